"""Background work (the GEMM measurer of blas.py / blas_threads.py, the -O3 compiles of tiers.py)
writes into the cache folder that was in use when it was queued, never into the one
GIR_CACHE_DIR names when it finishes; and a process's in-memory GEMM times belong to one folder.

Before, a measurement queued by one test and finished during the next wrote its times file into
the next test's cache folder (and the in-memory times of the first folder went with it), and an
-O3 compile finishing late stored its `compiled/` and `objects/` entries there: a test counting
the entries of its own folder saw one too many. Each test here holds the background work with an
event until GIR_CACHE_DIR has changed, so the order is forced, not left to chance.
"""

from __future__ import annotations

import threading
from pathlib import Path

import gir
import pytest
from gir.backend.cpu import blas, blas_threads, tiers


def _fresh_measurer(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(folder))
    monkeypatch.setenv("GIR_GEMM_MEASURE", "background")
    monkeypatch.setattr(blas, "_queue", [])
    monkeypatch.setattr(blas, "_queued", set())
    monkeypatch.setattr(blas, "_worker", None)
    monkeypatch.setattr(blas, "_choices", None)
    monkeypatch.setattr(blas, "_retried", set())
    monkeypatch.setattr(blas_threads, "_times", None)
    monkeypatch.setattr(blas_threads, "_retried", set())


def _slow(result: object, started: threading.Event, gate: threading.Event):  # noqa: ANN202
    """A measurement that starts, then waits for gate (the test changes folders meanwhile)."""
    def measure(*args: object) -> object:
        started.set()
        assert gate.wait(30)
        return result(args) if callable(result) else result
    return measure


