"""Which OpenBLAS gir's `openblas` GEMM path calls: NumPy's bundled ILP64 build or SciPy's.

Both wheels bundle an OpenBLAS (`numpy.libs/libscipy_openblas64_*.so`,
`scipy.libs/libscipy_openblas-*.so`), often of different versions. backend/cpu/blas.py
`openblas()` takes NumPy's unless GIR_OPENBLAS=scipy. This times, for each library, in a
process of its own (two OpenBLAS thread pools in one process spin against each other):

- the per-step GEMMs of bench/rnn.py's S models (batch 32, hidden 256) and a big one-off GEMM,
  called through gir's own `blas.gemm_caller("openblas", ...)`;
- whole training steps of bench/rnn.py's models compiled by gir (GEMM paths forced to
  OpenBLAS, the -O3 code).

Rounds alternate the libraries; medians of the rounds are printed with the ratio.

    python bench/openblas_libs.py [--models rnn,gru,lstm] [--size S] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBS = ("numpy", "scipy")
GEMMS = ((32, 1024, 256), (32, 256, 1024), (32, 768, 256), (32, 256, 256), (1600, 1024, 256))


def child(models: list[str], size: str, threads: int) -> dict[str, float]:
    """In a process whose GIR_OPENBLAS is set: ms per GEMM shape and per training step."""
    sys.path.insert(0, str(HERE))
    import numpy as np
    import rnn
    from gir.backend.cpu import blas

    rnn.gir_set_threads(threads)
    out: dict[str, float] = {"lib": blas.openblas().name if blas.openblas() else "cython_blas"}
    rng = np.random.default_rng(0)
    for m, n, k in GEMMS:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        call = blas.gemm_caller("openblas", "f32", m, n, k, False, False, a, b, np.zeros((m, n), np.float32))
        reps = 20 if m > 1000 else 300
        out[f"gemm {m}x{k} @ {k}x{n}"] = 1e3 * statistics.median(_per_call(call, reps) for _ in range(5))
    T, B, width, H = rnn.SIZES[size]
    for model in models:
        step, _ = rnn.setup_gir(model, rnn.make_inputs(model, T, B, width, H, 0))
        out[f"{model}-{size} step"] = 1e3 * statistics.median(_per_call(step, 1) for _ in range(30))
    return out


def _per_call(call, reps: int) -> float:  # noqa: ANN001
    call()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - start) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--size", default="S")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    models = args.models.split(",")
    if args.child:
        print(json.dumps(child(models, args.size, args.threads)))
        return
    runs: dict[str, list[dict]] = {lib: [] for lib in LIBS}
    for _ in range(args.rounds):
        for lib in LIBS:
            env = dict(os.environ, GIR_OPENBLAS=lib, GIR_GEMM_PATH="openblas", GIR_GEMM_MEASURE="now")
            proc = subprocess.run([sys.executable, __file__, "--child", "--models", args.models, "--size", args.size,
                                   "--threads", str(args.threads)], env=env, capture_output=True, text=True, check=True)
            runs[lib].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"threads={args.threads}; medians of {args.rounds} alternating rounds, ms")
    print(f"{'':34} {runs['numpy'][0]['lib']:>34} {runs['scipy'][0]['lib']:>34}  scipy/numpy")
    for key in runs["numpy"][0]:
        if key == "lib":
            continue
        a, b = (statistics.median(r[key] for r in runs[lib]) for lib in LIBS)
        print(f"{key:34} {a:34.4f} {b:34.4f}  {b / a:10.2f}")


if __name__ == "__main__":
    main()
