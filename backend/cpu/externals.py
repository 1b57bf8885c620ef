"""The table of external functions compiled code calls: `fns`, the third argument of `gir_main`
and `gir_worker` (codegen.call_external).

Object code loads every external's address from this table instead of naming a symbol, so it
holds no process address and needs no symbol resolved at load time beyond libc's and libm's:
the same bytes are cached on disk, loaded by LLVM's JIT linker, or linked into a shared
library that a cache hit loads with the system's dynamic loader (runtime.py).
"""

from __future__ import annotations

import ctypes
from functools import cache

from ...errors import GirError, Location
from . import blas, blas_threads, team

SLOTS: tuple[str, ...] = blas.FN_TABLE + blas_threads.EXTERNALS + team.EXTERNALS
"""The table's order: the BLAS entries (blas.FN_TABLE), the two-core schedule's, the split
schedule's."""


def index(slot: str) -> int:
    return SLOTS.index(slot)


@cache
def table() -> ctypes.Array:
    """This process's table (the addresses never change while it runs: built once)."""
    addresses = blas.providers().table + blas_threads.addresses() + team.addresses()
    return (ctypes.c_void_p * len(SLOTS))(*addresses)


def check(used: list[str], loc: Location | None = None) -> None:
    """Refuses code that calls a slot this process has no function for (it would jump to 0),
    at the compiled function's location."""
    fns = table()
    missing = [slot for slot in used if slot not in SLOTS or not fns[index(slot)]]
    if missing:
        raise GirError(f"compiled code calls {', '.join(missing)}, which this process does not provide "
                       "(compiled for another BLAS setup? GIR_CACHE=0 compiles it again)", loc)
