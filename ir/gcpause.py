"""Pausing Python's cyclic garbage collector while a large IR is built or rewritten.

The IR is a graph of many small objects linked both ways (an op and its results, a block and
its ops, a value and its uses). Building or rewriting a 25,000-op function allocates far more
container objects than it frees, so the collector runs its young generation every 700
allocations and, every so often, an old-generation pass over the whole graph: ~10-15% of parse
and pass time at 25k ops (bench/passes_scale.py), for nothing, as almost all of that graph is
alive. Reference counting still frees acyclic garbage at once.

When the pause ends, everything allocated during it (the whole IR) sits in the youngest
generation, and the first collection after the pause would scan it all at once (~0.1 s at 25k
ops). So the pause moves it to the oldest generation first, with `gc.freeze` then
`gc.unfreeze`, which re-link lists without scanning; garbage cycles among it (erased ops) are
freed by the next full collection. Where the program froze objects itself (`gc.freeze` before a
fork), nothing is moved, so its frozen objects stay frozen.

Nested and concurrent pauses are fine: only the pause that found the collector on turns it back
on, and a collector the user turned off stays off.
"""

from __future__ import annotations

import atexit
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
        if gc.get_freeze_count() == 0:
            gc.freeze()  # every tracked object to the permanent generation...
            gc.unfreeze()  # ...and back, into the oldest one, without a scan
        gc.enable()


_at_exit = False


def skip_final_collection() -> None:
    """At interpreter exit, leave the objects then alive out of the final full collection.

    For a command that built a large IR and ends the process (`gir opt`): the interpreter's
    last collection would scan the whole IR (~0.1 s at 25k ops) just before the process's
    memory goes back anyway. Registered once; it runs before that collection (atexit), after
    the program's own exit hooks registered later. Cyclic garbage then left unfreed has its
    `__del__` not run, which Python does not promise at exit either."""
    global _at_exit
    if not _at_exit:
        atexit.register(gc.freeze)
        _at_exit = True
