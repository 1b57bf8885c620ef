"""Tiered compilation: a first compile emits cheap code at once and -O3 code in the background.

A first compile with nothing cached (llvm_jit.compile_code) optimises the LLVM module with
`QUICK_PASSES` and emits it at the code generator's `QUICK_CODEGEN` level, so the function is
callable after a fraction of -O3's time (bench/llvm_tiers.py measured the recipes; numbers in
docs/performance.md, "Compile time"). The same LLVM IR is queued here as a `FinalCompile` (or,
where the quick code left gir-packed GEMMs out, the function lowered again by the job, which
makes no code if a switch of the cache key changed since the quick compile): one
daemon thread ("gir-llvm-final") runs the queue, each job with a target machine of its own
(ctypes releases the GIL, so it can run on the second core). When the -O3 object is ready it goes into the object cache,
then the job's callbacks run: the `CPUFunction` loads it and swaps its entry points between
calls (runtime.py), and `gir.jit` stores it in the compile cache, replacing the quick code it
stored at once (compile_cache.store_what_runs). The same queue makes the better code of a
specialisation loaded from the cache as quick code, or with GEMM paths measured since
(compile_cache.better_code_for): `FinalCompile.what` names what a job makes.

llvmlite serialises every call into LLVM with one process-wide lock (llvmlite.binding.ffi), and
-O3's pass pipeline is one call of seconds: run on this thread, it made a new shape's quick
compile wait for it (issue 28: 7-9 s per new sequence length). So the thread lowers here (pure
Python) and hands LLVM's part to a process of its own at nice 19 (`compile_in_child`,
final_child.py): this process's LLVM lock stays free, and the job takes a core only when the
step and other work leave one. It is bounded (FINAL_BUDGET) and runs under the options of the
compile that made it (`FinalCompile.options`). `child_hook` lets a test hold a job mid-compile.

`GIR_LLVM_TIER=0` turns tiering off (one -O3 compile, as before); an explicit `GIR_LLVM_OPT`
level also does. At process exit, jobs whose code a cache will store are finished first, for
up to `exit_finish()` seconds in all (GIR_LLVM_EXIT_WAIT, default 3), so a short script's next
run loads its -O3 code from the compile cache (a shared library: ~16 ms) rather than the quick
code stored at once; then the queue is dropped, the compiles' processes still running are killed, and a job still
running is given `EXIT_WAIT` seconds to stop; past that, exit still waits for an LLVM call in
progress on this process's threads (llvm_exit.py: a process exiting inside LLVM crashed; the
measurer's gir-packed kernels still compile in-process), never for the rest of the job. `gir run` waits for every
job (`wait_all`).
"""

from __future__ import annotations

import atexit
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import config

if TYPE_CHECKING:  # imported where a child is started: ~4 ms of a cache hit's import otherwise
    import queue
    import subprocess
from ...config import current

QUICK_PASSES = "cheap"
"""'cheap': SROA (registers instead of stack slots), instcombine and simplifycfg; 'none'."""
QUICK_CODEGEN = 1
"""The TargetMachine's level for quick code. Measured (bench/llvm_tiers.py, GRU/LSTM steps):
cheap passes + level 1 costs 0.10 of -O3's LLVM time and runs steps 1.4x slower; level 0 (fast
instruction selection) 0.02-0.03 and 1.8-1.9x slower; the -O1 pipeline 0.25-0.45 and 1.4-1.5x."""
EXIT_WAIT = 0.5
"""Seconds process exit waits for a running background compile to stop."""
FINAL_BUDGET = 600.0
"""Seconds an -O3 compile's process may take (at nice 19 on a busy machine it can take long);
past that it is killed and the quick code keeps running (its `error` says why)."""


def exit_finish() -> float:
    """GIR_LLVM_EXIT_WAIT: seconds process exit spends finishing the jobs a cache will store
    (default 3; 0: none, the next process compiles again)."""
    return current().llvm_exit_wait


