"""The tracing core: `Tracer` values, the functions being traced (`Frame`), source locations.

Terms.
- A *frame* is one `Function` being built from a Python function (the traced entry, or the
  callee of a `gir.grad`). It keeps the blocks open in it (the function body, then the bodies
  of the `gir.scan`s being traced inside it) and emits every op into the innermost.
- A *Tracer* stands for one IR `Value` while its Python function runs: NumPy's operators and
  methods on it emit ops (`x @ w` emits `matmul`). It remembers the frame and block it was made
  in, so a value used where its block is closed (kept from one `gir.scan` step for later: a
  "leaked tracer" in JAX) is an error, and a value of an enclosing frame (a `gir.grad` callee
  closing over its caller's values) becomes an extra argument of the callee (`capture`).
- A *weak* operand is a Python or NumPy scalar: it takes the dtype of the tensor it meets, as
  in JAX (`x * 2` keeps x's f32).

Every op carries the location of the user's Python line: the first frame on the call stack
outside this package's tracing code (`user_location`). Errors (a shape rule that fails, a
traced value used as a Python bool) point there too.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ...errors import UNKNOWN, GirError, GirTypeError, Location, remember_source
from ...ir.core import Block, Function, Module, Operation, Region, Value, erase_op
from ...ir.ops import make_op
from ...ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType, dtype_name

_HERE = os.path.dirname(os.path.abspath(__file__))
F = TypeVar("F", bound=Callable[..., Any])
_INTERNAL_FILES: set[str] = set()
"""Other files whose frames are not the user's (driver/pyjit.py registers itself)."""


class GirTraceError(GirTypeError):
    """Python code that cannot be traced: a traced value used as a Python bool, a leaked value,
    an unsupported construct. Points at the user's Python line."""


class GirTraceAttributeError(GirTraceError, AttributeError):
    """An attribute a traced value does not have (also an AttributeError, so hasattr works)."""


# -- source locations ---------------------------------------------------------------------------

_REMEMBERED: set[str] = set()
_POSITIONS: dict[CodeType, list[Any]] = {}


def register_internal_file(path: str) -> None:
    _INTERNAL_FILES.add(os.path.abspath(path))


def _is_internal(filename: str) -> bool:
    return filename.startswith(_HERE) or filename in _INTERNAL_FILES


def user_location(depth: int = 1) -> Location:
    """file:line:col of the innermost caller outside the tracing code (the user's Python)."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None and _is_internal(os.path.abspath(frame.f_code.co_filename)):
        frame = frame.f_back
    if frame is None:
        return UNKNOWN
    code = frame.f_code
    _remember(code.co_filename)
    line, col = frame.f_lineno or code.co_firstlineno, 1
    positions = _POSITIONS.get(code)
    if positions is None:
        if sys.version_info >= (3, 11):
            positions = _POSITIONS[code] = list(code.co_positions())
        else:  # Python 3.10 has no column positions: the line alone (gir supports 3.10, pyproject)
            positions = _POSITIONS[code] = []
    index = frame.f_lasti // 2
    if 0 <= index < len(positions):
        start_line, _, start_col, _ = positions[index]
        if start_line == line and start_col is not None:
            col = start_col + 1
    return Location(code.co_filename, line, col)


def function_location(fn: Any) -> Location:
    """Where fn is defined; a wrapper of gir's own (gir.grad's, a static-argument binding of
    gir.jit: `__wrapped__`) stands for the user's function it wraps."""
    code = getattr(fn, "__code__", None)
    while code is not None and _is_internal(os.path.abspath(code.co_filename)) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
        code = getattr(fn, "__code__", None)
    if code is None:
        return user_location(2)
    _remember(code.co_filename)
    return Location(code.co_filename, code.co_firstlineno, 1)


def _remember(filename: str) -> None:
    """Lets diagnostics quote the user's Python line, as they quote a .gir file's."""
    if filename in _REMEMBERED:
        return
    _REMEMBERED.add(filename)
    lines = linecache.getlines(filename)
    if lines:
        remember_source(filename, "".join(lines))


# -- tracebacks ---------------------------------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.dirname(_HERE))
_USER_FOLDERS = tuple(os.path.join(_PACKAGE, d) + os.sep for d in ("tests", "examples", "bench"))


def _gir_frame(filename: str) -> bool:
    """A frame of gir itself (not of its tests, examples or benchmarks, which are user code)."""
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE + os.sep) and not path.startswith(_USER_FOLDERS)


