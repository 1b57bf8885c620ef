"""Taking a `scan` apart and putting it back together, for passes that change its operands.

`ScanParts` names every piece of a scan: sequences (outer value, block argument), carries
(initial value, block argument, yielded value, result) and stacks (yielded value, result).
`scan_parts` reads them through the scan's `LoopView` (ir/loops.py); a pass edits the lists
(drops entries, appends new ones) and `rebuild_scan` makes the new op, moving the body over, so
no pass slices a flat operand list by position. The trip count is `LoopView(op).trip_count`;
`rebuild_scan` keeps it, writing it as `length` when the sequences left do not fix it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import rebuilding
from ..ir.core import BlockArgument, Operation, OpResult, Value
from ..ir.loops import LoopView
from ..ir.ops import make_op
from ..ir.spec import fails_at_run_time
from ..ir.types import TensorType
from ..passes.rewriter import Rewriter


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
    """The pieces of scan `op`, read through its loop view, as lists a pass may edit."""
    view = LoopView(op)
    assert view.is_scan, f"{op.name} has no carries: not a scan"
    g = view.groups()
    return ScanParts(
        op,
        [Sequence(outer, arg) for outer, arg in zip(g.sequences, g.element_args)],
        [Carry(*c) for c in zip(g.inits, g.carry_args, g.yielded_carries, g.final_carries)],
        [Stack(v, r) for v, r in zip(g.yielded_stacks, g.stacked_results)],
    )


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
    with rebuilding():  # the same yield and scan, rebuilt: an error on them is about the user's loop
        rw.create("yield", carries + stacks, before=term, segments=(len(carries), len(stacks)))
    rw.erase(term)
    for inner in reversed(body.ops):
        if inner.spec.pure and not inner.spec.terminator and not any(r.uses for r in inner.results) \
                and not fails_at_run_time(inner):
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
    if attrs["length"] is None and not any(s.outer.tensor_type.shape[0] is not None for s in parts.sequences):
        # The dropped sequences fixed the trip count (none left, or those left are `?` long):
        # `length` keeps it, so stacked results keep their types.
        attrs["length"] = LoopView(old).trip_count
    with rebuilding():
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
    view = LoopView(op)
    term = view.yield_op
    segments = (len(view.yielded_carries), len(view.yielded_stacks) + 1)
    term.add_operand(value)
    term.segments = segments
    t = value.tensor_type
    result = OpResult(TensorType((view.trip_count,) + t.shape, t.dtype), op, len(op.results),
                      (value.name_hint or "r") + "s" if value.name_hint and not value.name_hint.isdigit() else None)
    op.results.append(result)
    return result


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


def is_defined_inside(v: Value, op: Operation) -> bool:
    """v is in `defined_inside(op)`, found by walking out from where v is defined rather than
    by collecting every value of op's body (a pattern tried on each scan asks for a few values)."""
    owner = v.defining_op
    block = owner.parent if owner is not None else v.defining_block
    while block is not None:
        parent = block.parent_op
        if parent is op:
            return True
        if parent is None:
            return False
        block = parent.parent
    return False
