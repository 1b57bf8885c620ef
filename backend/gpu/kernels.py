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
from .device import Device

INDENT = " " * 8
"""Statements of the body sit inside `def` and the grid-stride `for`."""


@dataclass(frozen=True)
class InputLayout:
    """Where an input's elements sit in the flat buffer the kernel is given, when that buffer
    is not the input itself: a strided view (a column slice of a GEMM result), read in place
    instead of copied out first (codegen's absorbed slices). Element i of the input, at
    coordinates (k0, k1, ...), is buffer[offset + k0 * strides[0] + k1 * strides[1] + ...]."""

    offset: int
    strides: tuple[int, ...]
    """Per axis of the input, in elements of the buffer."""


@dataclass(eq=False)
class KernelSource:
    """A generated kernel, before compiling."""

    text: str
    """Python source defining `gir_elementwise` with @cuda.jit."""
    signature: str
    """The numba type signature of its launches: `void(int64, float32[::1], ...)`."""
    error_sites: list[tuple[str, Operation]] = field(default_factory=list)
    """Site k (err[0] = code + k) -> (message, op). Empty: the kernel takes no err, code."""
    single_block: bool = False
    """Launched as one block (a whole-array reduction: ReductionRead.whole)."""
    row_blocks: bool = False
    """A row kernel (row_source): launched with n = the rows, a block per row (at most
    max_blocks, striding over the rest) of up to SHARED threads."""


@dataclass(eq=False)
class ElementwiseKernel:
    source: KernelSource
    kernel: Any
    """The numba.cuda kernel (compiled for its argument types on the first launch)."""

    @property
    def error_sites(self) -> list[tuple[str, Operation]]:
        return self.source.error_sites

    def launch(self, dev: Device, n: int, args: Sequence[Any]) -> None:
        if not n and not self.source.single_block:
            return
        threads = min(dev.threads_per_block, SHARED)
        shape = ((1, threads) if self.source.single_block else (min(n, dev.max_blocks), threads)
                 if self.source.row_blocks else dev.launch_shape(n))
        dev.launch(self.kernel, shape, (n, *args))


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
    # math.sin of an infinity raises where CUDA gives nan: guard it (a nan passes through).
    "sin": lambda s, a: f"({s.dtype}(math.sin({a[0]})) if abs({a[0]}) != math.inf else {literal(math.nan, s.dtype)})",
    "cos": lambda s, a: f"({s.dtype}(math.cos({a[0]})) if abs({a[0]}) != math.inf else {literal(math.nan, s.dtype)})",
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

    def index(self, t: TensorType, layout: InputLayout | None = None) -> str:
        shape = tuple(t.shape)
        if layout is not None:
            return self.strided_index(shape, layout)  # type: ignore[arg-type]
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

    def strided_index(self, shape: tuple[int, ...], layout: InputLayout) -> str:
        """The buffer index of the element the output index reads, for an input laid out by
        layout (its axes aligned to the output's from the right; size-1 axes broadcast)."""
        lead = len(self.out_shape) - len(shape)
        terms = [str(layout.offset)] if layout.offset else []
        for axis, (d, stride) in enumerate(zip(shape, layout.strides)):
            if d != 1 and stride:
                self.coords.add(lead + axis)
                terms.append(f"c{lead + axis}" if stride == 1 else f"c{lead + axis} * {stride}")
        return " + ".join(terms) or "0"

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
        code = scalar.build(expr, [self.names[v] for v in op.operands], element.literal, element.primitive)
        self.names[op.result] = name
        self.emit(f"{name} = {code}")

    def temporary(self) -> str:
        """A fresh name for a value a primitive computes in statements."""
        self.count += 1
        return f"v{self.count - 1}"


NUMBA_TYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "i1": "boolean"}


