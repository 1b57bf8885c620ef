"""Elementwise kernels for numba.cuda, generated as Python source: one per `fused` op, and one
per elementwise op standing alone (a group of one).

A kernel runs one CUDA thread per output element in a grid-stride loop, so any launch size
covers any number of elements. Arrays are passed flat; an input broadcast to the output's
shape is read at an index made from the output index's coordinates (stride 0 on a broadcast
axis, index 0 for a single element). The group's scalar ops run in order, each result cast
back to its dtype (`f32(...)`) so that a float64 literal or a float64 math result never
widens a float32 computation; literals are written into the source. A fused
`tanh(%x + %b)`, %x: tensor<2x4xf32>, %b: tensor<4xf32>, becomes

    @cuda.jit
    def gir_elementwise(n, out0, in0, in1):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            c1 = i % 4
            x0 = in0[i]
            x1 = in1[c1]
            v0 = f32(x0 + x1)
            v1 = f32(math.tanh(v0))
            out0[i] = v1

The same source runs on a GPU (compiled by numba.cuda to PTX) and in the simulator (as Python,
where every value is a NumPy scalar, so arithmetic has NumPy's semantics). Math that raises in
Python where CUDA gives inf or nan is guarded: `exp` above 709, `log` of 0 or a negative,
`sqrt` of a negative. Integer division by zero stores the kernel's `code` (plus the site's
number) in `err[0]` and gives 0; the runtime raises a GirError after the call, at the op.

Kernels are compiled once per process and cached by their source text, which is determined by
the group's printed body, shapes and dtypes: groups that print alike share one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import GirError
from ...ir import scalar
from ...ir.core import Operation, Value
from ...ir.types import FLOAT_DTYPES, TensorType
from .device import SIMULATOR_LAUNCHES, Device

INDENT = " " * 8
"""Statements of the body sit inside `def` and the grid-stride `for`."""


@dataclass(eq=False)
class KernelSource:
    """A generated kernel, before compiling."""

    text: str
    """Python source defining `gir_elementwise` with @cuda.jit."""
    signature: str
    """The numba type signature of its launches: `void(int64, float32[::1], ...)`."""
    error_sites: list[tuple[str, Operation]] = field(default_factory=list)
    """Site k (err[0] = code + k) -> (message, op). Empty: the kernel takes no err, code."""


@dataclass(eq=False)
class ElementwiseKernel:
    source: KernelSource
    kernel: Any
    """The numba.cuda kernel (compiled for its argument types on the first launch)."""

    @property
    def error_sites(self) -> list[tuple[str, Operation]]:
        return self.source.error_sites

    def launch(self, dev: Device, n: int, args: Sequence[Any]) -> None:
        if not n:
            return
        if dev.simulated:
            with SIMULATOR_LAUNCHES:  # the simulator's launches share process state (device.py)
                self.kernel[dev.launch_shape(n)](n, *args)
        else:
            self.kernel[dev.launch_shape(n)](n, *args)


# ---------------------------------------------------------------------------------------------
# Scalar code: op kind -> a Python expression over the operands' names


def _wrap(dtype: str, expr: str) -> str:
    """expr cast to dtype (booleans need no cast)."""
    return expr if dtype == "i1" else f"{dtype}({expr})"


def literal(value: Any, dtype: str) -> str:
    if dtype == "i1":
        return "True" if value else "False"
    if dtype in FLOAT_DTYPES:
        v = float(value)
        if math.isnan(v):
            return f"{dtype}(NAN)"
        if math.isinf(v):
            return f"{dtype}(INF)" if v > 0 else f"{dtype}(-INF)"
        return f"{dtype}({v!r})"
    return f"{dtype}({int(value)})"


@dataclass
class Scalar:
    """Where one element of an op is computed: what the primitive emitters see."""

    source: _Source
    op: Operation
    dtype: str
    """The compute dtype (ir/scalar.py): of the literals and of the primitives' operands."""

    def literal(self, value: float) -> str:
        return literal(value, self.dtype)

    def primitive(self, name: str, args: list[str]) -> str:
        return PRIMITIVES[name](self, args)


def _binary(symbol: str) -> Callable[[Scalar, list[str]], str]:
    return lambda s, a: _wrap(s.dtype, f"{a[0]} {symbol} {a[1]}")


def _compare(symbol: str) -> Callable[[Scalar, list[str]], str]:
    return lambda s, a: f"({a[0]} {symbol} {a[1]})"


