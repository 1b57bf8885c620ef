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


def addresses(mkl: bool = True) -> list[int]:
    """The EXTERNALS' addresses in this process (0: none here); mkl=False: MKL's setter 0 too,
    without loading MKL (externals.py fills it for code that calls it)."""
    libc = ctypes.CDLL(None)
    return [ctypes.cast(libc.syscall, ctypes.c_void_p).value or 0,
            ctypes.cast(libc.sched_yield, ctypes.c_void_p).value or 0, local_setter("openblas"),
            local_setter("mkl") if mkl else 0]


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


def measured_times() -> dict[str, float]:
    """A copy of the times file in use now (for the schedule's snapshot, snapshot.py)."""
    with _lock:
        return dict(_load())


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
    try:
        measured, model = _measure(*params), False
    except quiet_timing.Unmeasured:  # the program kept the process busy for the whole budget
        measured, model = (model_seconds(*params[1:]), True), True
    with _lock:
        times = _load() if path == _cache_file() else blas.read_times(path, blas.is_seconds)
        old = {part: times[f"{key} {part}"] for part in ("t1", "t0", quiet_timing.DISTURBED, quiet_timing.MODEL)
               if f"{key} {part}" in times}
        entry = quiet_timing.merge(old or None, *measured, model)
        marks = (f"{key} {quiet_timing.DISTURBED}", f"{key} {quiet_timing.MODEL}")
        for mark in marks:
            times.pop(mark, None)
        ours = {f"{key} {part}": value for part, value in entry.items()}
        times.update(ours)
        # a clean measurement ends the provisional count
        blas.write_times(path, ours, drop=marks, valid=blas.is_seconds)


def model_seconds(m: int, n: int, k: int, ta: bool, tb: bool) -> dict[str, float]:
    """The deterministic guess when nothing was measured: 2mnk flops at a nominal 50 GFLOP/s on
    one thread, all threads 1.6x faster, each plus a call's overhead (a guess: its only duty is to
    give the same answer every time, so the schedule settles)."""
    one = 2.0 * m * n * k / 5e10 + 2e-6
    return {"t1": one, "t0": one / 1.6 + 3e-6}


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

    pool = "mkl" if family == "mkl" else "openblas"  # after the other provider's rounds, its pool settles
    return quiet_timing.best_clean_rounds({"t1": timed(True), "t0": timed(False)}, pools={"t1": pool, "t0": pool},
                                          settle=blas.spin_settle())


# ---------------------------------------------------------------------------------------------
# At run time: one thread while the second core is taken (issue 28)