@dataclass(frozen=True)
class ReductionRead:
    """Input k of a kernel is a reduction computed in the kernel (codegen's fused reductions):
    the sum (or mean) over the leading axes of the buffer the kernel is given for it, an
    operand of `rows` x `columns` elements (C order, or 2-D through `layout`). Output element
    i reads the sum of column i. With `columns == 1` (a reduction to one element) the whole
    block sums (a shared-memory tree) and thread 0 runs the rest of the kernel."""

    rows: int
    columns: int
    mean: bool = False
    layout: InputLayout | None = None

    @property
    def whole(self) -> bool:
        return self.columns == 1


SHARED = 256
"""Threads (and shared-memory slots) of a whole-array reduction's one block, at most: a power
of two, as the tree needs (Device.threads_per_block is 256 on a GPU, 4 in the simulator)."""

MAX_WHOLE_READS = 8
"""Whole-array reductions one kernel folds, at most: each takes SHARED slots of shared memory
(8 x 256 x 8 bytes = 16 KiB, well under the 48 KiB a block may declare statically)."""


def _scale(k: int, red: ReductionRead, dtype: str) -> list[str]:
    return [f"x{k} = {dtype}(x{k} / {dtype}({red.rows}))"] if red.mean else []


def _column_sums(sums: Sequence[tuple[int, ReductionRead, str]]) -> list[str]:
    """The statements giving each x{k} (k, its reduction, its dtype) as its column's sum, in the
    grid-stride loop: one `for r` loop per row count, adding every column sum of that count
    (a backward step's bias gradients: one loop instead of one each, which numba types and
    lowers in a fraction of the time; each sum still runs over r in order, so the bits are
    the same as one loop each)."""
    lines: list[str] = []
    for rows in dict.fromkeys(red.rows for _, red, _ in sums):
        group = [(k, red, dtype) for k, red, dtype in sums if red.rows == rows]
        lines += [f"x{k} = {dtype}(0)" for k, _, dtype in group] + [f"for r in range({rows}):"]
        for k, red, dtype in group:
            lay = red.layout
            at = (f"r * {red.columns} + i" if lay is None
                  else f"{lay.offset} + r * {lay.strides[0]} + i * {lay.strides[1]}")
            lines.append(f"    x{k} = {dtype}(x{k} + in{k}[{at}])")
        lines += [line for k, red, dtype in group for line in _scale(k, red, dtype)]
    return lines


def _whole_head(k: int, red: ReductionRead, dtype: str) -> list[str]:
    """A one-block kernel's sum of in{k} into sm{k}[0] (a tree over the block's threads). Each
    whole reduction has its own shared array: a kernel may fold several (`sum(a) + mean(b)`),
    and each tree's total must outlive the trees after it (its accumulator is its own too: the
    trees' dtypes may differ, and a numba variable has one type)."""
    return [f"    sm{k} = cuda.shared.array({SHARED}, {dtype})", "    t = cuda.threadIdx.x",
            f"    acc{k} = {dtype}(0)", f"    for r in range(t, {red.rows}, cuda.blockDim.x):",
            f"        acc{k} = {dtype}(acc{k} + in{k}[r])", f"    sm{k}[t] = acc{k}", "    cuda.syncthreads()",
            "    s = cuda.blockDim.x // 2", "    while s > 0:", "        if t < s:",
            f"            sm{k}[t] = {dtype}(sm{k}[t] + sm{k}[t + s])", "        cuda.syncthreads()", "        s //= 2"]


