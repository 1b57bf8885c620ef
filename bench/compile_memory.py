"""What a process compiling many shapes keeps: resident memory per compile (issue 31).

    GIR_CACHE=0 GIR_LENGTHS=0 GIR_LLVM_TIER=0 python bench/compile_memory.py shapes --n 200
    ... compile_memory.py objects --n 200 [--collect]       # a gir.jit object per shape, dropped
    ... compile_memory.py stages --n 150 [--collect]        # each stage of a compile alone

`shapes`: one `gir.jit` function called with n leading sizes (each a specialisation with
GIR_LENGTHS=0; GIR_MAX_SPECIALISATIONS bounds how many are kept). `objects`: n `gir.jit`
functions, each called once and dropped. `stages`: the compile cut after each stage (parse and
passes; + lowering to LLVM IR; + LLVM's parse, -O3 and emission; + loading; + a CPUFunction and a
call), each run n times. RSS from /proc/self/statm after `gc.collect()`, after 20 warm-up
compiles (and once the background -O3 jobs of a tiered compile have swapped their code in);
malloc's bytes in use from mallinfo2 (glibc; the main arena). --collect: a full
collection after every compile (what stays, not what waits for CPython's collector). Linux only.
Results are in docs/reliability.md ("The outside reliability campaign", item 7).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time
from collections.abc import Callable

import gir
import numpy as np

SOURCE = ("func @f(%x: tensor<?x8xf32>, %w: tensor<8xf32>) -> tensor<f32> {\n"
          "  return sum(tanh(%x * %w + 1.0) * %x)\n}\n")
STAGES = ("passes", "lower", "llvm", "load", "call")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def malloc_mb() -> float:
    """Bytes malloc has handed out and not got back (main arena and mmapped blocks)."""
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    info = libc.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


def stage_compile(stage: str) -> Callable[[int], None]:
    """A compile of shape (i + 1, 8) cut after stage (one of STAGES)."""
    from gir.analysis.memory.plan import MemoryPlan
    from gir.backend.cpu import llvm_jit, snapshot
    from gir.backend.cpu.code import Code, CompileInfo
    from gir.backend.cpu.lower import lower_function
    from gir.backend.cpu.runtime import CPUFunction
    from gir.config import current
    from gir.driver.compile import run_passes, specialised
    from gir.passes.pipeline import DEFAULT_MODE, get_mode

    pipeline = get_mode(DEFAULT_MODE).pipeline("cpu")

    def compile_once(i: int) -> None:
        module = gir.parse(SOURCE)
        f = module.functions["f"]
        copy = specialised(module, "f", [f.arg_types[0].with_shape((i + 1, 8)), f.arg_types[1]])
        report = run_passes(copy, pipeline)
        if stage == "passes":
            return
        fn = copy.functions["f"]
        plan = report.analyses.get(MemoryPlan, fn)
        lowered, layout = lower_function(fn, plan, snapshot.schedule(fn, plan, current()), quick=False)
        ir = str(lowered)
        if stage == "lower":
            return
        mod = llvm_jit.parse_own(ir)
        mod.verify()
        llvm_jit.optimize(mod, 3)
        code = Code(llvm_jit.target_machine().emit_object(mod), layout, str(mod), ir, CompileInfo())
        if stage == "llvm":
            return
        if stage == "load":
            llvm_jit.load_object(code)
            return
        CPUFunction(fn, plan, code=code)(np.ones((i + 1, 8), np.float32), np.ones(8, np.float32))

    return compile_once


def measure(name: str, compile_once: Callable[[int], None], n: int, collect: bool) -> None:
    for i in range(20):
        compile_once(100_000 + i)
    gc.collect()
    rss, used, start = rss_mb(), malloc_mb(), time.perf_counter()
    for i in range(n):
        compile_once(i)
        if collect:
            gc.collect()
    if "gir.backend.cpu.tiers" in sys.modules:  # tiered: the -O3 jobs swap their code in first
        sys.modules["gir.backend.cpu.tiers"].wait_all(1200)
    gc.collect()
    grown, grown_malloc = rss_mb() - rss, malloc_mb() - used
    print(f"{name:8s} n={n}: RSS +{grown:.1f} MB ({grown / n * 1024:.0f} KB a compile), malloc in use "
          f"{grown_malloc / n * 1024:.1f} KB a compile, {time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("shapes", "objects", "stages"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--collect", action="store_true", help="gc.collect() after every compile")
    args = ap.parse_args()
    w = np.ones(8, np.float32)
    if args.mode == "shapes":
        fn = gir.jit(SOURCE, "f")
        measure("shapes", lambda i: fn(np.ones((i + 1, 8), np.float32), w), args.n, args.collect)
        print(f"kept {fn.specialisations_kept}, evicted {fn.specialisations_evicted}")
    elif args.mode == "objects":
        measure("objects", lambda i: gir.jit(SOURCE, "f")(np.ones((i + 1, 8), np.float32), w), args.n, args.collect)
    else:
        for stage in STAGES:
            measure(stage, stage_compile(stage), args.n, args.collect)


if __name__ == "__main__":
    main()