class Governor:
    """Whether a compiled function's calls run BLAS (and the two-core schedules) on all threads
    or on one, decided from the calls themselves. On a 2-core machine whose other core is busy,
    a 2-thread GEMM waits for that core at every synchronisation: a step measured 10-20x slower
    than on one thread (docs/performance.md, "Performance on a shared machine").

    All threads (the compiled schedule) until STRIKES calls in a row each took more than
    SLOW_FACTOR times the fastest all-thread call and lost their core (involuntary switches);
    then one thread (the worker of the two-core schedule is not started: the calling thread
    claims every chunk; split loops run alone, OpenBLAS being set to one), and every PROBE calls
    one call on all threads again: back to all threads when it is no slower than the median of
    the recent one-thread calls. The other way too: on all threads, call FIRST_PROBE and then
    every PROBE calls run on one thread, and the calls go to one thread when that one was
    faster than the median of the recent all-thread calls by SLOW_FACTOR: a process that starts
    on a busy machine has no quiet all-thread time to be slower than (measured: LSTM-S beside
    two busy processes, 2 threads 265 ms median against 53 ms on one, and no strike in 120
    calls). The decision uses counts and the call's own times only, so a test drives it with
    made-up ones."""

    STRIKES = 3
    SLOW_FACTOR = 2.0
    PROBE = 32
    KEEP = 15
    """One-thread calls whose median a probe is compared with (and all-thread calls, for a probe
    on one thread)."""
    FIRST_PROBE = 10
    """The call that first tries one thread while the calls run on all."""

    def __init__(self) -> None:
        self.one_thread = False
        self.probing = False
        self.quiet_all = 0.0
        self.strikes = 0
        self.since_probe = 0
        self.recent_one: list[float] = []
        self.recent_all: list[float] = []
        self.calls_all = 0
        """Calls on all threads since the last switch (FIRST_PROBE, PROBE)."""
        self.switches_to_one = 0
        """How many times the calls went to one thread (fn.stats)."""

    def use_one_thread(self) -> bool:
        """Whether the next call runs on one thread (a probe every PROBE calls does not; on all
        threads, a probe on one thread at call FIRST_PROBE and every PROBE calls after)."""
        if not self.one_thread:
            self.calls_all += 1
            n = self.calls_all - self.FIRST_PROBE
            return n >= 0 and n % self.PROBE == 0
        self.since_probe += 1
        self.probing = self.since_probe >= self.PROBE
        if self.probing:
            self.since_probe = 0
        return not self.probing

    def record(self, seconds: float, switches: int, one_thread: bool) -> None:
        """A call's seconds, the involuntary switches it suffered, and how it ran."""
        if one_thread and not self.one_thread:  # a probe on one thread
            alls = sorted(self.recent_all)
            if alls and seconds * self.SLOW_FACTOR < alls[len(alls) // 2]:
                self._to_one_thread()
                self.recent_one = [seconds]
            return
        if one_thread:
            self.recent_one = (self.recent_one + [seconds])[-self.KEEP:]
            return
        if self.one_thread:  # a probe on all threads
            ones = sorted(self.recent_one)
            if not ones or seconds <= ones[len(ones) // 2]:
                self.one_thread, self.strikes, self.calls_all, self.recent_all = False, 0, 0, []
                self.quiet_all = min(self.quiet_all, seconds) if self.quiet_all else seconds
            return
        self.recent_all = (self.recent_all + [seconds])[-self.KEEP:]
        if not self.quiet_all or seconds < self.quiet_all:
            self.quiet_all = seconds
        slow = seconds > self.SLOW_FACTOR * self.quiet_all and switches > 0
        self.strikes = self.strikes + 1 if slow else 0
        if self.strikes >= self.STRIKES:
            self._to_one_thread()

    def _to_one_thread(self) -> None:
        self.one_thread, self.strikes, self.since_probe = True, 0, 0
        self.recent_one = []
        self.switches_to_one += 1

    def describe(self) -> str:
        if not self.switches_to_one:
            return "all threads"
        now = "one thread" if self.one_thread else "all threads"
        return (f"{now} (went to one thread {self.switches_to_one} time(s): calls over "
                f"{self.SLOW_FACTOR:g}x their quiet time while they lost their core, or a call on one thread "
                f"{self.SLOW_FACTOR:g}x faster than those on all; a probe every {self.PROBE} calls)")


class OneThread:
    """Sets BLAS to one thread for a call and back after. MKL's setter is per thread: each call
    saves and restores its own. OpenBLAS's is process-wide (module docstring): the first of the
    calls in flight saves and sets, the last restores, so calls from several threads never
    leave the process on one thread (other threads' OpenBLAS calls run on one meanwhile)."""

    def __init__(self, setter: Callable[[int], int], process_wide: bool):
        self._set = setter
        self._process_wide = process_wide
        self._lock = threading.Lock()
        self._count = 0
        self._saved = 0

    def enter(self) -> int:
        if not self._process_wide:
            return self._set(1)
        with self._lock:
            self._count += 1
            if self._count == 1:
                self._saved = self._set(1)
            return self._saved

    def leave(self, token: int) -> None:
        if not self._process_wide:
            self._set(token)
            return
        with self._lock:
            self._count -= 1
            if self._count == 0:
                self._set(self._saved)


_one_thread: dict[str, OneThread | None] = {}


def one_thread(family: str) -> OneThread | None:
    """The OneThread of the function's GEMM family ('mkl' or 'openblas'; one per process); None
    where there is no setter or BLAS runs on one thread anyway."""
    if family not in _one_thread:
        address = local_setter(family) if blas.threads() >= 2 else 0
        setter = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(address) if address else None
        _one_thread[family] = OneThread(setter, family != "mkl") if setter is not None else None
    return _one_thread[family]
