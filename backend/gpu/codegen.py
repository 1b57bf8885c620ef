"""IR -> a host program for the GPU: one *step* per op, run in order by the runtime, each
launching a generated kernel or calling xp (CuPy on a GPU) on device arrays.

Terms.
- *Env*: value -> device array, for one call. It starts from the compiled function's static
  arrays (every value's storage, the constants, the argument buffers); views are added as
  their steps run.
- *Step*: (op, run(env)). Lowering is a dispatch table from op kind to one function per op
  family, which returns the op's step (or None when the op needs no work at run time) and
  raises a GirError naming the op and its location when it cannot lower it.
- Elementwise: a `fused` op, or an elementwise op outside any group, is one generated kernel
  launch (kernels.py). matmul: `xp.matmul(a, b, out=...)`, cuBLAS through CuPy; a 2-D
  transpose read only by matmuls is a strided view, which cuBLAS takes as a transpose flag.
  Reductions: xp.sum / mean / max / min with `out=`. Layout: views where the memory plan has
  a view (memory.py), else an xp copy into the value's storage. Constants: uploaded once.
- `scan`: a loop on the host over device-resident buffers: a sequence's element is a view of
  row t, each carry lives in its body argument's storage (the initial value is copied in
  unless it is already there), and at the yield, stacked values are copied into row t of
  their stack, then each yielded carry into its carry (through a temporary when it overlaps
  any carry's storage: a swap). Nothing is read back to the host per step.
- Run-time errors: kernels record integer division by zero in a device flag (kernels.py);
  `index` out of range is checked on the host. `index` by a computed (not constant) index
  reads that one scalar back to the host.

Known gaps: `call`, `grad` and pre-SSA ops must be gone (inline, autodiff, ssa); one stream,
so steps never overlap; a kernel is launched per fused group per step (no persistent or
CUDA-graph scan yet).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...analysis.memory.plan import MemoryPlan
from ...errors import GirError, Location
from ...ir.core import Block, Function, Operation, Value
from ...ir.interpreter import empty_reduction
from ...ir.loops import LoopView
from ...ir.ops import REGISTRY, norm_axis, reduction_axes
from ...ir.spec import OpSpec, dispatch_by_fact
from ...ir.types import INT_DTYPES
from .device import Device
from .gather import lower_gather, lower_logsumexp, lower_scatter_add
from .kernels import ElementwiseKernel, compile_kernel, fused_source, op_source
from .memory import Memory

Env = dict[Value, Any]
Run = Callable[[Env], None]
Step = tuple[Operation, Run]


@dataclass
class Counters:
    """What one call did (the runtime resets them per call)."""

    kernel_launches: int = 0
    gemm_calls: int = 0
    copies: int = 0
    read_backs: int = 0
    """Scalars read back to the host (`index` by a computed index)."""


@dataclass(eq=False)
class Lowering:
    """Lowers one function: owns its device memory, its static arrays and its kernels."""

    function: Function
    dev: Device
    plan: MemoryPlan | None = None
    """The pipeline's memory plan (memplan's default plan when None)."""
    memory: Memory = field(init=False)
    static: Env = field(default_factory=dict)
    """Values whose device array is fixed for the compiled function's life."""
    kernels: list[ElementwiseKernel] = field(default_factory=list)
    errors: list[tuple[str, Location]] = field(default_factory=list)
    """Run-time error code k (the value of the err flag) is errors[k - 1]: (message, location)."""
    counters: Counters = field(default_factory=Counters)
    host_scalars: dict[Value, int] = field(default_factory=dict)
    """Integer scalar constants, known on the host (an `index` by one needs no read-back)."""
    _args: dict[tuple, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.memory = Memory(self.function, self.dev, self.plan)
        self.err = self.memory.own((1,), np.dtype(np.int32))
        self.err_arg = self.dev.kernel_arg(self.err)
        for arg in self.function.args:
            t = arg.tensor_type
            self.static[arg] = self.memory.own(tuple(t.shape), t.numpy_dtype)  # type: ignore[arg-type]

    # -- helpers ----------------------------------------------------------------------------
    def storage(self, v: Value) -> Any:
        array = self.memory.storage(v)
        self.static[v] = array
        return array

    def kernel_arg(self, a: Any) -> Any:
        """a as a kernel argument. Every array a step sees is the function's own memory or a
        view of it, so wrappers are kept by address (a non-contiguous view is copied)."""
        if not a.flags.c_contiguous:
            return self.dev.kernel_arg(self.dev.xp.ascontiguousarray(a))
        key = (self.dev.address(a), a.size, a.dtype.str)
        found = self._args.get(key)
        if found is None:
            found = self._args[key] = self.dev.kernel_arg(a)
        return found

    def error_codes(self, sites: list[tuple[str, Operation]]) -> int:
        """The first of len(sites) new run-time error codes."""
        base = len(self.errors) + 1
        self.errors.extend((message, op.loc) for message, op in sites)
        return base

    def same_memory(self, a: Any, b: Any) -> bool:
        return a.nbytes == b.nbytes and a.dtype == b.dtype and self.dev.address(a) == self.dev.address(b) \
            and a.flags.c_contiguous and b.flags.c_contiguous

    def extent(self, a: Any) -> tuple[int, int]:
        """[low, high) of the bytes a touches."""
        if a.size == 0:
            return 0, 0
        low = high = self.dev.address(a)
        for d, s in zip(a.shape, a.strides):
            if s < 0:
                low += (d - 1) * s
            else:
                high += (d - 1) * s
        return low, high + a.itemsize

    # -- driver -----------------------------------------------------------------------------
    def block(self, block: Block) -> tuple[list[Step], list[Value]]:
        """The steps of block's ops and the values its terminator returns or yields."""
        steps: list[Step] = []
        for op in block:
            if op.spec.terminator:
                return steps, list(op.operands)
            lower = LOWER.get(op.name)
            if lower is None:
                raise GirError(f"the GPU backend cannot compile '{op.name}'", op.loc)
            try:
                run = lower(self, op)
            except GirError:
                raise
            except (ValueError, TypeError, KeyError, AssertionError) as e:
                raise GirError(f"the GPU backend failed on '{op.name}': {type(e).__name__}: {e}", op.loc) from e
            if run is not None:
                steps.append((op, run))
        return steps, []


def run_steps(steps: list[Step], env: Env) -> None:
    for op, run in steps:
        try:
            run(env)
        except GirError:
            raise
        except Exception as e:  # an xp or numba failure at run time: say which op
            raise GirError(f"'{op.name}' failed on the GPU at run time: {type(e).__name__}: {e}", op.loc) from e


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.tensor_type.shape)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Elementwise: generated kernels


