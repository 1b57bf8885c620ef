"""The two-core schedule: weight-gradient GEMMs run on a second thread during the scan that
produces their operand.

After `scan-grad`, a training step's weight gradients are GEMMs after the backward scan that
contract over every step of one of its stacks (`dW = Xᵀ · dA`, K = steps x batch). Each
step's rows of that stack are final once the step is done, so the GEMM can be split along K
into chunks of steps and each chunk accumulated (beta = 1) as soon as its steps are done,
while the scan's own recurrence goes on. The compiled code then has a second entry,
`gir_worker`, which the runtime runs on a thread of its own beside `gir_main`:

- `gir_main`, when it enters such a scan, switches its own BLAS calls to one thread (the
  per-thread setting of OpenBLAS and MKL), wakes the worker (a futex), and after every step
  publishes how many steps are done; at each deferred GEMM it waits until the worker has done
  all that GEMM's chunks, and after the scan it restores its BLAS threads.
- `gir_worker` waits to be woken, then claims chunks in order (a compare-and-swap of the next
  chunk's index, codegen._Worker), setting its BLAS calls to one thread once it has one: each
  waits until its steps and the chunk before it are done, runs one GEMM, and publishes that
  it is done. At a deferred GEMM `gir_main` claims and runs the chunks the worker has not
  claimed yet, so a worker whose core is busy costs a one-thread step, not a wait (issue 28).

When the calling thread's other GEMMs (the forward pass's) measured faster on one thread
than on all, its BLAS stays on one thread for the whole call (`main_blas_threads`): on a
machine whose other core is busy, a 2-thread GEMM waits for that core.

No Python runs per step or per chunk; the list of chunks is fixed when the code is compiled.
Whether to do it at all is decided by the schedule step (schedule/overlap.py), from the GEMM
thread times blas_threads.py measures, and recorded with the reasons in the CpuSchedule and
`fn.stats.schedule`.

This module is the analysis (IR only): which GEMMs can be deferred, and how they are chunked.
lower/two_core.py emits the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...config import current
from ...ir.core import Function, Operation, Value
from ...ir.loops import LoopView
from ...ir.spec import view_source

CHUNKS = 8
"""Chunks per deferred GEMM: small enough that the worker starts early, large enough (K =
steps/8 x batch rows) that a chunk runs near a one-thread GEMM's speed."""


@dataclass
class Address:
    """Where a view lives: `root` (a function argument or a value with storage of its own)
    plus a constant byte offset."""

    root: Value
    offset: int


@dataclass
class Chunk:
    trigger: int
    """Iterations of the scan that must be done before this chunk runs."""
    k0: int
    k1: int
    beta: float


@dataclass
class Deferred:
    """One GEMM `C = Aᵀ B` after a scan, B rows being rows of one of the scan's stacks."""

    op: Operation
    a: Address
    b: Address
    m: int
    n: int
    k: int
    chunks: list[Chunk] = field(default_factory=list)


@dataclass
class Window:
    """A scan during which deferred GEMMs run on the worker."""

    scan: Operation
    deferred: list[Deferred]


def address(v: Value) -> Address:
    """v's storage as root + byte offset, through reshapes and contiguous slices (views)."""
    offset = 0
    while True:
        d = v.defining_op
        # a view in row-major order at a constant offset: one operand (not `index`, whose row
        # is known at run time), not a transpose (read in another order)
        if d is None or view_source(d) is None or len(d.operands) != 1 or "perm" in d.attrs:
            return Address(v, offset)
        if "starts" in d.attrs:  # a contiguous slice
            src = d.operands[0]
            shape = src.tensor_type.static_shape
            strides, acc = [], 1
            for dim in reversed(shape):
                strides.append(acc)
                acc *= dim
            strides.reverse()
            offset += sum(s * st for s, st in zip(d.attrs["starts"], strides)) * src.tensor_type.numpy_dtype.itemsize
        v = d.operands[0]


def _transposed(v: Value) -> Value | None:
    d = v.defining_op
    if d is not None and d.name == "transpose" and view_source(d) is not None:
        return d.operands[0]
    return None


