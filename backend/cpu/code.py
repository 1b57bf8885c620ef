"""Compiled code as data (`Code`: the object, its layout, its IR texts, how it was compiled) and
the keys of the object cache. Below llvm_jit.py (which makes Code) and runtime.py (which loads
and runs it): neither imports the other's floor back. Loads no LLVM: a cache hit needs the keys."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ...analysis.lengths import LengthDims
from ...analysis.memory.plan import MemoryPlan
from ...config import code_key, current
from ...ir.core import Function
from ...support.cache import build_fingerprint, digest
from . import blas, native, team, tiers
from .layout import Layout


def opt_level() -> int:
    """LLVM's optimisation level for compiled code: GIR_LLVM_OPT (0-3), default DEFAULT_OPT."""
    level = current().llvm_opt
    return DEFAULT_OPT if level is None else level


DEFAULT_OPT = 3
"""Chosen by measurement (docs/performance.md, "Compile time"): compile seconds against the
run time of the bench/rnn.py training steps."""


@dataclass
class CompileInfo:
    opt_level: int = DEFAULT_OPT
    """LLVM's optimisation level (GIR_LLVM_OPT; the default is chosen by measurement)."""
    from_cache: str = ""
    """'' compiled here; 'compiled' a hit in the compile cache (nothing ran but loading);
    'objects' a hit in the object cache (the passes ran, LLVM did not)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds of lowering, LLVM's passes and code emission when it was compiled; of loading now."""
    gemm_measured: bool = True
    """False when some GEMM path came from the model (it is refined by a later compile)."""
    tier: str = ""
    """'' compiled once (tiering off, an explicit GIR_LLVM_OPT, or final code loaded from a
    cache); 'quick' the cheap first code while -O3 compiles in the background (tiers.py), or
    quick code loaded from the compile cache (stored at once: what ran); 'final' the better
    code that replaced it (-O3, or measured GEMM paths)."""


@dataclass
class Code:
    """What compiling a function produced: everything a process needs to run it and show it."""

    obj: bytes
    layout: Layout
    optimized_ir: str
    llvm_ir: str
    info: CompileInfo
    final: tiers.FinalCompile | None = None
    """Quick code's background -O3 compile (its `code` is this function's final Code)."""
    shared: bytes | None = None
    """obj linked into a shared library (native.py), when it came from a cache entry that has one."""

    def to_entry(self, shared: bool = False) -> tuple[dict, bytes]:
        """(meta, blob) of a cache entry; shared: the blob adds the object linked into a shared
        library (where a linker is found), which a hit in a new process loads without LLVM.
        The IR texts are parts of the blob, not of the JSON meta: decoding them costs nothing."""
        library = native.link(self.obj) if shared else None
        parts = {"object": self.obj, "llvm_ir": self.llvm_ir.encode(), "optimized_ir": self.optimized_ir.encode()}
        if library is not None:
            parts["shared"] = library
        meta = {"layout": self.layout.to_json(), "opt_level": self.info.opt_level, "seconds": self.info.seconds,
                "parts": [[name, len(data)] for name, data in parts.items()], "state": self.state()}
        return meta, b"".join(parts.values())

    def state(self) -> dict[str, Any]:
        """What a cache entry of this code says of it (`gir cache info`): 'quick' code (the -O3
        code is better) or 'final', and whether its GEMM paths and schedule were measured."""
        return {"tier": "quick" if self.info.tier == "quick" else "final", "measured": self.layout.measured}

    @classmethod
    def from_entry(cls, meta: dict, blob: bytes, source: str) -> Code:
        layout = Layout.from_json(meta["layout"])
        tier = "quick" if (meta.get("state") or {}).get("tier") == "quick" else ""  # quick code stays quick
        info = CompileInfo(int(meta["opt_level"]), source, dict(meta.get("seconds", {})), layout.measured, tier)
        parts, at = {}, 0
        for name, size in meta["parts"]:
            parts[str(name)], at = blob[at : at + int(size)], at + int(size)
        if at != len(blob):
            raise ValueError("parts do not add up to the blob")
        return cls(parts["object"], layout, parts["optimized_ir"].decode(), parts["llvm_ir"].decode(), info,
                   shared=parts.get("shared"))

    def from_model(self) -> bool:
        """Some GEMM path came from the model, or its two-core schedule was decided without
        GEMM thread times (read from the layout alone: `stale` asks whether they are measured
        now, which loads MKL and reads the times files)."""
        return bool(self.layout.schedule.get("overlap_pending") or self.layout.provisional)

    def stale(self) -> bool:
        """Its GEMM paths came from the model, or its two-core schedule was decided without
        GEMM thread times, and every such shape is measured now."""
        from . import blas_threads

        if not self.from_model():
            return False
        pending = self.layout.schedule.get("overlap_pending") or []
        assert isinstance(pending, list)  # the CpuSchedule's thread shapes, as lists (JSON)
        provisional = self.layout.provisional
        return (blas_threads.is_measured([tuple(p) for p in pending])
                and (not provisional or blas.is_measured([tuple(p) for p in provisional])))