def _without_gir_frames(tb: TracebackType | None) -> TracebackType | None:
    kept = []
    while tb is not None:
        if not _gir_frame(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def hides_gir_frames(fn: F) -> F:
    """An entry point of the frontend (gir.trace, a jitted function's call, an eager call): a
    GirError raised under it loses gir's own frames from its traceback, which then reads from
    the user's call through the user's traced lines (as JAX filters its frames); the message
    already points at the user's line. GIR_TRACEBACK=1 keeps every frame."""
    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GirError as e:
            from ...config import current

            if current().traceback:
                raise
            raise e.with_traceback(_without_gir_frames(e.__traceback__))  # noqa: B904 - the same error
    return entry  # type: ignore[return-value]


# -- frames -------------------------------------------------------------------------------------


class Frame:
    """One function being traced; see the module docstring."""

    def __init__(self, function: Function, module: Module, parent: Frame | None):
        self.function = function
        self.module = module
        self.parent = parent
        self.blocks: list[Block] = [function.body]
        self.captures: dict[Value, Value] = {}
        """A value of an enclosing frame -> the argument of this function that stands for it."""
        self.closed = False
        self.strict: bool = parent.strict if parent is not None else _strict_promotion()
        """GIR_PROMOTION=strict, read once per trace: tensors of different dtypes do not promote."""
        self.hide_constants: bool = parent.hide_constants if parent is not None else True
        """Large NumPy arrays become hidden arguments of the entry (`array_constant`); False:
        printed as constants (`gir.trace`, whose module stands alone)."""
        self.hidden: dict[int, tuple[np.ndarray, np.ndarray, Value]] = {}
        """The entry's frame: id of a closed-over array -> (the array, its copy at trace time,
        the hidden argument standing for it)."""

    @property
    def block(self) -> Block:
        return self.blocks[-1]

    def is_open(self, block: Block) -> bool:
        return block in self.blocks

    def hidden_argument(self, a: np.ndarray, dtype: str) -> Value:
        """The hidden argument of this (entry) frame's function that passes array a: one per
        array object, its values copied now (read at trace time, as a printed constant is)."""
        found = self.hidden.get(id(a))
        if found is None:
            arg = self.function.body.add_arg(TensorType(a.shape, dtype), f"closed{len(self.hidden)}")
            found = self.hidden[id(a)] = (a, np.array(a, copy=True, order="C"), arg)
        return found[2]

    @property
    def hidden_arrays(self) -> tuple[np.ndarray, ...]:
        """What a call passes after the user's arguments, in the order of the hidden arguments."""
        return tuple(copy for _, copy, _ in self.hidden.values())

    def capture(self, outer: Value) -> Value:
        arg = self.captures.get(outer)
        if arg is None:
            arg = self.captures[outer] = self.function.body.add_arg(outer.type, outer.name_hint)
        return arg


def _strict_promotion() -> bool:
    from ...config import current

    return current().promotion == "strict"


_STATE = threading.local()


def current_frame() -> Frame | None:
    stack = getattr(_STATE, "frames", None)
    return stack[-1] if stack else None


@contextmanager
def frame_scope(frame: Frame) -> Iterator[Frame]:
    stack = getattr(_STATE, "frames", None)
    if stack is None:
        stack = _STATE.frames = []
    stack.append(frame)
    try:
        yield frame
    finally:
        stack.pop()
        frame.closed = True


@contextmanager
def block_scope(frame: Frame, block: Block) -> Iterator[Block]:
    """Ops are emitted into `block` inside; if the Python code raises, the block's ops are
    erased so they hold no use of an outer value (a caught error leaves the IR as it was)."""
    frame.blocks.append(block)
    ok = False
    try:
        yield block
        ok = True
    finally:
        frame.blocks.pop()
        if not ok:
            for op in reversed(block.ops):
                erase_op(op)


def need_frame(what: str) -> Frame:
    frame = current_frame()
    if frame is None:
        raise GirTraceError(f"{what} needs a traced function (inside gir.trace / gir.jit)", user_location(2))
    return frame


# -- tracers ------------------------------------------------------------------------------------


class Tracer:
    """A traced tensor; NumPy's operators and methods are in numpy_api.py (installed there)."""

    __slots__ = ("value", "frame", "block", "weak")
    __array_priority__ = 1000

    def __init__(self, value: Value, frame: Frame, block: Block, weak: bool = False):
        self.value = value
        self.frame = frame
        self.block = block
        self.weak = weak
        """A Python scalar argument of the traced function (`lr` in `gir.jit(step)(p, 0.1)`): as in
        JAX, it takes the float dtype of a tensor it meets (`p - lr * g` with f64 `p` is f64)."""

    @property
    def type(self) -> TensorType:
        return self.value.tensor_type

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Tracer<{self.type}>"

    if TYPE_CHECKING:  # installed at run time by numpy_api.py; declared here for the type checker
        def __getattr__(self, name: str) -> Any: ...
        def __getitem__(self, key: Any) -> Any: ...
        def __add__(self, other: Any) -> Any: ...
        def __radd__(self, other: Any) -> Any: ...
        def __sub__(self, other: Any) -> Any: ...
        def __rsub__(self, other: Any) -> Any: ...
        def __mul__(self, other: Any) -> Any: ...
        def __rmul__(self, other: Any) -> Any: ...
        def __truediv__(self, other: Any) -> Any: ...
        def __rtruediv__(self, other: Any) -> Any: ...
        def __floordiv__(self, other: Any) -> Any: ...
        def __rfloordiv__(self, other: Any) -> Any: ...
        def __mod__(self, other: Any) -> Any: ...
        def __rmod__(self, other: Any) -> Any: ...
        def __pow__(self, other: Any) -> Any: ...
        def __rpow__(self, other: Any) -> Any: ...
        def __matmul__(self, other: Any) -> Any: ...
        def __rmatmul__(self, other: Any) -> Any: ...
        def __lt__(self, other: Any) -> Any: ...
        def __le__(self, other: Any) -> Any: ...
        def __gt__(self, other: Any) -> Any: ...
        def __ge__(self, other: Any) -> Any: ...
        def __and__(self, other: Any) -> Any: ...
        def __or__(self, other: Any) -> Any: ...
        def __eq__(self, other: Any) -> Any: ...
        def __ne__(self, other: Any) -> Any: ...
        def __neg__(self) -> Any: ...
        def __invert__(self) -> Any: ...


def wrap(op: Operation, frame: Frame) -> list[Tracer]:
    return [Tracer(r, frame, frame.block) for r in op.results]


def emit(name: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
         declared: Sequence[TensorType] | None = None, regions: Sequence[Region] = (),
         segments: tuple[int, ...] = (), loc: Location | None = None) -> Operation:
    """Builds op `name` (its spec infers and checks the types) into the current block."""
    frame = need_frame(f"'{name}'")
    op = make_op(name, operands, attrs=attrs, regions=regions, loc=loc or user_location(2), declared=declared,
                 segments=segments)
    frame.block.append(op)
    return op


def emit1(name: str, operands: Sequence[Value], **kw: Any) -> Tracer:
    frame = need_frame(f"'{name}'")
    kw.setdefault("loc", user_location(2))
    op = emit(name, operands, **kw)
    return Tracer(op.result, frame, frame.block)


def resolve(t: Tracer, frame: Frame | None = None) -> Value:
    """The Value standing for t in `frame` (the current one): t's own, or a captured argument."""
    frame = frame or need_frame("a traced value")
    if t.frame is frame:
        if not frame.is_open(t.block):
            raise GirTraceError("a value traced inside a gir.scan step is used outside it (a leaked tracer): "
                                "return it from the step as a carry or a stacked value instead", user_location(2))
        return t.value
    if frame.parent is None:
        raise GirTraceError("a traced value from another trace (or one that has finished) is used here: pass it "
                            "as an argument instead", user_location(2))
    return frame.capture(resolve(t, frame.parent))


# -- constants and dtypes -----------------------------------------------------------------------

_DTYPE_ALIASES = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "i1"}


