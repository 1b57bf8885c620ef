"""Elementwise (fused) loops: one element of an op from its operands' (ir/scalar.py), through
the primitive emitters (`PRIMITIVES`), in a loop nest over the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from ....errors import GirError
from ....ir import scalar
from ....ir.core import Operation, Value
from ....ir.types import FLOAT_DTYPES, TensorType
from .. import mathlib
from ..llvm_types import I64, LLVM_TYPES, MEM_TYPES, _strides
from .lengths import _length_constant

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def _bcast_strides(t: TensorType, out_shape: tuple[int, ...]) -> list[int]:
    shape = tuple(t.shape)
    strides = _strides(shape)
    lead = len(out_shape) - len(shape)
    out = [0] * lead
    for d, s in zip(shape, strides):
        out.append(0 if d == 1 else s)
    return out


@dataclass
class Scalar:
    """Where one element of an op is computed: what the primitive emitters see."""

    low: Lowering
    op: Operation
    dtype: str
    """The compute dtype (ir/scalar.py): of the literals and of the primitives' operands."""
    reassociate: bool = False
    """A float `add` may be reassociated (a sum reduction's accumulator: so that it vectorises)."""

    @property
    def b(self) -> ir.IRBuilder:
        return self.low.b

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def literal(self, value: float) -> ir.Value:
        return ir.Constant(LLVM_TYPES[self.dtype], float(value) if self.is_float else int(value))

    def primitive(self, name: str, args: list[ir.Value]) -> ir.Value:
        return PRIMITIVES[name](self, args)

    def build(self, expr: scalar.Expr, args: list[ir.Value]) -> ir.Value:
        return scalar.build(expr, args, self.literal, self.primitive)


def _scalar(low: Lowering, op: Operation, args: list[ir.Value]) -> ir.Value:
    """One element of op from its operands' elements (ir/scalar.py describes every op)."""
    if op.spec.splat is not None:  # a constant: every element is one scalar
        follows = low.lengths.constants.get(op.result) if low.lengths is not None else None
        if follows is not None:
            return _length_constant(low, op, *follows)
        value = op.spec.splat(op)
        if value is None:
            raise GirError(f"the CPU backend has no scalar for '{op.name}' (not one value for every element)", op.loc)
        return Scalar(low, op, op.result.tensor_type.dtype).literal(value)
    semantics = op.spec.scalar
    dtype = semantics.compute_dtype(op) if semantics is not None else op.result.tensor_type.dtype
    expr = semantics.expr(dtype) if semantics is not None else None
    if expr is None:
        raise GirError(f"the CPU backend has no scalar code for '{op.name}' on {dtype}", op.loc)
    return Scalar(low, op, dtype).build(expr, args)


def _compare(kind: str) -> Callable[[Scalar, list[ir.Value]], ir.Value]:
    def emit(s: Scalar, a: list[ir.Value]) -> ir.Value:
        if s.is_float:  # false on nan, but != is true on nan
            return s.b.fcmp_unordered(kind, *a) if kind == "!=" else s.b.fcmp_ordered(kind, *a)
        # i1 orders false < true (NumPy); as a signed 1-bit integer true would be -1.
        return s.b.icmp_unsigned(kind, *a) if s.dtype == "i1" else s.b.icmp_signed(kind, *a)

    return emit


def _floordiv(s: Scalar, a: list[ir.Value]) -> ir.Value:
    """NumPy's floor division. Never traps: a zero divisor is flagged (the runtime raises, as the
    interpreter does) and the division runs on 1 instead; x // -1 is -x (wrapping: the minimum
    // -1 is the minimum, where the hardware's division would trap)."""
    b = s.b
    x, y = a
    zero, one = ir.Constant(x.type, 0), ir.Constant(x.type, 1)
    by_zero = b.icmp_signed("==", y, zero)
    by_minus_one = b.icmp_signed("==", y, ir.Constant(x.type, -1))
    s.low.flag_error(by_zero, "integer division by zero", s.op)
    safe_y = b.select(b.or_(by_zero, by_minus_one), one, y)
    q = b.sdiv(x, safe_y)
    r = b.srem(x, safe_y)
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                                                 b.icmp_signed("<", safe_y, zero)))
    q = b.select(adjust, b.sub(q, one), q)
    q = b.select(by_minus_one, b.neg(x), q)
    return b.select(by_zero, zero, q)


def _cast(s: Scalar, a: list[ir.Value]) -> ir.Value:
    b = s.b
    src, dst = s.dtype, s.op.result.tensor_type.dtype
    x, to = a[0], LLVM_TYPES[dst]
    if src == dst:
        return x
    if src in FLOAT_DTYPES and dst in FLOAT_DTYPES:
        return b.fpext(x, to) if dst == "f64" else b.fptrunc(x, to)
    if src in FLOAT_DTYPES:
        return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0)) if dst == "i1" else b.fptosi(x, to)
    if dst in FLOAT_DTYPES:
        return b.uitofp(x, to) if src == "i1" else b.sitofp(x, to)
    if dst == "i1":
        return b.icmp_signed("!=", x, ir.Constant(x.type, 0))
    if src == "i1":
        return b.zext(x, to)
    return b.sext(x, to) if to.width > x.type.width else b.trunc(x, to)


