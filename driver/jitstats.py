"""What a `gir.jit` compile did, for `fn.stats.compile` and `gir run -v`.

    CompileStats(entry="rnn_grads", device="cpu", shapes=((50, 32, 256), ...),
                 stages={"specialize": 0.0, "passes": 0.41, "codegen": 0.12, "llvm-optimize": 1.9,
                         "emit-object": 0.8, "load": 0.02},
                 passes={"ssa": 0.01, ...}, cache="miss", threads=2,
                 gemms=[GemmChoice("examples/rnn.gir:9:18", "mkl-packed", "f32", 32, 256, 256, ...), ...])

Stages: `specialize` (retyping `?` dims, ir/specialize.py), `passes` (the default and backend
pipelines; `passes` has the time of each), then the backend's: on the CPU `codegen` (IR ->
LLVM IR), `llvm-optimize` (-O3), `emit-object` (machine code) — or `cache-load` when the
object came from the disk cache — and `load` (linking it into this process); on the GPU
`codegen`. `cache` is "hit" or "miss" for the CPU's disk cache of object code, "none" where
there is no such cache (interp, gpu).

A compile that takes longer than `PROGRESS_AFTER` seconds says so on stderr (one line when it
has taken that long, one when it ends), so a cold LSTM compile is not seconds of silence: when
stderr is a terminal, or always with `GIR_PROGRESS=1` (never with `GIR_PROGRESS=0`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from ..config import current

if TYPE_CHECKING:
    from .compile import CodeInfo, Executable

PROGRESS_AFTER = 1.0
"""Seconds a compile may take before it prints a progress line."""


@dataclass(frozen=True)
class GemmChoice:
    """One matrix product of the compiled code and the BLAS path chosen for it."""

    where: str
    """The product's source location (file:line:col)."""
    path: str
    """One of backend/cpu/blas.py's PATHS: 'mkl', 'mkl-packed', 'openblas' or 'openblas-copy'
    (measured and chosen there)."""
    dtype: str
    m: int
    n: int
    k: int
    transposed: str
    """Which operands the GEMM reads transposed: '', 'a', 'b' or 'ab'."""


