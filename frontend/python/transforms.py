"""`gir.trace`, `gir.scan`, `gir.grad`, `gir.value_and_grad`, `gir.spec`: Python functions to IR.

- `trace_entry(fn, args)` builds a module whose last function is fn traced on the arguments'
  shapes and dtypes (arrays, `gir.spec`s, Python scalars; any nest of dicts, lists, tuples).
  Each leaf is one named argument (`params["wx"]` -> `%params_wx`), each returned leaf one
  result; `Traced` keeps the two tree structures to rebuild Python values around a call.
- `scan(step, init, xs)` is `jax.lax.scan`: it traces `step` once into the body of a `scan` op
  (carries = init's leaves, sequences = xs's leaves, stacks = the leaves of step's second
  result). The text frontend's `for` loop becomes the same `scan` after the `ssa` pass.
- `grad(f)(*args)` traces f into a function of its own and emits `grad @f(...) wrt (...)`, as
  a `.gir` file spells it, so the autodiff pass (and scan-grad, and every other pass) sees the
  same IR as from text. Values of the caller that f closes over become extra arguments of @f.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import Location
from ...ir.core import Block, Module, Region, Value
from ...ir.ops import make_op
from ...ir.types import FLOAT_DTYPES, Dim, TensorType, dtype_name
from .numpy_api import EAGER, eager_installed, traceable
from .pytree import TreeDef, flatten, func_name, unflatten, value_name
from .tracer import (
    Frame,
    GirTraceError,
    Tracer,
    block_scope,
    current_frame,
    dtype_of,
    emit,
    finish_function,
    frame_scope,
    function_location,
    hides_gir_frames,
    is_weak,
    new_function,
    promote,
    resolve,
    to_value,
    user_location,
    weak_argument_dtype,
    wrap,
)


@dataclass(frozen=True)
class Spec:
    """An abstract argument: a shape (None for `?`) and a dtype, as `gir.spec("?x256", "f32")`."""

    shape: tuple[Dim, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"gir.spec({'x'.join('?' if d is None else str(d) for d in self.shape)!r}, {self.dtype!r})"

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)


def spec(shape: str | int | None | Sequence[int | str | None], dtype: Any = "f32") -> Spec:
    """An abstract argument for gir.trace: `spec("?x32x256", "f32")`, `spec((None, 256))`."""
    loc = user_location()
    dims: list[Any]
    if isinstance(shape, (int, np.integer)) or shape is None:
        dims = [shape]  # spec(3) is a vector of 3, spec(None) one of `?` elements, as NumPy's shape=3
    elif isinstance(shape, str):
        dims = [] if shape == "" else shape.split("x")
    elif isinstance(shape, Sequence):
        dims = list(shape)
    else:
        raise GirTraceError(f"gir.spec: the shape is a string ('?x32x256') or a sequence of ints/None, not "
                            f"{type(shape).__name__}", loc)
    out: list[Dim] = []
    for d in dims:
        if d is None or d == "?":
            out.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        elif isinstance(d, str) and d.isdigit():
            out.append(int(d))
        else:
            raise GirTraceError(f"gir.spec: bad dim {d!r} in {shape!r} (use integers and ?)", loc)
    return Spec(tuple(out), dtype_of(dtype, loc))


def leaf_type(leaf: Any, loc: Location, name: str = "") -> TensorType:
    """The type of an argument leaf: a Spec's, an array's, a Python scalar's (f32, i32, i1)."""
    try:
        return _leaf_type(leaf, loc)
    except GirTraceError as e:
        raise GirTraceError(f"argument %{name}: {e.message}" if name else e.message, e.loc) from None


def _leaf_type(leaf: Any, loc: Location) -> TensorType:
    if isinstance(leaf, Spec):
        return leaf.type
    if isinstance(leaf, Tracer):
        raise GirTraceError("a traced value is passed to gir.trace/gir.jit: call the function directly inside a "
                            "trace", loc)
    if is_weak(leaf) and not isinstance(leaf, np.generic):
        return TensorType((), weak_argument_dtype(leaf))
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        raise GirTraceError(f"an argument leaf of type {type(leaf).__name__} is neither an array, a scalar nor "
                            "a gir.spec", loc)
    try:
        return TensorType(tuple(int(d) for d in shape), dtype_name(np.dtype(dtype)))
    except (KeyError, TypeError):
        raise GirTraceError(f"unsupported dtype {dtype}; use float32, float64, int32, int64 or bool", loc) from None


