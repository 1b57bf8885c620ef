"""GEMM timing that ignores rounds another process disturbed (backend/cpu/quiet_timing.py), and
the caches treating a measurement with no clean round as provisional."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from gir.backend.cpu import blas, blas_threads, quiet_timing


class FakeSwitches:
    """A stand-in for the involuntary switch counter, advanced by the fake rounds."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> int:
        return self.count


def rounds(switches: FakeSwitches, plan: dict[str, list[tuple[float, bool]]]) -> dict:
    """Round functions returning planned (seconds, disturbed) in turn."""
    def make(name: str):  # noqa: ANN202
        it = iter(plan[name])

        def run() -> float:
            seconds, disturbed = next(it)
            switches.count += 10 if disturbed else 0
            return seconds
        return run
    return {name: make(name) for name in plan}


def test_disturbed_rounds_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    switches = FakeSwitches()
    monkeypatch.setattr(quiet_timing, "involuntary_switches", switches)
    # The fastest round of "a" was disturbed (a timing fluke is possible either way); only
    # clean rounds count, and "b" needs 7 rounds before its first clean one.
    plan = {"a": [(0.5, True), (2.0, False), (1.5, False)] + [(1.8, False)] * 12,
            "b": [(0.1, True)] * 6 + [(3.0, False)] + [(4.0, False)] * 8}
    best, disturbed = quiet_timing.best_clean_rounds(rounds(switches, plan))
    assert best == {"a": 1.5, "b": 3.0} and not disturbed


def test_no_clean_round_gives_the_best_disturbed_time_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    switches = FakeSwitches()
    monkeypatch.setattr(quiet_timing, "involuntary_switches", switches)
    plan = {"a": [(1.0, False)] * 15, "b": [(9.0, True)] * 14 + [(7.0, True)]}
    best, disturbed = quiet_timing.best_clean_rounds(rounds(switches, plan), max_rounds=15)
    assert best == {"a": 1.0, "b": 7.0} and disturbed


def test_merge_keeps_the_faster_time_while_provisional() -> None:
    old = {"openblas": 5.0, "mkl": 1.0, quiet_timing.DISTURBED: 1.0}
    assert quiet_timing.merge(old, {"openblas": 2.0, "mkl": 3.0}, False) == {"openblas": 2.0, "mkl": 1.0}
    assert quiet_timing.merge(old, {"openblas": 2.0, "mkl": 3.0}, True) == \
        {"openblas": 2.0, "mkl": 1.0, quiet_timing.DISTURBED: 2.0}
    # A clean entry is replaced, never merged: it is not provisional.
    assert quiet_timing.merge({"openblas": 1.0}, {"openblas": 2.0}, False) == {"openblas": 2.0}


