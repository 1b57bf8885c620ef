"""NumPy's spelling on traced values: operators and methods of `Tracer`, and the functions that
`gir` exports (`gir.tanh`, `gir.sum`, `gir.where`, ...). Each emits the registry's op (ops.py
says what it computes and how its type follows); nothing here restates an op's semantics
except where NumPy's surface differs from the op's (1-D `@`, integer indexing, `.T` of a
vector, `logsumexp`, composed from existing ops).

Outside a trace, the functions run eagerly on NumPy arrays (driver/pyjit.py installs the runner:
the same ops, run by the interpreter).
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import Location
from ...ir.core import Value
from ...ir.ops import ONE_ARGUMENT_ALIASES, REGISTRY
from ...ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType
from .. import EAGER_LOADERS
from .tracer import (
    GirTraceAttributeError,
    GirTraceError,
    Tracer,
    current_frame,
    dtype_of,
    emit1,
    hides_gir_frames,
    is_weak,
    result_dtype,
    to_value,
    user_location,
    values_of,
)

EAGER: list[Callable[..., Any]] = []
"""The runner of a gir function called outside a trace on arrays (set by driver/pyjit.py)."""


def traceable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs fn traced inside a trace; outside one, eagerly on arrays (through EAGER)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_frame() is not None or not (EAGER or eager_installed()):
            return fn(*args, **kwargs)
        return _eager(fn, args, kwargs)
    return wrapper


@hides_gir_frames
def _eager(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    return EAGER[0](fn, args, kwargs)


def eager_installed() -> bool:
    """Installs EAGER's runner if it is not yet: `import gir` loads driver/pyjit.py (which sets it) only
    when a name of this frontend is first used, and `import gir.frontend.python` alone not at all;
    the loader gir/__init__.py registered (frontend/__init__.py EAGER_LOADERS) loads it here."""
    if not EAGER:
        for load in EAGER_LOADERS:
            load()
    return bool(EAGER)


def _operand_like(x: Any) -> bool:
    return isinstance(x, (Tracer, np.ndarray)) or is_weak(x)


def _binary(name: str, a: Any, b: Any, loc: Location) -> Any:
    if a is None or b is None:  # most often a `?` dim read from x.shape: say so, not a bare TypeError
        raise GirTraceError(f"'{name}' with None: a `?` dim of .shape is None while tracing and is not a number; "
                            "use gir.mean, or trace with concrete sizes (gir.jit specialises on the arguments)", loc)
    if not (_operand_like(a) and _operand_like(b)):
        return NotImplemented
    if name == "pow":
        power = _int_power(a, b, loc)
        if power is not None:
            return power
    return _weak_if(emit1(name, _promoted(name, a, b, loc), loc=loc), a, b)


def _int_power(a: Any, b: Any, loc: Location) -> Tracer | None:
    """x ** n for an integer tensor x and a Python int n >= 0 (JAX's integer_pow): products by
    squaring, since the `pow` op takes floats; None where that is not the case."""
    if not (isinstance(a, Tracer) and a.type.dtype in INT_DTYPES and isinstance(b, (int, np.integer))
            and not isinstance(b, bool)):
        return None
    if b < 0:
        raise GirTraceError(f"an integer tensor to the negative power {b}: convert with .astype(float) first", loc)
    result: Tracer | None = None
    base, n = a, int(b)
    while n:
        if n & 1:
            result = base if result is None else emit1("mul", [result.value, base.value], loc=loc)
        n >>= 1
        if n:
            base = emit1("mul", [base.value, base.value], loc=loc)
    return result if result is not None else ones_like(a)


def _promoted(name: str, a: Any, b: Any, loc: Location) -> list[Any]:
    """The operands of binary op `name`, promoted; `/` of integers or bools is true division
    (NumPy, JAX): both become the default float, f32."""
    dtype = result_dtype([a, b])
    if dtype is not None and dtype not in FLOAT_DTYPES and (name == "div" or _floats_only(name, dtype)):
        dtype = "f32"  # `/` is true division; an op on floats only (pow) takes ints as floats, as JAX
    return values_of([a, b], loc, dtype)


def _weak_unary(out: Tracer, x: Any) -> Tracer:
    out.weak = isinstance(x, Tracer) and x.weak
    return out


def _weak_if(out: Tracer, a: Any, b: Any) -> Tracer:
    """Arithmetic on weak scalars only (`lr * 2.0`, `lr / n`) is weak too, as in JAX, so it still
    meets f64 tensors as f64."""
    operands = (a, b)
    if any(isinstance(v, Tracer) and v.weak for v in operands) and \
            all((isinstance(v, Tracer) and v.weak) or (is_weak(v) and not isinstance(v, np.generic))
                for v in operands):
        out.weak = out.type.dtype not in ("i1",)
    return out


def _tracer(x: Any, loc: Location) -> Tracer:
    """x as a traced value of the current function (an array or a scalar becomes a constant)."""
    if isinstance(x, Tracer):
        return x
    frame = current_frame()
    if frame is None:
        raise GirTraceError("expected a traced value", loc)
    return Tracer(to_value(x, loc=loc), frame, frame.block)


# -- elementwise --------------------------------------------------------------------------------


def _unary_fn(name: str, doc: str) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        loc = user_location()
        return _weak_unary(emit1(name, [float_operand(name, to_value(x, loc=loc), loc)], loc=loc), x)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc
    return traceable(f)


def _floats_only(name: str, dtype: str) -> bool:
    """Op `name` has no meaning on `dtype` (the registry's scalar semantics say which classes
    it takes), so an integer or bool operand is computed as a float."""
    semantics = REGISTRY[name].scalar
    return semantics is not None and semantics.expr(dtype) is None


def float_operand(name: str, v: Value, loc: Location) -> Value:
    """v as the operand of op `name`: integers and bools become float32 where the op takes
    floats only (`gir.exp(counts)`, as JAX's jnp.exp of an int32 is a float32)."""
    if not _floats_only(name, v.tensor_type.dtype):
        return v
    return emit1("cast", [v], declared=[v.tensor_type.with_dtype("f32")], loc=loc).value


tanh = _unary_fn("tanh", "Hyperbolic tangent, elementwise.")
sigmoid = _unary_fn("sigmoid", "1 / (1 + exp(-x)), elementwise.")
exp = _unary_fn("exp", "e ** x, elementwise.")
log = _unary_fn("log", "Natural logarithm, elementwise.")
relu = _unary_fn("relu", "max(x, 0), elementwise.")
sqrt = _unary_fn("sqrt", "Square root, elementwise.")
abs = _unary_fn("abs", "|x|, elementwise.")  # noqa: A001 - NumPy's name
negative = _unary_fn("neg", "-x, elementwise.")


def _binary_fn(name: str, public: str, doc: str) -> Callable[[Any, Any], Any]:
    def f(a: Any, b: Any) -> Any:
        loc = user_location()
        return _weak_if(emit1(name, _promoted(name, a, b, loc), loc=loc), a, b)
    f.__name__ = f.__qualname__ = public
    f.__doc__ = doc
    return traceable(f)


maximum = _binary_fn("max", "maximum", "Elementwise maximum (NumPy broadcasting).")
minimum = _binary_fn("min", "minimum", "Elementwise minimum (NumPy broadcasting).")
add = _binary_fn("add", "add", "a + b")
subtract = _binary_fn("sub", "subtract", "a - b")
multiply = _binary_fn("mul", "multiply", "a * b")
divide = _binary_fn("div", "divide", "a / b")
power = _binary_fn("pow", "power", "a ** b")


@traceable
def where(cond: Any, a: Any, b: Any) -> Any:
    """a where cond else b, elementwise; cond is a comparison's (bool) result."""
    loc = user_location()
    c = to_value(cond, "i1", loc=loc)
    if c.tensor_type.dtype != "i1":
        raise GirTraceError(f"gir.where needs a bool condition (a comparison such as x > 0), got {c.type}", loc)
    va, vb = values_of([a, b], loc)
    return emit1("select", [c, va, vb], loc=loc)


@traceable
def matmul(a: Any, b: Any) -> Any:
    """a @ b: 2-D and batched as NumPy; a 1-D operand is a row (left) or a column (right)."""
    return _matmul(a, b, user_location())


def _matmul(a: Any, b: Any, loc: Location) -> Any:
    if not (_operand_like(a) and _operand_like(b)):
        return NotImplemented
    va, vb = values_of([a, b], loc)
    ta, tb = va.tensor_type, vb.tensor_type
    if ta.rank == 0 or tb.rank == 0:
        raise GirTraceError(f"'@' needs operands of rank >= 1, got {ta} @ {tb}", loc)
    frame = current_frame()
    assert frame is not None
    x, y = Tracer(va, frame, frame.block), Tracer(vb, frame, frame.block)
    if ta.rank == 1:
        x = _reshape(x, (1, _dim(ta.shape[0])), loc)
    if tb.rank == 1:
        y = _reshape(y, (_dim(tb.shape[0]), 1), loc)
    out = emit1("matmul", [x.value, y.value], loc=loc)
    if ta.rank == 1 or tb.rank == 1:
        shape = list(out.type.shape)
        if tb.rank == 1:
            del shape[-1]
        if ta.rank == 1:
            del shape[-2 if tb.rank != 1 else -1]
        out = _reshape(out, tuple(_dim(d) for d in shape), loc)
    return out


def _dim(d: int | None) -> int:
    return -1 if d is None else d


# -- reductions ---------------------------------------------------------------------------------


def _axes(axis: Any, loc: Location) -> list[int] | None:
    if axis is None:
        return None
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        return [int(axis)]
    if isinstance(axis, (tuple, list)) and all(isinstance(a, (int, np.integer)) for a in axis):
        return [int(a) for a in axis]
    raise GirTraceError(f"axis must be None, an int or a tuple of ints, got {axis!r}", loc)


def _reduce(kind: str, x: Any, axis: Any, keepdims: bool, loc: Location) -> Tracer:
    name = ONE_ARGUMENT_ALIASES.get(kind, kind)
    v = to_value(x, loc=loc)
    # NumPy and JAX: the sum of bools counts them (int32), the mean of integers is a float
    dtype = v.tensor_type.dtype
    cast_to = "i32" if kind == "sum" and dtype == "i1" else "f32" if kind == "mean" and dtype not in FLOAT_DTYPES \
        else None
    if cast_to is not None:
        v = emit1("cast", [v], declared=[v.tensor_type.with_dtype(cast_to)], loc=loc).value
    return emit1(name, [v], attrs={"axes": _axes(axis, loc), "keepdims": bool(keepdims)}, loc=loc)


def _reduction_fn(kind: str, doc: str) -> Callable[..., Any]:
    def f(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return _reduce(kind, x, axis, keepdims, user_location())
    f.__name__ = f.__qualname__ = kind
    f.__doc__ = doc
    return traceable(f)


sum = _reduction_fn("sum", "Sum over axis (all axes when None).")  # noqa: A001
mean = _reduction_fn("mean", "Mean over axis (all axes when None).")
max = _reduction_fn("max", "Maximum over axis (all axes when None); gir.maximum is elementwise.")  # noqa: A001
min = _reduction_fn("min", "Minimum over axis (all axes when None); gir.minimum is elementwise.")  # noqa: A001


@traceable
def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x))) over axis, computed stably (the `logsumexp` op: m + log(sum(exp(x - m))),
    m the maximum). Its gradient is softmax(x)."""
    return _reduce("logsumexp", x, axis, keepdims, user_location())


# -- layout -------------------------------------------------------------------------------------


def _reshape(x: Any, shape: Sequence[Any], loc: Location) -> Tracer:
    dims = []
    for d in shape:
        if d is None:
            d = -1  # a `?` dim read from x.shape: the one inferred dim
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise GirTraceError(f"reshape needs integer dims, got {d!r}", loc)
        dims.append(int(d))
    v = to_value(x, loc=loc)
    if dims.count(-1) > 1:
        units = _unit_axes_only(v.tensor_type.shape, dims)
        if units is not None:
            return _reshape_units(v, *units, loc)
    return emit1("reshape", [v], attrs={"shape": dims}, loc=loc)


def _unit_axes_only(shape: Sequence[Any], dims: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """Where a reshape with several `?` dims (`mask[..., None]` on tensor<?x?xi1>) only adds or
    drops axes of size 1: (the source's unit axes dropped, the target's unit axes added), else
    None. `reshape` takes one -1, so these become `index` and `stack` ops instead."""
    src = [i for i, d in enumerate(shape) if d != 1]
    dst = [i for i, d in enumerate(dims) if d != 1]
    if [(-1 if shape[i] is None else shape[i]) for i in src] != [dims[i] for i in dst]:
        return None
    return [i for i, d in enumerate(shape) if d == 1], [i for i, d in enumerate(dims) if d == 1]


def _reshape_units(v: Value, dropped: list[int], added: list[int], loc: Location) -> Tracer:
    frame = current_frame()
    assert frame is not None
    x = Tracer(v, frame, frame.block)
    for axis in reversed(dropped):  # x[..., 0, ...]: an index at 0 on that axis drops it
        x = _index(x, axis, 0, loc)
    for axis in added:  # a stack of one adds an axis of size 1
        x = emit1("stack", [x.value], attrs={"axis": axis}, loc=loc)
    return x


@traceable
def reshape(x: Any, shape: Any) -> Any:
    """Same elements, new shape; one dim may be -1."""
    loc = user_location()
    return _reshape(x, (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape), loc)


def _transpose(x: Any, axes: Any, loc: Location) -> Tracer:
    v = to_value(x, loc=loc)
    perm = None if axes is None else [int(a) % builtins.max(v.tensor_type.rank, 1) for a in axes]
    frame = current_frame()
    assert frame is not None
    if v.tensor_type.rank < 2 and perm is None:
        return Tracer(v, frame, frame.block)  # NumPy: .T of a vector is the vector
    return emit1("transpose", [v], attrs={"perm": perm}, loc=loc)


@traceable
def transpose(x: Any, axes: Any = None) -> Any:
    """Permutes axes (reverses them when axes is None)."""
    return _transpose(x, axes, user_location())


@traceable
def concatenate(arrays: Sequence[Any], axis: int = 0) -> Any:
    """Joins tensors along an existing axis."""
    loc = user_location()
    return emit1("concat", values_of(list(arrays), loc), attrs={"axis": int(axis)}, loc=loc)


@traceable
def stack(arrays: Sequence[Any], axis: int = 0) -> Any:
    """Joins tensors of one shape along a new axis."""
    loc = user_location()
    return emit1("stack", values_of(list(arrays), loc), attrs={"axis": int(axis)}, loc=loc)


def _static_shape(shape: Any, loc: Location) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(d is None for d in dims):
        raise GirTraceError(f"the shape {shape!r} has a `?` dim (None: unknown while tracing), and zeros/ones need "
                            "sizes; make the value from a tensor of that shape (gir.zeros_like(x)), pass it as an "
                            "argument, or trace with concrete sizes (gir.jit specialises on the arguments)", loc)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise GirTraceError(f"the shape must be non-negative integers, got {shape!r}", loc)
    return tuple(int(d) for d in dims)


def _filled(kind: str, shape: Any, dtype: Any, loc: Location) -> Tracer:
    t = TensorType(_static_shape(shape, loc), dtype_of(dtype, loc))
    return emit1(kind, [], declared=[t], loc=loc)


def zeros(shape: Any, dtype: Any = "f32") -> Any:
    """A tensor of zeros of a static shape."""
    return _filled("zeros", shape, dtype, user_location())


def ones(shape: Any, dtype: Any = "f32") -> Any:
    """A tensor of ones of a static shape."""
    return _filled("ones", shape, dtype, user_location())


def _like(kind: str, x: Any, dtype: Any) -> Any:
    loc = user_location(2)
    t = to_value(x, loc=loc).tensor_type
    dt = dtype_of(dtype, loc) if dtype is not None else t.dtype
    if t.is_static:
        return _filled(kind, t.shape, dt, loc)
    # A `?` dim: no op makes a tensor of a run-time shape yet, so select(x == x, 0, 0) takes
    # x's shape (both branches are the value, so a NaN in x does not matter).
    xv = to_value(x, loc=loc)
    same = emit1("eq", [xv, xv], loc=loc)
    fill = 0 if kind == "zeros" else 1
    return emit1("select", [same.value, to_value(fill, dt, loc), to_value(fill, dt, loc)], loc=loc)


def zeros_like(x: Any, dtype: Any = None) -> Any:
    """Zeros of x's shape (and dtype unless given)."""
    return _like("zeros", x, dtype)


