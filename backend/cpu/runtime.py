"""Compiling an LLVM module for the host CPU and calling it on NumPy arrays.

The target is the host CPU with its features at optimisation level 3 (so fused loops are
vectorised for, e.g., AVX2). A `CPUFunction` owns its arena (allocated once, reused across
calls) and its pinned area (packed weights). Arguments are checked against the signature
before any native code runs; outputs are fresh arrays.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from ...errors import GirArgumentError, GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from . import blas
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
    """What the last call did (`fn.stats`)."""

    gemm_calls: int = 0
    pack_calls: int = 0
    seconds: float = 0.0
    gemm_paths: dict[str, int] = field(default_factory=dict)


class CPUFunction:
    def __init__(self, function: Function):
        self.function = function
        module, self.layout = lower_function(function)
        self.llvm_ir = str(module)
        mod = llvm.parse_assembly(self.llvm_ir)
        mod.verify()
        optimize(mod)
        self.optimized_ir = str(mod)
        self.asm = target_machine().emit_assembly(mod)
        blas.bind_symbols()
        self.engine = llvm.create_mcjit_compiler(mod, new_target_machine())
        self.engine.finalize_object()
        addr = self.engine.get_function_address("gir_main")
        self._native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(addr)
        self.arena = _aligned(self.layout.arena_bytes)
        self.pinned = _aligned(self.layout.pinned_bytes)
        self.counters = np.zeros(4, np.int64)
        self.fns = blas.providers().table_array()
        self.stats = Stats()

    @classmethod
    def compile(cls, function: Function) -> CPUFunction:
        return cls(function)

    def __call__(self, *args: Any) -> list[np.ndarray]:
        f = self.function
        arrays = check_arguments(f, args)
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise GirArgumentError(f"argument %{f.args[i].name_hint} of @{f.name} must be C-contiguous "
                                       "(use np.ascontiguousarray)", f.loc)
        outs = [np.empty(t.shape, t.numpy_dtype) for t in f.result_types]  # type: ignore[arg-type]
        ptrs = [a.ctypes.data for a in arrays] + [o.ctypes.data for o in outs] + [self.arena.ctypes.data,
                                                                                  self.pinned.ctypes.data]
        buffers = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self.counters[:] = 0
        start = time.perf_counter()
        self._native(buffers, self.counters.ctypes.data, ctypes.cast(self.fns, ctypes.c_void_p))
        seconds = time.perf_counter() - start
        if self.counters[2]:
            message, loc = self.layout.errors[int(self.counters[2]) - 1]
            raise GirError(f"{message} at run time", loc)  # type: ignore[arg-type]
        paths: dict[str, int] = {}
        for g in self.layout.gemms:
            paths[g.path] = paths.get(g.path, 0) + 1
        self.stats = Stats(int(self.counters[0]), int(self.counters[1]), seconds, paths)
        return outs


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 64, np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + max(nbytes, 1)]


__all__ = ["CPUFunction", "Layout", "Stats"]
