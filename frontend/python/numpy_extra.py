"""More of NumPy's (and jax.nn's) functions on traced values, composed of the registry's ops.

Each function here is built from ops that already have a gradient rule (ir/vjp.py), so each
is differentiable where NumPy's function is, with no rule of its own: `softmax` is
`exp(x - logsumexp(x))`, `cumsum` a product with a triangular matrix of ones, `flip` and
`take_along_axis` gathers (`index`, whose gradient is `scatter_add`), `prod` a tree of
products of halves, `einsum` transposes, reshapes and one `matmul`. Only `sin`, `cos` and
`stop_gradient` needed ops of their own. Outside a trace they run eagerly (`traceable`).

Known gaps (docs/python.md's table): `einsum` takes one or two operands without repeated
indices inside one operand (no diagonals) and no `...`; `pad` pads with a constant only;
`cumsum`, `flip`, `prod`, `take_along_axis`, `split`, `pad` need the size of the axis they
work on to be known (not `?`).
"""

from __future__ import annotations

import builtins
import string
from typing import Any, cast

import numpy as np

from ...errors import Location
from ...ir.types import FLOAT_DTYPES, INT_DTYPES
from .numpy_api import (
    _reshape,
    _tracer,
    _transpose,
    astype,
    concatenate,
    exp,
    float_operand,
    log,
    logsumexp,
    matmul,
    maximum,
    minimum,
    sqrt,
    traceable,
    where,
)
from .numpy_api import (
    max as reduce_max,
)
from .numpy_api import (
    mean as reduce_mean,
)
from .numpy_api import (
    min as reduce_min,
)
from .numpy_api import (
    sum as reduce_sum,
)
from .pytree import flatten, unflatten
from .tracer import GirTraceError, Tracer, current_frame, dtype_of, emit1, to_value, user_location

_t = _tracer
"""x as a traced value (numpy_api's `_tracer`, short here where every function calls it)."""


def _axis(axis: Any, rank: int, loc: Location) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -rank <= axis < builtins.max(rank, 1):
        raise GirTraceError(f"axis {axis!r} is out of range for rank {rank}", loc)
    return int(axis) % builtins.max(rank, 1)


def _known(t: Tracer, axis: int, what: str, loc: Location) -> int:
    d = t.type.shape[axis]
    if d is None:
        raise GirTraceError(f"{what} on axis {axis} of {t.type}: that axis is `?`; it needs its size (trace "
                            "with concrete sizes, gir.jit specialises)", loc)
    return d


def _move_to_front(x: Tracer, axis: int, loc: Location) -> Tracer:
    if axis == 0:
        return x
    perm = [axis] + [a for a in range(x.type.rank) if a != axis]
    return _transpose(x, perm, loc)


def _move_back(x: Tracer, axis: int, loc: Location) -> Tracer:
    if axis == 0:
        return x
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, x.type.rank))
    return _transpose(x, perm, loc)


def _dims(t: Tracer) -> tuple[int, ...]:
    return tuple(-1 if d is None else d for d in t.type.shape)


def _float_dtype(t: Tracer) -> str:
    return t.type.dtype if t.type.dtype in FLOAT_DTYPES else "f32"


# -- jax.lax ------------------------------------------------------------------------------------


@traceable
def stop_gradient(x: Any) -> Any:
    """x (any pytree), with no gradient flowing back through it (jax.lax.stop_gradient)."""
    loc = user_location()
    leaves, _, tree = flatten(x)
    return unflatten(tree, [emit1("stop_gradient", [to_value(leaf, loc=loc)], loc=loc) for leaf in leaves])


# -- elementwise --------------------------------------------------------------------------------


@traceable
def sin(x: Any) -> Any:
    """Sine (radians), elementwise."""
    loc = user_location()
    return emit1("sin", [float_operand("sin", to_value(x, "f32" if not isinstance(x, Tracer) else None, loc), loc)],
                 loc=loc)


@traceable
def cos(x: Any) -> Any:
    """Cosine (radians), elementwise."""
    loc = user_location()
    return emit1("cos", [float_operand("cos", to_value(x, "f32" if not isinstance(x, Tracer) else None, loc), loc)],
                 loc=loc)


@traceable
def square(x: Any) -> Any:
    """x * x, elementwise."""
    return x * x


