"""The schedule step: (Function, MemoryPlan, Measurements, Options) -> CpuSchedule. Pure: it
reads no disk and no environment and queues nothing (snapshot.py does that for its caller)."""

from __future__ import annotations

from ....analysis.memory.plan import MemoryPlan
from ....config import Options
from ....ir.core import Function, Operation
from .. import overlap
from . import gemms, split
from . import overlap as overlap_decision
from .data import CpuSchedule, GemmChoice, GemmParams, Measurements


def needed_shapes(function: Function) -> list[GemmParams]:
    """Every GEMM shape the step may ask the snapshot about: the family's sites, each op's call
    and the chunks the two-core schedule's worker would run (in a stable order, no repeats)."""
    shapes = [p for p, _ in gemms.sites(function)]
    shapes += [gemms.call_params(op) for op in function.walk() if gemms._static_gemm(op)]
    for w in overlap.find_windows(function):
        shapes += [chunk_params(d, c) for d in w.deferred for c in d.chunks]
    return list(dict.fromkeys(shapes))


def chunk_params(d: overlap.Deferred, c: overlap.Chunk) -> GemmParams:
    return ("f32", d.m, d.n, c.k1 - c.k0, True, False, False)


def plan(function: Function, memory: MemoryPlan | None, measured: Measurements, options: Options) -> CpuSchedule:
    """Every decision of the CPU backend for function, with its reasons. `memory` is the
    arena's plan; no decision depends on it today (the worker's private values are placed by
    the lowering), it is an input so that one can."""
    del memory
    ids = gemms.op_ids(function)
    sites = gemms.sites(function)
    family, family_reason = gemms.choose_family(sites, measured, options)
    loops, split_note = split.plan(function, ids, family if sites else None, measured, options)
    split_used = any(s.used for s in loops)
    kept, notes, seconds = overlap_decision.plan(function, ids, family, measured, options, split_used)
    if split_note is not None:
        notes = {"split": split_note, **notes}
    deferred = {d.op for w in kept for d in w.deferred}
    choices = _op_choices(function, ids, family, deferred, measured, options)
    choices += _chunk_choices(ids, kept, family, measured, options)
    provisional = [p for p, _ in sites] + [g.params for g in choices]
    provisional = [p for p in dict.fromkeys(provisional) if not gemms.is_measured(p, measured, options)]
    pending = notes.get("overlap_pending") or []
    assert isinstance(pending, list)  # overlap_decision.plan's thread shapes, as lists
    main = notes.get("main_blas_threads")
    return CpuSchedule(
        function.name, family, family_reason, tuple(sorted(choices, key=lambda g: _order(g.op_id))),
        loops, overlap_decision.windows_of(function, ids, kept),
        bool(kept) and isinstance(main, dict) and main.get("threads") == 1, notes,
        tuple(provisional), tuple(tuple(p) for p in pending),
        tuple(dict.fromkeys(seconds.asked)), measured.level1, measured.openblas_int_bits, options.cpu_arena)


def _where(op: Operation) -> str:
    return f"{op.loc.line}:{op.loc.col}" if op.loc is not None else ""


def _order(op_id: str) -> tuple[int, int]:
    """opN before opN#c, numerically."""
    head, _, chunk = op_id.partition("#")
    return int(head[2:]), int(chunk) if chunk else -1


def _op_choices(function: Function, ids: dict[Operation, str], family: str, deferred: set[Operation],
                measured: Measurements, options: Options) -> list[GemmChoice]:
    """The path of each GEMM op the calling thread runs. A packable GEMM in a scan body (its
    weight packed or copied before the loop) gets a quick-tier path without gir-packed, unless
    GIR_GEMM_PATH forces gir-packed."""
    out = []
    for op in function.walk():
        if op in deferred or not gemms._static_gemm(op):
            continue
        params = gemms.call_params(op)
        path, why = gemms.choose_path(params, family, measured, options)
        quick = path
        in_scan = params[-1] and op.parent_op is not None and op.parent_op.name == "scan"
        if in_scan and path == "gir-packed" and options.gemm_path != path:
            quick, _ = gemms.choose_path(params, family, measured, options, exclude=(path,))
        dtype, m, n, k = params[:4]
        size = measured.mkl_pack_bytes.get((dtype, m, n, k), 0) if "mkl-packed" in (path, quick) and in_scan else 0
        out.append(GemmChoice(ids[op], params, path, quick, not gemms.is_measured(params, measured, options), why,
                              bool(in_scan), size, _where(op)))
    return out


def _chunk_choices(ids: dict[Operation, str], kept: list[overlap.Window], family: str, measured: Measurements,
                   options: Options) -> list[GemmChoice]:
    """The path of each chunk a deferred GEMM is split into (the worker runs them)."""
    out = []
    for w in kept:
        for d in w.deferred:
            for i, c in enumerate(d.chunks):
                params = chunk_params(d, c)
                path, why = gemms.choose_path(params, family, measured, options)
                out.append(GemmChoice(f"{ids[d.op]}#{i}", params, path, path,
                                      not gemms.is_measured(params, measured, options), why, where=_where(d.op)))
    return out
