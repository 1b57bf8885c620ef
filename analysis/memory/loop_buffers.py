"""Loop buffers: where a backend that writes kernel and GEMM results wherever it is told (the GPU
backend) puts a scan's per-step values, and which values therefore live in memory of the loop's
own, outside the arena, as facts of the IR.

The memory plan and the GPU lowering both ask this module, so that each such value lives in
exactly one place: the lowering allocates the loop's own buffers and writes there, the plan
(with `ViewRules.loop_buffers`, the GPU's `memplan{views=strided}`) reserves no arena slot for
them (`MemoryPlan.external`). Nothing here depends on the target: only op-registry facts.

Terms.
- *Writes anywhere* (`writes_anywhere`): a value made by a kernel (`fused`, an elementwise op),
  a GEMM (matmul) or a join (concat, stack) that is not itself a claimed piece: its op can write
  it into any C-contiguous array of its shape, so a scan can put it in a stack row or a carry
  buffer instead of a slot of its own (the GPU's `Lowering.redirectable`; codegen checks the
  two agree).
- *Claimed pieces* (`join_claims`): the operands of a concat or stack made by a kernel in the
  same block and read otherwise only by kernels, reductions and joins: their kernels write
  them straight into their places in the join's result. That result is then written from its
  first piece's kernel on, earlier than the plan's lifetimes say: a *claimed join*, outside the
  arena.
- *Placement* (`ScanPlacement`, `place_loop`): per scan, which stacked values are written
  straight into their rows, which carries take their next value from a stack row, which are
  double-buffered (two buffers of the loop's own, swapped per step), which are *shifted* (a
  carry stacked itself: one buffer of T + 1 rows holds the carry's stack and its next values'
  stack a row apart) and which are copied at the yield.
- *Loop-owned values* (`loop_owned`): a double-buffered carry's body argument, yielded value and
  final value; a shifted carry's, and the stacks of its buffer of T + 1 rows. A scan of at least
  one step only (with none, the final carry is the initial one, in the carry's slot).

Safety: a loop-owned value is in no arena slot, so no value the plan places can overwrite it,
nor it any of them; a backend that gives a loop-owned value storage after all (a placement it
could not make) gets a buffer of its own for it (slower, never wrong).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.core import Block, Function, Operation, Value
from ...ir.loops import LoopView, as_loop

CLAIMED_JOIN = "claimed join"
LOOP_OWNED = "loop's own buffer"


@dataclass(frozen=True)
class ScanPlacement:
    """Where a scan's per-step values are written (no copy for any but `copied_*`). A value is
    *placeable* when it is defined in this body and writes anywhere (module docstring).

    - `in_stack[k] = v`: stacked value v (placeable) is written straight into row t of stack k.
    - `carry_from_stack[j] = k`: carry j's next value is that stack's row t: the carry's body
      argument points at it in step t + 1 (a pointer swap; stack rows are not overwritten
      while the loop runs).
    - `double_buffered`: carry j's next value (placeable, in no stack) is written into the one
      of two buffers of the loop's own that the body argument does not point at; the two swap
      per step.
    - `shifted[j] = (a, k)`: stack a stacks carry j's body argument itself, which is stack k
      shifted by a step (carry j from stack k): both are views of one buffer of T + 1 rows, one
      row apart, so that writing stack k's row writes stack a's next row (`stack (%h)` of a
      BPTT forward, no copy). With k None, carry j's next value (placeable, in no stack) is
      written into the buffer's rows that are not stack a's: its next row, for the next step.
    - every other stacked value and carry is copied at the yield."""

    in_stack: dict[int, Value]
    carry_from_stack: dict[int, int]
    double_buffered: frozenset[int]
    shifted: dict[int, tuple[int, int | None]]
    copied_stacks: tuple[int, ...]
    copied_carries: tuple[int, ...]


def joins(op: Operation) -> bool:
    """Whether op puts its operands side by side (concat, stack)."""
    return op.spec.joins is not None


def _kernel(op: Operation) -> bool:
    return op.name == "fused" or op.spec.is_elementwise


def join_claims(block: Block) -> dict[Operation, list[int]]:
    """Per concat or stack of block, the operand positions whose kernels write them straight
    into its result (module docstring), in order: a value's first claim in the block is its own
    place; a later one (another join, never the same result twice) an extra place its kernel
    also stores it into. Joins with no claim are left out."""
    claims: dict[Operation, list[int]] = {}
    places: dict[Value, list[Value]] = {}  # a claimed value -> the join results it is written into
    for op in block:
        if not joins(op):
            continue
        for i, v in enumerate(op.operands):
            maker = v.defining_op
            if maker is None or maker.parent is not block or not _kernel(maker):
                continue
            if v in places:
                if op.result not in places[v]:
                    places[v].append(op.result)
                    claims.setdefault(op, []).append(i)
                continue
            if not all(_kernel(u) or joins(u) or u.spec.reduction is not None for u in v.users):
                continue
            places[v] = [op.result]
            claims.setdefault(op, []).append(i)
    return claims


def claimed_values(block: Block, claims: dict[Operation, list[int]] | None = None) -> set[Value]:
    """The values of block some join claims (join_claims)."""
    claims = join_claims(block) if claims is None else claims
    return {op.operands[i] for op, positions in claims.items() for i in positions}


def writes_anywhere(v: Value, claimed: set[Value]) -> bool:
    """Whether v's op can write it into any array of its shape (module docstring)."""
    op = v.defining_op
    return (op is not None and v not in claimed
            and (_kernel(op) or op.spec.category == "matmul" or joins(op)))