@traceable
def clip(x: Any, a_min: Any = None, a_max: Any = None) -> Any:
    """min(max(x, a_min), a_max); either bound may be None."""
    if a_min is not None:
        x = maximum(x, a_min)
    if a_max is not None:
        x = minimum(x, a_max)
    return x


@traceable
def sign(x: Any) -> Any:
    """-1, 0 or 1 by the sign of x (nan stays nan); its gradient is zero."""
    loc = user_location()
    x = _t(x, loc)
    if x.type.dtype == "i1":
        raise GirTraceError("sign of a bool tensor: convert with .astype first", loc)
    out = astype(x > 0, x.dtype) - astype(x < 0, x.dtype)
    return where(x != x, x, out) if x.type.dtype in FLOAT_DTYPES else out


@traceable
def isnan(x: Any) -> Any:
    """x is nan, elementwise (x != x)."""
    x = _t(x, user_location())
    return x != x


@traceable
def isfinite(x: Any) -> Any:
    """x is neither nan nor +-inf, elementwise."""
    x = _t(x, user_location())
    return (x == x) & (x - x == 0)


@traceable
def log1p(x: Any) -> Any:
    """log(1 + x), accurate for small |x|: log(u) * x / (u - 1) with u = 1 + x (the rounding of
    u cancels; Goldberg's identity), and x itself where u rounds to 1."""
    x = _t(x, user_location())
    u = 1.0 + x
    d = u - 1.0
    safe = where(d == 0, 1.0, d)
    return where(d == 0, x, log(u) * (x / safe))


KAHAN_BELOW = 0.5
"""|x| under which expm1 uses Kahan's formula; from it on exp(x) - 1 loses no digits (e^x - 1 is
at least 1 - e^-0.5 = 0.39 in size)."""


@traceable
def expm1(x: Any) -> Any:
    """exp(x) - 1, accurate for small |x|: (u - 1) * x / log(u) with u = exp(x) (Kahan) where
    |x| < 0.5, on x clamped to that range, and exp(x) - 1 elsewhere. Clamped, the formula never
    sees an exp that under- or overflows (log(u) = -inf or inf: 0 * inf, a NaN in the value
    and, in the branch `where` drops, in the gradient), and its derivative, which the rounding
    of log(exp(x)) spoils far from 0 (1e-4 relative at x = -30), is used only near 0."""
    x = _t(x, user_location())
    near = minimum(maximum(x, -KAHAN_BELOW), KAHAN_BELOW)
    u = exp(near)
    lu = log(u)
    small = (u == 1.0) | (lu == 0)
    kahan = where(small, near, (u - 1.0) * (near / where(small, 1.0, lu)))
    return where(abs(x) < KAHAN_BELOW, kahan, exp(x) - 1.0)


# -- jax.nn -------------------------------------------------------------------------------------


@traceable
def softmax(x: Any, axis: Any = -1) -> Any:
    """exp(x) / sum(exp(x)) over axis, computed as exp(x - logsumexp(x)) (no overflow)."""
    x = _t(x, user_location())
    return exp(x - logsumexp(x, axis=axis, keepdims=True))


@traceable
def log_softmax(x: Any, axis: Any = -1) -> Any:
    """x - logsumexp(x) over axis."""
    x = _t(x, user_location())
    return x - logsumexp(x, axis=axis, keepdims=True)


@traceable
def one_hot(x: Any, num_classes: int, dtype: Any = "f32", axis: int = -1) -> Any:
    """As jax.nn.one_hot: x's integers as one-hot vectors along a new last axis (an index out of
    [0, num_classes) gives a row of zeros)."""
    loc = user_location()
    x = _t(x, loc)
    if x.type.dtype not in INT_DTYPES:
        raise GirTraceError(f"one_hot needs integer class ids, got {x.type}; convert with .astype('int32')", loc)
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        raise GirTraceError(f"one_hot: num_classes must be a non-negative int, got {num_classes!r}", loc)
    classes = np.arange(int(num_classes), dtype=np.int64 if x.type.dtype == "i64" else np.int32)
    hot = astype(_reshape(x, (*_dims(x), 1), loc) == classes, dtype_of(dtype, loc))
    rank = hot.type.rank
    a = _axis(axis, rank, loc)
    if a == rank - 1:
        return hot
    perm = list(range(rank - 1))
    perm.insert(a, rank - 1)
    return _transpose(hot, perm, loc)


# -- making arrays ------------------------------------------------------------------------------


