"""Row programs: reductions over the trailing axis computed inside generated kernels.

LayerNorm over the hidden units, `(x - mean(x, axes=[-1], keepdims=true)) / sqrt(var + eps)`,
reduces each row of a (batch x hidden) value and reads the row's result at every element of the
row. As xp calls, each such reduction is a CuPy launch per time step (two per LayerNorm forward,
two more backward), an allocation CuPy may make inside a CUDA graph capture, and a refusal of
the persistent scan. A *row program* instead runs the block's row-aligned work in one kernel
with a CUDA block per row (kernels.row_source): the fused groups over the row's elements, the
row reductions as shared-memory trees between them, a block barrier after each phase.

A row program is decided once per block, before lowering (`row_programs`), from the IR alone:
starting at a `fused` op whose result is `lead x C` (lead: all axes but the last, the *rows*),
or at a row reduction of a `lead x C` operand (`_lead`), it takes the later ops of the block
that work row by row on the same rows:
- `fused` ops whose results all have the leading axes `lead` (any trailing shape: a `lead x 1`
  group is one element per row);
- float `sum` / `mean` / `max` / `min` over exactly the trailing axes of a `lead x ...`
  operand (keepdims or not): the row reductions;
- `slice`s of values made before the program (absorbed slices of the step's GEMM result: a
  view, lowered with the program, before its kernel);
- `reshape`s between `lead` and `lead x 1 x ...`, and `broadcast`s from `lead x 1 x ...` to
  `lead x ...`, of values the program makes (read in place: a view, a stride-0 layout);
and of those only the ones whose operands are made by the program or before its first op (as
codegen's chains), whose program-made operands have the reading group's rank (so NumPy's
right-aligned broadcasting cannot read another row), and which read no reduction made outside
the program (codegen may fold that one into its reader, which a row kernel does not do). Ops
the program passes over run at their own place, after it. A program is kept when it holds at
least one row reduction; its ops are then lowered as one kernel at the first op's place
(codegen.lower_row_program). `RowProgram.describe()` prints the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.core import Block, Operation, Value
from ...ir.ops import reduction_axes

ROLES = {"fused": "group", "reshape": "reshape", "broadcast": "broadcast", "slice": "slice"}
"""Op kind -> its role in a row program (a dispatch table, as codegen's LOWER); a reduction's
role is `reduction` (its spec says so), anything else's `other`."""


def role(op: Operation) -> str:
    """op's role in a row program: group, reduction, reshape, broadcast, slice or other."""
    return "reduction" if op.spec.reduction is not None else ROLES.get(op.name, "other")


def read_in_place(op: Operation) -> bool:
    """A reshape or broadcast of a program-made value: the program reads its operand's buffer
    (as is, or with stride 0 along the row), no step of its own unless read outside."""
    return role(op) in ("reshape", "broadcast")


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.tensor_type.shape)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RowProgram:
    """Ops of one block run as one row kernel: a block per row of `lead`."""

    lead: tuple[int, ...]
    ops: tuple[Operation, ...]
    """In block order: fused groups, row reductions, reshapes and broadcasts read in place."""

    @property
    def rows(self) -> int:
        return math.prod(self.lead)

    @property
    def reductions(self) -> tuple[Operation, ...]:
        return tuple(op for op in self.ops if op.spec.reduction is not None)

    def describe(self) -> str:
        kinds = [f"{op.name}" + (f" over {math.prod(_shape(op.operands[0])) // self.rows}" if op.spec.reduction
                                 else "") for op in self.ops]
        return f"row program: {self.rows} rows, {len(self.ops)} ops ({', '.join(kinds)}) at {self.ops[0].loc}"


def row_reduction(op: Operation, lead: tuple[int, ...]) -> bool:
    """A float sum, mean, max or min over exactly the trailing axes after `lead` of a non-empty
    operand."""
    red = op.spec.reduction
    if red is None or red.combine not in ("add", "max", "min") or not op.operands \
            or not op.operands[0].tensor_type.is_float:
        return False
    x = op.operands[0]
    shape, rank = _shape(x), x.tensor_type.rank
    tail = shape[len(lead):]
    if shape[:len(lead)] != lead or not tail or not math.prod(shape):
        return False
    axes = sorted(reduction_axes(op.attrs, rank))
    return axes == list(range(len(lead), rank)) and _shape(op.result) in (lead, lead + (1,) * len(tail))