def arg_names(fn: Callable[..., Any], n: int) -> list[str]:
    """Names of fn's first n positional parameters (`*args` -> args0, args1, ...)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            names.extend(f"{p.name}{i}" for i in range(n - len(names)))
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        if len(names) >= n:
            break
    return (names + [f"arg{i}" for i in range(len(names), n)])[:n]


def flatten_args(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[list[Any], list[str], list[TreeDef]]:
    """Leaves of all arguments, their value names (`params_wx`), and each argument's structure."""
    leaves: list[Any] = []
    names: list[str] = []
    trees: list[TreeDef] = []
    for name, arg in zip(arg_names(fn, len(args)), args):
        arg_leaves, paths, tree = flatten(arg, path=(name,))
        leaves += arg_leaves
        names += [value_name(p) for p in paths]
        trees.append(tree)
    return leaves, names, trees


def unflatten_args(trees: Sequence[TreeDef], leaves: Sequence[Any]) -> list[Any]:
    out, start = [], 0
    for tree in trees:
        n = tree.num_leaves
        out.append(unflatten(tree, leaves[start:start + n]))
        start += n
    return out


@dataclass
class Traced:
    """A traced entry: the module, its entry's name, and the structures around a call."""

    module: Module
    entry: str
    arg_trees: list[TreeDef]
    out_tree: TreeDef
    hidden: tuple[np.ndarray, ...] = ()
    """The values of the entry's hidden arguments, after the user's: the large NumPy arrays fn
    closes over, copied when traced (tracer.py `array_constant`); each call passes them."""


def trace_entry(fn: Callable[..., Any], args: Sequence[Any], hide_constants: bool = True) -> Traced:
    """fn traced on args; hide_constants: large closed-over NumPy arrays become hidden arguments
    after the user's (`Traced.hidden`, tracer.py `array_constant`), else printed constants."""
    if not callable(fn):
        raise GirTraceError(f"gir.trace takes a Python function, not {type(fn).__name__}", user_location())
    floc = function_location(fn)
    _check_arity(fn, args)
    leaves, names, trees = flatten_args(fn, args)
    types = [leaf_type(leaf, floc, name) for leaf, name in zip(leaves, names)]
    module = Module(filename=floc.file)
    function = new_function(func_name(getattr(fn, "__name__", "f")), module, types, names, floc)
    frame = Frame(function, module, None)
    frame.hide_constants = hide_constants
    with frame_scope(frame):
        tracers = [Tracer(a, frame, function.body, weak=is_weak(leaf) and not isinstance(leaf, np.generic))
                   for a, leaf in zip(function.args, leaves)]
        out = fn(*unflatten_args(trees, tracers))
        out_leaves, _, out_tree = flatten(out)
        finish_function(function, module, [to_value(leaf, loc=floc) for leaf in out_leaves], floc)
    return Traced(module, function.name, trees, out_tree, frame.hidden_arrays)


