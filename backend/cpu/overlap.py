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
Whether to do it at all is decided here, from the GEMM times blas.py measures (see `decide`),
and recorded with the reasons in `fn.stats.schedule`.

This module is the analysis (IR only): which GEMMs can be deferred, and how they are chunked.
codegen.py emits the code.
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
            shape = [int(x) for x in src.tensor_type.shape]  # type: ignore[arg-type]
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
    k, m = (int(x) for x in a_src.tensor_type.shape)  # type: ignore[arg-type]
    n = int(b_val.tensor_type.shape[1])  # type: ignore[arg-type]
    rt = b.root.tensor_type
    item = rt.numpy_dtype.itemsize
    step_elems = math.prod(int(x) for x in rt.shape[1:])  # type: ignore[arg-type]
    if int(rt.shape[-1]) != n or step_elems % n or b.offset % (n * item):  # type: ignore[arg-type]
        return None
    return Deferred(op, a, b, m, n, k)


def _chunk(d: Deferred, scan: Operation, steps: int) -> None:
    """Splits d along K by the steps whose rows it reads, in the order the scan finishes them."""
    loop = LoopView(scan)
    rt = d.b.root.tensor_type
    rows_per_step = math.prod(int(x) for x in rt.shape[1:]) // d.n  # type: ignore[arg-type]
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
            stacks = set(loop.stacked_results)
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
# Deciding: the measured model


def _outside_gemms(function: Function, windows: list[Window]) -> list[tuple[int, int, int, bool, bool]]:
    """The GEMMs the calling thread runs outside the windows (each once per run: a scan's body
    GEMMs as many times as it has steps), as (m, n, k, ta, tb)."""
    skip = {d.op for w in windows for d in w.deferred}
    out = []
    for op in function.body:
        if op in skip or any(op is w.scan for w in windows):
            continue
        if op.name == "scan":
            out += _body_gemms(op) * (LoopView(op).trip_count or 1)
        else:
            out += _body_gemms(op, [op])
    return out


def _body_gemms(scan: Operation, ops: list[Operation] | None = None) -> list[tuple[int, int, int, bool, bool]]:
    """(m, n, k, ta, tb) of every float32 GEMM with a 2-D right operand in the scan's body (or ops)."""
    out = []
    for op in ops if ops is not None else scan.body:
        if op.name != "matmul" or op.result.tensor_type.dtype != "f32" or op.operands[1].tensor_type.rank != 2:
            continue
        if any(not t.is_static for t in (op.operands[0].tensor_type, op.operands[1].tensor_type)):
            continue
        a, b = op.operands
        ta, tb = _transposed(a) is not None, _transposed(b) is not None
        shape = [int(x) for x in op.result.tensor_type.shape]  # type: ignore[arg-type]
        out.append((math.prod(shape[:-1]), shape[-1], int(a.tensor_type.shape[-1]), ta, tb))  # type: ignore[arg-type]
    return out


class _Times:
    """blas_threads.seconds for one family, asked for every shape a decision needs: a shape not
    measured yet counts 0 and is noted, and `check` then raises NotMeasured naming them all
    (so all of them are queued for the background measurer at once)."""

    def __init__(self, family: str):
        self.family = family
        self.missing: list[tuple] = []

    def __call__(self, *g: object, threads: int) -> float:
        from . import blas_threads

        try:
            return blas_threads.seconds(self.family, *g, threads=threads)  # type: ignore[arg-type]
        except blas_threads.NotMeasured as e:
            self.missing.append(e.params)
            return 0.0

    def check(self) -> None:
        from . import blas_threads

        if self.missing:
            raise blas_threads.NotMeasured(tuple(dict.fromkeys(self.missing)))


def estimate(window: Window, family: str) -> dict[str, float]:
    """Milliseconds of the window's GEMMs: `without` (2-thread GEMMs, the deferred ones after the
    scan) and `with` (the scan's GEMMs on one thread here, the chunks on one thread on the
    worker, whichever is longer, plus the last chunk, which can only start after the last step).
    Elementwise work and waiting are not in the model: it decides between the two GEMM
    schedules, measured on this machine (blas_threads.py)."""
    seconds = _Times(family)
    steps = LoopView(window.scan).trip_count or 0
    body = _body_gemms(window.scan)
    main1 = steps * sum(seconds(*g, threads=1) for g in body)
    main2 = steps * sum(seconds(*g, threads=0) for g in body)
    after2 = sum(seconds(d.m, d.n, d.k, True, False, threads=0) for d in window.deferred)
    worker, last = 0.0, 0.0
    for d in window.deferred:
        for c in d.chunks:
            last = seconds(d.m, d.n, c.k1 - c.k0, True, False, threads=1)
            worker += last
    seconds.check()
    return {"without_ms": 1e3 * (main2 + after2), "with_ms": 1e3 * max(main1 + last, worker),
            "scan_gemms_1thread_ms": 1e3 * main1, "scan_gemms_ms": 1e3 * main2,
            "deferred_ms": 1e3 * after2, "worker_1thread_ms": 1e3 * worker}