def test_a_gemm_path_measurement_finishing_late_stores_into_its_own_folder(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _fresh_measurer(monkeypatch, first)
    started, gate = threading.Event(), threading.Event()
    monkeypatch.setattr(blas, "_measure_all", _slow(lambda a: ({p: 1.0 for p in a[0]}, False), started, gate))
    params = ("f32", 5, 6, 7, False, False, False)
    assert blas.path_times(*params) is None  # not measured
    blas.measure_later(params)  # queued for the background, as snapshot.schedule does
    assert started.wait(30)
    monkeypatch.setenv("GIR_CACHE_DIR", str(second))  # as the next test does
    gate.set()
    assert blas.wait_for_measurements(30)
    assert not list(second.glob("gemm-*")), "written into the folder current when it finished"
    assert blas.path_times(*params) is None  # the second folder's times: none measured there
    monkeypatch.setenv("GIR_CACHE_DIR", str(first))
    assert set(blas.path_times(*params).values()) == {1.0}  # type: ignore[union-attr]


def test_a_thread_time_measurement_finishing_late_stores_into_its_own_folder(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _fresh_measurer(monkeypatch, first)
    started, gate = threading.Event(), threading.Event()
    monkeypatch.setattr(blas_threads, "_measure", _slow(({"t1": 2.0, "t0": 1.5}, False), started, gate))
    params = ("openblas", 11, 12, 13, False, False)
    with pytest.raises(blas_threads.NotMeasured):
        blas_threads.seconds(*params, threads=0)
    assert started.wait(30)
    monkeypatch.setenv("GIR_CACHE_DIR", str(second))
    gate.set()
    assert blas.wait_for_measurements(30)
    assert not list(second.glob("gemm-*"))
    assert not blas_threads.is_measured([params])  # not in the second folder's times
    monkeypatch.setenv("GIR_CACHE_DIR", str(first))
    assert blas_threads.is_measured([params]) and blas_threads.seconds(*params, threads=1) == 2.0


def test_a_clean_thread_time_measurement_ends_the_provisional_count_on_disk(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    """A provisional (disturbed) entry measured again cleanly loses its DISTURBED count in the
    file too, not only in memory: a later process does not measure it again."""
    _fresh_measurer(monkeypatch, tmp_path)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    results = iter([({"t1": 2.0, "t0": 5.0}, True), ({"t1": 3.0, "t0": 1.0}, False)])
    monkeypatch.setattr(blas_threads, "_measure", lambda *a: next(results))
    params = ("openblas", 14, 14, 14, False, False)
    key = blas_threads._key(*params)
    blas_threads.seconds(*params, threads=0)
    path = blas_threads._cache_file()
    assert blas.read_times(path, blas.is_seconds)[f"{key} disturbed"] == 1.0
    blas_threads._measure_into(path, key, params)
    on_disk = blas.read_times(path, blas.is_seconds)
    assert f"{key} disturbed" not in on_disk and on_disk[f"{key} t0"] == 1.0 and on_disk[f"{key} t1"] == 2.0


def test_dropping_the_queue_forgets_what_was_queued(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`drop_queued_measurements` (tests/conftest.py calls it after every test): queued tasks
    never run, the running one ends, and a dropped shape may be queued again later."""
    _fresh_measurer(monkeypatch, tmp_path)
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []
    blas.measure_in_background(("a",), lambda: (started.set(), gate.wait(30), ran.append("a")))
    blas.measure_in_background(("b",), lambda: ran.append("b"))
    assert started.wait(30)
    threading.Timer(0.2, gate.set).start()
    assert blas.drop_queued_measurements(30)
    assert ran == ["a"] and ("b",) not in blas._queued
    blas.measure_in_background(("b",), lambda: ran.append("b"))
    assert blas.wait_for_measurements(30) and ran == ["a", "b"]


def test_a_task_queued_while_the_measurer_is_ending_still_runs(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The measurer found the queue empty (under the lock) and is returning, but is still alive:
    a task queued then gets a new worker instead of waiting for the next task to start one."""
    _fresh_measurer(monkeypatch, tmp_path)
    ending = threading.Event()
    dying = threading.Thread(target=ending.wait, args=(30,), daemon=True)  # alive, takes nothing more
    dying.start()
    monkeypatch.setattr(blas, "_worker", dying)
    monkeypatch.setattr(blas, "_worker_takes_more", False)
    ran = threading.Event()
    try:
        blas.measure_in_background(("late",), ran.set)
        assert ran.wait(30)
    finally:
        ending.set()


SOURCE = """\
func @isolated(%x: tensor<3x5xf32>, %w: tensor<5x2xf32>) -> tensor<3x2xf32> {
  return sigmoid(%x @ %w) - 0.25
}
"""


def test_a_background_llvm_compile_finishing_late_stores_into_its_own_folder(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("GIR_CACHE_DIR", str(first))
    monkeypatch.setenv("GIR_LLVM_TIER", "1")
    monkeypatch.delenv("GIR_LLVM_OPT", raising=False)
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    gate = threading.Event()
    blocker = tiers.submit(tiers.FinalCompile(lambda: gate.wait(30)))  # holds the queue
    try:
        fn = gir.jit(SOURCE, "isolated")  # quick code now; its -O3 compile waits behind blocker
        assert fn.compiled.code.info.tier == "quick"
        monkeypatch.setenv("GIR_CACHE_DIR", str(second))
    finally:
        gate.set()
    assert blocker.wait(30) and tiers.wait_all(120)
    assert not list(second.rglob("*.entry")), "stored into the folder current when it finished"
    assert list((first / "objects").glob("*.entry")) and list((first / "compiled").glob("*.entry"))
    monkeypatch.setenv("GIR_CACHE_DIR", str(first))
    assert gir.jit(SOURCE, "isolated").compiled.code.info.from_cache == "compiled"


def test_waiting_for_measurements_covers_a_worker_started_meanwhile(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """The measurer's worker ends when its queue is empty; a task queued just then starts a new
    worker. A wait that joined the old one returned True while the new one ran."""
    _fresh_measurer(monkeypatch, tmp_path)
    first_gate, second_gate, ran = threading.Event(), threading.Event(), []
    blas.measure_in_background(("first",), lambda: (first_gate.wait(30), ran.append("first")))
    old = blas._worker
    assert old is not None  # alive until first_gate: the wait below finds it running
    real_join = old.join

    def join_then_hand_over(timeout: float | None = None) -> None:
        first_gate.set()
        real_join()  # the old worker found the queue empty and ended
        blas.measure_in_background(("second",), lambda: (second_gate.wait(30), ran.append("second")))
        assert blas._worker is not old  # a new worker runs the new task
        threading.Timer(0.2, second_gate.set).start()

    old.join = join_then_hand_over  # type: ignore[method-assign]
    assert blas.wait_for_measurements(30)
    assert ran == ["first", "second"]


def test_a_failing_measurement_does_not_end_the_measurer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A task that raises leaves its shape unmeasured; the tasks queued behind it still run and
    the wait for them returns (it waited forever on a worker that had died with tasks queued)."""
    _fresh_measurer(monkeypatch, tmp_path)
    gate, ran = threading.Event(), []

    def fails() -> None:
        assert gate.wait(30)
        raise RuntimeError("a BLAS path that cannot be measured here")

    blas.measure_in_background(("fails",), fails)
    blas.measure_in_background(("after",), lambda: ran.append("after"))
    gate.set()
    assert blas.wait_for_measurements(30)
    assert ran == ["after"]
