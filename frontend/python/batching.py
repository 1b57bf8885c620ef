"""`gir.vmap`'s batched path: fun traced once on one example, then its ops re-emitted with a
leading batch axis (JAX's batching rules, one small rule per op family).

    per example:  %y = matmul %x, %w : tensor<1x4xf32>        (x: tensor<1x3xf32>)
    batched:      %y = matmul %xb, %w : tensor<B x 1x4xf32>   (xb: tensor<Bx1x3xf32>)

A value is *batched* when it depends on a mapped argument; others (closed-over values,
unmapped arguments, constants) are re-emitted unchanged. A batched operand of per-example rank
k meeting a result of rank r is reshaped to (B, 1 x (r - k), ...), so NumPy broadcasting
aligns it as it aligned the example (`lifted`). Rules exist for elementwise ops, casts,
matmul, reductions, transpose, reshape, broadcast, concat, stack, slice, index (a gather with
the table, the ids or both batched), constants, `scan` (its body batched in turn: the
loop runs once over time for the whole batch) and `grad` (per-example gradients: the callee
batched, differentiated once); an op without one (scatter_add, call) makes vmap fall back
to a scan over the batch axis (control.py), which is right for any function. `NoBatchRule`
says so; the caller erases what was emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import Location
from ...ir.core import Block, Function, Operation, Region, Value, erase_op
from ...ir.loops import LoopGroups, LoopView
from ...ir.ops import REGISTRY, make_op, norm_axis, reduction_axes
from ...ir.types import Dim, TensorType
from .tracer import Frame, finish_function, new_function


class NoBatchRule(Exception):
    """An op of the traced example has no batching rule (or needs a known batch size)."""


Env = dict[Value, tuple[Value, bool]]
"""Per-example value -> (its value in the caller, whether it is batched)."""


class Batcher:
    """Re-emits the ops of one traced example into `frame`'s current block, batched over B."""

    def __init__(self, frame: Frame, batch: Dim, loc: Location):
        self.blocks = [frame.block]
        """Where ops go: the caller's block, then the body of a batched scan being built."""
        self.batch = batch
        self.loc = loc
        self.module = frame.module
        self.made: list[str] = []
        """Functions this batcher added to the module (batched callees of `grad`): kept."""

    def emit(self, name: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
             declared: Sequence[TensorType] | None = None, regions: Sequence[Region] = (),
             segments: tuple[int, ...] = ()) -> Operation:
        op = make_op(name, list(operands), attrs=attrs, declared=declared, regions=regions, segments=segments,
                     loc=self.loc)
        self.blocks[-1].append(op)
        return op

    def batched_type(self, t: TensorType) -> TensorType:
        return TensorType((self.batch, *t.shape), t.dtype)

    def known_batch(self) -> int:
        if self.batch is None:
            raise NoBatchRule("needs a known batch size")
        return self.batch

    def lifted(self, v: Value, rank: int) -> Value:
        """A batched value of per-example rank k as (B, 1 x (rank - k), ...)."""
        t = v.tensor_type
        missing = rank - (t.rank - 1)
        if missing <= 0:
            return v
        shape = [-1 if self.batch is None else self.batch, *[1] * missing,
                 *(-1 if d is None else d for d in t.shape[1:])]
        if shape.count(-1) > 1:
            raise NoBatchRule("reshape with two unknown dims")
        return self.emit("reshape", [v], attrs={"shape": shape}).result

    def broadcast_batch(self, v: Value) -> Value:
        """An unbatched value repeated along a new leading batch axis."""
        b = self.known_batch()
        return self.emit("broadcast", [v], attrs={"shape": [b, *v.tensor_type.shape]}).result

    def transpose01(self, v: Value) -> Value:
        """(B, T, ...) <-> (T, B, ...)."""
        rank = v.tensor_type.rank
        return self.emit("transpose", [v], attrs={"perm": [1, 0, *range(2, rank)]}).result

    def run(self, function: Function, env: Env) -> list[tuple[Value, bool]]:
        return self.run_block(function.body, env)

    def run_block(self, block: Block, env: Env) -> list[tuple[Value, bool]]:
        """Re-emits block's ops (env: what each value of the example is); the values its
        terminator (return, yield) ends with."""
        for op in block.ops:
            if op.spec.terminator:
                return [env[v] for v in op.operands]
            ins = [env[v] for v in op.operands]
            if op.name == "scan":  # its body may read batched values of the example: always its rule
                env.update(zip(op.results, _scan(self, op, ins, env)))
                continue
            if op.name == "grad" and any(b for _, b in ins):
                env.update(zip(op.results, _grad(self, op, ins)))
                continue
            if op.regions:
                raise NoBatchRule(f"'{op.name}' has a body")
            if not any(b for _, b in ins):
                clone = self.emit(op.name, [v for v, _ in ins], attrs=dict(op.attrs),
                                  declared=[r.tensor_type for r in op.results])
                env.update({r: (c, False) for r, c in zip(op.results, clone.results)})
                continue
            rule = RULES.get(op.name) or _CATEGORY_RULES.get(REGISTRY[op.name].category)
            if rule is None:
                raise NoBatchRule(f"no batching rule for '{op.name}'")
            env[op.result] = (rule(self, op, ins), True)
        raise NoBatchRule("a block without a terminator")