# ---------------------------------------------------------------------------------------------
# The disk cache of compiled code


def cache_key(function: Function, plan: MemoryPlan | None = None, lengths: LengthDims | None = None) -> str:
    """Content key of the object cache: the printed function (after every pass), the memory
    plan's strategy, the dims that follow a run-time length, the target (`target_key`) and gir's code."""
    from ...ir.printer import print_function

    return digest(print_function(function, print_locations=True), plan.strategy if plan is not None else "default",
                  lengths.describe() if lengths is not None else "", target_key(), build_fingerprint())


def target_key() -> tuple:
    """What the same IR compiles differently for: gir and llvmlite versions, LLVM's level, the
    host CPU and its features, and what decides GEMM paths (MKL present, threads, a forced
    path, the arena switch). Computed without loading LLVM or MKL, as a cache hit needs it."""
    from ...version import __version__

    return (__version__, _CODEGEN_VERSION, *host_id(), blas.mkl_found(), blas.thread_setting(),
            blas.openblas_int_bits(),
            found.name if (found := blas.openblas()) else "cython_blas",
            team.pool_threads(), opt_level(), code_key(current()))


@cache
def host_id() -> tuple[str, ...]:
    """The host as the caches key it: llvmlite's version (it fixes LLVM's), the OS and machine,
    and the CPU: its /proc/cpuinfo entry (vendor, model, flags; on ARM implementer, part and
    features) without the fields that change while it runs, read without loading LLVM (a cache
    hit never does); where there is no /proc/cpuinfo, LLVM's host CPU name and features (code
    compiled for the host CPU must never be loaded on another one)."""
    import platform

    import llvmlite

    cpu = _cpuinfo()
    if not cpu:
        cpu = host()
    return (llvmlite.__version__, sys.platform, platform.machine(), *cpu)


@cache
def host() -> tuple[str, str]:
    """The host CPU's name and features, from LLVM (asking LLVM for the features costs ~25 ms:
    once). Loads LLVM: the caches ask it only where there is no /proc/cpuinfo."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


_VOLATILE_CPUINFO = ("cpu mhz", "bogomips", "processor", "core id", "apicid", "initial apicid")


def _cpuinfo() -> tuple[str, ...]:
    """The first CPU's /proc/cpuinfo entry as sorted `key=value` strings (() where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 17).strip().split("\n\n", 1)[0]
    except OSError:
        return ()
    pairs = (line.split(":", 1) for line in first.splitlines() if ":" in line)
    return tuple(sorted(f"{k.strip()}={v.strip()}" for k, v in pairs if k.strip().lower() not in _VOLATILE_CPUINFO))


_CODEGEN_VERSION = "21"  # 19: chunks and split blocks claimed by either thread (issue 28); 20: the schedule as data;
# 21: code for every length (analysis/lengths.py); 22: loop nests outlined past OUTLINE_AFTER (issue 30)
"""Bump when the code the backend generates changes meaning, to retire cached objects."""


def has_worker(layout: Layout) -> bool:
    notes = layout.schedule.get("overlap")
    return isinstance(notes, list) and any(n.get("used") for n in notes)
