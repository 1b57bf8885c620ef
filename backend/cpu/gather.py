"""CPU lowerings of the row ops and of `logsumexp`: loops over rows, no BLAS.

- `index` by an integer tensor (a gather): one bounds check and one row copy (memcpy) per index.
  By a scalar it is a view (lower/views.py `lower_index`).
- `scatter_add`: the base copied into the result (memmove: memplan may give the result the
  base's buffer, `inplace=0`), then each update row added to its row, in index order, so
  repeated rows accumulate.
- `logsumexp`: per output element, a pass for the maximum, then a pass summing exp(x - max);
  the result is max + log(sum). A maximum that is not finite is not shifted out (all -inf gives
  -inf, a +inf element +inf, a nan propagates through the sum).

An index out of range flags the run-time error the runtime raises after the call (as `index`
by a scalar does) and reads or writes row 0 instead, so no memory outside the tensor is touched.
lower/table.py imports this module; it imports nothing of lower/'s at run time (its
types and helpers are llvm_types.py's, `low.scalar` makes its `Scalar`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llvmlite import ir

from ...ir.core import Operation
from ...ir.ops import reduction_axes
from .llvm_types import I1, I64, LLVM_TYPES, PTR, _i64, _static, _strides

if TYPE_CHECKING:
    from .lower.base import Lowering


def lower_gather(low: Lowering, op: Operation) -> None:
    """Rows of x by the integers of i; x's rows or i's leading dim may follow the run-time
    length (`Lowering.shape`): a row's size never does."""
    x, i = op.operands
    shape = low.shape(x, op)
    row = math.prod(shape[1:])
    itemsize = x.tensor_type.numpy_dtype.itemsize
    low.slot(op.result, op)
    dtype = x.tensor_type.dtype
    with low.for_range(_i64(low.product(low.shape(i, op))), "g") as n:
        k = low.row_number(i, n, shape[0], op)
        src = low.elem_ptr(low.ptr[x], dtype, low.b.mul(k, ir.Constant(I64, row)))
        dst = low.elem_ptr(low.ptr[op.result], dtype, low.b.mul(n, ir.Constant(I64, row)))
        low.memcpy(dst, src, row * itemsize)


def _memmove(low: Lowering, dst: ir.Value, src: ir.Value, nbytes: int | ir.Value) -> None:
    fn = low.module.declare_intrinsic("llvm.memmove", [PTR, PTR, I64])
    low.b.call(fn, [dst, src, _i64(nbytes), ir.Constant(I1, 0)])


def lower_scatter_add(low: Lowering, op: Operation) -> None:
    base, i, updates = op.operands
    t = base.tensor_type
    shape = low.shape(base, op)  # its rows, or i's leading dim, may follow the length
    row = math.prod(shape[1:])
    low.slot(op.result, op)
    out = low.ptr[op.result]
    _memmove(low, out, low.ptr[base], low.nbytes(base, op))
    add = low.scalar(op, t.dtype)
    with low.for_range(_i64(low.product(low.shape(i, op))), "s") as n:
        k = low.row_number(i, n, shape[0], op, "scatter_add index")
        dst = low.b.mul(k, ir.Constant(I64, row))
        src = low.b.mul(n, ir.Constant(I64, row))
        with low.for_range(row, "c") as j:
            at = low.b.add(dst, j)
            total = add.primitive("add", [low.load(out, t.dtype, at),
                                          low.load(low.ptr[updates], t.dtype, low.b.add(src, j))])
            low.store(total, out, t.dtype, at)


def lower_logsumexp(low: Lowering, op: Operation) -> None:
    x = op.operands[0]
    t = x.tensor_type
    shape = _static(t, op)
    axes = reduction_axes(op.attrs, t.rank)
    strides = _strides(shape)
    kept = tuple(d for k, d in enumerate(shape) if k not in axes)
    kept_strides = [strides[k] for k in range(len(shape)) if k not in axes]
    red_shape = tuple(shape[k] for k in axes)
    red_strides = [strides[k] for k in axes]
    low.slot(op.result, op)
    ty = LLVM_TYPES[t.dtype]
    s = low.scalar(op, t.dtype, reassociate=True)
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        peak, acc = low.b.alloca(ty), low.b.alloca(ty)
    with low.loop_nest(kept) as oidx:
        base = low.linear(oidx, kept_strides)
        low.b.store(ir.Constant(ty, -math.inf), peak)
        with low.loop_nest(red_shape) as ridx:
            v = low.load(low.ptr[x], t.dtype, low.b.add(base, low.linear(ridx, red_strides)))
            m = low.b.load(peak, typ=ty)
            low.b.store(low.b.select(s.primitive("gt", [v, m]), v, m), peak)
        m = low.b.load(peak, typ=ty)
        finite = s.primitive("eq", [s.primitive("sub", [m, m]), s.literal(0.0)])  # false for inf and nan
        shift = low.b.select(finite, m, s.literal(0.0))
        low.b.store(s.literal(0.0), acc)
        with low.loop_nest(red_shape) as ridx:
            v = low.load(low.ptr[x], t.dtype, low.b.add(base, low.linear(ridx, red_strides)))
            e = s.primitive("exp", [s.primitive("sub", [v, shift])])
            low.b.store(s.primitive("add", [low.b.load(acc, typ=ty), e]), acc)
        result = s.primitive("add", [s.primitive("log", [low.b.load(acc, typ=ty)]), shift])
        low.store(result, low.ptr[op.result], t.dtype, low.linear(oidx, _strides(kept)))