def ones_like(x: Any, dtype: Any = None) -> Any:
    """Ones of x's shape (and dtype unless given)."""
    return _like("ones", x, dtype)


def astype(x: Any, dtype: Any) -> Any:
    """x converted to dtype."""
    loc = user_location()
    v = to_value(x, loc=loc)
    return emit1("cast", [v], declared=[v.tensor_type.with_dtype(dtype_of(dtype, loc))], loc=loc)


# -- indexing -----------------------------------------------------------------------------------


def _getitem(x: Tracer, key: Any, loc: Location) -> Tracer:
    """x[i], x[a:b, c:d], x[..., i], x[t] (t a traced integer): a slice op for the ranges (and
    static integers, as ranges of one then reshaped away: differentiable), an index op for a
    traced integer or an integer on a `?` dim. `None` (np.newaxis) adds an axis of size 1."""
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(_constant_index(k, loc) for k in key)
    if any(k is None for k in key):
        return _getitem_newaxis(x, key, loc)
    t = x.type
    key = _expand_key(key if isinstance(key, tuple) else (key,), t.rank, loc)
    bounds: list[tuple[int, int, int] | None] = []
    drop: list[int] = []
    dynamic: list[tuple[int, Any]] = []
    for axis, (k, d) in enumerate(zip(key, t.shape)):
        if isinstance(k, slice):
            if k == slice(None):
                bounds.append(None)
                continue
            if d is None:
                raise GirTraceError(f"slicing axis {axis} of {t}: its size is `?` (unknown until gir.jit "
                                    "specialises); slice after specialising, or trace with a concrete size", loc)
            if k.step is not None and not isinstance(k.step, Tracer) and int(k.step) < 1:
                raise GirTraceError(f"slice step {k.step}: only positive steps are supported (gir.numpy.flip "
                                    "reverses an axis)", loc)
            start, stop, step = k.indices(d)
            bounds.append((start, builtins.max(start, stop), step))
        elif isinstance(k, Tracer) or d is None:
            bounds.append(None)
            dynamic.append((axis, k))
        else:
            i = int(k)
            if not -d <= i < d:
                raise GirTraceError(f"index {i} is out of range for axis {axis} of size {d}", loc)
            bounds.append((i % d, i % d + 1, 1))
            drop.append(axis)
    gathers = [axis for axis, k in dynamic if isinstance(k, Tracer) and k.type.rank]
    if gathers and (gathers != [0] or len(dynamic) > 1):
        raise GirTraceError("an integer tensor index (a gather, x[ids]) works on the leading axis, as the only "
                            "traced index", loc)
    out = x
    if any(b is not None for b in bounds):
        # an axis kept whole has the limit `?` (None) where its size is `?`: the slice op takes it whole
        full = [b or (0, d, 1) for b, d in zip(bounds, t.shape)]
        steps = [s for _, _, s in full]
        out = emit1("slice", [out.value], attrs={"starts": [s for s, _, _ in full], "limits": [e for _, e, _ in full],
                                                 "steps": None if all(s == 1 for s in steps) else steps}, loc=loc)
    if drop:
        out = _reshape(out, tuple(d for i, d in enumerate(out.type.shape) if i not in drop), loc)
    for axis, k in reversed(dynamic):
        axis -= builtins.sum(1 for a in drop if a < axis)
        out = _index(out, axis, k, loc)
    return out


