"""The CPU backend's decisions as data: what the schedule step reads (`Measurements`, a snapshot
of this machine's BLAS facts and measured times) and what it decides (`CpuSchedule`).

Both are values: the schedule step (plan.py) is a pure function of (Function, MemoryPlan,
Measurements, Options), and the lowering (lower/) a pure function of (Function,
MemoryPlan, CpuSchedule). Who takes the snapshot, and queues measurements for the shapes a
schedule took from the model, is the caller's business (snapshot.py, called by llvm_jit.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GemmParams = tuple[str, int, int, int, bool, bool, bool]
"""(dtype, m, n, k, ta, tb, packable): one GEMM call's shape as blas.py keys its times."""

ThreadParams = tuple[str, int, int, int, bool, bool]
"""(family, m, n, k, ta, tb): a float32 GEMM's one-thread and all-thread times (blas_threads.py)."""


@dataclass(frozen=True)
class Measurements:
    """A snapshot of what the schedule step may know about this machine's BLAS: which paths
    exist, the measured times of the shapes asked for (absent: not measured yet) and the model's
    guess for each, the thread times measured, and the facts the code generator compiles in."""

    has_mkl: bool
    candidates: Mapping[bool, tuple[str, ...]]
    """The paths a GEMM may take, by `packable` (blas._candidates)."""
    blas_threads: int
    """BLAS's thread count (blas.threads())."""
    gemm_times: Mapping[GemmParams, Mapping[str, float]] = field(default_factory=dict)
    """Measured seconds per path of the shapes asked for; a shape missing is not measured."""
    model_times: Mapping[GemmParams, Mapping[str, float]] = field(default_factory=dict)
    """The model's guess (blas.model_times) for every shape asked for."""
    thread_times: Mapping[ThreadParams, tuple[float, float]] = field(default_factory=dict)
    """(one thread, all threads) seconds of the measured shapes (blas_threads.py)."""
    overlap_unavailable: Mapping[str, str | None] = field(default_factory=dict)
    """Per family: why the two-core schedule cannot run here (None: it can)."""
    level1: tuple[int, int] | None = None
    """OpenBLAS's blas_level1_thread as the probe found it: (its mode word, the bytes `b`
    advances per row); None where it is not usable (team.level1_entry)."""
    openblas_int_bits: int = 32
    mkl_pack_bytes: Mapping[tuple[str, int, int, int], int] = field(default_factory=dict)
    """Bytes MKL needs to pack the B operand of a (dtype, m, n, k) GEMM (blas.pack_size)."""
    thread_disturbed: frozenset[ThreadParams] = frozenset()
    """Shapes whose thread times were measured only in disturbed rounds (another process had a
    core: quiet_timing.DISTURBED): the two-core schedule does not decide on them."""


PACKING = ("mkl-packed", "gir-packed", "openblas-copy")
"""The paths whose weight is prepared once before its scan's loop."""


@dataclass(frozen=True)
class GemmChoice:
    """The path of one GEMM call site (an op of the function, or a chunk of a deferred GEMM that
    the two-core schedule's worker runs)."""

    op_id: str
    params: GemmParams
    path: str
    quick_path: str
    """The quick tier's path: a BLAS path where `path` is gir-packed (its kernel costs the
    quick compile ~40 ms and pays only in long runs), else `path`."""
    provisional: bool
    """The path came from the model: the shape is not measured yet (measured in the background)."""
    reason: str
    loop_weight: bool = False
    """A GEMM of a scan body with a loop-invariant weight: on a packing path (PACKING) its
    weight is packed (or copied) once before the scan's loop."""
    pack_bytes: int = 0
    """Pinned bytes of an mkl-packed weight (blas.pack_size at snapshot time)."""
    where: str = ""
    """The op's source line and column (an op autodiff made has its user op's)."""

    def path_for(self, quick: bool) -> str:
        return self.quick_path if quick else self.path

    def packs(self, quick: bool = False) -> bool:
        """Its weight is prepared before the loop in the code of that tier."""
        return self.loop_weight and self.path_for(quick) in PACKING


@dataclass(frozen=True)
class SplitLoop:
    op_id: str
    elements: int
    used: bool


