"""gir's configuration: one typed object, read from the environment once per compile.

Every `GIR_*` switch is a field of `Options`. Nothing else in gir reads `os.environ` for a gir
switch (tests/test_architecture.py checks it); code asks `config.current()` and passes the
object down. A field's metadata says whether it changes generated code (`code=True`): the
compile and object caches key on `code_key(options)`, derived from those fields, so a new switch
that changes code cannot be forgotten by a key.

Overrides without the environment, for tests and for users:

    with gir.config.override(gemm_measure="off", cpu_split="0"):
        fn = gir.jit(text, "main")

This module is a leaf: standard library only, importable from every floor.

Parsing is forgiving and never raises: a value that does not parse takes the field's default
(`GIR_CACHE_MAX_MB=inf` or `1e400` is "no bound" rather than an `OverflowError`; see
`_parse_megabytes`). The documented meaning of each switch is in its field's docstring.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_OFF = ("0", "off", "no", "false")


def _flag(default: bool) -> Callable[[str | None], bool]:
    def parse(text: str | None) -> bool:
        if text is None or not text.strip():
            return default
        return text.strip().lower() not in _OFF
    return parse


def _choice(default: str, allowed: tuple[str, ...]) -> Callable[[str | None], str]:
    def parse(text: str | None) -> str:
        value = (text or "").strip().lower()
        return value if value in allowed else default
    return parse


def _text(default: str = "") -> Callable[[str | None], str]:
    return lambda text: text if text else default


def _seconds(default: float) -> Callable[[str | None], float]:
    def parse(text: str | None) -> float:
        try:
            value = float(text) if text and text.strip() else default
        except ValueError:
            return default
        if math.isnan(value) or value < 0:
            return default
        return min(value, 1e9)  # `inf`: as long as it takes, within reason
    return parse


def _opt_level(text: str | None) -> int | None:
    """None: the tiered default (quick code now, -O3 in the background); 0-3: one level."""
    if text is None or not text.strip():
        return None
    try:
        return min(3, max(0, int(text.strip())))
    except ValueError:
        return None


def _parse_megabytes(text: str | None) -> int | None:
    """GIR_CACHE_MAX_MB in bytes; None is no bound (`inf`, a value too large for memory,
    or a negative one). A value that does not parse keeps the default bound."""
    default = 512 * 1024 * 1024
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    if math.isnan(value):
        return default
    if value < 0 or not math.isfinite(value) or value > 2.0 ** 53:
        return None
    return int(value * 1024 * 1024)


def _count_or_none(default: int) -> Callable[[str | None], int | None]:
    """A positive count; `0`, `inf`, `none` or a negative number: no bound (None); a value that
    does not parse keeps the default."""
    def parse(text: str | None) -> int | None:
        value = (text or "").strip().lower()
        if not value:
            return default
        if value in ("inf", "none", "unbounded"):
            return None
        try:
            number = int(value)
        except ValueError:
            return default
        return number if number > 0 else None
    return parse


def _field(env: str, parse: Callable[[str | None], Any], default: Any, *, code: bool, doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"env": env, "parse": parse, "code": code, "doc": doc})


@dataclasses.dataclass(frozen=True)
class Options:
    """All of gir's switches. `code=True` fields change the generated code and key the caches."""

    cache: bool = _field("GIR_CACHE", _flag(True), True, code=False,
                         doc="look up and store compiled functions (0: off)")
    cache_dir: str = _field("GIR_CACHE_DIR", _text(""), "", code=False,
                            doc="the compile cache's folder (default ~/.cache/gir)")
    cache_max_bytes: int | None = _field("GIR_CACHE_MAX_MB", _parse_megabytes, 512 * 1024 * 1024, code=False,
                                         doc="bound of the cache in MB (inf: none)")
    parser: str = _field("GIR_PARSER", _choice("fast", ("fast", "lark")), "fast", code=False,
                         doc="`lark`: parse every text with Lark, not the fast parser")
    traceback: bool = _field("GIR_TRACEBACK", _flag(False), False, code=False,
                             doc="show gir's own frames and the cause of errors")
    promotion: str = _field("GIR_PROMOTION", _choice("standard", ("standard", "strict")), "standard", code=False,
                            doc="`strict`: tensors of different dtypes are an error in traced Python (no promotion)")
    progress: str = _field("GIR_PROGRESS", _choice("auto", ("0", "1")), "auto", code=False,
                           doc="progress lines: 1 always, 0 never, unset when stderr is a terminal")
    llvm_opt: int | None = _field("GIR_LLVM_OPT", _opt_level, None, code=True,
                                  doc="one LLVM level 0-3 for all code (unset: quick code, then -O3)")
    llvm_tier: bool = _field("GIR_LLVM_TIER", _flag(True), True, code=False,
                             doc="quick code first and -O3 in the background (0: -O3 at once)")
    llvm_exit_wait: float = _field("GIR_LLVM_EXIT_WAIT", _seconds(3.0), 3.0, code=False,
                                   doc="seconds exit spends finishing background jobs a cache stores")
    gemm_path: str = _field("GIR_GEMM_PATH", _text(""), "", code=True,
                            doc="force one GEMM path where it applies (e.g. openblas, gir-packed)")
    gemm_measure: str = _field("GIR_GEMM_MEASURE", _choice("background", ("background", "now", "off")),
                               "background", code=False,
                               doc="measure GEMM paths in the background, now, or never (the model)")
    packed_gemm: bool = _field("GIR_PACKED_GEMM", _flag(True), True, code=True,
                               doc="gir's own packed-weight GEMM as a candidate path")
    cpu_arena: bool = _field("GIR_CPU_ARENA", _flag(True), True, code=True,
                             doc="buffers from the memory plan's arena (0: one allocation each)")
    cpu_overlap: str = _field("GIR_CPU_OVERLAP", _choice("auto", ("auto", "0", "1", "whole")), "auto", code=True,
                              doc="second-thread overlap windows: auto, 1, 0 or whole")
    cpu_split: str = _field("GIR_CPU_SPLIT", _choice("auto", ("auto", "0", "1")), "auto", code=True,
                            doc="split loops across two threads: auto, 1 or 0")
    lengths: bool = _field("GIR_LENGTHS", _flag(True), True, code=True,
                           doc="one compile for every sequence length: a `?` dim that only sets loop trip "
                               "counts is read at run time (0: specialised per length)")
    max_specialisations: int | None = _field(
        "GIR_MAX_SPECIALISATIONS", _count_or_none(64), 64, code=False,
        doc="specialisations a gir.jit function keeps in memory, least recently used evicted (0 or inf: all)")
    cpu_adapt_threads: bool = _field("GIR_CPU_ADAPT", _flag(True), True, code=False,
                                     doc="calls go to one BLAS thread while the second core is busy (0: never)")
    cpu_shared: bool = _field("GIR_CPU_SHARED", _flag(True), True, code=False,
                              doc="load compiled code as a shared object (0: in-memory only)")
    openblas: str = _field("GIR_OPENBLAS", _choice("numpy", ("numpy", "scipy")), "numpy", code=True,
                           doc="which OpenBLAS: NumPy's (default) or SciPy's")
    no_mkl: bool = _field("GIR_NO_MKL", _flag(False), False, code=True,
                          doc="never load MKL")
    gpu_arena: bool = _field("GIR_GPU_ARENA", _flag(True), True, code=True,
                             doc="GPU buffers from one arena (0: one allocation each)")
    gpu_graphs: bool = _field("GIR_GPU_GRAPHS", _flag(True), True, code=True,
                              doc="GPU functions captured once as a CUDA graph and replayed per call (0: eager)")
    gpu_persistent: str = _field("GIR_GPU_PERSISTENT", _choice("off", ("off", "on", "measure")), "off", code=True,
                                 doc="a scan as one persistent GPU kernel where eligible: off, on, or measure "
                                     "(time both at the first call, keep the faster)")


FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(Options)
"""Every switch, in declaration order (`gir --help-env` and docs list them from here)."""

CODE_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.metadata["code"])
"""The fields that change generated code: the caches key on exactly these."""

_override: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("gir_options", default=None)


_ENV_NAMES: tuple[str, ...] = tuple(f.metadata["env"] for f in FIELDS)

_last: tuple[tuple[str | None, ...], Options] | None = None
"""The raw values last parsed and their Options (frozen: shared): `current()` is asked ~20 times
by a compile-cache hit, and parsing every field each time was most of its cost."""


def from_environ(environ: Mapping[str, str] | None = None) -> Options:
    """Options as the environment sets them; no value makes this raise. The parsers are pure:
    the same raw values give the same Options, parsed once."""
    global _last
    env = os.environ if environ is None else environ
    raw = tuple(env.get(name) for name in _ENV_NAMES)
    last = _last
    if last is not None and last[0] == raw:
        return last[1]
    options = Options(**{f.name: f.metadata["parse"](value) for f, value in zip(FIELDS, raw)})
    _last = (raw, options)
    return options


def current() -> Options:
    """The options in force: the environment's, with the active `override` applied."""
    options = from_environ()
    changes = _override.get()
    return dataclasses.replace(options, **changes) if changes else options


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Options]:
    """Set some options for the code inside the block (this thread or task only)."""
    unknown = sorted(set(changes) - {f.name for f in FIELDS})
    if unknown:
        raise TypeError(f"unknown gir option(s): {', '.join(unknown)}; known: {', '.join(f.name for f in FIELDS)}")
    merged = {**(_override.get() or {}), **changes}
    token = _override.set(merged)
    try:
        yield current()
    finally:
        _override.reset(token)


def code_key(options: Options) -> tuple[tuple[str, Any], ...]:
    """The part of a cache key that options contribute: every code-changing field, by name."""
    return tuple((name, getattr(options, name)) for name in CODE_FIELDS)


def describe() -> str:
    """One line per switch: variable, field, whether it changes code, meaning."""
    lines = []
    for f in FIELDS:
        mark = "code" if f.metadata["code"] else "    "
        lines.append(f"{f.metadata['env']:<20} {f.name:<16} {mark}  {f.metadata['doc']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Other programs' variables that gir reads (not gir switches: no Options fields, no overrides)

BLAS_THREAD_VARIABLES = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_DYNAMIC")
"""What decides how many threads MKL and OpenBLAS start with (blas.thread_setting keys on them)."""


def blas_thread_environment() -> tuple[str, ...]:
    """The BLAS thread variables' values ('' when unset), in BLAS_THREAD_VARIABLES order."""
    return tuple(os.environ.get(name, "") for name in BLAS_THREAD_VARIABLES)


def cuda_simulator_requested() -> bool:
    """NUMBA_ENABLE_CUDASIM=1: the user asked for Numba's CUDA simulator (only effective when
    set before numba is imported; the GPU backend says so when it is set too late)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
