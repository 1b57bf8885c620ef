"""Compiling an LLVM module for the host CPU and calling it on NumPy arrays.

The target is the host CPU with its features at optimisation level 3 (so fused loops are
vectorised for, e.g., AVX2). Arguments are checked against the signature before any native
code runs; outputs are fresh arrays.

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
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from ... import cache as disk
from ... import timing
from ...cache import build_fingerprint, digest
from ...errors import GirArgumentError, GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from ...ir.types import TensorType
from ...passes.memory.plan import MemoryPlan
from . import blas, blas_threads
from .codegen import Layout, lower_function


def opt_level() -> int:
    """LLVM's optimisation level for compiled code: GIR_LLVM_OPT (0-3), default DEFAULT_OPT."""
    try:
        level = int(os.environ.get("GIR_LLVM_OPT", DEFAULT_OPT))
    except ValueError:
        return DEFAULT_OPT
    return min(3, max(0, level))


DEFAULT_OPT = 3
"""Chosen by measurement (docs/performance.md, "Compile time"): compile seconds against the
run time of the bench/rnn.py training steps."""


def new_target_machine(opt: int | None = None) -> llvm.TargetMachine:
    """The host CPU with all its features. An execution engine takes ownership of the target
    machine it is given, so every engine gets a machine of its own."""
    cpu, features = host()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=opt_level() if opt is None else opt,
                                        codemodel="jitdefault")


@cache
def host() -> tuple[str, str]:
    """The host CPU's name and features (asking LLVM for the features costs ~25 ms: once)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@cache
def _target_machine(opt: int) -> llvm.TargetMachine:
    return new_target_machine(opt)


def target_machine() -> llvm.TargetMachine:
    """A machine for optimising and printing assembly; never handed to an engine."""
    return _target_machine(opt_level())


def optimize(mod: llvm.ModuleRef, opt: int | None = None) -> None:
    opt = opt_level() if opt is None else opt
    if opt == 0:
        return
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pb = llvm.create_pass_builder(_target_machine(opt), pto)
    pb.getModulePassManager().run(mod, pb)


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


@dataclass
class CompileInfo:
    opt_level: int = DEFAULT_OPT
    """LLVM's optimisation level (GIR_LLVM_OPT; the default is chosen by measurement)."""
    from_cache: str = ""
    """'' compiled here; 'compiled' a hit in the compile cache (nothing ran but loading);
    'objects' a hit in the object cache (the passes ran, LLVM did not)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds of lowering, LLVM's passes and code emission when it was compiled; of loading now."""
    gemm_measured: bool = True
    """False when some GEMM path came from the model (it is refined by a later compile)."""


@dataclass
class Code:
    """What compiling a function produced: everything a process needs to run it and show it."""

    obj: bytes
    layout: Layout
    optimized_ir: str
    llvm_ir: str
    info: CompileInfo

    def to_entry(self) -> tuple[dict, bytes]:
        meta = {"layout": self.layout.to_json(), "optimized_ir": self.optimized_ir, "llvm_ir": self.llvm_ir,
                "opt_level": self.info.opt_level, "seconds": self.info.seconds}
        return meta, self.obj

    @classmethod
    def from_entry(cls, meta: dict, obj: bytes, source: str) -> Code:
        layout = Layout.from_json(meta["layout"])
        info = CompileInfo(int(meta["opt_level"]), source, dict(meta.get("seconds", {})), not layout.provisional)
        return cls(obj, layout, meta["optimized_ir"], meta["llvm_ir"], info)

    def stale(self) -> bool:
        """Its GEMM paths came from the model and every such shape is measured now."""
        return bool(self.layout.provisional) and blas.is_measured([tuple(p) for p in self.layout.provisional])