def _per_row(v: Value, lead: tuple[int, ...]) -> bool:
    """v is one element per row: `lead`, or `lead x 1 x ...`."""
    shape = _shape(v)
    return shape[:len(lead)] == lead and all(d == 1 for d in shape[len(lead):])


def _row_op(op: Operation, lead: tuple[int, ...], pieces: set[Value]) -> bool:
    kind = role(op)
    if kind == "group":
        return bool(op.results) and all(_shape(r)[:len(lead)] == lead and r.tensor_type.rank >= len(lead)
                                        for r in op.results)
    if kind == "reduction":
        return row_reduction(op, lead)
    if kind == "reshape":
        return _per_row(op.operands[0], lead) and _per_row(op.result, lead)
    if kind == "slice":  # of a value made before the program: lowered with it, first (a view, mostly)
        return True
    if kind == "broadcast":
        x, r = op.operands[0], op.result
        return _per_row(x, lead) and x.tensor_type.rank == r.tensor_type.rank and _shape(r)[:len(lead)] == lead \
            and x not in pieces
    return False


def _reads_ok(op: Operation, made: set[Value], before: int, position: dict[Operation, int]) -> bool:
    """op's operands are made by the program or before its first op (constants: any time),
    program-made ones of the reading group's rank, and no reduction outside the program."""
    for v in op.operands:
        maker = v.defining_op
        if v in made:
            if role(op) == "slice":
                return False
            if role(op) == "group" and v.tensor_type.rank != op.results[0].tensor_type.rank:
                return False
            continue
        if read_in_place(op):
            return False  # read in place: only values the program makes
        if role(op) == "slice" and (maker is None or position.get(maker, -1) < before):
            return True
        if maker is None or maker.spec.category == "constant":
            continue
        if position.get(maker, -1) >= before or maker.spec.reduction is not None:
            return False
    return True


def _lead(first: Operation) -> tuple[int, ...] | None:
    """The rows of a program starting at first: all axes but the last of a fused group's result,
    or of a row reduction's operand (LayerNorm of an argument starts at its mean)."""
    if role(first) == "group" and first.results and first.results[0].tensor_type.rank >= 2:
        return _shape(first.results[0])[:-1]
    if first.spec.reduction is not None and first.operands and first.operands[0].tensor_type.rank >= 2:
        lead = _shape(first.operands[0])[:-1]
        return lead if row_reduction(first, lead) else None
    return None


def row_programs(block: Block, taken: set[Operation], pieces: set[Value] | frozenset[Value] = frozenset()
                 ) -> dict[Operation, RowProgram]:
    """The block's row programs: first op -> program (module docstring). Ops in `taken` (merged
    elsewhere) stay out; `pieces` are values kernels write into a concat (not read in place by
    a broadcast)."""
    ops = list(block)
    position = {op: i for i, op in enumerate(ops)}
    claimed, pieces = set(taken), set(pieces)
    found: dict[Operation, RowProgram] = {}
    for i, first in enumerate(ops):
        lead = _lead(first)
        if lead is None or first in claimed:
            continue
        if not math.prod(lead) or not _row_op(first, lead, pieces) \
                or not _reads_ok(first, set(), i, position):
            continue
        program: list[Operation] = [first]
        made: set[Value] = set(first.results)
        for later in ops[i + 1:]:
            if later.spec.terminator:
                break
            if later in claimed or not _row_op(later, lead, pieces) \
                    or not _reads_ok(later, made, i, position):
                continue
            program.append(later)
            made |= set(later.results)
        if any(op.spec.reduction is not None for op in program):
            found[first] = RowProgram(lead, tuple(program))
            claimed |= set(program)
    return found