class GemmLike(Protocol):
    """One GEMM of a backend's code and the path chosen for it (the CPU's layout.GemmSite)."""

    @property
    def key(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def m(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def ta(self) -> bool: ...
    @property
    def tb(self) -> bool: ...


@dataclass
class CompileStats:
    entry: str
    device: str
    shapes: tuple[tuple[int | None, ...], ...]
    """The argument shapes compiled for (None: a `?` dim the interpreter runs as it is)."""
    seconds: float = 0.0
    """The whole compile, wall clock."""
    stages: dict[str, float] = field(default_factory=dict)
    passes: dict[str, float] = field(default_factory=dict)
    cache: str = "none"
    """'hit': the compile cache had the specialisation (nothing but loading ran); 'hit (object
    code)': the passes ran, LLVM did not; 'miss'; 'none' where there is no cache (interp, gpu)."""
    opt_level: int | None = None
    """LLVM's optimisation level (CPU; GIR_LLVM_OPT, default 3: chosen by measurement) of the
    code that ran (`fn.stats`; of the code compiled first in `gir run -v`)."""
    tier: str | None = None
    """Tiered compilation (CPU, backend/cpu/tiers.py): 'quick' cheap code ran while -O3
    compiles in the background; 'final' the -O3 code that replaced it ran; '' compiled once
    (tiering off, an explicit GIR_LLVM_OPT, a cache hit: -O3)."""
    gemm_measured: bool | None = None
    """False when a GEMM path came from the model, not yet measured here (a later compile refines it)."""
    lengths: str = ""
    """Which `?` dims are read at run time (driver/lengths.py): 'every length: %xs dim 0 = T; ...'
    when the code serves every sequence length, 'specialised: <why not>' when a signature's `?`
    leading dims were tried and are not a length, '' otherwise (no `?` leading dim, not the CPU)."""
    preparing: str = ""
    """Better code being made in the background, to replace the code that runs ('' none): '-O3
    code' (quick code, compiled here or loaded from the cache) or 'code with the measured GEMM
    paths'. Read live by `fn.stats`: '' once it has replaced it."""
    threads: int | None = None
    """The BLAS threads the code runs GEMMs with (CPU)."""
    gemms: list[GemmChoice] = field(default_factory=list)
    planned_peak: int | None = None
    """The memory plan's peak arena bytes of the entry after the pipeline (None on a compile-cache
    hit, where no pass ran, or when the plan is not supported)."""
    arena_bytes: int | None = None
    """The workspace the compiled code allocates per thread (CPU: arena + pinned area)."""
    checkpoints: list[str] = field(default_factory=list)
    """The `checkpoint` pass's decisions (a memory budget), one line each."""

    def for_code(self, info: CodeInfo | None, gemms: Sequence[GemmLike] = ()) -> CompileStats:
        """These stats with the tier and LLVM level of the code that runs (`Executable.code_info`)
        and its GEMM paths: the final code of a tiered compile is lowered again where the quick
        code left gir-packed out (backend/cpu/llvm_jit.compile_code)."""
        if info is None or (info.tier == self.tier and info.opt_level == self.opt_level):
            return self
        return replace(self, tier=info.tier, opt_level=info.opt_level, gemm_measured=info.gemm_measured,
                       gemms=gemm_choices(gemms))

    def describe(self) -> str:
        """Several lines for `gir run -v` (stderr)."""
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        lines = [f"compiled @{self.entry} for {self.device} ({shapes}) in {self.seconds:.3f} s; "
                 f"code cache: {self.cache}" + (f"; BLAS threads: {self.threads}" if self.threads else "")
                 + (f"; LLVM -O{self.opt_level}" if self.opt_level is not None else "")
                 + ("; quick code" if self.tier == "quick" else "")
                 + ("; GEMM paths from the model" if self.gemm_measured is False else "")
                 + (f"; preparing {self.preparing} in the background" if self.preparing else "")]
        lines.append("  stages: " + ", ".join(f"{k} {v:.3f} s" for k, v in self.stages.items()))
        if self.lengths:
            lines.append(f"  lengths: {self.lengths}")
        if self.passes:
            top = sorted(self.passes.items(), key=lambda kv: -kv[1])[:5]
            lines.append("  slowest passes: " + ", ".join(f"{k} {v:.3f} s" for k, v in top))
        for g in self.gemms:
            t = f" transposed {g.transposed}" if g.transposed else ""
            lines.append(f"  GEMM {g.where}: {g.dtype} {g.m}x{g.k} @ {g.k}x{g.n}{t} -> {g.path}")
        if self.device == "cpu" and not self.gemms:
            lines.append("  GEMM: none (no matrix product reaches BLAS)")
        return "\n".join(lines)


class CompileTimer:
    """Times the stages of one compile and prints the progress line of a slow one."""

    def __init__(self, stats: CompileStats, progress: bool | None = None):
        self.stats = stats
        self.start = time.perf_counter()
        self.announced = False
        if progress is None:
            progress = progress_wanted()
        self._timer: threading.Timer | None = None
        if progress:
            self._timer = threading.Timer(PROGRESS_AFTER, self._announce)
            self._timer.daemon = True
            self._timer.start()

    def _announce(self) -> None:
        self.announced = True
        s = self.stats
        shapes = ", ".join("x".join(map(str, sh)) or "scalar" for sh in s.shapes)
        _say(f"gir: compiling @{s.entry} for {s.device} ({shapes}) ...")

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stats.stages[name] = self.stats.stages.get(name, 0.0) + time.perf_counter() - start

    def finish(self, compiled: Executable) -> CompileStats:
        """Stops the clock, takes what the backend recorded from `compiled`, ends the progress line."""
        if self._timer is not None:
            self._timer.cancel()
        s = self.stats
        s.seconds = time.perf_counter() - self.start
        backend_stages = compiled.compile_seconds
        if backend_stages:  # the backend's own split of the `backend` stage
            total = s.stages.pop("backend", 0.0)
            s.stages.update(backend_stages)
            rest = total - sum(backend_stages.values())
            if rest > 0.0005:  # printing the IR for fn.ir, binding BLAS: what the backend did not time
                s.stages["other"] = rest
        info = compiled.code_info
        if info is not None:  # a backend with a code cache and tiers (the CPU's CompileInfo)
            s.cache = {"compiled": "hit", "objects": "hit (object code)"}.get(info.from_cache, "miss")
            s.opt_level, s.gemm_measured, s.tier = info.opt_level, info.gemm_measured, info.tier
        s.preparing = compiled.preparing
        s.gemms += gemm_choices(compiled.gemms)
        if self.announced:
            _say(f"gir: compiled @{s.entry} in {s.seconds:.1f} s (code cache: {s.cache})")
        return s

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def gemm_choices(gemms: Sequence[GemmLike]) -> list[GemmChoice]:
    """A backend's GEMMs (`Executable.gemms`) and their paths."""
    out = []
    for g in gemms:
        transposed = ("a" if g.ta else "") + ("b" if g.tb else "")
        out.append(GemmChoice(g.key, g.path, g.dtype, g.m, g.n, g.k, transposed))
    return out


def progress_wanted() -> bool:
    """GIR_PROGRESS=1: always; GIR_PROGRESS=0: never; unset: when stderr is a terminal (a
    person is waiting; a log or a test capturing stderr gets no unasked-for lines)."""
    setting = current().progress
    if setting in ("0", "1"):
        return setting == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: progress is not worth failing for
        pass
