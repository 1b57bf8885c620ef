"""LLVM's optimisation level: compile seconds against run time of the bench/rnn.py training steps.

For each model (rnn, gru, lstm) at size S (T=50, batch 32, 256/256, float32) and each level
0-3 (GIR_LLVM_OPT), compiles `@<model>_grads` with the compile cache off and the GEMM paths
fixed (GIR_GEMM_MEASURE=off: the same paths at every level), then times training steps. The
levels are interleaved round by round in one process, so the machine's drift hits them alike.
LLVM's time is CPU time of the compiling thread (median). BLAS runs on one thread, in the
calling thread, so a step's time is the CPU time of that thread (`time.thread_time`), which
leaves out the time other processes held the core; the minimum over all rounds is reported
(the figure least disturbed by what others do to the caches).

    python bench/llvm_opt.py [--models rnn,gru,lstm] [--rounds 5] [--steps 10] [--size S]

Prints one table: per model and level, LLVM seconds (optimise + emit object), the median
step time, and both relative to -O3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["GIR_CACHE"] = "0"
os.environ["GIR_GEMM_MEASURE"] = "off"
for _var in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"  # LLVM's level changes the elementwise loops, which run on one thread
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gir  # noqa: E402
import numpy as np  # noqa: E402
import rnn  # noqa: E402  (bench/rnn.py: the sources and inputs)


def compile_at(source: str, entry: str, level: int) -> tuple[object, float]:
    """The compiled function and the CPU seconds of LLVM's passes and code emission (this
    thread's CPU time: what other processes take on a shared machine is left out)."""
    os.environ["GIR_LLVM_OPT"] = str(level)
    fn = gir.jit(source, entry)
    s = fn.compiled.code.info.seconds
    return fn, s["llvm_opt_cpu"] + s["llvm_emit_cpu"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round (median taken)")
    ap.add_argument("--size", default="S", choices=sorted(rnn.SIZES))
    ap.add_argument("--levels", default="0,1,2,3")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    T, B, n_in, H = rnn.SIZES[args.size]
    print(f"size {args.size}: T={T} batch={B} input={n_in} hidden={H}; {args.rounds} rounds x {args.steps} steps")
    print(f"{'model':<6} {'-O':>3} {'LLVM s':>8} {'vs O3':>6} {'min step ms':>11} {'vs O3':>6}")
    for model in args.models.split(","):
        source = rnn.gir_source(model, T, B, n_in, H)
        p = rnn.make_inputs(model, T, B, n_in, H, 0)
        call_args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
        llvm_s: dict[int, list[float]] = {lv: [] for lv in levels}
        step_s: dict[int, list[float]] = {lv: [] for lv in levels}
        want = None
        for _ in range(args.rounds):
            for lv in levels:
                fn, seconds = compile_at(source, f"{model}_grads", lv)
                llvm_s[lv].append(seconds)
                out = fn(*call_args)  # type: ignore[operator]
                if want is None:
                    want = out
                for a, b in zip(want, out):
                    np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-4 * float(np.abs(a).max() + 1e-30))
                for _ in range(args.steps):
                    start = time.thread_time()
                    fn(*call_args)  # type: ignore[operator]
                    step_s[lv].append(time.thread_time() - start)
        ref_c, ref_r = statistics.median(llvm_s[3]), min(step_s[3])
        for lv in levels:
            c, r = statistics.median(llvm_s[lv]), min(step_s[lv])
            print(f"{model:<6} {lv:>3} {c:8.3f} {c / ref_c:6.2f} {r * 1e3:11.2f} {r / ref_r:6.2f}")


if __name__ == "__main__":
    main()