def _launch(low: Lowering, op: Operation, kernel: ElementwiseKernel, inputs: list[Value]) -> Run | None:
    if not op.results:
        return None
    low.kernels.append(kernel)
    outs = [low.kernel_arg(low.storage(r)) for r in op.results]
    n = math.prod(_shape(op.results[0]))
    extra = (low.err_arg, low.error_codes(kernel.error_sites)) if kernel.error_sites else ()
    dev, counters, arg = low.dev, low.counters, low.kernel_arg

    def run(env: Env) -> None:
        kernel.launch(dev, n, [*outs, *(arg(env[v]) for v in inputs), *extra])
        counters.kernel_launches += 1

    return run


def lower_fused(low: Lowering, op: Operation) -> Run | None:
    return _launch(low, op, compile_kernel(low.dev, fused_source(op)), list(op.operands))


def lower_elementwise(low: Lowering, op: Operation) -> Run | None:
    """An elementwise op outside a fused group: a kernel of one op."""
    return _launch(low, op, compile_kernel(low.dev, op_source(op)), list(dict.fromkeys(op.operands)))


# ---------------------------------------------------------------------------------------------
# GEMMs and reductions through xp


def lower_matmul(low: Lowering, op: Operation) -> Run:
    a, b = op.operands
    out = low.storage(op.result)
    matmul, counters = low.dev.xp.matmul, low.counters

    def run(env: Env) -> None:
        matmul(env[a], env[b], out=out)
        counters.gemm_calls += 1

    return run


_XP_REDUCTIONS = {"add": "sum", "max": "max", "min": "min"}
"""`Reduction.combine` -> the xp function folding with it (`mean` where it divides by the count)."""