def enabled() -> bool:
    """GIR_LLVM_TIER (default on), unless GIR_LLVM_OPT asks for one explicit level."""
    options = current()
    return options.llvm_opt is None and options.llvm_tier


class FinalCompile:
    """One function's -O3 compile, queued for the background thread. `run_job` makes the
    `Code`; the callbacks (`add_done_callback`) run after it, on that thread, in order."""

    def __init__(self, make: Callable[[], Any], key: str | None = None, what: str = "-O3 code"):
        self._make = make
        self.options = current()
        """The options in force when the job was made: it runs under them (the environment may
        have changed by the time it runs: a test's GIR_* switches undone, GIR_CACHE_DIR moved), so
        it makes the code its cache key names."""
        self.key = key
        """The cache key the job stores (a lookup of it waits: `wait_for_key`)."""
        self.what = what
        """What the job makes, as `fn.stats.compile.preparing` says it."""
        self.submitted = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[FinalCompile], object]] = []
        self._ended = False
        self.done = threading.Event()
        """Set when the job has ended (code or error) and every callback has run."""
        self.code: Any = None
        self.error: BaseException | None = None
        self.cancelled = False

    def run_job(self) -> None:
        try:
            with config.override(**{f.name: getattr(self.options, f.name) for f in config.FIELDS}):
                self.code = self._make()
        except BaseException as e:  # noqa: BLE001 - the quick code keeps running; the error is kept
            self.error = e
        self._finish()

    def cancel(self) -> None:
        self.cancelled = True
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
            self._ended = True
        for callback in callbacks:
            _run_callback(callback, self)
        self.done.set()

    def add_done_callback(self, callback: Callable[[FinalCompile], object]) -> None:
        """Runs callback(job) when the job ends: now, in this thread, if it has ended."""
        with self._lock:
            if not self._ended:
                self._callbacks.append(callback)
                return
        _run_callback(callback, self)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def _run_callback(callback: Callable[[FinalCompile], object], job: FinalCompile) -> None:
    try:
        callback(job)
    except Exception:  # noqa: BLE001 - a failed swap or store leaves the quick code running
        pass


_queue: queue.Queue[FinalCompile | None] | None = None
"""The jobs, made with the thread (a cache hit whose code is final never imports `queue`)."""
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()
_stopping = False
_running: FinalCompile | None = None
_jobs: set[FinalCompile] = set()
"""Queued or running jobs (wait_all)."""
_pending_keys: dict[str, FinalCompile] = {}
"""Cache keys whose entry a queued or running job will store: a lookup of one waits for it."""


def submit(job: FinalCompile) -> FinalCompile:
    """Queues job (its key: see `wait_for_key`)."""
    global _thread, _queue
    job.submitted = True
    _jobs.add(job)
    job.add_done_callback(_jobs.discard)
    if job.key:
        add_key(job, job.key)
    if _stopping:
        job.cancel()
        return job
    with _thread_lock:
        if _queue is None:
            import queue

            _queue = queue.Queue()
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, args=(_queue,), name="gir-llvm-final", daemon=True)
            _thread.start()
        jobs = _queue
    jobs.put(job)
    return job