def test_a_provisional_path_time_is_measured_again_once_per_process(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    monkeypatch.setattr(quiet_timing.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(blas, "_choices", None)
    monkeypatch.setattr(blas, "_retried", set())
    calls: list[int] = []
    results = iter([({p: 9.0 for p in blas._candidates(False)}, True),
                    ({p: 4.0 for p in blas._candidates(False)}, False)])

    def fake_measure(paths: list[str], dtype: str, m: int, n: int, k: int,
                     *rest: object) -> tuple[dict[str, float], bool]:
        if (m, n, k) != (7, 7, 7):  # a background measurer left by another test: not ours
            return {p: 1.0 for p in paths}, False
        calls.append(1)
        return next(results)
    monkeypatch.setattr(blas, "_measure_all", fake_measure)
    params = ("f32", 7, 7, 7, False, False, False)
    assert set(blas.path_times(*params).values()) == {9.0}  # first measurement: all disturbed
    monkeypatch.setattr(blas, "_retried", set())  # as a new process
    assert set(blas.path_times(*params).values()) == {4.0}  # measured again, clean now
    assert set(blas.path_times(*params).values()) == {4.0} and len(calls) == 2  # clean: kept


def test_a_provisional_entry_is_measured_again_a_few_times_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet_timing.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    entry = {"t1": 1.0}
    for attempt in range(1, quiet_timing.ATTEMPTS + 1):
        entry = quiet_timing.merge(entry if attempt > 1 else None, {"t1": 1.0}, True)
        assert entry[quiet_timing.DISTURBED] == attempt
        assert quiet_timing.provisional(entry[quiet_timing.DISTURBED]) == (attempt < quiet_timing.ATTEMPTS)
    assert not quiet_timing.provisional(None) and not quiet_timing.provisional(0.0)
    monkeypatch.setattr(quiet_timing.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert not quiet_timing.provisional(1.0)  # busy now: it would be disturbed again


def _fresh_background(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_GEMM_MEASURE", "background")
    monkeypatch.setattr(blas, "_queue", [])
    monkeypatch.setattr(blas, "_queued", set())
    monkeypatch.setattr(blas, "_worker", None)


def test_a_provisional_thread_time_is_measured_again_in_the_background(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(quiet_timing.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(blas_threads, "_times", None)
    monkeypatch.setattr(blas_threads, "_retried", set())
    results = iter([({"t1": 2.0, "t0": 50.0}, True), ({"t1": 3.0, "t0": 1.2}, False)])
    monkeypatch.setattr(blas_threads, "_measure", lambda *a: next(results))
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    assert blas_threads.seconds("openblas", 8, 8, 8, False, False, threads=0) == 50.0  # first: measured now
    _fresh_background(monkeypatch)
    monkeypatch.setattr(blas_threads, "_retried", set())  # as a new process
    gate = threading.Event()
    monkeypatch.setattr(blas, "_measure_queue", lambda real=blas._measure_queue: (gate.wait(10), real()))
    assert blas_threads.seconds("openblas", 8, 8, 8, False, False, threads=0) == 50.0  # the compile does not wait
    gate.set()
    assert blas.wait_for_measurements(10)
    assert blas_threads.seconds("openblas", 8, 8, 8, False, False, threads=0) == 1.2  # measured meanwhile
    assert blas_threads.seconds("openblas", 8, 8, 8, False, False, threads=1) == 2.0  # the faster of both


def test_unmeasured_thread_times_are_measured_in_the_background(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path) -> None:  # noqa: ANN001
    """A first compile does not wait for the two-core schedule's GEMM times: NotMeasured now
    (the schedule is decided without the worker), measured by the one background measurer for
    a later compile."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    _fresh_background(monkeypatch)
    monkeypatch.setattr(blas_threads, "_times", None)
    monkeypatch.setattr(blas_threads, "_retried", set())
    monkeypatch.setattr(blas_threads, "_measure", lambda *a: ({"t1": 2.0, "t0": 1.5}, False))
    params = ("openblas", 9, 9, 9, False, False)
    with pytest.raises(blas_threads.NotMeasured) as info:
        blas_threads.seconds(*params, threads=0)
    assert info.value.params == params
    assert blas.wait_for_measurements(10)
    assert blas_threads.is_measured([params]) and blas_threads.seconds(*params, threads=1) == 2.0
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    with pytest.raises(blas_threads.NotMeasured):
        blas_threads.seconds("openblas", 10, 10, 10, False, False, threads=0)


def test_real_measurement_returns_every_path() -> None:
    times, disturbed = blas._measure_all(blas._candidates(False), "f32", 16, 16, 16, False, False)
    assert set(times) == set(blas._candidates(False)) and all(t > 0 for t in times.values())
    assert isinstance(disturbed, bool)



def test_a_first_compile_decides_the_two_core_schedule_without_waiting(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path) -> None:  # noqa: ANN001
    """With no GEMM thread times cached, the schedule is off for now, says why, and names what
    a later compile waits for (Code.stale: compiled again once measured)."""
    import gir
    from gir.backend.cpu import snapshot
    from gir.backend.cpu.lower import lower_function
    from gir.config import current
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GIR_CPU_OVERLAP", raising=False)
    monkeypatch.setenv("GIR_CPU_SPLIT", "0")  # else the split schedule (team.py) takes the second core first
    _fresh_background(monkeypatch)
    monkeypatch.setattr(blas_threads, "_times", None)
    monkeypatch.setattr(blas, "_measure_queue", lambda: None)  # queued, never run here
    if blas.threads() < 2 or blas_threads.unavailable("openblas"):
        pytest.skip("the two-core schedule needs 2 BLAS threads")
    module = gir.parse((Path(__file__).parent.parent / "examples" / "rnn.gir").read_text())
    PassManager(DEFAULT_PIPELINE).run(module)
    f = module.functions["rnn_grads"]
    _, layout = lower_function(f, None, snapshot.schedule(f, None, current()))
    notes = layout.schedule["overlap"]
    assert notes and all(not n["used"] and "not measured yet" in n["why"] for n in notes), notes
    assert layout.schedule["overlap_pending"] and not layout.measured
    assert blas._queued  # what it needs is queued for the background measurer


@pytest.mark.parametrize(("ratio", "used"), [(0.85, False), (0.65, False), (0.45, True)],
                         ids=["1.18x", "1.54x", "2.2x"])
def test_the_two_core_schedule_needs_a_predicted_2x_gain(monkeypatch: pytest.MonkeyPatch, ratio: float,
                                                         used: bool) -> None:
    """schedule/overlap.py MARGIN: a predicted 1.18x or 1.54x gain leaves the schedule off (forced on, the S
    steps ran 1.5x slower on a quiet machine, rnn-S with a predicted 1.53x), 2.2x turns it on."""
    import dataclasses

    import gir
    from gir.backend.cpu.schedule import Measurements, op_ids
    from gir.backend.cpu.schedule import overlap as decide
    from gir.config import current
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    monkeypatch.setattr(decide, "estimate", lambda w, seconds: {"without_ms": 10.0, "with_ms": 10.0 * ratio})
    monkeypatch.setattr(decide, "main_threads", lambda *a: {"threads": "all", "why": "test"})
    module = gir.parse((Path(__file__).parent.parent / "examples" / "rnn.gir").read_text())
    PassManager(DEFAULT_PIPELINE).run(module)
    f = module.functions["rnn_grads"]
    measured = Measurements(False, {False: ("openblas",), True: ("openblas",)}, 2,
                            overlap_unavailable={"openblas": None})
    options = dataclasses.replace(current(), cpu_overlap="auto")
    kept, notes, _ = decide.plan(f, op_ids(f), "openblas", measured, options, False)
    assert bool(kept) == used and all(n["used"] == used for n in notes["overlap"])


def test_exit_stops_a_measurement_at_its_next_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit (quiet_timing.STOP, set by blas's atexit hook) a measurement stops after the round
    it is in, instead of holding process exit for up to a second; the background worker ends
    quietly and nothing is stored."""
    calls: list[str] = []

    def first_round_then_exit() -> float:
        calls.append("a")
        quiet_timing.STOP.set()
        return 1e-3

    try:
        with pytest.raises(quiet_timing.Stopped):
            quiet_timing.best_clean_rounds({"a": first_round_then_exit}, min_rounds=5, max_rounds=10)
        assert calls == ["a"]  # one round, not five
        quiet_timing.STOP.clear()
        stored: list[object] = []

        def task() -> None:  # as blas.measure_later's: measure, then store
            stored.append(quiet_timing.best_clean_rounds({"a": first_round_then_exit}))

        monkeypatch.setattr(blas, "_queue", [(("k",), task), (("never",), lambda: stored.append("never"))])
        blas._measure_queue()  # the task stops in its first round; Stopped does not escape the worker
        assert not stored and calls == ["a", "a"]
    finally:
        quiet_timing.STOP.clear()


class FakeClock:
    """A clock that a round advances by `step` and a sleep by its argument."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.slept = 0.0, step, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_rounds_grouped_by_pool_meet_at_the_same_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths of one provider run together and the providers' order rotates, so a measurement
    switches provider once per round (not twice), and each switch waits for the other pool to
    stop spinning: settle seconds after its last round, never at a round of the same pool."""
    monkeypatch.setattr(quiet_timing, "_last_pool", None)
    monkeypatch.setattr(quiet_timing, "involuntary_switches", lambda: 0)
    clock = FakeClock(0.001)
    ran: list[str] = []

    def round_(name: str):  # noqa: ANN202
        def run() -> float:
            ran.append(name)
            clock.now += clock.step
            return 1.0
        return run

    pools = {"mkl": "mkl", "mkl-packed": "mkl", "openblas": "openblas", "gir-packed": "openblas"}
    best, disturbed = quiet_timing.best_clean_rounds({n: round_(n) for n in ("mkl", "openblas", "mkl-packed",
                                                                             "gir-packed")},
                                                     budget=100.0, clock=clock, pools=pools, settle=0.25,
                                                     sleep=clock.sleep)
    assert not disturbed and len(ran) == 4 * 5
    pool_runs = [pools[n] for n in ran]
    switches = sum(a != b for a, b in zip(pool_runs, pool_runs[1:]))
    assert switches == 5  # one inside each of the 5 rounds, none between rounds
    assert all({pools[n] for n in ran[i:i + 2]} == {pool_runs[i]} for i in range(0, 20, 2))
    assert len(clock.slept) == switches and all(abs(s - 0.25) < 1e-9 for s in clock.slept)


def test_no_settle_without_pools_or_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet_timing, "_last_pool", ("mkl", 0.0))
    monkeypatch.setattr(quiet_timing, "involuntary_switches", lambda: 0)
    clock = FakeClock(0.001)
    quiet_timing.best_clean_rounds({"a": lambda: 1.0, "b": lambda: 1.0}, budget=100.0, clock=clock,
                                   pools={"a": "openblas", "b": "mkl"}, settle=0.0, sleep=clock.sleep)
    quiet_timing.best_clean_rounds({"a": lambda: 1.0}, budget=100.0, clock=clock, sleep=clock.sleep)
    assert clock.slept == []


def test_measurements_name_each_paths_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """blas's path measurement hands quiet_timing each path's provider, and the settle time
    where a pool has a second thread."""
    seen: dict = {}

    def fake(rounds, **kw):  # noqa: ANN001, ANN202
        seen.update(kw)
        return {name: 1e-3 for name in rounds}, False

    monkeypatch.setattr(quiet_timing, "best_clean_rounds", fake)
    monkeypatch.setattr(blas, "gemm_caller", lambda *a: (lambda: None))
    monkeypatch.setattr(blas, "threads", lambda: 2)
    blas._measure_all(["mkl", "openblas", "mkl-packed"], "f32", 4, 4, 4, False, False)
    assert seen["pools"] == {"mkl": "mkl", "openblas": "openblas", "mkl-packed": "mkl"}
    assert seen["settle"] == quiet_timing.SPIN


def test_two_core_schedule_not_decided_on_disturbed_thread_times() -> None:
    """Thread times that show the worker 10x faster, measured cleanly: the window runs with the
    worker. The same times marked disturbed (measured while another process had a core): it
    does not, the note says why, and nothing is pending (no recompile for them)."""
    import dataclasses

    import gir
    from gir.backend.cpu import overlap as windows
    from gir.backend.cpu.schedule import Measurements, op_ids
    from gir.backend.cpu.schedule import overlap as decide
    from gir.config import current
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    module = gir.parse((Path(__file__).parent.parent / "examples" / "rnn.gir").read_text())
    PassManager(DEFAULT_PIPELINE).run(module)
    f = module.functions["rnn_grads"]
    options = dataclasses.replace(current(), cpu_overlap="auto", gemm_measure="background")
    probe = decide.Times("openblas", Measurements(False, {False: ("openblas",), True: ("openblas",)}, 2))
    for w in windows.find_windows(f):
        try:
            decide.estimate(w, probe)
        except decide.NotMeasured:
            pass
    shapes = set(probe.asked)
    assert shapes
    times = {p: (1e-4, 1e-3) for p in shapes}  # 2 threads 10x slower than 1: the worker wins big
    base = dict(has_mkl=False, candidates={False: ("openblas",), True: ("openblas",)}, blas_threads=2,
                thread_times=times, overlap_unavailable={"openblas": None})
    kept, notes, _ = decide.plan(f, op_ids(f), "openblas", Measurements(**base), options, False)
    assert kept and all(n["used"] for n in notes["overlap"])
    disturbed = Measurements(**base, thread_disturbed=frozenset(shapes))
    kept, notes, _ = decide.plan(f, op_ids(f), "openblas", disturbed, options, False)
    assert not kept and "overlap_pending" not in notes
    assert all(not n["used"] and "disturbed" in n["why"] for n in notes["overlap"])
