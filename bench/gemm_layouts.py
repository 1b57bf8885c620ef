"""Layouts of an LSTM-S step's GEMMs that gir measured and did not take (docs/performance-rnn.md,
"Where the time of an LSTM-S step goes"), through NumPy's OpenBLAS (the library gir calls):

- the per-step products as stored, with the weight transposed, and computed transposed
  (C^T = B^T A^T, which would need the gates in a transposed layout), plus what a transpose of
  the result back costs;
- the per-step product split into two column halves, each a one-thread GEMM on a thread of
  its own (what a split of the step across the cores by gir itself would run), against
  OpenBLAS's own 2-thread split;
- dW and dU as two GEMMs against one merged GEMM over [xs, h] (with and without the copy that
  the merge needs).

Medians of interleaved rounds, microseconds (ms for the weight gradients).

    python bench/gemm_layouts.py
"""

from __future__ import annotations

import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

T, B, H = 50, 32, 256


def rounds(calls: dict, n: int, repeat: int = 15) -> dict[str, float]:
    """Median seconds of one call of each, the calls interleaved round by round."""
    for f in calls.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeat):
        for name, f in calls.items():
            f()
            start = time.perf_counter()
            for _ in range(n):
                f()
            times[name].append((time.perf_counter() - start) / n)
    return {k: float(np.median(v)) for k, v in times.items()}


def layouts(rng: np.random.Generator, m: int, k: int, n: int) -> dict[str, float]:
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bt, at = np.ascontiguousarray(b.T), np.ascontiguousarray(a.T)
    c, ct = np.empty((m, n), np.float32), np.empty((n, m), np.float32)
    with threadpool_limits(2, user_api="blas"):
        return rounds({"as stored": lambda: np.matmul(a, b, out=c),
                       "weight transposed": lambda: np.matmul(a, bt.T, out=c),
                       "computed transposed": lambda: np.matmul(bt, at, out=ct),
                       "transpose of the result": lambda: np.copyto(c, ct.T)}, 100)


def column_halves(rng: np.random.Generator, m: int, k: int, n: int) -> dict[str, float]:
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)

    def both_threads() -> None:
        other = threading.Thread(target=lambda: [np.matmul(a, b[:, n // 2:], out=c[:, n // 2:]) for _ in range(T)])
        other.start()
        for _ in range(T):
            np.matmul(a, b[:, : n // 2], out=c[:, : n // 2])
        other.join()

    with threadpool_limits(2, user_api="blas"):
        own = rounds({"OpenBLAS 2 threads": lambda: [np.matmul(a, b, out=c) for _ in range(T)]}, 1)
    with threadpool_limits(1, user_api="blas"):
        split = rounds({"two 1-thread halves": both_threads}, 1)
    return {k: v / T for k, v in (own | split).items()}  # per step (includes one thread start per 50)


def weight_gradients(rng: np.random.Generator) -> dict[str, float]:
    x = rng.standard_normal((T * B, H), dtype=np.float32)
    h = rng.standard_normal((T * B, H), dtype=np.float32)
    dg = rng.standard_normal((T * B, 4 * H), dtype=np.float32)
    xh = np.concatenate([x, h], 1)
    dw, du, dwu = (np.empty((H, 4 * H), np.float32), np.empty((H, 4 * H), np.float32),
                   np.empty((2 * H, 4 * H), np.float32))
    with threadpool_limits(2, user_api="blas"):
        return rounds({"dW and dU": lambda: (np.matmul(x.T, dg, out=dw), np.matmul(h.T, dg, out=du)),
                       "merged": lambda: np.matmul(xh.T, dg, out=dwu),
                       "merged with its copy": lambda: (np.concatenate([x, h], 1, out=xh),
                                                        np.matmul(xh.T, dg, out=dwu))}, 5, 9)


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (m, k, n) in (("forward", (B, H, 4 * H)), ("backward", (B, 4 * H, H))):
        r = layouts(rng, m, k, n)
        print(f"{name} {m}x{k} @ {k}x{n}: " + ", ".join(f"{key} {v * 1e6:.1f} us" for key, v in r.items()))
        r = column_halves(rng, m, k, n)
        print("  per step, 2 cores: " + ", ".join(f"{key} {v * 1e6:.1f} us" for key, v in r.items()))
    r = weight_gradients(rng)
    print("weight gradients: " + ", ".join(f"{key} {v * 1e3:.2f} ms" for key, v in r.items()))


if __name__ == "__main__":
    main()