def _constant_index(k: Any, loc: Location) -> Any:
    """An integer NumPy array or list used as an index (`emb[ids]` with ids a constant): a traced
    constant, so it gathers as a traced integer tensor does."""
    if isinstance(k, list) and k and all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in k):
        k = np.asarray(k, dtype=np.int64)
    if isinstance(k, np.ndarray) and k.dtype.kind in "iu" and k.ndim:
        frame = current_frame()
        if frame is None:
            raise GirTraceError("expected a traced value", loc)
        return Tracer(to_value(k.astype(np.int64) if k.dtype.kind == "u" else k, loc=loc), frame, frame.block)
    return k


def _getitem_newaxis(x: Tracer, key: tuple[Any, ...], loc: Location) -> Tracer:
    """x[key] with `None`s: indexed without them, then reshaped with a 1 where each `None` was."""
    if any(isinstance(k, Tracer) for k in key):
        raise GirTraceError("None (np.newaxis) together with a traced index is not supported; index first, then "
                            "reshape", loc)
    real = [k for k in key if k is not None]
    if Ellipsis in real:
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (x.type.rank - len(real) + 1) + key[i + 1:]
    out = _getitem(x, tuple(k for k in key if k is not None), loc)
    dims: list[int | None] = []
    j = 0
    for k in key:
        if k is None:
            dims.append(1)
        elif isinstance(k, slice):
            dims.append(out.type.shape[j])
            j += 1
    dims.extend(out.type.shape[j:])
    return _reshape(out, tuple(-1 if d is None else d for d in dims), loc)