def lower_reduce(low: Lowering, op: Operation) -> Run:
    """Over no element (a reduced axis of size 0, known here): `sum` is its identity, `mean`
    nan (0/0, written without xp's warning), and max/min (`Reduction.empty_is_error`) raise the
    interpreter's error when the op runs (not when it compiles: in a loop body that runs no
    step there is no error)."""
    reduction = op.spec.reduction
    assert reduction is not None
    x = op.operands[0]
    shape = x.tensor_type.shape
    axes = tuple(reduction_axes(op.attrs, x.tensor_type.rank))
    keepdims = op.attrs["keepdims"]
    out = low.storage(op.result)
    xp = low.dev.xp
    empty = empty_reduction(op, shape)  # type: ignore[arg-type]  # static: the backend specialised
    if empty is not None:
        def fail(env: Env) -> None:
            raise GirError(f"{empty} at run time", op.loc)  # as flagged errors read

        return fail
    if reduction.divide_by_count and math.prod(shape[a] for a in axes) == 0:  # type: ignore[misc]
        def nan(env: Env) -> None:
            out[...] = math.nan

        return nan
    reduce = getattr(xp, "mean" if reduction.divide_by_count else _XP_REDUCTIONS[reduction.combine])
    # Accumulate a sum in the operand's dtype, as the interpreter's result is (NumPy would widen i32).
    options = {"dtype": x.tensor_type.numpy_dtype} if reduction.combine == "add" else {}

    def run(env: Env) -> None:
        reduce(env[x], axis=axes, keepdims=keepdims, out=out, **options)

    return run


# ---------------------------------------------------------------------------------------------
# Constants


def lower_constant(low: Lowering, op: Operation) -> None:
    """constant, zeros, ones: the interpreter's value, uploaded once."""
    t = op.result.tensor_type
    host = np.asarray(REGISTRY[op.name].kernel(op), dtype=t.numpy_dtype)  # type: ignore[misc]
    low.static[op.result] = low.memory.constant(host)
    if t.shape == () and t.dtype in INT_DTYPES:
        low.host_scalars[op.result] = int(host)
    return None


def lower_fill(low: Lowering, op: Operation) -> Run:
    value = op.operands[0]
    out = low.storage(op.result)
    counters = low.counters

    def run(env: Env) -> None:
        out[...] = env[value]
        counters.copies += 1

    return run


# ---------------------------------------------------------------------------------------------
# Layout: views where the memory plan has one, copies into storage where not


def _view_or_copy(low: Lowering, op: Operation, make: Callable[[Any], Any]) -> Run:
    """A step setting op's result to make(operand), as a view or copied into storage."""
    x, r = op.operands[0], op.result
    if low.memory.is_view(r, op):
        def view(env: Env) -> None:
            env[r] = make(env[x])

        return view
    out = low.storage(r)
    counters = low.counters

    def copy(env: Env) -> None:
        out[...] = make(env[x])
        counters.copies += 1

    return copy


def lower_reshape(low: Lowering, op: Operation) -> Run:
    shape = _shape(op.result)
    return _view_or_copy(low, op, lambda a: a.reshape(shape))


def lower_transfer(low: Lowering, op: Operation) -> Run:
    """The whole function runs on the GPU: a transfer is the value itself."""
    return _view_or_copy(low, op, lambda a: a)


def lower_transpose(low: Lowering, op: Operation) -> Run:
    rank = op.operands[0].tensor_type.rank
    perm = tuple(op.attrs["perm"] or range(rank)[::-1])
    transpose = low.dev.xp.transpose
    return _view_or_copy(low, op, lambda a: transpose(a, perm))


def lower_slice(low: Lowering, op: Operation) -> Run:
    starts, limits = op.attrs["starts"], op.attrs["limits"]
    steps = op.attrs["steps"] or [1] * len(starts)
    box = tuple(slice(s, lim, st) for s, lim, st in zip(starts, limits, steps))
    return _view_or_copy(low, op, lambda a: a[box])


def lower_broadcast(low: Lowering, op: Operation) -> Run:
    x, out = op.operands[0], low.storage(op.result)
    counters = low.counters

    def run(env: Env) -> None:
        out[...] = env[x]  # NumPy broadcasting, on the device
        counters.copies += 1

    return run


def _join(low: Lowering, op: Operation, new_axis: bool) -> Run:
    out = low.storage(op.result)
    rank = op.result.tensor_type.rank
    axis = norm_axis(op.attrs["axis"], rank)
    pieces: list[tuple[Value, tuple]] = []
    start = 0
    for v in op.operands:
        width = 1 if new_axis else _shape(v)[axis]
        where = start if new_axis else slice(start, start + width)
        pieces.append((v, (slice(None),) * axis + (where,)))
        start += width
    counters = low.counters

    def run(env: Env) -> None:
        for v, where in pieces:
            out[where] = env[v]
        counters.copies += len(pieces)

    return run


def lower_concat(low: Lowering, op: Operation) -> Run:
    return _join(low, op, new_axis=False)


def lower_stack(low: Lowering, op: Operation) -> Run:
    return _join(low, op, new_axis=True)