def _shape_of(shape: Any, what: str, loc: Location) -> tuple[int, ...]:
    """A static shape (an int or a sequence of non-negative ints), else a located error."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    ok = isinstance(dims, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims)
    if not ok:
        raise GirTraceError(f"{what}: expected non-negative integer sizes, got {shape!r}", loc)
    return tuple(int(d) for d in dims)


def _array(a: np.ndarray, loc: Location) -> Tracer:
    frame = current_frame()
    if frame is None:
        return a  # type: ignore[return-value]  # outside a trace: a NumPy array
    return Tracer(to_value(a, loc=loc), frame, frame.block)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> Any:
    """As np.arange with static bounds (a constant; a NumPy array outside a trace)."""
    loc = user_location()
    for b in (start, stop, step):
        if isinstance(b, Tracer):
            raise GirTraceError("arange needs Python numbers: its length is the shape of its result", loc)
    a = np.arange(start, stop, step) if stop is not None else np.arange(start)
    if dtype is not None:
        a = a.astype(np.dtype(dtype) if not isinstance(dtype, str) or dtype not in _SHORT else _SHORT[dtype])
    elif a.dtype == np.int64 and (a.size == 0 or builtins.max(abs(int(a.min())), abs(int(a.max()))) < 2**31):
        a = a.astype(np.int32)  # JAX's default int
    elif a.dtype == np.float64:
        a = a.astype(np.float32)
    return _array(a, loc)


_SHORT = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "i1": np.bool_}


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Any:
    """A tensor of `shape` filled with fill_value (a number or a traced scalar)."""
    loc = user_location()
    dims = _shape_of(shape, "full", loc)
    if isinstance(fill_value, Tracer):
        v = fill_value if dtype is None else astype(fill_value, dtype)
        zeros = np.zeros(dims, dtype=np.dtype(_SHORT.get(v.type.dtype, np.float32)))
        return v + _array(zeros, loc)
    dt = np.dtype(_SHORT[dtype_of(dtype, loc)]) if dtype is not None else (
        np.float32 if isinstance(fill_value, float) else np.int32 if not isinstance(fill_value, bool) else np.bool_)
    return _array(np.full(dims, fill_value, dtype=dt), loc)


def eye(n: int, m: int | None = None, k: int = 0, dtype: Any = "f32") -> Any:
    """The n x m identity (ones on diagonal k)."""
    loc = user_location()
    n, m = _shape_of((n, n if m is None else m), "eye", loc)
    if not isinstance(k, (int, np.integer)):
        raise GirTraceError(f"eye: k must be an int, got {k!r}", loc)
    return _array(np.eye(n, m, int(k), dtype=_SHORT[dtype_of(dtype, loc)]), loc)


# -- layout -------------------------------------------------------------------------------------


@traceable
def expand_dims(x: Any, axis: Any) -> Any:
    """x with axes of size 1 inserted at `axis` (an int or a tuple)."""
    loc = user_location()
    x = _t(x, loc)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    rank = x.type.rank + len(axes)
    axes = sorted(_axis(a, rank, loc) for a in axes)
    dims = list(_dims(x))
    for a in axes:
        dims.insert(a, 1)
    return _reshape(x, dims, loc)


@traceable
def squeeze(x: Any, axis: Any = None) -> Any:
    """x without its axes of size 1 (those given, or all)."""
    loc = user_location()
    x = _t(x, loc)
    shape = x.type.shape
    if axis is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    else:
        axes = [_axis(a, x.type.rank, loc) for a in ([axis] if isinstance(axis, (int, np.integer)) else axis)]
        for a in axes:
            if shape[a] != 1:
                raise GirTraceError(f"squeeze: axis {a} of {x.type} does not have size 1", loc)
    return _reshape(x, [-1 if d is None else d for i, d in enumerate(shape) if i not in axes], loc)


def _slice_axis(x: Tracer, axis: int, start: int, stop: int, loc: Location) -> Tracer:
    key = [slice(None)] * x.type.rank
    key[axis] = slice(start, stop)
    return x[tuple(key)]


@traceable
def split(x: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    """np.split: n equal sections, or the pieces between the given indices."""
    loc = user_location()
    x = _t(x, loc)
    a = _axis(axis, x.type.rank, loc)
    n = _known(x, a, "split", loc)
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or n % k:
            raise GirTraceError(f"split: {n} elements do not divide into {k} equal sections", loc)
        cuts = [i * (n // k) for i in range(1, k)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    bounds = [0, *cuts, n]
    return [_slice_axis(x, a, lo, builtins.max(lo, hi), loc) for lo, hi in zip(bounds, bounds[1:])]


@traceable
def flip(x: Any, axis: Any = None) -> Any:
    """x with the order of elements reversed along axis (all axes when None)."""
    loc = user_location()
    x = _t(x, loc)
    axes = range(x.type.rank) if axis is None else (
        [axis] if isinstance(axis, (int, np.integer)) else list(axis))
    for a in [_axis(a, x.type.rank, loc) for a in axes]:
        n = _known(x, a, "flip", loc)
        front = _move_to_front(x, a, loc)
        x = _move_back(front[np.arange(n - 1, -1, -1)], a, loc)
    return x


@traceable
def pad(x: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> Any:
    """np.pad with a constant (pad_width: an int, a (before, after) pair, or one pair per axis)."""
    loc = user_location()
    x = _t(x, loc)
    if mode != "constant":
        raise GirTraceError(f"pad: only mode='constant' is supported, not {mode!r}", loc)
    if not x.type.is_static:
        raise GirTraceError(f"pad of {x.type}: every dim must be known", loc)
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.type.rank, 2)).tolist()
    for a, (before, after) in enumerate(widths):
        if before < 0 or after < 0:
            raise GirTraceError(f"pad: negative width {(before, after)}", loc)
        if before == after == 0:
            continue
        _known(x, a, "pad", loc)
        parts = []
        for w in (before, after):
            dims = list(x.type.shape)
            dims[a] = w
            parts.append(full(tuple(dims), constant_values, x.dtype) if w else None)
        x = concatenate([p for p in (parts[0], x, parts[1]) if p is not None], axis=a)
    return x


@traceable
def tile(x: Any, reps: Any) -> Any:
    """np.tile: x repeated reps times along each axis (as a whole)."""
    loc = user_location()
    x = _t(x, loc)
    reps = _shape_of(reps, "tile", loc)
    if len(reps) > x.type.rank:
        x = _reshape(x, (1,) * (len(reps) - x.type.rank) + _dims(x), loc)
    reps = (1,) * (x.type.rank - len(reps)) + reps
    for a, r in enumerate(reps):
        if r != 1:
            x = concatenate([x] * int(r), axis=a)
    return x


@traceable
def repeat(x: Any, repeats: int, axis: Any = None) -> Any:
    """np.repeat with an int count: each element repeated along axis (x flattened when None)."""
    loc = user_location()
    x = _t(x, loc)
    if not isinstance(repeats, (int, np.integer)) or repeats < 0:
        raise GirTraceError("repeat: repeats must be a non-negative int (per-element counts are not supported)",
                            loc)
    if axis is None:
        x, axis = _reshape(x, (-1,), loc), 0
    a = _axis(axis, x.type.rank, loc)
    dims = list(_dims(x))
    stacked = concatenate([expand_dims(x, a + 1)] * int(repeats), axis=a + 1)
    dims[a] = -1 if dims[a] == -1 else dims[a] * int(repeats)
    return _reshape(stacked, dims, loc)


# -- reductions ---------------------------------------------------------------------------------


@traceable
def var(x: Any, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Any:
    """Variance: mean((x - mean(x)) ** 2) (divided by n - ddof)."""
    loc = user_location()
    x = _t(x, loc)
    if x.type.dtype not in FLOAT_DTYPES:
        x = astype(x, "f32")
    centred = x - reduce_mean(x, axis=axis, keepdims=True)
    out = reduce_mean(centred * centred, axis=axis, keepdims=keepdims)
    if ddof:
        axes = range(x.type.rank) if axis is None else [axis] if isinstance(axis, int) else axis
        n = int(np.prod([_known(x, _axis(a, x.type.rank, loc), "var(ddof=...)", loc) for a in axes]))
        out = out * (n / (n - ddof))
    return out


@traceable
def std(x: Any, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> Any:
    """Standard deviation: sqrt(var(x))."""
    return sqrt(var(x, axis=axis, ddof=ddof, keepdims=keepdims))


@traceable
def cumsum(x: Any, axis: Any = None) -> Any:
    """Running sums along axis (x flattened when None): x times a triangular matrix of ones
    (one GEMM; its gradient is the reversed running sum)."""
    loc = user_location()
    x = _t(x, loc)
    if axis is None:
        x, axis = _reshape(x, (-1,), loc), 0
    a = _axis(axis, x.type.rank, loc)
    n = _known(x, a, "cumsum", loc)
    last = x.type.rank - 1
    moved = x if a == last else _transpose(x, [i for i in range(x.type.rank) if i != a] + [a], loc)
    tri = np.triu(np.ones((n, n), dtype=np.dtype(_SHORT[moved.type.dtype])))
    out = matmul(moved, tri) if moved.type.rank > 1 else _reshape(matmul(_reshape(moved, (1, n), loc), tri), (n,),
                                                                     loc)
    if a == last:
        return out
    perm = list(range(last))
    perm.insert(a, last)
    return _transpose(out, perm, loc)


@traceable
def prod(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Product over axis (all axes when None): halves multiplied until one is left (a product
    of differentiable multiplications, so zeros get their gradient right)."""
    loc = user_location()
    x = _t(x, loc)
    if axis is None:
        out = _prod_front(_reshape(x, (-1,), loc), loc)
        return _reshape(out, (1,) * x.type.rank, loc) if keepdims else out
    axes = sorted({_axis(a, x.type.rank, loc) for a in ([axis] if isinstance(axis, (int, np.integer)) else axis)})
    out = x
    for a in reversed(axes):  # the last first, so the earlier axes keep their positions
        out = _prod_front(_move_to_front(out, a, loc), loc)
    return expand_dims(out, tuple(axes)) if keepdims else out


