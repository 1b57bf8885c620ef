"""The rewriter every transforming pass goes through, and a greedy worklist pattern driver.

A `Pattern` matches one op kind (`op_name`), bails out early, and states its rewrite as an
equation in its docstring. The `Rewriter` creates, replaces and erases ops while keeping use
lists right, and counts per pattern (or per named activity of a pass) how often it applied,
how many ops it created and erased, and how long it took: the profile `--timing` prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import UNKNOWN, Location, creating
from ..ir.core import Block, Function, Operation, Region, Value, erase_op
from ..ir.ops import make_op
from ..ir.types import TensorType


@dataclass
class PatternStats:
    tried: int = 0
    applied: int = 0
    created: int = 0
    erased: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"tried": self.tried, "applied": self.applied, "created": self.created, "erased": self.erased,
                "seconds": round(self.seconds, 6)}


@dataclass
class PassStatistics:
    """What one pass did, for --timing and --stats-json."""

    patterns: dict[str, PatternStats] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    """Named events: applications and rejected candidates (`rejected: too much memory`)."""
    notes: list[str] = field(default_factory=list)
    """Human-readable reasons, one per rejected candidate."""
    decisions: list[Any] = field(default_factory=list)
    """What the pass decided, as frozen dataclasses (the `checkpoint` pass's segment choices),
    for reports that outlive the analyses a later pass invalidates (`gir opt --memplan-report`,
    `fn.stats.compile`)."""

    def pattern(self, name: str) -> PatternStats:
        stats = self.patterns.get(name)
        if stats is None:
            stats = self.patterns[name] = PatternStats()
        return stats

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


class Rewriter:
    """Creates and erases ops, attributing each to the pattern that is `current`."""

    def __init__(self, stats: PassStatistics | None = None):
        self.stats = stats or PassStatistics()
        self.current = "other"
        self.worklist: list[Operation] | None = None
        self.changed = False
        self.origin: Location | None = None
        """Where ops created without a `loc` come from, inside `made_from`."""
        self.pin: str | None = None
        """The `device` written on the op `made_from` names: ops made from it keep it."""

    def _note_created(self, op: Operation) -> None:
        self.stats.pattern(self.current).created += 1
        self.changed = True
        if self.worklist is not None:
            self.worklist.append(op)

    # -- creation ---------------------------------------------------------------------------
    @contextmanager
    def made_from(self, op: Operation, action: str = "from") -> Iterator[None]:
        """Ops created inside come from the user op `op`: they take its location unless given
        one, and an error on one says the running pass made it `action` `op` (errors.Origin).
        For ops put somewhere else than `op` (scan-grad's GEMM after the loop, from the
        accumulation inside it), where the nearest location would be an unrelated op's."""
        saved = self.origin, self.pin
        self.origin = op.loc if op.loc != UNKNOWN else _nearest_location(op, None)
        self.pin = op.attrs.get("device")
        try:
            with creating(action=action):
                yield
        finally:
            self.origin, self.pin = saved

    def create(self, name: str, operands: Sequence[Value], *, before: Operation | None = None,
               after: Operation | None = None, at_end: Block | None = None, loc: Location | None = None,
               **kw: Any) -> Operation:
        """make_op + insert: exactly one of before / after / at_end says where. Without a `loc`,
        the op takes the nearest known location of where it goes (the anchor, else the op whose
        body it is put in, outwards), so an error about it points at the user's source; inside
        `made_from`, the location of the op it is made from."""
        anchor = before or after
        if loc is None or loc == UNKNOWN:
            loc = self.origin if self.origin is not None else _nearest_location(anchor, at_end)
        if self.pin is not None and "device" not in (kw.get("attrs") or {}):
            # A device written in the input is the user's pin: what a rewrite makes from the
            # pinned op stays on that device (placement respects pins, not guesses).
            kw["attrs"] = {**(kw.get("attrs") or {}), "device": self.pin}
        op = make_op(name, operands, loc=loc, **kw)
        if before is not None:
            before.parent.insert_before(before, op)  # type: ignore[union-attr]
        elif after is not None:
            after.parent.insert_after(after, op)  # type: ignore[union-attr]
        else:
            assert at_end is not None
            at_end.append(op)
        self._note_created(op)
        return op

    def value(self, name: str, operands: Sequence[Value], *, before: Operation, **kw: Any) -> Value:
        return self.create(name, operands, before=before, **kw).result

    def constant(self, value: Any, type: TensorType, *, before: Operation) -> Value:
        return self.create("constant", [], before=before, attrs={"value": value}, declared=[type]).result

    def adopt(self, op: Operation) -> None:
        """Counts an op the pass built itself (e.g. a new scan with moved regions)."""
        self._note_created(op)

    # -- replacement and erasure ------------------------------------------------------------
    def replace_all_uses(self, old: Value, new: Value) -> None:
        if old is new:
            return
        if self.worklist is not None:
            self.worklist.extend(old.users)
        old.replace_all_uses_with(new)
        self.changed = True

    def replace_op(self, op: Operation, new_values: Sequence[Value]) -> None:
        assert len(new_values) == len(op.results), (op.name, len(new_values))
        for old, new in zip(op.results, new_values):
            self.replace_all_uses(old, new)
        self.erase(op)

    def erase(self, op: Operation) -> None:
        """Erases op (and its regions); operands whose definers may now be dead go on the worklist."""
        regions = op.regions
        n = 1 + sum(region.block.num_ops() for region in regions) if regions else 1  # most ops: no generator
        if self.worklist is not None:
            for v in op.operands:
                owner = v.defining_op
                if owner is not None:
                    self.worklist.append(owner)
        erase_op(op)
        self.stats.pattern(self.current).erased += n
        self.changed = True

    def clone(self, op: Operation, mapping: dict[Value, Value]) -> Operation:
        """A copy of op (regions included) whose operands go through `mapping`; not inserted.
        Results of the copy are added to mapping, so a list of ops can be cloned in order."""
        regions = []
        for region in op.regions:
            old = region.block
            block = Block([a.type for a in old.args], [a.name_hint for a in old.args])
            mapping.update(zip(old.args, block.args))
            for inner in old:
                block.append(self.clone(inner, mapping))
            regions.append(Region(block))
        new = Operation(op.name, [mapping.get(v, v) for v in op.operands], [r.type for r in op.results],
                        dict(op.attrs), regions, op.loc, op.segments, [r.name_hint for r in op.results])
        mapping.update(zip(op.results, new.results))
        self._note_created(new)
        return new

    def move_before(self, op: Operation, anchor: Operation) -> None:
        op.parent.unlink(op)  # type: ignore[union-attr]
        anchor.parent.insert_before(anchor, op)  # type: ignore[union-attr]
        self.changed = True


def _nearest_location(anchor: Operation | None, block: Block | None) -> Location:
    op = anchor if anchor is not None else block.parent_op if block is not None else None
    while op is not None and op.loc == UNKNOWN:
        op = op.parent_op
    return op.loc if op is not None else UNKNOWN


class Pattern:
    """A local rewrite of one op kind; subclasses set `op_name` and a docstring equation."""

    op_name: str = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    def match_and_rewrite(self, op: Operation, rewriter: Rewriter) -> bool:
        raise NotImplementedError(f"{self.name} must implement match_and_rewrite")


def _ops_in(regions: Iterable[Region]) -> list[Operation]:
    out: list[Operation] = []
    for region in regions:
        out.extend(region.block.walk())
    return out


def apply_patterns_greedily(function: Function, patterns: Sequence[Pattern], rewriter: Rewriter,
                            max_rewrites: int = 10_000_000) -> bool:
    """Applies patterns until none applies; each op is revisited only when something it
    depends on or feeds changed, so the cost is linear in ops plus rewrites."""
    by_kind = _patterns_by_kind(patterns, rewriter.stats)
    worklist = list(reversed(_ops_in([function.region])))
    rewriter.worklist = worklist
    changed = False
    rewrites = 0
    clock = time.perf_counter
    try:
        while worklist:
            op = worklist.pop()
            if op.parent is None:  # erased meanwhile
                continue
            start = clock()
            for p, name, stats in by_kind.get(op.name, ()):
                stats.tried += 1
                rewriter.current = name
                applied = p.match_and_rewrite(op, rewriter)
                end = clock()  # one read per try: the end of this try is the start of the next
                stats.seconds += end - start
                start = end
                if applied:
                    stats.applied += 1
                    changed = True
                    rewrites += 1
                    if rewrites > max_rewrites:
                        raise RuntimeError("pattern rewriting does not terminate: patterns undo each other")
                    break
    finally:
        rewriter.worklist = None
    return changed


_Entry = tuple["Pattern", str, PatternStats]
"""A pattern, its name and its statistics."""


def _patterns_by_kind(patterns: Sequence[Pattern], stats: PassStatistics) -> dict[str, list[_Entry]]:
    """Op kind -> its patterns in order, each with its name and statistics (looked up once, not
    per try); every pattern is listed in the report even if it never applies."""
    by_kind: dict[str, list[_Entry]] = {}
    for p in patterns:
        name = p.name
        by_kind.setdefault(p.op_name, []).append((p, name, stats.pattern(name)))
    return by_kind
