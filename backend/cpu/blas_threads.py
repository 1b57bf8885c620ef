"""One-thread and all-thread GEMM times, for the two-core schedule (overlap.py), and the
per-thread BLAS thread setting the schedule needs.

The schedule switches BLAS to one thread while its two threads run, and back after:
MKL's `mkl_set_num_threads_local` is per thread; OpenBLAS's `openblas_set_num_threads_local`
(0.3.27 and later) returns the previous setting but, measured here with SciPy's OpenBLAS
0.3.30, changes it for the whole process (another thread sees the new count) — so during a
window, other threads of the process calling SciPy's OpenBLAS run on one thread too.

Times are measured once per (provider, shape, thread setting) and cached beside blas.py's
(GIR_CACHE_DIR/gemm-thread-times-<machine>.json). On a machine shared with other work a measurement is
the best of several interleaved rounds (the least disturbed), not one run: a single run taken
while another pool's threads spin can be off by 5-10x (docs/performance-rnn.md).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from . import blas, quiet_timing


def _openblas() -> ctypes.CDLL | None:
    """The OpenBLAS library blas.py's `ob_*` entries are in, if it sets threads per thread."""
    found = blas.openblas()
    if found is None or not hasattr(found.lib, "openblas_set_num_threads_local"):
        return None
    return found.lib


def local_setter(family: str) -> int:
    """Address of `int f(int)` setting this thread's BLAS threads for family (0 if none)."""
    if family == "mkl":
        mkl = blas.providers().mkl
        return ctypes.cast(mkl.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value or 0 if mkl is not None else 0
    lib = _openblas()
    return ctypes.cast(lib.openblas_set_num_threads_local, ctypes.c_void_p).value or 0 if lib is not None else 0


def unavailable(family: str) -> str | None:
    """Why the two-core schedule cannot run here, or None."""
    if blas.threads() < 2:
        return f"BLAS runs on {blas.threads()} thread"
    if not local_setter(family):
        return f"{family} cannot set threads per thread here"
    return None


EXTERNALS = ("syscall", "sched_yield", "ob_threads_local", "mkl_threads_local")
"""The schedule's entries of the externals table (externals.py): futex, yield, the setters."""


def addresses() -> list[int]:
    """The EXTERNALS' addresses in this process (0: none here)."""
    libc = ctypes.CDLL(None)
    return [ctypes.cast(libc.syscall, ctypes.c_void_p).value or 0,
            ctypes.cast(libc.sched_yield, ctypes.c_void_p).value or 0, local_setter("openblas"), local_setter("mkl")]


def _cache_file() -> str:
    """Per machine, as blas.py's GEMM times: a copied home directory carries no other CPU's times."""
    from ...support.cache import cache_root

    return os.path.join(cache_root(), f"gemm-thread-times-{blas.machine_key()}.json")


_times: dict[str, float] | None = None
"""The times of `_times_path`, in memory (None: read it again)."""
_times_path: str | None = None


def _load() -> dict[str, float]:
    """The times of the cache folder in use now (read again when GIR_CACHE_DIR changes)."""
    global _times, _times_path
    path = _cache_file()
    if _times is None or path != _times_path:
        _times, _times_path = blas.read_times(path, blas.is_seconds), path
    return _times


class NotMeasured(Exception):
    """A GEMM's thread times are not measured yet; `params` are seconds()'s arguments (the
    measurement is queued in the background unless GIR_GEMM_MEASURE=off)."""

    def __init__(self, params: tuple):
        super().__init__(params)
        self.params = params


def _key(family: str, m: int, n: int, k: int, ta: bool, tb: bool) -> str:
    return f"{family} m={m} n={n} k={k} ta={int(ta)} tb={int(tb)} threads={blas.threads()}"


def is_measured(params: list) -> bool:
    """Whether every (family, m, n, k, ta, tb) has its thread times now."""
    times = _load()
    return all(f"{_key(*p)} t1" in times for p in params)


def seconds(family: str, m: int, n: int, k: int, ta: bool, tb: bool, threads: int) -> float:
    """Seconds of one float32 GEMM through family's plain path; threads=1 on one thread, 0 on
    the process's setting. Measured together (interleaved) and cached. Not measured yet: with
    GIR_GEMM_MEASURE=now it is measured here; otherwise NotMeasured is raised and (background,
    the default) it is measured on a background thread, as blas.py does for GEMM paths, so a
    first compile never waits for it."""
    key = _key(family, m, n, k, ta, tb)
    times = _load()
    params = (family, m, n, k, ta, tb)
    path = _cache_file()  # a measurement in the background stores here, wherever GIR_CACHE_DIR points then
    if f"{key} t1" not in times:
        mode = blas.measure_mode()
        if mode != "now":
            blas.measure_in_background(("threads", path) + params, lambda: _measure_into(path, key, params))
            raise NotMeasured(params)
        _measure_into(path, key, params)
        _retried.add(key)
    value = times[f"{key} t{1 if threads == 1 else 0}"]
    if quiet_timing.provisional(times.get(f"{key} {quiet_timing.DISTURBED}")) and key not in _retried:
        _retried.add(key)  # measured only in disturbed rounds: again, once per process, meanwhile
        blas.measure_in_background(("threads", path) + params, lambda: _measure_into(path, key, params))
    return value


_retried: set[str] = set()
_lock = threading.Lock()


def _measure_into(path: str, key: str, params: tuple) -> None:
    """Measures (1 and all threads) and stores the entry into the times file `path` (the one in
    use when the measurement was asked for), merged with a provisional one."""
    measured = _measure(*params)
    with _lock:
        times = _load() if path == _cache_file() else blas.read_times(path, blas.is_seconds)
        old = {part: times[f"{key} {part}"] for part in ("t1", "t0", quiet_timing.DISTURBED)
               if f"{key} {part}" in times}
        entry = quiet_timing.merge(old or None, *measured)
        disturbed = f"{key} {quiet_timing.DISTURBED}"
        times.pop(disturbed, None)
        ours = {f"{key} {part}": value for part, value in entry.items()}
        times.update(ours)
        # a clean measurement ends the provisional count
        blas.write_times(path, ours, drop=(disturbed,), valid=blas.is_seconds)


def _measure(family: str, m: int, n: int, k: int, ta: bool, tb: bool) -> tuple[dict[str, float], bool]:
    """({'t1': one thread, 't0': all threads}, disturbed): the best clean rounds, interleaved
    (quiet_timing.py)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    call = blas.gemm_caller("mkl" if family == "mkl" else "openblas", "f32", m, n, k, ta, tb, a, b, c)
    setter = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(local_setter(family))
    reps = max(3, min(50, int(1e8 / max(1, 2 * m * n * k))))

    def timed(one_thread: bool) -> Callable[[], float]:
        def run() -> float:
            before = setter(1) if one_thread else None
            call()
            start = time.perf_counter()
            for _ in range(reps):
                call()
            seconds = (time.perf_counter() - start) / reps
            if before is not None:
                setter(before)
            return seconds
        return run

    return quiet_timing.best_clean_rounds({"t1": timed(True), "t0": timed(False)})