def _floordiv(s: Scalar, a: list[str]) -> str:
    """Floor division; a zero divisor records an error (and gives 0) instead of trapping."""
    src = s.source
    site = len(src.error_sites)
    src.error_sites.append(("integer division by zero", s.op))
    name = src.temporary()
    x, y = a
    src.emit(f"if {y} == 0:")
    src.emit(f"    err[0] = code + {site}")
    src.emit(f"    {name} = {literal(0, s.dtype)}")
    src.emit("else:")
    src.emit(f"    {name} = {s.dtype}({x} // {y})")
    return name


def _cast(s: Scalar, a: list[str]) -> str:
    src, dst = s.dtype, s.op.result.tensor_type.dtype
    if src == dst:
        return a[0]
    if dst == "i1":
        return f"({a[0]} != 0)"
    if src == "i1":
        return f"({literal(1, dst)} if {a[0]} else {literal(0, dst)})"
    return f"{dst}({a[0]})"  # float -> int truncates; int -> int wraps


PRIMITIVES: dict[str, Callable[[Scalar, list[str]], str]] = {
    "add": _binary("+"),
    "sub": _binary("-"),
    "mul": _binary("*"),
    "div": _binary("/"),
    "pow": _binary("**"),
    "neg": lambda s, a: _wrap(s.dtype, f"-{a[0]}"),
    "floordiv": _floordiv,
    **{name: _compare(symbol) for name, symbol in zip(scalar.COMPARISONS, ("<", "<=", ">", ">=", "==", "!="))},
    "and": lambda s, a: f"({a[0]} and {a[1]})",
    "or": lambda s, a: f"({a[0]} or {a[1]})",
    "select": lambda s, a: f"({a[1]} if {a[0]} else {a[2]})",
    # Python's math raises where CUDA gives inf or nan: guard those arguments.
    "exp": lambda s, a: f"({literal(math.inf, s.dtype)} if {a[0]} > 709.0 else {s.dtype}(math.exp({a[0]})))",
    "log": lambda s, a: (f"({s.dtype}(math.log({a[0]})) if {a[0]} > 0 else {literal(-math.inf, s.dtype)} "
                         f"if {a[0]} == 0 else {literal(math.nan, s.dtype)})"),
    "sqrt": lambda s, a: f"({s.dtype}(math.sqrt({a[0]})) if {a[0]} >= 0 else {literal(math.nan, s.dtype)})",
    "tanh": lambda s, a: f"{s.dtype}(math.tanh({a[0]}))",
    "abs": lambda s, a: _wrap(s.dtype, f"abs({a[0]})"),
    "cast": _cast,
}
"""ir/scalar.py's primitive -> its Python expression (statements, for floordiv)."""


# ---------------------------------------------------------------------------------------------
# Source generation


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _bcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Per output axis, the input's stride (0 where the input is broadcast)."""
    lead = len(out_shape) - len(shape)
    return [0] * lead + [0 if d == 1 else s for d, s in zip(shape, _strides(shape))]


class _Source:
    def __init__(self, out_shape: tuple[int, ...]):
        self.out_shape = out_shape
        self.lines: list[str] = []
        self.names: dict[Value, str] = {}
        self.error_sites: list[tuple[str, Operation]] = []
        self.coords: set[int] = set()
        self.count = 0

    def emit(self, line: str) -> None:
        self.lines.append(INDENT + line)

    def index(self, t: TensorType) -> str:
        shape = tuple(t.shape)
        if shape == self.out_shape:
            return "i"
        if math.prod(shape) == 1:  # type: ignore[arg-type]
            return "0"
        terms = []
        for axis, stride in enumerate(_bcast_strides(shape, self.out_shape)):  # type: ignore[arg-type]
            if stride:
                self.coords.add(axis)
                terms.append(f"c{axis}" if stride == 1 else f"c{axis} * {stride}")
        return " + ".join(terms)

    def coordinate_lines(self) -> list[str]:
        strides = _strides(self.out_shape)
        lines = []
        for axis in sorted(self.coords):
            div = f"i // {strides[axis]}" if strides[axis] != 1 else "i"
            lines.append(f"{INDENT}c{axis} = {div}" + (f" % {self.out_shape[axis]}" if axis else ""))
        return lines

    def op(self, op: Operation) -> None:
        t = op.result.tensor_type
        name = f"v{self.count}"
        self.count += 1
        if op.spec.splat is not None:  # a constant copied into the group: one scalar
            value = op.spec.splat(op)
            if value is None:
                raise GirError(f"the GPU backend has no scalar for '{op.name}' (not one value for every element)",
                               op.loc)
            self.emit(f"{name} = {literal(value, t.dtype)}")
            self.names[op.result] = name
            return
        semantics = op.spec.scalar
        dtype = semantics.compute_dtype(op) if semantics is not None else t.dtype
        expr = semantics.expr(dtype) if semantics is not None else None
        if expr is None:
            raise GirError(f"the GPU backend has no kernel code for '{op.name}' on {dtype}", op.loc)
        element = Scalar(self, op, dtype)
        value = scalar.build(expr, [self.names[v] for v in op.operands], element.literal, element.primitive)
        self.names[op.result] = name
        self.emit(f"{name} = {value}")

    def temporary(self) -> str:
        """A fresh name for a value a primitive computes in statements."""
        self.count += 1
        return f"v{self.count - 1}"


