"""Copies a call makes outside its loops, avoided by aliasing (docs/gpu.md, *Copies outside
the loops*): where a value is read or left where it already is instead of being copied between
buffers. Each decision is made once, when lowering; codegen.py asks for it.

Terms.
- *Carry ends* (`CarryEnds`): a scan's initial carries and final carries. An initial carry that
  is a function argument or a constant (memory nobody writes during a call) is *read in place*
  by the first step instead of copied into the carry's buffer, where the step writes its next
  value elsewhere anyway (a double-buffered carry, or one taken from a stack row); a final
  carry that nothing reads is not copied out; a final carry left by the last step in memory of
  the loop's own (one of its two double buffers, a row of a stack outside the arena) *lives
  there*: the scan result is that array, no copy.
- *Returned slices*: a slice read only by `return` is a strided view of its source; the copy
  that hands the result out (a download, or the fresh device array of a call with device
  arrays) is the only one.
- *Sequence slices*: a slice of a kernel or GEMM result (the column block of `%xs @ [w_i w_f
  ...]` for one gate) that a scan only walks as a sequence, its element read only by kernels:
  no copy; the step's kernels read row t of the source through the slice's strides (an
  absorbed element, as codegen's absorbed slices).
- Memory: the GPU's plan (`memplan{views=strided}`, analysis/memory/aliases.py) counts both
  kinds as views of their sources, held until the slice's last reader (a walked one: until the
  scan ends), so the source stays in its arena slot; with a plan that does not (`memplan`
  alone) the source leaves the arena (the plan thought it dead at the slice). A packed concat
  (below) is outside the arena in the GPU's plan: its buffer here is the arguments' storage,
  counted once.

Known gaps: a final carry taken from a stack row in the arena is still copied (the plan may
reuse the stack's slot before the final carry's last reader); initial carries computed in the
function (not arguments or constants) and carries copied at the yield are still copied in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analysis.memory.aliases import packed_arguments as is_packed
from ...analysis.memory.aliases import returned_only, walked_only
from ...ir.core import Operation, Value
from ...ir.loops import LoopView
from ...ir.ops import norm_axis
from .kernels import InputLayout

if TYPE_CHECKING:
    from ...analysis.memory.loop_buffers import ScanPlacement
    from .codegen import Lowering


@dataclass(frozen=True)
class CarryEnds:
    """Per carry j of a scan: how its initial value gets in and its final value out."""

    read_in_place: frozenset[int]
    """Initial carries the first step reads where they are (an argument's or constant's
    buffer): no copy in."""
    unread: frozenset[int]
    """Final carries nothing reads: no copy out."""
    left_in: dict[int, Any]
    """Final carries whose scan result is the array the last step wrote them into: no copy out."""


def carry_ends(low: Lowering, loop: LoopView, place: ScanPlacement, buffers: dict[int, tuple[Any, Any]],
               hidden: dict[int, Any], stacks: list[Any], first: list[Any]) -> CarryEnds:
    """Decides CarryEnds for loop (lowered: place, its double buffers, its shifted rows, its
    stacks and the arrays the first step reads its carries from known), moves each final
    carry left in place out of the arena to that array, and makes the buffer of an argument
    that is the initial value of a shifted carry that carry's first row (the call's upload
    writes it there: `stack (%h)` of a BPTT forward needs h0 as its row; no step writes that
    row, so the argument's other readers read it there)."""
    packed = {a for pack in low.packs for a in pack.args}
    for j in place.shifted:
        init = loop.inits[j]
        if loop.op.parent_op is None and init in low.function.args and init not in packed \
                and [u for u in init.users if u.name == "scan"] == [loop.op] and loop.inits.count(init) == 1:
            low.memory.own_bytes -= low.static[init].nbytes  # its own buffer, dropped
            low.static[init] = first[j]
    steps = loop.trip_count or 0
    # Both kinds write the step's next value away from the carry's argument: the first step
    # may read an argument or constant there, which no step then overwrites.
    moved = {j for j in (*place.double_buffered, *place.carry_from_stack) if j not in place.shifted}
    read_in_place = frozenset(j for j in moved if _unwritten(low, loop.inits[j]))
    unread = frozenset(j for j, c in enumerate(loop.carries) if not c.result.users)
    left_in: dict[int, Any] = {}
    last = 0 if loop.reverse else steps - 1
    for j in range(len(loop.carries)):
        if not steps or j in unread:
            continue  # with no step the final carry is the initial one: copied as before
        if j in buffers:
            left_in[j] = buffers[j][steps % 2]  # step i writes buffer (i + 1) % 2
        elif j in hidden:
            left_in[j] = hidden[j][last]
        elif (k := place.shifted.get(j, (0, None))[1]) is not None:
            left_in[j] = stacks[k][last]  # the shifted buffer: outside the arena
    for j, array in left_in.items():
        r = loop.carries[j].result
        low.static[r] = low.memory.move_out(r, array)
    return CarryEnds(read_in_place, unread, left_in)


