"""jax.nn's activation functions and `erf` (jax.lax.erf), composed of the registry's ops.

Each is JAX's formula (jax/_src/nn/functions.py) written with ops that have gradient rules
(ir/vjp.py), so each is differentiable with no rule of its own and runs on every backend:
`softplus(x) = max(x, 0) + log1p(exp(-|x|))` (no overflow), `log_sigmoid(x) = -softplus(-x)`,
`silu(x) = x * sigmoid(x)`, `elu` takes `expm1` of the negative part only (no overflow in the
branch `where` drops), `gelu(x, approximate=True)` is the tanh form and `approximate=False`
`x * (1 + erf(x / sqrt(2))) / 2`.

`erf` has no op: it is composed (`erf`'s docstring) of a series below |x| = 2.5 and a
continued fraction above, each on its input clamped to its own range, so the branch a `where`
drops is finite and passes no NaN into the gradient. Float64 error: below 1e-15 relative
(tests/test_jax_surface.py checks it against math.erf); its gradient, the derivative of the
composition, is within 1e-12 relative of 2/sqrt(pi) exp(-x^2) (the series' terms cancel in
it near |x| = 2.5). About 170 elementwise ops, which the fuse pass puts in one kernel.
"""

from __future__ import annotations

import math
from typing import Any

from .numpy_api import abs as absolute
from .numpy_api import exp, maximum, minimum, sigmoid, tanh, traceable, where
from .numpy_extra import _t, expm1, log1p, split
from .tracer import user_location

SERIES_BELOW = 2.5
"""erf uses its series below this |x| and the continued fraction of erfc from it up."""
SERIES_TERMS = 36
"""Terms of the series at |x| < 2.5: the float64 error is below 6e-16 relative (34: 1.1e-15)."""
FRACTION_TERMS = 28
"""Depth of the continued fraction at |x| >= 2.5: the float64 error of 1 - erfc is below 1.2e-16."""


@traceable
def erf(x: Any) -> Any:
    """The error function 2/sqrt(pi) * integral of exp(-t^2) from 0 to x, elementwise (jax.lax.erf).

    |x| < 2.5: erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)), a series of
    positive terms (no cancellation), in Horner form; odd in x, so it needs no sign.
    |x| >= 2.5: erf(x) = sign(x) (1 - erfc(|x|)), erfc(z) = exp(-z^2)/sqrt(pi) / (z + (1/2)/(z +
    1/(z + (3/2)/(z + ...)))), the continued fraction evaluated from its depth up.
    """
    x = _t(x, user_location())
    small = minimum(maximum(x, -SERIES_BELOW), SERIES_BELOW)
    x2 = small * small
    h = 1.0 + x2 * (2.0 / (2 * SERIES_TERMS + 1))
    for n in range(SERIES_TERMS - 1, 0, -1):
        h = 1.0 + (h * x2) * (2.0 / (2 * n + 1))
    series = (2.0 / math.sqrt(math.pi)) * exp(-x2) * small * h
    z = maximum(absolute(x), SERIES_BELOW)
    t = z
    for n in range(FRACTION_TERMS, 0, -1):
        t = z + (n / 2.0) / t
    tail = 1.0 - exp(-(z * z)) / (math.sqrt(math.pi) * t)
    return where(absolute(x) < SERIES_BELOW, series, where(x < 0, -tail, tail))


@traceable
def gelu(x: Any, approximate: bool = True) -> Any:
    """x * Phi(x), Phi the standard normal CDF: with approximate=True (JAX's default) the tanh
    form x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), else x/2 (1 + erf(x / sqrt(2)))."""
    x = _t(x, user_location())
    if approximate:
        return x * (0.5 * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x)))))
    return x * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0) / 2.0


@traceable
def softplus(x: Any) -> Any:
    """log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)): no overflow."""
    x = _t(x, user_location())
    return maximum(x, 0.0) + log1p(exp(-absolute(x)))


@traceable
def log_sigmoid(x: Any) -> Any:
    """log(sigmoid(x)) = -softplus(-x)."""
    x = _t(x, user_location())
    return -softplus(-x)


@traceable
def silu(x: Any) -> Any:
    """x * sigmoid(x) (also `swish`)."""
    x = _t(x, user_location())
    return x * sigmoid(x)


swish = silu


@traceable
def relu6(x: Any) -> Any:
    """min(max(x, 0), 6)."""
    x = _t(x, user_location())
    return minimum(maximum(x, 0.0), 6.0)


@traceable
def leaky_relu(x: Any, negative_slope: float = 1e-2) -> Any:
    """x where x >= 0, else negative_slope * x."""
    x = _t(x, user_location())
    return where(x >= 0, x, negative_slope * x)


@traceable
def elu(x: Any, alpha: float = 1.0) -> Any:
    """x where x > 0, else alpha * (exp(x) - 1); expm1 of the negative part only."""
    x = _t(x, user_location())
    return where(x > 0, x, alpha * expm1(minimum(x, 0.0)))


@traceable
def celu(x: Any, alpha: float = 1.0) -> Any:
    """max(x, 0) + alpha * expm1(min(x, 0) / alpha)."""
    x = _t(x, user_location())
    return maximum(x, 0.0) + alpha * expm1(minimum(x, 0.0) / alpha)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


@traceable
def selu(x: Any) -> Any:
    """scale * elu(x, alpha) with JAX's (Klambauer et al.'s) alpha and scale."""
    x = _t(x, user_location())
    return SELU_SCALE * elu(x, SELU_ALPHA)


@traceable
def soft_sign(x: Any) -> Any:
    """x / (|x| + 1)."""
    x = _t(x, user_location())
    return x / (absolute(x) + 1.0)


@traceable
def hard_tanh(x: Any) -> Any:
    """x clipped to [-1, 1]."""
    x = _t(x, user_location())
    return minimum(maximum(x, -1.0), 1.0)


@traceable
def hard_sigmoid(x: Any) -> Any:
    """relu6(x + 3) / 6."""
    x = _t(x, user_location())
    return relu6(x + 3.0) / 6.0


@traceable
def hard_silu(x: Any) -> Any:
    """x * hard_sigmoid(x) (also `hard_swish`)."""
    x = _t(x, user_location())
    return x * hard_sigmoid(x)


hard_swish = hard_silu


@traceable
def mish(x: Any) -> Any:
    """x * tanh(softplus(x))."""
    x = _t(x, user_location())
    return x * tanh(softplus(x))


@traceable
def glu(x: Any, axis: int = -1) -> Any:
    """The first half of x along axis times the sigmoid of the second half (the axis even)."""
    x = _t(x, user_location())
    a, b = split(x, 2, axis=axis)
    return a * sigmoid(b)


__all__ = ["celu", "elu", "erf", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "leaky_relu",
           "log_sigmoid", "mish", "relu6", "selu", "silu", "soft_sign", "softplus", "swish"]