NUMBA_TYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "i1": "boolean"}


def generate(inputs: Sequence[Value], ops: Sequence[Operation], outputs: Sequence[Value],
             out_shape: tuple[int, ...]) -> KernelSource:
    """The kernel for ops (in order) reading inputs and writing outputs, all of out_shape but
    the inputs, which broadcast."""
    src = _Source(out_shape)
    for k, v in enumerate(inputs):
        src.names[v] = f"x{k}"
    reads = [f"{INDENT}x{k} = in{k}[{src.index(v.tensor_type)}]" for k, v in enumerate(inputs)]
    for op in ops:
        src.op(op)
    writes = [f"{INDENT}out{k}[i] = {src.names[v]}" for k, v in enumerate(outputs)]
    params = ["n"] + [f"out{k}" for k in range(len(outputs))] + [f"in{k}" for k in range(len(inputs))]
    types = ["int64"] + [NUMBA_TYPES[v.tensor_type.dtype] + "[::1]" for v in [*outputs, *inputs]]
    if src.error_sites:
        params += ["err", "code"]
        types += ["int32[::1]", "int64"]
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):"]
    body = src.coordinate_lines() + reads + src.lines + writes or [INDENT + "pass"]
    return KernelSource("\n".join(head + body) + "\n", f"void({', '.join(types)})", src.error_sites)


def fused_source(op: Operation) -> KernelSource:
    """The kernel of a `fused` op: its body's ops, its inputs, the values it yields."""
    body = op.body
    term = body.terminator
    assert term is not None
    ops = [inner for inner in body if inner is not term]
    out_shape = tuple(op.results[0].tensor_type.shape) if op.results else ()
    return generate(body.args, ops, list(term.operands), out_shape)  # type: ignore[arg-type]


def op_source(op: Operation) -> KernelSource:
    """The kernel of an elementwise op outside any fused group."""
    inputs = list(dict.fromkeys(op.operands))  # `mul %a, %a` reads one input
    return generate(inputs, [op], [op.result], tuple(op.result.tensor_type.shape))  # type: ignore[arg-type]


_CACHE: dict[str, Any] = {}
"""Kernel source -> compiled kernel, for the whole process."""


def _define(cuda: Any, source: str) -> Any:
    """Runs the source (its @cuda.jit makes the kernel); returns the kernel."""
    namespace: dict[str, Any] = {"cuda": cuda, "math": math, "INF": math.inf, "NAN": math.nan,
                                 "f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}
    exec(compile(source, "<gir elementwise kernel>", "exec"), namespace)
    return namespace["gir_elementwise"]


def compile_kernel(dev: Device, ks: KernelSource) -> ElementwiseKernel:
    kernel = _CACHE.get(ks.text)
    if kernel is None:
        kernel = _CACHE[ks.text] = _define(dev.cuda, ks.text)
    return ElementwiseKernel(ks, kernel)


def cached_kernels() -> int:
    """How many distinct kernels this process has compiled."""
    return len(_CACHE)


def ptx(ks: KernelSource, cc: tuple[int, int] = (8, 0)) -> str:
    """The kernel's PTX from numba.cuda's compiler, which needs NVVM (numba-cuda[cu12]) but no
    GPU: a check of generated code where only the simulator can run it (not in the simulator)."""
    from numba import cuda

    code, _ = cuda.compile_ptx(_define(cuda, ks.text).py_func, ks.signature, cc=cc)
    return code