def _expand_key(key: tuple[Any, ...], rank: int, loc: Location) -> tuple[Any, ...]:
    for k in key:
        ok = (k is Ellipsis or isinstance(k, (slice, Tracer))
              or (isinstance(k, (int, np.integer)) and not isinstance(k, bool)))
        if not ok:
            raise GirTraceError(f"unsupported index {k!r}: use integers, slices, ... or a traced integer", loc)
        if isinstance(k, slice) and not all(isinstance(s, (int, np.integer, type(None))) for s in
                                            (k.start, k.stop, k.step)):
            raise GirTraceError("slice bounds must be Python integers (a traced bound has no static size)", loc)
    if builtins.sum(k is Ellipsis for k in key) > 1:
        raise GirTraceError("an index can have only one ...", loc)
    if Ellipsis in [k for k in key if not isinstance(k, Tracer)]:
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (rank - len(key) + 1) + key[i + 1:]
    if len(key) > rank:
        raise GirTraceError(f"too many indices ({len(key)}) for a tensor of rank {rank}", loc)
    return key + (slice(None),) * (rank - len(key))


def _index(x: Tracer, axis: int, k: Any, loc: Location) -> Tracer:
    """x indexed at k on axis: the axis is moved to the front first (index works on axis 0)."""
    if axis:
        perm = [axis] + [a for a in range(x.type.rank) if a != axis]
        x = emit1("transpose", [x.value], attrs={"perm": perm}, loc=loc)
    if isinstance(k, Tracer):
        if k.type.dtype not in INT_DTYPES:
            raise GirTraceError(f"a traced index must be an integer scalar or tensor, got {k.type}", loc)
        kv = to_value(k, loc=loc)
    else:
        if int(k) < 0:
            raise GirTraceError(f"a negative index on a `?` dim ({x.type}) has no static position", loc)
        kv = to_value(int(k), "i64", loc)
    return emit1("index", [x.value, kv], loc=loc)