MARGIN = 0.5
"""The schedule is used when the model predicts it at least 2x faster. The model counts GEMM
times only, each measured alone; with the worker running, both threads' 1-thread GEMMs and
OpenBLAS's own pool thread share the 2 cores, which the model does not see. Forced on, on a
quiet machine (`GIR_CPU_OVERLAP=0|1 python bench/rnn.py --models rnn,gru,lstm --sizes S
--threads 2 --peers numpy`): rnn-S 8.1 -> 12.1 ms, gru-S 25.3 -> 37.7, lstm-S 34.8 -> 51.3;
a two-layer GRU the model gave 27.8 against 29.4 ms ran 1.44x slower with it
(bench/generic_cell.py). The margin was 25 % until a quiet machine's thread times gave rnn-S
4.64 against 7.12 ms (a predicted 1.53x gain, `fn.stats.schedule`), and the step ran 12.5-13.4
ms with the schedule against 7.3 ms without (`GIR_CPU_OVERLAP=auto|0 python bench/rnn_steps.py
rnn 100`, alternated, 2026-11-24; re-run later with `=1|0`: 17.7-19.7 against 9.5-13.5 ms).
Where it won, on a loaded machine, the predicted gain was 1.3x-60x: only the large ones stay."""


def plan(function: Function, family: str, schedule: dict[str, object]) -> list[Window]:
    """The windows to run with the worker, the decision and its reasons written to schedule."""
    from . import blas_threads  # lazily: it loads BLAS

    windows = find_windows(function)
    if not windows:
        return []
    chosen = mode()
    why = blas_threads.unavailable(family)
    if chosen == "0" or why is not None:
        schedule["overlap"] = "off: " + ("GIR_CPU_OVERLAP=0" if chosen == "0" else why)  # type: ignore[operator]
        return []
    kept, notes = [], []
    pending: list[tuple] = []
    for w in windows:
        try:
            est = {k: round(v, 3) for k, v in estimate(w, family).items()} if chosen == "auto" else {}
        except blas_threads.NotMeasured as e:  # decided without the worker; compiled again once measured
            pending += e.params
            notes.append({"scan": str(w.scan.loc), "used": False,
                          "why": "GEMM thread times not measured yet (measuring in the background)"})
            continue
        use = chosen in ("1", "whole") or est["with_ms"] < MARGIN * est["without_ms"]
        notes.append({"scan": str(w.scan.loc), "deferred_gemms": len(w.deferred),
                      "chunks": sum(len(d.chunks) for d in w.deferred), "used": use,
                      "why": "measured model" if chosen == "auto" else f"GIR_CPU_OVERLAP={chosen}", **est})
        if use:
            kept.append(w)
    schedule["overlap"] = notes
    if kept and chosen == "auto":
        try:
            schedule["main_blas_threads"] = _main_threads(function, kept, family)
        except blas_threads.NotMeasured as e:
            pending += e.params
            schedule["main_blas_threads"] = {"threads": "all", "why": "GEMM thread times not measured yet"}
    elif kept and chosen == "whole":
        schedule["main_blas_threads"] = {"threads": 1, "why": "GIR_CPU_OVERLAP=whole"}
    if pending and blas_threads.blas.measure_mode() == "background":  # refined later (=off: never)
        schedule["overlap_pending"] = [list(p) for p in dict.fromkeys(pending)]
    return kept


def _main_threads(function: Function, kept: list[Window], family: str) -> dict[str, object]:
    """The calling thread's other GEMMs: on one thread for the whole call when that measured
    faster (on a machine whose other core is busy, 2-thread GEMMs wait for it)."""
    seconds = _Times(family)
    outside = _outside_gemms(function, kept)
    one = sum(seconds(*g, threads=1) for g in outside)
    both = sum(seconds(*g, threads=0) for g in outside)
    seconds.check()
    return {"threads": 1 if one <= both else "all", "why": "measured model",
            "outside_1thread_ms": round(1e3 * one, 3), "outside_ms": round(1e3 * both, 3)}


def whole_call_one_thread(schedule: dict[str, object]) -> bool:
    """Whether the calling thread's BLAS runs on one thread for the whole call (`plan`)."""
    main = schedule.get("main_blas_threads")
    return isinstance(main, dict) and main.get("threads") == 1
