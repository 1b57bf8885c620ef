"""Which `?` dims of a call are a run-time length, and the module that serves every length.

    found = find_length(make, "lstm_grads", pipeline, shapes, candidate_groups(shapes, free))
    # a ForEveryLength (compile found.module's entry with found.lengths) or the reason why not

A *group* is a set of `?` leading dims of the signature that have one value in a call (the
sequence length T of `%xs` and `%ys`, say). For each group, `make` gives the module at the two
representative lengths, the pipeline runs on both, and analysis/lengths.py compares them: the
first group that is a length wins. A group that sets no loop's trip count is skipped before
any pass runs (a batch dim), as is one whose module does not specialise (a dim shared with
another `?`). The rest of the call's dims stay as they are: they are specialised as before.

Costs: the first compile of a signature with `?` leading dims specialises twice per group
tried, runs the pipeline twice for the group that is a length, three times where constants
follow it (docs/backend.md, "One compile for every length").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.lengths import LengthDims, NotALength, compare, verify
from ..analysis.memory.plan import MemoryPlan
from ..errors import GirError
from ..ir.core import Module
from ..ir.loops import as_loop
from ..support import timing
from .compile import Backend, CompileOptions, Executable, blas_threads, run_passes
from .jitstats import CompileStats, CompileTimer

REPRESENTATIVES = (11, 13)
"""The two lengths a module is made at to find its length dims: distinct, above 1 (no dim of 0
or 1, where broadcasting differs), and unlikely to equal a batch or hidden size."""
THIRD = 17
"""Where constants follow the length (a `mean`'s count), the length they are checked at."""

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class LengthGroup:
    """`?` leading dims that are one length: (argument, axis) each."""

    positions: tuple[tuple[int, int], ...]

    def length(self, shapes: Sequence[Sequence[int]]) -> int | None:
        """The length these shapes give the group (None: its dims differ)."""
        found = {shapes[i][axis] for i, axis in self.positions}
        return found.pop() if len(found) == 1 else None

    def generic(self, shapes: Shapes) -> tuple:
        """shapes with the group's dims as None: the key of the code for every length."""
        out: list[list[int | None]] = [list(s) for s in shapes]
        for i, axis in self.positions:
            out[i][axis] = None
        return tuple(tuple(s) for s in out)

    def at(self, shapes: Shapes, t: int) -> Shapes:
        out = [list(s) for s in shapes]
        for i, axis in self.positions:
            out[i][axis] = t
        return tuple(tuple(s) for s in out)


def leading_free_dims(arg_types: Sequence[Any]) -> list[tuple[int, int]]:
    """(argument, 0) of each argument whose leading dim is `?`: the dims a length may be."""
    return [(i, 0) for i, t in enumerate(arg_types) if t.rank and t.shape[0] is None]


def candidate_groups(shapes: Shapes, free: Sequence[tuple[int, int]]) -> list[LengthGroup]:
    """free's dims grouped by their value in this call, in argument order."""
    by_value: dict[int, list[tuple[int, int]]] = {}
    for i, axis in free:
        by_value.setdefault(shapes[i][axis], []).append((i, axis))
    return [LengthGroup(tuple(p)) for p in by_value.values()]


@dataclass(frozen=True, eq=False)
class ForEveryLength:
    """A module at the first representative length, after the pipeline, and its length dims."""

    group: LengthGroup
    module: Module
    report: Any
    """The pipeline's report (its `analyses` hold the memory plan)."""
    lengths: LengthDims


def find_length(make: Callable[[Shapes], Module], entry: str, pipeline: str, shapes: Shapes,
                groups: Sequence[LengthGroup]) -> ForEveryLength | str:
    """The first group that is a length, with its module; else why none is (one line)."""
    reasons = []
    for group in groups:
        try:
            found = _try(make, entry, pipeline, shapes, group)
        except (GirError, NotALength) as e:
            found = str(e).splitlines()[0]
        except Exception as e:  # noqa: BLE001 - a Python function traced at a length it was not called
            found = f"tracing at a representative length raised {type(e).__name__}: {e}"  # with may raise anything
        if isinstance(found, ForEveryLength):
            return found
        reasons.append(f"{_name(group)}: {found}")
    return "; ".join(reasons) or "no `?` leading dim"


def _try(make: Callable[[Shapes], Module], entry: str, pipeline: str, shapes: Shapes,
         group: LengthGroup) -> ForEveryLength | str:
    ta, tb = REPRESENTATIVES
    a, b = make(group.at(shapes, ta)), make(group.at(shapes, tb))
    if _trip_counts(a) == _trip_counts(b):
        return "sets no loop's trip count"
    report = run_passes(a, pipeline)
    run_passes(b, pipeline)
    lengths = compare(a.functions[entry], b.functions[entry], ta, tb)
    if lengths.constants:  # two points fit any line: a third says whether the constants do
        c = make(group.at(shapes, THIRD))
        run_passes(c, pipeline)
        verify(lengths, c.functions[entry], THIRD)
    return ForEveryLength(group, a, report, lengths)


def _trip_counts(module: Module) -> list[Any]:
    return [loop.trip_count for f in module.functions.values() for op in f.walk()
            if (loop := as_loop(op)) is not None]


def _name(group: LengthGroup) -> str:
    return ", ".join(f"argument {i} dim {axis}" for i, axis in group.positions)


def compile_every_length(make: Callable[[Shapes], Module], entry: str, backend: Backend, pipeline: str,
                         shapes: Shapes, groups: Sequence[LengthGroup],
                         serves: Callable[[Any, Shapes, LengthGroup], bool]) -> tuple[Executable, LengthGroup] | str:
    """Code for every length of the first of groups that is one, which serves shapes (`serves`),
    with its stats (as compile_entry's); else why not ('' when no group was tried: a length
    of 0 is specialised on its own, the passes may rely on a loop running)."""
    tried = [g for g in groups if (g.length(shapes) or 0) >= 1]
    if not tried:
        return "a length of 0 (the code for every length serves lengths >= 1)" if groups else ""
    timer = CompileTimer(CompileStats(entry, backend.name, shapes))
    try:
        with timer.stage("lengths"), timing.phase("lengths: two representative lengths"):
            found = find_length(make, entry, pipeline, shapes, tried)
        if isinstance(found, str):
            return found
        with timer.stage("backend"):
            options = CompileOptions(lengths=found.lengths)
            executable = backend.compile(found.module, entry, found.report.analyses, options)
    except NotALength as e:
        return str(e)
    finally:
        timer.cancel()
    if not serves(executable, shapes, found.group):
        return f"the code for every length does not serve {shapes}"
    stats = timer.stats
    for r in found.report.records:
        stats.passes[r.spec] = stats.passes.get(r.spec, 0.0) + r.seconds
    plan = found.report.analyses.get(MemoryPlan, found.module.functions[entry])
    stats.planned_peak = plan.peak_bytes if plan is not None and plan.supported else None
    stats.arena_bytes = executable.workspace_bytes
    stats.threads = blas_threads(executable)
    executable.compile_stats = timer.finish(executable)
    return executable, found.group