def _deferrable(op: Operation, scan: Operation, stacks: set[Value], before: set[Value | None]) -> Deferred | None:
    """op as a Deferred when it is `C = Aᵀ B` with B's rows whole steps of a stack of scan and A
    stored before the scan starts."""
    if op.name != "matmul" or not op.spec.gemm_dtypes or op.result.tensor_type.dtype != "f32":
        return None
    a_val, b_val = op.operands
    if a_val.tensor_type.rank != 2 or b_val.tensor_type.rank != 2:
        return None
    a_src = _transposed(a_val)
    if a_src is None or _transposed(b_val) is not None:
        return None
    a, b = address(a_src), address(b_val)
    if b.root not in stacks or a.root not in before:
        return None
    k, m = a_src.tensor_type.static_shape
    n = b_val.tensor_type.static_shape[1]
    rt = b.root.tensor_type
    item = rt.numpy_dtype.itemsize
    step_elems = math.prod(rt.static_shape[1:])
    if rt.static_shape[-1] != n or step_elems % n or b.offset % (n * item):
        return None
    return Deferred(op, a, b, m, n, k)


def _chunk(d: Deferred, scan: Operation, steps: int) -> None:
    """Splits d along K by the steps whose rows it reads, in the order the scan finishes them."""
    loop = LoopView(scan)
    rt = d.b.root.tensor_type
    rows_per_step = math.prod(rt.static_shape[1:]) // d.n
    row0 = d.b.offset // (d.n * rt.numpy_dtype.itemsize)
    per = max(1, -(-steps // CHUNKS))
    first = True
    for it0 in range(0, steps, per):
        it1 = min(steps, it0 + per)
        lo, hi = (steps - it1, steps - it0) if loop.reverse else (it0, it1)
        k0 = max(0, lo * rows_per_step - row0)
        k1 = min(d.k, hi * rows_per_step - row0)
        if k1 <= k0:
            continue
        d.chunks.append(Chunk(it1, k0, k1, 0.0 if first else 1.0))
        first = False


def find_windows(function: Function) -> list[Window]:
    """Every top-level scan with GEMMs after it that can run during it."""
    windows = []
    before: set[Value | None] = set(function.args)
    claimed: set[Operation] = set()
    ops = list(function.body)
    for i, op in enumerate(ops):
        if op.name == "scan":
            loop = LoopView(op)
            steps = loop.trip_count
            stacks: set[Value] = set(loop.stacked_results)
            if steps is not None and steps >= 2 and stacks:
                found = [d for later in ops[i + 1:]
                         if later not in claimed and (d := _deferrable(later, op, stacks, before)) is not None]
                for d in found:
                    _chunk(d, op, steps)
                found = [d for d in found if d.chunks]
                if found:
                    windows.append(Window(op, found))
                    claimed.update(d.op for d in found)
        before.update(op.results)
    return windows


def mode() -> str:
    """GIR_CPU_OVERLAP: `auto` (default: decide by the measured model), `1` always, `0` never,
    `whole` always and the calling thread's BLAS on one thread for the whole call."""
    return current().cpu_overlap


# ---------------------------------------------------------------------------------------------
# What the decision (schedule/overlap.py) weighs: the calling thread's GEMMs


def outside_gemms(function: Function, windows: list[Window]) -> list[tuple[int, int, int, bool, bool]]:
    """The GEMMs the calling thread runs outside the windows (each once per run: a scan's body
    GEMMs as many times as it has steps), as (m, n, k, ta, tb)."""
    skip = {d.op for w in windows for d in w.deferred}
    out = []
    for op in function.body:
        if op in skip or any(op is w.scan for w in windows):
            continue
        if op.name == "scan":
            out += body_gemms(op) * (LoopView(op).trip_count or 1)
        else:
            out += body_gemms(op, [op])
    return out


def body_gemms(scan: Operation, ops: list[Operation] | None = None) -> list[tuple[int, int, int, bool, bool]]:
    """(m, n, k, ta, tb) of every float32 GEMM with a 2-D right operand in the scan's body (or ops)."""
    out = []
    for op in ops if ops is not None else scan.body:
        if op.name != "matmul" or op.result.tensor_type.dtype != "f32" or op.operands[1].tensor_type.rank != 2:
            continue
        if any(not t.is_static for t in (op.operands[0].tensor_type, op.operands[1].tensor_type)):
            continue
        a, b = op.operands
        ta, tb = _transposed(a) is not None, _transposed(b) is not None
        shape = op.result.tensor_type.static_shape
        out.append((math.prod(shape[:-1]), shape[-1], a.tensor_type.static_shape[-1], ta, tb))
    return out
