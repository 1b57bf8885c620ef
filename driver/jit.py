"""`gir.jit`: the default pipeline, specialisation on argument shapes, and a compiled callable.

    fn = gir.jit(module_or_source, "rnn_grads")        # device="cpu", mode="fast-run"
    loss, dwx, dwh, db = fn(xs, h0, wx, wh, b)
    fn.stats, fn.ir, fn.llvm_ir, fn.asm

Arguments are bound and converted (driver/calling.py) and checked (count, dtype, shape, contiguity)
before any native code runs. A signature with `?` dims is specialised per distinct argument
shape; every specialisation is compiled once and kept in memory. Results are named
(driver/results.py); how each specialisation was compiled is in `fn.stats.compile` (driver/jitstats.py).
See `help(gir.jit)`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..analysis.lengths import LengthDims, NotALength
from ..analysis.memory.plan import MemoryPlan
from ..config import current
from ..errors import GirArgumentError, Location, did_you_mean
from ..frontend.parser import parse, read_source
from ..ir.core import Function, Module
from ..ir.interpreter import check_arguments
from ..ir.printer import print_module
from ..ir.specialize import specialize
from ..ir.verifier import verify
from ..passes.pass_manager import PassManager
from ..passes.pipeline import DEFAULT_MODE, get_mode, parse_bytes, with_memory_budget
from ..support import timing
from . import compile_cache
from .calling import bind_arguments
from .jitstats import CompileStats, CompileTimer
from .lengths import ForEveryLength, LengthGroup, candidate_groups, find_length, leading_free_dims
from .results import result_names, results_class

DEVICES = ("cpu", "gpu", "auto", "interp")
"""auto: the `place` pass decides, per op, CPU or GPU, and the function runs split (backend/split.py)."""


class JitFunction:
    """What `gir.jit` returns: call it like a Python function (see `help(gir.jit)`)."""

    def __init__(self, module: Module | None, entry: str, device: str, pipeline: str, *,
                 cache_key: str | None = None, signature: Function | None = None,
                 text: tuple[str, str] | None = None, names: tuple[str, ...] | None = None):
        """module, or (on a compile-cache hit) the signature, its results' names and the (text,
        file name) to parse should a specialisation miss; cache_key: compile_cache's key of the source."""
        self._source = module
        self._text = text
        self._cache_key = cache_key
        self.entry = entry
        self.device = device
        self.pipeline = pipeline
        self.signature = module.functions[entry] if module is not None else signature
        assert self.signature is not None
        self.result_names = names if names is not None else result_names(self.signature)
        """The results' names (driver/results.py), as `fn(...)._fields` gives them."""
        self._results = results_class(entry, self.result_names)
        self._compiled: dict[tuple, Any] = {}
        """Argument shapes -> the specialisation for them; for code that serves every length, the
        shapes with the length's dims as None (`LengthGroup.generic`)."""
        self._length_groups: list[LengthGroup] = []
        """The groups of `?` dims some compiled code reads at run time (driver/lengths.py)."""
        self._served: dict[tuple, Any] = {}
        """Argument shapes -> the code for every length that serves them (checked once)."""
        self._compiling = threading.Lock()
        """Held while a specialisation compiles: threads that call with a new shape at once
        compile it once (the compiled function itself is safe to call from several threads)."""
        self._last: Any = None
        self._thread = threading.local()
        """`last`: the specialisation this thread called last, which the inspection properties show."""
        if all(t.is_static for t in self.signature.arg_types):
            self._last = self._specialise(tuple(tuple(t.shape) for t in self.signature.arg_types))

    def _specialise(self, shapes: tuple) -> Any:
        found = self._compiled.get(shapes) or self._served.get(shapes) or self._for_every_length(shapes)
        if found is not None:
            return found
        with self._compiling:
            found = self._compiled.get(shapes) or self._for_every_length(shapes)
            if found is None:
                found = self._compile(shapes)
                group = getattr(found, "length_group", None)
                self._compiled[group.generic(shapes) if group is not None else shapes] = found
                if group is not None and group not in self._length_groups:
                    self._length_groups.append(group)
        return found

    def _for_every_length(self, shapes: tuple) -> Any:
        """Compiled code for every length that these shapes fit, or None."""
        for group in self._length_groups:
            found = self._compiled.get(group.generic(shapes))
            if found is not None and self._serves(found, shapes, group):
                self._served[shapes] = found
                return found
        return None

    def _serves(self, compiled: Any, shapes: tuple, group: LengthGroup) -> bool:
        """Whether code for every length of group runs these shapes (TracedJit also checks that
        the Python function traces to the same program at this length)."""
        return compiled.length_of(shapes) is not None

    @property
    def specialisations(self) -> int:
        """How many specialisations were compiled or loaded (code for every length counts once)."""
        return len(self._compiled)

    def _length_candidates(self, shapes: tuple) -> list[LengthGroup]:
        """The groups of `?` leading dims that may be a length (none off the CPU, or with GIR_LENGTHS=0)."""
        if self.device != "cpu" or not current().lengths:
            return []
        return candidate_groups(shapes, leading_free_dims(self.signature.arg_types))

    @property
    def source(self) -> Module:
        """The module as given; never changed: every specialisation clones it (locations
        included). After a compile-cache hit it is parsed when first needed."""
        if self._source is None:
            assert self._text is not None
            self._source = parse(*self._text)
        return self._source

    def _compile(self, shapes: tuple) -> Any:
        """The specialisation for shapes: from the compile cache (CPU), else compiled and stored.
        Code for every length (driver/lengths.py) is looked up and stored under the shapes with
        the length's dims as None."""
        groups = [g for g in self._length_candidates(shapes)
                  if g.generic(shapes) not in self._compiled]  # there, it does not serve these shapes
        for group in groups:
            found = self._load(("every length", group.generic(shapes)), shapes, group)
            if found is not None and self._serves(found, shapes, group):
                found.length_group = group
                return found
        found = self._load(shapes, shapes, None)
        if found is not None:
            return found
        compiled = self._compile_now(shapes, groups)
        group = getattr(compiled, "length_group", None)
        cached = shapes if group is None else ("every length", group.generic(shapes))
        key = compile_cache.specialisation_key(self._cache_key, cached) if self._cache_key else None
        if key is not None:  # what runs now (quick code too), then the final code once swapped
            compile_cache.store_what_runs(key, compiled)
        return compiled

    def _load(self, cached: tuple, shapes: tuple, group: LengthGroup | None) -> Any:
        """The specialisation stored in the compile cache under `cached` (shapes, or the key of
        code for every length), or None. Never waits for a better version: loads the best entry
        there is, and makes the better code in the background."""
        if not self._cache_key:
            return None
        key = compile_cache.specialisation_key(self._cache_key, cached)
        timer = CompileTimer(CompileStats(self.entry, self.device, shapes))
        with timer.stage("cache-load"):
            found = compile_cache.load_compiled(key)
        if found is None or (group is not None and found.length_of(shapes) is None):
            timer.cancel()
            return None
        found.compile_seconds = {}  # nothing was compiled: the time is the load's
        if compile_cache.needs_better_code(found):
            compile_cache.better_code_for(key, found, lambda: self._better_code(shapes, group))
        # stats.threads is filled when first read (`stats`): asking MKL starts it (~8 ms),
        # which a hit's code does only at its first call
        found.compile_stats = timer.finish(found)
        return found

    def _better_code(self, shapes: tuple, group: LengthGroup | None = None) -> Any:
        """The best code for shapes (-O3, the GEMM paths measured now), for a specialisation
        loaded from the cache as quick code or with the model's paths: on the background
        thread (tiers.py), so the passes run there too; the object cache may skip LLVM.
        group: the code serves every length of it (the length dims are found again)."""
        from ..backend.cpu.llvm_jit import compile_code

        lengths = None
        if group is not None:
            found = find_length(self._specialised_module, self.entry, self.pipeline, shapes, [group])
            if not isinstance(found, ForEveryLength):
                raise RuntimeError(f"the length dims are not found again: {found}")
            module, report, lengths = found.module, found.report, found.lengths
        else:
            module = self._specialised_module(shapes)
            report = PassManager(self.pipeline).run(module)
        f = module.functions[self.entry]
        code = compile_code(f, report.analyses.get(MemoryPlan, f), tiered=False, best=True, lengths=lengths)
        code.info.tier = "final"  # what replaced the loaded code (runtime.CompileInfo.tier)
        return code

    def _every_length(self, shapes: tuple, groups: list[LengthGroup], timer: CompileTimer) -> tuple | None:
        """(compiled code for every length, its module, the pipeline's report), or None with the reason in
        timer.stats.lengths: no group is a length, or the backend cannot serve it."""
        if any(g.length(shapes) == 0 for g in groups):
            timer.stats.lengths = "specialised: a length of 0 (the code for every length serves lengths >= 1)"
        groups = [g for g in groups if (g.length(shapes) or 0) >= 1]
        if not groups:
            return None
        with timer.stage("lengths"), timing.phase("lengths: two representative lengths"):
            found = find_length(self._specialised_module, self.entry, self.pipeline, shapes, groups)
        if isinstance(found, str):
            timer.stats.lengths = f"specialised: {found}"
            return None
        try:
            with timer.stage("backend"):
                compiled = self._backend(found.module, found.report.analyses, found.lengths)
        except NotALength as e:
            timer.stats.lengths = f"specialised: {e}"
            return None
        if not self._serves(compiled, shapes, found.group):  # shorter than it serves (min_length), ...
            timer.stats.lengths = f"specialised: the code for every length does not serve {shapes}"
            return None
        compiled.length_group = found.group
        return compiled, found.module, found.report

    def _compile_now(self, shapes: tuple, groups: list[LengthGroup] | None = None) -> Any:
        timer = CompileTimer(CompileStats(self.entry, self.device, shapes))
        try:
            every = self._every_length(shapes, groups or [], timer)
            if every is not None:
                compiled, module, report = every
            else:
                with timer.stage("specialize"):
                    module = self._specialised_module(shapes)
                with timer.stage("passes"), timing.phase("passes"):
                    report = PassManager(self.pipeline).run(module)
                with timer.stage("backend"):
                    compiled = self._backend(module, report.analyses)
        finally:
            timer.cancel()
        for r in report.records:  # a pass that runs twice (canonicalize) counts its total
            timer.stats.passes[r.spec] = timer.stats.passes.get(r.spec, 0.0) + r.seconds
            timer.stats.checkpoints += [d.describe() for d in r.stats.decisions]
        plan = report.analyses.get(MemoryPlan, module.functions[self.entry])
        timer.stats.planned_peak = plan.arena_bytes if plan is not None and plan.supported else None
        layout = getattr(compiled, "layout", None)
        timer.stats.arena_bytes = layout.arena_bytes + layout.pinned_bytes if layout is not None else None
        timer.stats.threads = _blas_threads(compiled) if self.device == "cpu" else None
        compiled.compile_stats = timer.finish(compiled)
        return compiled

    def _specialised_module(self, shapes: tuple) -> Module:
        f = self.source.functions[self.entry]
        if shapes != tuple(tuple(t.shape) for t in f.arg_types):
            types = [t.with_shape(tuple(shape)) for t, shape in zip(f.arg_types, shapes)]
            return specialize(self.source, self.entry, types)
        return self.source.clone()

    def _backend(self, module: Module, analyses: Any, lengths: LengthDims | None = None) -> Any:
        f = module.functions[self.entry]
        plan = analyses.get(MemoryPlan, f)  # the pipeline's plan, with its pass options
        if self.device == "interp":
            compiled: Any = _Interpreted(module, self.entry)
        elif self.device == "auto":
            from ..analysis.placement import PlacementReport
            from ..backend.split import SplitFunction

            compiled = SplitFunction.compile(f, plan)
            compiled.ir = print_module(module)
            compiled.placement = analyses.get(PlacementReport, f)  # None without a `place` pass
        elif self.device == "gpu":
            from ..backend.gpu.runtime import GPUFunction

            compiled = GPUFunction.compile(f, plan)
            compiled.ir = print_module(module)
        else:
            from ..backend.cpu.runtime import CPUFunction

            compiled = CPUFunction.compile(f, plan, lengths=lengths)
            with timing.phase("print IR (fn.ir)"):
                compiled.ir = print_module(module)
        return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        """Runs @entry: arguments by position or by parameter name (driver/calling.py); returns its
        results as a named tuple (driver/results.py)."""
        arrays = check_arguments(self.signature, bind_arguments(self.signature, args, kwargs))
        compiled = self._specialise(tuple(a.shape for a in arrays))
        self._last = self._thread.last = compiled
        return self._results(*compiled(*arrays))

    # -- inspection (of the specialisation this thread called last; else the last one any
    #    thread used or compiled) -------------------------------------------------------------
    def _current(self) -> Any:
        current = getattr(self._thread, "last", None) or self._last
        if current is None:
            raise GirArgumentError(f"@{self.entry} has `?` dims: call it once so it is specialised")
        return current

    @property
    def compiled(self) -> Any:
        """The backend's compiled function (CPUFunction, GPUFunction) of the last specialisation:
        its `layout` / `memory` say how the arena was laid out."""
        return self._current()

    @property
    def stats(self) -> Any:
        """The calling thread's last call (backend counters, seconds) and, as `.compile`, how
        its specialisation was compiled (jitstats.CompileStats: stages, cache, GEMM paths)."""
        current = self._current()
        stats = current.stats
        ran = getattr(stats, "compile", None)  # the CPU's CompileInfo of the code that ran (its tier)
        stats.compile = getattr(current, "compile_stats", None)
        if stats.compile is not None:
            if stats.compile.threads is None and stats.compile.device == "cpu":
                stats.compile.threads = _blas_threads(current)
            # `ran` is final only once current runs the final code (the swap is one way): its layout
            stats.compile = stats.compile.for_code(ran, getattr(current, "layout", None))
            preparing = getattr(current, "preparing", "")
            if preparing != stats.compile.preparing:  # better code being made now, or made since
                stats.compile = replace(stats.compile, preparing=preparing)
        return stats

    @property
    def ir(self) -> str:
        return self._current().ir

    @property
    def llvm_ir(self) -> str:
        return self._current().llvm_ir

    @property
    def asm(self) -> str:
        return self._current().asm