def _prod_front(x: Tracer, loc: Location) -> Tracer:
    """The product over the leading axis."""
    n = _known(x, 0, "prod", loc)
    if n == 0:
        return full(x.type.shape[1:], 1, x.dtype)
    while n > 1:
        half = n // 2
        low, high = x[:half], x[half:2 * half]
        rest = x[2 * half:] if n % 2 else None
        x = low * high
        if rest is not None:
            x = concatenate([x, rest], axis=0)
        n = half + n % 2
    return _reshape(x, _dims(x)[1:], loc)


def _arg_extreme(x: Any, axis: Any, keepdims: bool, biggest: bool, loc: Location) -> Any:
    x = _t(x, loc)
    if axis is None:
        x, axis = _reshape(x, (-1,), loc), 0
    a = _axis(axis, x.type.rank, loc)
    n = _known(x, a, "argmax" if biggest else "argmin", loc)
    extreme = (reduce_max if biggest else reduce_min)(x, axis=a, keepdims=True)
    hit = (x == extreme) | (x != x)  # the first nan wins, as in NumPy
    shape = [1] * x.type.rank
    shape[a] = n
    ids = np.arange(n, dtype=np.int32).reshape(shape)
    return reduce_min(where(hit, ids, n), axis=a, keepdims=keepdims)