def _part_lines(src: _Source, inputs: Sequence[Value], ops: Sequence[Operation], outputs: Sequence[Value],
                layouts: dict[int, InputLayout], out_layouts: dict[int, InputLayout],
                reductions: dict[int, ReductionRead], in_base: int = 0, out_base: int = 0,
                given: dict[int, str] | None = None) -> tuple[list[str], list[str]]:
    """(reads, writes) of one group of ops in src (its statements go to src.lines): input k
    is parameter in{in_base + k} (or the expression given[k]: a total computed elsewhere),
    output k parameter out{out_base + k}."""
    given = given or {}
    for k, v in enumerate(inputs):
        src.names[v] = f"x{in_base + k}"
    reads: list[str] = []
    sums: list[tuple[int, ReductionRead, str]] = []
    for k, v in enumerate(inputs):
        name, dtype = f"x{in_base + k}", v.tensor_type.dtype
        if k in given:
            reads.append(f"{INDENT}{name} = {given[k]}")
        elif k in reductions and reductions[k].whole:
            reads += [f"{INDENT}{name} = sm{in_base + k}[0]",
                      *(INDENT + line for line in _scale(in_base + k, reductions[k], dtype))]
        elif k in reductions:
            sums.append((in_base + k, reductions[k], dtype))
        else:
            reads.append(f"{INDENT}{name} = in{in_base + k}[{src.index(v.tensor_type, layouts.get(k))}]")
    reads += [INDENT + line for line in _column_sums(sums)]
    for op in ops:
        src.op(op)
    at = [src.strided_index(src.out_shape, out_layouts[k]) if k in out_layouts else "i" for k in range(len(outputs))]
    writes = [f"{INDENT}out{out_base + k}[{at[k]}] = {src.names[v]}" for k, v in enumerate(outputs)]
    return reads, writes


def _signature(outputs: Sequence[Value], inputs: Sequence[Value], errors: bool) -> tuple[list[str], list[str]]:
    """(parameter names, numba types): n, the outputs, the inputs, then err and code if errors."""
    params = ["n"] + [f"out{k}" for k in range(len(outputs))] + [f"in{k}" for k in range(len(inputs))]
    types = ["int64"] + [NUMBA_TYPES[v.tensor_type.dtype] + "[::1]" for v in [*outputs, *inputs]]
    if errors:
        params += ["err", "code"]
        types += ["int32[::1]", "int64"]
    return params, types


def generate(inputs: Sequence[Value], ops: Sequence[Operation], outputs: Sequence[Value],
             out_shape: tuple[int, ...], layouts: dict[int, InputLayout] | None = None,
             out_layouts: dict[int, InputLayout] | None = None,
             reductions: dict[int, ReductionRead] | None = None) -> KernelSource:
    """The kernel for ops (in order) reading inputs and writing outputs, all of out_shape but
    the inputs, which broadcast; input k is read through layouts[k] where given (a strided
    view of the buffer it is launched with), else it is its own flat buffer; output k likewise
    written through out_layouts[k] (a piece of a concat written in place); input k is
    reductions[k] computed from its buffer where given (whole-array reductions: one block, a
    tree each, at most MAX_WHOLE_READS)."""
    src = _Source(out_shape)
    reductions = reductions or {}
    reads, writes = _part_lines(src, inputs, ops, outputs, layouts or {}, out_layouts or {}, reductions)
    params, types = _signature(outputs, inputs, bool(src.error_sites))
    whole = [(k, r) for k, r in reductions.items() if r.whole]
    trees = [line for k, r in whole for line in _whole_head(k, r, inputs[k].tensor_type.dtype)]
    loop = (trees + ["    if t == 0:", "        i = 0"] if whole
            else ["    for i in range(cuda.grid(1), n, cuda.gridsize(1)):"])
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):", *loop]
    body = src.coordinate_lines() + reads + src.lines + writes or [INDENT + "pass"]
    return KernelSource("\n".join(head + body) + "\n", f"void({', '.join(types)})", src.error_sites,
                        single_block=bool(whole))


