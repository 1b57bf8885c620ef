"""The GEMM providers the CPU backend calls through function pointers, and the choice between them.

Providers: MKL (`libmkl_rt` from PyPI's `mkl`, x86-64 Linux): `cblas_?gemm`, and for a weight
used at every step of a loop `cblas_?gemm_pack` once plus `cblas_?gemm_compute` per step;
OpenBLAS (SciPy's, through `scipy.linalg.cython_blas`, Fortran ABI). Which one a GEMM shape
takes is decided by measuring each candidate once per (shape, dtype, transposes, threads) and
cached on disk: on an AMD EPYC OpenBLAS wins large GEMMs while MKL's packed path can win
small ones; on Intel CPUs packing is known to pay. Where MKL cannot be loaded, OpenBLAS alone.

Compiled code never holds a process address: it gets a table of function pointers
(`FN_TABLE` order) at every call, so object code can be cached on disk and reloaded.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import time
from dataclasses import dataclass
from functools import cache

import numpy as np

FN_TABLE = (
    "mkl_sgemm", "mkl_dgemm", "mkl_sgemm_pack", "mkl_dgemm_pack", "mkl_sgemm_compute", "mkl_dgemm_compute",
    "ob_sgemm", "ob_dgemm",
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
            hits = glob.glob(os.path.join(prefix, "lib", lib))
            if hits:
                return hits[0]
    return None


def _capsule_pointer(capsule: object) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, get_name(capsule)))


@cache
def providers() -> Providers:
    table = [0] * len(FN_TABLE)
    notice = None
    mkl = None
    if os.environ.get("GIR_NO_MKL"):
        notice = "MKL disabled by GIR_NO_MKL; using OpenBLAS"
    else:
        path = _find_mkl()
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
    from scipy.linalg import cython_blas

    table[FN_TABLE.index("ob_sgemm")] = _capsule_pointer(cython_blas.__pyx_capi__["sgemm"])
    table[FN_TABLE.index("ob_dgemm")] = _capsule_pointer(cython_blas.__pyx_capi__["dgemm"])
    return Providers(mkl, table, notice)


def symbol(slot: str) -> str:
    return "gir_" + slot


def bind_symbols() -> None:
    """Tells LLVM's JIT linker where each gir_<slot> BLAS entry is in this process."""
    import llvmlite.binding as llvm

    for slot, address in zip(FN_TABLE, providers().table):
        if address:
            llvm.add_symbol(symbol(slot), address)


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


PATHS = ("mkl", "openblas", "mkl-packed")


def _cache_file() -> str:
    root = os.environ.get("GIR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gir")
    return os.path.join(root, "gemm-times.json")


_choices: dict[str, dict[str, float]] | None = None


def _load_choices() -> dict[str, dict[str, float]]:
    global _choices
    if _choices is None:
        try:
            with open(_cache_file(), encoding="utf-8") as f:
                _choices = dict(json.load(f))
        except (OSError, ValueError):
            _choices = {}
    return _choices


def _save_choices() -> None:
    path = _cache_file()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + f".{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(_choices, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs re-measuring


def threads() -> int:
    mkl = providers().mkl
    if mkl is not None:
        return int(mkl.mkl_get_max_threads())
    return os.cpu_count() or 1


def path_times(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool, packable: bool) -> dict[str, float]:
    """Seconds of one GEMM of this shape through each available path, measured once per
    machine and cached on disk."""
    prov = providers()
    candidates = ["openblas"] + (["mkl"] + (["mkl-packed"] if packable else []) if prov.has_mkl else [])
    key = f"{dtype} m={m} n={n} k={k} ta={int(ta)} tb={int(tb)} packable={int(packable)} threads={threads()}"
    choices = _load_choices()
    found = choices.get(key)
    if not isinstance(found, dict) or not all(c in found for c in candidates):
        found = _measure_all(candidates, dtype, m, n, k, ta, tb)
        choices[key] = found
        _save_choices()
    return {c: found[c] for c in candidates}


FAMILIES = {"mkl": ("mkl", "mkl-packed"), "openblas": ("openblas",)}
"""A compiled function calls one provider only: MKL's and OpenBLAS's thread pools, both
spinning on 2 cores, slowed an LSTM step 4x when a function mixed them (docs/performance.md)."""