def dtype_of(spec: Any, loc: Location | None = None) -> str:
    """A dtype name from "f32", "float32", np.float32 or np.dtype(...)."""
    if isinstance(spec, str) and spec in DTYPES:
        return spec
    if isinstance(spec, str) and spec in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[spec]
    try:
        return dtype_name(np.dtype(spec))
    except (TypeError, KeyError, ValueError):
        raise GirTraceError(f"unsupported dtype {spec!r}; use one of " + ", ".join(DTYPES)
                            + " (or float32, float64, int32, int64, bool)", loc or user_location(2)) from None


def is_weak(x: Any) -> bool:
    """A Python or NumPy scalar: it takes the dtype of the tensor it is combined with."""
    return isinstance(x, (bool, int, float, np.generic)) and not isinstance(x, np.ndarray)


def default_dtype(x: Any) -> str:
    """The dtype of a weak scalar standing alone (as JAX without x64: f32, i32; an int that
    does not fit 32 bits is i64)."""
    if isinstance(x, (bool, np.bool_)):
        return "i1"
    if isinstance(x, (int, np.integer)):
        return "i32" if -2**31 <= int(x) < 2**31 else "i64"
    return "f32"


def weak_argument_dtype(x: Any) -> str:
    """The dtype a Python scalar argument of a traced function is passed as: the widest of its
    kind (f64, i64), so that `lr = 0.1` meets f64 tensors as 0.1, not as 0.1 rounded to f32;
    it is narrowed to the dtype of any tensor it meets (`_weak_as`) or, standing alone, to
    `default_dtype` (`to_value`)."""
    if isinstance(x, (bool, np.bool_)):
        return "i1"
    return "i64" if isinstance(x, (int, np.integer)) else "f64"


