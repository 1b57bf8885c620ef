"""Compiling a function for the GPU and calling it on NumPy arrays.

A `GPUFunction` owns its device memory (memory.py: the arena or a buffer per value, argument
buffers, constants), allocated once and reused by every call. A call checks the arguments
against the signature before anything runs on the device, copies them to their device buffers
(the only host-to-device transfers), runs the steps (codegen.py), then reads the error flag
and copies the results back as new NumPy arrays (the only device-to-host transfers, but for
`index` by a computed index).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from ...passes.memory.plan import MemoryPlan
from .codegen import lower_function, run_steps
from .device import get_device


@dataclass
class Stats:
    """What the last call did (`fn.stats`)."""

    kernel_launches: int = 0
    gemm_calls: int = 0
    copies: int = 0
    """Device-to-device copies made by xp (carries, stack rows, layout ops)."""
    seconds: float = 0.0
    """The whole call, transfers included."""
    memory: str = ""
    """How values are stored: the arena and its size, or a buffer per value and why."""
    device: str = ""


class GPUFunction:
    """A function compiled for the GPU (or the CUDA simulator)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None):
        self.dev = get_device()
        self.function = function
        self.lowering, self.steps, self.results = lower_function(function, self.dev, plan)
        self.memory = self.lowering.memory
        self.stats = Stats(memory=self.memory.describe(), device=self.dev.name)
        self.ir = ""
        """The IR compiled (set by gir.jit)."""

    @classmethod
    def compile(cls, function: Function, plan: MemoryPlan | None = None) -> GPUFunction:
        """Compiles function, its device arena laid out by plan (the pipeline's `memplan`
        result; memplan's default plan when None)."""
        return cls(function, plan)

    @property
    def kernel_sources(self) -> list[str]:
        """The generated kernels' Python source, once each, in program order."""
        return list(dict.fromkeys(k.source.text for k in self.lowering.kernels))

    @property
    def llvm_ir(self) -> str:
        """For the GPU: the numba.cuda kernels' Python source (numba makes the LLVM IR and PTX)."""
        return "\n".join(self.kernel_sources)

    @property
    def asm(self) -> str:
        """The kernels' PTX on a GPU, for the argument types they were launched with (empty in
        the simulator, and before the first call)."""
        if self.dev.simulated:
            return ""
        texts = []
        for kernel in dict.fromkeys(k.kernel for k in self.lowering.kernels):
            texts.extend(kernel.inspect_asm().values())
        return "\n".join(texts)

    def __call__(self, *args: Any) -> list[np.ndarray]:
        f, low, dev = self.function, self.lowering, self.dev
        arrays = check_arguments(f, args)
        start = time.perf_counter()
        for arg, a in zip(f.args, arrays):
            dev.upload(low.static[arg], a)
        low.err[...] = 0
        counters = low.counters
        counters.kernel_launches = counters.gemm_calls = counters.copies = 0
        env = dict(low.static)
        if dev.simulated:
            with np.errstate(all="ignore"):  # inf and nan as on a GPU (this thread's xp work)
                run_steps(self.steps, env)
        else:
            run_steps(self.steps, env)
        code = int(dev.download(low.err)[0])
        if code:
            message, loc = low.errors[code - 1]
            raise GirError(f"{message} at run time", loc)
        outs = [dev.download(env[v]) for v in self.results]
        self.stats = Stats(counters.kernel_launches, counters.gemm_calls, counters.copies,
                           time.perf_counter() - start, self.memory.describe(), dev.name)
        return outs


__all__ = ["GPUFunction", "Stats"]
