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

Yielding to the program (issue 28): a measurement shares the process with the step it is meant
to speed up. The runtime counts the calls of compiled functions in flight (`running_call`); a
round starts only when none is (waiting in slices of SLICE seconds), and a round during which a
call started does not count as clean. The whole measurement has a fixed BUDGET of wall-clock
seconds (waiting included): afterwards it decides with what it has (clean rounds, else the best
disturbed ones, marked), and a name with no round at all gets None, so the caller takes its
deterministic model for it (`Unmeasured`): one program on one machine converges to one
schedule instead of staying provisional. Priority was the other way considered: a measurement
at idle priority would time the scheduler, not the GEMM.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator

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


class Unmeasured(Exception):
    """The BUDGET ran out before some name had a single round (the program kept the process
    busy): the caller decides by its model."""


BUDGET = 2.0
"""Wall-clock seconds one measurement may take, waiting for the program included."""
SLICE = 0.005
"""Seconds a measurement sleeps between looks at the calls in flight."""


# ---------------------------------------------------------------------------------------------
# Calls of compiled functions in flight (the runtime counts them; background work yields)

_calls = threading.Lock()
_in_flight = 0
_started = 0
"""Calls started since the process began: a round during which it moved saw a call."""


def call_began() -> None:
    """Before each call of compiled code (runtime.py; with `call_ended` in a finally): background
    work waits while any runs. A plain lock, no notification: a call costs ~0.3 us for it."""
    global _in_flight, _started
    with _calls:
        _in_flight += 1
        _started += 1


def call_ended() -> None:
    global _in_flight
    with _calls:
        _in_flight -= 1


@contextlib.contextmanager
def running_call() -> Iterator[None]:
    """`call_began` and `call_ended` around a block (tests)."""
    call_began()
    try:
        yield
    finally:
        call_ended()


def calls_in_flight() -> int:
    return _in_flight


def calls_started() -> int:
    return _started


