"""The GEMM providers the CPU backend calls through function pointers, and the choice between them.

Providers: MKL (`libmkl_rt` from PyPI's `mkl`, x86-64 Linux): `cblas_?gemm`, and for a weight
used at every step of a loop `cblas_?gemm_pack` once plus `cblas_?gemm_compute` per step;
OpenBLAS (NumPy's bundled ILP64 build, else SciPy's; Fortran ABI: `openblas()`). Which one a GEMM shape
takes is decided by measuring each candidate once per (shape, dtype, transposes, threads) and
cached on disk per machine (`gemm-times-<machine>.json`); a shape not measured yet takes a
model's guess and is measured in a background thread, so a first compile does not wait ~0.2 s
a shape (GIR_GEMM_MEASURE): on an AMD EPYC OpenBLAS wins large GEMMs while MKL's packed path can win
small ones; on Intel CPUs packing is known to pay. Where MKL cannot be loaded, OpenBLAS alone.

Compiled code never holds a process address: it gets a table of function pointers at every
call (externals.py; `FN_TABLE` is its first part), so object code can be cached on disk and reloaded.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ...config import blas_thread_environment, current
from . import quiet_timing

FN_TABLE = (
    "mkl_sgemm", "mkl_dgemm", "mkl_sgemm_pack", "mkl_dgemm_pack", "mkl_sgemm_compute", "mkl_dgemm_compute",
    "ob_sgemm", "ob_dgemm", "ob_somatcopy", "ob_domatcopy",
)
"""Slots of the function-pointer table passed to compiled code."""

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, CBLAS_PACKED = 101, 111, 112, 151
CBLAS_A_MATRIX, CBLAS_B_MATRIX = 161, 162


@dataclass
class Providers:
    mkl: ctypes.CDLL | None
    table: list[int]
    notice: str | None = None
    """Why MKL is missing, shown under -v."""

    @property
    def has_mkl(self) -> bool:
        return self.mkl is not None

    def table_array(self) -> ctypes.Array:
        return (ctypes.c_void_p * len(self.table))(*self.table)


def _find_mkl() -> str | None:
    for prefix in {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(sys.executable))}:
        for lib in ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"):
            path = os.path.join(prefix, "lib", lib)
            if os.path.lexists(path):  # what glob.glob of a name without wildcards did
                return path
    return None


def _capsule_pointer(capsule: object) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, get_name(capsule)))


def mkl_found() -> bool:
    """Whether MKL is there to be used (GIR_NO_MKL unset, `libmkl_rt` found), known from the
    file system without loading it: the cache keys ask this (`target_key`), so a compile-cache
    hit whose code calls no MKL path never loads MKL. It differs from
    `providers().has_mkl` only where the library is found but cannot be loaded."""
    return not current().no_mkl and _mkl_path() is not None


@cache
def _mkl_path() -> str | None:
    return _find_mkl()


@cache
def openblas_table() -> tuple[int, ...]:
    """FN_TABLE with OpenBLAS's entries filled and MKL's 0: what code calling no MKL path needs
    (externals.py fills MKL's slots only for code that calls one)."""
    table = [0] * len(FN_TABLE)
    table[FN_TABLE.index("ob_sgemm")], table[FN_TABLE.index("ob_dgemm")] = _openblas_gemms()
    found = openblas()
    if found is not None:
        table[FN_TABLE.index("ob_somatcopy")], table[FN_TABLE.index("ob_domatcopy")] = \
            found.omatcopy("s"), found.omatcopy("d")
    return tuple(table)


@cache
def providers() -> Providers:
    """MKL loaded (where found and not switched off) and the whole FN_TABLE: what compiling
    and measuring need; a cache hit's call needs only `openblas_table` unless its code calls MKL."""
    table = list(openblas_table())
    notice = None
    mkl = None
    if current().no_mkl:
        notice = "MKL disabled by GIR_NO_MKL; using OpenBLAS"
    else:
        path = _mkl_path()
        if path is None:
            notice = "MKL not found (pip install mkl on x86-64 Linux); using OpenBLAS"
        else:
            try:
                mkl = ctypes.CDLL(path)
                for slot, sym in (("mkl_sgemm", "cblas_sgemm"), ("mkl_dgemm", "cblas_dgemm"),
                                  ("mkl_sgemm_pack", "cblas_sgemm_pack"), ("mkl_dgemm_pack", "cblas_dgemm_pack"),
                                  ("mkl_sgemm_compute", "cblas_sgemm_compute"),
                                  ("mkl_dgemm_compute", "cblas_dgemm_compute")):
                    table[FN_TABLE.index(slot)] = ctypes.cast(getattr(mkl, sym), ctypes.c_void_p).value or 0
            except OSError as e:
                mkl, notice = None, f"MKL could not be loaded ({e}); using OpenBLAS"
    return Providers(mkl, table, notice)


@dataclass(frozen=True)
class OpenBLAS:
    """The OpenBLAS library the `ob_*` entries come from: its Fortran-ABI `?gemm_` symbols and
    the width of their integer arguments (64 for NumPy's ILP64 build)."""

    path: str
    prefix: str
    """What the library's symbols are named with: `scipy_sgemm_64_` is prefix + 'sgemm' + suffix."""
    suffix: str
    int_bits: int

    @property
    def lib(self) -> ctypes.CDLL:
        return ctypes.CDLL(self.path)  # the already-loaded handle after the first call

    def gemm(self, s: str) -> int:
        return ctypes.cast(getattr(self.lib, f"{self.prefix}{s}gemm{self.suffix}"), ctypes.c_void_p).value or 0

    def omatcopy(self, s: str) -> int:
        """OpenBLAS's out-of-place transpose (`?omatcopy_`, an extension to BLAS); 0 if absent."""
        try:
            return ctypes.cast(getattr(self.lib, f"{self.prefix}{s}omatcopy{self.suffix}"), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _site_lib(package: str, folder: str, prefix: str) -> str | None:
    """The one library `<prefix>*.so*` in `folder` beside `package` (found without importing
    it; matched by hand: glob's patterns cost a cache hit the `re` compiles of fnmatch)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    where = os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), folder)
    try:
        names = os.listdir(where)
    except OSError:
        return None
    hits = [n for n in names if n.startswith(prefix) and ".so" in n[len(prefix):]]
    return os.path.join(where, hits[0]) if len(hits) == 1 else None


def _numpy_openblas() -> OpenBLAS | None:
    path = _site_lib("numpy", "numpy.libs", "libscipy_openblas64_")
    return OpenBLAS(path, "scipy_", "_64_", 64) if path else None


def _scipy_openblas() -> OpenBLAS | None:
    path = _site_lib("scipy", "scipy.libs", "libscipy_openblas-") or \
        _site_lib("scipy", "scipy.libs", "libscipy_openblas")
    return OpenBLAS(path, "scipy_", "_", 32) if path and "openblas64" not in path else None


@cache
def openblas() -> OpenBLAS | None:
    """NumPy's own OpenBLAS where its wheel bundles one, else SciPy's (GIR_OPENBLAS=numpy|scipy
    forces one). NumPy's is preferred because it is the pool NumPy's own matmuls use (two
    OpenBLAS pools in one process spin against each other on a 2-core machine) and because
    it measured faster here: the per-step GEMM 32x256 @ 256x1024 took 0.132 ms with NumPy's
    0.3.31 against 0.181 ms with SciPy's 0.3.30 on 2 threads (`python bench/openblas_libs.py`,
    docs/backend.md)."""
    order = [_scipy_openblas, _numpy_openblas] if current().openblas == "scipy" else \
        [_numpy_openblas, _scipy_openblas]
    for find in order:
        found = find()
        if found is None:
            continue
        try:
            if found.gemm("s") and found.gemm("d"):
                return found
        except (OSError, AttributeError):
            continue  # another build: the next one, or cython_blas
    return None


def _openblas_gemms() -> tuple[int, int]:
    """The `ob_*` entries: sgemm_ and dgemm_ (Fortran ABI) of `openblas()`, straight from the
    library (~6 ms); importing scipy.linalg for its cython_blas table costs ~0.35 s, more than
    a whole compile, and is only the fallback."""
    found = openblas()
    if found is not None:
        return found.gemm("s"), found.gemm("d")
    from scipy.linalg import cython_blas

    return (_capsule_pointer(cython_blas.__pyx_capi__["sgemm"]), _capsule_pointer(cython_blas.__pyx_capi__["dgemm"]))


def openblas_int_bits() -> int:
    """The width of the `ob_*` entries' integer arguments (cython_blas's are 32-bit)."""
    found = openblas()
    return found.int_bits if found is not None else 32


def pack_size(dtype: str, m: int, n: int, k: int) -> int:
    """Bytes MKL needs to pack the B operand of an (m, n, k) GEMM."""
    mkl = providers().mkl
    assert mkl is not None
    f = mkl.cblas_sgemm_pack_get_size if dtype == "f32" else mkl.cblas_dgemm_pack_get_size
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return int(f(CBLAS_B_MATRIX, m, n, k))


# ---------------------------------------------------------------------------------------------
# Choosing a path by measuring


PATHS = ("mkl", "openblas", "mkl-packed", "openblas-copy", "gir-packed")


def _cache_file() -> str:
    """Measured times are per machine: a home directory copied to another CPU (or another BLAS)
    starts afresh instead of carrying this one's choices."""
    from ...support.cache import cache_root

    return os.path.join(cache_root(), f"gemm-times-{machine_key()}.json")