@traceable
def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first maximum along axis (of the flattened x when None), as int32."""
    return _arg_extreme(x, axis, keepdims, True, user_location())


@traceable
def argmin(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The index of the first minimum along axis (of the flattened x when None), as int32."""
    return _arg_extreme(x, axis, keepdims, False, user_location())


@traceable
def take_along_axis(arr: Any, indices: Any, axis: int) -> Any:
    """np.take_along_axis: out[..., j, ...] = arr[..., indices[..., j, ...], ...] along axis;
    one gather of the flattened arr (negative indices count from the end)."""
    loc = user_location()
    arr, indices = _t(arr, loc), _t(indices, loc)
    if indices.type.dtype not in INT_DTYPES:
        raise GirTraceError(f"take_along_axis needs integer indices, got {indices.type}", loc)
    if indices.type.rank != arr.type.rank:
        raise GirTraceError(f"take_along_axis: indices {indices.type} and arr {arr.type} differ in rank", loc)
    a = _axis(axis, arr.type.rank, loc)
    if not arr.type.is_static or not indices.type.is_static:
        raise GirTraceError(f"take_along_axis on {arr.type} with {indices.type}: every dim must be known", loc)
    shape = list(np.broadcast_shapes(tuple(d for i, d in enumerate(arr.type.shape) if i != a),
                                     tuple(d for i, d in enumerate(indices.type.shape) if i != a)))
    shape.insert(a, indices.type.shape[a])
    strides = np.cumprod((list(arr.type.shape[1:]) + [1])[::-1])[::-1]
    n = arr.type.shape[a]
    ids = astype(indices, "i64")
    flat = where(ids < 0, ids + n, ids) * int(strides[a])
    for d in range(arr.type.rank):
        if d != a:
            coord = np.arange(shape[d], dtype=np.int64).reshape([shape[d] if i == d else 1 for i in range(len(shape))])
            flat = flat + coord * int(strides[d])
    flat = flat + np.zeros(shape, dtype=np.int64)  # broadcast to the result's shape
    return _reshape(arr, (-1,), loc)[flat]


