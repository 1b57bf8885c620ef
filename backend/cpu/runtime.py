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
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from ...errors import GirArgumentError, GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from ...ir.types import TensorType
from ...passes.memory.plan import MemoryPlan
from . import blas, blas_threads
from .codegen import Layout, lower_function


def new_target_machine() -> llvm.TargetMachine:
    """The host CPU with all its features, -O3. An execution engine takes ownership of the
    target machine it is given, so every engine gets a machine of its own."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, codemodel="jitdefault")


@cache
def target_machine() -> llvm.TargetMachine:
    """A machine for optimising and printing assembly; never handed to an engine."""
    return new_target_machine()


def optimize(mod: llvm.ModuleRef) -> None:
    tm = target_machine()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


@dataclass
class Stats:
    """What a call did (`fn.stats`: the calling thread's last call)."""

    gemm_calls: int = 0
    pack_calls: int = 0
    seconds: float = 0.0
    gemm_paths: dict[str, int] = field(default_factory=dict)
    schedule: dict[str, object] = field(default_factory=dict)
    """How the compiled code lays out its work (Layout.schedule): stacked values written in
    place or copied, and the two-core schedule with the reasons for it."""


class CPUFunction:
    """A function compiled for this CPU; cached on disk by content (see `cache_key`)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None):
        self.function = function
        key = cache_key(function, plan)
        cached = _load_cached(key)
        if cached is not None:
            obj, self.layout, self.optimized_ir, self.llvm_ir = cached
            self.from_cache = True
        else:
            module, self.layout = lower_function(function, plan)
            self.llvm_ir = str(module)
            mod = llvm.parse_assembly(self.llvm_ir)
            mod.verify()
            optimize(mod)
            self.optimized_ir = str(mod)
            obj = target_machine().emit_object(mod)
            _store_cached(key, obj, self.layout, self.optimized_ir, self.llvm_ir)
            self.from_cache = False
        check_fits(function, self.layout.arena_bytes + self.layout.pinned_bytes, host_memory_bytes(), "this machine")
        blas.bind_symbols()
        blas_threads.bind_symbols()
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
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
        self._last_stats = Stats()
        """The last call completed on any thread (what `stats` is in a thread that made none)."""
        self._asm: str | None = None

    @property
    def asm(self) -> str:
        """The host assembly (made on first access: printing it costs as much as compiling)."""
        if self._asm is None:
            self._asm = target_machine().emit_assembly(llvm.parse_assembly(self.optimized_ir))
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
                                                      self.layout.schedule)
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
    """Content key: the printed function (after every pass), the memory plan's strategy, gir and
    llvmlite versions, the host CPU and its features, and what decides GEMM paths (MKL present,
    threads, forced path)."""
    from ... import __version__
    from ...ir.printer import print_function

    parts = [print_function(function, print_locations=True), __version__, llvm.llvm_version_info.__str__(),
             llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
             str(blas.providers().has_mkl), str(blas.threads()), os.environ.get("GIR_GEMM_PATH", ""),
             os.environ.get("GIR_CPU_ARENA", ""), os.environ.get("GIR_CPU_OVERLAP", ""),
             plan.strategy if plan is not None else "default",
             _CODEGEN_VERSION]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


_CODEGEN_VERSION = "11"
"""Bump when the code the backend generates changes meaning, to retire cached objects."""


def _cache_dir() -> str:
    root = os.environ.get("GIR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gir")
    return os.path.join(root, "objects")


def _store_cached(key: str, obj: bytes, layout: Layout, optimized_ir: str, llvm_ir: str) -> None:
    folder = _cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        meta = {"layout": layout.to_json(), "optimized_ir": optimized_ir, "llvm_ir": llvm_ir,
                "sha256": hashlib.sha256(obj).hexdigest()}
        for suffix, data in ((".o", obj), (".json", json.dumps(meta).encode())):
            # a temporary name per process and thread: two threads may compile the same function
            tmp = os.path.join(folder, f"{key}{suffix}.{os.getpid()}.{threading.get_ident()}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(folder, key + suffix))
    except OSError:
        pass  # an unwritable cache only costs compiling again


def _load_cached(key: str) -> tuple[bytes, Layout, str, str] | None:
    folder = _cache_dir()
    try:
        with open(os.path.join(folder, key + ".json"), "rb") as f:
            meta = json.loads(f.read())
        with open(os.path.join(folder, key + ".o"), "rb") as f:
            obj = f.read()
        if hashlib.sha256(obj).hexdigest() != meta["sha256"]:
            return None  # truncated or overwritten: loading it would crash the process; compile again
        return obj, Layout.from_json(meta["layout"]), meta["optimized_ir"], meta["llvm_ir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


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


__all__ = ["CPUFunction", "Layout", "Stats", "Workspace", "check_fits", "host_memory_bytes"]
