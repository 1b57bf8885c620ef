"""gir's packed-weight GEMM (backend/cpu/packed_gemm.py, the `gir-packed` path) against the BLAS
paths, at the per-step GEMM shapes of bench/rnn.py's models, on 1 and 2 threads.

    python bench/packed_gemm.py [--sizes S,M] [--threads 2,1] [--pack]

Each shape is timed the way gir chooses a path (blas._measure_all: the paths interleaved within a
round, the best undisturbed round of at least five, the weight packed or copied once and not
timed), with OpenBLAS's pool limited by threadpoolctl. Prints microseconds and GFLOP/s per path
and the ratio of the best BLAS path to gir-packed. `--pack` also times packing each shape's
weight (once per scan in compiled code): the median of 20 calls of the compiled pack function.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rnn  # noqa: E402
from gir.backend.cpu import blas, llvm_jit, packed_gemm  # noqa: E402

GATES = {"rnn": 1, "gru": 3, "lstm": 4}


def shapes(size: str) -> list[tuple[str, tuple]]:
    """(label, path_times' arguments) of the step's GEMMs with a loop-invariant weight: the
    forward h @ U (hidden x gates*hidden) and the backward dG @ U^T."""
    _, batch, _, hidden = rnn.SIZES[size]
    out = []
    for model in ("rnn", "gru", "lstm"):
        g = GATES[model] * hidden
        out.append((f"{model}-{size} h@U", ("f32", batch, g, hidden, False, False, True)))
        out.append((f"{model}-{size} dG@U^T", ("f32", batch, hidden, g, False, True, True)))
    return out


def pack_seconds(m: int, n: int, k: int, tb: bool) -> float:
    """Median seconds of packing a float32 weight of this shape (gir_pack_f32_<tb>)."""
    shape = packed_gemm.Shape("f32", m, n, k, False, tb)
    engine, pack, _ = llvm_jit.packed_functions(shape, 1)
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(pack)
    weight = np.ones((n, k) if tb else (k, n), np.float32)
    dest = np.zeros(shape.packed_bytes // 4, np.float32)
    times = []
    for _ in range(21):
        start = time.perf_counter()
        call(weight.ctypes.data, dest.ctypes.data, n, k)
        times.append(time.perf_counter() - start)
    del engine
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="S,M")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--pack", action="store_true", help="also time packing each weight")
    args = ap.parse_args()
    paths = [p for p in ("openblas", "openblas-copy", "gir-packed") if p in blas._candidates(True)]
    print(f"| shape | m x n x k | threads | {' | '.join(paths)} | best BLAS / gir-packed |")
    print("|---|---|---:|" + "---:|" * len(paths) + "---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        for size in args.sizes.split(","):
            for label, (dtype, m, n, k, ta, tb, _) in shapes(size):
                with threadpool_limits(threads):
                    times, disturbed = blas._measure_all(paths, dtype, m, n, k, ta, tb)
                flops = 2.0 * m * n * k
                cells = [f"{times[p] * 1e6:.1f} us · {flops / times[p] / 1e9:.0f} GF/s" for p in paths]
                blas_best = min(times[p] for p in paths if p != "gir-packed")
                note = " (disturbed)" if disturbed else ""
                print(f"| {label} | {m}x{n}x{k} | {threads} | {' | '.join(cells)} | "
                      f"{blas_best / times['gir-packed']:.2f}x{note} |")
    if args.pack:
        print("\n| weight | k x n | transposed | pack |\n|---|---|---|---:|")
        for size in args.sizes.split(","):
            for label, (_, m, n, k, _, tb, _) in shapes(size):
                print(f"| {label} | {k}x{n} | {tb} | {pack_seconds(m, n, k, tb) * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
