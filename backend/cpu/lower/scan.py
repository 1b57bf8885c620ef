"""scan: a native loop; sequence elements are views, carries and stacks have their own slots
(a stacked value computed in its row of the stack where it can be)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llvmlite import ir

from ....errors import GirError
from ....ir.core import Operation, Value
from ....ir.loops import LoopView
from ....ir.spec import view_source
from ..llvm_types import I8, I64, _i64, _static
from .gemm import _pack_weights

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def lower_scan(low: Lowering, op: Operation) -> None:
    loop = LoopView(op)
    steps: int | ir.Value | None = loop.trip_count
    if steps is None:
        raise GirError("the CPU backend needs a static trip count", op.loc)
    if loop.sequences:  # the sequences' leading dim: the length T where it follows it
        steps = low.shape(loop.sequences[0], op)[0]
    for c in loop.carries:
        p = low.slot(c.arg, op)
        low.memcpy(p, low.ptr[c.init], c.init.tensor_type.nbytes() or 0)
    for r in loop.stacked_results:
        low.slot(r, op)
    _pack_weights(low, op)
    carry_args = loop.carry_args
    low.worker.enter(op)
    with low.for_range(steps, "t") as i:
        t = low.b.sub(low.b.sub(_i64(steps), ir.Constant(I64, 1)), i) if loop.reverse else i
        for arg, seq in zip(loop.element_args, loop.sequences):
            st = seq.tensor_type
            row = math.prod(_static(st, op)[1:])
            low.ptr[arg] = low.elem_ptr(low.ptr[seq], st.dtype, low.b.mul(t, ir.Constant(I64, row)))
        rows = _stack_rows(low, loop, t)
        low.block(loop.body)
        for r, v in zip(loop.stacked_results, loop.yielded_stacks):
            if low.ptr[v] is rows[r]:  # computed in its row of the stack: nothing to copy
                low.layout.schedule["stack_copies_avoided"] += 1  # type: ignore[operator]
                continue
            low.layout.schedule["stack_copies"] += 1  # type: ignore[operator]
            low.memcpy(rows[r], low.ptr[v], v.tensor_type.nbytes() or 0)
        low.stack_rows.clear()
        new_carries = loop.yielded_carries
        # A carry yielded from another carry's storage (a swap) must not be overwritten before
        # it is read: copy those through a temporary slot.
        carry_set = set(carry_args)
        sources = []
        for v in new_carries:
            src = low.ptr[v]
            if low.root.get(v, v) in carry_set:
                tmp = low.alloc(v.tensor_type.nbytes() or 0)
                low.memcpy(tmp, src, v.tensor_type.nbytes() or 0)
                src = tmp
            sources.append(src)
        for arg, v, src in zip(carry_args, new_carries, sources):
            if v is not arg:
                low.memcpy(low.ptr[arg], src, v.tensor_type.nbytes() or 0)
        low.worker.step_done(op, i)
    for c in loop.carries:
        low.ptr[c.result] = low.ptr[c.arg]


def _stack_rows(low: Lowering, loop: LoopView, t: ir.Value) -> dict[Value, ir.Value]:
    """Each stacked result's row for step t. A stacked value that a body op computes into
    storage of its own (not a view, not a value from outside the body, stacked once) is
    computed in that row directly (`Lowering.slot`), saving a copy per step: memplan's plan
    keeps the value live to the end of the step, so no other value was planned into its slot
    while it lives, and its arena slot simply goes unused."""
    rows: dict[Value, ir.Value] = {}
    seen: set[Value] = set()
    for r, v in zip(loop.stacked_results, loop.yielded_stacks):
        nbytes = v.tensor_type.nbytes() or 0
        rows[r] = low.b.gep(low.ptr[r], [low.b.mul(t, ir.Constant(I64, nbytes))], source_etype=I8)
        d = v.defining_op
        if v in seen or d is None or d.parent is not loop.body or view_source(d) is not None:
            seen.add(v)
            continue
        seen.add(v)
        low.stack_rows[v] = rows[r]
    return rows