def chain_source(parts: Sequence[KernelPart], links: Sequence[dict[int, tuple[int, int]]]) -> KernelSource:
    """One kernel for `fused` ops of one shape where a later one reads results of earlier ones
    at the same index (codegen's chains: the groups of a backward step): per thread, each part
    in turn, a linked operand (links[p][k] = (earlier part, its yielded value)) taken from the
    earlier part's register rather than from memory."""
    first = parts[0].op
    src = _Source(tuple(first.results[0].tensor_type.shape))  # type: ignore[arg-type]
    body_lines: list[str] = []
    writes: list[str] = []
    all_in: list[Value] = []
    all_out: list[Value] = []
    yielded_names: list[list[str]] = []
    for part, link in zip(parts, links):
        body, term = part.op.body, part.op.body.terminator
        assert term is not None
        yielded = list(term.operands)
        outputs = yielded if part.repeat is None else [yielded[k] for k in part.repeat]
        given = {k: yielded_names[j][y] for k, (j, y) in link.items()}
        start = len(src.lines)
        reads, part_writes = _part_lines(src, body.args, [o for o in body if o is not term], outputs, part.layouts,
                                         part.out_layouts, part.reductions, len(all_in), len(all_out), given)
        body_lines += reads + src.lines[start:]
        writes += part_writes
        yielded_names.append([src.names[v] for v in yielded])
        all_in += body.args
        all_out += outputs
    params, types = _signature(all_out, all_in, bool(src.error_sites))
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):"]
    return KernelSource("\n".join(head + src.coordinate_lines() + body_lines + writes) + "\n",
                        f"void({', '.join(types)})", src.error_sites)


def ranges_source(parts: Sequence[KernelPart]) -> KernelSource:
    """One kernel for independent `fused` ops of different shapes (codegen's runs: a backward
    step's `dh` sum and its bias-gradient accumulations): the grid-stride loop runs over the
    largest, and each part works on the indices below its own size."""
    error_sites: list[tuple[str, Operation]] = []
    count = 0
    lines: list[str] = []
    all_in: list[Value] = []
    all_out: list[Value] = []
    for part in parts:
        shape, outputs, code, count = _part_code(part, error_sites, count, len(all_in), len(all_out))
        lines.append(f"{INDENT}if i < {math.prod(shape)}:")
        lines += ["    " + line for line in code]
        all_in += part.op.body.args
        all_out += outputs
    params, types = _signature(all_out, all_in, bool(error_sites))
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):"]
    return KernelSource("\n".join(head + lines) + "\n", f"void({', '.join(types)})", error_sites)


@dataclass(frozen=True)
class GridTotal:
    """A kernel that also sums one of its values over the whole grid and then runs a second,
    one-element group on the total (codegen's `loss + sum(h * h)` after the step's group):
    each thread sums its elements, each block its threads (a shared-memory tree), the blocks
    add theirs into `acc` atomically, and the last block to finish (an atomic count) runs the
    second group and resets acc and count for the next launch. The order of the blocks'
    additions varies: the total may differ in its last bits from launch to launch."""

    value: Value
    """The first group's value summed (a yielded value)."""
    rows: int
    mean: bool
    then: KernelPart
    """The second group (one element)."""
    operand: int
    """The second group's operand that is the total."""


def _total_tail(dtype: str, after: list[str]) -> list[str]:
    """After the grid-stride loop: the block's tree, the atomic sum, the last block's `after`."""
    return ["    t = cuda.threadIdx.x", "    sm[t] = part", "    cuda.syncthreads()",
            "    s = cuda.blockDim.x // 2", "    while s > 0:", "        if t < s:",
            f"            sm[t] = {dtype}(sm[t] + sm[t + s])", "        cuda.syncthreads()", "        s //= 2",
            "    if t == 0:", "        cuda.atomic.add(acc, 0, sm[0])", "        cuda.threadfence()",
            "        if cuda.atomic.add(count, 0, 1) == cuda.gridDim.x - 1:",
            f"            total = cuda.atomic.add(acc, 0, {dtype}(0))",
            f"            acc[0] = {dtype}(0)", "            count[0] = 0", "            i = 0",
            *("    " + line for line in after)]


