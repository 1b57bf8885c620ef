"""The CPU backend's decisions as data (docs/backend.md, "The schedule"): `plan` is the pure
step (Function, MemoryPlan, Measurements, Options) -> CpuSchedule; the lowering (lower/)
follows the schedule and decides nothing. Imports: schedule -> blas, team, overlap (their
analyses and constants), never the lowering or the runtime."""

from .data import CpuSchedule, GemmChoice, GemmParams, Measurements, OverlapWindow, SplitLoop, ThreadParams
from .gemms import op_ids
from .plan import needed_shapes, plan

__all__ = ["CpuSchedule", "GemmChoice", "GemmParams", "Measurements", "OverlapWindow", "SplitLoop", "ThreadParams",
           "needed_shapes", "op_ids", "plan"]