def _check_arity(fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """Calling fn with these arguments is possible (else a GirError, not the TypeError of the call)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError as e:
        raise GirTraceError(f"{getattr(fn, '__name__', 'the function')} cannot take {len(args)} argument(s): {e}",
                            user_location()) from None


@hides_gir_frames
def trace(fn: Callable[..., Any], *example_args: Any) -> Module:
    """fn traced on the example arguments' shapes and dtypes (arrays, gir.spec(...), scalars,
    nested in dicts/lists/tuples): a Module whose last function is fn; print it for `.gir` text."""
    return trace_entry(fn, example_args, hide_constants=False).module


# -- scan -----------------------------------------------------------------------------------------


@traceable
def scan(f: Callable[[Any, Any], Any], init: Any, xs: Any = None, length: int | None = None,
         reverse: bool = False, unroll: int = 1) -> tuple[Any, Any]:
    """As jax.lax.scan: `carry, ys = scan(f, init, xs)` with `carry, y = f(carry, x)` per step
    over the leading axis of xs (any pytree); ys stacks the y's. `reverse` runs the steps from
    the last; `length` gives the step count when xs is None. (`unroll` is accepted and ignored:
    the backends run the loop natively.)"""
    loc = user_location()
    frame = current_frame()
    assert frame is not None
    if not callable(f):
        raise GirTraceError(f"gir.scan takes a step function, not {type(f).__name__}", loc)
    _check_arity(f, (init, xs))  # step(carry, x)
    init_leaves, init_paths, init_tree = flatten(init, path=("carry",))
    xs_leaves, xs_paths, xs_tree = flatten(xs, path=("x",))
    inits = [to_value(leaf, loc=loc) for leaf in init_leaves]
    seqs = [to_value(leaf, loc=loc) for leaf in xs_leaves]
    for v in seqs:
        if v.tensor_type.rank == 0:
            raise GirTraceError(f"gir.scan: xs has a scalar leaf ({v.type}); every leaf needs a leading axis", loc)
    if not seqs and length is None:
        raise GirTraceError("gir.scan needs xs or length=", loc)
    if length is not None and (not isinstance(length, int) or length < 0):
        raise GirTraceError(f"gir.scan: length must be a non-negative int, got {length!r}", loc)
    weak = [isinstance(leaf, Tracer) and leaf.weak or is_weak(leaf) and not isinstance(leaf, np.generic)
            for leaf in init_leaves]
    while True:
        try:
            body, y_tree = _trace_step(f, frame, seqs, inits, init_tree, xs_tree, xs is not None,
                                       [value_name(p) for p in xs_paths + init_paths], weak, loc)
            break
        except _WeakCarryPromoted as promoted:  # as JAX: a Python scalar init takes the step's dtype
            inits[promoted.index] = to_value(init_leaves[promoted.index], promoted.dtype, loc)
            weak[promoted.index] = False
    op = emit("scan", seqs + inits, attrs={"reverse": bool(reverse), "length": length}, regions=[Region(body)],
              segments=(len(seqs), len(inits)), loc=loc)
    finals = [Tracer(r, frame, frame.block) for r in op.result_group("finals")]
    stacked = [Tracer(r, frame, frame.block) for r in op.result_group("stacks")]
    return unflatten(init_tree, finals), unflatten(y_tree, stacked)


def _made_at(value: Any, loc: Location) -> Location:
    """Where the step made (the first traced leaf of) what it returns, so that an error about
    the step's result points into the step rather than at the gir.scan call; else loc."""
    for leaf in flatten(value)[0]:
        op = leaf.value.defining_op if isinstance(leaf, Tracer) else None
        if op is not None and op.loc.file == loc.file:
            return op.loc
    return loc


class _WeakCarryPromoted(Exception):
    """A carry initialised by a Python scalar comes out of the step promoted (`0.0` summing f64
    values): the step is traced again with the init of that dtype."""

    def __init__(self, index: int, dtype: str):
        super().__init__(index, dtype)
        self.index = index
        self.dtype = dtype


def _trace_step(f: Callable[[Any, Any], Any], frame: Frame, seqs: list[Value], inits: list[Value],
                init_tree: TreeDef, xs_tree: TreeDef, has_xs: bool, names: list[str], weak: list[bool],
                loc: Location) -> tuple[Block, TreeDef]:
    """The scan's body: f traced on one element and the carries, ended by its `yield`."""
    body = Block([s.tensor_type.with_shape(s.tensor_type.shape[1:]) for s in seqs] + [v.type for v in inits], names)
    args = list(body.args)
    elements, carries = args[:len(seqs)], args[len(seqs):]  # the block's groups, as the scan spec orders them
    with block_scope(frame, body):
        carry_in = unflatten(init_tree, [Tracer(a, frame, body) for a in carries])
        x_in = unflatten(xs_tree, [Tracer(a, frame, body) for a in elements]) if has_xs else None
        out = f(carry_in, x_in)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise GirTraceError("the gir.scan step must return a pair (new carry, value to stack)",
                                _made_at(out, loc))
        new_carries = _carry_values(out[0], init_tree, inits, loc, weak)
        y_leaves, _, y_tree = flatten(out[1])
        stacks = [to_value(leaf, loc=loc) for leaf in y_leaves]
        body.append(make_op("yield", new_carries + stacks, loc=loc, segments=(len(new_carries), len(stacks))))
    return body, y_tree


