"""The GEMMs of an LSTM-S training step alone, through NumPy (its bundled OpenBLAS, the one gir
calls): what a step would cost with no elementwise work, copies or calls, as a yardstick for
gir's whole step (docs/performance-rnn.md, "Issue 14").

Phases, the shapes gir's pipeline makes for bench/rnn.py's lstm at S (T=50, batch 32, 256
wide, gates fused to 1024): the input projection (1600x256 @ 256x1024), 50 forward per-step
GEMMs (32x256 @ 256x1024, with one tanh between), 50 backward ones (32x1024 @ 1024x256), and
the weight gradients as gir computes them (`fn.stats.compile.gemms`): dW = xs^T dG (256x1600 @
1600x1024) and dU in two parts, h0^T dG_0 (256x32 @ 32x1024) plus the other 49 steps' stack
(256x1568 @ 1568x1024). Median of 30 after one warm-up. (Until 2026-11-24 this counted three
weight-gradient GEMMs of K=1600, one more than gir runs, and so overstated the GEMMs of a step
by ~4.6 ms.)

    python bench/lstm_gemms.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

T, B, H = 50, 32, 256


def phases(rng: np.random.Generator):  # noqa: ANN201
    xs = rng.standard_normal((T, B, H), dtype=np.float32)
    w = (rng.standard_normal((H, 4 * H)) * 0.05).astype(np.float32)
    u = (rng.standard_normal((H, 4 * H)) * 0.05).astype(np.float32)
    ut = np.ascontiguousarray(u.T)
    p = np.empty((T * B, 4 * H), np.float32)
    g, h = np.empty((B, 4 * H), np.float32), np.zeros((B, H), np.float32)
    dg, dh, dw = np.empty((T, B, 4 * H), np.float32), np.empty((B, H), np.float32), np.empty((H, 4 * H), np.float32)
    x2 = xs.reshape(T * B, H)
    hs = rng.standard_normal((T * B, H), dtype=np.float32)
    du0, du = np.empty((H, 4 * H), np.float32), np.empty((H, 4 * H), np.float32)

    def run() -> np.ndarray:
        t0 = time.perf_counter()
        np.matmul(x2, w, out=p)
        t1 = time.perf_counter()
        for _ in range(T):
            np.matmul(h, u, out=g)
            np.tanh(g[:, :H], out=h)
        t2 = time.perf_counter()
        for t in range(T):
            np.matmul(dg[t], ut, out=dh)
        t3 = time.perf_counter()
        dg2 = dg.reshape(T * B, 4 * H)
        np.matmul(x2.T, dg2, out=dw)
        np.matmul(h.T, dg2[:B], out=du0)
        np.matmul(hs[:T * B - B].T, dg2[B:], out=du)
        return np.array([t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3])
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run = phases(np.random.default_rng(0))
    with threadpool_limits(args.threads, user_api="blas"):
        run()
        ms = np.median([run() for _ in range(30)], axis=0) * 1e3
    print(f"threads={args.threads}: projection {ms[0]:.2f} ms, forward per-step GEMMs {ms[1]:.2f}, "
          f"backward per-step GEMMs {ms[2]:.2f}, weight-gradient GEMMs {ms[3]:.2f}; all {ms.sum():.2f} ms")


if __name__ == "__main__":
    main()