# -- the Tracer's operators and methods ---------------------------------------------------------


def _traced_bool(self: Tracer) -> bool:
    raise GirTraceError("a traced value has no Python truth value (an `if`, `while`, `and`, `or` or `bool()` on "
                        "it): choose per element with gir.where(cond, a, b), loop with gir.scan", user_location())


def _concrete(what: str) -> Callable[..., Any]:
    def f(self: Tracer, *args: Any, **kwargs: Any) -> Any:  # NumPy calls __array__(dtype, copy=...)
        raise GirTraceError(f"{what} of a traced value: its value is not known while tracing (use it as a tensor; "
                            "loop with gir.scan, choose with gir.where)", user_location())
    return f


def _iter(self: Tracer) -> Any:
    raise GirTraceError("iterating over a traced value: loop over its leading axis with gir.scan(step, init, xs)",
                        user_location())


_UFUNCS: dict[Any, Callable[..., Any]] = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.divide: divide, np.true_divide: divide,
    np.power: power, np.maximum: maximum, np.minimum: minimum, np.negative: negative, np.tanh: tanh,
    np.exp: exp, np.log: log, np.sqrt: sqrt, np.absolute: abs, np.matmul: matmul,
    np.square: lambda x: multiply(x, x),
}


_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.where: where, np.dot: matmul, np.matmul: matmul, np.sum: sum, np.mean: mean, np.max: max, np.amax: max,
    np.min: min, np.amin: min, np.concatenate: concatenate, np.stack: stack, np.transpose: transpose,
    np.reshape: reshape, np.zeros_like: zeros_like, np.ones_like: ones_like,
    np.clip: lambda x, lo, hi: minimum(maximum(x, lo), hi),
}
"""NumPy functions (not ufuncs) on a traced value, through NumPy's `__array_function__`: the gir
function of the same meaning (`np.sum(x, axis=0)` is `gir.sum(x, axis=0)`)."""