Rule = Callable[[Batcher, Operation, list[tuple[Value, bool]]], Value]


def _elementwise(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    rank = op.result.tensor_type.rank
    operands = [bt.lifted(v, rank) if b else v for v, b in ins]
    return bt.emit(op.name, operands, attrs=dict(op.attrs), declared=[bt.batched_type(op.result.tensor_type)]).result


def _reduction(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    (x, _), = ins
    axes = [a + 1 for a in reduction_axes(op.attrs, op.operands[0].tensor_type.rank)]
    return bt.emit(op.name, [x], attrs={**op.attrs, "axes": axes}).result


def _transpose(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    (x, _), = ins
    rank = op.operands[0].tensor_type.rank
    perm = op.attrs.get("perm") or list(reversed(range(rank)))
    return bt.emit("transpose", [x], attrs={"perm": [0, *(p % rank + 1 for p in perm)]}).result


def _reshape(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    (x, _), = ins
    shape = [-1 if d is None else d for d in op.result.tensor_type.shape]
    if -1 in shape:
        return bt.emit("reshape", [x], attrs={"shape": [bt.known_batch(), *shape]}).result
    return bt.emit("reshape", [x], attrs={"shape": [-1 if bt.batch is None else bt.batch, *shape]}).result


def _broadcast(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    (x, _), = ins
    shape = list(op.attrs["shape"])
    return bt.emit("broadcast", [bt.lifted(x, len(shape))], attrs={"shape": [bt.known_batch(), *shape]}).result


def _joined(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    """concat and stack: every operand batched (the unbatched ones repeated), the axis moved by one."""
    rank = op.operands[0].tensor_type.rank + (1 if op.name == "stack" else 0)
    axis = norm_axis(op.attrs["axis"], rank) + 1
    operands = [v if b else bt.broadcast_batch(v) for v, b in ins]
    return bt.emit(op.name, operands, attrs={"axis": axis}).result


def _slice(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    (x, _), = ins
    steps = op.attrs.get("steps")
    return bt.emit("slice", [x], attrs={"starts": [0, *op.attrs["starts"]],
                                        "limits": [bt.known_batch(), *op.attrs["limits"]],
                                        "steps": None if steps is None else [1, *steps]}).result


def _index(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> Value:
    """table[i]: with only i batched, one gather (its result has i's leading batch axis); with
    only the table batched, the rows are read from every example's table (axis 1 moved to the
    front, indexed, and the batch moved back)."""
    (x, xb), (i, ib) = ins
    if ib and not xb:  # an unbatched table read at batched ids: the gather's result is batched already
        return bt.emit("index", [x, i]).result
    if ib:  # both batched: one gather from the batch's tables laid end to end
        return _gather_both(bt, x, i)
    rank = x.tensor_type.rank
    front = bt.emit("transpose", [x], attrs={"perm": [1, 0, *range(2, rank)]}).result
    rows = bt.emit("index", [front, i]).result
    k = i.tensor_type.rank
    perm = [k, *range(k), *range(k + 1, rows.tensor_type.rank)]
    return bt.emit("transpose", [rows], attrs={"perm": perm}).result


class _CarryBecomesBatched(Exception):
    """A carry that starts unbatched comes out of the step batched: the body is built again
    with that carry batched (its init repeated along the batch)."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


def _scan(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]], env: Env) -> list[tuple[Value, bool]]:
    """A scan of the example: batched sequences are read time-major ((B, T, ...) transposed to
    (T, B, ...)), a carry is batched when its init is or the step makes it so (found by
    building the body again), batched stacks come out (T, B, ...) and are transposed back."""
    groups = LoopView(op).groups()
    n_seq, n_carry = len(groups.sequences), len(groups.inits)
    seqs = [(bt.transpose01(v), True) if b else (v, False) for v, b in ins[:n_seq]]
    batched = [b for _, b in ins[n_seq:]]
    while True:
        try:
            body, stack_batched = _scan_body(bt, op, groups, seqs, batched, env)
            break
        except _CarryBecomesBatched as grown:
            batched[grown.index] = True
    inits = [v if b or not batched[k] else bt.broadcast_batch(v) for k, (v, b) in enumerate(ins[n_seq:])]
    new = bt.emit("scan", [v for v, _ in seqs] + inits, attrs=dict(op.attrs), regions=[Region(body)],
                  segments=(n_seq, n_carry))
    view = LoopView(new)
    finals = list(zip(view.final_carries, batched))
    stacks = [(bt.transpose01(r), True) if b else (r, False) for r, b in zip(view.stacked_results, stack_batched)]
    return finals + stacks


def _scan_body(bt: Batcher, op: Operation, groups: LoopGroups, seqs: list[tuple[Value, bool]],
               batched: list[bool], env: Env) -> tuple[Block, list[bool]]:
    """The batched body and which of its stacks are batched; erased again if it fails."""
    elements = [v.tensor_type.with_shape(v.tensor_type.shape[1:]) for v, _ in seqs]
    carries = [bt.batched_type(a.tensor_type) if b else a.tensor_type for a, b in zip(groups.carry_args, batched)]
    body = Block(elements + carries, [a.name_hint for a in [*groups.element_args, *groups.carry_args]])
    inner = dict(env)
    flags = [b for _, b in seqs] + batched  # the body's arguments: elements, then carries
    inner.update({a: (new, b) for a, new, b in zip([*groups.element_args, *groups.carry_args], body.args, flags)})
    bt.blocks.append(body)
    try:
        ends = bt.run_block(op.body, inner)
        carry_ends, stack_ends = ends[:len(batched)], ends[len(batched):]
        for k, ((_, b), want) in enumerate(zip(carry_ends, batched)):
            if b and not want:
                raise _CarryBecomesBatched(k)
        carry_values = [v if b or not want else bt.broadcast_batch(v) for (v, b), want in zip(carry_ends, batched)]
        bt.emit("yield", carry_values + [v for v, _ in stack_ends], segments=(len(carry_values), len(stack_ends)))
    except (NoBatchRule, _CarryBecomesBatched):
        for o in reversed(body.ops):
            erase_op(o)
        raise
    finally:
        bt.blocks.pop()
    return body, [b for _, b in stack_ends]


def _grad(bt: Batcher, op: Operation, ins: list[tuple[Value, bool]]) -> list[tuple[Value, bool]]:
    """Per-example gradients: the callee batched (its wrt arguments batched, a shared weight
    repeated along the batch) returns the sum of the examples' losses, then the losses and
    aux values as aux results; since the examples do not mix, the gradient of the sum with
    respect to a batched argument is each example's own gradient."""
    callee = bt.module.functions[op.attrs["callee"]]
    wrt = list(op.attrs["wrt"])
    args = [(bt.broadcast_batch(v), True) if k in wrt and not b else (v, b) for k, (v, b) in enumerate(ins)]
    function = new_function(callee.name + "_batched", bt.module,
                            [v.tensor_type for v, _ in args], [a.name_hint or "arg" for a in callee.args], op.loc)
    bt.blocks.append(function.body)
    try:
        ends = bt.run_block(callee.body, {a: (new, b) for a, new, (_, b) in zip(callee.args, function.args, args)})
        (losses, batched_loss), aux = ends[0], ends[1:]
        if not batched_loss:
            raise NoBatchRule("a loss that does not depend on the mapped arguments")
        total = bt.emit("sum", [losses], attrs={"axes": None, "keepdims": False}).result
    finally:
        bt.blocks.pop()
    finish_function(function, bt.module, [total, losses, *(v for v, _ in aux)], op.loc)
    bt.made.append(function.name)
    new = bt.emit("grad", [v for v, _ in args], attrs={"callee": function.name, "wrt": wrt},
                  declared=[*function.result_types, *(args[k][0].tensor_type for k in wrt)])
    results = new.results
    return [(results[1], True), *((r, b) for r, (_, b) in zip(results[2:2 + len(aux)], aux)),
            *((r, True) for r in results[2 + len(aux):])]


def _gather_both(bt: Batcher, x: Value, i: Value) -> Value:
    """x (B, N, ...) read at i (B, ...): x reshaped to (B * N, ...) and read at i + b * N."""
    b, rows = bt.known_batch(), x.tensor_type.shape[1]
    if rows is None or None in x.tensor_type.shape[2:]:
        raise NoBatchRule("a gather with both batched needs the table's sizes")
    flat = bt.emit("reshape", [x], attrs={"shape": [b * rows, *x.tensor_type.shape[2:]]}).result
    it = i.tensor_type
    offsets = np.arange(b).reshape((b,) + (1,) * (it.rank - 1)) * rows
    start = bt.emit("constant", [], attrs={"value": offsets.tolist()},
                    declared=[TensorType(offsets.shape, it.dtype)]).result
    return bt.emit("index", [flat, bt.emit("add", [i, start]).result]).result


RULES: dict[str, Rule] = {
    "cast": _elementwise,
    "matmul": _elementwise,
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast": _broadcast,
    "concat": _joined,
    "stack": _joined,
    "slice": _slice,
    "index": _index,
}
"""Op kind -> its batching rule."""

_CATEGORY_RULES: dict[str, Rule] = {"elementwise": _elementwise, "reduction": _reduction}
"""The rule shared by a registry category: elementwise ops, reductions (over `axes`)."""