def total_source(first: KernelPart, total: GridTotal) -> KernelSource:
    """One kernel for `first` and a one-element group on the grid-wide sum of one of its values."""
    body, term = first.op.body, first.op.body.terminator
    assert term is not None
    ops = [inner for inner in body if inner is not term]
    yielded = list(term.operands)
    outputs = yielded if first.repeat is None else [yielded[k] for k in first.repeat]
    src = _Source(tuple(first.op.results[0].tensor_type.shape))  # type: ignore[arg-type]
    reads, writes = _part_lines(src, body.args, ops, outputs, first.layouts, first.out_layouts, first.reductions)
    dtype = total.value.tensor_type.dtype
    summed = src.names[total.value]
    second, term2 = total.then.op.body, total.then.op.body.terminator
    assert term2 is not None
    src2 = _Source(tuple(total.then.op.results[0].tensor_type.shape))  # type: ignore[arg-type]
    src2.error_sites, src2.count = src.error_sites, src.count  # one numbering of sites and names
    scaled = f"{dtype}(total / {dtype}({total.rows}))" if total.mean else "total"
    yielded2 = list(term2.operands)
    outputs2 = yielded2 if total.then.repeat is None else [yielded2[k] for k in total.then.repeat]
    reads2, writes2 = _part_lines(src2, second.args, [o for o in second if o is not term2], outputs2,
                                  total.then.layouts, total.then.out_layouts, {}, len(body.args), len(outputs),
                                  {total.operand: scaled})
    params, types = _signature([*outputs, *outputs2], [*body.args, *second.args], bool(src.error_sites))
    params += ["acc", "count"]
    types += [NUMBA_TYPES[dtype] + "[::1]", "int32[::1]"]
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):",
            f"    sm = cuda.shared.array({SHARED}, {dtype})", f"    part = {dtype}(0)",
            "    for i in range(cuda.grid(1), n, cuda.gridsize(1)):"]
    loop = src.coordinate_lines() + reads + src.lines + writes + [f"{INDENT}part = {dtype}(part + {summed})"]
    tail = _total_tail(dtype, src2.coordinate_lines() + reads2 + src2.lines + writes2)
    return KernelSource("\n".join(head + loop + tail) + "\n", f"void({', '.join(types)})", src.error_sites)


@dataclass(frozen=True)
class KernelPart:
    """One `fused` op of a kernel, and how its operands and results are read and written
    (each dict keyed by the op's own operand or output-parameter index)."""

    op: Operation
    layouts: dict[int, InputLayout] = field(default_factory=dict)
    out_layouts: dict[int, InputLayout] = field(default_factory=dict)
    reductions: dict[int, ReductionRead] = field(default_factory=dict)
    repeat: tuple[int, ...] | None = None
    """Which result each output parameter stores (a result stored twice: a piece of two
    concats); None: each result once, in order."""


def _part_code(part: KernelPart, error_sites: list[tuple[str, Operation]], count: int, n_in: int, n_out: int
               ) -> tuple[tuple[int, ...], list[Value], list[str], int]:
    """The lines computing one part for output index `i` (its coordinates, reads, scalar ops and
    writes), its inputs numbered from n_in and outputs from n_out, its error sites and names
    numbered on from count (one numbering per kernel): (its shape, the values it stores, the
    lines, the next count)."""
    body, term = part.op.body, part.op.body.terminator
    assert term is not None
    shape = tuple(part.op.results[0].tensor_type.shape)
    src = _Source(shape)  # type: ignore[arg-type]
    src.error_sites, src.count = error_sites, count
    yielded = list(term.operands)
    outputs = yielded if part.repeat is None else [yielded[k] for k in part.repeat]
    reads, writes = _part_lines(src, body.args, [o for o in body if o is not term], outputs, part.layouts,
                                part.out_layouts, part.reductions, n_in, n_out)
    return shape, outputs, src.coordinate_lines() + reads + src.lines + writes, src.count  # type: ignore[return-value]


