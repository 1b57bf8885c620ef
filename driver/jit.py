"""`gir.jit`: the default pipeline, specialisation on argument shapes, and a compiled callable.

    fn = gir.jit(module_or_source, "rnn_grads")        # device="cpu", mode="fast-run"
    loss, dwx, dwh, db = fn(xs, h0, wx, wh, b)
    fn.stats, fn.ir, fn.llvm_ir, fn.asm

Arguments are bound and converted (driver/calling.py) and checked (count, dtype, shape, contiguity)
before any native code runs. A signature with `?` dims is specialised per distinct argument
shape; every specialisation is compiled once and kept in memory, the least recently used
evicted past GIR_MAX_SPECIALISATIONS (driver/specialisations.py). Results are named
(driver/results.py); how each specialisation was compiled is in `fn.stats.compile` (driver/jitstats.py).
See `help(gir.jit)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ..analysis.lengths import conforms, module_extents
from ..config import current
from ..errors import GirArgumentError, GirError, Location, did_you_mean
from ..frontend.parser import parse, read_source
from ..ir.core import Function, Module
from ..ir.interpreter import check_arguments
from ..ir.types import TensorType
from ..ir.verifier import verify
from ..passes.pipeline import DEFAULT_MODE, get_mode, parse_bytes, with_memory_budget
from ..support import timing
from . import compile_cache
from .backends import BACKENDS, backend_named
from .calling import bind_arguments
from .compile import CompileOptions, Executable, blas_threads, compile_entry, specialised
from .jitstats import CompileStats, CompileTimer
from .lengths import (
    REPRESENTATIVES,
    LengthGroup,
    candidate_groups,
    compile_every_length,
    find_length,
    leading_free_dims,
)
from .results import result_names, results_class
from .specialisations import Specialisations

if TYPE_CHECKING:
    from .pyjit import PythonJit, StaticJit

DEVICES = tuple(BACKENDS)
"""cpu, gpu, auto, interp (driver/backends.py). auto: the `place` pass decides, per op, CPU or
GPU, and the function runs split (backend/split.py)."""

Shapes = tuple[tuple[int, ...], ...]
"""What tells one specialisation of a JitFunction from another: the argument shapes."""


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
        self.backend = backend_named(device)
        self.pipeline = pipeline
        found = module.functions[entry] if module is not None else signature
        assert found is not None
        self.signature: Function = found
        self.result_names = names if names is not None else result_names(self.signature)
        """The results' names (driver/results.py), as `fn(...)._fields` gives them."""
        self._results = results_class(entry, self.result_names)
        self._compiled: Specialisations[tuple, Executable] = Specialisations(self._evicted)
        """Each specialisation compiled once (the compiled function itself is safe to call
        from several threads), the least recently used evicted past GIR_MAX_SPECIALISATIONS;
        `last()` is what the inspection properties show. Keyed by the argument shapes; code for
        every length (driver/lengths.py) by the shapes with the length's dims as None
        (`LengthGroup.generic`), which later lengths use."""
        self._every_length: dict[tuple, Any] = {}
        """Code for every length, by its key (the shapes with the length's dims as None)."""
        self._length_groups: list[LengthGroup] = []
        """The groups of `?` dims that code for every length reads at run time."""
        self._served: dict[Shapes, tuple] = {}
        """Argument shapes -> the key of the code for every length that serves them (checked
        once; emptied past SERVED_LIMIT entries, as a process may call with ever new lengths)."""
        self._made = 0
        """Specialisations compiled or loaded (code for every length once)."""
        if all(t.is_static for t in self.signature.arg_types):
            self._compiled.get(tuple(t.static_shape for t in self.signature.arg_types), self._compile)

    @staticmethod
    def specialisation_key(arrays: Sequence[np.ndarray]) -> Shapes:
        """The key of the specialisation that runs these (checked) arguments: their shapes."""
        return tuple(a.shape for a in arrays)

    def _arg_types(self, shapes: Shapes) -> list[TensorType]:
        return [t.with_shape(tuple(shape)) for t, shape in zip(self.signature.arg_types, shapes)]

    @property
    def specialisations(self) -> int:
        """How many specialisations were compiled or loaded (code for every length counts once;
        one evicted and made again counts again)."""
        return self._made

    @property
    def specialisations_kept(self) -> int:
        """How many specialisations are kept in memory now (at most GIR_MAX_SPECIALISATIONS; code
        for every length, kept under two keys once a second length called it, counts once)."""
        return self._compiled.distinct()

    @property
    def specialisations_evicted(self) -> int:
        """How many specialisations were evicted (least recently used, past the bound) so far."""
        return self._compiled.evicted

    def _evicted(self, key: tuple, compiled: Executable) -> None:
        """Drops what else refers to an evicted specialisation: it as code for every length, and
        the shapes it served, unless it is still kept under its other key (code for every length
        is kept under the shapes of its first call and, once another length called it, under its
        generic key: the first call's key, used once, is evicted first while the code is hot).
        Called under the specialisations' lock."""
        generic = self._generic_keys_of(compiled)
        for k in generic:
            del self._every_length[k]
        if generic:
            self._served = {shapes: k for shapes, k in self._served.items() if k not in generic}

    def _generic_keys_of(self, compiled: Executable) -> list[tuple]:
        """The generic keys under which compiled is code for every length, where no key of the
        specialisations holds it any more."""
        if self._compiled.holds(compiled):
            return []
        return [k for k, code in self._every_length.items() if code is compiled]

    def _key(self, shapes: Shapes) -> tuple:
        """The key of the specialisation that runs these shapes: code for every length that
        serves them (its key), else the shapes."""
        found = self._served.get(shapes)
        if found is not None:
            return found
        for group in self._length_groups:
            generic = group.generic(shapes)
            compiled = self._every_length.get(generic)
            if compiled is not None and self._serves(compiled, shapes, group):
                if len(self._served) >= SERVED_LIMIT:
                    self._served = {}
                self._served[shapes] = generic
                return generic
        return shapes

    def _serves(self, compiled: Any, shapes: Shapes, group: LengthGroup) -> bool:
        """Whether code for every length of group runs these shapes (TracedJit also checks that
        the Python function traces to the same program at this length)."""
        return compiled.length_of(shapes) is not None

    def _length_candidates(self, shapes: Shapes) -> list[LengthGroup]:
        """The groups of `?` leading dims that may be a length (none off the CPU, with GIR_LENGTHS=0,
        or where code for every length of the group exists and does not serve these shapes)."""
        if self.device != "cpu" or not current().lengths:
            return []
        groups = candidate_groups(shapes, leading_free_dims(self.signature.arg_types))
        return [g for g in groups if g.generic(shapes) not in self._every_length]

    @property
    def source(self) -> Module:
        """The module as given; never changed: every specialisation clones it (locations
        included). After a compile-cache hit it is parsed when first needed."""
        if self._source is None:
            assert self._text is not None
            self._source = parse(*self._text)
        return self._source

    def _compile(self, key: tuple) -> Executable:
        """The specialisation for key: code for every length made already (key is its key),
        else for the shapes key: from the compile cache (CPU; code for every length first,
        stored under the shapes with the length's dims as None), else compiled and stored."""
        if key in self._every_length:
            return self._every_length[key]
        if any(d is None for shape in key for d in shape):  # a generic key whose code was evicted meanwhile
            raise _Evicted
        shapes: Shapes = key
        groups = self._length_candidates(shapes)
        for group in groups:
            found = self._load(("every length", group.generic(shapes)), shapes, group)
            if found is not None:
                return self._made_for_every_length(found, shapes, group)
        found = self._load(shapes, shapes, None)
        if found is not None:
            self._made += 1
            return found
        compiled, length = self._compile_now(shapes, groups)
        cached = shapes if length is None else ("every length", length.generic(shapes))
        cache_key = compile_cache.specialisation_key(self._cache_key, cached) if self._cache_key else None
        if cache_key is not None:  # what runs now (quick code too), then the final code once swapped
            compile_cache.store_what_runs_soon(cache_key, compiled)
        if length is not None:
            return self._made_for_every_length(compiled, shapes, length)
        self._made += 1
        return compiled

    def _made_for_every_length(self, compiled: Any, shapes: Shapes, group: LengthGroup) -> Any:
        self._every_length[group.generic(shapes)] = compiled
        if group not in self._length_groups:
            self._length_groups.append(group)
        self._made += 1
        lengths = compiled.layout.lengths
        compiled.compile_stats.lengths = f"every length: {lengths.describe}"
        return compiled

    def _compile_now(self, shapes: Shapes, groups: list[LengthGroup]) -> tuple[Executable, LengthGroup | None]:
        """Compiled for every length of one of groups, else for shapes (with the reason why not
        in its stats)."""
        every = compile_every_length(self._specialised_module, self.entry, self.backend, self.pipeline, shapes,
                                     groups, self._serves)
        if not isinstance(every, str):
            return every
        compiled = compile_entry(self._module_for(shapes), self.entry, self._arg_types(shapes), self.backend,
                                 self.pipeline)
        if every and compiled.compile_stats is not None:
            compiled.compile_stats.lengths = f"specialised: {every}"
        return compiled, None

    def _specialised_module(self, shapes: Shapes) -> Module:
        """The source specialised on shapes (a Python function's TracedJit traces it again)."""
        return specialised(self.source, self.entry, self._arg_types(shapes))

    def _module_for(self, shapes: Shapes) -> Module:
        """The module compile_entry specialises on shapes: the source (TracedJit: fn traced at them)."""
        return self.source

    def _load(self, cached: tuple, shapes: Shapes, group: LengthGroup | None) -> Any:
        """The specialisation stored in the compile cache under `cached` (shapes, or the key of
        code for every length, which must serve shapes), or None. Never waits for a better
        version: loads the best entry there is, and makes the better code in the background."""
        if not self._cache_key:
            return None
        key = compile_cache.specialisation_key(self._cache_key, cached)
        timer = CompileTimer(CompileStats(self.entry, self.device, shapes))
        with timer.stage("cache-load"):
            found = compile_cache.load_compiled(key)
        if found is None or (group is not None and not self._serves(found, shapes, group)):
            timer.cancel()
            return None
        found.compile_seconds = {}  # nothing was compiled: the time is the load's
        compile_cache.better_code_later(key, found, lambda: self._better_code(shapes, group))
        # stats.threads is filled when first read (`stats`): asking MKL starts it (~8 ms),
        # which a hit's code does only at its first call
        found.compile_stats = timer.finish(found)
        return found

    def _better_code(self, shapes: Shapes, group: LengthGroup | None = None) -> Any:
        """The best code for shapes (-O3, the GEMM paths measured now), for a specialisation
        loaded from the cache as quick code or with the model's paths: on the background
        thread (tiers.py), so the passes run there too; the object cache may skip LLVM.
        group: the code serves every length of it (the length dims are found again)."""
        from ..backend.cpu.runtime import CPUFunction

        options = CompileOptions(tiered=False, best=True, progress=False)
        if group is not None:
            found = find_length(self._specialised_module, self.entry, self.pipeline, shapes, [group])
            if isinstance(found, str):
                raise RuntimeError(f"the length dims are not found again: {found}")
            better = self.backend.compile(found.module, self.entry, found.report.analyses,
                                          replace(options, lengths=found.lengths))
        else:
            better = compile_entry(self._module_for(shapes), self.entry, self._arg_types(shapes), self.backend,
                                   self.pipeline, options)
        assert isinstance(better, CPUFunction)  # the compile cache holds CPU code only
        code = better.code
        code.info.tier = "final"  # what replaced the loaded code (runtime.CompileInfo.tier)
        return code

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        """Runs @entry: arguments by position or by parameter name (driver/calling.py); returns its
        results as a named tuple (driver/results.py)."""
        device = _gpu_device_arrays() if self.device == "gpu" else (None, None)  # taken as they are
        arrays = check_arguments(self.signature, bind_arguments(self.signature, args, kwargs, device[0]), device[1])
        shapes = self.specialisation_key(arrays)
        try:
            compiled = self._compiled.get(self._key(shapes), self._compile)
        except _Evicted:  # another thread evicted the code for every length found: look again
            compiled = self._compiled.get(self._key(shapes), self._compile)
        return self._results(*compiled.run(arrays))  # checked: the backend does not check again

    # -- inspection (of the specialisation this thread called last; else the last one any
    #    thread used or compiled) -------------------------------------------------------------
    def _current(self) -> Executable:
        current = self._compiled.last()
        if current is None:
            raise GirArgumentError(f"@{self.entry} has `?` dims: call it once so it is specialised")
        return current

    @property
    def compiled(self) -> Executable:
        """The backend's compiled function (CPUFunction, GPUFunction) of the last specialisation:
        its `layout` / `memory` say how the arena was laid out."""
        return self._current()

    @property
    def stats(self) -> Any:
        """The calling thread's last call (backend counters, seconds) and, as `.compile`, how
        its specialisation was compiled (jitstats.CompileStats: stages, cache, GEMM paths)."""
        current = self._current()
        stats = current.stats
        compiled = current.compile_stats
        if compiled is not None:
            if compiled.threads is None and compiled.device == "cpu":
                compiled.threads = blas_threads(current)
            # the code calls run now: final once the swap came (it is one way), with its layout
            compiled = compiled.for_code(current.code_info, current.gemms)
            preparing = current.preparing
            if preparing != compiled.preparing:  # better code being made now, or made since
                compiled = replace(compiled, preparing=preparing)
        stats.compile = compiled
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


