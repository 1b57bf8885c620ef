"""`gir.jit(fn)` for a Python function, and gir's functions run eagerly outside a trace.

    step = gir.jit(gir.value_and_grad(loss))      # device="cpu" | "gpu" | "interp"
    value, grads = step(params, xs, h0)           # grads shaped like params

Each call flattens the arguments (pytrees) to arrays; the first call with a new structure,
shapes or dtypes traces fn (frontend/python) and compiles the module with `gir.jit`; later
calls with the same key reuse that compiled specialisation (driver/specialisations.py). Results are rebuilt into the
structure fn returned.

On the CPU the key leaves out the leading dim of every array argument: one `TracedJit`
(driver/jit.py: a `JitFunction` whose specialisations trace fn again at their shapes) serves
them all, and where one of those dims is a sequence length (driver/lengths.py, found by
tracing at two lengths), one compile serves every length; any other leading dim (a batch) is
traced and compiled per value, as before.

Like driver/jit.py and cli.py, this module wires stages together (frontend -> jit), which no stage may.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend.gpu.device import is_device_array
from ..config import current
from ..errors import GirArgumentError
from ..frontend.python import numpy_api
from ..frontend.python.pytree import TreeDef, flatten, unflatten
from ..frontend.python.tracer import (
    current_frame,
    hides_gir_frames,
    is_weak,
    register_internal_file,
    user_location,
    weak_argument_dtype,
)
from ..frontend.python.transforms import Spec, Traced, trace_entry
from ..ir.core import Module
from ..ir.types import DTYPES
from ..passes.pipeline import DEFAULT_MODE, get_mode
from .compile import compile_entry
from .specialisations import Specialisations
from .transfer import device_put

register_internal_file(__file__)


Key = tuple[TreeDef, tuple[tuple[tuple[int, ...], str], ...], tuple[bool, ...]]
"""A specialisation of a PythonJit: the argument structure, each leaf's shape and dtype, and
which leaves are Python scalars (weakly typed)."""

CompileModule = Callable[..., Any]
"""`gir.jit` of a Module (driver/jit.py `jit`, given by it: this module does not import it)."""


class PythonJit:
    """A Python function compiled once per distinct (argument structure, shapes, dtypes)."""

    def __init__(self, fn: Callable[..., Any], device: str, pipeline: str | None, compile_module: CompileModule,
                 traced_jit: Any = None, donate: tuple[int, ...] = (), **options: Any):
        """traced_jit: driver/jit.py's `TracedJit` (given by it), for one compile per length;
        donate: the positional parameters donated (gir.jit's donate_argnums, checked)."""
        self.fn = fn
        self.donate = donate if device == "gpu" else ()
        """Donated parameters, where donating saves copies (the GPU: `GPUFunction.donate`)."""
        self._traced_jit = traced_jit
        self.device = device
        self.pipeline = pipeline
        self.options = options
        self._compile_module = compile_module
        self._compiled: Specialisations[Key, tuple[Traced, Any]] = Specialisations(self._evicted)
        """Per key, the trace and its `gir.jit` function (itself keeping its specialisations:
        one, or on the CPU one per length group and other leading dims), the least recently
        used evicted past GIR_MAX_SPECIALISATIONS."""
        self._device_hidden: dict[int, tuple[Traced, tuple[Any, ...]]] = {}
        """Per trace (by id, the trace kept to tell a reused id), its hidden arguments on the
        device (`_hidden_on_device`); dropped with the trace's specialisation."""
        self._gone = (0, 0)
        """(made, evicted) specialisations of the inner functions evicted since, which
        `specialisations` and `specialisations_evicted` still count."""
        self._relax = traced_jit is not None and device == "cpu" and current().lengths
        """One TracedJit for every leading dim (GIR_LENGTHS), decided once: the environment is
        read per gir.jit, not per call (~20 us of a ~80 us call of a small function)."""
        self.__name__ = getattr(fn, "__name__", "jitted")
        self.__doc__ = getattr(fn, "__doc__", None)

    @hides_gir_frames
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_frame() is not None:
            return self.fn(*args, **kwargs)  # called inside a trace (jit of a jitted function): inlined, as JAX does
        if kwargs:
            args = _bind(self.fn, args, kwargs)
        leaves, _, tree = flatten(args)
        arrays = [_as_array(leaf, i) for i, leaf in enumerate(leaves)]
        # A Python scalar is traced weakly typed (as in JAX: a float `lr` meets f64 params as f64),
        # so the key tells it from a 0-d array of the same dtype.
        weak = tuple(_is_python_scalar(leaf) for leaf in leaves)
        relax = self._relaxed()  # one TracedJit for every leading dim
        key: Key = (tree, tuple((_key_shape(a, w, relax), str(a.dtype)) for a, w in zip(arrays, weak)), weak)

        def make(_: Key) -> tuple[Traced, Any]:
            examples = [leaf if w else a for leaf, a, w in zip(leaves, arrays, weak)]
            traced, compiled = self._compile(unflatten(tree, examples))
            if self.donate:
                f = traced.module.functions[traced.entry]
                donated = donated_leaves(tree, self.donate, self.__name__)
                compiled.compiled.donate(donation_pairs([(a.shape, a.dtype) for a in arrays], donated,
                                                        [(t.shape, DTYPES[t.dtype]) for t in f.result_types]))
            return traced, compiled

        traced, compiled = self._compiled.get(key, make)
        hidden = traced.hidden
        if hidden and self.device == "gpu" and any(is_device_array(a) for a in arrays):
            hidden = self._hidden_on_device(traced)
        return unflatten(traced.out_tree, compiled(*arrays, *hidden))

    def _hidden_on_device(self, traced: Traced) -> tuple[Any, ...]:
        """The closed-over arrays of traced (`Traced.hidden`) as device arrays, uploaded once:
        a call with device arrays copies them on the device instead of uploading them every call
        (its results are device arrays anyway). A call with NumPy arrays only passes the NumPy
        ones, so that its results stay NumPy arrays."""
        found = self._device_hidden.get(id(traced))
        if found is None or found[0] is not traced:
            found = self._device_hidden[id(traced)] = (traced, device_put(traced.hidden, "gpu"))
        return found[1]

    def _relaxed(self) -> bool:
        return self._relax

    def _compile(self, args: tuple[Any, ...]) -> tuple[Traced, Any]:
        traced = trace_entry(self.fn, args)
        if self._relaxed():
            leaves, _, tree = flatten(args)
            weak = [_is_python_scalar(leaf) for leaf in leaves]

            def retrace(shapes: tuple) -> Module:
                examples = [leaf if w else np.zeros(shape, leaf.dtype) for leaf, w, shape in zip(leaves, weak, shapes)]
                return trace_entry(self.fn, unflatten(tree, examples)).module

            full = self.pipeline or get_mode(self.options.get("mode") or DEFAULT_MODE).pipeline("cpu")
            return traced, self._traced_jit(retrace, traced.module, traced.entry, full, weak)
        return traced, self._compile_module(traced.module, traced.entry, device=self.device, pipeline=self.pipeline,
                                            **self.options)

    def trace(self, *args: Any) -> Traced:
        """The traced module for these arguments (not compiled)."""
        return trace_entry(self.fn, args)

    @property
    def specialisations(self) -> int:
        """Specialisations compiled (code for every length counts once; one evicted and made
        again counts again)."""
        return self._gone[0] + sum(c.specialisations for _, c in self._compiled.values())

    @property
    def specialisations_kept(self) -> int:
        """Specialisations kept in memory now (each key's, at most GIR_MAX_SPECIALISATIONS keys)."""
        return sum(c.specialisations_kept for _, c in self._compiled.values())

    @property
    def specialisations_evicted(self) -> int:
        """Specialisations evicted so far, within a key's function or with it."""
        return self._gone[1] + sum(c.specialisations_evicted for _, c in self._compiled.values())

    def _evicted(self, key: Key, value: tuple[Traced, Any]) -> None:
        self._device_hidden.pop(id(value[0]), None)
        inner = value[1]
        made, evicted = self._gone
        gone = inner.specialisations_kept + inner.specialisations_evicted
        self._gone = (made + inner.specialisations, evicted + gone)

    def _last(self) -> tuple[Traced, Any]:
        found = self._compiled.last()
        if found is None:
            raise GirArgumentError(f"{self.__name__} has not been called yet: it is compiled on its first call")
        return found

    def _current(self) -> Any:
        return self._last()[1]

    @property
    def module(self) -> Module:
        """The traced module (before the pipeline) of the calling thread's last call."""
        return self._last()[0].module

    @property
    def ir(self) -> str:
        return self._current().ir

    @property
    def stats(self) -> Any:
        return self._current().stats

    @property
    def compiled(self) -> Any:
        return self._current().compiled


def donated_leaves(tree: TreeDef, positions: tuple[int, ...], name: str) -> list[int]:
    """The flat indices of the leaves of the donated positional arguments (tree: the arguments'
    tuple)."""
    n = len(tree.children)
    bad = [p for p in positions if not -n <= p < n]
    if bad:
        raise GirArgumentError(f"donate_argnums {bad[0]}: {name} was called with {n} positional argument(s)",
                               user_location())
    starts = [0]
    for child in tree.children:
        starts.append(starts[-1] + child.num_leaves)
    return sorted(k for p in {p % n for p in positions} for k in range(starts[p], starts[p + 1]))


def donation_pairs(args: Sequence[tuple[tuple[int, ...], Any]], donated: Sequence[int],
                   results: Sequence[tuple[tuple[int | None, ...], Any]]) -> list[tuple[int, int]]:
    """(result, argument) pairs as jax.jit pairs donated buffers with outputs: each result, in
    order, takes the first donated argument leaf not taken yet of its shape and dtype (a step
    returning its parameters and state in the structure it took them pairs each with its own)."""
    free = list(donated)
    pairs = []
    for r, (shape, dtype) in enumerate(results):
        same = [k for k in free if tuple(args[k][0]) == tuple(shape) and np.dtype(args[k][1]) == np.dtype(dtype)]
        k = same[0] if same else None
        if k is not None:
            free.remove(k)
            pairs.append((r, k))
    return pairs


def _key_shape(a: Any, weak: bool, relax: bool) -> tuple:
    """a's shape in PythonJit's key: without its leading dim where relax (TracedJit specialises it)."""
    shape = tuple(a.shape)
    return (None, *shape[1:]) if relax and shape and not weak else shape


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Keyword arguments as positional ones (fn's parameters in order), as jax.jit takes them."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise GirArgumentError(f"{getattr(fn, '__name__', 'the function')}: {e}") from None
    if bound.kwargs:
        raise GirArgumentError("keyword-only arguments of a jitted function are not supported: "
                               + ", ".join(bound.kwargs))
    return tuple(bound.args)


def _is_python_scalar(leaf: Any) -> bool:
    return is_weak(leaf) and not isinstance(leaf, np.generic)


def _as_array(leaf: Any, i: int) -> Any:
    if isinstance(leaf, np.ndarray):
        return leaf
    if is_weak(leaf):
        return np.asarray(leaf, dtype=DTYPES[weak_argument_dtype(leaf)] if not isinstance(leaf, np.generic) else None)
    if isinstance(leaf, Spec):
        raise GirArgumentError("gir.spec describes an argument for gir.trace; a jitted function needs arrays")
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return leaf  # a device array (CuPy); the backend checks it
    raise GirArgumentError(f"argument leaf #{i} is a {type(leaf).__name__}, not an array or a number")


def jit_python(fn: Callable[..., Any], compile_module: CompileModule, entry: str | None = None, device: str = "cpu",
               pipeline: str | None = None, static_argnums: int | Sequence[int] | None = None,
               static_argnames: str | Sequence[str] | None = None, donate_argnums: int | Sequence[int] | None = None,
               **options: Any) -> PythonJit | StaticJit:
    """`gir.jit(fn)`: fn traced per argument structure, each trace compiled by compile_module;
    with static arguments, one such PythonJit per distinct tuple of their values."""
    if entry is not None:
        raise GirArgumentError("gir.jit of a Python function takes no entry name")
    static = static_arguments(fn, static_argnums, static_argnames)
    donate = _donate_argnums(donate_argnums)
    if donate and static is not None:
        raise GirArgumentError("donate_argnums together with static arguments is not supported yet")
    if static is None:
        return PythonJit(fn, device, pipeline, compile_module, donate=donate, **options)
    return StaticJit(fn, static, lambda f: PythonJit(f, device, pipeline, compile_module, **options))


def _donate_argnums(argnums: int | Sequence[int] | None) -> tuple[int, ...]:
    nums = [argnums] if isinstance(argnums, int) else list(argnums or ())
    for n in nums:
        if not isinstance(n, int) or isinstance(n, bool):
            raise GirArgumentError(f"donate_argnums takes integers (positions), not {n!r}")
    return tuple(sorted(set(nums)))


# -- static arguments (jax.jit's static_argnums / static_argnames) ------------------------------------


@dataclass(frozen=True)
class StaticArguments:
    """Which parameters of a jitted Python function are static: passed to it as the Python values
    they are (a shape, a flag, a layer count, a function) rather than traced, and part of the
    specialisation key, as in jax.jit. Decided once, at `gir.jit`."""

    signature: inspect.Signature
    """fn's signature: calls are bound to it, so a static parameter may be given by position or name."""
    names: tuple[str, ...]
    """The static parameters, in the signature's order."""


def static_arguments(fn: Callable[..., Any], argnums: int | Sequence[int] | None,
                     argnames: str | Sequence[str] | None) -> StaticArguments | None:
    """The static parameters named by position (argnums; negative ones count from the end of the
    positional parameters) or by name, checked against fn's signature; None when there are none."""
    nums = [argnums] if isinstance(argnums, int) else list(argnums or ())
    names = [argnames] if isinstance(argnames, str) else list(argnames or ())
    if not nums and not names:
        return None
    what = getattr(fn, "__name__", "the function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise GirArgumentError(f"static_argnums/static_argnames: {what} has no signature to bind them to") from None
    params = list(signature.parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    chosen = set()
    for n in nums:
        if not isinstance(n, int) or isinstance(n, bool) or not -len(positional) <= n < len(positional):
            raise GirArgumentError(f"static_argnums {n!r}: {what} has {len(positional)} positional parameter(s) "
                                   f"({', '.join(positional)})")
        chosen.add(positional[n])
    for name in names:
        p = signature.parameters.get(name) if isinstance(name, str) else None
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise GirArgumentError(f"static_argnames {name!r}: {what} has no parameter of that name "
                                   f"({', '.join(signature.parameters)})")
        chosen.add(name)
    return StaticArguments(signature, tuple(p.name for p in params if p.name in chosen))


class StaticJit:
    """`gir.jit(fn, static_argnums=..., static_argnames=...)`: one `PythonJit` per distinct tuple
    of static values (compared by type and equality, so they must be hashable, as in JAX), each
    tracing fn with those values bound as Python values; the other arguments are traced."""

    def __init__(self, fn: Callable[..., Any], static: StaticArguments,
                 make_jit: Callable[[Callable[..., Any]], PythonJit]):
        self.fn = fn
        self.static = static
        self._make_jit = make_jit
        self._jits: Specialisations[tuple[tuple[Any, ...], tuple[str, ...]], PythonJit] = Specialisations()
        """(the static values, the traced parameters given) -> the PythonJit of fn with those bound."""
        self.__name__ = getattr(fn, "__name__", "jitted")
        self.__doc__ = getattr(fn, "__doc__", None)

    @hides_gir_frames
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_frame() is not None:
            return self.fn(*args, **kwargs)  # inside a trace: inlined, static values and all
        bound = self._bind(args, kwargs)
        static = {name: bound.arguments[name] for name in self.static.names if name in bound.arguments}
        key = tuple((name, type(v), v) for name, v in static.items())
        try:
            hash(key)
        except TypeError:
            name = next(n for n, v in static.items() if not _hashable(v))
            raise GirArgumentError(f"static argument {name!r} of {self.__name__} is a {type(static[name]).__name__}, "
                                   "which is not hashable: static values are part of the specialisation key (as in "
                                   "jax.jit); pass a tuple instead of a list, or make it a traced argument",
                                   user_location()) from None
        dynamic = [n for n in bound.arguments if n not in static]  # parameters left out keep fn's defaults
        jitted = self._jits.get((key, tuple(dynamic)), lambda _: self._make_jit(self._bound_to(static, dynamic)))
        return jitted(*(bound.arguments[n] for n in dynamic))

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        try:
            bound = self.static.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise GirArgumentError(f"{self.__name__}: {e}", user_location()) from None
        for name in self.static.names:  # a static parameter left out takes its default (part of the key);
            default = self.static.signature.parameters[name].default  # other defaults stay fn's own
            if name not in bound.arguments and default is not inspect.Parameter.empty:
                bound.arguments[name] = default
        return bound

    def _bound_to(self, static: dict[str, Any], dynamic: list[str]) -> Callable[..., Any]:
        """fn of the dynamic arguments (by position, named as fn names them) with the static
        values bound: what one PythonJit traces."""
        fn, signature = self.fn, self.static.signature

        def specialised(*values: Any) -> Any:
            args, kwargs = _call_arguments(signature, dict(zip(dynamic, values)) | static, set(static))
            return fn(*args, **kwargs)

        specialised.__name__ = self.__name__
        specialised.__wrapped__ = fn  # type: ignore[attr-defined]  # locations: fn's own file and line
        specialised.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # argument names: fn's
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in dynamic])
        return specialised

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """The traced module for these arguments (not compiled)."""
        bound = self._bind(args, kwargs)
        static = {name: bound.arguments[name] for name in self.static.names if name in bound.arguments}
        dynamic = [n for n in bound.arguments if n not in static]
        return trace_entry(self._bound_to(static, dynamic), [bound.arguments[n] for n in dynamic])

    @property
    def specialisations(self) -> int:
        """Specialisations compiled, over every tuple of static values."""
        return sum(j.specialisations for j in self._jits.values())

    def _last(self) -> PythonJit:
        found = self._jits.last()
        if found is None:
            raise GirArgumentError(f"{self.__name__} has not been called yet: it is compiled on its first call")
        return found

    @property
    def module(self) -> Module:
        return self._last().module

    @property
    def ir(self) -> str:
        return self._last().ir

    @property
    def stats(self) -> Any:
        return self._last().stats

    @property
    def compiled(self) -> Any:
        return self._last().compiled


def _call_arguments(signature: inspect.Signature, arguments: dict[str, Any],
                    static: set[str]) -> tuple[list[Any], dict[str, Any]]:
    """fn's call with these arguments: traced ones by position as far as possible, static ones
    after the last traced positional one by keyword, so that `gir.jit(gir.grad(f),
    static_argnums=1)` hands gir.grad a keyword argument, which it passes on as the Python value
    (a positional one it would trace, to differentiate by argnums)."""
    params = list(signature.parameters.values())
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                        inspect.Parameter.VAR_POSITIONAL)
    last = max((i for i, p in enumerate(params) if p.name in arguments and p.name not in static
                and p.kind in positional_kinds), default=-1)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    by_position = True
    for i, p in enumerate(params):
        if p.name not in arguments:
            by_position = by_position and p.kind not in positional_kinds  # a gap: keywords from here
            continue
        v = arguments[p.name]
        if p.kind == p.VAR_POSITIONAL:
            args.extend(v)
        elif p.kind == p.VAR_KEYWORD:
            kwargs.update(v)
        elif p.kind == p.POSITIONAL_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and by_position and i <= last):
            args.append(v)
        else:
            kwargs[p.name] = v
            by_position = False
    return args, kwargs


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def run_eager(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A gir function called outside a trace: traced with its array arguments as parameters
    (everything else stays a Python value) and run by the interpreter, after the default
    mode's pipeline (autodiff gives `grad` its meaning)."""
    leaves, _, tree = flatten((args, kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray)]

    def eager(*arrays: Any) -> Any:
        filled = list(leaves)
        for i, a in zip(where, arrays):
            filled[i] = a
        a, k = unflatten(tree, filled)
        return fn(*a, **k)

    eager.__name__ = getattr(fn, "__name__", "eager")
    arrays = [leaves[i] for i in where]
    traced = trace_entry(eager, arrays)
    f = traced.module.functions[traced.entry]
    pipeline = get_mode(DEFAULT_MODE).pipeline("interp")
    executable = compile_entry(traced.module, traced.entry, f.arg_types, "interp", pipeline)
    out = executable(*arrays, *traced.hidden)
    return unflatten(traced.out_tree, out)


numpy_api.EAGER[:] = [run_eager]