def lower_index(low: Lowering, op: Operation) -> Run:
    """By a scalar: one row, a view where memplan has one. By a tensor: a gather (gather.py)."""
    x, i = op.operands
    if i.tensor_type.rank:
        return lower_gather(low, op)
    r = op.result
    rows = _shape(x)[0]
    known = low.host_scalars.get(i)
    dev, counters = low.dev, low.counters
    out = None if low.memory.is_view(r, op) else low.storage(r)

    def run(env: Env) -> None:
        if known is not None:
            k = known
        else:  # a computed index: one read-back
            k = int(dev.download(env[i]))
            counters.read_backs += 1
        if not 0 <= k < rows:
            raise GirError(f"'index' out of range at run time: index {k} for a leading dim of {rows}", op.loc)
        if out is None:
            env[r] = env[x][k]
        else:
            out[...] = env[x][k]

    return run


# ---------------------------------------------------------------------------------------------
# scan: a host loop over device-resident buffers


def lower_scan(low: Lowering, op: Operation) -> Run:
    loop = LoopView(op)
    steps = loop.trip_count
    if steps is None:
        raise GirError("the GPU backend needs a static trip count", op.loc)
    seqs, seq_args, inits = loop.sequences, loop.element_args, loop.inits
    carries = [low.storage(a) for a in loop.carry_args]
    carry_extents = [low.extent(c) for c in carries]
    stacks = [low.storage(r) for r in loop.stacked_results]
    final_storage = []
    for c in loop.carries:
        low.memory.share(c.result, c.arg)  # the final carry stays in the carry's storage
        final_storage.append(low.storage(c.result))
    body_steps, _ = low.block(loop.body)
    yielded_carries, yielded_stacks = loop.yielded_carries, loop.yielded_stacks
    order = range(steps - 1, -1, -1) if loop.reverse else range(steps)
    same, extent, counters = low.same_memory, low.extent, low.counters

    def overlaps_a_carry(a: Any) -> bool:
        lo, hi = extent(a)
        return any(lo < c_hi and c_lo < hi for c_lo, c_hi in carry_extents)

    def run(env: Env) -> None:
        for init, carry in zip(inits, carries):
            if not same(env[init], carry):
                carry[...] = env[init]
                counters.copies += 1
        for t in order:
            for arg, seq in zip(seq_args, seqs):
                env[arg] = env[seq][t]
            run_steps(body_steps, env)
            for stack, v in zip(stacks, yielded_stacks):
                stack[t] = env[v]
            pending = []
            for carry, v in zip(carries, yielded_carries):
                value = env[v]
                if same(value, carry):
                    continue
                if overlaps_a_carry(value):  # read before any carry is overwritten
                    value = value.copy()
                pending.append((carry, value))
            for carry, value in pending:
                carry[...] = value
            counters.copies += len(stacks) + len(pending)
        for carry, final in zip(carries, final_storage):
            if not same(carry, final):
                final[...] = carry

    return run


def _row_and_softmax_lowerings() -> dict[str, Callable[[Lowering, Operation], Run | None]]:
    return {"scatter_add": lower_scatter_add, "logsumexp": lower_logsumexp}


def _lowerings() -> dict[str, Callable[[Lowering, Operation], Run | None]]:
    """Op kind -> lowering function: the kinds with a family of their own by name, every other
    kind by its spec's facts (elementwise, constant, reduction, matmul, device move)."""
    table: dict[str, Callable[[Lowering, Operation], Run | None]] = {
        "fused": lower_fused,
        "scan": lower_scan,
        "fill": lower_fill,
        "reshape": lower_reshape,
        "transpose": lower_transpose,
        "broadcast": lower_broadcast,
        "slice": lower_slice,
        "concat": lower_concat,
        "stack": lower_stack,
        "index": lower_index,
        **_row_and_softmax_lowerings(),
    }
    by_fact: list[tuple[Callable[[OpSpec], bool], Callable[[Lowering, Operation], Run | None]]] = [
        (lambda spec: spec.is_elementwise, lower_elementwise),
        (lambda spec: spec.category == "constant", lower_constant),
        (lambda spec: spec.reduction is not None, lower_reduce),
        (lambda spec: spec.category == "matmul", lower_matmul),
        (lambda spec: spec.moves_device, lower_transfer),
    ]
    return dispatch_by_fact(table, by_fact)


LOWER = _lowerings()
"""Op kind -> lowering function."""


def lower_function(function: Function, dev: Device, plan: MemoryPlan | None = None
                   ) -> tuple[Lowering, list[Step], list[Value]]:
    low = Lowering(function, dev, plan)
    steps, returned = low.block(function.body)
    return low, steps, returned