@dataclass(frozen=True)
class OverlapWindow:
    """A scan with GEMMs after it that can run on the worker during it (overlap.find_windows)."""

    scan_id: str
    deferred: tuple[str, ...]
    chunks: int
    used: bool
    estimate: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CpuSchedule:
    """Every decision the CPU backend's lowering follows, with its reasons."""

    function: str
    family: str
    """The one BLAS provider of the function (blas.FAMILIES): 'mkl' or 'openblas'."""
    family_reason: str
    gemms: tuple[GemmChoice, ...]
    """One per GEMM op (op_id 'opN') and per worker chunk ('opN#c'), sorted by op id."""
    split: tuple[SplitLoop, ...]
    windows: tuple[OverlapWindow, ...]
    main_one_thread: bool
    """The calling thread's BLAS on one thread for the whole call (overlap `_main_threads`)."""
    notes: Mapping[str, object]
    """The reasons in `fn.stats.schedule`'s form (split, overlap, main_blas_threads,
    overlap_pending): Layout.schedule starts from these."""
    provisional: tuple[GemmParams, ...]
    """GEMM shapes whose path or family came from the model (a later compile refines them)."""
    overlap_pending: tuple[ThreadParams, ...]
    """GEMM thread times the two-core schedule lacked (decided without it meanwhile)."""
    thread_shapes: tuple[ThreadParams, ...]
    """Every thread-time shape the step looked up (the caller queues the missing ones)."""
    level1: tuple[int, int] | None
    """OpenBLAS's blas_level1_thread (mode word, bytes per row) that split loops and gir-packed
    GEMMs are compiled for; None: not usable (they run on the calling thread)."""
    openblas_int_bits: int
    """The width of the `ob_*` entries' integer arguments (64: NumPy's ILP64 OpenBLAS)."""
    arena_plan: bool = True
    """Lay the arena out by memplan's plan (GIR_CPU_ARENA)."""

    def gemm(self, op_id: str) -> GemmChoice | None:
        return next((g for g in self.gemms if g.op_id == op_id), None)

    @property
    def split_ids(self) -> frozenset[str]:
        return frozenset(s.op_id for s in self.split if s.used)

    @property
    def window_ids(self) -> frozenset[str]:
        return frozenset(w.scan_id for w in self.windows if w.used)

    @property
    def quick_differs(self) -> bool:
        """The quick tier lowers some GEMM on another path than the final code."""
        return any(g.quick_path != g.path for g in self.gemms)

    def format(self) -> str:
        """The stable printed form (`gir opt --cpu-schedule`): one line a decision, sorted."""
        lines = [f"cpu-schedule @{self.function}", f"  family {self.family}: {self.family_reason}"]
        for g in self.gemms:
            dtype, m, n, k, ta, tb, packable = g.params
            quick = f" quick={g.quick_path}" if g.quick_path != g.path else ""
            extra = (" packed" if g.packs() else "") + (" provisional" if g.provisional else "")
            lines.append(f"  gemm {g.op_id} at {g.where or '?'} {dtype} m={m} n={n} k={k} ta={int(ta)} tb={int(tb)} "
                         f"packable={int(packable)}: {g.path}{quick}{extra} ({g.reason})")
        split = self.notes.get("split")
        lines.append(f"  split: {split}" if isinstance(split, str)
                     else "  split: by loop" if self.split else "  split: no candidate loop")
        for s in self.split:
            lines.append(f"  split {s.op_id} elements={s.elements}: {'yes' if s.used else 'no'}")
        overlap = self.notes.get("overlap")
        if isinstance(overlap, str) or not self.windows:
            lines.append(f"  overlap: {overlap if overlap is not None else 'no window'}")
        for w in self.windows:
            est = "".join(f" {k}={v}" for k, v in sorted(w.estimate.items()))
            lines.append(f"  overlap {w.scan_id} deferred={','.join(w.deferred)} chunks={w.chunks}: "
                         f"{'yes' if w.used else 'no'}{est}")
        lines.append(f"  main-blas-threads: {'1' if self.main_one_thread else 'all'}")
        lines.append(f"  arena: {'memplan' if self.arena_plan else 'a slot per value (GIR_CPU_ARENA=0)'}")
        lines.append(f"  provisional: {len(self.provisional)} gemm shapes, {len(self.overlap_pending)} thread shapes")
        return "\n".join(lines) + "\n"
