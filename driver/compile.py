"""The one compile path: specialise an entry on argument types, run a pipeline, hand the
result to a backend.

    executable = compile_entry(module, "rnn_grads", arg_types, "cpu", pipeline)
    outs = executable(*arrays)           # checked; executable.run(arrays) when checked already
    executable.stats, executable.ir, executable.llvm_ir, executable.asm, executable.preparing

Every driver goes through `compile_entry`: `gir.jit` of text or of a Module (driver/jit.py) and
of a Python function (driver/pyjit.py, through jit.py), `gir run`, `gir compile` (cli.py),
`gir.interpret` (driver/reference.py: the `interp` target with `ssa,autodiff`), and the better
code a compile-cache hit makes in the background. `run_passes` is the one place a
`PassManager` is made outside passes/ (tests/test_architecture.py keeps it so).

A target is a `Backend` (driver/backends.py holds them by name: cpu, gpu, auto, interp); what
it compiles is an `Executable`. Both are `typing.Protocol`s, checked by mypy
(tests/test_types.py): the backends' classes (backend/cpu/runtime.py `CPUFunction`,
backend/gpu/runtime.py `GPUFunction`, backend/split.py `SplitFunction`) satisfy `Executable`
by their shape and import nothing of the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..analysis.lengths import LengthDims
from ..analysis.manager import Analyses
from ..analysis.memory.plan import MemoryPlan
from ..ir.core import Function, Module
from ..ir.specialize import specialize
from ..ir.types import TensorType
from ..passes.pass_manager import DebugOptions, PassManager, Report
from ..support import timing
from .backends import backend_named
from .jitstats import CompileStats, CompileTimer

if TYPE_CHECKING:
    from .jitstats import GemmLike


class CodeInfo(Protocol):
    """What a backend says of the code its calls run now (the CPU's `CompileInfo`)."""

    @property
    def tier(self) -> str: ...
    @property
    def opt_level(self) -> int | None: ...
    @property
    def gemm_measured(self) -> bool | None: ...
    @property
    def from_cache(self) -> str: ...


class CallStats(Protocol):
    """`fn.stats`: a backend's record of the calling thread's last call; the driver puts how
    the code was compiled into `compile` (a jitstats.CompileStats)."""

    compile: Any


@runtime_checkable
class Executable(Protocol):
    """What a backend compiles: the entry, callable on NumPy arrays. (`isinstance` against it
    is for tests: before Python 3.12 it reads every property, `asm` too.)"""

    function: Function
    """The compiled function (its signature checks arguments)."""
    ir: str
    """The IR it was compiled from, after all passes (set by the driver: `fn.ir`)."""
    compile_stats: CompileStats | None
    """How the driver compiled it (set by the driver: `fn.stats.compile`)."""
    compile_seconds: dict[str, float]
    """The backend's own split of its compile time, by the stage names of jitstats ({} none)."""

    @property
    def stats(self) -> CallStats: ...
    @property
    def llvm_ir(self) -> str: ...
    @property
    def asm(self) -> str: ...
    @property
    def preparing(self) -> str:
        """Readiness of the final tier: the better code being made in the background to replace
        what calls run now ('' when calls run the final code, or there is no other tier)."""
    @property
    def code_info(self) -> CodeInfo | None:
        """The code calls run now (tier, LLVM level, cache): None for a backend without tiers."""
    @property
    def gemms(self) -> Sequence[GemmLike]:
        """The matrix products of the code calls run now and the BLAS path of each ([] none)."""
    @property
    def workspace_bytes(self) -> int | None:
        """The memory a call allocates per thread (CPU: arena and pinned area); None: not known."""

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs on arguments the driver has checked (`check_arguments`): no check again."""
    def __call__(self, *args: Any) -> list[np.ndarray]:
        """Checks the arguments, then runs."""


@dataclass(frozen=True)
class CompileOptions:
    """How `compile_entry` compiles, beyond the target and the pipeline."""

    tiered: bool | None = None
    """CPU: quick code first, -O3 in the background (None: config's default; False: the final
    code only, as `gir compile` writes it)."""
    best: bool = False
    """CPU: compile again with the GEMM paths measured now, even if the object cache has it."""
    debug: DebugOptions | None = None
    """The pass manager's debugging options (the CLI's flags); None: the defaults."""
    progress: bool | None = None
    """Print a progress line for a slow compile (None: jitstats.progress_wanted; False: a
    background compile, which nobody waits for)."""
    on_report: Callable[[Report], None] | None = None
    """Given the pass manager's report once the pipeline has run (`gir run --timing`)."""
    lengths: LengthDims | None = None
    """CPU: code for every length of these dims (analysis/lengths.py, driver/lengths.py)."""


