"""The compile cache of `gir.jit` and `gir run`: keys known before any work, so a hit skips
parsing, the passes and LLVM (support/cache.py stores the entries).

Two kinds of entry, both under `compiled/`:

- `<source key>.sig`: the signature of the entry function of a source (its text and file
  name, the entry asked for, the device, the pipeline, the target and gir's code). With it a
  `JitFunction` checks arguments and, for a static signature, looks its code up at once.
- `<source key + argument shapes>.entry`: one specialisation: the object code, its layout,
  the LLVM IR before and after LLVM's passes, the gir IR after the passes (`fn.ir`) and the
  specialised signature.

A hit whose GEMM paths came from blas' model, once every such shape has been measured, counts
as a miss: the function is compiled again with the measured paths (and replaces the entry).
"""

from __future__ import annotations

from typing import Any

from ..config import code_key, current
from ..errors import Location
from ..ir.core import Function, Module
from ..ir.types import parse_type
from ..support import cache as disk
from ..support import timing
from .results import result_names

CACHED_DEVICES = ("cpu",)


def source_key(source: str, filename: str, entry: str | None, device: str, pipeline: str) -> str | None:
    """The key of a source's compilation (None when the cache is off or the device has none)."""
    if device not in CACHED_DEVICES or not disk.enabled():
        return None
    from ..backend.cpu.runtime import target_key

    with timing.phase("cache: key"):
        return disk.digest("gir-source", source, filename, entry, device, pipeline, _environment(), target_key(),
                           disk.build_fingerprint())


def module_key(module: Module, entry: str, device: str, pipeline: str) -> str | None:
    """The key of a Module built in Python: its printed form (locations included) stands for a text."""
    if device not in CACHED_DEVICES or not disk.enabled():
        return None
    from ..ir.printer import print_module

    with timing.phase("cache: print module for its key"):
        text = print_module(module, print_locations=True)
    return source_key(text, module.filename or "", entry, device, pipeline)


def _environment() -> tuple:
    """The options that change generated code (config.code_key; target_key holds them too, and
    the GPU, which has no target_key, needs them here)."""
    return code_key(current())


def specialisation_key(key: str, shapes: tuple) -> str:
    return disk.digest(key, shapes)


# ---------------------------------------------------------------------------------------------
# Signatures: body-less Functions


def signature_json(f: Function) -> dict[str, Any]:
    return {"name": f.name, "args": [[a.name_hint, str(a.tensor_type)] for a in f.args],
            "results": [str(t) for t in f.result_types], "loc": [f.loc.file, f.loc.line, f.loc.col],
            "result_names": list(result_names(f))}


def signature_from_json(data: dict[str, Any]) -> Function:
    """A Function with the signature and location of the one compiled, and an empty body: what
    checking arguments and making outputs need."""
    return Function(data["name"], [parse_type(t) for _, t in data["args"]], [parse_type(t) for t in data["results"]],
                    [n for n, _ in data["args"]], Location(*data["loc"]))


def store_signature(key: str, f: Function) -> None:
    with timing.phase("cache: store"):
        disk.store("compiled", key, {"signature": signature_json(f)}, suffix=".sig")


def load_signature(key: str) -> tuple[Function, tuple[str, ...]] | None:
    """The entry's signature and its results' names (driver/results.py: they come from the body, which
    a signature does not keep)."""
    with timing.phase("cache: lookup"):
        found = disk.load("compiled", key, suffix=".sig")
    if found is None:
        return None
    try:
        data = found[0]["signature"]
        return signature_from_json(data), tuple(str(n) for n in data["result_names"])
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Compiled specialisations


def store_compiled(key: str, compiled: Any, root: str | None = None) -> None:
    """Stores a CPUFunction (with its `ir` text) under a specialisation key (in the cache folder
    root; default: the current one)."""
    meta, obj = compiled.code.to_entry(shared=True)  # a hit in a new process loads it without LLVM
    meta["signature"] = signature_json(compiled.function)
    meta["ir"] = compiled.ir
    with timing.phase("cache: store"):
        disk.store("compiled", key, meta, obj, root=root)


def store_when_final(key: str, compiled: Any) -> None:
    """Stores compiled under key once it runs its final code (tiered compilation: after the
    background -O3 compile, on that thread; at once otherwise), so the cache holds -O3 code:
    in the cache folder of the lookup that missed, even if GIR_CACHE_DIR changed meanwhile."""
    when_final = getattr(compiled, "when_final", None)
    final = compiled.code.final if when_final is not None else None  # read once: the swap may come between two reads
    if final is None:
        store_compiled(key, compiled)
        return
    from ..backend.cpu import tiers

    tiers.add_key(final, key)
    root = disk.cache_root()
    when_final(lambda: store_compiled(key, compiled, root))


def wait_for_background_store(key: str) -> None:
    """A lookup of key that a background compile of this process will store waits for it."""
    from ..backend.cpu import tiers

    tiers.wait_for_key(key)


def load_compiled(key: str) -> Any | None:
    """The CPUFunction stored under key, loaded (no parsing, passes or LLVM), or None."""
    from ..backend.cpu.runtime import Code, CPUFunction

    with timing.phase("cache: lookup"):
        found = disk.load("compiled", key)
    if found is None:
        return None
    meta, obj = found
    try:
        code = Code.from_entry(meta, obj, "compiled")
        signature = signature_from_json(meta["signature"])
        ir_text = meta["ir"]
    except (KeyError, TypeError, ValueError):
        return None
    if code.stale():
        return None  # compiled with the model's GEMM paths; they are measured now
    compiled = CPUFunction(signature, code=code)
    compiled.ir = ir_text
    return compiled
