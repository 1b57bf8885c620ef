"""`gir.optim`: optimizers as pure functions over pytrees, as optax's, so that `gir.jit`
compiles the update into the training step.

    opt = gir.optim.chain(gir.optim.clip_by_global_norm(1.0), gir.optim.adam(1e-3))
    state = opt.init(params)                              # NumPy arrays, outside the step

    @gir.jit
    def step(params, state, xs, ys):
        loss, grads = gir.value_and_grad(loss_fn)(params, xs, ys)
        updates, state = opt.update(grads, state, params)
        return loss, gir.optim.apply_updates(params, updates), state

`update` is written with operators only, so it runs on traced values inside a step and on
NumPy arrays outside one (the tests compare the two). A learning rate is a number or a
function of the step count (a schedule). The state's step count is an int32 array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...errors import GirArgumentError
from .numpy_api import sqrt as gir_sqrt
from .numpy_api import sum as gir_sum
from .tracer import Tracer
from .tree_util import tree_leaves, tree_map

Schedule = Callable[[Any], Any]


@dataclass(frozen=True)
class GradientTransformation:
    """init(params) -> state; update(grads, state, params=None) -> (updates, new state)."""

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]


def _sqrt(x: Any) -> Any:
    return gir_sqrt(x) if isinstance(x, Tracer) else np.sqrt(x)


def _zeros_like(x: Any) -> Any:
    return np.zeros(np.shape(x), dtype=getattr(x, "dtype", np.float32))


def _as_float(count: Any, like: Any) -> Any:
    """The step count as a float of like's dtype (for b ** count)."""
    return count.astype(like.dtype) if hasattr(count, "astype") else np.asarray(count, like.dtype)


def _lr(learning_rate: float | Schedule, count: Any) -> Any:
    return learning_rate(count) if callable(learning_rate) else learning_rate


def apply_updates(params: Any, updates: Any) -> Any:
    """params + updates, leafwise."""
    return tree_map(lambda p, u: p + u, params, updates)


def global_norm(tree: Any) -> Any:
    """sqrt of the sum of squares of every leaf."""
    total = sum((gir_sum(x * x) if isinstance(x, Tracer) else np.sum(np.square(x))) for x in tree_leaves(tree))
    return _sqrt(total)


class EmptyState(NamedTuple):
    pass


class ScaleByMomentumState(NamedTuple):
    count: Any
    trace: Any


def sgd(learning_rate: float | Schedule, momentum: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """SGD, with momentum (optax's trace: t = g + momentum * t; the step is -lr * t, or
    -lr * (g + momentum * t) with nesterov)."""
    def init(params: Any) -> ScaleByMomentumState:
        return ScaleByMomentumState(np.zeros((), np.int32), tree_map(_zeros_like, params))

    def update(grads: Any, state: ScaleByMomentumState, params: Any = None) -> tuple[Any, Any]:
        lr = _lr(learning_rate, state.count)
        trace = tree_map(lambda g, t: g + momentum * t, grads, state.trace)
        step = tree_map(lambda g, t: g + momentum * t, grads, trace) if nesterov else trace
        updates = tree_map(lambda s: -lr * s, step)
        return updates, ScaleByMomentumState(state.count + 1, trace)

    return GradientTransformation(init, update)


class AdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def adamw(learning_rate: float | Schedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-4) -> GradientTransformation:
    """AdamW (optax's): mu, nu the moving averages of g and g**2, bias-corrected by 1 - b**t;
    the step is -lr * (mu_hat / (sqrt(nu_hat) + eps) + weight_decay * params)."""
    def init(params: Any) -> AdamState:
        return AdamState(np.zeros((), np.int32), tree_map(_zeros_like, params), tree_map(_zeros_like, params))

    def update(grads: Any, state: AdamState, params: Any = None) -> tuple[Any, Any]:
        count = state.count + 1
        lr = _lr(learning_rate, state.count)
        mu = tree_map(lambda g, m: b1 * m + (1 - b1) * g, grads, state.mu)
        nu = tree_map(lambda g, v: b2 * v + (1 - b2) * (g * g), grads, state.nu)

        def step(m: Any, v: Any, p: Any) -> Any:
            t = _as_float(count, m)
            direction = (m / (1 - b1 ** t)) / (_sqrt(v / (1 - b2 ** t)) + eps)
            if weight_decay:
                direction = direction + weight_decay * p
            return -lr * direction

        if weight_decay and params is None:
            raise GirArgumentError("adamw's update needs params (for the weight decay): "
                                   "optimizer.update(grads, state, params)")
        updates = tree_map(step, mu, nu, params if weight_decay else mu)
        return updates, AdamState(count, mu, nu)

    return GradientTransformation(init, update)


def adam(learning_rate: float | Schedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8) -> GradientTransformation:
    """Adam (optax's): adamw without weight decay."""
    return adamw(learning_rate, b1, b2, eps, weight_decay=0.0)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scales every update by min(1, max_norm / global_norm(updates))."""
    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(grads: Any, state: EmptyState, params: Any = None) -> tuple[Any, Any]:
        norm = global_norm(grads)
        if isinstance(norm, Tracer):
            from .numpy_api import maximum
            scale = max_norm / maximum(norm, max_norm)
        else:
            scale = max_norm / np.maximum(norm, max_norm)
        return tree_map(lambda g: g * scale, grads), state

    return GradientTransformation(init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """The transformations applied in order; the state is the tuple of their states."""
    def init(params: Any) -> tuple[Any, ...]:
        return tuple(t.init(params) for t in transforms)

    def update(grads: Any, state: tuple[Any, ...], params: Any = None) -> tuple[Any, Any]:
        new_states = []
        for t, s in zip(transforms, state):
            grads, s = t.update(grads, s, params)
            new_states.append(s)
        return grads, tuple(new_states)

    return GradientTransformation(init, update)


__all__ = ["AdamState", "EmptyState", "GradientTransformation", "ScaleByMomentumState", "adam", "adamw",
           "apply_updates", "chain", "clip_by_global_norm", "global_norm", "sgd"]
