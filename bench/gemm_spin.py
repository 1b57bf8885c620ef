"""A GEMM timed right after the other BLAS provider's: the spinning pool it meets.

Times one float32 GEMM (default 32x1024x256, the LSTM-S recurrent GEMM) through MKL and through
OpenBLAS alternately, 8 rounds of 50 calls each, first with no pause between the providers and
then with --pause seconds before each (their pools' spin-wait: MKL's KMP_BLOCKTIME, 200 ms by
default; OpenBLAS's ~0.1 s), and prints each provider's best and median time per call. The
difference is what quiet_timing.SPIN and the provider grouping of the GEMM measurement remove
(backend/cpu/quiet_timing.py, docs/backend.md). Needs MKL; meaningful with 2+ BLAS threads.

    OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 python bench/gemm_spin.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from gir.backend.cpu import (
    blas,
    llvm_jit,  # noqa: F401  (registers the gir-packed caller blas may ask for)
)


def timed(call, reps: int = 50) -> float:  # noqa: ANN001
    call()
    call()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - start) / reps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32,1024,256", help="m,n,k")
    ap.add_argument("--pause", type=float, default=0.3)
    args = ap.parse_args()
    if not blas.providers().has_mkl:
        print("no MKL here: nothing to compare")
        return 0
    m, n, k = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    calls = {p: blas.gemm_caller(p, "f32", m, n, k, False, False, a, b, c) for p in ("mkl", "openblas")}
    print(f"{m}x{n}x{k} f32, BLAS threads {blas.threads()}")
    for pause in (0.0, args.pause):
        times: dict[str, list[float]] = {p: [] for p in calls}
        for _ in range(8):
            for name, call in calls.items():
                time.sleep(pause)
                times[name].append(timed(call))
        print(f"pause {pause:.2f} s: " + ", ".join(
            f"{p} best {min(t):.1f} us, median {statistics.median(t):.1f} us" for p, t in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