def _carry_values(carry: Any, init_tree: TreeDef, inits: list[Value], loc: Location,
                  weak: Sequence[bool] = ()) -> list[Value]:
    leaves, paths, tree = flatten(carry, path=("carry",))
    if tree != init_tree:
        raise GirTraceError(f"the gir.scan step returns a carry of structure {tree}, but init has {init_tree}",
                            _made_at(carry, loc))
    out = []
    for k, (leaf, path, init) in enumerate(zip(leaves, paths, inits)):
        v = to_value(leaf, init.tensor_type.dtype, loc)
        t = init.tensor_type
        if k < len(weak) and weak[k] and v.tensor_type.shape == t.shape and v.tensor_type.dtype != t.dtype \
                and promote([t.dtype, v.tensor_type.dtype]) == v.tensor_type.dtype:
            raise _WeakCarryPromoted(k, v.tensor_type.dtype)
        if v.type != init.type:
            where = value_name(path)
            what = "the carry" if where == "carry" else f"the carry {where}"  # not "the carry carry"
            raise GirTraceError(f"the gir.scan step changes {what} from {init.type} to {v.type}; a "
                                "carry keeps its shape and dtype (convert with .astype)", _made_at(leaf, loc))
        out.append(v)
    return out


# -- grad -----------------------------------------------------------------------------------------


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *, wrt: int | Sequence[int] | None = None,
         has_aux: bool = False) -> Callable[..., Any]:
    """As jax.grad: the gradient of fun (returning a float scalar) with respect to argument
    `argnums` (an int, or a tuple: a tuple of gradients), shaped like that argument's pytree.
    `wrt=` is another name for argnums."""
    return _differentiate(fun, argnums if wrt is None else wrt, has_aux, with_value=False)


def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, *,
                   wrt: int | Sequence[int] | None = None, has_aux: bool = False) -> Callable[..., Any]:
    """As jax.value_and_grad: `(fun(*args), grad(fun, argnums)(*args))`."""
    return _differentiate(fun, argnums if wrt is None else wrt, has_aux, with_value=True)


