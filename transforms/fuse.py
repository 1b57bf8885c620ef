"""The `fuse` pass: groups elementwise ops into `fused` ops, each run as one loop nest.

Before:
    %0 = add %x, %y : tensor<32x256xf32>
    %1 = tanh %0 : tensor<32x256xf32>
    %2 = matmul %1, %w : tensor<32x256xf32>
After:
    %1 = fused (%a = %x, %b = %y) {
      %0 = add %a, %b : tensor<32x256xf32>
      %3 = tanh %0 : tensor<32x256xf32>
      yield (%3)
    } : tensor<32x256xf32>
    %2 = matmul %1, %w : tensor<32x256xf32>

Greedy and linear: in each block, in order, an elementwise op joins the open group of one of
its operands whose ops have the same result shape, and that reads at most `MAX_INPUTS` outside
values with it, else starts a group. A group closes as soon
as an op outside it reads one of its values, so the fused op can stand where its last member
stood (every outside reader comes later; every input was defined earlier). Splat constants
read by a group are copied into it, so backends see literals. Values read after the group
become its results; the rest live only in registers.

Ops placed on different devices (`device` attributes, as `place` or a user writes them) never
share a group. Loop bodies are fused in turn; an existing `fused` op (a structural region op, not
elementwise) is left as it is, neither joined nor entered, so the pass is idempotent:
`fuse,fuse` gives what `fuse` gives.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.core import Block, Module, Operation, Region, Value
from ..ir.ops import make_op, splat_value
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Rewriter

MAX_INPUTS = 64
"""A group reading more outside values than this takes no more ops: the loss or norm of a
pytree of thousands of leaves (a chain of adds over their sums) would otherwise be one fused op
of thousands of inputs, one LLVM function growing with the leaves (issue 30). Fused code reads
each input once an element anyway, so the cap costs a store and a load per extra group."""


def _fusable(op: Operation) -> bool:
    return op.spec.category == "elementwise" and op.result.tensor_type.is_static


class _Group:
    def __init__(self, first: Operation):
        self.ops = [first]
        self.shape = first.result.tensor_type.shape
        self.device = first.attrs.get("device")
        """Placed IR: a group never mixes devices (its ops all carry this `device`, or none)."""
        self.open = True
        self.inputs: set[Value] = set()
        """Values from outside that its ops read (splat constants included: an upper bound)."""

    def reads_with(self, op: Operation, other: _Group | None, group_of: Callable[[Value], _Group | None]) -> int:
        """How many outside values the group would read with op (and other's ops) joined. Two
        open groups never read each other's values (a reader outside a group closes it)."""
        inputs = self.inputs | other.inputs if other is not None else self.inputs
        extra = {v for v in op.operands if v not in inputs and group_of(v) not in (self, other)}
        return len(inputs) + len(extra)


def fuse_block(rw: Rewriter, block: Block) -> int:
    group_of: dict[Operation, _Group] = {}
    position: dict[Operation, int] = {}
    groups: list[_Group] = []

    def group_of_value(v: Value) -> _Group | None:
        owner = v.defining_op
        return None if owner is None else group_of.get(owner)

    for index, op in enumerate(block):
        position[op] = index
        if op.spec.loop:  # a loop body is a block of its own; a `fused` body is a group already
            fuse_block(rw, op.body)
        joined: _Group | None = None
        if _fusable(op):
            # Join every open operand group of this shape: open groups have no outside readers
            # yet, so their union can still stand here.
            for v in op.operands:
                g = group_of_value(v)
                if g is None or not g.open or g.shape != op.result.tensor_type.shape or g is joined \
                        or g.device != op.attrs.get("device") or g.reads_with(op, joined, group_of_value) > MAX_INPUTS:
                    continue
                if joined is None:
                    joined = g
                else:
                    joined.ops = sorted(joined.ops + g.ops, key=position.__getitem__)
                    joined.inputs |= g.inputs
                    for member in g.ops:
                        group_of[member] = joined
                    g.ops = []
        readers = [op] + [inner for r in op.regions for inner in r.block.walk()]
        for reader in readers:  # a reader outside a group (a loop body included) closes it
            for v in reader.operands:
                g = group_of_value(v)
                if g is not None and g is not joined:
                    g.open = False
        if joined is not None:
            joined.ops.append(op)
            group_of[op] = joined
            joined.inputs |= {v for v in op.operands if group_of_value(v) is not joined}
        elif _fusable(op):
            g = _Group(op)
            g.inputs = set(op.operands)
            groups.append(g)
            group_of[op] = g
    live = [g for g in groups if g.ops]
    for g in live:
        _outline(rw, g)
    return len(live)


def _outline(rw: Rewriter, g: _Group) -> None:
    members = set(g.ops)
    last = g.ops[-1]
    inputs: dict[Value, None] = {}  # ordered, and a set: a group of thousands of inputs (pytree leaves) stays linear
    constants: dict[Operation, None] = {}
    for op in g.ops:
        for v in op.operands:
            owner = v.defining_op
            if owner in members or v in inputs:
                continue
            # A scalar splat made from nothing (not a `fill` of an outer value) is copied in.
            if owner is not None and not owner.operands and splat_value(v) is not None \
                    and v.tensor_type.shape == ():
                constants[owner] = None
                continue
            inputs[v] = None
    outputs = [r for op in g.ops for r in op.results if any(u not in members for u in r.users)]
    if not outputs:
        # Nothing reads the group (dead code that canonicalize keeps: an op in it may fail, an
        # integer division by zero): it yields its last value, whose shape its loop nest runs over.
        outputs = [last.result]
    anchor = last.next
    parent = last.parent
    assert parent is not None and anchor is not None  # a terminator is never elementwise
    body = Block([v.type for v in inputs], [v.name_hint for v in inputs])
    operands = list(inputs)
    mapping: dict[Value, Value] = dict(zip(operands, body.args))
    for c in constants:
        body.append(rw.clone(c, mapping))
    for op in g.ops:
        body.append(rw.clone(op, mapping))
    body.append(make_op("yield", [mapping[r] for r in outputs], loc=last.loc, segments=(len(outputs), 0)))
    fused = make_op("fused", operands, regions=[Region(body)], loc=g.ops[0].loc,
                    result_names=[r.name_hint for r in outputs])
    parent.insert_before(anchor, fused)
    rw.adopt(fused)
    for old, new in zip(outputs, fused.results):
        rw.replace_all_uses(old, new)
    for op in reversed(g.ops):
        rw.erase(op)


class Fuse(Pass):
    name = "fuse"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        rw.current = "fuse-elementwise"
        for f in module.functions.values():
            stats.count("fused groups", fuse_block(rw, f.body))
        return rw.changed
