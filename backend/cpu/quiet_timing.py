"""Timing GEMMs only in rounds no other process disturbed.

GEMM paths and the two-core schedule are chosen from times measured once and cached per
machine. On a 2-core machine a 2-thread OpenBLAS GEMM that loses a core to another process
slows down a lot (its threads spin at synchronisation points waiting for the preempted one):
`python bench/gemm_disturbed.py` gives 0.135 ms alone and 0.253 ms with one busy process beside
it for 32x256 @ 256x1024; with several test suites running it was 28 ms (a cached 2-thread time
seen in `fn.stats.schedule`), and that one number switched the two-core schedule on and made a
GRU step 1.6x slower for good.

The sign of a disturbed round is in the kernel's accounting: the process's involuntary context
switches (`ru_nivcsw`, all its threads: BLAS's pool included) grow while another task takes a
core; a quiet round of a few milliseconds has none or one. So a round counts only when clean;
a measurement that found no clean round for some call is returned marked `disturbed`, and the
caches keep such entries as provisional: a later process measures them again, in the
background (a compile uses the provisional time meanwhile), and keeps the faster time of each
(noise only ever adds time) — at most ATTEMPTS disturbed measurements, and only while the load
average is below the core count.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable

CLEAN_SWITCHES = 2
"""Involuntary switches a round may see and still count (a timer tick, a kernel thread)."""

DISTURBED = "disturbed"
"""The key under which a cached entry counts the measurements of it that found no clean round."""

ATTEMPTS = 3
"""A disturbed entry is measured again (in the background: a compile never waits for it) until
a clean measurement or this many disturbed ones; on a machine that is always busy the busy
time is the one it gets."""


STOP = threading.Event()
"""Set at process exit (blas.py): a measurement in progress stops at its next round."""


class Stopped(Exception):
    """A measurement stopped by STOP: nothing of it is stored."""


def involuntary_switches() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def best_clean_rounds(rounds: dict[str, Callable[[], float]], min_rounds: int = 5,
                      max_rounds: int = 10) -> tuple[dict[str, float], bool]:
    """({name: best seconds}, disturbed): runs every `rounds[name]()` (one timed round, returning
    seconds per call) once per round, interleaved, at least `min_rounds` rounds and until each
    name has a clean round (at most `max_rounds`). A name with no clean round gets its best
    disturbed time, and `disturbed` is True."""
    clean: dict[str, float] = {}
    any_: dict[str, float] = {}
    for done in range(1, max_rounds + 1):
        if STOP.is_set():  # exiting: a round takes milliseconds, the whole measurement up to ~1 s
            raise Stopped
        for name, run in rounds.items():
            before = involuntary_switches()
            seconds = run()
            any_[name] = min(any_.get(name, float("inf")), seconds)
            if involuntary_switches() - before <= CLEAN_SWITCHES:
                clean[name] = min(clean.get(name, float("inf")), seconds)
        if done >= min_rounds and len(clean) == len(rounds):
            break
    return {name: clean.get(name, any_[name]) for name in rounds}, len(clean) < len(rounds)


def provisional(disturbed_count: float | None) -> bool:
    """Whether an entry with this DISTURBED count is to be measured again now: fewer than
    ATTEMPTS disturbed measurements, and the machine not busy at the moment (a load average
    below the core count; measured on a busy machine it would only be disturbed again)."""
    if not disturbed_count or float(disturbed_count) >= ATTEMPTS:
        return False
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return True


def merge(old: dict[str, float] | None, new: dict[str, float], disturbed: bool) -> dict[str, float]:
    """A cache entry from an old provisional one and a new measurement: each time the smaller;
    DISTURBED counts the disturbed measurements while no clean one was made."""
    out = dict(new)
    previous = float(old.get(DISTURBED, 0.0)) if old is not None else 0.0
    if previous:
        for name, seconds in old.items():  # type: ignore[union-attr]
            if name != DISTURBED and name in out:
                out[name] = min(out[name], seconds)
    if disturbed:
        out[DISTURBED] = previous + 1.0
    return out