class Backend(Protocol):
    """A target: compiles the entry of a module the pipeline has run on (driver/backends.py)."""

    name: str

    def target_key(self) -> tuple[object, ...]:
        """What of this machine and of gir's options changes its code (part of cache keys)."""
    def compile(self, module: Module, entry: str, analyses: Analyses, options: CompileOptions) -> Executable:
        """The Executable of @entry; analyses hold what the pipeline computed (the MemoryPlan)."""


def run_passes(module: Module, pipeline: str, debug: DebugOptions | None = None) -> Report:
    """Runs pipeline on module (in place): the one PassManager of the drivers."""
    manager = PassManager(pipeline, **vars(debug)) if debug is not None else PassManager(pipeline)
    return manager.run(module)


def specialised(module: Module, entry: str, arg_types: Sequence[TensorType]) -> Module:
    """A copy of module with @entry's parameters of arg_types (re-inferred through calls,
    loops and `grad`, ir/specialize.py); a plain copy when they are its own."""
    if list(arg_types) != list(module.functions[entry].arg_types):
        return specialize(module, entry, arg_types)
    return module.clone()


def compile_entry(module: Module, entry: str, arg_types: Sequence[TensorType], target: str | Backend,
                  pipeline: str, options: CompileOptions = CompileOptions()) -> Executable:
    """@entry of module (never changed: a specialised copy is compiled) for arguments of
    arg_types, after pipeline, by target (a name of driver/backends.py or a Backend). The
    Executable's `compile_stats` say what each stage took."""
    backend = backend_named(target) if isinstance(target, str) else target
    shapes = tuple(tuple(t.shape) for t in arg_types)
    timer = CompileTimer(CompileStats(entry, backend.name, shapes), options.progress)
    try:
        with timer.stage("specialize"):
            copy = specialised(module, entry, arg_types)
        with timer.stage("passes"), timing.phase("passes"):
            report = run_passes(copy, pipeline, options.debug)
        if options.on_report is not None:
            options.on_report(report)
        with timer.stage("backend"):
            executable = backend.compile(copy, entry, report.analyses, options)
    finally:
        timer.cancel()
    stats = timer.stats
    for r in report.records:  # a pass that runs twice (canonicalize) counts its total
        stats.passes[r.spec] = stats.passes.get(r.spec, 0.0) + r.seconds
        stats.checkpoints += [d.describe() for d in r.stats.decisions]
    plan = report.analyses.get(MemoryPlan, copy.functions[entry])
    stats.planned_peak = plan.peak_bytes if plan is not None and plan.supported else None
    stats.arena_bytes = executable.workspace_bytes
    stats.threads = blas_threads(executable) if backend.name == "cpu" else None
    executable.compile_stats = timer.finish(executable)
    return executable


def blas_threads(executable: Executable) -> int | None:
    """The threads executable's GEMMs run on (None: not known)."""
    from ..backend.cpu.blas import threads_of

    try:
        return threads_of([g.path for g in executable.gemms])
    except Exception:  # noqa: BLE001 - a report must not fail a compile
        return None
