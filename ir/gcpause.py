"""Pausing Python's cyclic garbage collector while a large IR is built or rewritten.

The IR is a graph of many small objects linked both ways (an op and its results, a block and
its ops, a value and its uses). Building or rewriting a 25,000-op function allocates far more
container objects than it frees, so the collector runs its young generation every 700
allocations and, every so often, an old-generation pass over the whole graph: ~10-15% of parse
and pass time at 25k ops (bench/passes_scale.py), for nothing, as almost all of that graph is
alive. Reference counting still frees acyclic garbage at once; the cycles left by erased ops
are collected when the pause ends.

Nested and concurrent pauses are fine: only the pause that found the collector on turns it back
on, and a collector the user turned off stays off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Runs the block with the cyclic collector off (see the module docstring)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