def _unwritten(low: Lowering, v: Value) -> bool:
    """Whether v's device array is written by no step of a call: an argument's buffer (the plan
    never places arguments) or a constant's (uploaded when compiling)."""
    made_by = v.defining_op
    return v in low.function.args or (made_by is not None and made_by.spec.category == "constant"
                                      and v in low.static)


def aliased_slice(low: Lowering, op: Operation, box: tuple, planned: bool = False) -> bool:
    """Whether slice op (not a registry view, of a kernel or GEMM result) needs no copy: a
    scan walks it (recorded in Lowering.sequence_rows) or only `return` reads it (recorded in
    Lowering.returned_views). Its step is then a strided view. Its source stays in the arena
    where the plan counts the slice a strided view (`planned`: memplan{views=strided} holds the
    source until the slice's last reader); else it leaves the arena (read later than the plan
    knows)."""
    x, r = op.operands[0], op.result
    rows = sequence_layout(op)
    if rows is not None:
        low.sequence_rows[r] = (x, rows)
    elif returned_only(op):
        low.returned_views[r] = (x, box)
    else:
        return False
    if not planned:
        low.own_storage(x)
    return True


def sequence_layout(op: Operation) -> InputLayout | None:
    """For a slice op whose result only scans walk as a sequence (element t read only by
    kernels) and which keeps every row of its source: where element t's elements sit in row t
    of the source (`Lowering.sequence_rows`). None otherwise."""
    if not walked_only(op):  # the memory plan's rule (analysis/memory/aliases.py)
        return None
    x = op.operands[0]
    starts, steps = op.attrs["starts"], op.attrs["steps"] or [1] * len(op.attrs["starts"])
    shape = [int(d) for d in x.tensor_type.shape]  # type: ignore[arg-type]
    row = [math.prod(shape[i + 1:]) for i in range(1, len(shape))]
    return InputLayout(sum(s * e for s, e in zip(starts[1:], row)), tuple(e * k for e, k in zip(row, steps[1:])))


def walked_sequences(low: Lowering, loop: LoopView) -> list[Value]:
    """The arrays loop walks, per sequence: a sequence slice's source (Lowering.sequence_rows),
    its element then read by the body's kernels in the source's row t through the slice's
    layout; else the sequence itself."""
    walked = []
    for s, arg in zip(loop.sequences, loop.element_args):
        if s in low.sequence_rows:
            source, layout = low.sequence_rows[s]
            low.absorbed[arg] = (arg, layout)  # env[arg] is row t of the source
            s = source
        walked.append(s)
    return walked




@dataclass(frozen=True)
class PackedArguments:
    """A `concat` or `stack` at the top of a function whose every operand is an argument read
    by it alone: the arguments' buffers are its pieces (strided views of the result's buffer,
    outside the arena), so a call's arguments land where the op would have copied them."""

    op: Operation
    args: tuple[Value, ...]
    axis: int
    new_axis: bool
    """stack (a new axis) rather than concat."""

    def places(self) -> list[tuple]:
        """Per argument, its index into the result."""
        out, start = [], 0
        for v in self.args:
            width = 1 if self.new_axis else int(v.tensor_type.shape[self.axis])  # type: ignore[arg-type]
            where = start if self.new_axis else slice(start, start + width)
            out.append((slice(None),) * self.axis + (where,))
            start += width
        return out

    def place(self, low: Lowering) -> None:
        """The result's buffer (its own, outside the arena: written when a call starts, before
        the plan knows it) and the arguments' buffers as its pieces."""
        r = self.op.result
        t = r.tensor_type
        buffer = low.memory.own(tuple(int(d) for d in t.shape), t.numpy_dtype)  # type: ignore[arg-type]
        low.static[r] = low.memory.move_out(r, buffer)
        low.owned.add(r)
        for v, where in zip(self.args, self.places()):
            low.static[v] = buffer[where]

    def pack(self, hosts: list[Any]) -> Any:
        """The result from the arguments' host arrays, put together on the host (one upload)."""
        import numpy as np

        return (np.stack if self.new_axis else np.concatenate)(hosts, axis=self.axis)


def packed_arguments(low: Lowering, joins: Any) -> list[PackedArguments]:
    """The top-level concat and stack ops of the function whose operands are distinct
    arguments, each read by that op alone (`joins(op)`: None for other ops, else whether a
    stack), each placed (the arguments' buffers made its pieces)."""
    function = low.function
    found = []
    for op in function.body:
        kind = joins(op)
        if kind is not None and is_packed(op, function):  # the memory plan's rule (aliases.py)
            axis = norm_axis(op.attrs["axis"], op.result.tensor_type.rank)
            found.append(PackedArguments(op, tuple(op.operands), axis, kind))
            found[-1].place(low)
    return found


__all__ = ["CarryEnds", "PackedArguments", "aliased_slice", "carry_ends", "packed_arguments", "returned_only",
           "sequence_layout", "walked_sequences"]
