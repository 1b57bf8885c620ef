"""`gir.jit`: the default pipeline, specialisation on argument shapes, and a compiled callable.

    fn = gir.jit(module_or_source, "rnn_grads")        # device="cpu"
    loss, dwx, dwh, db = fn(xs, h0, wx, wh, b)
    fn.stats, fn.ir, fn.llvm_ir, fn.asm

Arguments are checked (count, dtype, shape, contiguity) before any native code runs. A
signature with `?` dims is specialised per distinct argument shape; every specialisation is
compiled once and kept in memory.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from . import compile_cache, timing
from .errors import GirArgumentError, Location
from .frontend.parser import parse, read_source
from .ir.core import Function, Module
from .ir.interpreter import check_arguments
from .ir.printer import print_module
from .ir.specialize import specialize
from .ir.verifier import verify
from .passes.memory.plan import MemoryPlan
from .passes.pass_manager import PassManager
from .passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE

DEVICES = ("cpu", "gpu", "interp")


class JitFunction:
    def __init__(self, module: Module | None, entry: str, device: str, pipeline: str, *,
                 cache_key: str | None = None, signature: Function | None = None,
                 text: tuple[str, str] | None = None):
        """module, or (on a compile-cache hit) the signature and the (text, file name) to parse
        should a specialisation miss; cache_key: compile_cache's key of the source."""
        self._source = module
        self._text = text
        self._cache_key = cache_key
        self.entry = entry
        self.device = device
        self.pipeline = pipeline
        self.signature = module.functions[entry] if module is not None else signature
        self._compiled: dict[tuple, Any] = {}
        self._compiling = threading.Lock()
        """Held while a specialisation compiles: threads that call with a new shape at once
        compile it once (the compiled function itself is safe to call from several threads)."""
        self._last: Any = None
        self._thread = threading.local()
        """`last`: the specialisation this thread called last, which the inspection properties show."""
        if all(t.is_static for t in self.signature.arg_types):
            self._last = self._specialise(tuple(tuple(t.shape) for t in self.signature.arg_types))

    def _specialise(self, shapes: tuple) -> Any:
        found = self._compiled.get(shapes)
        if found is not None:
            return found
        with self._compiling:
            found = self._compiled.get(shapes)
            if found is None:
                found = self._compiled[shapes] = self._compile(shapes)
        return found

    @property
    def source(self) -> Module:
        """The module as given; never changed: every specialisation clones it (locations
        included). After a compile-cache hit it is parsed when first needed."""
        if self._source is None:
            assert self._text is not None
            self._source = parse(*self._text)
        return self._source

    def _compile(self, shapes: tuple) -> Any:
        key = compile_cache.specialisation_key(self._cache_key, shapes) if self._cache_key else None
        if key is not None:
            found = compile_cache.load_compiled(key)
            if found is not None:
                return found
        compiled = self._compile_now(shapes)
        if key is not None:
            compile_cache.store_compiled(key, compiled)
        return compiled

    def _compile_now(self, shapes: tuple) -> Any:
        f = self.source.functions[self.entry]
        if shapes != tuple(tuple(t.shape) for t in f.arg_types):
            types = [t.with_shape(tuple(shape)) for t, shape in zip(f.arg_types, shapes)]
            module = specialize(self.source, self.entry, types)
        else:
            module = self.source.clone()
        with timing.phase("passes"):
            analyses = PassManager(self.pipeline).run(module).analyses
        f = module.functions[self.entry]
        plan = analyses.get(MemoryPlan, f)  # the pipeline's plan, with its pass options
        if self.device == "interp":
            compiled: Any = _Interpreted(module, self.entry)
        elif self.device == "gpu":
            from .backend.gpu.runtime import GPUFunction

            compiled = GPUFunction.compile(f, plan)
            compiled.ir = print_module(module)
        else:
            from .backend.cpu.runtime import CPUFunction

            compiled = CPUFunction.compile(f, plan)
            with timing.phase("print IR (fn.ir)"):
                compiled.ir = print_module(module)
        return compiled

    def __call__(self, *args: Any) -> list[np.ndarray]:
        arrays = check_arguments(self.signature, args)
        compiled = self._specialise(tuple(a.shape for a in arrays))
        self._last = self._thread.last = compiled
        return compiled(*arrays)

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
        return self._current().stats

    @property
    def ir(self) -> str:
        return self._current().ir

    @property
    def llvm_ir(self) -> str:
        return self._current().llvm_ir

    @property
    def asm(self) -> str:
        return self._current().asm


class _Interpreted:
    def __init__(self, module: Module, entry: str):
        from .ir.interpreter import Interpreter

        self.interp = Interpreter(module)
        self.entry = entry
        self.ir = print_module(module)
        self.stats = None
        self.llvm_ir = self.asm = ""

    def __call__(self, *args: Any) -> list[np.ndarray]:
        return self.interp.call(self.entry, args)


def jit(source_or_module: Module | str, entry: str | None = None, device: str = "cpu",
        pipeline: str | None = None) -> JitFunction:
    """Compiles @entry of a module (or of gir source text, or of a .gir file path). Compiled code
    is cached on disk (compile_cache.py): a source compiled before is not parsed again."""
    if device not in DEVICES:
        raise GirArgumentError(f"unknown device {device!r}; devices: " + ", ".join(DEVICES))
    full = pipeline if pipeline is not None else f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}"
    if isinstance(source_or_module, Module):
        module = source_or_module.clone()
        verify(module)  # built or edited in Python: its errors are its own, not the first pass's
        entry = _entry(module, entry)
        return JitFunction(module, entry, device, full, cache_key=compile_cache.module_key(module, entry, device, full))
    if not isinstance(source_or_module, str):
        kind = type(source_or_module).__name__
        raise GirArgumentError(f"gir.jit takes a Module, gir source or a .gir path, not {kind}")
    if "\n" not in source_or_module and "{" not in source_or_module \
            and (source_or_module.endswith(".gir") or os.path.exists(source_or_module)):
        text, filename = read_source(source_or_module), source_or_module
    else:
        text, filename = source_or_module, "<jit>"
    key = compile_cache.source_key(text, filename, entry, device, full)
    signature = compile_cache.load_signature(key) if key else None
    if signature is not None:  # compiled before: parsed only if a specialisation misses
        return JitFunction(None, signature.name, device, full, cache_key=key, signature=signature,
                           text=(text, filename))
    with timing.phase("parse"):
        module = parse(text, filename=filename)
    entry = _entry(module, entry)
    if key:
        compile_cache.store_signature(key, module.functions[entry])
    return JitFunction(module, entry, device, full, cache_key=key)


def _entry(module: Module, entry: str | None) -> str:
    if entry is None:
        entry = list(module.functions)[-1]
    entry = entry.lstrip("@")
    if entry not in module.functions:
        raise GirArgumentError(f"no function @{entry} in {module.filename}; the module has "
                               + ", ".join("@" + n for n in module.functions), Location(module.filename, 1, 1))
    return entry
