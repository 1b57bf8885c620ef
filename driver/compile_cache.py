"""The compile cache of `gir.jit` and `gir run`: keys known before any work, so a hit skips
parsing, the passes and LLVM (support/cache.py stores the entries).

Two kinds of entry, both under `compiled/`:

- `<source key>.sig`: the signature of the entry function of a source (its text and file
  name, the entry asked for, the device, the pipeline, the target and gir's code). With it a
  `JitFunction` checks arguments and, for a static signature, looks its code up at once.
- `<source key + argument shapes>.entry`: one specialisation: the object code, its layout,
  the LLVM IR before and after LLVM's passes, the gir IR after the passes (`fn.ir`) and the
  specialised signature.

What runs is stored at once (issue 28, "store what ran"): a first compile stores its quick code
(tiers.py) beside its first call (on a thread of its own that exit waits for), and its -O3 code
replaces the entry when the background compile ends; a later process loads whatever entry
exists, the best one made so far. A hit on quick code, or on code whose GEMM paths came from
blas' model and are measured now, runs that code at once and makes the better code in the
background (`better_code_later`): it swaps in between calls and replaces the entry. A lookup
never waits for better code, never recompiles in its own path, and asks nothing that loads MKL:
whether the model's decisions are measured now is asked on the background thread after the
first call (`better_code_if_measured`). Each entry records its state (`Code.state`; `gir cache
info` lists it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import code_key, current
from ..errors import Location
from ..ir.core import Function, Module
from ..ir.types import parse_type
from ..support import cache as disk
from ..support import timing
from .backends import backend_named
from .results import result_names

if TYPE_CHECKING:
    from ..backend.cpu.runtime import Code, CPUFunction
    from .compile import Executable

CACHED_DEVICES = ("cpu",)


def source_key(source: str, filename: str, entry: str | None, device: str, pipeline: str) -> str | None:
    """The key of a source's compilation (None when the cache is off or the device has none)."""
    if device not in CACHED_DEVICES or not disk.enabled():
        return None
    with timing.phase("cache: key"):  # the target's key: its machine and the options that change its code
        return disk.digest("gir-source", source, filename, entry, device, pipeline, _environment(),
                           backend_named(device).target_key(), disk.build_fingerprint())


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
        disk.store("compiled", key, {"signature": signature_json(f), "about": {"entry": f.name}}, suffix=".sig")


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
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# Compiled specialisations


_store_lock = threading.Lock()
"""One store at a time in this process: the quick code's store (on its own thread) and the final
code's (on the tiers thread) each compare ranks and then write; without the lock a quick store
could check, then write over the final code stored in between."""


def store_compiled(key: str, compiled: CPUFunction, root: str | None = None, code: Code | None = None) -> None:
    """Stores a CPUFunction (with its `ir` text) under a specialisation key (in the cache folder
    root; default: the current one): code, default the code its calls run now."""
    code = compiled.code if code is None else code
    meta, obj = code.to_entry(shared=True)  # a hit in a new process loads it without LLVM
    f = compiled.function
    meta["signature"] = signature_json(f)
    meta["ir"] = compiled.ir
    meta["about"] = {"entry": f.name, "shapes": _shapes_about(f, code.layout)}
    with _store_lock:
        if _rank(code.state()) < _rank(_stored_state(key, root)):
            return  # better code was stored meanwhile (here or by another process): never replace it by worse
        with timing.phase("cache: store"):
            disk.store("compiled", key, meta, obj, root=root)


def _shapes_about(f: Function, layout: Any) -> list[list[Any]]:
    """f's argument shapes for `gir cache info`; a dim read at run time (code for every
    length, docs/backend.md) as its extent, `T` or `2*T+1`."""
    shapes: list[list[Any]] = [list(t.shape) for t in f.arg_types]
    lengths = layout.lengths  # backend/cpu/layout.py's Layout: the cache holds CPU code only
    for i, axis, a, b in lengths.arguments if lengths is not None else ():
        shapes[i][axis] = ("T" if a == 1 else f"{a}*T") + (f"{b:+d}" if b else "")
    return shapes


def _stored_state(key: str, root: str | None) -> dict[str, Any] | None:
    """The state (`Code.state`) of the usable entry stored under key now, None without one (a
    damaged entry is replaced whatever it says of itself)."""
    found = disk.load("compiled", key, root=root)
    state = found[0].get("state") if found is not None else None
    return state if isinstance(state, dict) else None


def _rank(state: dict[str, Any] | None) -> int:
    """How good code in a state is: final beats quick, measured GEMM paths beat the model's."""
    if state is None:
        return -1
    return 2 * (state.get("tier") != "quick") + bool(state.get("measured", True))


def store_what_runs(key: str, executable: Executable, root: str | None = None) -> None:
    """Stores the code compiled's calls run now (quick code is correct code: the next process
    loads it whatever happens to this one's background compile), and its final code when
    that replaces it (`store_when_final`). Only CPU code has a key (CACHED_DEVICES)."""
    from ..backend.cpu.runtime import CPUFunction

    assert isinstance(executable, CPUFunction), "only CPU code is cached"
    code = executable.code  # read once: the swap may come between two reads
    root = disk.cache_root() if root is None else root
    store_compiled(key, executable, root, code=code)
    if code.final is not None:
        store_when_final(key, executable, root)


