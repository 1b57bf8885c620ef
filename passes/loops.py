"""Taking a `scan` apart and putting it back together, for passes that change its operands.

`ScanParts` names every piece of a scan: sequences (outer value, block argument), carries
(initial value, block argument, yielded value, result) and stacks (yielded value, result).
A pass edits the lists (drops entries, appends new ones) and `rebuild_scan` makes the new op,
moving the body over, so no pass slices a flat operand list by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.core import BlockArgument, Operation, OpResult, Value
from ..ir.ops import make_op
from ..ir.types import TensorType
from .rewriter import Rewriter


@dataclass
class Sequence:
    outer: Value
    arg: BlockArgument


@dataclass
class Carry:
    init: Value
    arg: BlockArgument
    yielded: Value
    result: OpResult | None = None


@dataclass
class Stack:
    yielded: Value
    result: OpResult | None = None


@dataclass
class ScanParts:
    op: Operation
    sequences: list[Sequence] = field(default_factory=list)
    carries: list[Carry] = field(default_factory=list)
    stacks: list[Stack] = field(default_factory=list)


def scan_parts(op: Operation) -> ScanParts:
    assert op.name == "scan"
    body = op.body
    seqs, inits = op.group("sequences"), op.group("inits")
    term = body.terminator
    assert term is not None
    yielded_carries, yielded_stacks = term.group("carries"), term.group("stacks")
    n_seq = len(seqs)
    parts = ScanParts(op)
    parts.sequences = [Sequence(s, body.args[i]) for i, s in enumerate(seqs)]
    parts.carries = [Carry(v, body.args[n_seq + i], yielded_carries[i], op.results[i]) for i, v in enumerate(inits)]
    parts.stacks = [Stack(v, op.results[len(inits) + i]) for i, v in enumerate(yielded_stacks)]
    return parts


def rebuild_scan(rw: Rewriter, parts: ScanParts) -> Operation:
    """Builds the scan `parts` describes in place of parts.op.

    The new yield is written first, then body ops that nothing uses any more are erased; after
    that, block arguments dropped from parts and results of dropped carries and stacks must be
    unused (the caller's liveness guarantees it)."""
    old = parts.op
    body = old.body
    term = body.terminator
    assert term is not None
    carries = [c.yielded for c in parts.carries]
    stacks = [s.yielded for s in parts.stacks]
    rw.create("yield", carries + stacks, before=term, segments=(len(carries), len(stacks)))
    rw.erase(term)
    for inner in reversed(body.ops):
        if inner.spec.pure and not inner.spec.terminator and not any(r.uses for r in inner.results):
            rw.erase(inner)
    keep = [s.arg for s in parts.sequences] + [c.arg for c in parts.carries]
    for arg in body.args:
        if arg not in keep:
            assert not arg.uses, "a dropped scan block argument still has uses"
    body.args = keep
    for i, a in enumerate(keep):
        a.index = i
    region = old.regions.pop()
    attrs = dict(old.attrs)
    if not parts.sequences and attrs["length"] is None:
        attrs["length"] = _trip_count(old)
    new = make_op("scan", [s.outer for s in parts.sequences] + [c.init for c in parts.carries], attrs=attrs,
                  regions=[region], loc=old.loc, segments=(len(parts.sequences), len(parts.carries)))
    old.parent.insert_before(old, new)  # type: ignore[union-attr]
    rw.adopt(new)
    results = iter(new.results)
    for c in parts.carries:
        r = next(results)
        if c.result is not None:
            r.name_hint = c.result.name_hint
            rw.replace_all_uses(c.result, r)
        c.result = r
    for s in parts.stacks:
        r = next(results)
        if s.result is not None:
            r.name_hint = s.result.name_hint
            rw.replace_all_uses(s.result, r)
        s.result = r
    for r in old.results:
        assert not r.uses, "a dropped scan result still has uses"
    rw.erase(old)
    parts.op = new
    return new


def append_stack(op: Operation, value: Value) -> OpResult:
    """Makes scan `op` also stack `value` (a value of its body); returns the new result.

    Stacks come last in both the yield and the results, so appending in place keeps every
    existing operand, result and reference valid."""
    term = op.body.terminator
    assert term is not None and term.name == "yield"
    n_carries, n_stacks = term.segments
    term.add_operand(value)
    term.segments = (n_carries, n_stacks + 1)
    t = value.tensor_type
    result = OpResult(TensorType((_trip_count(op),) + t.shape, t.dtype), op, len(op.results),
                      (value.name_hint or "r") + "s" if value.name_hint and not value.name_hint.isdigit() else None)
    op.results.append(result)
    return result


def _trip_count(op: Operation) -> int | None:
    seqs = op.group("sequences")
    if seqs:
        return seqs[0].tensor_type.shape[0]
    return op.attrs["length"]


def trip_count(op: Operation) -> int | None:
    """The number of steps of a scan, None when it is a `?` dim."""
    return _trip_count(op)


def defined_inside(op: Operation) -> set[Value]:
    """Every value defined in op's regions (block arguments and results), at any depth."""
    out: set[Value] = set()
    for region in op.regions:
        out.update(region.block.args)
        for inner in region.block.walk():
            out.update(inner.results)
            for r in inner.regions:
                out.update(r.block.args)
    return out