def wait_all(timeout: float | None = None) -> bool:
    """Waits for every background compile queued so far (`gir run` does before it exits, so
    the -O3 code reaches the cache); False if timeout passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for job in list(_jobs):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not job.wait(left):
            return False
    return True


def add_key(job: FinalCompile, key: str) -> None:
    """A further cache key the job's callbacks store (the compile cache's, added by gir.jit)."""
    _pending_keys[key] = job
    job.add_done_callback(lambda j: _pending_keys.pop(key, None) if _pending_keys.get(key) is j else None)


def pending(key: str | None) -> FinalCompile | None:
    """The queued or running job that will store key, if any."""
    return _pending_keys.get(key) if key else None


def wait_for_key(key: str | None, timeout: float | None = None) -> None:
    """Before a cache lookup of key: if a background compile will store it, wait for that (a
    second compile of the same code then loads the -O3 object instead of compiling again)."""
    job = _pending_keys.get(key) if key else None
    if job is not None and threading.current_thread() is not _thread:
        job.wait(timeout)


def _serve(jobs: queue.Queue[FinalCompile | None]) -> None:
    global _running
    while True:
        job = jobs.get()
        if job is None or _stopping:
            if job is not None:
                job.cancel()
            continue
        _running = job
        try:
            job.run_job()
        finally:
            _running = None


class NoChild(RuntimeError):
    """No process could be started for an -O3 compile (llvm_jit compiles it in-process)."""


_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()
"""Guards `_children`: a child started while exit kills them is killed by its starter."""
"""The -O3 compiles' processes now running (killed at exit)."""
child_hook: Callable[[subprocess.Popen], None] | None = None
"""Tests: called on the background thread once a child is started, before its output is read
(a test holds the job there, mid-compile, deterministically)."""


def compile_in_child(llvm_ir: str, cpu: str, features: str, opt: int) -> tuple[str, bytes, dict[str, float]]:
    """(optimised IR, object, CPU seconds per stage) of llvm_ir at -O<opt>, made by a process of
    its own at nice 19 (final_child.py): it holds no LLVM lock of this process, so a quick
    compile of another shape never waits behind it, and it takes a core only when the step and
    everything else at normal priority leave one. At most FINAL_BUDGET seconds."""
    if _stopping:
        raise RuntimeError("process exiting")
    import subprocess

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "final_child.py")
    try:
        child = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    except OSError as e:  # no interpreter to start (an embedded Python): the caller compiles here
        raise NoChild(str(e)) from None
    with _children_lock:
        _children.add(child)
        if _stopping:  # exit began between the check above and Popen: it never saw this child
            child.kill()
    try:
        if child_hook is not None:
            child_hook(child)
        request = json.dumps({"cpu": cpu, "features": features, "opt": opt}).encode() + b"\n"
        try:
            out, err = child.communicate(request + llvm_ir.encode(), timeout=FINAL_BUDGET)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise RuntimeError(f"the -O3 compile took more than {FINAL_BUDGET:.0f} s: stopped") from None
    finally:
        with _children_lock:
            _children.discard(child)
    if child.returncode != 0 or _stopping:
        raise RuntimeError(f"the -O3 compile's process ended with {child.returncode}: "
                           f"{err.decode(errors='replace')[-2000:]}")
    return _parse_child(out)


def _parse_child(out: bytes) -> tuple[str, bytes, dict[str, float]]:
    parts, at = [], 0
    for _ in range(2):
        (size,) = struct.unpack_from(">Q", out, at)
        parts.append(out[at + 8: at + 8 + size])
        at += 8 + size
    return parts[0].decode(), parts[1], json.loads(out[at:])


def stopping() -> bool:
    """True once the process is exiting: a running job stops at its next stage."""
    return _stopping


@atexit.register
def _at_exit() -> None:
    """Finishes the jobs a cache will store (at most exit_finish() seconds), then drops the
    queue and waits at most EXIT_WAIT seconds for a running job to stop."""
    global _stopping
    thread = _thread
    if thread is None or not thread.is_alive():
        _stopping = True
        return
    deadline = time.monotonic() + exit_finish()
    for job in list(_pending_keys.values()):
        job.wait(max(0.0, deadline - time.monotonic()))
    with _children_lock:
        _stopping = True
        children = list(_children)
    for child in children:  # a compile not finished in time: nothing of it is stored
        try:
            child.kill()
        except OSError:
            pass
    deadline = time.monotonic() + EXIT_WAIT
    while _running is not None and time.monotonic() < deadline:
        time.sleep(0.005)
