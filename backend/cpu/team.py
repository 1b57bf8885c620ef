"""The split schedule: a scan step's large elementwise loops run on both cores, on OpenBLAS's
own thread pool.

A recurrent step is a few per-step GEMMs and elementwise loops over a small batch. The GEMMs
run on OpenBLAS's two threads; the elementwise loops ran on the calling thread alone while
OpenBLAS's second thread spun, waiting for the next GEMM (about 5 ms of a 32 ms LSTM-S
step, docs/performance-rnn.md). Here a split loop is handed to OpenBLAS's `blas_level1_thread`
(the entry its own level-1 routines use to run on its pool): the calling thread and
OpenBLAS's pool thread, already spinning between GEMMs, each run the loop's rows in BLOCKS
blocks claimed by an atomic add, so a pool thread that starts late (its core busy) leaves its
blocks to the calling thread (issue 28; OpenBLAS still waits for its now empty call).
No third thread: a first design with a worker thread of gir's own ran slower (56 against
36 ms per LSTM-S step), because on a 2-core machine three spinning threads (the caller,
gir's worker, OpenBLAS's pool thread) take turns on two cores (docs/performance-rnn.md,
"Splitting the step across two threads").

This module is the analysis (IR only) and the probe of the OpenBLAS entry; lower/two_core.py
(`_Split`) emits the calls. The decision per loop and its reason are in
`fn.stats.schedule["split"]`.
"""

from __future__ import annotations

import ctypes
import math
from functools import cache
from typing import TYPE_CHECKING

from ...config import current
from ...ir.core import Operation
from ...ir.types import FLOAT_DTYPES

if TYPE_CHECKING:
    from _ctypes import CFuncPtr  # a CFUNCTYPE instance's base

MIN_ELEMENTS = 1024
"""A loop is split only from this many elements. `python bench/split_loops.py` (an LSTM-like
cell, quiet machine): split/unsplit per step 1.33x faster at 512 elements (8x64), 1.64x at
2048, 1.59-1.72x from 4096 to 65536; below 1024 the hand-off to OpenBLAS's pool and back
(~1 us) is most of the gain, and the 256-element loops of an LSTM's backward step are not
measured, so they stay on the calling thread."""


def mode() -> str:
    """GIR_CPU_SPLIT: `auto` (default: split loops the model says gain), `1` (every loop that
    can be split), `0` (never)."""
    return current().cpu_split


def level1_entry() -> tuple[int, int, int] | None:
    """(address of OpenBLAS's blas_level1_thread, its mode word, the bytes `b` advances per
    row) where calling it with a probe routine splits rows across two threads as expected;
    None otherwise. The mode's precision bits differ between OpenBLAS versions (0.3.31: 2 is
    single precision; with an unknown one the routine is silently not called), so they are
    found by calling it, not assumed. Never called with a pool of one thread (OpenBLAS's
    `blas_num_threads`, read each time): it has no second thread to run the other half, and
    the call would wait forever."""
    return _probe() if pool_threads() >= 2 and all(addresses()) else None


def pool_threads() -> int:
    """Threads of OpenBLAS's pool, the caller's included (its `blas_num_threads`; 0 when not
    known). Part of the compiled code's cache key (runtime.target_key): code that splits
    loops must not be loaded where the pool has one thread."""
    return _openblas_int("blas_num_threads", 0)


def cpu_number() -> int:
    """OpenBLAS's thread setting now (its `blas_cpu_number`; 1 when not known), as the compiled
    code reads it before handing work to the pool."""
    return _openblas_int("blas_cpu_number", 1)


def _openblas_int(name: str, default: int) -> int:
    """An int OpenBLAS exports (default when there is no OpenBLAS or it does not export it)."""
    from . import blas

    found = blas.openblas()
    try:
        return ctypes.c_int.in_dll(found.lib, name).value if found is not None else default
    except ValueError:  # not exported
        return default


