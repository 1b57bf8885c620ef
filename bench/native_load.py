"""Run time of a training step by how its code was made and loaded, interleaved in one process:
the cached -O3 object opened as a shared library (a compile-cache hit, backend/cpu/native.py),
the same object loaded by LLVM's JIT linker (GIR_CPU_SHARED=0), and the step compiled without
position-independent code (LLVM's default relocation model, as before the shared library)
loaded by LLVM's JIT linker.

    python bench/native_load.py lstm [--size S] [--threads 2] [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["GIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="gir-native-load-")
os.environ["GIR_LLVM_TIER"] = "0"  # -O3 at once, stored at once
os.environ["GIR_GEMM_MEASURE"] = "now"  # every arm with the same measured GEMM paths

import gir  # noqa: E402
import llvmlite.binding as llvm  # noqa: E402
import rnn  # noqa: E402
from gir.backend.cpu import llvm_jit, native  # noqa: E402


def _not_pic(opt: int | None = None) -> llvm.TargetMachine:
    cpu, features = llvm_jit.host()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu, features=features, opt=llvm_jit.opt_level() if opt is None else opt, codemodel="jitdefault")


def arms(model: str, size: str) -> tuple[dict[str, Callable[[], object]], list]:
    T, B, I, H = rnn.SIZES[size]  # noqa: E741
    p = rnn.make_inputs(model, T, B, I, H, 0)
    src = rnn.gir_source(model, T, B, I, H)
    args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
    gir.jit(src, f"{model}_grads")  # compiled and stored
    shared = gir.jit(src, f"{model}_grads")
    os.environ["GIR_CPU_SHARED"] = "0"
    mcjit = gir.jit(src, f"{model}_grads")
    os.environ["GIR_CACHE"] = "0"
    llvm_jit.new_target_machine, llvm_jit._target_machine = _not_pic, llvm_jit.cache(_not_pic)  # type: ignore[attr-defined]
    not_pic = gir.jit(src, f"{model}_grads")
    assert isinstance(shared.compiled._entry.engine, native.Library), "no shared library (no linker?)"
    assert not isinstance(mcjit.compiled._entry.engine, native.Library)
    return {"shared library": shared, "LLVM JIT linker": mcjit, "not PIC, JIT linker": not_pic}, args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=rnn.MODELS)
    ap.add_argument("--size", default="S", choices=list(rnn.SIZES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    limits = rnn.limit_blas_threads(args.threads)  # noqa: F841 (kept alive while the steps run)
    fns, inputs = arms(args.model, args.size)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            fn(*inputs)
            start = time.perf_counter()
            for _ in range(10):
                fn(*inputs)
            times[name].append((time.perf_counter() - start) / 10 * 1e3)
    base = statistics.median(times["LLVM JIT linker"])
    for name, t in times.items():
        print(f"{args.model}-{args.size} {name}: {statistics.median(t):.2f} ms a step "
              f"(ratio to the JIT linker {statistics.median(t) / base:.3f})")


if __name__ == "__main__":
    main()