def compile_code(function: Function, plan: MemoryPlan | None = None) -> Code:
    """Lowers function to LLVM, optimises and emits an object: or loads the object of the same
    function (printed after the passes) from the object cache."""
    key = cache_key(function, plan)
    with timing.phase("cache: object lookup"):
        found = disk.load("objects", key) if disk.enabled() else None
    if found is not None:
        try:
            code = Code.from_entry(found[0], found[1], "objects")
            if not code.stale():
                return code
        except (KeyError, TypeError, ValueError):
            pass  # another format: compile again
    opt = opt_level()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    with timing.phase("backend: lower to LLVM IR"):
        module, layout = lower_function(function, plan)
        llvm_ir = str(module)
    t1 = time.perf_counter()
    with timing.phase("LLVM: parse and verify"):
        mod = llvm.parse_assembly(llvm_ir)
        mod.verify()
    t2, c2 = time.perf_counter(), time.thread_time()
    with timing.phase(f"LLVM: optimise (-O{opt})"):
        optimize(mod, opt)
        optimized_ir = str(mod)
    t3, c3 = time.perf_counter(), time.thread_time()
    with timing.phase("LLVM: emit object"):
        obj = _target_machine(opt).emit_object(mod)
    t4, c4 = time.perf_counter(), time.thread_time()
    seconds = {"lower": t1 - t0, "llvm_parse": t2 - t1, "llvm_opt": t3 - t2, "llvm_emit": t4 - t3,
               "llvm_opt_cpu": c3 - c2, "llvm_emit_cpu": c4 - c3}
    code = Code(obj, layout, optimized_ir, llvm_ir, CompileInfo(opt, "", seconds, not layout.provisional))
    if disk.enabled():
        with timing.phase("cache: store"):
            disk.store("objects", key, *code.to_entry())
    return code


class CPUFunction:
    """A function compiled for this CPU; cached on disk by content (see `cache_key`)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None, code: Code | None = None):
        """Compiles function (or takes `code` compiled before: then function may be a signature
        without a body, as the compile cache rebuilds it)."""
        self.function = function
        if code is None:
            code = compile_code(function, plan)
        self.code = code
        self.layout, self.optimized_ir, self.llvm_ir = code.layout, code.optimized_ir, code.llvm_ir
        self.from_cache = bool(code.info.from_cache)
        s = {} if self.from_cache else code.info.seconds
        self.compile_seconds: dict[str, float] = {} if not s else {
            "codegen": s.get("lower", 0.0) + s.get("llvm_parse", 0.0), "llvm-optimize": s.get("llvm_opt", 0.0),
            "emit-object": s.get("llvm_emit", 0.0)}
        """Seconds per backend stage, as `fn.stats.compile` names them (jitstats.py)."""
        check_fits(function, self.layout.arena_bytes + self.layout.pinned_bytes, host_memory_bytes(), "this machine")
        clock = time.perf_counter()
        with timing.phase("backend: load object"):
            blas.bind_symbols()
            blas_threads.bind_symbols()
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(code.obj))
            self.engine.finalize_object()
            addr = self.engine.get_function_address("gir_main")
        self._native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(addr)
        self._worker = None
        """`gir_worker`, the second thread's part of a two-core schedule (overlap.py), if any."""
        if _has_worker(self.layout):
            waddr = self.engine.get_function_address("gir_worker")
            self._worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(waddr)
        self.fns = blas.providers().table_array()
        self._fns_ptr = ctypes.cast(self.fns, ctypes.c_void_p)
        self._local = threading.local()
        """This thread's `Workspace` (`.workspace`) and `Stats` (`.stats`)."""
        self._last_stats = Stats(compile=code.info)
        """The last call completed on any thread (what `stats` is in a thread that made none)."""
        self._asm: str | None = None
        self.compile_seconds["load"] = time.perf_counter() - clock

    @property
    def asm(self) -> str:
        """The host assembly (made on first access: printing it costs as much as compiling)."""
        if self._asm is None:
            self._asm = _target_machine(self.code.info.opt_level).emit_assembly(llvm.parse_assembly(self.optimized_ir))
        return self._asm

    @classmethod
    def compile(cls, function: Function, plan: MemoryPlan | None = None) -> CPUFunction:
        """Compiles function, laying its arena out by plan (the pipeline's `memplan` result;
        memplan's default plan when None)."""
        return cls(function, plan)

    @property
    def stats(self) -> Stats:
        """The last call this thread completed; in a thread that has completed none, the last
        call completed by any thread (a fresh `Stats()` before any)."""
        return getattr(self._local, "stats", self._last_stats)

    def workspace(self) -> Workspace:
        """This thread's working memory (allocated on its first call)."""
        ws = getattr(self._local, "workspace", None)
        if ws is None:
            ws = self._local.workspace = Workspace(self.layout)
        return ws

    def __call__(self, *args: Any) -> list[np.ndarray]:
        f = self.function
        arrays = check_arguments(f, args)
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise GirArgumentError(f"argument %{f.args[i].name_hint} of @{f.name} must be C-contiguous "
                                       "(use np.ascontiguousarray)", f.loc)
        ws = self.workspace()
        outs = [np.empty(t.shape, t.numpy_dtype) for t in f.result_types]  # type: ignore[arg-type]
        ptrs = [a.ctypes.data for a in arrays] + [o.ctypes.data for o in outs] + ws.pointers
        buffers = (ctypes.c_void_p * len(ptrs))(*ptrs)
        counters = ws.counters
        counters[:] = 0
        start = time.perf_counter()
        worker = None
        if self._worker is not None:  # ctypes releases the GIL: the two run at once
            worker = threading.Thread(target=self._worker, args=(buffers, ws.counters_ptr, self._fns_ptr))
            worker.start()
        self._native(buffers, ws.counters_ptr, self._fns_ptr)
        if worker is not None:
            worker.join()
        seconds = time.perf_counter() - start
        if counters[2]:
            message, loc = self.layout.errors[int(counters[2]) - 1]
            raise GirError(f"{message} at run time", loc)  # type: ignore[arg-type]
        paths: dict[str, int] = {}
        for g in self.layout.gemms:
            paths[g.path] = paths.get(g.path, 0) + 1
        self._local.stats = self._last_stats = Stats(int(counters[0] + counters[7]), int(counters[1]), seconds, paths,
                                                     self.code.info, self.layout.schedule)
        return outs