# -- einsum -------------------------------------------------------------------------------------


@traceable
def einsum(subscripts: str, *operands: Any) -> Any:
    """np.einsum with one or two operands and explicit or implicit output ('ij,jk->ik',
    'bij,bjk->bik', 'i,i->', 'ij->ji', 'ij->j', 'bi,bj->bij'): operand-only indices are summed
    first, then the rest is one batched matmul (batch, free, contracted), reshaped and
    transposed into the output's order. No '...' and no index repeated within one operand."""
    loc = user_location()
    spec = subscripts.replace(" ", "")
    if "..." in spec:
        raise GirTraceError("einsum: '...' is not supported; name every axis", loc)
    ins, _, out = spec.partition("->")
    terms = ins.split(",")
    if len(terms) != len(operands) or not 1 <= len(terms) <= 2:
        raise GirTraceError(f"einsum takes one or two operands matching {subscripts!r}, got {len(operands)}", loc)
    xs = [_t(x, loc) for x in operands]
    for term, x in zip(terms, xs):
        if len(set(term)) != len(term) or not all(c in string.ascii_letters for c in term):
            raise GirTraceError(f"einsum: {term!r} repeats an index or has a non-letter (diagonals are not "
                                "supported)", loc)
        if len(term) != x.type.rank:
            raise GirTraceError(f"einsum: {term!r} names {len(term)} axes of {x.type}", loc)
    if "->" not in spec:
        counts = {c: ins.count(c) for c in ins if c != ","}
        out = "".join(sorted(c for c, k in counts.items() if k == 1))
    # indices in one operand only and not in the output: summed away first
    for i, term in enumerate(terms):
        others = "".join(terms[:i] + terms[i + 1:]) + out
        gone = [k for k, c in enumerate(term) if c not in others]
        if gone:
            xs[i] = reduce_sum(xs[i], axis=tuple(gone))
            terms[i] = "".join(c for c in term if c in others)
    if len(xs) == 1:
        return _transpose(xs[0], [terms[0].index(c) for c in out], loc) if terms[0] != out else xs[0]
    return _einsum2(terms, xs, out, loc)


def _einsum2(terms: list[str], xs: list[Tracer], out: str, loc: Location) -> Tracer:
    (ta, tb), (a, b) = terms, xs
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    size = {c: d for term, x in zip(terms, xs) for c, d in zip(term, x.type.shape)}
    if any(size[c] is None for c in free_a + free_b + contract):
        raise GirTraceError("einsum: only batch indices may be `?`", loc)

    def arranged(x: Tracer, term: str, order: list[str], groups: list[list[str]]) -> Tracer:
        perm = [term.index(c) for c in order]
        x = _transpose(x, perm, loc) if perm != list(range(len(perm))) else x
        dims = [-1 if len(g) == 1 and size[g[0]] is None else int(np.prod([cast(int, size[c]) for c in g]))
                for g in groups]
        return _reshape(x, [*dims], loc)

    nb = [c for c in batch]
    a3 = arranged(a, ta, nb + free_a + contract, [[c] for c in nb] + [free_a, contract])
    b3 = arranged(b, tb, nb + contract + free_b, [[c] for c in nb] + [contract, free_b])
    product = matmul(a3, b3)
    dims = [-1 if size[c] is None else size[c] for c in nb + free_a + free_b]
    result = _reshape(product, dims, loc)
    order = nb + free_a + free_b
    perm = [order.index(c) for c in out]
    return _transpose(result, perm, loc) if perm != list(range(len(perm))) else result


__all__ = ["arange", "argmax", "argmin", "clip", "cos", "cumsum", "einsum", "expand_dims", "expm1", "eye", "flip",
           "full", "isfinite", "isnan", "log1p", "log_softmax", "one_hot", "pad", "prod", "repeat", "sign", "sin",
           "softmax", "split", "square", "squeeze", "std", "stop_gradient", "take_along_axis", "tile", "var"]