def fused_source(op: Operation, layouts: dict[int, InputLayout] | None = None,
                 out_layouts: dict[int, InputLayout] | None = None,
                 reductions: dict[int, ReductionRead] | None = None, repeat: Sequence[int] | None = None
                 ) -> KernelSource:
    """The kernel of a `fused` op: its body's ops, its inputs (operand k read through
    layouts[k] where given), the values it yields (result k written through out_layouts[k])."""
    return fused_group_source([KernelPart(op, layouts or {}, out_layouts or {}, reductions or {},
                                          None if repeat is None else tuple(repeat))])


def fused_group_source(parts: Sequence[KernelPart]) -> KernelSource:
    """One kernel for several `fused` ops of one shape, none reading another's results (a run
    codegen merges: one launch instead of several): their bodies one after the other, their
    inputs and outputs side by side."""
    args: list[Value] = []
    ops: list[Operation] = []
    outputs: list[Value] = []
    layouts: dict[int, InputLayout] = {}
    out_layouts: dict[int, InputLayout] = {}
    reductions: dict[int, ReductionRead] = {}
    for part in parts:
        body = part.op.body
        term = body.terminator
        assert term is not None
        base_in, base_out = len(args), len(outputs)
        args += body.args
        ops += [inner for inner in body if inner is not term]
        yielded = list(term.operands)
        outputs += yielded if part.repeat is None else [yielded[k] for k in part.repeat]  # a value stored twice
        layouts.update({base_in + k: v for k, v in part.layouts.items()})
        reductions.update({base_in + k: v for k, v in part.reductions.items()})
        out_layouts.update({base_out + k: v for k, v in part.out_layouts.items()})
    first = parts[0].op
    out_shape = tuple(first.results[0].tensor_type.shape) if first.results else ()
    return generate(args, ops, outputs, out_shape, layouts, out_layouts, reductions)  # type: ignore[arg-type]


def op_source(op: Operation, layouts: dict[int, InputLayout] | None = None,
              out_layouts: dict[int, InputLayout] | None = None, stores: int = 1) -> KernelSource:
    """The kernel of an elementwise op outside any fused group (its distinct operand k read
    through layouts[k] where given, its result stored `stores` times, the k-th through
    out_layouts[k])."""
    inputs = list(dict.fromkeys(op.operands))  # `mul %a, %a` reads one input
    return generate(inputs, [op], [op.result] * stores, tuple(op.result.tensor_type.shape), layouts,  # type: ignore[arg-type]
                    out_layouts)


@dataclass(frozen=True)
class RowReduction:
    """A phase of a row kernel (row_source): the sum, mean, max or min of each row of `operand` (the
    trailing `columns` elements of a row: a reduction over the trailing axes, LayerNorm's
    `mean(x, axes=[-1], keepdims=true)`), summed by the row's block through a shared-memory
    tree and stored by thread 0 at the row's index of `result` (one element per row)."""

    operand: Value
    result: Value
    columns: int
    mean: bool
    layout: InputLayout | None = None
    """The operand read through a strided layout (an absorbed slice, a sequence row, a
    broadcast read in place), else its own C-contiguous buffer."""
    combine: str = "add"
    """`add` (sum, mean), `max` or `min` (a NaN in the row gives NaN, as NumPy's)."""


_ROW_INIT = {"add": 0.0, "max": -math.inf, "min": math.inf}
"""Each combine's identity: a thread with no column of the row contributes it."""


def _combined(combine: str, dtype: str, a: str, b: str) -> str:
    """a combined with b; for max/min a NaN wins (either side), as NumPy's reductions."""
    if combine == "add":
        return f"{dtype}({a} + {b})"
    cmp = ">" if combine == "max" else "<"
    return f"({b} if ({b} {cmp} {a} or {b} != {b}) else {a})"


RowPhase = KernelPart | RowReduction
"""One phase of a row kernel: a fused group over the row's elements, or a row reduction."""