def constant(value: Any, dtype: str, loc: Location | None = None) -> Value:
    loc = loc or user_location(2)
    if isinstance(value, np.generic):
        value = value.item()
    if dtype in INT_DTYPES and isinstance(value, float):
        if not value.is_integer():
            raise GirTraceError(f"the float {value} is used as an {dtype}; convert the tensor with "
                                ".astype(float) first", loc)
        value = int(value)
    if dtype in INT_DTYPES and isinstance(value, int) and not isinstance(value, bool):
        bits = 31 if dtype == "i32" else 63
        if not -2**bits <= value < 2**bits:
            raise GirTraceError(f"the integer {value} does not fit {dtype}; convert the tensor with "
                                ".astype('int64') (or to a float) first", loc)
    if dtype in FLOAT_DTYPES and isinstance(value, int):  # bools too: printed as 1.0, as a float is
        value = float(value)
    if dtype == "i1" and not isinstance(value, bool):
        raise GirTraceError(f"the number {value} is used as an i1 (bool); compare, or convert with .astype "
                            "first", loc)
    return emit("constant", [], attrs={"value": value}, declared=[TensorType((), dtype)], loc=loc).result


HIDDEN_ARGUMENT_ELEMENTS = 1024
"""A NumPy array of more elements than this used inside a traced function (closed over) becomes
a hidden argument of the entry rather than a printed `constant` (issue 30: a 1000x1000 array
printed, parsed and lowered as a constant took 72 s to compile). Smaller ones stay constants,
which the passes may fold and the backends see as literals."""


def array_constant(a: np.ndarray, loc: Location | None = None) -> Value:
    """A NumPy array used inside a traced function, read now (a later change to it is not
    seen, as in JAX): a constant of its dtype (printed in full), or, with more than
    HIDDEN_ARGUMENT_ELEMENTS elements, a hidden argument of the traced entry that each call
    passes a copy taken now (`Frame.hidden_argument`)."""
    loc = loc or user_location(2)
    try:
        dtype = dtype_name(a.dtype)
    except KeyError:
        raise GirTraceError(f"unsupported array dtype {a.dtype}; use float32, float64, int32, int64 or bool",
                            loc) from None
    frame = need_frame("a NumPy array")
    entry = frame
    while entry.parent is not None:
        entry = entry.parent
    if a.size > HIDDEN_ARGUMENT_ELEMENTS and entry.hide_constants:
        arg = entry.hidden_argument(a, dtype)
        return resolve(Tracer(arg, entry, entry.function.body), frame)
    value = a.tolist()
    return emit("constant", [], attrs={"value": value}, declared=[TensorType(a.shape, dtype)], loc=loc).result


def to_value(x: Any, dtype: str | None = None, loc: Location | None = None) -> Value:
    """A Tracer, Python/NumPy scalar (as `dtype`, else its default) or NumPy array as a Value.
    A weak float argument standing alone (no `dtype`) is narrowed to f32, as JAX's weak f32
    (a weak int stays i64: narrowing could wrap it)."""
    if isinstance(x, Tracer):
        if x.weak and dtype is None and x.type.dtype == "f64":
            v = resolve(x)
            return emit("cast", [v], declared=[v.tensor_type.with_dtype("f32")], loc=loc or user_location(2)).result
        return resolve(x)
    loc = loc or user_location(2)
    if is_weak(x):
        return constant(x, dtype or default_dtype(x), loc)
    if isinstance(x, np.ndarray):
        return array_constant(x, loc)
    if isinstance(x, (list, tuple)) and x and all(is_weak(e) or isinstance(e, (list, tuple)) for e in x):
        return array_constant(np.asarray(x, dtype=DTYPES[dtype] if dtype else None), loc)
    raise GirTraceError(f"a {type(x).__name__} cannot be used as a tensor in a traced function", loc)


PROMOTION_ORDER = ("i1", "i32", "i64", "f32", "f64")
"""JAX's type lattice on gir's dtypes, a chain: bool < int32 < int64 < float32 < float64 (JAX
promotes int64 with float32 to float32 as well; NumPy would give float64)."""