SERVED_LIMIT = 4096
"""Entries of `JitFunction._served` (and `TracedJit._checked`) kept at most: they are memos of a
check, so they are emptied rather than grown without bound by a process of many lengths."""


class _Evicted(Exception):
    """A generic key (code for every length) whose code was evicted by another thread between
    finding the key and asking for its code; the call looks its key up again."""


class TracedJit(JitFunction):
    """`gir.jit` of a Python function on the CPU (driver/pyjit.py), for one argument structure
    and dtypes and every leading dim: its signature has `?` leading dims, and each
    specialisation traces fn again at its shapes (`retrace`), so a Python value read from a
    shape (`xs.shape[0]`) is right in each, and the two representative lengths a length is
    found with are traces (driver/lengths.py)."""

    def __init__(self, retrace: Callable[[Shapes], Module], traced: Module, entry: str, pipeline: str,
                 weak: Sequence[bool]):
        f = traced.functions[entry]
        # the hidden arguments after the user's (large closed-over arrays) keep their exact types
        kept = list(weak) + [True] * (len(f.arg_types) - len(weak))
        types = [t if w or not t.rank else TensorType((None, *t.shape[1:]), t.dtype)
                 for t, w in zip(f.arg_types, kept)]
        signature = Function(f.name, types, f.result_types, [a.name_hint for a in f.args], f.loc)
        self._retrace = retrace
        self._checked: dict[tuple, bool] = {}
        """(shapes without the length, length) -> whether the code for every length serves it."""
        self._references: dict[tuple, tuple[Module | None, Any]] = {}
        """shapes without the length -> fn traced at the first representative and its extents."""
        key = compile_cache.module_key(traced, entry, "cpu", pipeline)
        super().__init__(None, entry, "cpu", pipeline, cache_key=key, signature=signature, names=result_names(f))
        self._source = traced

    def _specialised_module(self, shapes: Shapes) -> Module:
        return self._retrace(shapes)

    def _evicted(self, key: tuple, compiled: Executable) -> None:
        """As JitFunction's, and the reference trace and checks of evicted code for every length."""
        generic = self._generic_keys_of(compiled)
        super()._evicted(key, compiled)
        for k in generic:
            self._references.pop(k, None)
        if generic:
            self._checked = {k: v for k, v in self._checked.items() if k[0] not in generic}

    def _module_for(self, shapes: Shapes) -> Module:
        return self._retrace(shapes)

    def _serves(self, compiled: Any, shapes: Shapes, group: LengthGroup) -> bool:
        """As JitFunction's, and fn traces at this length to the program traced at the first
        representative, with every dim where the two representatives put it (analysis/lengths.py
        `conforms`: a Python `if` on `xs.shape[0]`, a size T*T): checked once per length."""
        t = compiled.length_of(shapes)
        if t is None:
            return False
        key = (group.generic(shapes), t)
        if key not in self._checked:
            if len(self._checked) >= SERVED_LIMIT:
                self._checked = {}
            self._checked[key] = self._conforms(shapes, group, t)
        return self._checked[key]

    def _conforms(self, shapes: Shapes, group: LengthGroup, t: int) -> bool:
        ta, tb = REPRESENTATIVES
        reference = self._references.get(group.generic(shapes))
        if reference is None:
            a: Module | None = None
            try:
                a = self._retrace(group.at(shapes, ta))
                extents = module_extents(a, self._retrace(group.at(shapes, tb)), ta, tb)
            except Exception:  # noqa: BLE001 - fn traced at a length it was not called with may raise anything
                extents = None
            reference = self._references[group.generic(shapes)] = (a, extents)
        a, extents = reference
        if a is None or extents is None:
            return False
        try:
            return conforms(a, extents, self._retrace(shapes), ta, t) is None
        except GirError:
            return False