def store_what_runs_soon(key: str, executable: Executable) -> threading.Thread | None:
    """store_what_runs: quick code (tiered: its -O3 code pending) on a thread of its own, beside
    the first call, since linking the entry's shared library (`cc -shared`, 60-90 ms) was most
    of the time a tiered first compile added before its first result; final code (a compile
    that took the -O3 time already) at once. The thread is not a daemon: interpreter exit joins
    it, so the code that ran is stored before the process ends (a process killed first stores
    nothing, as before)."""
    from ..backend.cpu.runtime import CPUFunction

    if not isinstance(executable, CPUFunction) or executable.code.final is None:
        store_what_runs(key, executable)
        return None
    # the folder of the lookup, read now: GIR_CACHE_DIR may change before the thread runs
    t = threading.Thread(target=store_what_runs, args=(key, executable, disk.cache_root()), name="gir-store",
                         daemon=False)
    with _store_lock:
        for k in [k for k, s in _stores.items() if not s.is_alive()]:
            del _stores[k]
        _stores[key] = t
    t.start()
    return t


_stores: dict[str, threading.Thread] = {}
"""The store threads started, by key (the finished ones dropped at the next start)."""


def wait_for_stores(timeout: float | None = None, key: str | None = None) -> bool:
    """Waits until every store started so far (or key's) has written its entry (True), or
    timeout seconds. A lookup in this process waits for its key's: it finds the entry being
    written instead of compiling it again."""
    with _store_lock:
        pending = [t for k, t in _stores.items() if key is None or k == key]
    for t in pending:
        t.join(timeout)
    return not any(t.is_alive() for t in pending)


def store_when_final(key: str, compiled: CPUFunction, root: str | None = None) -> None:
    """Stores compiled under key once it runs its final code (tiered compilation: after the
    background -O3 compile, on that thread; at once otherwise): in the cache folder of the
    lookup (root; default: the current one), even if GIR_CACHE_DIR changed meanwhile."""
    root = disk.cache_root() if root is None else root
    final = compiled.code.final  # read once: the swap may come between two reads
    if final is None:
        store_compiled(key, compiled, root)
        return
    from ..backend.cpu import tiers

    tiers.add_key(final, key)
    compiled.when_final(lambda: store_compiled(key, compiled, root))


def better_code_later(key: str, compiled: CPUFunction, make: Callable[[], Code]) -> None:
    """What a hit does about code that may not be the best this process can make (nothing
    here is asked of MKL or the GEMM times files, nothing waits): quick code gets its -O3 code
    at once (`better_code_for`); final code with some decision from the model (`Code.from_model`)
    asks whether that is measured now after its first call (`better_code_if_measured`)."""
    code = compiled.code
    if code.info.tier == "quick":
        better_code_for(key, compiled, make)
    elif code.from_model():
        better_code_if_measured(key, compiled, make)


def better_code_for(key: str, compiled: CPUFunction, make: Callable[[], Code]) -> None:
    """compiled (loaded from the cache) runs now; its better code is made in the background by
    make() -> Code, swapped in between calls and stored under key. A job of this process that
    will store key already is followed rather than started again."""
    from ..backend.cpu import tiers

    job = tiers.pending(key)
    if job is not None:
        compiled.follow(job)
        return
    what = "-O3 code" if compiled.code.info.tier == "quick" else "code with the measured GEMM paths"
    job = tiers.FinalCompile(make, key, what=what)
    root = disk.cache_root()
    compiled.follow(job)
    compiled.when_final(lambda: store_compiled(key, compiled, root))


def better_code_if_measured(key: str, compiled: CPUFunction, make: Callable[[], Code]) -> None:
    """For final code whose GEMM paths or two-core schedule came from the model: whether they
    are measured now (`Code.stale`) loads and starts MKL (`machine_key` asks its version,
    `threads` its thread count) and reads the times files, so it is asked on the background
    thread, queued once the first call has returned (a hit's first result never waits for it,
    and code calling no MKL path has not loaded MKL by then). Measured: that
    job makes the better code, swapped in and stored as `better_code_for` does; not yet: it ends
    without code and the entry stays (a later process asks again). The job is made now, under
    this lookup's options and cache folder."""
    from ..backend.cpu import tiers

    loaded = compiled.code

    def if_measured() -> Code | None:
        return make() if loaded.stale() else None

    job = tiers.FinalCompile(if_measured, key, what="code with the measured GEMM paths")
    root = disk.cache_root()

    def queue() -> None:
        pending = tiers.pending(key)  # another function of this process asked first: follow it
        compiled.follow(pending if pending is not None else job)
        compiled.when_final(lambda: store_compiled(key, compiled, root))

    compiled.after_first_call(queue)


def load_compiled(key: str) -> CPUFunction | None:
    """The CPUFunction stored under key, loaded (no parsing, passes or LLVM), or None."""
    wait_for_stores(key=key)
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
    except (KeyError, TypeError, ValueError, AttributeError):  # another format: a miss
        return None
    compiled = CPUFunction(signature, code=code)  # stale or quick: better code comes later (jit.py)
    compiled.ir = ir_text
    return compiled
