"""Reductions: an accumulator per output element, the reduced axes innermost."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from ....errors import GirError
from ....ir.core import Operation
from ....ir.interpreter import empty_reduction
from ....ir.ops import REGISTRY, reduction_axes
from ....ir.types import DTYPES, INT_DTYPES
from ..llvm_types import I1, I64, LLVM_TYPES, _static, _strides
from .elementwise import Scalar

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def _identity(value: float, dtype: str) -> float | int:
    """A reduction's identity in dtype: an infinite one is the integer type's extreme."""
    if dtype not in INT_DTYPES:
        return value
    info = np.iinfo(DTYPES[dtype])
    return info.min if value == -math.inf else info.max if value == math.inf else int(value)


def lower_reduce(low: Lowering, op: Operation) -> None:
    """Over no element (a reduced axis of size 0, known here): `sum` stores its identity, `mean`
    0/0 = nan, and max/min (`Reduction.empty_is_error`) flag the interpreter's error when the
    op runs (not when it compiles: in a loop body that runs no step there is no error)."""
    reduction = op.spec.reduction
    assert reduction is not None
    x = op.operands[0]
    t = x.tensor_type
    shape = low.shape(x, op)
    axes = reduction_axes(op.attrs, t.rank)
    empty = empty_reduction(op, _static(t, op))
    if empty is not None:
        low.flag_error(ir.Constant(I1, 1), empty, op)
    for axis, e in low.lengths.dims(x).items() if low.lengths is not None else ():
        message = empty_reduction(op, tuple(0 if a == axis else d for a, d in enumerate(_static(t, op))))
        if axis in axes and message is not None:  # empty at lengths where its extent is 0
            low.flag_error(low.b.icmp_signed("==", low.extent(e), ir.Constant(I64, 0)), message, op)
    kept = [d for i, d in enumerate(shape) if i not in axes]
    strides = _strides(shape)
    low.slot(op.result, op)
    ty = LLVM_TYPES[t.dtype]
    init = ir.Constant(ty, _identity(reduction.identity, t.dtype))
    combine = REGISTRY[reduction.combine].scalar
    combine_expr = combine.expr(t.dtype) if combine is not None else None
    if combine_expr is None:
        raise GirError(f"the CPU backend cannot combine '{op.name}' elements of {t.dtype}", op.loc)
    element = Scalar(low, op, t.dtype, reassociate=True)
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        acc = low.b.alloca(ty)
    kept_strides = [strides[i] for i in range(len(shape)) if i not in axes]
    red_shape = tuple(shape[i] for i in axes)
    red_strides = [strides[i] for i in axes]
    with low.loop_nest(tuple(kept)) as oidx:
        low.b.store(init, acc)
        base = low.linear(oidx, kept_strides)
        with low.loop_nest(red_shape) as ridx:
            v = low.load(low.ptr[x], t.dtype, low.b.add(base, low.linear(ridx, red_strides)))
            a = low.b.load(acc, typ=ty)
            low.b.store(element.build(combine_expr, [a, v]), acc)
        result = low.b.load(acc, typ=ty)
        count = low.product(red_shape)
        if reduction.divide_by_count and not isinstance(count, int):  # over the length: 0/0 is nan
            result = low.b.fdiv(result, low.b.sitofp(count, ty))
        elif reduction.divide_by_count:
            result = low.b.fmul(result, ir.Constant(ty, 1.0 / count if count else math.nan))  # 0 * nan: 0/0
        low.store(result, low.ptr[op.result], t.dtype, low.linear(oidx, _strides(tuple(kept))))
