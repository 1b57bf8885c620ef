"""The schedule step's inputs and side effects: `take` snapshots what blas.py, blas_threads.py
and team.py know now (measured times from disk, the providers, the thread pools, the OpenBLAS
probe) for the shapes a function needs; `schedule` runs the pure step (schedule/) on it and then
queues the measurements of what the step took from the model (GIR_GEMM_MEASURE=background) or
measures them at once and decides again (=now). The lowering reads none of this: it follows
the CpuSchedule."""

from __future__ import annotations

import re

from ...analysis.memory.plan import MemoryPlan
from ...config import Options
from ...ir.core import Function
from . import blas, blas_threads, quiet_timing, team
from .schedule import CpuSchedule, GemmParams, Measurements, needed_shapes, plan
from .schedule.gemms import sites

_THREAD_KEY = re.compile(r"^(\w+) m=(\d+) n=(\d+) k=(\d+) ta=([01]) tb=([01]) threads=(\d+) (t[01]|\w+)$")


def thread_times() -> tuple[dict[tuple, tuple[float, float]], frozenset[tuple]]:
    """blas_threads' measured (one thread, all threads) seconds for BLAS's thread count now, and
    the shapes among them measured only in disturbed rounds (the model's times are not: they
    are the same every time)."""
    threads = blas.threads()
    found: dict[tuple, dict[str, float]] = {}
    for key, value in blas_threads.measured_times().items():
        m = _THREAD_KEY.match(key)
        if m is None or int(m[7]) != threads:
            continue
        params = (m[1], int(m[2]), int(m[3]), int(m[4]), m[5] == "1", m[6] == "1")
        found.setdefault(params, {})[m[8]] = float(value)
    times = {p: (t["t1"], t["t0"]) for p, t in found.items() if "t1" in t and "t0" in t}
    disturbed = frozenset(p for p, t in found.items() if p in times and quiet_timing.DISTURBED in t
                          and quiet_timing.MODEL not in t)
    return times, disturbed


def take(function: Function, options: Options) -> tuple[Measurements, list[GemmParams]]:
    """(the snapshot, the GEMM shapes asked for that have no measured times)."""
    shapes = needed_shapes(function)
    scans = any(op.name == "scan" for op in function.body)
    if not shapes and not scans:  # nothing to decide: start no BLAS (MKL's first call costs ~8 ms)
        return Measurements(False, {False: ("openblas",), True: ("openblas",)}, 1), []
    candidates = {False: tuple(blas._candidates(False)), True: tuple(blas._candidates(True))}
    has_mkl = blas.providers().has_mkl
    times, missing = {}, []
    for p in shapes:
        cands = candidates[p[-1]]
        if len(cands) == 1 or options.gemm_path in cands:
            continue  # nothing is chosen by measuring: nothing asked
        found = blas.path_times(*p)
        if found is None:
            missing.append(p)
        else:
            times[p] = found
    entry = team.level1_entry()
    threads, disturbed = thread_times()
    pack_bytes = {(p[0], p[1], p[2], p[3]): blas.pack_size(p[0], p[1], p[2], p[3]) for p in shapes if p[-1] and has_mkl}
    return Measurements(
        has_mkl, candidates, blas.threads(), times, {p: blas.model_times(*p) for p in shapes if p not in times},
        threads, {f: blas_threads.unavailable(f) for f in blas.FAMILIES} if scans else {},
        (entry[1], entry[2]) if entry is not None else None, blas.openblas_int_bits(),
        pack_bytes, disturbed), missing


def _consulted(function: Function, result: CpuSchedule, measured: Measurements, options: Options) -> set[GemmParams]:
    """The shapes whose times the step used (blas.choose_family's and choose_path's asks): the
    family's sites unless a path is forced or MKL is missing, and every call site's. The chunks
    of a window left unused are in the snapshot but not consulted: they are not measured."""
    used = {g.params for g in result.gemms}
    if not options.gemm_path and measured.has_mkl:
        used |= {p for p, _ in sites(function)}
    return used


def schedule(function: Function, memory: MemoryPlan | None, options: Options) -> CpuSchedule:
    """The CpuSchedule of function now, the measurements it lacked queued (or, with
    GIR_GEMM_MEASURE=now, measured and the step run again with them)."""
    for _ in range(4):  # =now: each round measures what the last decision asked for
        measured, missing = take(function, options)
        result = plan(function, memory, measured, options)
        for p in _consulted(function, result, measured, options) & set(missing):
            blas.measure_later(p)  # only in the background mode
        lacking = [t for t in result.thread_shapes if t not in measured.thread_times]
        for t in result.thread_shapes:
            try:  # queues what is missing (background), measures it (now), or neither (off)
                blas_threads.seconds(*t, threads=0)
            except blas_threads.NotMeasured:
                pass
        if options.gemm_measure != "now" or not lacking:
            return result
    return result
