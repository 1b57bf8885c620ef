"""Analyses the pipeline computed, handed from pass to pass and on to the backends.

An *analysis* is an object computed from one function's IR that does not change the IR: the
liveness (analysis/liveness.py `Liveness`), the memory plan (analysis/memory `MemoryPlan`), the
placement report (transforms/placement.py `PlacementReport`). The pass that computes one puts it
here (`analyses.put(function, result)`); a later pass or a backend asks for it by its class
(`analyses.get(MemoryPlan, function)`) instead of computing it again with default options, so
a pass option (`memplan{strategy=program}`) reaches the code that runs.

Invalidation is whole-module and conservative: the pass manager drops every cached analysis
after a pass that reports it changed the IR (`Pass.run` returns True), except those that pass
itself put (a pass that changes the IR and reports on the result, as `place` does, describes
the IR as it leaves it). An analysis that is still cached is therefore of the IR as it is now.

The printed form (`str(analyses)`) is sorted and stable, one line per function:
    @rnn_grads: Liveness, MemoryPlan
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..ir.core import Function

T = TypeVar("T")


class Analyses:
    def __init__(self) -> None:
        self._results: dict[tuple[type, Function], Any] = {}
        self._generation: dict[tuple[type, Function], int] = {}
        self._pass = 0
        """Counts the passes begun; an entry remembers the pass that put it."""

    def begin_pass(self) -> None:
        self._pass += 1

    def put(self, function: Function, result: Any) -> None:
        """Caches result (keyed by its class) as the analysis of function's current IR."""
        key = (type(result), function)
        self._results[key] = result
        self._generation[key] = self._pass

    def get(self, kind: type[T], function: Function) -> T | None:
        """The cached analysis of class `kind` of function, or None."""
        return self._results.get((kind, function))

    def all(self, kind: type[T]) -> list[T]:
        """Every cached analysis of class `kind`, in the order they were computed."""
        return [r for (k, _), r in self._results.items() if k is kind]

    def invalidate(self) -> None:
        """The current pass changed the IR: forgets every analysis put before it began."""
        for key in [k for k, g in self._generation.items() if g < self._pass]:
            del self._results[key], self._generation[key]

    def __len__(self) -> int:
        return len(self._results)

    def __str__(self) -> str:
        by_function: dict[str, list[str]] = {}
        for kind, f in self._results:
            by_function.setdefault(f.name, []).append(kind.__name__)
        return "".join(f"@{name}: {', '.join(sorted(kinds))}\n" for name, kinds in sorted(by_function.items()))
