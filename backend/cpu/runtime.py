"""Loading compiled code for the host CPU and calling it on NumPy arrays.

Compiling is llvm_jit.py's (the host CPU with its features at optimisation level 3, so fused
loops are vectorised for, e.g., AVX2; a first compile runs quick code until that is ready:
tiers.py); this module imports LLVM only when it compiles or must load an object with LLVM's
JIT linker: a compile-cache hit opens the code's shared library (native.py). Arguments are
checked against the signature before any native code runs; outputs are fresh arrays.

Threads: a `CPUFunction` may be called from several threads at once (ctypes releases the GIL
for the native call, so calls do overlap). Its *workspace* (the arena, the pinned area of
packed weights, and the counters: GEMM calls, pack calls, the error flag) is per thread,
allocated on a thread's first call and reused by that thread's later calls; the code, layout
and BLAS table are shared and read only. Packing needs no sharing: a scan packs its weights
into the pinned area before its loop in every call. A thread keeps its workspace (the arena
size again, e.g. 5 MB for rnn_grads) while it and the function live.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...analysis.lengths import LengthDims
from ...analysis.memory.plan import MemoryPlan
from ...config import current
from ...errors import GirArgumentError, GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from ...ir.types import TensorType
from ...support import timing
from . import blas, blas_threads, externals, native, quiet_timing, tiers
from .code import (  # noqa: F401 - what runtime.py has always offered
    _CODEGEN_VERSION,
    DEFAULT_OPT,
    Code,
    CompileInfo,
    cache_key,
    has_worker,
    host_id,
    opt_level,
    target_key,
)
from .layout import GemmSite, Layout, LengthLayout


@dataclass
class Stats:
    """What a call did (`fn.stats`: the calling thread's last call), and how the code was made."""

    gemm_calls: int = 0
    pack_calls: int = 0
    seconds: float = 0.0
    gemm_paths: dict[str, int] = field(default_factory=dict)
    compile: Any = None
    """How this code was compiled: `gir.jit` sets a `jitstats.CompileStats` (stages, cache, LLVM
    level, GEMM paths); a CPUFunction compiled directly has its `CompileInfo`."""
    schedule: dict[str, object] = field(default_factory=dict)
    """How the compiled code lays out its work (Layout.schedule): stacked values written in
    place or copied, and the two-core schedule with the reasons for it."""
    quiet_seconds: float = 0.0
    """The fastest call of this code in this process so far: its quiet time."""
    slower_because: list[str] = field(default_factory=list)
    """When this call took more than SLOW_FACTOR times the quiet time: what competed with it
    (quiet_timing.competitors: background work of this process, other processes, the switches
    the call suffered); empty otherwise."""
    source: Callable[[], CPUFunction | None] = field(default=lambda: None, repr=False, compare=False)
    """A weak reference to the CPUFunction that made the call: `background` and `blas_threads`
    are read from it when asked (computing them at every call cost microseconds a call). Weak:
    these stats live in the function's thread-local storage, which the garbage collector does
    not traverse, so a strong reference back would keep every function (and its loaded
    library) alive for as long as the calling thread lives."""
    split_blocks: tuple[int, int] = (0, 0)
    """Split schedule: blocks of split loops run by (the calling thread, OpenBLAS's pool thread)."""
    worker_chunks: int = 0
    """Two-core schedule: chunks of the deferred GEMMs the worker thread ran (the calling thread
    ran the others: those the worker had not claimed when it needed them, codegen._Worker)."""

    @property
    def background(self) -> list[str]:
        """Background work of this process pending or running now (GEMM measurements, better
        code being compiled), as `gir run -v` says it."""
        source = self.source()
        preparing = source.preparing if source is not None else ""
        return quiet_timing.background_work() + ([f"preparing {preparing}"] if preparing else [])

    @property
    def blas_threads(self) -> str:
        """How calls run BLAS now: 'all threads', or 'one thread (...)' while the second core
        is busy (blas_threads.Governor, GIR_CPU_ADAPT); '' without the governor."""
        source = self.source()
        governor = source.governor if source is not None else None
        return governor.describe() if governor is not None else ""

    def slow_note(self) -> str:
        """One line on a slow call ('' when it was not slow)."""
        if not self.slower_because:
            return ""
        return (f"this call took {self.seconds * 1e3:.2f} ms against {self.quiet_seconds * 1e3:.2f} ms quiet; "
                "competing: " + "; ".join(self.slower_because))


SLOW_FACTOR = 2.0
"""A call slower than this many times its code's quiet time gets `Stats.slower_because`."""
SLOW_FLOOR = 1e-4
"""Seconds below which a call is never called slow (jitter of microseconds is no news)."""


@dataclass
class _Entry:
    """Loaded code: what one call runs. A call reads `CPUFunction._entry` once, so a swap to the
    final code between calls never mixes the two entry points, and the old engine lives as
    long as a call in flight holds its entry."""

    code: Code
    engine: Any
    native: Any
    worker: Any
    asm: str | None = None


def _load(code: Code) -> _Entry:
    """Links code into this process: its shared library with the system's dynamic loader when it
    has one (a compile-cache hit: no LLVM loaded), else its object with LLVM's JIT linker."""
    signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    owner: Any = native.load(code.shared) if code.shared is not None else None
    if owner is not None:
        main = native.address(owner, "gir_main")
        worker = native.address(owner, "gir_worker") if has_worker(code.layout) else None
    else:
        from .llvm_jit import load_object

        owner, main, worker = load_object(code)
    return _Entry(code, owner, signature(main), signature(worker) if worker else None)


class CPUFunction:
    """A function compiled for this CPU; cached on disk by content (see `cache_key`)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None, code: Code | None = None,
                 tiered: bool | None = None, lengths: LengthDims | None = None):
        """Compiles function (or takes `code` compiled before: then function may be a signature
        without a body, as the compile cache rebuilds it). tiered: see compile_code; lengths:
        code for every length of the dims that follow it (`length_of`)."""
        self.function = function
        self.ir = ""
        """The IR compiled, after the passes (set by the driver: `fn.ir`)."""
        self.compile_stats: Any = None
        """How the driver compiled it (a driver/jitstats.CompileStats, set by the driver)."""
        self._results = [(t.static_shape_at(function.loc), t.numpy_dtype) for t in function.result_types]
        """Each result's shape and dtype: what a call allocates."""
        if code is None:
            from .llvm_jit import compile_code

            code = compile_code(function, plan, tiered, lengths=lengths)
        self.from_cache = bool(code.info.from_cache)
        s = {} if self.from_cache else code.info.seconds
        self.compile_seconds: dict[str, float] = {} if not s else {
            "codegen": s.get("lower", 0.0) + s.get("llvm_parse", 0.0), "llvm-optimize": s.get("llvm_opt", 0.0),
            "emit-object": s.get("llvm_emit", 0.0)}
        """Seconds per backend stage, as `fn.stats.compile` names them (driver/jitstats.py)."""
        check_fits(function, code.layout.arena_bytes + code.layout.pinned_bytes, host_memory_bytes(), "this machine")
        externals.check(code.layout.externals, function.loc)
        clock = time.perf_counter()
        with timing.phase("backend: load object"):
            self._entry = _load(code)
        """The code calls run: `gir_main` and, for a two-core schedule (overlap.py), `gir_worker`.
        Quick code (tiers.py) is replaced by the final code when that is ready (`_swap`)."""
        self._final = code.final
        self.final_error: BaseException | None = None
        """Why the background -O3 compile failed, if it did (the quick code keeps running)."""
        self._fns_ptr = ctypes.cast(externals.table(), ctypes.c_void_p)
        self._local = threading.local()
        """This thread's `Workspace` (`.workspace`) and `Stats` (`.stats`)."""
        self.governor = blas_threads.Governor() if current().cpu_adapt_threads else None
        """One BLAS thread while the second core is busy (GIR_CPU_ADAPT; blas_threads.Governor)."""
        self._quiet: dict[int, float] = {}
        """Fastest call seconds per code (id of its CompileInfo: the quick and the final code differ)."""
        self._last_stats: Stats | None = None
        """The last call completed on any thread (what `stats` is in a thread that made none)."""
        self._after_call: list[Callable[[], object]] = []
        """Run once, after the first call's native code returns (`after_first_call`)."""
        self._after_call_lock = threading.Lock()
        self.compile_seconds["load"] = time.perf_counter() - clock
        if self._final is not None:
            self._final.add_done_callback(self._swap)
            tiers.submit(self._final)

    def follow(self, job: tiers.FinalCompile) -> None:
        """Calls run job's code once it is made (better code for code loaded from a cache:
        -O3 for quick code, measured GEMM paths for the model's); queued unless it is already
        (another function of this process made it first). Calls never wait for it."""
        self._final = job
        job.add_done_callback(self._swap)
        if not job.submitted:
            tiers.submit(job)

    def after_first_call(self, callback: Callable[[], object]) -> None:
        """Runs callback() once the next call's native code has returned (the first call, for
        code just loaded), on the calling thread: background work that would compete with the
        first result, or load MKL before it, is started there
        (compile_cache.better_code_if_measured). An exception it raises is kept in
        `final_error`, never raised out of the call."""
        with self._after_call_lock:
            self._after_call.append(callback)

    def _first_call_done(self) -> None:
        with self._after_call_lock:
            callbacks, self._after_call = self._after_call, []
        for callback in callbacks:
            try:
                callback()
            except Exception as e:  # noqa: BLE001 - queueing better code never fails the call that ran
                self.final_error = e

    @property
    def preparing(self) -> str:
        """What better code is being made in the background ('' none): the job's `what`."""
        job = self._final
        return job.what if job is not None and not job.done.is_set() else ""

    def _swap(self, job: tiers.FinalCompile) -> None:
        """On the background thread: loads the final code and makes it the entry of later calls
        (one assignment: a call in flight keeps its entry, and with it the old engine)."""
        if job.code is None:
            self.final_error = job.error
            return
        try:  # lowered again, the final code may call other externals and need more memory
            externals.check(job.code.layout.externals, self.function.loc)
            layout = job.code.layout
            check_fits(self.function, layout.arena_bytes + layout.pinned_bytes, host_memory_bytes(), "this machine")
        except GirError as e:
            self.final_error = e
            return
        self._entry = _load(job.code)

    @property
    def layout(self) -> Layout:
        """The layout of the code calls run now: the final code's can differ from the quick
        code's (llvm_jit.compile_code lowers it again when the quick tier left gir-packed out)."""
        return self._entry.code.layout

    @property
    def gemms(self) -> list[GemmSite]:
        """The GEMMs of the code calls run now, each with its BLAS path (Layout.gemms)."""
        return self.layout.gemms

    @property
    def workspace_bytes(self) -> int:
        """What a call's workspace holds per thread: the arena and the pinned area."""
        layout = self.layout
        return layout.arena_bytes + layout.pinned_bytes

    @property
    def code_info(self) -> CompileInfo:
        """How the code calls run now was made (its tier, LLVM level, cache)."""
        return self._entry.code.info

    @property
    def llvm_ir(self) -> str:
        return self._entry.code.llvm_ir

    @property
    def code(self) -> Code:
        """The code calls run now (quick code until the final code replaces it)."""
        return self._entry.code

    @property
    def optimized_ir(self) -> str:
        return self._entry.code.optimized_ir

    @property
    def tier(self) -> str:
        """'quick', 'final' or '' (compiled once): CompileInfo.tier of the code calls run now."""
        return self._entry.code.info.tier

    def wait_for_final_code(self, timeout: float | None = None) -> bool:
        """Waits until calls run the final (-O3) code; False if timeout passed first or the
        background compile failed (then `final_error` says why). True at once without tiering."""
        if self._final is not None and not self._final.wait(timeout):
            return False
        return self.tier != "quick"

    def when_final(self, callback: Any) -> None:
        """Runs callback() once calls run the final code (now, if they do; else on the
        background thread after the swap). Nothing runs if the final compile fails."""
        if self._final is None:
            callback()
        else:
            self._final.add_done_callback(lambda job: callback() if self.tier == "final" else None)

    @property
    def asm(self) -> str:
        """The host assembly (made on first access: printing it costs as much as compiling)."""
        entry = self._entry
        if entry.asm is None:
            from .llvm_jit import assembly

            entry.asm = assembly(entry.code)
        return entry.asm

    @classmethod
    def compile(cls, function: Function, plan: MemoryPlan | None = None, tiered: bool | None = None,
                lengths: LengthDims | None = None) -> CPUFunction:
        """Compiles function, laying its arena out by plan (the pipeline's `memplan` result;
        memplan's default plan when None); tiered=False: the final code only (tiers.py);
        lengths: the code serves every length (analysis/lengths.py)."""
        return cls(function, plan, tiered=tiered, lengths=lengths)

    def length_of(self, shapes: Sequence[Sequence[int]]) -> int | None:
        """The length T these argument shapes have, where the code serves every length and
        they fit it (every other dim as compiled, one T for all, T >= min_length); else None."""
        lengths = self.layout.lengths
        if lengths is None or len(shapes) != len(self.function.args):
            return None
        free = {(i, axis): (a, b) for i, axis, a, b in lengths.arguments}
        found: set[int] = set()
        for i, (shape, t) in enumerate(zip(shapes, self.function.arg_types)):
            if len(shape) != t.rank:
                return None
            for axis, (d, compiled) in enumerate(zip(shape, t.shape)):
                if (i, axis) not in free:
                    if d != compiled:
                        return None
                    continue
                a, b = free[(i, axis)]
                if (d - b) % a:
                    return None
                found.add((d - b) // a)
        if len(found) != 1 or min(found) < lengths.min_length:
            return None
        return found.pop()

    def _result_shapes(self, lengths: LengthLayout | None, t: int | None) -> list[tuple[tuple[int, ...], Any]]:
        """Each result's shape and dtype at length t (code for every length), else as compiled."""
        if lengths is None or t is None:
            return self._results
        shapes = [list(shape) for shape, _ in self._results]
        for i, axis, a, b in lengths.results:
            shapes[i][axis] = a * t + b
        return [(tuple(s), dtype) for s, (_, dtype) in zip(shapes, self._results)]

    @property
    def stats(self) -> Stats:
        """The last call this thread completed; in a thread that has completed none, the last
        call completed by any thread (a fresh `Stats()` before any)."""
        found = getattr(self._local, "stats", None) or self._last_stats
        return found if found is not None else Stats(compile=self.code.info)

    def workspace(self, layout: Layout | None = None) -> Workspace:
        """This thread's working memory for code of `layout` (default: the code calls run now),
        allocated on its first call, and again when the final code needs more than the quick
        code's."""
        layout = layout if layout is not None else self.layout
        ws = getattr(self._local, "workspace", None)
        if ws is None or not ws.fits(layout):
            ws = self._local.workspace = Workspace(layout)
            self._local.switches = quiet_timing.thread_switches()  # the mark a slow call counts from
        return ws

    def __call__(self, *args: Any) -> list[np.ndarray]:
        f = self.function
        if self.layout.lengths is None:
            return self.run(check_arguments(f, args))
        arrays = [np.asarray(a) for a in args]  # code for every length: T from the shapes (`run`)
        if any(a.dtype != t.numpy_dtype for a, t in zip(arrays, f.arg_types)):
            check_arguments(f, arrays)  # its error names the argument
        return self.run(arrays)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """A call on arguments checked already (count, dtype, shape: `check_arguments`)."""
        f = self.function
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise GirArgumentError(f"argument %{f.args[i].name_hint} of @{f.name} must be C-contiguous "
                                       "(use np.ascontiguousarray)", f.loc)
        entry = self._entry  # once: both entry points and the layout of this call come from the same code
        layout = entry.code.layout
        length = None
        if layout.lengths is not None:
            length = self.length_of([a.shape for a in arrays])
            if length is None:
                raise GirArgumentError(f"@{f.name}: arguments of shapes {[a.shape for a in arrays]} do not fit the "
                                       f"code compiled for every length ({layout.lengths.describe})", f.loc)
        ws = self.workspace(layout)
        outs = [np.empty(shape, dtype) for shape, dtype in self._result_shapes(layout.lengths, length)]
        ptrs = [a.ctypes.data for a in arrays] + [o.ctypes.data for o in outs] + ws.pointers
        if layout.lengths is not None:
            ptrs += ws.for_length(length, layout.lengths)  # type: ignore[arg-type]
        buffers = (ctypes.c_void_p * len(ptrs))(*ptrs)
        ws.join_worker()  # a late worker of this thread's last call (it claims nothing more)
        counters = ws.counters
        counters[:] = 0
        one = self._setter(layout) if self.governor is not None and self.governor.use_one_thread() else None
        quiet_timing.call_began()
        try:
            before = one.enter() if one is not None else 0
            start = time.perf_counter()
            if entry.worker is not None and one is None:  # ctypes releases the GIL: the two run at once
                ws.start_worker(entry, buffers, self._fns_ptr)
            # on one thread, no worker: gir_main claims and runs every chunk itself
            entry.native(buffers, ws.counters_ptr, self._fns_ptr)
            seconds = time.perf_counter() - start
            if one is not None:
                one.leave(before)
        finally:
            quiet_timing.call_ended()
        if self._after_call:  # the first call (one look per call)
            self._first_call_done()
        # gir_main returns once every chunk is done, by whichever thread: a worker that has not
        # run yet finds them all claimed, and is joined before the workspace is used again
        if counters[2]:
            message, loc = layout.errors[int(counters[2]) - 1]
            message = message.replace("{value}", str(int(counters[3])))  # the offending index (flag_error)
            raise GirError(message if "at run time" in message else f"{message} at run time", loc)  # type: ignore[arg-type]
        paths: dict[str, int] = {}
        for g in layout.gemms:
            paths[g.path] = paths.get(g.path, 0) + 1
        stats = Stats(int(counters[0] + counters[7]), int(counters[1]), seconds, paths, entry.code.info,
                      layout.schedule, worker_chunks=int(counters[6] - counters[8]) if entry.worker is not None else 0,
                      split_blocks=(int(counters[10]), int(counters[11])), source=weakref.ref(self))
        switches = self._note_quiet_time(stats)
        if self.governor is not None:
            self.governor.record(seconds, switches, one is not None)
        self._local.stats = self._last_stats = stats
        return outs

    def _setter(self, layout: Layout) -> blas_threads.OneThread | None:
        """What sets BLAS to one thread for the code's GEMM family (None: nothing here, or BLAS
        on one thread anyway: the call runs as compiled)."""
        family = "mkl" if any(g.path in blas.FAMILIES["mkl"] for g in layout.gemms) else "openblas"
        return blas_threads.one_thread(family)

    def _note_quiet_time(self, stats: Stats) -> int:
        """Keeps the fastest call as the quiet time; a call much slower says what competed.
        Returns the involuntary switches this thread suffered since it last looked, read only
        for a slow call (a look costs ~1 us: the fast path does not pay it), 0 otherwise."""
        key = id(stats.compile)
        quiet = self._quiet.get(key, 0.0)
        if not quiet or stats.seconds < quiet:
            self._quiet[key] = quiet = stats.seconds
        stats.quiet_seconds = quiet
        if stats.seconds <= SLOW_FACTOR * quiet or stats.seconds <= SLOW_FLOOR:
            return 0
        now = quiet_timing.thread_switches()
        switches = now - getattr(self._local, "switches", now)
        self._local.switches = now
        stats.slower_because = quiet_timing.competitors(switches) or ["nothing seen (a page fault, a timer?)"]
        return switches


worker_hook: Any = None
"""Tests: called on the worker's thread before `gir_worker` runs (a test delays the worker,
as a busy second core would, and counts who ran the chunks)."""


def _run_worker(entry: _Entry, buffers: Any, ws: Workspace, fns: Any) -> None:
    if worker_hook is not None:
        worker_hook()
    entry.worker(buffers, ws.counters_ptr, fns)


class Workspace:
    """One thread's working memory for one compiled function: the arena, the pinned area
    (packed weights) and the counters, sized by the layout."""

    def __init__(self, layout: Layout):
        self.sizes = (layout.arena_bytes, layout.pinned_bytes)
        self.arena = _aligned(layout.arena_bytes)
        self.pinned = _aligned(layout.pinned_bytes)
        self.counters = np.zeros(12, np.int64)
        """GEMM calls, pack calls, the error code (layout.errors[code - 1]), the value its message
        names (an index out of range), and the
        two-core schedule's words (codegen._Worker): futex, steps done, chunks done, the
        worker's GEMM calls, chunks the calling thread ran, the next chunk to claim; and the
        split loops' blocks run by the calling thread and by OpenBLAS's pool (codegen._Split)."""
        self.pointers = [self.arena.ctypes.data, self.pinned.ctypes.data]
        """The last two entries of the native function's `buffers` (four for code for every
        length: `for_length`)."""
        self.length = np.zeros(1, np.int64)
        self.length_area = _aligned(0)
        """The last two entries of the native function's `buffers`."""
        self.counters_ptr = self.counters.ctypes.data
        self._worker: threading.Thread | None = None

    def start_worker(self, entry: _Entry, buffers: Any, fns: Any) -> None:
        """Starts `gir_worker` on a thread of its own for this call. It holds the entry (its code:
        a swap to the final code may drop the old one before a late worker runs), the buffers
        and this workspace alive until it has run, however late."""
        self._worker = threading.Thread(target=_run_worker, args=(entry, buffers, self, fns), daemon=True)
        self._worker.start()

    def join_worker(self) -> None:
        """Waits for the last call's worker: it has claimed nothing left (gir_main returned),
        but it reads the counters, which the next call sets to zero."""
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def for_length(self, t: int, lengths: LengthLayout) -> list[int]:
        """The two more `buffers` entries of code for every length at length t: the length and
        the length area, grown when t needs more than an earlier call did."""
        self.length[0] = t
        need = lengths.area_bytes(t)
        if need > self.length_area.size:
            self.length_area = _aligned(max(need, 2 * self.length_area.size))
        return [self.length.ctypes.data, self.length_area.ctypes.data]

    def fits(self, layout: Layout) -> bool:
        return layout.arena_bytes <= self.sizes[0] and layout.pinned_bytes <= self.sizes[1]


def host_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(function: Function, workspace_bytes: int, capacity: int | None, where: str) -> None:
    """Raises a GirError, before anything is allocated, when function cannot run in capacity
    bytes (`where`'s memory): at the first op whose result alone is larger, else at the
    function when its workspace (arena and pinned area) is. Without this, a program naming a
    tensor<100000x100000x100xf32> fails with NumPy's MemoryError, or worse, is overcommitted."""
    if capacity is None:
        return
    for op in function.walk():
        for r in op.results:
            nbytes = r.tensor_type.nbytes() if isinstance(r.type, TensorType) else None
            if nbytes is not None and nbytes > capacity:
                raise GirError(f"@{function.name}: '{op.name}' makes a {r.type} of {_human(nbytes)}, more than "
                               f"{where}'s memory ({_human(capacity)})", op.loc)
    if workspace_bytes > capacity:
        raise GirError(f"@{function.name} needs a workspace of {_human(workspace_bytes)}, more than {where}'s "
                       f"memory ({_human(capacity)})", function.loc)


def _human(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes} bytes" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    raise AssertionError


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 64, np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + max(nbytes, 1)]


__all__ = ["CPUFunction", "Code", "CompileInfo", "Layout", "Stats", "Workspace", "check_fits",
           "host_memory_bytes"]
