"""Layout: views where possible (reshape, a contiguous slice, an index by a scalar), strided
copies where not (transpose, broadcast, slice, concat, stack)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llvmlite import ir

from ....ir.core import Operation
from ....ir.spec import view_source
from ..llvm_types import I64, _i64, _static, _strides
from .elementwise import _bcast_strides
from .lengths import _iadd, _imul

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def _copy(low: Lowering, dst: ir.Value, dst_strides: list[int], src: ir.Value, src_strides: list[int],
          shape: tuple, dtype: str) -> None:
    with low.loop_nest(shape) as idx:
        low.store(low.load(src, dtype, low.linear(idx, src_strides)), dst, dtype, low.linear(idx, dst_strides))


def lower_view(low: Lowering, op: Operation) -> None:
    low.alias(op.result, op.operands[0], low.ptr[op.operands[0]])


def lower_transpose(low: Lowering, op: Operation) -> None:
    if view_source(op) is not None:
        low.ptr[op.result] = low.ptr[op.operands[0]]  # folded into the GEMM's flags (see _gemm_operand)
        return
    src_t = op.operands[0].tensor_type
    out_shape = low.shape(op.result, op)
    perm = op.attrs["perm"] or list(range(src_t.rank))[::-1]
    src_strides = _strides(tuple(src_t.shape))
    low.slot(op.result, op)
    _copy(low, low.ptr[op.result], _strides(out_shape), low.ptr[op.operands[0]], [src_strides[p] for p in perm],
          out_shape, src_t.dtype)


def lower_broadcast(low: Lowering, op: Operation) -> None:
    out_shape = low.shape(op.result, op)
    low.slot(op.result, op)
    src = op.operands[0]
    _copy(low, low.ptr[op.result], _strides(out_shape), low.ptr[src], _bcast_strides(src.tensor_type, out_shape),
          out_shape, src.tensor_type.dtype)


def lower_slice(low: Lowering, op: Operation) -> None:
    src_t = op.operands[0].tensor_type
    src_shape = _static(src_t, op)  # for its strides, which the leading dim (maybe the length) is in none of
    out_shape = low.shape(op.result, op)
    starts = list(op.attrs["starts"])
    steps = list(op.attrs["steps"] or [1] * len(starts))
    strides = _strides(src_shape)
    offset = sum(s * st for s, st in zip(starts, strides))
    base = low.elem_ptr(low.ptr[op.operands[0]], src_t.dtype, ir.Constant(I64, offset))
    if view_source(op) is not None:  # contiguous: memplan's rule, so plan and code agree
        low.alias(op.result, op.operands[0], base)
        return
    low.slot(op.result, op)
    _copy(low, low.ptr[op.result], _strides(out_shape), base, [s * st for s, st in zip(strides, steps)], out_shape,
          src_t.dtype)


def _join(low: Lowering, op: Operation, axis: int, new_axis: bool) -> None:
    out_shape = low.shape(op.result, op)
    low.slot(op.result, op)
    out_strides = _strides(out_shape)
    start: int | ir.Value = 0
    for v in op.operands:
        t = v.tensor_type
        shape = low.shape(v, op)
        piece = shape[:axis] + (1,) + shape[axis:] if new_axis else shape
        dst = low.elem_ptr(low.ptr[op.result], t.dtype, _i64(_imul(low.b, start, out_strides[axis])))
        _copy(low, dst, out_strides, low.ptr[v], _strides(piece), piece, t.dtype)
        start = _iadd(low.b, start, 1 if new_axis else shape[axis])


def lower_concat(low: Lowering, op: Operation) -> None:
    _join(low, op, op.attrs["axis"] % op.result.tensor_type.rank, new_axis=False)


def lower_stack(low: Lowering, op: Operation) -> None:
    _join(low, op, op.attrs["axis"] % op.result.tensor_type.rank, new_axis=True)


def lower_index(low: Lowering, op: Operation) -> None:
    """By a scalar: a view of one row. By a tensor: a gather (gather.py)."""
    x, i = op.operands
    if i.tensor_type.rank:
        from ..gather import lower_gather
        lower_gather(low, op)
        return
    t = x.tensor_type
    shape = low.shape(x, op)
    k = low.row_number(i, ir.Constant(I64, 0), shape[0], op)
    row = math.prod(shape[1:])
    low.alias(op.result, x, low.elem_ptr(low.ptr[x], t.dtype, low.b.mul(k, ir.Constant(I64, row))))
