"""The quick tier of tiered compilation: LLVM seconds against step time for cheap recipes.

For each model (gru, lstm by default) at size S, lowers `@<model>_grads` once (compile cache
off, GEMM paths fixed), then compiles the same LLVM IR with each recipe below (a pass list and
the TargetMachine's code generation level), interleaved round by round in one process. LLVM's
time is the CPU time of this thread (parse + passes + emit object); a step's time the minimum
thread CPU time of `--steps` steps per round (BLAS on one thread).

    python bench/llvm_tiers.py [--models gru,lstm] [--rounds 3] [--steps 5]
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
os.environ["GIR_LLVM_TIER"] = "0"
for _var in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gir  # noqa: E402
import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402
import rnn  # noqa: E402
from gir.backend.cpu import llvm_jit, runtime  # noqa: E402

RECIPES = {  # name: (passes, TargetMachine codegen level)
    "O0/cg0": ("none", 0),
    "cheap/cg0": ("cheap", 0),
    "cheap/cg1": ("cheap", 1),
    "cheap/cg2": ("cheap", 2),
    "O1/cg0": ("O1", 0),
    "O1/cg1": ("O1", 1),
    "O3/cg3": ("O3", 3),
}


def compile_recipe(llvm_ir: str, passes: str, cg: int) -> tuple[bytes, float]:
    c0 = time.thread_time()
    mod = llvm.parse_assembly(llvm_ir)
    if passes == "cheap":
        llvm_jit.optimize_quick(mod)
    elif passes != "none":
        llvm_jit.optimize(mod, int(passes[1]))
    obj = llvm_jit.new_target_machine(cg).emit_object(mod)
    return obj, time.thread_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gru,lstm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    args = ap.parse_args()
    names = args.recipes.split(",")
    T, B, n_in, H = rnn.SIZES["S"]
    print(f"{'model':<6} {'recipe':<10} {'LLVM s':>8} {'vs O3':>6} {'min step ms':>11} {'vs O3':>6}")
    for model in args.models.split(","):
        fn = gir.jit(rnn.gir_source(model, T, B, n_in, H), f"{model}_grads")
        base = fn.compiled
        p = rnn.make_inputs(model, T, B, n_in, H, 0)
        call_args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
        want = base(*call_args)
        llvm_s: dict[str, list[float]] = {n: [] for n in names}
        step_s: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.rounds):
            for n in names:
                obj, sec = compile_recipe(base.llvm_ir, *RECIPES[n])
                llvm_s[n].append(sec)
                code = runtime.Code(obj, base.layout, "", base.llvm_ir, runtime.CompileInfo())
                f = runtime.CPUFunction(base.function, code=code)
                for a, b in zip(want, f(*call_args)):
                    np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-4 * float(np.abs(a).max() + 1e-30))
                for _ in range(args.steps):
                    start = time.thread_time()
                    f(*call_args)
                    step_s[n].append(time.thread_time() - start)
        ref_c, ref_r = statistics.median(llvm_s["O3/cg3"]), min(step_s["O3/cg3"])
        for n in names:
            c, r = statistics.median(llvm_s[n]), min(step_s[n])
            print(f"{model:<6} {n:<10} {c:8.3f} {c / ref_c:6.2f} {r * 1e3:11.2f} {r / ref_r:6.2f}", flush=True)


if __name__ == "__main__":
    main()
