"""The table of all passes, the default pipeline, and pipeline strings.

A pipeline string is a comma-separated list of pass names, each optionally followed by options
in braces: `ssa,canonicalize,scan-grad{max-extra-bytes=1000000}`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

from ..errors import GirArgumentError, GirPassError, did_you_mean
from .base import Pass


class _PassTable(MutableMapping[str, type[Pass]]):
    """Pass name -> pass class, each pass's module imported when its class is first asked for:
    `gir opt` with the default pipeline needs 4 of the 10 (placement, memplan, liveness, fuse
    and inline are ~20 ms of a start-up). Iterating the names imports nothing; `.items()` and
    `.values()` import every pass. A class may also be set directly (tests add passes)."""

    def __init__(self, where: dict[str, str]):
        self._where = dict(where)
        """name -> `module:Class`, a module of transforms/, for passes not imported yet."""
        self._classes: dict[str, type[Pass]] = {}
        self._order = list(where)

    def __getitem__(self, name: str) -> type[Pass]:
        cls = self._classes.get(name)
        if cls is None:
            module, _, attr = self._where[name].partition(":")  # KeyError for an unknown name
            cls = getattr(importlib.import_module(f"..transforms.{module}", __package__), attr)
            assert cls.name == name, f"PASSES says {name!r} is {self._where[name]}, which is named {cls.name!r}"
            self._classes[name] = cls
        return cls

    def __setitem__(self, name: str, cls: type[Pass]) -> None:
        if name not in self._where and name not in self._classes:
            self._order.append(name)
        self._where.pop(name, None)
        self._classes[name] = cls

    def __delitem__(self, name: str) -> None:
        if name not in self._where and name not in self._classes:
            raise KeyError(name)
        self._where.pop(name, None)
        self._classes.pop(name, None)
        self._order.remove(name)

    def __contains__(self, name: object) -> bool:
        return name in self._where or name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


PASSES: MutableMapping[str, type[Pass]] = _PassTable({
    "ssa": "ssa:SSA",
    "canonicalize": "canonicalize:Canonicalize",
    "autodiff": "autodiff:Autodiff",
    "scan-grad": "scan_grad:ScanGrad",
    "checkpoint": "checkpoint:Checkpoint",
    "inline": "inline:Inline",
    "fuse": "fuse:Fuse",
    "place": "placement:Place",
    "liveness": "liveness:LivenessPass",
    "print-liveness": "liveness:PrintLiveness",
    "memplan": "memplan:Memplan",
})
"""Every pass, by name (`module:Class` in transforms/, imported on first use). A new pass is
added here and nowhere else."""

DEFAULT_PIPELINE = "ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize,scan-grad,canonicalize"
"""scan-grad runs twice: before autodiff it hoists input projections and merges GEMMs (so the
gradients inherit one GEMM per step), after it it pushes weight-gradient accumulations out."""

BACKEND_PIPELINE = "inline,canonicalize,fuse,memplan"
"""What gir.jit runs after the default pipeline, before handing the IR to a backend: the last
pass plans memory, and the backend lays its arena out by that plan (analysis/manager.py).
`DEFAULT_PIPELINE` is what `gir opt` runs without -p, and what `gir run` and `gir.jit` run
before this."""


@dataclass(frozen=True)
class Mode:
    """A compile mode: a named pipeline (DESIGN.md §4, Theano's FAST_COMPILE / FAST_RUN).

    `front` is what `gir opt --mode` and `gir run --mode` run with the debugging flags; `backend`
    what gir.jit runs after it for the CPU and GPU backends; for `device="auto"` the `place`
    pass with this mode's policy runs right before the backend's last pass (`memplan`), after
    `fuse`, so a fused group is placed as one op (docs/placement.md)."""

    name: str
    front: str
    backend: str
    policy: str
    """The `place` policy for device="auto": aggressive or lift."""
    gives_up: str
    """One line for `--help` and docs: what this mode trades away."""

    def backend_pipeline(self, device: str) -> str:
        """The passes after `front`, for a backend (`cpu`, `gpu`, `interp`, or `auto`: placed).
        For `gpu` the last pass plans the views the GPU backend makes (`memplan{views=strided}`:
        analysis/memory/aliases.py, docs/memplan.md)."""
        if device == "gpu":
            *before, last = split_pipeline(self.backend)
            planned = last.partition("{")[0] == "memplan"
            return ",".join([*before, _with_options(last, "views=strided") if planned else last])
        if device != "auto":
            return self.backend
        *before, last = split_pipeline(self.backend)
        return ",".join([*before, f"place{{policy={self.policy}}}", last])

    def pipeline(self, device: str) -> str:
        """The whole pipeline gir.jit runs for device."""
        return f"{self.front},{self.backend_pipeline(device)}"


MODES: dict[str, Mode] = {m.name: m for m in [
    Mode("fast-run", DEFAULT_PIPELINE, BACKEND_PIPELINE, "lift",
         "nothing: every pass runs; compiling takes longest"),
    Mode("fast-compile", "ssa,canonicalize,autodiff,canonicalize", "inline,fuse,memplan", "aggressive",
         "scan-grad (no GEMM hoisting or merging, weight gradients accumulated per step) and the "
         "canonicalize runs between and after them; aggressive placement (more transfers)"),
]}
"""The compile modes by name; `fast-run` is the default."""

DEFAULT_MODE = "fast-run"


def get_mode(name: str) -> Mode:
    """The mode called name; a GirArgumentError listing the modes otherwise."""
    mode = MODES.get(name)
    if mode is None:
        raise GirArgumentError(f"unknown mode {name!r}; modes: " + ", ".join(MODES))
    return mode


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


def with_memory_budget(pipeline: str, budget: int) -> str:
    """pipeline, made to fit `budget` bytes (docs/memplan.md, "Memory budget"):
    `checkpoint{budget=N}` right after the first `autodiff` (and the canonicalize that follows
    it), before the second `scan-grad`; the `scan-grad` runs before autodiff neither hoist input
    projections nor merge sums of products, so that the one after `checkpoint` hoists them
    per segment (a projection hoisted before autodiff would stay T steps long). Without an
    autodiff, `checkpoint` goes last. A pipeline that has a `checkpoint` already is kept."""
    items = split_pipeline(pipeline)
    if any(item.partition("{")[0].strip() == "checkpoint" for item in items):
        return pipeline
    names = [item.partition("{")[0].strip() for item in items]
    where = len(items)
    if "autodiff" in names:
        at = names.index("autodiff")
        where = at + 2 if at + 1 < len(names) and names[at + 1] == "canonicalize" else at + 1
        for i in range(at):
            if names[i] == "scan-grad":
                items[i] = _with_options(items[i], "hoist=false,merge-sums=false")
    # the budget bounds the peak of the plan the backend lays its memory out by: the last
    # memplan's view rules (the GPU's pipeline runs memplan{views=strided})
    views = next((_option(item, "views") for item in reversed(items)
                  if item.partition("{")[0].strip() == "memplan" and _option(item, "views")), None)
    items.insert(where, f"checkpoint{{budget={budget}" + (f",views={views}" if views else "") + "}")
    return ",".join(items)


def _option(item: str, key: str) -> str | None:
    """The value of option key in a pipeline item `name{key=value,...}`, or None."""
    _, brace, rest = item.partition("{")
    if not brace:
        return None
    for part in rest.rstrip("}").split(","):
        k, eq, v = part.partition("=")
        if eq and k.strip() == key:
            return v.strip()
    return None


def _with_options(item: str, options: str) -> str:
    name, brace, rest = item.partition("{")
    return f"{name}{{{options}}}" if not brace else f"{name}{{{rest[:-1]},{options}}}"


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(value: int | str | None) -> int | None:
    """A memory budget in bytes: an int, or a string like "256MB", "1GB", "512MiB", "1e9";
    None or "" for no budget. A GirArgumentError says what is accepted otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise GirArgumentError(f"memory budget must be a number of bytes or a string like '1GB', not {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise GirArgumentError(f"memory budget {value!r}: write bytes as an integer or with a unit "
                                   f"(B, KB, MB, GB, KiB, MiB, GiB), e.g. '256MB'")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise GirArgumentError(f"memory budget must be positive, got {value!r}")
    return n
