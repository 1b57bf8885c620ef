"""The split schedule's decision (team.py has the analysis and the probe): which large
elementwise loops of scan bodies run on both cores, on OpenBLAS's pool. Asked before the
two-core schedule (overlap.py): where both apply, the split measured faster (gru-S 1.045x,
gru-M 1.03x, rnn-S even; bench/rnn_split.py, docs/performance-rnn.md), unless GIR_CPU_OVERLAP
asks for that schedule."""

from __future__ import annotations

from ....config import Options
from ....ir.core import Function, Operation
from .. import team
from .data import Measurements, SplitLoop


def why_not(family: str | None, measured: Measurements, options: Options) -> str | None:
    """Why no loop is split (None: loops may be)."""
    if options.cpu_split == "0":
        return "GIR_CPU_SPLIT=0"
    if options.cpu_overlap in ("1", "whole"):
        return f"GIR_CPU_OVERLAP={options.cpu_overlap} asks for the two-core schedule"
    if family == "mkl":
        return "the function's GEMMs run on MKL (its threads would spin beside OpenBLAS's)"
    if measured.blas_threads < 2:
        return f"BLAS runs on {measured.blas_threads} thread"
    if measured.level1 is None:
        return "OpenBLAS's blas_level1_thread is not usable here (not exported, or a pool of one thread)"
    return None


def plan(function: Function, ids: dict[Operation, str], family: str | None, measured: Measurements,
         options: Options) -> tuple[tuple[SplitLoop, ...], object]:
    """(the splittable loops of scan bodies, each used or not; the note for fn.stats.schedule["split"]).
    family: the function's GEMM provider, None without GEMMs."""
    scans = [op for op in function.body if op.name == "scan"]
    if not scans:
        return (), None
    why = why_not(family, measured, options)
    loops: list[SplitLoop] = []
    notes = []
    for scan in scans:
        found = [op for op in scan.body if team.splittable(op)]
        large = [op for op in found
                 if why is None and (options.cpu_split == "1" or team.elements(op) >= team.MIN_ELEMENTS)]
        loops += [SplitLoop(ids[op], team.elements(op), op in large) for op in found]
        notes.append({"scan": str(scan.loc), "used": bool(large), "split_loops": len(large),
                      "loops": [f"{op.loc} {op.name} {team.elements(op)}" for op in large],
                      "why": "GIR_CPU_SPLIT=1" if options.cpu_split == "1"
                      else f"loops of at least {team.MIN_ELEMENTS} elements"})
    return tuple(loops), ("off: " + why if why is not None else notes)