@dataclass
class InterpretedStats:
    """`fn.stats` on the `interp` device: no backend counters, only how it was prepared."""

    compile: Any = None


def _blas_threads(compiled: Any) -> int | None:
    """The threads compiled's GEMMs run on (None: not known)."""
    from ..backend.cpu.blas import threads_of

    try:
        return threads_of([g.path for g in compiled.layout.gemms])
    except Exception:  # noqa: BLE001 - a report must not fail a compile
        return None


class _Interpreted:
    def __init__(self, module: Module, entry: str):
        from ..ir.interpreter import Interpreter

        self.interp = Interpreter(module)
        self.entry = entry
        self.ir = print_module(module)
        self.stats = InterpretedStats()
        self.llvm_ir = self.asm = ""

    def __call__(self, *args: Any) -> list[np.ndarray]:
        return self.interp.call(self.entry, args)


def jit(source_or_module: Module | str, entry: str | None = None, device: str = "cpu",
        pipeline: str | None = None, mode: str | None = None, memory_budget: int | str | None = None,
        **jax_options: Any) -> JitFunction:
    """Compiles function @entry of a gir program into a Python callable.

    Args:
        source_or_module: a `gir.Module` (copied and verified; never changed), gir source text,
            or the path of a `.gir` file.
        entry: the function to compile, with or without `@`; default: the last one.
        device: where it runs.
            "cpu"    -- LLVM code for this CPU (llvmlite, -O3, host features), GEMMs through
                        MKL or OpenBLAS, whichever was measured faster (docs/backend.md). A
                        first compile runs quick code until its -O3 code, compiled in the
                        background, is swapped in (GIR_LLVM_TIER=0: off; backend/cpu/tiers.py).
            "gpu"    -- Numba CUDA kernels and CuPy GEMMs (docs/gpu.md); the CUDA simulator
                        under NUMBA_ENABLE_CUDASIM=1.
            "auto"   -- placed per op by the `place` pass and run split between the two,
                        `transfer` ops the only crossings (backend/split.py, docs/placement.md).
            "interp" -- the NumPy reference interpreter on the same optimised IR.
        pipeline: the passes to run instead of the mode's; fast-run's is
            passes.pipeline.DEFAULT_PIPELINE (ssa, canonicalize, scan-grad, autodiff, ...) then
            BACKEND_PIPELINE (inline, canonicalize, fuse, memplan); docs/passes.md describes each.
        mode: "fast-run" (the default: the whole pipeline, `lift` placement) or "fast-compile"
            (fewer passes, `aggressive` placement): passes/pipeline.py MODES, docs/passes.md.
        memory_budget: bytes (an int, or "256MB", "1GB", "512MiB") the planned peak of the
            compiled function should fit: when it does not, the `checkpoint` pass recomputes
            the forward steps of backward scans segment by segment instead of keeping every
            step's residuals (transforms/checkpoint.py, docs/memplan.md). None: no budget.

    Returns a `JitFunction`. Calling it:

        fn = gir.jit("examples/rnn.gir", "rnn_grads")
        loss, dwx, dwh, db = fn(xs, h0, wx, wh, b)      # or fn(xs, h0, wx=wx, wh=wh, b=b)
        out = fn(xs, h0, wx, wh, b); out.loss, out._fields, out._asdict()

    Arguments bind by position or by parameter name (without `%`). NumPy arrays must have the
    parameter's dtype (a lossless widening, f32 -> f64 or i32 -> i64, is done by a copy; a
    narrowing or a change of kind is an error that says how to convert); Python numbers and
    lists take the parameter's dtype, as weakly typed values do in JAX. Shapes must match
    the signature, where `?` matches any size. Every error is a `gir.GirArgumentError` naming
    the parameter (driver/calling.py, docs/backend.md "Calling convention").

    `?` dims: a signature such as `tensor<?x?x256xf32>` is compiled once per distinct
    argument shape, on first use, and kept: the module is specialised on the shapes
    (ir/specialize.py re-infers every type through loops, calls and `grad`), then the
    pipeline runs on static shapes. A static signature is compiled here, at once.

    Results: a tuple subclass (namedtuple) named after the `return` operands: `return %loss,
    %dwx` gives `.loss` and `.dwx`; an unnamed, duplicate or unusable name is `out<i>`. It
    unpacks, indexes, has `len`, and compares equal to a list or tuple of the same arrays
    (driver/results.py). Outputs are fresh arrays.

    Inspecting (the specialisation the calling thread used last):
        fn.stats     the last call: backend counters (gemm_calls, pack_calls, gemm_paths,
                     seconds) and `.compile`, a jitstats.CompileStats: seconds per stage
                     (specialize, passes, codegen, llvm-optimize, emit-object or cache-load,
                     load), per pass, the code cache (hit/miss), BLAS threads and the GEMM path
                     chosen for each product; `fn.stats.compile.describe()` prints it as
                     `gir run -v` does.
        fn.ir        the IR that was compiled, after all passes.
        fn.llvm_ir   the LLVM module before optimisation (cpu); fn.asm: host assembly.
        fn.compiled  the backend's object (CPUFunction / GPUFunction: layout, memory).

    A compile that takes more than about a second prints a line to stderr when it starts
    and when it ends, if stderr is a terminal (GIR_PROGRESS=1: always; 0: never). Compiled
    code is cached on disk (GIR_CACHE_DIR, default ~/.cache/gir; driver/compile_cache.py): a source
    compiled before is not even parsed again. The function may be called
    from several threads. Errors in the program are `gir.GirError`s with file:line:col.

    A Python function (DESIGN.md §7, docs/python.md) is traced per argument structure, shapes
    and dtypes and compiled the same way (driver/pyjit.py): `gir.jit(gir.value_and_grad(loss))`.
    """
    if jax_options:  # jax.jit's static_argnums, donate_argnums, ...: say so, not a bare TypeError
        raise GirArgumentError("gir.jit has no option " + ", ".join(sorted(jax_options)) + " (it takes entry, device, "
                               "pipeline, mode, memory_budget); a value that must stay a Python value can be bound "
                               "with functools.partial or a closure")
    budget = parse_bytes(memory_budget)
    if budget is not None:
        if pipeline is not None and mode is not None:
            raise GirArgumentError("gir.jit takes a mode or a pipeline, not both")
        if pipeline is None:
            pipeline = get_mode(mode or DEFAULT_MODE).pipeline(usable_device(device) if device in DEVICES else "cpu")
        pipeline, mode = with_memory_budget(pipeline, budget), None
    if callable(source_or_module) and not isinstance(source_or_module, (str, Module)):
        from .pyjit import jit_python

        return jit_python(source_or_module, entry, device=device, pipeline=pipeline, mode=mode)  # type: ignore[return-value]
    if device not in DEVICES:
        raise GirArgumentError(f"unknown device {device!r}; devices: " + ", ".join(DEVICES))
    if pipeline is not None and mode is not None:
        raise GirArgumentError("gir.jit takes a mode or a pipeline, not both")
    device = usable_device(device)
    full = pipeline if pipeline is not None else get_mode(mode or DEFAULT_MODE).pipeline(device)
    if isinstance(source_or_module, Module):
        module = source_or_module.clone()
        verify(module)  # built or edited in Python: its errors are its own, not the first pass's
        entry = _entry(module, entry)
        return JitFunction(module, entry, device, full, cache_key=compile_cache.module_key(module, entry, device, full))
    if isinstance(source_or_module, os.PathLike):  # a pathlib.Path is a path, whatever its characters
        path = os.fspath(source_or_module)
        text, filename = read_source(path), path
    elif not isinstance(source_or_module, str):
        kind = type(source_or_module).__name__
        raise GirArgumentError(f"gir.jit takes a Module, gir source, a .gir path or a Python function, not {kind}")
    elif names_a_file(source_or_module):
        text, filename = read_source(source_or_module), source_or_module
    else:
        text, filename = source_or_module, "<jit>"
    key = compile_cache.source_key(text, filename, entry, device, full)
    found = compile_cache.load_signature(key) if key else None
    if found is not None:  # compiled before: parsed only if a specialisation misses
        signature, names = found
        return JitFunction(None, signature.name, device, full, cache_key=key, signature=signature,
                           text=(text, filename), names=names)
    with timing.phase("parse"):
        module = parse(text, filename=filename)
    entry = _entry(module, entry)
    if key:
        compile_cache.store_signature(key, module.functions[entry])
    return JitFunction(module, entry, device, full, cache_key=key)


def names_a_file(text: str) -> bool:
    """A str given as a program is a path when it is one line that ends with `.gir` (no program
    text ends so: its last token is `}`) or names an existing file; `{` or a blank in a path
    does not make it source text. A caller that knows passes a pathlib.Path (the CLI does)."""
    return "\n" not in text and (text.endswith(".gir") or os.path.isfile(text))


def usable_device(device: str) -> str:
    """device="auto" where no GPU can run (no CUDA GPU, no simulator) is the CPU: as JAX's
    default backend, "auto" means the best this machine has; "gpu" there stays an error."""
    if device != "auto":
        return device
    from ..backend.gpu.device import available

    return "auto" if available() else "cpu"


def _entry(module: Module, entry: str | None) -> str:
    if entry is None:
        entry = list(module.functions)[-1]
    if not isinstance(entry, str):
        raise GirArgumentError(f"the entry is a function's name (a str), not {type(entry).__name__}")
    entry = entry.lstrip("@")
    if entry not in module.functions:
        raise GirArgumentError(f"no function @{entry} in {module.filename}; it has "
                               + ", ".join("@" + n for n in module.functions)
                               + did_you_mean(entry, module.functions, prefix="@"), Location(module.filename, 1, 1))
    return entry
