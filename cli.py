"""The `gir` command: `gir opt`, `gir run` (and `gir compile` with the CPU backend).

Errors are printed as `file:line:col: error: ...` with the source line and a caret, never as
a Python traceback; the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from .errors import GirArgumentError, GirError
from .frontend.parser import load
from .ir.core import Function, Module
from .ir.interpreter import interpret
from .ir.printer import print_module


def random_inputs(f: Function, seed: int) -> list[np.ndarray]:
    """Seeded random arguments for f: floats ~ N(0, 0.1), ints in [0, 3), bools fair."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in f.args:
        t = arg.tensor_type
        if not t.is_static:
            raise GirArgumentError(f"--random cannot invent a size for {t} (argument %{arg.name_hint}); "
                                   "use --inputs", f.loc)
        if t.is_float:
            out.append((0.1 * rng.standard_normal(t.shape)).astype(t.numpy_dtype))
        elif t.dtype == "i1":
            out.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            out.append(rng.integers(0, 3, t.shape).astype(t.numpy_dtype))
    return out


def load_inputs(f: Function, path: str) -> list[np.ndarray]:
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise GirArgumentError(f"cannot read inputs from {path}: {e}") from None
    out = []
    for arg in f.args:
        key = arg.name_hint or ""
        if key not in data:
            raise GirArgumentError(f"{path} has no array named '{key}' for argument %{key} of @{f.name}; it has "
                                   + ", ".join(sorted(data.keys())), f.loc)
        out.append(data[key])
    return out


def summarize(i: int, a: np.ndarray) -> str:
    flat = a.reshape(-1)[:4]
    values = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat)
    more = ", ..." if a.size > 4 else ""
    return f"out{i}: shape {tuple(a.shape)} {a.dtype} [{values}{more}]"


def entry_of(module: Module, name: str | None) -> Function:
    if not module.functions:
        raise GirArgumentError(f"{module.filename} defines no function")
    if name is None:
        return list(module.functions.values())[-1]
    name = name.lstrip("@")
    if name not in module.functions:
        raise GirArgumentError(f"no function @{name} in {module.filename}; it has "
                               + ", ".join("@" + n for n in module.functions))
    return module.functions[name]


def cmd_opt(args: argparse.Namespace) -> int:
    module = load(args.file)
    text = print_module(module, print_locations=args.print_locations)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    module = load(args.file)
    f = entry_of(module, args.entry)
    if args.inputs:
        inputs = load_inputs(f, args.inputs)
    else:
        inputs = random_inputs(f, args.random if args.random is not None else 0)
    results = interpret(module, f.name, *inputs)
    for i, a in enumerate(results):
        print(summarize(i, a))
    if args.outputs:
        np.savez(args.outputs, **{f"out{i}": a for i, a in enumerate(results)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gir", description="gir: a compiler for tensor programs with loops")
    sub = p.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("opt", help="parse, verify, transform and print a .gir file")
    opt.add_argument("file")
    opt.add_argument("-o", "--output", help="write the IR here instead of stdout")
    opt.add_argument("--print-locations", action="store_true", help="print loc(...) on every op")
    opt.set_defaults(func=cmd_opt)

    run = sub.add_parser("run", help="run a function of a .gir file")
    run.add_argument("file")
    run.add_argument("-e", "--entry", help="function to run (default: the last one)")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--inputs", help=".npz with one array per parameter name (without %%)")
    src.add_argument("--random", type=int, metavar="SEED", help="seeded random inputs (the default, seed 0)")
    run.add_argument("--outputs", help="save results as out0, out1, ... in this .npz")
    run.add_argument("--device", choices=["interp"], default="interp")
    run.set_defaults(func=cmd_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GirError as e:
        print(e, file=sys.stderr)
        return 1
    except RecursionError:
        print("error: the program is nested too deeply", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug in gir, not in the program: say so, without a traceback
        if os.environ.get("GIR_TRACEBACK"):
            raise
        print(f"gir: internal error: {type(e).__name__}: {e}\n(this is a bug in gir; run with GIR_TRACEBACK=1 "
              "for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
