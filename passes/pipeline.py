"""The table of all passes, the default pipeline, and pipeline strings.

A pipeline string is a comma-separated list of pass names, each optionally followed by options
in braces: `ssa,canonicalize,scan-grad{max-extra-bytes=1000000}`.
"""

from __future__ import annotations

from ..errors import GirPassError, did_you_mean
from .autodiff import Autodiff
from .base import Pass
from .canonicalize import Canonicalize
from .fuse import Fuse
from .inline import Inline
from .liveness import LivenessPass, PrintLiveness
from .memplan import Memplan
from .placement import Place
from .scan_grad import ScanGrad
from .ssa import SSA

PASSES: dict[str, type[Pass]] = {p.name: p for p in [
    SSA,
    Canonicalize,
    Autodiff,
    ScanGrad,
    Inline,
    Fuse,
    Place,
    LivenessPass,
    PrintLiveness,
    Memplan,
]}
"""Every pass, by name. A new pass is added here and nowhere else."""

DEFAULT_PIPELINE = "ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize,scan-grad,canonicalize"
"""scan-grad runs twice: before autodiff it hoists input projections and merges GEMMs (so the
gradients inherit one GEMM per step), after it it pushes weight-gradient accumulations out."""

BACKEND_PIPELINE = "inline,canonicalize,fuse,memplan"
"""What gir.jit runs after the default pipeline, before handing the IR to a backend: the last
pass plans memory, and the backend lays its arena out by that plan (passes/analysis.py)."""
"""What `gir opt` runs without -p, and what `gir run` and `gir.jit` run before executing."""


def split_pipeline(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise GirPassError(f"unbalanced '}}' in pipeline {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise GirPassError(f"unbalanced '{{' in pipeline {text!r}")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def parse_pipeline(text: str) -> list[Pass]:
    passes = []
    for item in split_pipeline(text):
        name, _, rest = item.partition("{")
        name = name.strip()
        cls = PASSES.get(name)
        if cls is None:
            raise GirPassError(f"unknown pass '{name}'; passes: " + ", ".join(PASSES) + did_you_mean(name, PASSES))
        options: dict[str, str] = {}
        if rest:
            if not rest.endswith("}"):
                raise GirPassError(f"bad options in {item!r}; write name{{key=value,...}}")
            for pair in split_pipeline(rest[:-1]):
                key, eq, value = pair.partition("=")
                if not eq:
                    raise GirPassError(f"option {pair!r} of pass '{name}' needs a value: key=value")
                key = key.strip()
                if key in options:
                    raise GirPassError(f"option '{key}' of pass '{name}' is given twice in {item!r}")
                options[key] = value.strip()
        passes.append(cls.from_options(options))
    return passes
