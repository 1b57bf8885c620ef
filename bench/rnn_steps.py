"""Runs N training steps of one of bench/rnn.py's models through gir (the -O3 code, GEMM paths
measured first) and prints the mean time of a step: a target for `perf record`, and for A/B
runs of environment switches in separate processes.

    python bench/rnn_steps.py lstm 150 [--size S] [--threads 2]
    perf record -F 4000 -g python bench/rnn_steps.py lstm 150
    GIR_CPU_OVERLAP=auto python bench/rnn_steps.py rnn 100; GIR_CPU_OVERLAP=0 python bench/rnn_steps.py rnn 100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rnn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=rnn.MODELS)
    ap.add_argument("steps", type=int)
    ap.add_argument("--size", default="S", choices=list(rnn.SIZES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    limits = rnn.limit_blas_threads(args.threads)  # noqa: F841 (kept alive while the steps run)
    T, B, I, H = rnn.SIZES[args.size]  # noqa: E741
    step, _ = rnn.setup_gir(args.model, rnn.make_inputs(args.model, T, B, I, H, 0))
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    ms = (time.perf_counter() - start) / args.steps * 1e3
    print(f"{args.model}-{args.size}, {args.threads} threads: {ms:.2f} ms a step")


if __name__ == "__main__":
    main()
