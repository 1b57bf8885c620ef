"""`gir.jit(fn)` for a Python function, and gir's functions run eagerly outside a trace.

    step = gir.jit(gir.value_and_grad(loss))      # device="cpu" | "gpu" | "interp"
    value, grads = step(params, xs, h0)           # grads shaped like params

Each call flattens the arguments (pytrees) to arrays; the first call with a new structure,
shapes or dtypes traces fn (frontend/python) and compiles the module with `gir.jit`; later
calls with the same key reuse that compiled specialisation. Results are rebuilt into the
structure fn returned.

On the CPU the key leaves out the leading dim of every array argument: one `TracedJit` (a
`JitFunction` whose specialisations trace fn again at their shapes) serves them all, and
where one of those dims is a sequence length (driver/lengths.py, found by tracing at two
lengths), one compile serves every length; any other leading dim (a batch) is traced and
compiled per value, as before.

Like driver/jit.py and cli.py, this module wires stages together (frontend -> jit), which no stage may.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..analysis.lengths import NotALength, conforms, module_extents
from ..config import current
from ..errors import GirArgumentError, GirError
from ..frontend.python import numpy_api
from ..frontend.python.pytree import TreeDef, flatten, unflatten
from ..frontend.python.tracer import current_frame, default_dtype, is_weak, register_internal_file
from ..frontend.python.transforms import Spec, Traced, trace_entry
from ..ir.core import Function, Module
from ..ir.types import DTYPES, TensorType
from .jit import JitFunction
from .lengths import REPRESENTATIVES, LengthGroup
from .results import result_names

register_internal_file(__file__)


class PythonJit:
    """A Python function compiled once per distinct (argument structure, shapes, dtypes)."""

    def __init__(self, fn: Callable[..., Any], device: str, pipeline: str | None, **options: Any):
        self.fn = fn
        self.device = device
        self.pipeline = pipeline
        self.options = options
        self._compiled: dict[tuple[TreeDef, tuple[Any, ...]], tuple[Traced, Any]] = {}
        self._lock = threading.Lock()
        self._last: tuple[Traced, Any] | None = None
        self.__name__ = getattr(fn, "__name__", "jitted")
        self.__doc__ = getattr(fn, "__doc__", None)

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
        relax = self.device == "cpu" and current().lengths  # one TracedJit for every leading dim
        key = (tree, tuple((_key_shape(a, w, relax), str(a.dtype)) for a, w in zip(arrays, weak)), weak)
        found = self._compiled.get(key)
        if found is None:
            with self._lock:
                found = self._compiled.get(key)
                if found is None:
                    examples = [leaf if w else a for leaf, a, w in zip(leaves, arrays, weak)]
                    found = self._compiled[key] = self._compile(unflatten(tree, examples))
        self._last = found
        traced, compiled = found
        return unflatten(traced.out_tree, compiled(*arrays))

    def _compile(self, args: tuple[Any, ...]) -> tuple[Traced, Any]:
        from .jit import jit

        traced = trace_entry(self.fn, args)
        if self.device == "cpu" and current().lengths:
            return traced, TracedJit(self.fn, args, traced, self.pipeline, self.options.get("mode"))
        return traced, jit(traced.module, traced.entry, device=self.device, pipeline=self.pipeline, **self.options)

    def trace(self, *args: Any) -> Traced:
        """The traced module for these arguments (not compiled)."""
        return trace_entry(self.fn, args)

    @property
    def specialisations(self) -> int:
        """Specialisations compiled (code for every length counts once)."""
        return sum(getattr(c, "specialisations", 1) for _, c in self._compiled.values())

    def _current(self) -> Any:
        if self._last is None:
            raise GirArgumentError(f"{self.__name__} has not been called yet: it is compiled on its first call")
        return self._last[1]

    @property
    def module(self) -> Any:
        """The traced module (before the pipeline) of the last call."""
        self._current()
        assert self._last is not None
        return self._last[0].module

    @property
    def ir(self) -> str:
        return self._current().ir

    @property
    def stats(self) -> Any:
        return self._current().stats

    @property
    def compiled(self) -> Any:
        return self._current().compiled


def _key_shape(a: Any, weak: bool, relax: bool) -> tuple:
    """a's shape in PythonJit's key: without its leading dim where relax (TracedJit specialises it)."""
    shape = tuple(a.shape)
    return (None, *shape[1:]) if relax and shape and not weak else shape


class TracedJit(JitFunction):
    """`gir.jit` of a Python function on the CPU, for one argument structure, dtypes and every
    leading dim: its signature has `?` leading dims, and each specialisation traces fn again
    at its shapes (so a Python value read from a shape, `xs.shape[0]`, is right in each), which
    also makes the two representative lengths a length is found with (driver/lengths.py)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], traced: Traced, pipeline: str | None,
                 mode: str | None):
        from ..passes.pipeline import DEFAULT_MODE, get_mode
        from . import compile_cache

        self._fn, self._args = fn, args
        f = traced.module.functions[traced.entry]
        leaves, _, self._tree = flatten(args)
        self._weak = [_is_python_scalar(leaf) for leaf in leaves]
        self._leaves = leaves
        types = [t if w or not t.rank else TensorType((None, *t.shape[1:]), t.dtype)
                 for t, w in zip(f.arg_types, self._weak)]
        signature = Function(f.name, types, f.result_types, [a.name_hint for a in f.args], f.loc)
        full = pipeline if pipeline is not None else get_mode(mode or DEFAULT_MODE).pipeline("cpu")
        key = compile_cache.module_key(traced.module, traced.entry, "cpu", full)
        self._checked: dict[tuple, bool] = {}
        """(shapes without the length, length) -> whether the code for every length serves it."""
        self._references: dict[tuple, tuple[Module | None, Any]] = {}
        """shapes without the length -> fn traced at the first representative and its extents."""
        super().__init__(None, traced.entry, "cpu", full, cache_key=key, signature=signature,
                         names=result_names(f))
        self._source = traced.module

    def _specialised_module(self, shapes: tuple) -> Module:
        examples = [leaf if w else np.zeros(shape, leaf.dtype)
                    for leaf, w, shape in zip(self._leaves, self._weak, shapes)]
        traced = trace_entry(self._fn, unflatten(self._tree, examples))
        return traced.module

    def _serves(self, compiled: Any, shapes: tuple, group: LengthGroup) -> bool:
        """As JitFunction's, and fn traces at this length to the program traced at the first
        representative, with every dim where the two representatives put it (analysis/lengths.py
        `conforms`: a Python `if` on `xs.shape[0]`, a size T*T): checked once per length."""
        t = compiled.length_of(shapes)
        if t is None:
            return False
        key = (group.generic(shapes), t)
        if key not in self._checked:
            self._checked[key] = self._conforms(shapes, group, t)
        return self._checked[key]

    def _conforms(self, shapes: tuple, group: LengthGroup, t: int) -> bool:
        ta, tb = REPRESENTATIVES
        reference = self._references.get(group.generic(shapes))
        if reference is None:
            a: Module | None = None
            try:
                a = self._specialised_module(group.at(shapes, ta))
                extents = module_extents(a, self._specialised_module(group.at(shapes, tb)), ta, tb)
            except (GirError, NotALength):
                extents = None
            except Exception:  # noqa: BLE001 - fn traced at a length it was not called with may raise anything
                extents = None
            reference = self._references[group.generic(shapes)] = (a, extents)
        a, extents = reference
        if a is None or extents is None:
            return False
        try:
            return conforms(a, extents, self._specialised_module(shapes), ta, t) is None
        except GirError:
            return False


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
        return np.asarray(leaf, dtype=DTYPES[default_dtype(leaf)] if not isinstance(leaf, np.generic) else None)
    if isinstance(leaf, Spec):
        raise GirArgumentError("gir.spec describes an argument for gir.trace; a jitted function needs arrays")
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return leaf  # a device array (CuPy); the backend checks it
    raise GirArgumentError(f"argument leaf #{i} is a {type(leaf).__name__}, not an array or a number")


def jit_python(fn: Callable[..., Any], entry: str | None = None, device: str = "cpu", pipeline: str | None = None,
               **options: Any) -> PythonJit:
    if entry is not None:
        raise GirArgumentError("gir.jit of a Python function takes no entry name")
    return PythonJit(fn, device, pipeline, **options)


def run_eager(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A gir function called outside a trace: traced with its array arguments as parameters
    (everything else stays a Python value) and run by the interpreter."""
    from .jit import jit

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
    out = jit(traced.module, traced.entry, device="interp")(*arrays)
    return unflatten(traced.out_tree, out)


numpy_api.EAGER[:] = [run_eager]
