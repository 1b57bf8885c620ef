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

import linecache
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import numpy as np

from ...errors import UNKNOWN, GirTypeError, Location, remember_source
from ...ir.core import Block, Function, Module, Operation, Region, Value, erase_op
from ...ir.ops import make_op
from ...ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType, dtype_name

_HERE = os.path.dirname(os.path.abspath(__file__))
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
        positions = _POSITIONS[code] = list(code.co_positions())
    index = frame.f_lasti // 2
    if 0 <= index < len(positions):
        start_line, _, start_col, _ = positions[index]
        if start_line == line and start_col is not None:
            col = start_col + 1
    return Location(code.co_filename, line, col)


def function_location(fn: Any) -> Location:
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

    @property
    def block(self) -> Block:
        return self.blocks[-1]

    def is_open(self, block: Block) -> bool:
        return block in self.blocks

    def capture(self, outer: Value) -> Value:
        arg = self.captures.get(outer)
        if arg is None:
            arg = self.captures[outer] = self.function.body.add_arg(outer.type, outer.name_hint)
        return arg


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
    """The dtype of a weak scalar standing alone (as JAX without x64: f32, i32)."""
    if isinstance(x, (bool, np.bool_)):
        return "i1"
    if isinstance(x, (int, np.integer)):
        return "i32"
    return "f32"


def constant(value: Any, dtype: str, loc: Location | None = None) -> Value:
    loc = loc or user_location(2)
    if isinstance(value, np.generic):
        value = value.item()
    if dtype in INT_DTYPES and isinstance(value, float):
        if not value.is_integer():
            raise GirTraceError(f"the float {value} is combined with an {dtype} tensor; cast one of them "
                                "(x.astype(...)) first", loc)
        value = int(value)
    if dtype in FLOAT_DTYPES and isinstance(value, int):  # bools too: printed as 1.0, as a float is
        value = float(value)
    if dtype == "i1" and not isinstance(value, bool):
        raise GirTraceError(f"the number {value} is combined with an i1 (bool) tensor; compare or cast first", loc)
    return emit("constant", [], attrs={"value": value}, declared=[TensorType((), dtype)], loc=loc).result


def array_constant(a: np.ndarray, loc: Location | None = None) -> Value:
    """A NumPy array used inside a traced function: a constant of its dtype (printed in full)."""
    loc = loc or user_location(2)
    try:
        dtype = dtype_name(a.dtype)
    except KeyError:
        raise GirTraceError(f"unsupported array dtype {a.dtype}; use float32, float64, int32, int64 or bool",
                            loc) from None
    value = a.tolist()
    return emit("constant", [], attrs={"value": value}, declared=[TensorType(a.shape, dtype)], loc=loc).result


def to_value(x: Any, dtype: str | None = None, loc: Location | None = None) -> Value:
    """A Tracer, Python/NumPy scalar (as `dtype`, else its default) or NumPy array as a Value."""
    if isinstance(x, Tracer):
        return resolve(x)
    loc = loc or user_location(2)
    if is_weak(x):
        return constant(x, dtype or default_dtype(x), loc)
    if isinstance(x, np.ndarray):
        return array_constant(x, loc)
    if isinstance(x, (list, tuple)) and x and all(is_weak(e) or isinstance(e, (list, tuple)) for e in x):
        return array_constant(np.asarray(x, dtype=DTYPES[dtype] if dtype else None), loc)
    raise GirTraceError(f"a {type(x).__name__} cannot be used as a tensor in a traced function", loc)


def values_of(xs: Sequence[Any], loc: Location) -> list[Value]:
    """Operands of one op: weak scalars take the dtype of the first (strong) tensor among them."""
    dtype = next((v.type.dtype for v in xs if isinstance(v, Tracer) and not v.weak), None)
    if dtype is None:
        dtype = next((dtype_name(v.dtype) for v in xs if isinstance(v, np.ndarray) and v.dtype in _KNOWN), None)
    if dtype is None:  # weak scalars only: a float one wins (`n / lr` is a float, as in JAX)
        weak = [v.type.dtype for v in xs if isinstance(v, Tracer)]
        dtype = next((d for d in weak if d in FLOAT_DTYPES), weak[0] if weak else None)
    return [_weak_as(x, dtype, loc) if isinstance(x, Tracer) and x.weak else to_value(x, dtype, loc) for x in xs]


def _weak_as(x: Tracer, dtype: str | None, loc: Location) -> Value:
    """A weak scalar argument cast to the dtype of the tensor it meets: a float to a wider or
    narrower float, an int to any int or float (JAX's weak types); otherwise kept as it is
    (the op's type rule then reports the mismatch)."""
    have = x.type.dtype
    if dtype is None or dtype == have or dtype == "i1":
        return resolve(x)
    if have in FLOAT_DTYPES and dtype not in FLOAT_DTYPES:
        return resolve(x)
    v = resolve(x)
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