class Workspace:
    """One thread's working memory for one compiled function: the arena, the pinned area
    (packed weights) and the counters, sized by the layout."""

    def __init__(self, layout: Layout):
        self.arena = _aligned(layout.arena_bytes)
        self.pinned = _aligned(layout.pinned_bytes)
        self.counters = np.zeros(8, np.int64)
        """GEMM calls, pack calls, the error code (layout.errors[code - 1]), unused, and the
        two-core schedule's words (codegen._Worker): futex, steps done, chunks done, the
        worker's GEMM calls."""
        self.pointers = [self.arena.ctypes.data, self.pinned.ctypes.data]
        """The last two entries of the native function's `buffers`."""
        self.counters_ptr = self.counters.ctypes.data


# ---------------------------------------------------------------------------------------------
# The disk cache of compiled code


def cache_key(function: Function, plan: MemoryPlan | None = None) -> str:
    """Content key of the object cache: the printed function (after every pass), the memory
    plan's strategy, the target (`target_key`) and gir's code."""
    from ...ir.printer import print_function

    return digest(print_function(function, print_locations=True), plan.strategy if plan is not None else "default",
                  target_key(), build_fingerprint())


def target_key() -> tuple:
    """What the same IR compiles differently for: gir and llvmlite versions, LLVM's level, the
    host CPU and its features, and what decides GEMM paths (MKL present, threads, a forced
    path, the arena switch)."""
    from ... import __version__

    return (__version__, _CODEGEN_VERSION, llvm.llvm_version_info, llvm.get_process_triple(), *host(),
            blas.providers().has_mkl, blas.threads(),
            os.environ.get("GIR_GEMM_PATH", ""), os.environ.get("GIR_CPU_ARENA", ""),
            os.environ.get("GIR_CPU_OVERLAP", ""), opt_level())


_CODEGEN_VERSION = "12"
"""Bump when the code the backend generates changes meaning, to retire cached objects."""


def _has_worker(layout: Layout) -> bool:
    notes = layout.schedule.get("overlap")
    return isinstance(notes, list) and any(n.get("used") for n in notes)


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


__all__ = ["CPUFunction", "Code", "CompileInfo", "Layout", "Stats", "Workspace", "check_fits", "compile_code",
           "host_memory_bytes"]
