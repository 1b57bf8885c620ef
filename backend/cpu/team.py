"""The team schedule: gir splits each step of a scan across the two cores itself.

A recurrent step is a few per-step GEMMs and elementwise loops over a small batch. With
OpenBLAS's own threads, only the GEMMs run on both cores: the elementwise loops run on the
calling thread while OpenBLAS's second thread spins (about 5 ms of a 32 ms LSTM-S step,
docs/performance-rnn.md). In the team schedule the calling thread and one worker thread of
gir's own (`gir_worker`) share every step:

- an elementwise (fused) loop is split by its outer dimension: the calling thread runs the
  first half of the rows, the worker the rest;
- a per-step GEMM is split by columns of its result, each half a one-thread BLAS call (two
  one-thread GEMMs on column halves measured 119 against 133 us for OpenBLAS's own 2-thread
  split of a 32x256 @ 256x1024 product);
- everything else (reductions across rows, copies, small loops) runs on the calling thread
  alone, as before.

Each split op is one handshake: the calling thread publishes the op (a task number and the
pointers it reads and writes), runs its half, and waits for the worker's; both threads spin
during the scan (BLAS on one thread each), and the worker sleeps on a futex outside it, so
the 2-thread GEMMs outside the scan keep both cores.

This module is the analysis (IR only): which scans run as a team and which of their ops are
split, with the reasons in `fn.stats.schedule["split"]`. codegen.py emits the code.
"""

from __future__ import annotations

import math
import os

from ...ir.core import Function, Operation
from ...ir.types import FLOAT_DTYPES

MIN_ELEMENTS = 4096
"""An elementwise loop is split only from this many elements (a 32x128 block): below it the
handshake (~0.3 us) is a large part of the loop."""

MIN_COLUMNS = 64
"""A per-step GEMM is split only from this many result columns (32 per thread)."""


def mode() -> str:
    """GIR_CPU_SPLIT: `auto` (default), `1` (every candidate scan), `0` (never)."""
    return os.environ.get("GIR_CPU_SPLIT", "auto")


def split_kind(op: Operation) -> str | None:
    """'rows' (an elementwise loop split by its outer dimension), 'cols' (a GEMM split by result
    columns) or None (runs on the calling thread)."""
    if op.name == "fused" or op.spec.is_elementwise:
        return "rows" if _rows_splittable(op) else None
    if op.name == "matmul" and _cols_splittable(op):
        return "cols"
    return None


def _rows_splittable(op: Operation) -> bool:
    types = [r.tensor_type for r in op.results]
    if not types or not all(t.is_static and t.rank >= 1 for t in types):
        return False
    shape = tuple(types[0].shape)
    if any(tuple(t.shape) != shape for t in types) or int(shape[0]) < 2:  # type: ignore[arg-type]
        return False
    if math.prod(int(d) for d in shape) < MIN_ELEMENTS:  # type: ignore[arg-type]
        return False
    # Float results only: integer ops can flag errors (division by zero), and one error slot
    # is shared by both threads.
    inner = list(op.body) if op.name == "fused" else [op]
    return all(r.tensor_type.dtype in (*FLOAT_DTYPES, "i1") for o in inner for r in o.results)


def _cols_splittable(op: Operation) -> bool:
    if op.result.tensor_type.dtype not in op.spec.gemm_dtypes:
        return False
    b = op.operands[1].tensor_type
    a = op.operands[0].tensor_type
    if b.rank != 2 or not (a.is_static and b.is_static and op.result.tensor_type.is_static):
        return False
    return int(op.result.tensor_type.shape[-1]) >= MIN_COLUMNS  # type: ignore[arg-type]


def plan(function: Function, family: str, schedule: dict[str, object], worker_used: bool) -> dict[Operation, str]:
    """The split ops of every scan run as a team (op -> split_kind), the decision and its
    reasons written to schedule["split"]."""
    from . import blas_threads  # lazily: it loads BLAS

    scans = [op for op in function.body if op.name == "scan"]
    if not scans:
        return {}
    chosen = mode()
    why = None
    if chosen == "0":
        why = "GIR_CPU_SPLIT=0"
    elif worker_used:
        why = "the two-core schedule (overlap.py) has the worker"
    elif family != "openblas":
        why = "the function calls MKL (only OpenBLAS GEMMs are split)"
    else:
        why = blas_threads.unavailable(family)
    if why is not None:
        schedule["split"] = "off: " + why
        return {}
    out: dict[Operation, str] = {}
    notes = []
    for scan in scans:
        kinds = {op: k for op in scan.body if (k := split_kind(op)) is not None}
        nested = any(op.spec.loop for op in scan.body)
        big = any(k == "rows" for k in kinds.values())
        use = bool(kinds) and not nested and (chosen == "1" or big)
        reason = ("nested loop in the body" if nested else "nothing large enough to split" if not use
                  else f"elementwise loops of at least {MIN_ELEMENTS} elements" if chosen == "auto"
                  else "GIR_CPU_SPLIT=1")
        notes.append({"scan": str(scan.loc), "used": use, "why": reason,
                      "split_loops": sum(k == "rows" for k in kinds.values()),
                      "split_gemms": sum(k == "cols" for k in kinds.values())})
        if use:
            out.update(kinds)
    schedule["split"] = notes
    return out


def team_scans(parallel: dict[Operation, str]) -> set[Operation]:
    """The scans whose bodies hold the split ops."""
    return {op.parent_op for op in parallel if op.parent_op is not None}