@cache
def _probe() -> tuple[int, int, int] | None:
    from . import blas

    found = blas.openblas()
    lib = found.lib if found is not None else None
    if lib is None or not hasattr(lib, "blas_level1_thread"):
        return None
    fn = lib.blas_level1_thread
    long = ctypes.c_int64
    fn.argtypes = [ctypes.c_int, long, long, long, ctypes.c_void_p, ctypes.c_void_p, long,
                   ctypes.c_void_p, long, ctypes.c_void_p, long, ctypes.c_void_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    calls: list[tuple[int, int, int]] = []
    routine = ctypes.CFUNCTYPE(None, long, long, long, ctypes.c_void_p, long, ctypes.c_void_p)(
        lambda m, n, k, a, lda, b: calls.append((m, n, b or 0)))
    alpha = (ctypes.c_double * 4)()
    for word in (2, 0):  # single precision: 0.3.10 and later, then earlier
        calls.clear()
        address = ctypes.cast(routine, ctypes.c_void_p)
        fn(word, 33, 33, 0, ctypes.addressof(alpha), None, 0, None, 1, None, 0, address, 2)
        if len(calls) == 2 and sorted(c[0] for c in calls) == [16, 17]:
            first, second = sorted(calls, key=lambda c: c[2])
            if first[2] == 0 and second[2] % first[0] == 0 and second[2] > 0:
                return ctypes.cast(fn, ctypes.c_void_p).value or 0, word, second[2] // first[0]
    return None


EXTERNALS = ("ob_level1_thread", "ob_cpu_number", "split_hook")
"""The split schedule's entries of the externals table (externals.py): OpenBLAS's
blas_level1_thread, and the address of its `blas_cpu_number`, the thread count set now
(threadpoolctl, openblas_set_num_threads), which the code reads before each split loop: at 1
it runs the loop on the calling thread alone; and the address of `_pool_hook`, a pointer the
pool thread's share calls when it is not null (tests: `set_pool_hook`)."""

BLOCKS = 8
"""Blocks a split loop's rows are claimed in (codegen._Split._outline): a thread takes the next
block by an atomic add, so a pool thread that starts late leaves its blocks to the calling
thread, in pieces small enough that the two still share the loop when both run."""

_pool_hook = ctypes.c_void_p(0)
_pool_hook_keep: object = None


def set_pool_hook(hook: CFuncPtr | None) -> None:
    """Tests: a ctypes CFUNCTYPE(None, c_void_p) the pool thread's share of each split loop calls
    (with the address of the loop's claim word) before it claims a block, as a busy core would
    delay it; None removes it."""
    global _pool_hook_keep
    _pool_hook_keep = hook
    _pool_hook.value = ctypes.cast(hook, ctypes.c_void_p).value if hook is not None else 0


def addresses() -> list[int]:
    """The EXTERNALS' addresses in this process: blas_level1_thread where OpenBLAS exports it
    and its pool has a second thread (0 otherwise, and externals.py refuses code calling it).
    Not probed here (a compile-cache hit must stay cheap): the mode word the code was compiled
    with was probed on the same library, which is in the cache key, as is the pool's size."""
    from . import blas

    hook = ctypes.addressof(_pool_hook)
    found = blas.openblas()
    if found is None or pool_threads() < 2 or not hasattr(found.lib, "blas_level1_thread"):
        return [0, 0, hook]
    try:
        setting = ctypes.addressof(ctypes.c_int.in_dll(found.lib, "blas_cpu_number"))
    except ValueError:  # not exported
        return [0, 0, hook]
    return [ctypes.cast(found.lib.blas_level1_thread, ctypes.c_void_p).value or 0, setting, hook]


def splittable(op: Operation) -> bool:
    """An elementwise (fused) loop whose results are static, float, of one shape, at least
    2 rows: its rows can be written by two threads independently."""
    if not (op.name == "fused" or op.spec.is_elementwise):
        return False
    types = [r.tensor_type for r in op.results]
    if not types or not all(t.is_static and t.rank >= 1 for t in types):
        return False
    shape = types[0].static_shape
    if any(t.static_shape != shape for t in types) or shape[0] < 2:
        return False
    # Float results only: integer ops can flag errors (division by zero), and one error slot
    # is shared by both threads.
    inner = list(op.body) if op.name == "fused" else [op]
    return all(r.tensor_type.dtype in (*FLOAT_DTYPES, "i1") for o in inner for r in o.results)


def elements(op: Operation) -> int:
    return math.prod(op.results[0].tensor_type.static_shape)