def place_loop(loop: LoopView, placeable_value: set[Value] | None = None) -> ScanPlacement:
    """The placement of loop (ScanPlacement); placeable_value, the body's values that write
    anywhere (computed from the IR when None)."""
    if placeable_value is None:
        claimed = claimed_values(loop.body)
        placeable_value = {r for op in loop.body for r in op.results if writes_anywhere(r, claimed)}
    defined_here = {r for op in loop.body for r in op.results}
    taken: set[Value] = set()

    def placeable(v: Value) -> bool:
        return v in placeable_value and v in defined_here and v not in taken

    in_stack: dict[int, Value] = {}
    for k, v in enumerate(loop.yielded_stacks):
        if placeable(v):
            in_stack[k] = v
            taken.add(v)
    stack_of = {v: k for k, v in in_stack.items()}
    from_stack: dict[int, int] = {}
    double: set[int] = set()
    for j, v in enumerate(loop.yielded_carries):
        if v in stack_of:
            from_stack[j] = stack_of[v]
        elif placeable(v):
            double.add(j)
            taken.add(v)
    shifted: dict[int, tuple[int, int | None]] = {}
    for a, v in enumerate(loop.yielded_stacks):
        c = next((i for i, arg in enumerate(loop.carry_args) if arg is v), None)
        if a not in in_stack and c is not None and (c in from_stack or c in double) and c not in shifted:
            shifted[c] = (a, from_stack.get(c))
            double.discard(c)
    implicit = {a for a, _ in shifted.values()}
    copied_stacks = tuple(k for k in range(len(loop.yielded_stacks)) if k not in in_stack and k not in implicit)
    copied_carries = tuple(j for j in range(len(loop.yielded_carries))
                           if j not in from_stack and j not in double and j not in shifted)
    return ScanPlacement(in_stack, from_stack, frozenset(double), shifted, copied_stacks, copied_carries)


def loop_owned(loop: LoopView, place: ScanPlacement) -> set[Value]:
    """The values of loop that live in the loop's own buffers under place (module docstring):
    none for a scan of no step or an unknown trip count."""
    steps = loop.trip_count
    if not isinstance(steps, int) or steps < 1:
        return set()
    out: set[Value] = set()
    carries = loop.carries
    for j in place.double_buffered:
        c = carries[j]
        out |= {c.arg, c.yielded, c.result}
    for j, (a, k) in place.shifted.items():
        c = carries[j]
        out |= {c.arg, c.yielded, c.result, loop.stacked_results[a]}
        if k is not None:
            out.add(loop.stacked_results[k])
    return out


def find_loop_buffers(function: Function) -> dict[Value, str]:
    """Every value of function that lives outside the arena because of where the loops write:
    claimed joins and loop-owned values -> which (CLAIMED_JOIN, LOOP_OWNED). Nested scans
    included; the insides of `fused` ops are registers."""
    out: dict[Value, str] = {}
    blocks = [function.body]
    while blocks:
        block = blocks.pop()
        for op in join_claims(block):
            out[op.result] = CLAIMED_JOIN
        for op in block:
            loop = as_loop(op)
            if loop is None:
                continue
            blocks.append(loop.body)
            for v in loop_owned(loop, place_loop(loop)):
                out.setdefault(v, LOOP_OWNED)
    return out


def outside_bytes(function: Function) -> int:
    """Bytes of the buffers find_loop_buffers' values live in, as a backend allocates them once
    per compiled function: two carries per double-buffered carry, T + 1 rows per shifted carry
    (its stacks share them), each claimed join; nested scans once (their buffers are reused by
    every outer step). What the plan leaves out of its arena for the loops."""
    total = 0
    blocks = [function.body]
    while blocks:
        block = blocks.pop()
        total += sum(_nbytes(op.result) for op in join_claims(block))
        for op in block:
            loop = as_loop(op)
            if loop is None:
                continue
            blocks.append(loop.body)
            steps = loop.trip_count
            if not isinstance(steps, int) or steps < 1:
                continue  # no loop-owned values: all in the arena
            place = place_loop(loop)
            total += sum(2 * _nbytes(loop.carry_args[j]) for j in place.double_buffered)
            total += sum(_nbytes(loop.stacked_results[a]) // steps * (steps + 1) for a, _ in place.shifted.values())
    return total


def _nbytes(v: Value) -> int:
    t = v.tensor_type
    shape: list[int] = [int(d) for d in t.shape]  # type: ignore[arg-type]  # static: the plan is made
    return math.prod(shape) * t.numpy_dtype.itemsize


__all__ = ["CLAIMED_JOIN", "LOOP_OWNED", "ScanPlacement", "claimed_values", "find_loop_buffers", "join_claims",
           "joins", "loop_owned", "outside_bytes", "place_loop", "writes_anywhere"]
