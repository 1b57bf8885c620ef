#!/usr/bin/env bash
# The GPU backend's one device check (issue 26): the gpu-marked tests on the GPU (CUDA graphs
# and persistent scans included: tests/test_gpu_graphs.py, test_gpu_persistent.py), the
# training-step probe (counts and times; again with GIR_GPU_PERSISTENT=on and measure) and
# bench/rnn.py --device gpu at size S (writes $OUT/performance-gpu.md), each under a timeout, everything
# logged to $OUT (the device tool brings $OUT back).
#
# Here, once (no network there): bash bench/gpu_check.sh prepare
#   copies ../shared/gpu to .gpu/ and downloads the wheels gir needs beyond the GPU image
#   (lark, interegular, filecheck) to .whl/, both ignored through .git/info/exclude.
# Then on the device machine, in one call (about 8 of the 10 minutes a command may run):
#   run(command="bash bench/gpu_check.sh", carry=[".gpu", ".whl"], timeout_s=590)
# and read $OUT/summary.txt first. Anywhere else: OUT=/tmp/check bash bench/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "prepare" ]; then
  mkdir -p .gpu .whl && cp -r ../shared/gpu/. .gpu/
  python3 -m pip download -q --no-deps -d .whl lark interegular filecheck
  exclude=$(git rev-parse --git-path info/exclude)
  for d in /.gpu/ /.whl/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
  ls .gpu .whl; exit 0
fi
OUT=${OUT:-/tmp/gir-gpu-check}
mkdir -p "$OUT"
step() {  # step NAME SECONDS COMMAND...: runs it, logs to $OUT/NAME.log, notes its status in the summary
  local name=$1 secs=$2; shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $secs s): $*" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
}
: >"$OUT/summary.txt"
if [ -f .gpu/setup.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/setup.sh >"$OUT/setup.log" 2>&1
fi
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import numpy, numba_cuda, cupy; print('numpy', numpy.__version__, 'numba-cuda', \
numba_cuda.__version__, 'cupy', cupy.__version__)"; } >"$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt" >>"$OUT/summary.txt"
step pytest-gpu 280 python3 -m pytest -p no:cacheprovider -m gpu -q -rfE --durations=15
# per model and size: the graph path and eager; at S also persistent scans (GIR_GPU_PERSISTENT=on
# and measure). The output is streamed: a timeout keeps what was printed.
step gpu-steps 110 python3 bench/gpu_steps.py --sizes S --repeat 10 --persistent on,measure --persistent-sizes S
# gir (CUDA graph replays) against PyTorch cuDNN and JAX at S, gradients checked first; M and L
# in a call of their own: python3 bench/rnn.py --device gpu --sizes M,L
step bench-rnn 160 python3 bench/rnn.py --device gpu --sizes S --repeat 10 --out "$OUT/performance-gpu.md"
echo "logs: $OUT" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
