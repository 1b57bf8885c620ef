"""Training steps of bench/rnn.py's models as test cases: the source, the inputs and the
interpreter's results (the oracle), shared by the backend's schedule and loading tests."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType
from typing import Any

import gir

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, imported by path (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_gir_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def training_step(model: str, steps: int, batch: int, inputs: int, hidden: int) -> tuple[str, list, Any]:
    """(source of @<model>_grads, its arguments, the interpreter's results for them)."""
    rnn = bench_module("rnn")
    src = rnn.gir_source(model, steps, batch, inputs, hidden)
    p = rnn.make_inputs(model, steps, batch, inputs, hidden, 0)
    args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
    return src, args, gir.jit(src, f"{model}_grads", device="interp")(*args)
