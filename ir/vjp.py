"""Reverse-mode rules: one line per op kind, installed into the op registry's `vjp` field.

A rule gets `c`, a context bound to one op, and `g`, the cotangent of the op's result, and
returns the cotangents of the operands (None where none flows, e.g. into an i1 condition).
`c.x(i)` is operand i and `c.y` the result as seen where the backward ops are emitted (in a
backward scan body these are residuals stacked by the forward scan, never recomputations);
`c.ub(v, i)` sums a broadcast cotangent back to the shape of operand i. `scan` has its own
multi-result rule in transforms/autodiff.py; `call` is inlined before differentiation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

Rule = Callable[[Any, Any], list[Any]]


def _matmul(c: Any, g: Any) -> list[Any]:
    a, b = c.x(0), c.x(1)
    ta, tb = c.type(0), c.type(1)
    if tb.rank == 2 and ta.rank > 2 and None not in ta.shape:
        # A 2-D weight applied to a batch: its cotangent is one GEMM with K = batch * rows,
        # not a batched product summed afterwards.
        rows = c.reshape(a, (-1, ta.shape[-1]))
        return [c.matmul(g, c.mT(b)), c.matmul(c.mT(rows), c.reshape(g, (-1, g.tensor_type.shape[-1])))]
    return [c.ub(c.matmul(g, c.mT(b)), 0), c.ub(c.matmul(c.mT(a), g), 1)]


def _concat(c: Any, g: Any) -> list[Any]:
    axis, out, start = c.attr("axis") % c.rank(g), [], 0
    for i in range(len(c.op.operands)):
        size = c.type(i).shape[axis]
        out.append(c.slice_axis(g, axis, start, start + size))
        start += size
    return out


def _stack(c: Any, g: Any) -> list[Any]:
    axis = c.attr("axis") % c.rank(g)
    return [c.reshape(c.slice_axis(g, axis, i, i + 1), c.type(i).shape) for i in range(len(c.op.operands))]


def _reduce_extreme(c: Any, g: Any) -> list[Any]:
    # The cotangent is shared equally by the elements that attain the extreme (as in JAX).
    x = c.x(0)
    mask = c.cast(c.eq(x, c.expand(c.y, 0)), c.type(0).dtype)
    count = c.expand(c.sum_like(mask), 0)
    return [c.div(c.mul(mask, c.expand(g, 0)), count)]


VJP_RULES: dict[str, Rule] = {
    "add": lambda c, g: [c.ub(g, 0), c.ub(g, 1)],
    "sub": lambda c, g: [c.ub(g, 0), c.ub(c.neg(g), 1)],
    "mul": lambda c, g: [c.ub(c.mul(g, c.x(1)), 0), c.ub(c.mul(g, c.x(0)), 1)],
    "div": lambda c, g: [c.ub(c.div(g, c.x(1)), 0), c.ub(c.neg(c.div(c.mul(g, c.y), c.x(1))), 1)],
    "pow": lambda c, g: [c.ub(c.mul(g, c.mul(c.x(1), c.pow(c.x(0), c.sub(c.x(1), c.const(1.0))))), 0),
                         c.ub(c.mul(g, c.mul(c.y, c.log(c.x(0)))), 1)],
    "max": lambda c, g: [c.ub(c.select(c.ge(c.x(0), c.x(1)), g, c.const(0.0)), 0),
                         c.ub(c.select(c.ge(c.x(0), c.x(1)), c.const(0.0), g), 1)],
    "min": lambda c, g: [c.ub(c.select(c.le(c.x(0), c.x(1)), g, c.const(0.0)), 0),
                         c.ub(c.select(c.le(c.x(0), c.x(1)), c.const(0.0), g), 1)],
    "neg": lambda c, g: [c.neg(g)],
    "abs": lambda c, g: [c.select(c.lt(c.x(0), c.const(0.0)), c.neg(g), g)],
    "exp": lambda c, g: [c.mul(g, c.y)],
    "log": lambda c, g: [c.div(g, c.x(0))],
    "tanh": lambda c, g: [c.mul(g, c.sub(c.const(1.0), c.mul(c.y, c.y)))],
    "sigmoid": lambda c, g: [c.mul(g, c.mul(c.y, c.sub(c.const(1.0), c.y)))],
    "relu": lambda c, g: [c.select(c.gt(c.x(0), c.const(0.0)), g, c.const(0.0))],
    "sqrt": lambda c, g: [c.div(c.mul(g, c.const(0.5)), c.y)],
    "sin": lambda c, g: [c.mul(g, c.cos(c.x(0)))],
    "cos": lambda c, g: [c.neg(c.mul(g, c.sin(c.x(0))))],
    "stop_gradient": lambda c, g: [None],
    "select": lambda c, g: [None, c.ub(c.select(c.x(0), g, c.const(0.0)), 1),
                            c.ub(c.select(c.x(0), c.const(0.0), g), 2)],
    "cast": lambda c, g: [c.cast(g, c.type(0).dtype)],
    "fill": lambda c, g: [c.sum_all(g)],
    "matmul": _matmul,
    "transpose": lambda c, g: [c.transpose(g, c.inverse_perm())],
    "reshape": lambda c, g: [c.reshape(g, c.type(0).shape)],
    "broadcast": lambda c, g: [c.ub(g, 0)],
    "concat": _concat,
    "slice": lambda c, g: [c.pad_slice(g)],
    "index": lambda c, g: [c.scatter_add(c.zeros_of(0), c.x(1), g), None],
    "scatter_add": lambda c, g: [g, None, c.index(g, c.x(1))],
    "stack": _stack,
    "sum": lambda c, g: [c.expand(g, 0)],
    "mean": lambda c, g: [c.div(c.expand(g, 0), c.const(float(c.reduced_count())))],
    "reduce_max": _reduce_extreme,
    "reduce_min": _reduce_extreme,
    "logsumexp": lambda c, g: [c.mul(c.expand(g, 0), c.exp(c.sub(c.x(0), c.expand(c.y, 0))))],
    "transfer": lambda c, g: [g],
    "constant": lambda c, g: [],
    "zeros": lambda c, g: [],
    "ones": lambda c, g: [],
}
"""Ops without an entry: comparisons and logical ops (their i1 results never carry a
cotangent, so they stop gradients, which is right). `index` and `scatter_add` are each other's
transposes: a gather's cotangent is scattered back with repeated rows summed. The cotangent of
`logsumexp` is g times the softmax, exp(x - y)."""


def install(registry: dict[str, Any]) -> None:
    for name, rule in VJP_RULES.items():
        registry[name] = replace(registry[name], vjp=rule)
