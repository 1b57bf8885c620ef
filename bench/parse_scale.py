"""How parsing, verifying and printing scale with program size.

Generates SSA-form programs of about 1k, 10k, 25k and 100k ops, one op per line with result
types, as the printer prints them (elementwise ops and matmuls over 8x8 f32 values), and
reports, median of 3:

- parse: `gir.parse(text)`, everything: text to the typed AST (the hand-written parser of
  frontend/fast_parser.py; Lark only for text it declines), emitting IR, verifying;
- its parts: text to AST alone (`parse_ast`), the Lark LALR parse alone (with the one-regex
  lexer of frontend/lexer.py and the transformer that builds the same AST; what `GIR_PARSER=lark`
  uses), emit alone (AST -> IR), verify alone;
- print: `print_module` of the parsed module.

GC is disabled while the IR is built (as `gir.parse` does); verify and print run with GC on.
Times are CPU seconds of this process (`time.process_time`; single-threaded Python, so on an
idle machine this is the wall-clock time); `parse wall` is the wall-clock time of the parse.

    python bench/parse_scale.py [--sizes 1000,10000,25000,100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import gir
from gir.frontend.emitter import emit_module
from gir.frontend.parser import _parser, parse_ast
from gir.ir.printer import print_module
from gir.ir.verifier import verify

T = "tensor<8x8xf32>"
BINARY = ("add", "sub", "mul", "div", "max", "min", "matmul")
UNARY = ("tanh", "exp", "neg", "sigmoid", "abs")


def program(n_ops: int) -> str:
    """A function of n_ops ops (n_ops - 1 computations and the return), deterministic."""
    lines = [f"func @big(%a: {T}, %b: {T}, %c: {T}) -> {T} {{"]
    names = ["%a", "%b", "%c"]
    for i in range(n_ops - 1):
        if i % 3 == 2:
            op = UNARY[i % len(UNARY)]
            lines.append(f"  %{i} = {op} {names[-1]} : {T}")
        else:
            op = BINARY[i % len(BINARY)]
            lines.append(f"  %{i} = {op} {names[-1]}, {names[-1 - (i * 7) % min(len(names), 50)]} : {T}")
        names.append(f"%{i}")
    lines.append(f"  return {names[-1]}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def median_time(fn: Callable[[], object], repeat: int, gc_off: bool = False) -> tuple[float, float]:
    """Median (CPU seconds, wall-clock seconds) of fn()."""
    cpus, walls = [], []
    for _ in range(repeat):
        gc.collect()
        if gc_off:
            gc.disable()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
        gc.enable()
    return statistics.median(cpus), statistics.median(walls)


def measure(n: int, repeat: int) -> tuple[float, ...]:
    """CPU seconds of (parse, AST, lark, emit, verify, print), then parse wall-clock seconds; medians."""
    parser = _parser()  # built once, outside the timings
    text = program(n)
    module = gir.parse(text)
    assert module.num_ops() == n, (module.num_ops(), n)
    assert print_module(module) == text  # the generated text is exactly the printed form
    funcs = parser.parse(text)
    parse_cpu, parse_wall = median_time(lambda: gir.parse(text), repeat)
    return (parse_cpu,
            median_time(lambda: parse_ast(text), repeat, gc_off=True)[0],
            median_time(lambda: parser.parse(text), repeat, gc_off=True)[0],
            median_time(lambda: emit_module(funcs, "<bench>"), repeat, gc_off=True)[0],
            median_time(lambda: verify(module), repeat)[0],
            median_time(lambda: print_module(module), repeat)[0],
            parse_wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,25000,100000", help="op counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'N ops':>8} {'parse s':>8} {'AST s':>8} {'lark s':>8} {'emit s':>8} {'verify s':>8} {'print s':>8} "
          f"{'parse wall':>10} {'parse s/1k':>10} {'print s/1k':>10}")
    for n in (int(s) for s in args.sizes.split(",")):
        t_parse, t_ast, t_lark, t_emit, t_verify, t_print, wall = measure(n, args.repeat)
        k = n / 1000
        print(f"{n:8d} {t_parse:8.3f} {t_ast:8.3f} {t_lark:8.3f} {t_emit:8.3f} {t_verify:8.3f} {t_print:8.3f} "
              f"{wall:10.3f} {t_parse / k:10.4f} {t_print / k:10.4f}", flush=True)


if __name__ == "__main__":
    main()
