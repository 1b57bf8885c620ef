"""The compile part of a GPU training step's first call, measured without a GPU: gir's own
compile (passes, memory plan, lowering) in the simulator, then numba-cuda's compile of every
kernel the step launches to PTX (typing, lowering, NVVM) in a process without the simulator,
as the first call on a GPU does it kernel by kernel. Issue 26's target is a first call under
1 s at S, compile included; the driver's PTX-to-SASS load and the call itself come on top and
only a GPU measures them (bench/gpu_steps.py prints the whole first call there).

    python bench/gpu_compile.py --sizes S --models rnn,gru,lstm

Needs numba-cuda with NVVM (pip install 'gir[gpu]', or cuda-toolkit's nvvm/nvrtc wheels); no
GPU and no driver. Each model runs in a fresh process, so numba's one-time start (its import,
and its first compile setting up typing and the NVVM binding) is counted once per model, as a
user's first call pays it; gir's compile is timed after numba's import (it used to include
the simulator's import, about 0.3 s, and so count numba's import twice)."""

# ruff: noqa: E741  (I is the input size, as in bench/rnn.py)
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"Q": (3, 2, 3, 4), "S": (50, 32, 256, 256), "M": (100, 64, 512, 512)}

PTX_TIMES = """\
import json, sys, time
from gir.backend.gpu import kernels  # gir imported (a user's script did), numba not yet
start = time.perf_counter()
from numba import cuda
cuda.compile_ptx(kernels._define(cuda, kernels.generate([], [], [], ()).text).py_func, "void(int64)", cc=(9, 0))
times = {"numba start": time.perf_counter() - start}
for k, (text, signature) in enumerate(json.load(open(sys.argv[1]))):
    start = time.perf_counter()
    cuda.compile_ptx(kernels._define(cuda, text).py_func, signature, cc=(9, 0))
    times[f"kernel {k} ({len(text)} chars)"] = time.perf_counter() - start
print(json.dumps(times))
"""


def gir_compile(model: str, size: str) -> tuple[float, dict[str, str]]:
    """(seconds gir.jit took in the simulator, numba imported before, the launched kernels'
    sources -> signatures)."""
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    sys.path.insert(0, str(HERE))
    import gir
    import rnn

    importlib.import_module("numba.cuda")  # the simulator's import is not gir's compile (numba's start: below)

    T, B, I, H = SIZES[size]
    src = rnn.gir_source(model, T, B, I, H)
    start = time.perf_counter()
    fn = gir.jit(src, f"{model}_grads", device="gpu")
    seconds = time.perf_counter() - start
    return seconds, {k.source.text: k.source.signature for k in fn.compiled.lowering.kernels}


def ptx_times(sources: dict[str, str]) -> dict[str, float]:
    """Seconds per kernel (and numba's start) compiling to PTX, in a process without the simulator."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(sorted(sources.items()), f)
    try:
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
        done = subprocess.run([sys.executable, "-c", PTX_TIMES, f.name], env=env, capture_output=True,
                              text=True, timeout=900)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise SystemExit(f"PTX compile failed (NVVM missing?):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def one(model: str, size: str) -> None:
    """Measures one model in this process and prints one JSON line."""
    seconds, sources = gir_compile(model, size)
    times = ptx_times(sources)
    print(json.dumps({"model": model, "size": size, "gir": seconds, "ptx": times}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--sizes", default="S")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(*args.one)
        return 0
    print("| model | size | gir compile (s) | numba start (s) | kernels | kernels to PTX (s) | total (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes.split(","):
        for model in args.models.split(","):
            done = subprocess.run([sys.executable, __file__, "--one", model, size], capture_output=True,
                                  text=True, timeout=1800)
            if done.returncode != 0:
                print(done.stdout + done.stderr, file=sys.stderr)
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            start = r["ptx"].pop("numba start")
            kernels = sum(r["ptx"].values())
            print(f"| {model} | {size} | {r['gir']:.2f} | {start:.2f} | {len(r['ptx'])} | {kernels:.2f} "
                  f"| {r['gir'] + start + kernels:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
