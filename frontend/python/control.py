"""`cond`, `fori_loop`, `while_loop` and `vmap` (jax.lax's and jax's), built on `gir.scan` and
`gir.where`, so each is differentiable with no rule of its own.

- `cond(pred, true_fun, false_fun, *operands)` traces both branches and selects per leaf
  (`select`), as JAX does under `vmap`: both branches run. A Python bool picks one branch.
- `fori_loop(lower, upper, body, init)` with Python bounds is a `scan` of upper - lower steps
  whose carry is (i, value); reverse-mode differentiable, as JAX's is with static bounds.
- `while_loop(cond_fun, body_fun, init, max_iterations=N)`: gir has no loop with a data-dependent
  trip count, so it is a scan of N steps that stops changing the value once cond_fun is false
  (a gir extension; JAX's while_loop has no bound and no reverse-mode gradient). Without
  max_iterations it is an error that says so.
- `vmap(fun, in_axes=0, out_axes=0)` traces fun on one example and re-emits its ops with a
  leading batch axis (batching.py: elementwise ops, matmul, reductions, layout ops, gathers),
  as JAX does, scans and grads inside fun included; where an op has no batching rule
  (scatter_add, call) or a rule needs a `?` batch size, it falls back to a `scan` over
  the batch axis, which is right for any fun but runs the examples one after another.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import Location
from ...ir.core import Value, erase_op
from .batching import Batcher, NoBatchRule
from .numpy_api import _transpose, traceable, where
from .pytree import flatten, func_name, unflatten, value_name
from .tracer import (
    Frame,
    GirTraceError,
    Tracer,
    current_frame,
    finish_function,
    frame_scope,
    new_function,
    resolve,
    to_value,
    user_location,
)
from .transforms import scan


def _pred(pred: Any, loc: Location, what: str = "cond needs a scalar predicate") -> Tracer:
    frame = current_frame()
    assert frame is not None
    p = Tracer(to_value(pred, loc=loc), frame, frame.block)
    if p.type.rank != 0:
        raise GirTraceError(f"{what}, got {p.type}", loc)
    return p if p.type.dtype == "i1" else p != 0


@traceable
def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any) -> Any:
    """As jax.lax.cond: true_fun(*operands) if pred else false_fun(*operands)."""
    loc = user_location()
    if isinstance(pred, (bool, np.bool_)):
        return (true_fun if pred else false_fun)(*operands)
    p = _pred(pred, loc)
    a_leaves, _, a_tree = flatten(true_fun(*operands))
    b_leaves, _, b_tree = flatten(false_fun(*operands))
    if a_tree != b_tree:
        raise GirTraceError(f"cond: the branches return different structures, {a_tree} and {b_tree}", loc)
    out = []
    for a, b in zip(a_leaves, b_leaves):
        ta = to_value(a, loc=loc).tensor_type if not isinstance(a, (int, float)) else None
        tb = to_value(b, loc=loc).tensor_type if not isinstance(b, (int, float)) else None
        if ta is not None and tb is not None and ta != tb:
            raise GirTraceError(f"cond: the branches return {ta} and {tb} for one leaf; convert with .astype", loc)
        out.append(where(p, a, b))
    return unflatten(a_tree, out)


@traceable
def fori_loop(lower: int, upper: int, body_fun: Callable[[Any, Any], Any], init_val: Any) -> Any:
    """As jax.lax.fori_loop with Python bounds: val = body_fun(i, val) for i in [lower, upper)."""
    loc = user_location()
    if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in (lower, upper)):
        raise GirTraceError("fori_loop needs Python int bounds (the trip count is the scan's length); for a "
                            "data-dependent count use gir.while_loop(..., max_iterations=N)", loc)
    n = int(upper) - int(lower)
    if n <= 0:
        return init_val

    def step(carry: Any, _: Any) -> Any:
        i, val = carry
        return (i + 1, body_fun(i, val)), None

    start = np.asarray(int(lower), dtype=np.int32)
    (_, val), _ = scan(step, (start, init_val), length=n)
    return val


@traceable
def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any,
               max_iterations: int | None = None) -> Any:
    """As jax.lax.while_loop, bounded: val = body_fun(val) while cond_fun(val), at most
    max_iterations times (required: a scan of that many steps; once cond_fun is false the
    value stops changing). Differentiable (the stopped steps pass the value through)."""
    loc = user_location()
    if max_iterations is None:
        raise GirTraceError("gir.while_loop needs max_iterations=N: gir has no loop with a data-dependent trip "
                            "count, so it runs N steps and keeps the value once cond_fun is false", loc)

    def step(val: Any, _: Any) -> Any:
        going = _pred(cond_fun(val), loc, "while_loop: cond_fun must return a scalar")
        new = body_fun(val)
        leaves, _, tree = flatten(val)
        new_leaves, _, new_tree = flatten(new)
        if tree != new_tree:
            raise GirTraceError(f"while_loop: body_fun returns the structure {new_tree}, the value has {tree}", loc)
        return unflatten(tree, [where(going, b, a) for a, b in zip(leaves, new_leaves)]), None

    val, _ = scan(step, init_val, length=int(max_iterations))
    return val


def vmap(fun: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0) -> Callable[..., Any]:
    """As jax.vmap: fun mapped over axis `in_axes` of its arguments (an int, None for an
    argument that is not mapped, or a tuple of those per argument), the results stacked along
    `out_axes`. Batched ops, or a gir.scan over the batch axis (see the module docstring)."""
    loc = user_location()
    if not callable(fun):
        raise GirTraceError(f"gir.vmap takes a function, not {type(fun).__name__}", loc)

    @functools.wraps(fun)
    def mapped(*args: Any) -> Any:
        return _vmap_call(fun, in_axes, out_axes, args, user_location())

    return traceable(mapped)


def _vmap_call(fun: Callable[..., Any], in_axes: Any, out_axes: Any, args: tuple[Any, ...], loc: Location) -> Any:
    axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
    if len(axes) != len(args):
        raise GirTraceError(f"vmap: in_axes has {len(axes)} entries for {len(args)} arguments", loc)
    mapped, fixed = [], {}
    for k, (arg, axis) in enumerate(zip(args, axes)):
        if axis is None:
            fixed[k] = arg
            continue
        leaves, _, tree = flatten(arg)
        moved = [_front(leaf, int(axis), loc) for leaf in leaves]
        mapped.append((k, unflatten(tree, moved)))
    if not mapped:
        raise GirTraceError("vmap: no argument is mapped (every in_axes is None)", loc)
    try:
        ys = _vmap_batched(fun, len(args), mapped, fixed, loc)
    except NoBatchRule:
        ys = _vmap_scan(fun, len(args), mapped, fixed)
    if out_axes == 0:
        return ys
    leaves, _, tree = flatten(ys)
    return unflatten(tree, [_from_front(leaf, int(out_axes), loc) for leaf in leaves])


def _vmap_scan(fun: Callable[..., Any], n: int, mapped: list[tuple[int, Any]], fixed: dict[int, Any]) -> Any:
    """vmap as a scan over the leading (batch) axis of the mapped arguments."""

    def step(carry: Any, xs: Any) -> Any:
        call = dict(fixed)
        call.update({k: x for (k, _), x in zip(mapped, xs)})
        return carry, fun(*[call[k] for k in range(n)])

    _, ys = scan(step, None, [x for _, x in mapped])
    return ys


def _vmap_batched(fun: Callable[..., Any], n: int, mapped: list[tuple[int, Any]], fixed: dict[int, Any],
                  loc: Location) -> Any:
    """fun traced on one example (a function of the caller's module, removed again), its ops
    re-emitted batched (batching.py). Raises NoBatchRule, having emitted nothing, where an op
    has no rule."""
    frame = current_frame()
    assert frame is not None
    leaves, paths, tree = flatten([x for _, x in mapped], path=("x",))
    sizes = {leaf.type.shape[0] for leaf in leaves}
    if len(sizes) > 1:
        raise GirTraceError(f"vmap: the mapped axes have different sizes {sorted(sizes, key=str)}", loc)
    module = frame.module
    before = set(module.functions)
    function = new_function(func_name(getattr(fun, "__name__", "f")) + "_example", module,
                            [leaf.type.with_shape(leaf.type.shape[1:]) for leaf in leaves],
                            [value_name(p) for p in paths], loc)
    callee = Frame(function, module, frame)
    start = len(frame.block.ops)
    batcher: Batcher | None = None
    try:
        with frame_scope(callee):
            examples = unflatten(tree, [Tracer(a, callee, function.body) for a in function.args])
            call = dict(fixed)
            call.update({k: x for (k, _), x in zip(mapped, examples)})
            out_leaves, _, out_tree = flatten(fun(*[call[k] for k in range(n)]))
            finish_function(function, module, [to_value(leaf, loc=loc) for leaf in out_leaves], loc)
        env: dict[Value, tuple[Value, bool]] = {a: (resolve(leaf), True) for a, leaf in zip(function.args, leaves)}
        env.update({inner: (outer, False) for outer, inner in callee.captures.items()})
        batcher = Batcher(frame, next(iter(sizes)), loc)
        outs = [v if b else batcher.broadcast_batch(v) for v, b in batcher.run(function, env)]
    except NoBatchRule:
        for op in reversed(frame.block.ops[start:]):
            erase_op(op)
        if batcher is not None:
            batcher.made.clear()  # nothing refers to them now
        raise
    finally:
        for name in set(module.functions) - before - set(batcher.made if batcher is not None else ()):
            del module.functions[name]
    return unflatten(out_tree, [Tracer(v, frame, frame.block) for v in outs])


def _front(x: Any, axis: int, loc: Location) -> Tracer:
    frame = current_frame()
    assert frame is not None
    t = Tracer(to_value(x, loc=loc), frame, frame.block)
    rank = t.type.rank
    if not -rank <= axis < rank:
        raise GirTraceError(f"vmap: in_axes {axis} is out of range for {t.type}", loc)
    axis %= rank
    return t if axis == 0 else _transpose(t, [axis] + [a for a in range(rank) if a != axis], loc)


def _from_front(x: Tracer, axis: int, loc: Location) -> Tracer:
    rank = x.type.rank
    axis %= rank
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
    return x if axis == 0 else _transpose(x, perm, loc)


__all__ = ["cond", "fori_loop", "vmap", "while_loop"]
