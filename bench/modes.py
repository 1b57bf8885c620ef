"""What the compile modes trade (docs/passes.md, *Compile modes*): `fast-compile` against
`fast-run` on the CPU, A/B interleaved in one process, medians.

1. examples/rnn.gir's rnn_grads (T=50, batch 32, hidden 256): the time of `gir.jit` with an
   empty disk cache (a real compile: passes, LLVM, object code; after one untimed compile per
   mode, which measures the GEMM paths of its shapes once per process), then the time of a
   call and its GEMM calls.
2. The passes alone (each mode's whole pipeline for device="auto", no verification), CPU
   seconds, on programs of about 1k and 10k ops built from bench/passes_scale.py's units.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/modes.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gir
from gir.ir.interpreter import random_inputs
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import MODES

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from passes_scale import program_of_about  # noqa: E402

A, B = "fast-run", "fast-compile"


def compile_and_run(repeat: int, calls: int) -> None:
    text = (ROOT / "examples" / "rnn.gir").read_text()
    compile_s: dict[str, list[float]] = {A: [], B: []}
    fns = {mode: gir.jit(text, "rnn_grads", mode=mode) for mode in (A, B)}  # untimed: GEMM paths measured
    for _ in range(repeat):
        for mode in (A, B):
            os.environ["GIR_CACHE_DIR"] = tempfile.mkdtemp()  # no disk-cache hit
            start = time.perf_counter()
            fns[mode] = gir.jit(text, "rnn_grads", mode=mode)
            compile_s[mode].append(time.perf_counter() - start)
    args = random_inputs(fns[A].signature, 0)
    call_s: dict[str, list[float]] = {A: [], B: []}
    for mode in (A, B):
        fns[mode](*args)
    for _ in range(calls):
        for mode in (A, B):
            start = time.perf_counter()
            fns[mode](*args)
            call_s[mode].append(time.perf_counter() - start)
    med = {m: (statistics.median(compile_s[m]), statistics.median(call_s[m])) for m in (A, B)}
    for m in (A, B):
        print(f"rnn_grads {m:13s} compile {med[m][0]:.3f} s  call {med[m][1] * 1e3:.2f} ms  "
              f"GEMM calls {fns[m].stats.gemm_calls}")
    print(f"rnn_grads {B} / {A}: compile {med[B][0] / med[A][0]:.2f}x, call {med[B][1] / med[A][1]:.2f}x")


def passes_only(repeat: int) -> None:
    for n in (1000, 10000):
        text = program_of_about(n)
        times: dict[str, list[float]] = {A: [], B: []}
        for _ in range(repeat):
            for mode in (A, B):
                module = gir.parse(text)
                start = time.process_time()
                PassManager(MODES[mode].pipeline("auto"), verify_each=False).run(module)
                times[mode].append(time.process_time() - start)
        a, b = statistics.median(times[A]), statistics.median(times[B])
        print(f"passes, ~{n} ops: {A} {a:.3f} s, {B} {b:.3f} s ({b / a:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="compiles per mode, and pass timings per size")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per mode")
    args = ap.parse_args()
    compile_and_run(args.repeat, args.calls)
    passes_only(args.repeat)


if __name__ == "__main__":
    main()
