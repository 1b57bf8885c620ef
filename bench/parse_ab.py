"""Text to AST and emit, A/B between two gir trees, in interleaved processes.

Each round runs one process per tree (A, then B); each process times `parse_ast` (text to the
typed AST, as `gir.parse` does it) and `emit_module` (AST to IR) on generated programs, median
of 3 with the GC off (as `gir.parse` runs them), in CPU seconds. The table gives the medians
over rounds. Programs: `surface` = bench/passes_scale.py's units (what `gir opt` reads in
bench/compile_time.py), `ssa` = bench/parse_scale.py's printed form.

    python bench/parse_ab.py --a "" --b /work/wt/parse [--sizes 25000,50000,100000] [--rounds 3]

`--a`/`--b` are PYTHONPATH entries holding a `gir` package ("" = the installed one).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def child(sizes: list[int]) -> None:
    sys.path.insert(0, str(BENCH))
    import parse_scale
    import passes_scale
    from gir.frontend.emitter import emit_module
    from gir.frontend.parser import _parser, parse_ast

    _parser()
    out = {}
    for form in ("surface", "ssa"):
        for n in sizes:
            text = passes_scale.program_of_about(n) if form == "surface" else parse_scale.program(n)
            ast_s, emit_s = [], []
            for _ in range(3):
                gc.collect()
                gc.disable()
                t0 = time.process_time()
                funcs = parse_ast(text, "bench.gir")
                t1 = time.process_time()
                emit_module(funcs, "bench.gir")
                t2 = time.process_time()
                gc.enable()
                ast_s.append(t1 - t0)
                emit_s.append(t2 - t1)
            out[f"{form} {n}"] = (statistics.median(ast_s), statistics.median(emit_s))
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="", help="PYTHONPATH of tree A ('' = the installed gir)")
    ap.add_argument("--b", required=True, help="PYTHONPATH of tree B")
    ap.add_argument("--sizes", default="25000,50000,100000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(sizes)
        return
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for _ in range(args.rounds):
        for name, path in (("A", args.a), ("B", args.b)):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            if path:
                env["PYTHONPATH"] = path
            p = subprocess.run([sys.executable, __file__, "--child", "--b", "-", "--sizes", args.sizes], env=env,
                               capture_output=True, text=True, check=True)
            runs[name].append(json.loads(p.stdout))
    print(f"{'program':16} {'AST A':>7} {'AST B':>7} {'B/A':>5} {'emit A':>7} {'emit B':>7} {'B/A':>5}")
    for key in runs["A"][0]:
        a = [statistics.median(r[key][i] for r in runs["A"]) for i in (0, 1)]
        b = [statistics.median(r[key][i] for r in runs["B"]) for i in (0, 1)]
        print(f"{key:16} {a[0]:7.3f} {b[0]:7.3f} {b[0] / a[0]:5.2f} {a[1]:7.3f} {b[1]:7.3f} {b[1] / a[1]:5.2f}")


if __name__ == "__main__":
    main()