def wait_until_no_calls(deadline: float, clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> bool:
    """Waits (looking every SLICE seconds) until no compiled call is in flight; False at deadline."""
    while _in_flight:
        if deadline - clock() <= 0 or STOP.is_set():
            return False
        sleep(SLICE)
    return True


_background: dict[int, str] = {}
_background_lock = threading.Lock()


@contextlib.contextmanager
def background(what: str) -> Iterator[None]:
    """Marks background work of this process while it runs, for `competitors`."""
    token = id(object())
    with _background_lock:
        _background[token] = what
    try:
        yield
    finally:
        with _background_lock:
            _background.pop(token, None)


def background_work() -> list[str]:
    """What background work of this process runs now (sorted)."""
    with _background_lock:
        return sorted(_background.values())


def competitors(switches: int = 0) -> list[str]:
    """What competes with the program's calls now: this process's background work, other
    processes (the load average against the cores), and the call's involuntary switches."""
    out = background_work()
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load >= cores - 0.5:
            out.append(f"other processes (load average {load:.1f} on {cores} cores)")
    except OSError:
        pass
    if switches:
        out.append(f"the call lost its core {switches} times (involuntary switches)")
    return out


def involuntary_switches() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def thread_switches() -> int:
    """The calling thread's involuntary switches (the process's where Linux's per-thread
    accounting is not available)."""
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_nivcsw


SPIN = 0.25
"""Seconds a BLAS thread pool keeps spinning on the other core after its last call (MKL's
OpenMP threads: KMP_BLOCKTIME, 200 ms by default; OpenBLAS's: 2^28 cycles, ~0.1 s). A round
through one provider started within that time of the other provider's shares the cores with
its spinning pool. `bench/gemm_spin.py` (32x1024x256, 2 threads, 2026-11-28, Intel Xeon): on
the idle machine MKL's median round 171 us right after OpenBLAS against 71 us after a 0.3 s
pause; with one other process running at nice 19, MKL's best round 168 against 70 us and
OpenBLAS's median 1.19 against 0.11 ms. That biased the provider choice and the two-core
schedule against whichever provider was timed second."""

_last_pool: tuple[str, float] | None = None
"""(pool, clock time) of the last measured round, across measurements: a measurement that
follows another provider's waits for that pool to stop spinning too."""


def _order(names: list[str], pools: dict[str, str] | None, round_no: int) -> list[str]:
    """This round's names grouped by pool, the pools' order rotating from round to round so that
    consecutive rounds meet at the same pool: one switch of provider per round, not two."""
    if not pools:
        return names
    order = list(dict.fromkeys(pools.get(n, "") for n in names))
    k = round_no % len(order)
    order = order[k:] + order[:k]
    return [n for pool in order for n in names if pools.get(n, "") == pool]


def _settle(pool: str, settle: float, deadline: float, clock: Callable[[], float],
            sleep: Callable[[float], None]) -> None:
    """Waits until `settle` seconds after the last round of another pool (within the deadline)."""
    if settle <= 0 or _last_pool is None or _last_pool[0] == pool:
        return
    wait = min(_last_pool[1] + settle, deadline) - clock()
    if wait > 0:
        sleep(wait)


def best_clean_rounds(rounds: dict[str, Callable[[], float]], min_rounds: int = 5,
                      max_rounds: int = 10, budget: float | None = None,
                      clock: Callable[[], float] = time.monotonic, pools: dict[str, str] | None = None,
                      settle: float = 0.0,
                      sleep: Callable[[float], None] = time.sleep) -> tuple[dict[str, float], bool]:
    """({name: best seconds}, disturbed): runs every `rounds[name]()` (one timed round, returning
    seconds per call) once per round, interleaved, at least `min_rounds` rounds and until each
    name has a clean round (at most `max_rounds`), within `budget` seconds (BUDGET) of `clock`.
    A round starts only while no compiled call is in flight; one that saw a call start, or more
    than CLEAN_SWITCHES involuntary switches, is not clean. A name with no clean round gets its
    best disturbed time, and `disturbed` is True; Unmeasured when some name got no round.
    `pools` names each name's thread pool (its BLAS provider): a round of one pool starts
    `settle` seconds (SPIN where the pools have threads to spin) after the other's last round."""
    global _last_pool
    deadline = clock() + (BUDGET if budget is None else budget)
    clean: dict[str, float] = {}
    any_: dict[str, float] = {}
    for done in range(1, max_rounds + 1):
        for name in _order(list(rounds), pools, done):
            run = rounds[name]
            pool = (pools or {}).get(name, "")
            if STOP.is_set():  # exiting: a round takes milliseconds, the whole measurement up to ~1 s
                raise Stopped
            _settle(pool, settle, deadline, clock, sleep)
            if clock() >= deadline or not wait_until_no_calls(deadline, clock):
                break
            before, calls = involuntary_switches(), calls_started()
            seconds = run()
            _last_pool = (pool, clock())
            any_[name] = min(any_.get(name, float("inf")), seconds)
            if involuntary_switches() - before <= CLEAN_SWITCHES and calls_started() == calls:
                clean[name] = min(clean.get(name, float("inf")), seconds)
        else:
            if done >= min_rounds and len(clean) == len(rounds):
                break
            continue
        break  # the budget ran out: decide with what there is
    if len(any_) < len(rounds):
        raise Unmeasured(sorted(set(rounds) - set(any_)))
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


MODEL = "model"
"""The key marking a cache entry whose times are the model's: its measurement found no round
within its BUDGET. Counted as a disturbed measurement (measured again by a later process, up to
ATTEMPTS); its times are never mixed with measured ones."""


def merge(old: dict[str, float] | None, new: dict[str, float], disturbed: bool,
          model: bool = False) -> dict[str, float]:
    """A cache entry from an old provisional one and a new measurement: each time the smaller;
    DISTURBED counts the disturbed measurements while no clean one was made. A model's times
    (model=True, or an old entry marked MODEL) never mix with measured ones: measured times win."""
    previous = float(old.get(DISTURBED, 0.0)) if old is not None else 0.0
    if model:
        out = dict(old) if old is not None and previous and MODEL not in old else {**new, MODEL: 1.0}
        out[DISTURBED] = previous + 1.0
        return out
    out = dict(new)
    if old is not None and previous and MODEL not in old:  # previous > 0 only with an old entry
        for name, seconds in old.items():
            if name not in (DISTURBED, MODEL) and name in out:
                out[name] = min(out[name], seconds)
    if disturbed:
        out[DISTURBED] = previous + 1.0
    return out
