"""A/B of the split schedule (backend/cpu/team.py) in ONE process: bench/rnn.py's training step
compiled with GIR_CPU_SPLIT=0 (A, or `--a`) and with the variant under test (B, default
GIR_CPU_SPLIT=1), then called
interleaved (A, B, A, B, ...), medians and the ratio printed. Separate processes are no A/B on a
machine shared with other work: its load changes between them.

    python bench/rnn_split.py lstm,gru [--size S] [--rounds 40] [--b GIR_CPU_SPLIT=1 ...]
    /tmp/perf/quiet.sh python bench/rnn_split.py lstm,gru --rounds 60

`--b NAME=VALUE` (repeatable) sets the environment the B variant compiles under, `--a` the A
variant's (default GIR_CPU_SPLIT=0). Both are compiled and their -O3 code awaited before timing. It
also prints which ops B split (fn.stats.schedule["split"]) and checks B's loss and gradients
against A's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rnn  # noqa: E402


def compile_with(model: str, p: dict, env: dict[str, str]):
    """setup_gir under env (the compile reads it; it is restored after)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        step, _ = rnn.setup_gir(model, p)
        return step, rnn.setup_gir.fn
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_model(model: str, size: str, rounds: int, a_env: dict[str, str], b_env: dict[str, str]) -> tuple[float, float]:
    T, B, I, H = rnn.SIZES[size]  # noqa: E741
    p = rnn.make_inputs(model, T, B, I, H, 0)
    step_a, fn_a = compile_with(model, p, a_env)
    step_b, fn_b = compile_with(model, p, b_env)
    out_a, out_b = step_a(), step_b()
    err = max(float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(a))), 1e-30) for a, b in zip(out_a, out_b))
    print(f"{model}-{size}: B's split: {fn_b.stats.schedule.get('split')}")
    print(f"{model}-{size}: GEMM paths A {fn_a.stats.gemm_paths}, B {fn_b.stats.gemm_paths}")
    print(f"{model}-{size}: max relative difference B vs A: {err:.1e}")
    times: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(3):
        step_a(), step_b()
    for _ in range(rounds):
        for name, step in (("A", step_a), ("B", step_b)):
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    a, b = (statistics.median(times[k]) * 1e3 for k in "AB")
    names = [" ".join(f"{k}={v}" for k, v in env.items()) for env in (a_env, b_env)]
    print(f"{model}-{size}: A ({names[0]}) {a:.2f} ms, B ({names[1]}) "
          f"{b:.2f} ms a step (medians of {rounds}); A/B = {a / b:.3f}")
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", help="comma-separated: rnn,gru,lstm")
    ap.add_argument("--size", default="S", choices=list(rnn.SIZES))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--a", action="append", default=[], help="NAME=VALUE of the A variant's environment")
    ap.add_argument("--b", action="append", default=[], help="NAME=VALUE of the B variant's environment")
    args = ap.parse_args()
    limits = rnn.limit_blas_threads(args.threads)  # noqa: F841 (kept alive while the steps run)
    a_env = dict(kv.split("=", 1) for kv in args.a) or {"GIR_CPU_SPLIT": "0"}
    b_env = dict(kv.split("=", 1) for kv in args.b) or {"GIR_CPU_SPLIT": "1"}
    for model in args.models.split(","):
        one_model(model, args.size, args.rounds, a_env, b_env)


if __name__ == "__main__":
    main()