def _differentiate(fun: Callable[..., Any], argnums: Any, has_aux: bool, with_value: bool) -> Callable[..., Any]:
    loc = user_location(2)
    if not callable(fun):
        raise GirTraceError(f"gir.grad takes a Python function, not {type(fun).__name__}", loc)
    ok = isinstance(argnums, int) or (isinstance(argnums, (tuple, list)) and argnums
                                      and all(isinstance(a, int) for a in argnums))
    if not ok or isinstance(argnums, bool):
        raise GirTraceError(f"argnums must be an int or a tuple of ints, got {argnums!r}", loc)

    @functools.wraps(fun)
    def differentiated(*args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        if frame is None and (EAGER or eager_installed()):
            return EAGER[0](differentiated, args, kwargs)
        if frame is None:
            raise GirTraceError("gir.grad needs a trace", user_location())
        # Keyword arguments are not differentiated (as in JAX); traced values among them reach
        # the callee as captured values of the caller.
        bound = functools.partial(fun, **kwargs) if kwargs else fun
        return _grad_call(bound, argnums, with_value, args, frame, user_location(), has_aux)

    base = func_name(getattr(fun, "__name__", "f"))
    differentiated.__name__ = f"{base}_value_and_grad" if with_value else f"{base}_grad"
    differentiated.__qualname__ = differentiated.__name__
    return differentiated


def _grad_call(fun: Callable[..., Any], argnums: Any, with_value: bool, args: Sequence[Any], frame: Frame,
               loc: Location, has_aux: bool = False) -> Any:
    """The `grad` op of fun at args. With has_aux, fun returns (loss, aux) and the result is
    JAX's: `(grads, aux)` for grad, `((loss, aux), grads)` for value_and_grad; the aux leaves
    are further results of the callee, which the `grad` op passes through."""
    _check_arity(fun, args)
    nums = [argnums] if isinstance(argnums, int) else list(argnums)
    for a in nums:
        if not -len(args) <= a < len(args):
            raise GirTraceError(f"argnums {a} is out of range for {len(args)} argument(s)", loc)
    nums = [a % len(args) for a in nums]
    leaves, names, trees = flatten_args(fun, args)
    # a weak argument of the caller is passed at its full precision (to_value would narrow it)
    values = [resolve(leaf) if isinstance(leaf, Tracer)
              else to_value(leaf, weak_argument_dtype(leaf) if is_weak(leaf) and not isinstance(leaf, np.generic)
                            else None, loc=loc) for leaf in leaves]
    # a Python scalar (or a weak scalar argument of the caller) stays weakly typed in the callee
    weak = [leaf.weak if isinstance(leaf, Tracer) else is_weak(leaf) and not isinstance(leaf, np.generic)
            for leaf in leaves]
    callee, out, aux_tree = _trace_callee(fun, values, names, trees, frame, loc, weak, has_aux)
    starts = [sum(t.num_leaves for t in trees[:i]) for i in range(len(trees))]
    wrt = [p for a in nums for p in range(starts[a], starts[a] + trees[a].num_leaves)]
    for p in wrt:
        if values[p].tensor_type.dtype not in FLOAT_DTYPES:
            raise GirTraceError(f"gir.grad with respect to %{names[p]} of type {values[p].type}: gradients need "
                                "float arguments", loc)
    declared = list(out) + [values[p].tensor_type for p in wrt]
    extra = list(callee.captures)  # caller values fun closes over: passed after its own arguments
    op = emit("grad", values + extra, attrs={"callee": callee.function.name, "wrt": wrt}, declared=declared, loc=loc)
    value, *rest = wrap(op, frame)
    aux_leaves, grads = rest[:len(out) - 1], rest[len(out) - 1:]
    for g, p in zip(grads, wrt):
        g.weak = weak[p]  # the gradient of a weak scalar is weak too (f32 standing alone), as in JAX
    grad_trees, start = [], 0
    for a in nums:
        n = trees[a].num_leaves
        grad_trees.append(unflatten(trees[a], grads[start:start + n]))
        start += n
    result = grad_trees[0] if isinstance(argnums, int) else tuple(grad_trees)
    if has_aux:
        assert aux_tree is not None  # has_aux traced the aux tree above
        aux = unflatten(aux_tree, aux_leaves)
        return ((value, aux), result) if with_value else (result, aux)
    return (value, result) if with_value else result


def _trace_callee(fun: Callable[..., Any], values: list[Value], names: list[str], trees: list[TreeDef],
                  frame: Frame, loc: Location, weak: Sequence[bool] = (),
                  has_aux: bool = False) -> tuple[Frame, list[TensorType], TreeDef | None]:
    """fun traced into a function of the caller's module; (its frame, its result types: the
    scalar, then the aux leaves', the aux structure)."""
    named = fun.func if isinstance(fun, functools.partial) else fun  # keyword arguments bound by gir.grad
    floc = function_location(named)
    function = new_function(func_name(getattr(named, "__name__", "f")), frame.module,
                            [v.tensor_type for v in values], names, floc)
    callee = Frame(function, frame.module, frame)
    with frame_scope(callee):
        weak = list(weak) + [False] * (len(function.args) - len(weak))
        tracers = [Tracer(a, callee, function.body, weak=w) for a, w in zip(function.args, weak)]
        out = fun(*unflatten_args(trees, tracers))
        aux_values, aux_tree = [], None
        if has_aux:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise GirTraceError(f"gir.grad(has_aux=True) needs {function.name} to return a pair (loss, aux), "
                                    f"it returns a {type(out).__name__}", loc)
            out, aux = out
            aux_leaves, _, aux_tree = flatten(aux)
            aux_values = [to_value(leaf, loc=floc) for leaf in aux_leaves]
        if not isinstance(out, Tracer):
            raise GirTraceError(f"gir.grad needs {function.name} to return one float scalar tensor, it returns a "
                                f"{type(out).__name__}", loc)
        result = resolve(out, callee)
        t = result.tensor_type
        if t.shape != () or t.dtype not in FLOAT_DTYPES:
            raise GirTraceError(f"gir.grad needs {function.name} to return one float scalar, it returns {t}", loc)
        finish_function(function, frame.module, [result, *aux_values], floc)
    return callee, [t, *(v.tensor_type for v in aux_values)], aux_tree