def promote(dtypes: Sequence[str]) -> str:
    """The join of strongly typed dtypes on the lattice."""
    return max(dtypes, key=PROMOTION_ORDER.index)


def _kind(dtype: str) -> str:
    """bool, int or float."""
    return "bool" if dtype == "i1" else "int" if dtype in INT_DTYPES else "float"


def _weak_dtype(x: Any) -> str:
    """The dtype of a weak operand: a weak argument's own, a Python scalar's default."""
    return x.type.dtype if isinstance(x, Tracer) else default_dtype(x)


def _is_weak_operand(x: Any) -> bool:
    return (x.weak if isinstance(x, Tracer) else not isinstance(x, np.ndarray) and is_weak(x))


def _strong_dtypes(xs: Sequence[Any]) -> list[str]:
    """The dtypes of the strongly typed operands: tensors that are not weak, NumPy arrays."""
    return ([v.type.dtype for v in xs if isinstance(v, Tracer) and not v.weak]
            + [dtype_name(v.dtype) for v in xs if isinstance(v, np.ndarray) and v.dtype in _KNOWN])


def result_dtype(xs: Sequence[Any]) -> str | None:
    """The dtype operands of one op are promoted to (JAX's weak-type rules): the join of the
    strongly typed ones (tensors, arrays), raised to the default float (f32) by a weak float
    next to integers and to i32 by a weak int next to bools; weak operands alone keep their
    kind (a float one wins) at the widest precision among the weak arguments of that kind, or
    a Python scalar's default (f32, i32)."""
    strong = _strong_dtypes(xs)
    weak = [v for v in xs if _is_weak_operand(v)]
    kinds = {_kind(_weak_dtype(v)) for v in weak}
    if strong:
        d = promote(strong)
        if "float" in kinds and d not in FLOAT_DTYPES:
            return "f32"
        if "int" in kinds and d == "i1":
            return "i32"
        return d
    if not weak:
        return None
    kind = "float" if "float" in kinds else "int" if "int" in kinds else "bool"
    arguments = [v.type.dtype for v in weak if isinstance(v, Tracer) and _kind(v.type.dtype) == kind]
    if arguments:
        return promote(arguments)
    return next(_weak_dtype(v) for v in weak if _kind(_weak_dtype(v)) == kind)


def values_of(xs: Sequence[Any], loc: Location, dtype: str | None = None) -> list[Value]:
    """Operands of one op, promoted to one dtype (`result_dtype`, or `dtype` when given):
    tensors of a lower dtype are cast up, weak scalars take the dtype."""
    dtype = dtype or result_dtype(xs)
    strong = set(_strong_dtypes(xs))
    if len(strong) > 1 and need_frame("a traced value").strict:
        raise GirTraceError(f"tensors of dtypes {', '.join(sorted(strong))} meet under GIR_PROMOTION=strict; "
                            "convert one with .astype", loc)
    out = []
    for x in xs:
        if isinstance(x, Tracer) and x.weak:
            out.append(_weak_as(x, dtype, loc))
            continue
        v = to_value(x, dtype, loc)
        if dtype is not None and v.tensor_type.dtype != dtype and isinstance(x, (Tracer, np.ndarray)):
            v = emit("cast", [v], declared=[v.tensor_type.with_dtype(dtype)], loc=loc).result
        out.append(v)
    return out


def _weak_as(x: Tracer, dtype: str | None, loc: Location) -> Value:
    """A weak scalar argument cast to the dtype of the tensor it meets."""
    v = resolve(x)
    if dtype is None or dtype == x.type.dtype:
        return v
    return emit("cast", [v], declared=[v.tensor_type.with_dtype(dtype)], loc=loc).result


_KNOWN = set(DTYPES.values())


def new_function(name: str, module: Module, arg_types: Sequence[TensorType], arg_names: Sequence[str],
                 loc: Location) -> Function:
    """An empty function named `name` (made unique within the module)."""
    unique, i = name, 1
    while unique in module.functions:
        unique, i = f"{name}_{i}", i + 1
    function = Function(unique, list(arg_types), [], list(arg_names), loc)
    module.add(function)  # reserves the name; `finish_function` moves it after its callees
    return function


def finish_function(function: Function, module: Module, results: Sequence[Value], loc: Location) -> None:
    """Ends `function` with `return results` and puts it last in the module, after the callees
    traced while it was traced (a printed module reads callee-first; the entry is the last)."""
    function.result_types = [v.tensor_type for v in results]
    function.body.append(make_op("return", list(results), loc=loc))
    del module.functions[function.name]
    module.add(function)