def _array_function(self: Tracer, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    fn = _FUNCTIONS.get(func)
    name = getattr(func, "__name__", str(func))
    if fn is None:
        raise GirTraceError(f"NumPy's {name} cannot run on a traced value; use a gir function (docs/python.md "
                            "lists them)", user_location())
    kwargs = {k: v for k, v in kwargs.items() if not (k in ("out", "dtype", "where", "initial") and v is None)}
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        raise GirTraceError(f"np.{name} on a traced value: {e}", user_location()) from None


def _array_ufunc(self: Tracer, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    fn = _UFUNCS.get(ufunc)
    if fn is None or method != "__call__" or kwargs:
        raise GirTraceError(f"NumPy's {ufunc.__name__} cannot run on a traced value; use the gir function of that "
                            "name (gir.tanh, gir.maximum, ...)", user_location())
    return fn(*inputs)


def _reduction_method(kind: str) -> Callable[..., Any]:
    def method(self: Tracer, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> Tracer:
        # dtype and out: NumPy's order, as np.sum(x, axis=0) calls x.sum(axis=0, dtype=None, out=None)
        loc = user_location()
        if out is not None:
            raise GirTraceError(f"{kind}(out=...): traced values are not written in place; use the result", loc)
        x = self if dtype is None else astype(self, dtype)
        return _reduce(kind, x, axis, keepdims, loc)
    method.__name__ = kind
    return method


def _reshape_method(self: Tracer, *shape: Any) -> Tracer:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return _reshape(self, shape, user_location())


def _transpose_method(self: Tracer, *axes: Any) -> Tracer:
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return _transpose(self, axes or None, user_location())


def _getattr(self: Tracer, name: str) -> Any:
    raise GirTraceAttributeError(f"a traced value has no attribute {name!r}", user_location())


def _bin(name: str, reflected: bool = False) -> Callable[[Tracer, Any], Any]:
    if reflected:
        return lambda self, other: _binary(name, other, self, user_location())
    return lambda self, other: _binary(name, self, other, user_location())


def _install() -> None:
    methods: dict[str, Any] = {
        "__floordiv__": lambda self, o: _floordiv(self, o),
        "__rfloordiv__": lambda self, o: _floordiv(self, o, True),
        "__mod__": lambda self, o: _mod(self, o),
        "__rmod__": lambda self, o: _mod(self, o, True),
        "__invert__": _invert,
        "__round__": _round,
        "__trunc__": _concrete("math.trunc()"),
        "__floor__": _concrete("math.floor()"),
        "__ceil__": _concrete("math.ceil()"),
        "__rand__": _bin("and", True),
        "__ror__": _bin("or", True),
        "__matmul__": lambda self, o: _matmul(self, o, user_location()),
        "__rmatmul__": lambda self, o: _matmul(o, self, user_location()),
        "__neg__": lambda self: _weak_unary(emit1("neg", [to_value(self)], loc=user_location()), self),
        "__pos__": lambda self: self,
        "__abs__": lambda self: _weak_unary(emit1("abs", [to_value(self)], loc=user_location()), self),
        "__bool__": _traced_bool,
        "__iter__": _iter,
        "__array_ufunc__": _array_ufunc,
        "__array_function__": _array_function,
        "__getitem__": lambda self, key: _getitem(self, key, user_location()),
        "__len__": _len,
        "__getattr__": _getattr,
        "shape": property(lambda self: self.type.shape),
        "dtype": property(lambda self: DTYPES[self.type.dtype]),
        "ndim": property(lambda self: self.type.rank),
        "size": property(lambda self: self.type.num_elements()),
        "T": property(lambda self: _transpose(self, None, user_location())),
        "reshape": _reshape_method,
        "transpose": _transpose_method,
        "astype": lambda self, dtype: astype(self, dtype),
    }
    for dunder, name in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("pow", "pow")]:
        methods[f"__{dunder}__"] = _bin(name)
        methods[f"__r{dunder}__"] = _bin(name, reflected=True)
    for dunder in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or"):
        methods[f"__{dunder}__"] = _bin(dunder)
    for dunder, what in [("int", "int()"), ("float", "float()"), ("index", "using as a Python integer"),
                         ("complex", "complex()"), ("array", "np.asarray()")]:
        methods[f"__{dunder}__"] = _concrete(what)
    for kind in ("sum", "mean", "max", "min"):
        methods[kind] = _reduction_method(kind)
    for name, method in methods.items():
        setattr(Tracer, name, method)


def _integer_operands(self: Tracer, other: Any, reflected: bool, refusal: str) -> tuple[Any, ...] | None:
    """(loc, a, b, dtype) of `a op b` for // and %, which gir has on integers only (refusal: the
    message for floats, `{dtype}` filled in); None where other is no operand (NotImplemented)."""
    loc = user_location(3)
    a, b = (other, self) if reflected else (self, other)
    if not _operand_like(other):
        return None
    dtype = result_dtype([a, b])
    if dtype not in INT_DTYPES:
        raise GirTraceError(refusal.format(dtype=dtype), loc)
    return loc, a, b, dtype


def _floordiv(self: Tracer, other: Any, reflected: bool = False) -> Any:
    """a // b on integers: the `div` op, which floors on integers (as NumPy's //)."""
    found = _integer_operands(self, other, reflected, "// on {dtype}: gir has no floor for floats yet; use / "
                              "(or integers with .astype('int32'))")
    if found is None:
        return NotImplemented
    loc, a, b, dtype = found
    return _weak_if(emit1("div", values_of([a, b], loc, dtype), loc=loc), a, b)


def _mod(self: Tracer, other: Any, reflected: bool = False) -> Any:
    """a % b on integers: a - (a // b) * b, the sign of b as in Python and NumPy."""
    found = _integer_operands(self, other, reflected,
                              "% on {dtype}: gir has no floor for floats yet, so % works on integers only")
    if found is None:
        return NotImplemented
    loc, a, b, dtype = found
    va, vb = values_of([a, b], loc, dtype)
    q = emit1("div", [va, vb], loc=loc)
    return _weak_if(emit1("sub", [va, emit1("mul", [q.value, vb], loc=loc).value], loc=loc), a, b)


def _invert(self: Tracer) -> Any:
    """~x: logical not of a bool tensor (integers have no bitwise ops in gir)."""
    loc = user_location()
    if self.type.dtype != "i1":
        raise GirTraceError(f"~ on {self.type}: gir has no bitwise not; ~ works on bool tensors (comparisons)", loc)
    return emit1("eq", [to_value(self, loc=loc), to_value(False, "i1", loc)], loc=loc)


def _round(self: Tracer, ndigits: Any = None) -> Any:
    raise GirTraceError("round() of a traced value: gir has no rounding op yet", user_location())


def _len(self: Tracer) -> int:
    if self.type.rank == 0:
        raise GirTraceError("len() of a scalar", user_location())
    d = self.type.shape[0]
    if d is None:
        raise GirTraceError(f"len() of {self.type}: its leading dim is `?`", user_location())
    return d


_install()
