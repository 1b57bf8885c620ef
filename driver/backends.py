"""The targets of `compile_entry` (driver/compile.py), by name: each a `Backend`.

    cpu     backend/cpu (llvmlite + BLAS)
    gpu     backend/gpu (numba.cuda + CuPy)
    auto    backend/split.py: the placed function cut at its transfers, run on both
    interp  ir/interpreter.py: the reference semantics on the optimised IR

Adding a backend: a class here with `name`, `target_key()` and `compile(module, entry,
analyses, options)` returning an object of the `Executable` protocol (driver/compile.py), and
an entry in BACKENDS; mypy (tests/test_types.py) checks both against their protocols. Each
imports its backend's package on first use, so `import gir` loads no backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.manager import Analyses
from ..analysis.memory.plan import MemoryPlan
from ..config import code_key, current
from ..errors import GirArgumentError
from ..ir.core import Function, Module
from ..ir.printer import print_module
from ..support import timing

if TYPE_CHECKING:
    from .compile import Backend, CodeInfo, CompileOptions, Executable
    from .jitstats import CompileStats, GemmLike


class CpuBackend:
    name = "cpu"

    def target_key(self) -> tuple[object, ...]:
        from ..backend.cpu.runtime import target_key

        return target_key()

    def compile(self, module: Module, entry: str, analyses: Analyses, options: CompileOptions) -> Executable:
        from ..backend.cpu.runtime import CPUFunction

        f = module.functions[entry]
        plan = analyses.get(MemoryPlan, f)  # the pipeline's plan, with its pass options
        if options.best:  # -O3 with the GEMM paths measured now (a cache hit's better code)
            from ..backend.cpu.llvm_jit import compile_code

            code = compile_code(f, plan, tiered=False, best=True, lengths=options.lengths)
            compiled = CPUFunction(f, plan, code=code)
        else:
            compiled = CPUFunction.compile(f, plan, tiered=options.tiered, lengths=options.lengths)
        with timing.phase("print IR (fn.ir)"):
            compiled.ir = print_module(module)
        return compiled


class GpuBackend:
    name = "gpu"

    def target_key(self) -> tuple[object, ...]:
        return code_key(current())  # what changes its code: the options (no object cache to key)

    def compile(self, module: Module, entry: str, analyses: Analyses, options: CompileOptions) -> Executable:
        from ..backend.gpu.runtime import GPUFunction

        f = module.functions[entry]
        compiled = GPUFunction.compile(f, analyses.get(MemoryPlan, f))
        compiled.ir = print_module(module)
        return compiled


class SplitBackend:
    """device="auto": the `place` pass's decisions executed, CPU and GPU segments."""

    name = "auto"

    def target_key(self) -> tuple[object, ...]:
        return (*CpuBackend().target_key(), *GpuBackend().target_key())

    def compile(self, module: Module, entry: str, analyses: Analyses, options: CompileOptions) -> Executable:
        from ..analysis.placement import PlacementReport
        from ..backend.split import SplitFunction

        f = module.functions[entry]
        compiled = SplitFunction.compile(f, analyses.get(MemoryPlan, f))
        compiled.ir = print_module(module)
        compiled.placement = analyses.get(PlacementReport, f)  # None without a `place` pass
        return compiled


class InterpreterBackend:
    name = "interp"

    def target_key(self) -> tuple[object, ...]:
        return ()

    def compile(self, module: Module, entry: str, analyses: Analyses, options: CompileOptions) -> Executable:
        return Interpreted(module, entry)


@dataclass
class InterpretedStats:
    """`fn.stats` on the `interp` device: no backend counters, only how it was prepared."""

    compile: Any = None


class Interpreted:
    """The `interp` target's Executable: ir/interpreter.py on the module after the pipeline."""

    def __init__(self, module: Module, entry: str):
        from ..ir.interpreter import Interpreter

        self.interp = Interpreter(module)
        self.module = module
        self.entry = entry
        self.function: Function = module.functions[entry]
        self._ir: str | None = None
        self.stats = InterpretedStats()
        self.compile_stats: CompileStats | None = None
        self.compile_seconds: dict[str, float] = {}
        self.llvm_ir = self.asm = self.preparing = ""
        self.code_info: CodeInfo | None = None
        self.gemms: Sequence[GemmLike] = ()
        self.workspace_bytes: int | None = None

    @property
    def ir(self) -> str:
        """The module run, printed when first asked for (gir.interpret never asks)."""
        if self._ir is None:
            self._ir = print_module(self.module)
        return self._ir

    @ir.setter
    def ir(self, text: str) -> None:
        self._ir = text

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.interp.run_checked(self.function, list(arrays))

    def __call__(self, *args: Any) -> list[np.ndarray]:
        from ..ir.interpreter import check_arguments

        return self.run(check_arguments(self.function, args))


BACKENDS: dict[str, Backend] = {b.name: b for b in (CpuBackend(), GpuBackend(), SplitBackend(), InterpreterBackend())}
"""Every target by name: `gir.jit(device=...)` and `gir run --device` take these."""


def backend_named(name: str) -> Backend:
    found = BACKENDS.get(name)
    if found is None:
        raise GirArgumentError(f"unknown device {name!r}; devices: " + ", ".join(BACKENDS))
    return found