ROW_TREE_BYTES = 4096
"""Shared memory the row reductions of one dtype that one tree sums side by side may take: each
takes SHARED slots, so 4 in float32 and 2 in float64 (a persistent scan inlining the kernel
keeps 8 KiB for its phases' arrays, persistent.PHASE_SHARED; before the stages a row kernel
declared 1 or 2 KiB)."""


def tree_width(dtype: str) -> int:
    """Row reductions of dtype (float) one tree sums side by side, at most."""
    return max(1, ROW_TREE_BYTES // (SHARED * (8 if dtype == "f64" else 4)))


def _accumulate(k: int, red: RowReduction) -> list[str]:
    """A reduction's lines in its row loop (`i` the operand's flat index): acc{k} takes in{k}[i]."""
    dtype = red.operand.tensor_type.dtype
    src = _Source(tuple(red.operand.tensor_type.shape))  # type: ignore[arg-type]
    at = src.index(red.operand.tensor_type, red.layout)
    return [*src.coordinate_lines(), f"{INDENT}e{k} = in{k}[{at}]",
            f"{INDENT}acc{k} = {_combined(red.combine, dtype, f'acc{k}', f'e{k}')}"]


def _row_trees(trees: Sequence[tuple[int, RowReduction, int]]) -> list[str]:
    """Reductions (input k, it, output) of one stage, their accumulators summed: per tree of
    up to tree_width(dtype) of each dtype, each in its own SHARED slots of sm_<dtype>, halved
    together (one barrier per level for all of them), thread 0 storing each row's total."""
    chunks: list[list[tuple[int, RowReduction, int]]] = [[]]
    for tree in trees:
        dtype = tree[1].operand.tensor_type.dtype
        if sum(1 for _, red, _ in chunks[-1] if red.operand.tensor_type.dtype == dtype) == tree_width(dtype):
            chunks.append([])
        chunks[-1].append(tree)
    lines: list[str] = []
    for n, chunk in enumerate(chunk for chunk in chunks if chunk):
        if n:
            lines.append("cuda.syncthreads()")  # thread 0 has read the last tree's totals
        slot: dict[int, str] = {}
        step: list[str] = []
        done: list[str] = []
        used: dict[str, int] = {}
        for k, red, out in chunk:
            dtype = red.operand.tensor_type.dtype
            j = used[dtype] = used.get(dtype, -1) + 1  # the tree's j-th of its dtype
            sm, base = f"sm_{dtype}", f"{j * SHARED} + " if j else ""
            slot[k] = f"{sm}[{base}t]"
            lines.append(f"{slot[k]} = acc{k}")
            step += [f"        e{k} = {sm}[{base}t + s]",
                     f"        {slot[k]} = {_combined(red.combine, dtype, slot[k], f'e{k}')}"]
            total = f"{sm}[{j * SHARED}]"
            done.append(f"    out{out}[row] = " + (f"{dtype}({total} / {dtype}({red.columns}))" if red.mean else total))
        lines += ["cuda.syncthreads()", "s = cuda.blockDim.x // 2", "while s > 0:", "    if t < s:", *step,
                  "    cuda.syncthreads()", "    s //= 2", "if t == 0:", *done]
    return [INDENT + line for line in lines]


@dataclass(frozen=True)
class RowStage:
    """Phases of a row kernel between two barriers (codegen._stages): `phases` read only what
    earlier stages wrote; `after`, groups of one element per row, run after the stage's trees
    and read what thread 0 stored there (a row's `sqrt(var + eps)` after its variance): a
    one-element group's loop runs on thread 0 alone, at i = row, where thread 0 stored."""

    phases: tuple[RowPhase, ...]
    after: tuple[KernelPart, ...] = ()


def _loop(width: int, code: list[str]) -> list[str]:
    return [f"{INDENT}for i in range(row * {width} + t, row * {width} + {width}, cuda.blockDim.x):",
            *("    " + line for line in code)]


def _stage_lines(stage: RowStage, counts: list[int], error_sites: list[tuple[str, Operation]],
                 all_in: list[Value], all_out: list[Value], rows: int) -> list[str]:
    """One stage of a row kernel: its phases over the same number of a row's elements share
    one loop, the reductions one tree per tree_width, then the `after` groups."""
    loops: dict[int, list[str]] = {}
    trees: list[tuple[int, RowReduction, int]] = []

    def part(phase: KernelPart) -> tuple[int, list[str]]:
        shape, outputs, code, counts[0] = _part_code(phase, error_sites, counts[0], len(all_in), len(all_out))
        all_in.extend(phase.op.body.args)
        all_out.extend(outputs)
        return math.prod(shape) // rows, code

    for phase in stage.phases:
        if isinstance(phase, RowReduction):
            k = len(all_in)
            loops.setdefault(phase.columns, []).extend(_accumulate(k, phase))
            trees.append((k, phase, len(all_out)))
            all_in.append(phase.operand)
            all_out.append(phase.result)
            continue
        width, code = part(phase)
        loops.setdefault(width, []).extend(code)
    lines = [f"{INDENT}acc{k} = {literal(_ROW_INIT[red.combine], red.operand.tensor_type.dtype)}"
             for k, red, _ in trees]
    for width, code in loops.items():
        lines += _loop(width, code)
    lines += _row_trees(trees)
    after = [line for group in stage.after for line in part(group)[1]]
    return lines + (_loop(1, after) if after else []) + [f"{INDENT}cuda.syncthreads()"]


def row_source(stages: Sequence[RowStage], rows: int) -> KernelSource:
    """One kernel for a row program (codegen's row programs: LayerNorm's mean, variance and
    normalisation, and their gradients' row sums): a block per row (striding over the rows),
    the stages in order (codegen._stages decides which phases share one), each phase over the
    row's elements (a group's `i` runs over the row's part of its output) or a row reduction,
    with a block barrier after each stage, so that a phase reads what the earlier stages wrote
    to memory for this row. Every value a phase reads from an earlier one lies in the same row
    (codegen checks), so blocks never wait for each other. A LayerNorm-LSTM's four gate
    LayerNorms share each stage: four means in one tree, not four trees (fewer barriers on a
    GPU; numba compiles fewer loops, in less than half the time)."""
    error_sites: list[tuple[str, Operation]] = []
    counts = [0]
    lines: list[str] = []
    all_in: list[Value] = []
    all_out: list[Value] = []
    trees: dict[str, int] = {}
    for stage in stages:
        lines += _stage_lines(stage, counts, error_sites, all_in, all_out, rows)
        reductions = [p for p in stage.phases if isinstance(p, RowReduction)]
        for dtype in dict.fromkeys(p.operand.tensor_type.dtype for p in reductions):
            width = sum(1 for p in reductions if p.operand.tensor_type.dtype == dtype)
            trees[dtype] = max(trees.get(dtype, 0), min(width, tree_width(dtype)))
    params, types = _signature(all_out, all_in, bool(error_sites))
    shared = [f"    sm_{d} = cuda.shared.array({SHARED * width}, {d})" for d, width in trees.items()]
    head = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):", "    t = cuda.threadIdx.x", *shared,
            "    for row in range(cuda.blockIdx.x, n, cuda.gridDim.x):"]
    return KernelSource("\n".join(head + lines) + "\n", f"void({', '.join(types)})", error_sites, row_blocks=True)


def kernel_body(ks: KernelSource) -> tuple[list[str], list[str]]:
    """(the kernel's parameter names, its body's lines, indented by 4): what a persistent kernel
    inlines as one of its phases (persistent.py)."""
    head, signature, *body = ks.text.rstrip("\n").split("\n")
    assert head == "@cuda.jit" and signature.startswith("def gir_elementwise("), ks.text[:60]
    params = signature[len("def gir_elementwise("):-len("):")].split(", ")
    return params, body


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
