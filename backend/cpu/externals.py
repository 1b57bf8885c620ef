"""The table of external functions compiled code calls: `fns`, the third argument of `gir_main`
and `gir_worker` (codegen.call_external).

Object code loads every external's address from this table instead of naming a symbol, so it
holds no process address and needs no symbol resolved at load time beyond libc's and libm's:
the same bytes are cached on disk, loaded by LLVM's JIT linker, or linked into a shared
library that a cache hit loads with the system's dynamic loader (runtime.py).
"""

from __future__ import annotations

import ctypes
import threading
from functools import cache

from ...errors import GirError, Location
from . import blas, blas_threads, team

SLOTS: tuple[str, ...] = blas.FN_TABLE + blas_threads.EXTERNALS + team.EXTERNALS
"""The table's order: the BLAS entries (blas.FN_TABLE), the two-core schedule's, the split
schedule's."""

MKL_SLOTS = frozenset(slot for slot in SLOTS if slot.startswith("mkl_"))
"""The slots whose addresses come from MKL: 0 until code calling one of them is loaded
(`check`), so a process whose code calls only OpenBLAS never loads MKL (a compile-cache hit in a
new process asked it in the key and in `Code.stale`: docs/performance.md, "The hit path by counts")."""

_mkl_lock = threading.Lock()
_mkl_filled = False


def index(slot: str) -> int:
    return SLOTS.index(slot)


@cache
def table() -> ctypes.Array:
    """This process's table (one array for every function: built once; MKL's slots are filled
    in place when code that calls one is loaded, and no address changes after that)."""
    addresses = list(blas.openblas_table()) + blas_threads.addresses(mkl=False) + team.addresses()
    return (ctypes.c_void_p * len(SLOTS))(*addresses)


def _fill_mkl(fns: ctypes.Array) -> None:
    """Loads MKL (blas.providers) and writes its slots; code already running calls none of
    them, so writing them while it runs is safe."""
    global _mkl_filled
    with _mkl_lock:
        if _mkl_filled:
            return
        full = blas.providers().table
        for i, slot in enumerate(blas.FN_TABLE):
            if slot in MKL_SLOTS:
                fns[index(slot)] = full[i]
        fns[index("mkl_threads_local")] = blas_threads.local_setter("mkl")
        _mkl_filled = True


def check(used: list[str], loc: Location | None = None) -> None:
    """Refuses code that calls a slot this process has no function for (it would jump to 0),
    at the compiled function's location; before that, fills MKL's slots if the code calls one."""
    fns = table()
    if not _mkl_filled and any(slot in MKL_SLOTS for slot in used):
        _fill_mkl(fns)
    missing = [slot for slot in used if slot not in SLOTS or not fns[index(slot)]]
    if missing:
        raise GirError(f"compiled code calls {', '.join(missing)}, which this process does not provide "
                       "(compiled for another BLAS setup? GIR_CACHE=0 compiles it again)", loc)