def _fadd(s: Scalar, a: list[ir.Value]) -> ir.Value:
    return s.b.fadd(*a, flags=("reassoc", "nsz") if s.reassociate else ())


PRIMITIVES: dict[str, Callable[[Scalar, list[ir.Value]], ir.Value]] = {
    "add": lambda s, a: _fadd(s, a) if s.is_float else s.b.add(*a),
    "sub": lambda s, a: s.b.fsub(*a) if s.is_float else s.b.sub(*a),
    "mul": lambda s, a: s.b.fmul(*a) if s.is_float else s.b.mul(*a),
    "div": lambda s, a: s.b.fdiv(*a),
    "neg": lambda s, a: s.b.fneg(*a) if s.is_float else s.b.neg(*a),
    "floordiv": _floordiv,
    **{name: _compare(kind) for name, kind in zip(scalar.COMPARISONS, ("<", "<=", ">", ">=", "==", "!="))},
    "and": lambda s, a: s.b.and_(*a),
    "or": lambda s, a: s.b.or_(*a),
    "select": lambda s, a: s.b.select(*a),
    # float32 exp and tanh are vectorisable polynomials (mathlib.py); float64 calls libm.
    "exp": lambda s, a: mathlib.exp(s.b, *a),
    "log": lambda s, a: mathlib.log(s.b, *a),
    "tanh": lambda s, a: mathlib.tanh(s.b, *a),
    "sqrt": lambda s, a: mathlib.sqrt(s.b, *a),
    "pow": lambda s, a: mathlib.pow(s.b, *a),
    "abs": lambda s, a: mathlib.fabs(s.b, *a),
    "sin": lambda s, a: mathlib.sin(s.b, *a),
    "cos": lambda s, a: mathlib.cos(s.b, *a),
    "cast": _cast,
}
"""ir/scalar.py's primitive -> its LLVM code."""


def lower_fused(low: Lowering, op: Operation) -> None:
    body = op.body
    outs = op.results
    shape = low.shape(outs[0], op) if outs else ()
    for r in outs:
        low.slot(r, op)
    term = body.terminator
    assert term is not None
    with low.loop_nest(shape) as idx:
        vals: dict[Value, ir.Value] = {}
        for arg, outer in zip(body.args, op.operands):
            t = outer.tensor_type
            vals[arg] = low.load(low.ptr[outer], t.dtype, low.linear(idx, _bcast_strides(t, shape)))
        for inner in body:
            if inner is term:
                break
            vals[inner.result] = _scalar(low, inner, [vals[v] for v in inner.operands])
        out_index = low.linear(idx, _strides(shape))
        for r, v in zip(outs, term.operands):
            low.store(vals[v], low.ptr[r], r.tensor_type.dtype, out_index)


def lower_elementwise(low: Lowering, op: Operation) -> None:
    """An elementwise op outside a fused group: a loop of one op."""
    shape = low.shape(op.result, op)
    low.slot(op.result, op)
    with low.loop_nest(shape) as idx:
        args = [low.load(low.ptr[v], v.tensor_type.dtype, low.linear(idx, _bcast_strides(v.tensor_type, shape)))
                for v in op.operands]
        low.store(_scalar(low, op, args), low.ptr[op.result], op.result.tensor_type.dtype,
                  low.linear(idx, _strides(shape)))


def lower_constant(low: Lowering, op: Operation) -> None:
    t = op.result.tensor_type
    shape = low.shape(op.result, op)
    if op.operands:  # `fill`: a scalar known at run time
        src = low.ptr[op.operands[0]]
        low.slot(op.result, op)
        v = low.load(src, t.dtype, ir.Constant(I64, 0))
        with low.for_range(low.product(shape)) as i:
            low.store(v, low.ptr[op.result], t.dtype, i)
        return
    if op.spec.splat is None or op.spec.splat(op) is None:  # a list literal: a global constant
        data = np.asarray(op.attrs["value"], dtype=t.numpy_dtype).reshape(-1)
        ty = ir.ArrayType(MEM_TYPES[t.dtype], data.size)
        const = ir.Constant(ty, [ir.Constant(MEM_TYPES[t.dtype], float(x) if t.is_float else int(x)) for x in data])
        g = ir.GlobalVariable(low.module, ty, name=f"const.{len(low.module.globals)}")
        g.global_constant = True
        g.initializer = const
        g.linkage = "internal"
        low.ptr[op.result] = g
        return
    low.slot(op.result, op)
    scalar = _scalar(low, op, [])
    with low.for_range(low.product(shape)) as i:
        low.store(scalar, low.ptr[op.result], t.dtype, i)
