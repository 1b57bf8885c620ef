"""Sizes that follow the run-time length T (analysis/lengths.py): int-or-i64 arithmetic, the
refusal of ops lowered for static sizes only, the constants computed from T, and the layout's
description of the dims that follow it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

from ....analysis.lengths import Extent, LengthDims, NotALength
from ....ir.core import Function, Operation, Value
from ....ir.types import FLOAT_DTYPES, INT_DTYPES
from ..llvm_types import LLVM_TYPES, _i64

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def _imul(b: ir.IRBuilder, x: int | ir.Value, y: int | ir.Value) -> int | ir.Value:
    """x * y: an int when both are, else an i64 computed at run time."""
    if isinstance(x, int) and isinstance(y, int):
        return x * y
    if isinstance(x, int) and x == 1:
        return y
    if isinstance(y, int) and y == 1:
        return x
    return b.mul(_i64(x), _i64(y))


def _iadd(b: ir.IRBuilder, x: int | ir.Value, y: int | ir.Value) -> int | ir.Value:
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    return b.add(_i64(x), _i64(y))


def _results(function: Function) -> list[Value]:
    """The values function returns, in order."""
    term = function.body.terminator
    return list(term.operands) if term is not None else []


def _length_dims(lengths: LengthDims, values: Sequence[Value]) -> list[list[int]]:
    """[index, axis, per_step, offset] of each dim of values that follows the length."""
    return [[i, axis, e.per_step, e.offset] for i, v in enumerate(values) for axis, e in lengths.dims(v).items()]


def _refuse_length(low: Lowering, op: Operation, what: str) -> None:
    """Raises NotALength where op reads or makes a value that follows the length: `what` is
    lowered for static sizes only (the driver then specialises the length)."""
    if low.lengths is not None and any(low.follows_length(v) for v in (*op.operands, *op.results)):
        raise NotALength(f"{what} ('{op.name}' at {op.loc}) is lowered for static sizes only")


def _length_constant(low: Lowering, op: Operation, e: Extent, reciprocal: bool) -> ir.Value:
    """A splat constant that follows the length (analysis/lengths.py): e at T, or 1/e, computed
    in double and rounded to the constant's dtype, as its literal was."""
    dtype = op.result.tensor_type.dtype
    if low.fn.name != "gir_main":  # T is read in gir_main only (not in a split loop's task)
        raise NotALength(f"the constant at {op.loc} follows the length in a loop split across two cores")
    n = low.extent(e)
    if dtype in INT_DTYPES and not reciprocal:
        return low.b.trunc(n, LLVM_TYPES[dtype]) if dtype != "i64" else n
    if dtype not in FLOAT_DTYPES:
        raise NotALength(f"a {dtype} constant at {op.loc} follows the length")
    f = low.b.sitofp(n, ir.DoubleType())
    if reciprocal:
        f = low.b.fdiv(ir.Constant(ir.DoubleType(), 1.0), f)
    return low.b.fptrunc(f, LLVM_TYPES[dtype]) if dtype == "f32" else f
