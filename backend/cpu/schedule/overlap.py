"""The two-core schedule's decision (overlap.py has the analysis: which GEMMs can be deferred
into a scan, and how they are chunked): whether each window runs with the worker, from the
GEMM thread times in the snapshot, and whether the calling thread's BLAS stays on one thread
for the whole call."""

from __future__ import annotations

from ....config import Options
from ....ir.core import Function, Operation
from ....ir.loops import LoopView
from .. import overlap
from .data import Measurements, OverlapWindow, ThreadParams

MARGIN = 0.5
"""The schedule is used when the model predicts it at least 2x faster. The model counts GEMM
times only, each measured alone; with the worker running, both threads' 1-thread GEMMs and
OpenBLAS's own pool thread share the 2 cores, which the model does not see. Forced on, on a
quiet machine (`GIR_CPU_OVERLAP=0|1 python bench/rnn.py --models rnn,gru,lstm --sizes S
--threads 2 --peers numpy`): rnn-S 8.1 -> 12.1 ms, gru-S 25.3 -> 37.7, lstm-S 34.8 -> 51.3;
a two-layer GRU the model gave 27.8 against 29.4 ms ran 1.44x slower with it
(bench/generic_cell.py). The margin was 25 % until a quiet machine's thread times gave rnn-S
4.64 against 7.12 ms (a predicted 1.53x gain, `fn.stats.schedule`), and the step ran 12.5-13.4
ms with the schedule against 7.3 ms without (`GIR_CPU_OVERLAP=auto|0 python bench/rnn_steps.py
rnn 100`, alternated, 2026-11-24; re-run later with `=1|0`: 17.7-19.7 against 9.5-13.5 ms).
Where it won, on a loaded machine, the predicted gain was 1.3x-60x: only the large ones stay."""


class NotMeasured(Exception):
    """Some thread times a decision needs are not in the snapshot; `params` names them all."""

    def __init__(self, params: tuple[ThreadParams, ...]):
        super().__init__(params)
        self.params = params


class Disturbed(Exception):
    """Some thread times a decision needs were measured only in disturbed rounds: a 2-thread
    GEMM timed while another process had the second core came out 7x slow (the GRU-S scan's
    GEMMs 38.7 ms on 2 threads against 5.6 on one, `fn.stats.schedule`), and the model then
    predicted a gain the worker never brought (`bench/rnn_rounds.py --peers gir,gir-base=...`
    beside a nice-19 process: GRU-S 31.3 against 20.4 ms without the worker). Decided
    without the worker: not pending (a later clean measurement is a later process's)."""


class Times:
    """Thread times of one family from the snapshot: a shape missing counts 0 and is noted, and
    `check` raises NotMeasured naming them all, else Disturbed if some was measured only while
    the machine was busy. `asked` keeps every shape looked up."""

    def __init__(self, family: str, measured: Measurements):
        self.family = family
        self.measured = measured
        self.missing: list[ThreadParams] = []
        self.disturbed: list[ThreadParams] = []
        self.asked: list[ThreadParams] = []

    def __call__(self, m: int, n: int, k: int, ta: bool, tb: bool, threads: int) -> float:
        params = (self.family, m, n, k, ta, tb)
        self.asked.append(params)
        found = self.measured.thread_times.get(params)
        if found is None:
            self.missing.append(params)
            return 0.0
        if params in self.measured.thread_disturbed:
            self.disturbed.append(params)
        return found[0] if threads == 1 else found[1]

    def reset(self) -> None:
        self.missing, self.disturbed = [], []

    def check(self) -> None:
        if self.missing:
            raise NotMeasured(tuple(dict.fromkeys(self.missing)))
        if self.disturbed:
            raise Disturbed(tuple(dict.fromkeys(self.disturbed)))


def estimate(window: overlap.Window, seconds: Times) -> dict[str, float]:
    """Milliseconds of the window's GEMMs: `without` (2-thread GEMMs, the deferred ones after the
    scan) and `with` (the scan's GEMMs on one thread here, the chunks on one thread on the
    worker, whichever is longer, plus the last chunk, which can only start after the last step).
    Elementwise work and waiting are not in the model: it decides between the two GEMM
    schedules, measured on this machine (blas_threads.py)."""
    seconds.reset()
    steps = LoopView(window.scan).trip_count or 0
    body = overlap.body_gemms(window.scan)
    main1 = steps * sum(seconds(*g, threads=1) for g in body)
    main2 = steps * sum(seconds(*g, threads=0) for g in body)
    after2 = sum(seconds(d.m, d.n, d.k, True, False, threads=0) for d in window.deferred)
    worker, last = 0.0, 0.0
    for d in window.deferred:
        for c in d.chunks:
            last = seconds(d.m, d.n, c.k1 - c.k0, True, False, threads=1)
            worker += last
    seconds.check()
    return {"without_ms": 1e3 * (main2 + after2), "with_ms": 1e3 * max(main1 + last, worker),
            "scan_gemms_1thread_ms": 1e3 * main1, "scan_gemms_ms": 1e3 * main2,
            "deferred_ms": 1e3 * after2, "worker_1thread_ms": 1e3 * worker}