@overload
def jit(source_or_module: Module | str | os.PathLike[str], entry: str | None = None, device: str = "cpu",
        pipeline: str | None = None, mode: str | None = None, memory_budget: int | str | None = None,
        static_argnums: int | Sequence[int] | None = None, static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, **jax_options: Any) -> JitFunction: ...
@overload
def jit(source_or_module: Callable[..., Any], entry: str | None = None, device: str = "cpu",
        pipeline: str | None = None, mode: str | None = None, memory_budget: int | str | None = None,
        static_argnums: int | Sequence[int] | None = None, static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, **jax_options: Any) -> PythonJit | StaticJit: ...
def jit(source_or_module: Any, entry: str | None = None, device: str = "cpu",
        pipeline: str | None = None, mode: str | None = None, memory_budget: int | str | None = None,
        static_argnums: int | Sequence[int] | None = None, static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, **jax_options: Any) -> JitFunction | PythonJit | StaticJit:
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
        static_argnums, static_argnames: (a Python function only) parameters passed to it as
            the Python values they are, not traced, as jax.jit's: each distinct tuple of their
            values (hashable; compared by type and equality) is its own specialisation.
        donate_argnums: (a Python function only) positional parameters whose arrays the caller
            gives up, as jax.jit's: with device="gpu", a result of the same shape and dtype as a
            donated array leaf is written into the function's buffer for that argument and
            handed out as that buffer, so that a training loop passing its parameters and
            optimizer state back in copies nothing in or out (docs/gpu.md *Training on the
            device*); the donated arrays must not be used after the call. Ignored on other
            devices (no copy to save), as JAX ignores it where donation is not implemented.

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
    pipeline runs on static shapes. A static signature is compiled here, at once. At most
    GIR_MAX_SPECIALISATIONS (64) are kept, the least recently used evicted (and compiled or
    loaded again if called again): `fn.specialisations_kept`, `fn.specialisations_evicted`.

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
    if jax_options:  # jax.jit's keep_unused, ...: say so, not a bare TypeError
        raise GirArgumentError("gir.jit has no option " + ", ".join(sorted(jax_options)) + " (it takes entry, device, "
                               "pipeline, mode, memory_budget, static_argnums, static_argnames, donate_argnums)")
    backend_named(device)  # an unknown device: a GirArgumentError naming the known ones (Python functions too)
    if pipeline is not None and mode is not None:
        raise GirArgumentError("gir.jit takes a mode or a pipeline, not both")
    budget = parse_bytes(memory_budget)
    if budget is not None:
        if pipeline is None:
            pipeline = get_mode(mode or DEFAULT_MODE).pipeline(usable_device(device) if device in DEVICES else "cpu")
        pipeline, mode = with_memory_budget(pipeline, budget), None
    if callable(source_or_module) and not isinstance(source_or_module, (str, Module)):
        from .pyjit import jit_python

        return jit_python(source_or_module, jit, entry, device=device, pipeline=pipeline, mode=mode,
                          traced_jit=TracedJit, static_argnums=static_argnums, static_argnames=static_argnames,
                          donate_argnums=donate_argnums)
    if donate_argnums is not None:
        raise GirArgumentError("donate_argnums is for a Python function (its pytrees of parameters and state)")
    if static_argnums is not None or static_argnames is not None:
        raise GirArgumentError("static_argnums and static_argnames are for a Python function; a gir program's "
                               "arguments are all tensors")
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
    if not module.functions:
        raise GirArgumentError(f"{module.filename} defines no function", Location(module.filename, 1, 1))
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


def _gpu_device_arrays() -> tuple[Any, Any]:
    """backend/gpu/device's device_view and is_device_array (imported when a gpu function is
    called: the GPU backend stays unimported for CPU users)."""
    from ..backend.gpu.device import device_view, is_device_array

    return device_view, is_device_array