@cache
def machine_key() -> str:
    """The CPU model, the core count and the BLAS builds (MKL's version, SciPy's OpenBLAS)."""
    from ...support.cache import digest

    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    if model is None:  # asked only then: platform.processor() runs `uname -p` (~8 ms on a cache hit)
        model = platform.processor() or platform.machine()
    mkl = providers().mkl
    mkl_version = ""
    if mkl is not None:
        buf = ctypes.create_string_buffer(256)
        try:
            mkl.mkl_get_version_string(buf, 256)
            mkl_version = buf.value.decode(errors="replace")
        except AttributeError:
            mkl_version = "mkl"
    return digest(model, os.cpu_count(), mkl_version, found.name if (found := openblas()) else "cython_blas")[:16]


_choices: dict[str, dict[str, float]] | None = None
"""The measured times of `_choices_path`, in memory (None: read it again)."""
_choices_path: str | None = None
_choices_lock = threading.Lock()


def is_seconds(value: Any) -> bool:
    """A measured time (or a count of disturbed rounds): a finite number >= 0, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def is_path_entry(value: Any) -> bool:
    """An entry of the GEMM times file: {path or 'disturbed': seconds}."""
    return isinstance(value, dict) and all(isinstance(k, str) and is_seconds(v) for k, v in value.items())


def read_times(path: str, valid: Callable[[Any], bool] = is_path_entry) -> dict:
    """A JSON file of measured times (this module's, entries `is_path_entry`, and
    blas_threads.py's, entries `is_seconds`): {} if absent, damaged or untrusted
    (cache.read_file: a private regular file, so a FIFO there never blocks), or not a JSON
    object; an entry `valid` refuses is left out (not measured: measured again and
    overwritten). Valid JSON of another shape (`[1, 2]`, `null`, `{"k": "fast"}`) raised
    TypeError out of every compile with a matmul."""
    from ...support.cache import read_file

    data = read_file(path, limit=64 << 20)
    try:
        parsed = json.loads(data) if data is not None else {}
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested past the parser's limit
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {k: v for k, v in parsed.items() if valid(v)}


def write_times(path: str, ours: dict, drop: tuple[str, ...] = (), valid: Callable[[Any], bool] = is_path_entry
                ) -> None:
    """Writes ours, merged into what the file holds now less the keys `drop`: another process
    may have measured other shapes meanwhile, and keeps them (atomic: a reader never sees half
    a file). Entries `valid` refuses are dropped."""
    from ...support.cache import atomic_write

    merged = {k: v for k, v in read_times(path, valid).items() if k not in drop} | ours
    atomic_write(path, json.dumps(merged, indent=1, sort_keys=True).encode())


def _load_choices() -> dict[str, dict[str, float]]:
    """The times of the cache folder in use now: read again when GIR_CACHE_DIR names another
    folder than the one read (times measured for one folder are not copied into another)."""
    global _choices, _choices_path
    path = _cache_file()
    if _choices is None or path != _choices_path:
        _choices, _choices_path = read_times(path), path
    return _choices


def threads() -> int:
    mkl = providers().mkl
    if mkl is not None:
        return int(mkl.mkl_get_max_threads())
    return os.cpu_count() or 1


def threads_of(paths: list[str]) -> int:
    """The threads GEMMs taking `paths` run on now: OpenBLAS's count when none is MKL's (asking
    OpenBLAS is free; MKL's first call costs ~8 ms: a cache hit whose code calls only OpenBLAS
    does not start MKL to report it)."""
    found = openblas()
    if found is None or any(p in FAMILIES["mkl"] for p in paths):
        return threads()
    try:
        return int(getattr(found.lib, f"{found.prefix}openblas_get_num_threads{found.suffix}")())
    except (AttributeError, OSError):
        return threads()


def thread_setting() -> tuple:
    """What decides how many threads BLAS starts with, for cache keys: the environment and the
    CPUs this process may run on (read without starting MKL). A count changed in-process
    (threadpoolctl) is not in it: code cached for another count runs correctly, with GEMM paths
    measured for that count."""
    env = blas_thread_environment()
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return (*env, cpus)


def measure_mode() -> str:
    """GIR_GEMM_MEASURE: 'background' (default): a shape not measured yet takes the model's
    path now and is measured in a background thread, for later compiles; 'now': measured
    before compiling (slow the first time, ~0.2 s a shape); 'off': the model only."""
    return current().gemm_measure


def _candidates(packable: bool) -> list[str]:
    ours = ["openblas"] + (["openblas-copy"] if packable and has_transpose_copy() else []) + \
        (["gir-packed"] if packable and current().packed_gemm else [])
    return ours + (["mkl"] + (["mkl-packed"] if packable else []) if providers().has_mkl else [])


def has_transpose_copy() -> bool:
    """Whether the `openblas-copy` path can run: OpenBLAS's `?omatcopy_` in both precisions."""
    table = providers().table
    return bool(table[FN_TABLE.index("ob_somatcopy")] and table[FN_TABLE.index("ob_domatcopy")])


def _key(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool, packable: bool) -> str:
    return f"{dtype} m={m} n={n} k={k} ta={int(ta)} tb={int(tb)} packable={int(packable)} threads={threads()}"


def path_times(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool, packable: bool) -> dict[str, float] | None:
    """Seconds of one GEMM of this shape through each available path, measured once per
    machine and cached on disk; None when it is not measured yet (and, unless GIR_GEMM_MEASURE
    says 'now', is not measured here: `measure_later` queues it)."""
    candidates = _candidates(packable)
    key = _key(dtype, m, n, k, ta, tb, packable)
    with _choices_lock:
        found = _load_choices().get(key)
    if isinstance(found, dict) and all(c in found for c in candidates):
        if not quiet_timing.provisional(found.get(quiet_timing.DISTURBED)) or key in _retried:
            return {c: found[c] for c in candidates}
        _retried.add(key)  # measured only in disturbed rounds: once more per process
        if measure_mode() != "now":
            measure_later((dtype, m, n, k, ta, tb, packable))
            return {c: found[c] for c in candidates}
    elif measure_mode() != "now":
        return None
    entry = _store(_cache_file(), key, *_measure_or_model((dtype, m, n, k, ta, tb, packable)))
    return {c: entry[c] for c in candidates}


_retried: set[str] = set()


def _measure_or_model(params: tuple) -> tuple[dict[str, float], bool, bool]:
    """(times, disturbed, model) of a shape (path_times' arguments): measured within
    quiet_timing.BUDGET, else (the program kept the process busy all along) the model's."""
    dtype, m, n, k, ta, tb, packable = params
    try:
        return (*_measure_all(_candidates(packable), dtype, m, n, k, ta, tb), False)
    except quiet_timing.Unmeasured:
        return model_times(*params), True, True


def _store(path: str, key: str, times: dict[str, float], disturbed: bool, model: bool = False) -> dict[str, float]:
    """Stores a measurement into the times file `path` (the one in use when it was asked for:
    a background measurement finishing after GIR_CACHE_DIR changed still goes to the folder it
    was measured for), merged with a provisional entry there; returns the entry."""
    with _choices_lock:
        choices = _load_choices() if path == _cache_file() else read_times(path)
        entry = choices[key] = quiet_timing.merge(choices.get(key), times, disturbed, model)
        write_times(path, {key: entry})
        return entry


def model_times(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool, packable: bool) -> dict[str, float]:
    """A guess of path_times before any measurement: 2mnk flops at a nominal rate, with the
    provider that wins on this CPU vendor a little faster (MKL on Intel, OpenBLAS elsewhere;
    MKL's packed path a little faster still for a weight packed once per loop)."""
    flops = 2.0 * m * n * k
    intel = "intel" in _vendor()
    out = {}
    for c in _candidates(packable):
        rate = 1.0 if (c in FAMILIES["openblas"]) != intel else 0.8
        if c == "mkl-packed":
            rate *= 1.05
        elif c == "gir-packed":  # measured 1.09-1.66x OpenBLAS on an EPYC (bench/packed_gemm.py): 1.1 to be safe
            rate *= 1.1
        out[c] = flops / (rate * 1e11) + 2e-6
    return out


@cache
def _vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip().lower() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return platform.processor().lower()


_queue: list[tuple[tuple, Callable[[], None]]] = []
"""(key, task) of the measurements waiting for the background measurer."""
_worker: threading.Thread | None = None
_stop = quiet_timing.STOP
"""Set at exit: the worker takes no further task, and the one it runs stops at its next round."""


def measure_later(params: tuple) -> None:
    """Queues a shape (path_times' arguments) for the background measurer."""
    path, key = _cache_file(), _key(*params)  # where and under what it is stored: known now

    def task() -> None:
        measured = _measure_or_model(params)
        if not _stop.is_set():
            _store(path, key, *measured)
    measure_in_background(("paths", path) + tuple(params), task)


def measure_in_background(key: tuple, task: Callable[[], None]) -> None:
    """Queues a measurement (GEMM paths here, GEMM thread times in blas_threads.py) for the one
    background measurer, which runs them one by one: two measuring at once on 2 cores would
    only disturb each other. Nothing is queued unless GIR_GEMM_MEASURE is 'background'. A task
    writes to the times file it was queued for (key names it), never to the cache folder
    current when it finishes."""
    global _worker, _worker_takes_more
    if measure_mode() != "background":
        return
    with _choices_lock:
        if key not in _queued:
            _queued.add(key)
            _queue.append((key, task))
        if _worker is None or not _worker.is_alive() or not _worker_takes_more:
            _worker = threading.Thread(target=_measure_queue, name="gir-gemm-measure", daemon=True)
            _worker_takes_more = True
            _worker.start()


_queued: set[tuple] = set()
_worker_takes_more = False
"""False once the worker found the queue empty (under the lock) and is ending: it may still be
alive for a moment, but a task queued now needs a new worker."""


def _measure_queue() -> None:
    """Runs the queued measurements one by one, each saving what it measured (so a process that
    exits early keeps it). Runs while the program does."""
    global _worker_takes_more
    while True:
        with _choices_lock:
            if _stop.is_set() or not _queue:
                _worker_takes_more = False
                return
            key, task = _queue.pop(0)
        try:
            with quiet_timing.background(f"GEMM measurement ({' '.join(str(p) for p in key[2:])})"):
                task()
        except quiet_timing.Stopped:
            return  # the process is exiting
        except Exception:  # noqa: BLE001 - a measurement that fails leaves its shape unmeasured (the
            continue  # model's path stays); it must not end the measurer with tasks queued behind it


def wait_for_measurements(timeout: float | None = None) -> bool:
    """Blocks until the background measurer is idle (no worker alive and nothing queued); True
    when it is (for benchmarks, tests). A worker may end and another start for a task queued
    meanwhile: it waits for that one too (it used to return True while it ran)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _choices_lock:  # a task is queued and its worker started under this lock: seen together
            worker, queued = _worker, bool(_queue)
        if worker is None or not worker.is_alive():
            # stopped at exit, what is queued never runs; else a dead worker with tasks left
            # (it cannot end so: it survives failing tasks) would never become idle
            return not queued or _stop.is_set()
        worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if deadline is not None and time.monotonic() >= deadline:
            with _choices_lock:
                return (_worker is None or not _worker.is_alive()) and not _queue


def drop_queued_measurements(timeout: float | None = None) -> bool:
    """Drops the measurements queued and not started, then waits for the running one (at most
    timeout seconds); True when the measurer is idle. Tests call it after each test (a test's
    measurements belong to its own cache folder and its own monkeypatched state)."""
    with _choices_lock:
        _queued.difference_update(key for key, _ in _queue)  # may be queued again later
        _queue.clear()
    return wait_for_measurements(timeout)


@atexit.register
def _stop_measuring() -> None:
    _stop.set()
    worker = _worker
    if worker is not None:
        worker.join(1.0)


FAMILIES = {"mkl": ("mkl", "mkl-packed"), "openblas": ("openblas", "openblas-copy", "gir-packed")}
"""A compiled function calls one provider only: MKL's and OpenBLAS's thread pools, both
spinning on 2 cores, slowed an LSTM step 4x when a function mixed them (docs/performance.md)."""

PROVIDER_NAMES = {"mkl": "MKL", "mkl-packed": "MKL (packed)", "openblas": "OpenBLAS",
                  "openblas-copy": "OpenBLAS (weight copied to the other orientation)",
                  "gir-packed": "gir's packed kernel"}


def provider_of(path: str) -> str:
    """What a GEMM path calls, in words (`gir run -v`)."""
    return PROVIDER_NAMES.get(path, path)


# Choosing the family and each GEMM's path from these times is the schedule step's
# (schedule/gemms.py), on a snapshot of them (snapshot.py).


def is_measured(sites: list[tuple]) -> bool:
    """Whether every GEMM shape in sites (path_times' arguments) has measured times now (a
    compiled function whose paths came from the model is compiled again once they do)."""
    if current().gemm_path or measure_mode() != "background":
        return True  # nothing is chosen by measuring, or it is measured now, or never
    return all(len(_candidates(p[-1])) == 1 or path_times(*p) is not None for p in sites)


_GEMM_ARGS = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]


def _measure(path: str, dtype: str, m: int, n: int, k: int, ta: bool, tb: bool) -> float:
    """Median seconds of one GEMM of this shape through `path` (packing is not timed: it is
    done once per loop, not once per step)."""
    np_dtype = np.float32 if dtype == "f32" else np.float64
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np_dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np_dtype)
    c = np.zeros((m, n), np_dtype)
    call = gemm_caller(path, dtype, m, n, k, ta, tb, a, b, c)
    call()
    reps = max(3, min(50, int(2e8 / max(1, 2 * m * n * k))))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        times.append((time.perf_counter() - start) / reps)
    return sorted(times)[2]


def _measure_all(paths: list[str], dtype: str, m: int, n: int, k: int, ta: bool,
                 tb: bool) -> tuple[dict[str, float], bool]:
    """(seconds of one GEMM of this shape through each path, disturbed): the best clean round
    of at least 5, the paths interleaved within each round (quiet_timing.py). Measured one path
    after the other, a path measured while the previous provider's thread pool was still
    spinning on the other core came out 5-10x slow on a 2-core machine (OpenBLAS 48 ms against
    4.9 ms for a 256x1024x1600 GEMM measured right after MKL), and that one number made the
    whole function take MKL (docs/performance-rnn.md)."""
    np_dtype = np.float32 if dtype == "f32" else np.float64
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np_dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np_dtype)
    c = np.zeros((m, n), np_dtype)
    reps = max(3, min(50, int(2e8 / max(1, 2 * m * n * k))))
    return quiet_timing.best_clean_rounds({p: _round(gemm_caller(p, dtype, m, n, k, ta, tb, a, b, c), reps)
                                           for p in paths}, pools={p: family_of(p) for p in paths},
                                          settle=spin_settle())


def family_of(path: str) -> str:
    """The provider (thread pool) a path runs on: a key of FAMILIES."""
    return next(f for f, paths in FAMILIES.items() if path in paths)


def spin_settle() -> float:
    """Seconds a measurement waits between rounds of different providers: their pools' spinning
    (quiet_timing.SPIN) where some pool has a second thread, else none."""
    return quiet_timing.SPIN if threads() > 1 or threads_of(["openblas"]) > 1 else 0.0


def _round(call, reps: int):  # noqa: ANN001, ANN202
    """One timed round of `reps` calls, after two untimed ones (they wake this provider's pool
    after the other's ran)."""
    def run() -> float:
        call()
        call()
        start = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - start) / reps
    return run


def gemm_caller(path: str, dtype: str, m: int, n: int, k: int, ta: bool, tb: bool,
                a: np.ndarray, b: np.ndarray, c: np.ndarray):  # noqa: ANN201
    """A Python callable doing c = a @ b through `path` (for measuring and for tests)."""
    prov = providers()
    scalar = ctypes.c_float if dtype == "f32" else ctypes.c_double
    lda = a.shape[1]
    ldb = b.shape[1]
    if path == "openblas-copy":  # the weight copied to the other orientation once (not timed)
        b, tb = np.ascontiguousarray(b.T), not tb
        ldb = b.shape[1]
        path = "openblas"
    if path in _CALLERS:
        return _CALLERS[path](dtype, m, n, k, ta, tb, a, b, c)
    if path == "gir-packed":
        raise RuntimeError("gir-packed is measured through LLVM: import gir.backend.cpu.llvm_jit first")
    pa, pb, pc = (x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c))
    if path == "openblas":
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 13))(prov.table[FN_TABLE.index(f"ob_{dtype[0:1]}gemm".replace(
            "ob_f", "ob_s" if dtype == "f32" else "ob_d"))])
        # Row-major C = A B is column-major C^T = B^T A^T.
        tra = ctypes.c_char(b"T" if tb else b"N")
        trb = ctypes.c_char(b"T" if ta else b"N")
        int_type = ctypes.c_int64 if openblas_int_bits() == 64 else ctypes.c_int32
        ints = [int_type(x) for x in (n, m, k, ldb, lda, n)]
        one, zero = scalar(1.0), scalar(0.0)
        refs = [ctypes.byref(x) for x in (tra, trb, ints[0], ints[1], ints[2], one)]
        args = refs + [pb, ctypes.byref(ints[3]), pa, ctypes.byref(ints[4]), ctypes.byref(zero), pc,
                       ctypes.byref(ints[5])]
        return lambda: (fn(*args), b)  # holds b: for openblas-copy, the only reference to the copy
    mkl = prov.mkl
    assert mkl is not None
    prefix = "cblas_s" if dtype == "f32" else "cblas_d"
    t_a = CBLAS_TRANS if ta else CBLAS_NO_TRANS
    t_b = CBLAS_TRANS if tb else CBLAS_NO_TRANS
    if path == "mkl":
        f = getattr(mkl, prefix + "gemm")
        f.argtypes = _GEMM_ARGS + [scalar, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, scalar,
                                   ctypes.c_void_p, ctypes.c_int]
        return lambda: f(CBLAS_ROW_MAJOR, t_a, t_b, m, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, n)
    size = pack_size(dtype, m, n, k)
    packed = np.zeros(size // np.dtype(np.float32).itemsize + 16, np.float32)
    pack = getattr(mkl, prefix + "gemm_pack")
    pack.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, scalar,
                     ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    pack(CBLAS_ROW_MAJOR, CBLAS_B_MATRIX, t_b, m, n, k, 1.0, pb, ldb, packed.ctypes.data_as(ctypes.c_void_p))
    compute = getattr(mkl, prefix + "gemm_compute")
    compute.argtypes = _GEMM_ARGS + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, scalar,
                                     ctypes.c_void_p, ctypes.c_int]
    pp = packed.ctypes.data_as(ctypes.c_void_p)
    return lambda: (compute(CBLAS_ROW_MAJOR, t_a, CBLAS_PACKED, m, n, k, pa, lda, pp, ldb, 0.0, pc, n), packed)


_CALLERS: dict[str, Callable[..., Callable[[], object]]] = {}
"""Paths measured through a caller a higher floor provides: `gir-packed` runs gir's own kernel,
compiled by LLVM (llvm_jit.packed_caller registers it when llvm_jit is imported, which every
compile does before it schedules: blas.py imports nothing above it)."""


def register_caller(path: str, make: Callable[..., Callable[[], object]]) -> None:
    """make(dtype, m, n, k, ta, tb, a, b, c) -> a callable doing c = a @ b through path."""
    _CALLERS[path] = make