def main_threads(function: Function, kept: list[overlap.Window], seconds: Times) -> dict[str, object]:
    """The calling thread's other GEMMs: on one thread for the whole call when that measured
    faster (on a machine whose other core is busy, 2-thread GEMMs wait for it)."""
    seconds.reset()
    outside = overlap.outside_gemms(function, kept)
    one = sum(seconds(*g, threads=1) for g in outside)
    both = sum(seconds(*g, threads=0) for g in outside)
    seconds.check()
    return {"threads": 1 if one <= both else "all", "why": "measured model",
            "outside_1thread_ms": round(1e3 * one, 3), "outside_ms": round(1e3 * both, 3)}


def plan(function: Function, ids: dict[Operation, str], family: str, measured: Measurements, options: Options,
         split_used: bool) -> tuple[list[overlap.Window], dict[str, object], Times]:
    """(the windows to run with the worker, the notes for fn.stats.schedule, the times asked)."""
    notes: dict[str, object] = {}
    seconds = Times(family, measured)
    if split_used:  # it measured faster than the two-core schedule where both applied
        notes["overlap"] = "off: the split schedule (team.py) uses the second core"
        return [], notes, seconds
    windows = overlap.find_windows(function)
    if not windows:
        return [], notes, seconds
    chosen = options.cpu_overlap
    why = measured.overlap_unavailable.get(family)
    if chosen == "0" or why is not None:
        notes["overlap"] = "off: " + ("GIR_CPU_OVERLAP=0" if chosen == "0" else str(why))
        return [], notes, seconds
    kept: list[overlap.Window] = []
    notes_list: list[dict[str, object]] = []
    pending: list[ThreadParams] = []
    for w in windows:
        try:
            est = {k: round(v, 3) for k, v in estimate(w, seconds).items()} if chosen == "auto" else {}
        except NotMeasured as e:  # decided without the worker; compiled again once measured
            pending += e.params
            notes_list.append({"scan": str(w.scan.loc), "used": False,
                               "why": "GEMM thread times not measured yet (measuring in the background)"})
            continue
        except Disturbed:
            notes_list.append({"scan": str(w.scan.loc), "used": False,
                               "why": "GEMM thread times measured only while the machine was busy (disturbed)"})
            continue
        use = chosen in ("1", "whole") or est["with_ms"] < MARGIN * est["without_ms"]
        notes_list.append({"scan": str(w.scan.loc), "deferred_gemms": len(w.deferred),
                           "chunks": sum(len(d.chunks) for d in w.deferred), "used": use,
                           "why": "measured model" if chosen == "auto" else f"GIR_CPU_OVERLAP={chosen}", **est})
        if use:
            kept.append(w)
    notes["overlap"] = notes_list
    if kept and chosen == "auto":
        try:
            notes["main_blas_threads"] = main_threads(function, kept, seconds)
        except NotMeasured as e:
            pending += e.params
            notes["main_blas_threads"] = {"threads": "all", "why": "GEMM thread times not measured yet"}
        except Disturbed:
            notes["main_blas_threads"] = {"threads": "all", "why": "GEMM thread times disturbed"}
    elif kept and chosen == "whole":
        notes["main_blas_threads"] = {"threads": 1, "why": "GIR_CPU_OVERLAP=whole"}
    if pending and options.gemm_measure == "background":  # refined later (=off: never)
        notes["overlap_pending"] = [list(p) for p in dict.fromkeys(pending)]
    return kept, notes, seconds


def windows_of(function: Function, ids: dict[Operation, str], kept: list[overlap.Window]) -> tuple[OverlapWindow, ...]:
    """Every window found, as data (used: kept)."""
    return tuple(OverlapWindow(ids[w.scan], tuple(ids[d.op] for d in w.deferred),
                               sum(len(d.chunks) for d in w.deferred), any(k.scan is w.scan for k in kept))
                 for w in overlap.find_windows(function))