def choose_family(sites: list[tuple[tuple, int]]) -> str:
    """The provider whose best paths make the function's GEMMs fastest; sites are
    ((dtype, m, n, k, ta, tb, packable), times run per call)."""
    forced = os.environ.get("GIR_GEMM_PATH")
    if forced:
        return "openblas" if forced == "openblas" else "mkl"
    if not providers().has_mkl:
        return "openblas"
    totals = {family: 0.0 for family in FAMILIES}
    for params, count in sites:
        times = path_times(*params)
        for family, paths in FAMILIES.items():
            totals[family] += count * min(times[p] for p in paths if p in times)
    return min(totals, key=totals.__getitem__)


def choose_path(dtype: str, m: int, n: int, k: int, ta: bool, tb: bool, packable: bool,
                family: str | None = None) -> str:
    """'mkl', 'openblas' or 'mkl-packed' for this GEMM (within `family` if given): the fastest
    measured path. GIR_GEMM_PATH forces one (where it applies)."""
    forced = os.environ.get("GIR_GEMM_PATH")
    times = path_times(dtype, m, n, k, ta, tb, packable)
    if forced in times:
        return forced  # type: ignore[return-value]
    allowed = [p for p in times if family is None or p in FAMILIES[family]]
    return min(allowed or list(times), key=times.__getitem__)


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


def _measure_all(paths: list[str], dtype: str, m: int, n: int, k: int, ta: bool, tb: bool) -> dict[str, float]:
    """Seconds of one GEMM of this shape through each path: the best of 5 rounds, the paths
    interleaved within each round. Measured one path after the other (the median of one path's
    runs, then the next path's), a path measured while the previous provider's thread pool was
    still spinning on the other core came out 5-10x slow on a 2-core machine (OpenBLAS 48 ms
    against 4.9 ms for a 256x1024x1600 GEMM measured right after MKL), and that one number
    made the whole function take MKL (docs/performance-rnn.md); the best round is the one the
    least disturbed by the other pool and by other processes."""
    np_dtype = np.float32 if dtype == "f32" else np.float64
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np_dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np_dtype)
    c = np.zeros((m, n), np_dtype)
    calls = {p: gemm_caller(p, dtype, m, n, k, ta, tb, a, b, c) for p in paths}
    reps = max(3, min(50, int(2e8 / max(1, 2 * m * n * k))))
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(5):
        for p, call in calls.items():
            call()
            call()  # wakes this provider's pool after the other's ran
            start = time.perf_counter()
            for _ in range(reps):
                call()
            best[p] = min(best[p], (time.perf_counter() - start) / reps)
    return best


def gemm_caller(path: str, dtype: str, m: int, n: int, k: int, ta: bool, tb: bool,
                a: np.ndarray, b: np.ndarray, c: np.ndarray):  # noqa: ANN201
    """A Python callable doing c = a @ b through `path` (for measuring and for tests)."""
    prov = providers()
    scalar = ctypes.c_float if dtype == "f32" else ctypes.c_double
    lda = a.shape[1]
    ldb = b.shape[1]
    pa, pb, pc = (x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c))
    if path == "openblas":
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 13))(prov.table[FN_TABLE.index(f"ob_{dtype[0:1]}gemm".replace(
            "ob_f", "ob_s" if dtype == "f32" else "ob_d"))])
        # Row-major C = A B is column-major C^T = B^T A^T.
        tra = ctypes.c_char(b"T" if tb else b"N")
        trb = ctypes.c_char(b"T" if ta else b"N")
        ints = [ctypes.c_int(x) for x in (n, m, k, ldb, lda, n)]
        one, zero = scalar(1.0), scalar(0.0)
        refs = [ctypes.byref(x) for x in (tra, trb, ints[0], ints[1], ints[2], one)]
        args = refs + [pb, ctypes.byref(ints[3]), pa, ctypes.byref(ints[4]), ctypes.byref(zero), pc,
                       ctypes.byref(ints[5])]
        return lambda: fn(*args)
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
