"""The pass interface: a small class with a kebab-case name, options as a frozen dataclass,
a docstring with a before/after example, and `run`, which says whether it changed the IR."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..analysis.manager import Analyses
from ..errors import GirPassError, did_you_mean
from ..ir.core import Module
from .rewriter import PassStatistics


@dataclass(frozen=True)
class NoOptions:
    def validate(self, pass_name: str) -> None:
        """Raises GirPassError when the values break the pass's constraints (a pass's options
        class defines its own); called whenever a pass is built, so a bad option fails when the
        pipeline is parsed, not when the pass runs."""


class Pass:
    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    idempotent: ClassVar[bool] = False
    """Running it again on the IR it left changes nothing (when its last run set `converged`,
    or has no such attribute): the pass manager then skips a run on unchanged IR."""

    def __init__(self, options: Any = None):
        self.options = options if options is not None else self.Options()
        validate = getattr(self.options, "validate", None)
        if validate is not None:
            validate(self.name)
        self.analyses = Analyses()
        """The pipeline's analysis cache (the pass manager sets it before `run`): a pass that
        computes an analysis puts it here; one that needs an analysis asks here first."""

    def run(self, module: Module, stats: PassStatistics) -> bool:
        raise NotImplementedError(f"pass {self.name} must implement run")

    @classmethod
    def from_options(cls, raw: dict[str, str]) -> Pass:
        """Builds the pass from `name{key=value,...}` options, converting to the field types."""
        fields = {f.name: f for f in dataclasses.fields(cls.Options)}
        values: dict[str, Any] = {}
        for key, text in raw.items():
            attr = key.replace("-", "_")
            if attr not in fields:
                options = [f.replace("_", "-") for f in fields]
                raise GirPassError(f"pass '{cls.name}' has no option '{key}' (options: {', '.join(options) or 'none'})"
                                   + did_you_mean(key, options))
            values[attr] = _convert(cls.name, key, text, fields[attr].default)
        return cls(cls.Options(**values))

    def spec(self) -> str:
        """The pipeline text that rebuilds this pass with its options."""
        changed = [(f.name, getattr(self.options, f.name)) for f in dataclasses.fields(self.options)
                   if getattr(self.options, f.name) != f.default]
        if not changed:
            return self.name
        inner = ",".join(f"{k.replace('_', '-')}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changed)
        return f"{self.name}{{{inner}}}"


def _convert(pass_name: str, key: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise GirPassError(f"option '{key}' of pass '{pass_name}' cannot be {text!r} "
                           f"(expected {type(default).__name__})") from None
    return text
