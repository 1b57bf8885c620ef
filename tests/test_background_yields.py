"""Background work that yields to the program, timing that decides on a busy machine, and a
two-core schedule that degrades gracefully (issue 28; backend/cpu/tiers.py, quiet_timing.py,
blas.py's measurer, codegen._Worker).

Every case forces its order with hooks and events or a fake clock, never with a sleep race:
- a new shape's quick compile returns while another shape's -O3 job is held mid-compile (its
  process started, its output not read), and that job holds no LLVM lock of this process;
- a measurement waits while a compiled call is in flight, gives up at its budget, and then the
  model decides, stored so the next compile takes the same decision;
- the two-core schedule's calling thread runs the chunks a delayed worker has not claimed, and
  the call returns while the worker is still held.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.cpu import blas, llvm_exit, quiet_timing, runtime, tiers
from gir.ir.interpreter import random_inputs
from gir.testing import assert_all_close
from rnn_cases import training_step

RNN = """\
func @loss(%xs: tensor<{t}x4x8xf32>, %h0: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<f32> {{
  %h = %h0
  %l = constant 0.0 : tensor<f32>
  for %x in %xs {{
    %h = tanh(%x @ %w + %h @ %w)
    %l = %l + sum(%h * %h)
  }}
  return %l
}}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GIR_LLVM_OPT", raising=False)
    monkeypatch.setenv("GIR_LLVM_TIER", "1")
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    return tmp_path / "cache"


def test_a_quick_compile_never_waits_behind_another_shapes_final_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    started, gate = threading.Event(), threading.Event()
    held: list[object] = []

    def hold(child: object) -> None:  # the first job: its process runs, its output waits
        held.append(child)
        started.set()
        assert gate.wait(120)

    monkeypatch.setattr(tiers, "child_hook", hold)
    try:
        first = gir.jit(RNN.format(t=6), "loss")
        assert started.wait(120), "the -O3 job never started"
        job = first.compiled._final
        monkeypatch.setattr(tiers, "child_hook", None)  # the second shape's job is not held
        lock = llvm_exit.llvm_lock()
        assert lock is not None and lock.acquire(blocking=False), "the -O3 job holds the LLVM lock"
        lock.release()
        second = gir.jit(RNN.format(t=7), "loss")  # compiles quick code while the first job is held
        args = random_inputs(second.signature, 0)
        assert second.compiled.tier == "quick" and not job.done.is_set()
        assert_all_close(second(*args), gir.jit(RNN.format(t=7), "loss", device="interp")(*args))
    finally:
        gate.set()
    assert first.compiled.wait_for_final_code(300) and first.compiled.tier == "final"


_real_wait = quiet_timing.wait_until_no_calls


class FakeClock:
    """A clock that moves only when rounds run (each round costs `step` seconds)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def test_a_measurement_waits_while_a_call_runs_then_decides_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(0.1)
    ran: list[str] = []
    monkeypatch.setattr(quiet_timing, "SLICE", 0.001)

    def sleep(seconds: float) -> None:  # a slice: time passes, the call goes on
        clock.now += 0.5

    monkeypatch.setattr(quiet_timing, "wait_until_no_calls",
                        lambda deadline, clock: _real_wait(deadline, clock, sleep))
    with quiet_timing.running_call():
        with pytest.raises(quiet_timing.Unmeasured):
            quiet_timing.best_clean_rounds({"a": lambda: ran.append("a") or 1.0}, budget=2.0, clock=clock)
    assert not ran, "a round ran while a compiled call was in flight"
    assert quiet_timing.calls_in_flight() == 0


def test_noisy_rounds_are_decided_within_the_budget_the_same_way_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round disturbed (a busy machine): after the budget the best disturbed times decide,
    marked disturbed; the same timings give the same decision."""
    def decide() -> tuple[dict[str, float], bool]:
        clock = FakeClock(0.3)
        switches = iter(range(0, 10_000, 10))  # every round sees 10 involuntary switches
        monkeypatch.setattr(quiet_timing, "involuntary_switches", lambda: next(switches))
        noise = iter([3.0, 1.0, 2.5, 1.2, 2.0, 0.9, 4.0, 1.1] * 10)

        def round_(_: str) -> float:
            clock.now += clock.step
            return next(noise)
        return quiet_timing.best_clean_rounds({"x": lambda: round_("x"), "y": lambda: round_("y")},
                                              min_rounds=5, max_rounds=100, budget=2.0, clock=clock)
    first = decide()
    # 0.3 s a round of the 2.0 s budget: x gets 3.0, 2.5, 2.0, 4.0 and y 1.0, 1.2, 0.9
    assert first == ({"x": 2.0, "y": 0.9}, True)
    assert decide() == first


def test_unmeasured_paths_store_the_model_and_a_later_measurement_replaces_it(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "m"))
    monkeypatch.setattr(blas, "_choices", None)
    monkeypatch.setattr(blas, "_retried", set())
    params = ("f32", 9, 10, 11, False, False, False)

    def busy(*args: object) -> object:
        raise quiet_timing.Unmeasured(["openblas"])

    monkeypatch.setattr(blas, "_measure_all", busy)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    model = blas.model_times(*params)
    assert blas.path_times(*params) == model  # decided (by the model), not left undecided
    entry = blas._load_choices()[blas._key(*params)]
    assert entry[quiet_timing.MODEL] == 1.0 and entry[quiet_timing.DISTURBED] == 1.0
    measured = {p: 1.0 for p in model}
    merged = quiet_timing.merge(entry, measured, False)
    assert merged == measured, "a model's times mixed into measured ones"


def test_the_calling_thread_takes_the_chunks_a_delayed_worker_has_not_claimed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    src, args, want = training_step("gru", 7, 3, 4, 5)
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")
    monkeypatch.setenv("GIR_CPU_SPLIT", "0")
    fn = gir.jit(src, "gru_grads")
    gate = threading.Event()
    monkeypatch.setattr(runtime, "worker_hook", lambda: gate.wait(120))  # the second core is busy
    try:
        got = fn(*args)  # returns without the worker: it has not started
        if isinstance(fn.stats.schedule.get("overlap"), str):
            pytest.skip(f"two-core schedule unavailable here: {fn.stats.schedule['overlap']}")
        assert not gate.is_set()
        assert fn.stats.worker_chunks == 0
        assert_all_close(got, want, what="gru, every chunk on the calling thread")
    finally:
        gate.set()
    monkeypatch.setattr(runtime, "worker_hook", None)
    for _ in range(3):  # the late worker claims nothing; then the worker runs again as usual
        assert_all_close(fn(*args), want, what="gru after a late worker")
        assert 0 <= fn.stats.worker_chunks


def test_a_slow_call_says_what_competed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_LLVM_TIER", "0")
    monkeypatch.setattr(runtime, "SLOW_FLOOR", 0.0)  # a call of microseconds counts here
    fn = gir.jit(RNN.format(t=6), "loss").compiled
    args = random_inputs(fn.function, 0)
    fn(*args)
    info = fn.code.info
    fn._quiet[id(info)] = 1e-9  # as if an earlier call had been far faster
    with quiet_timing.background("GEMM measurement (test)"):
        fn(*args)
        assert fn.stats.background == ["GEMM measurement (test)"]  # pending now
    stats = fn.stats
    assert stats.slower_because and "GEMM measurement (test)" in stats.slower_because
    assert "competing: " in stats.slow_note() and stats.background == []
    fn._quiet[id(info)] = 10.0  # a quiet time far above: not slow
    fn(*args)
    assert not fn.stats.slower_because and fn.stats.slow_note() == ""
    assert np.isfinite(fn(*args)[0]).all()


SPLIT = """
func @f(%xs: tensor<5x33x64xf32>, %h0: tensor<33x64xf32>, %b: tensor<64xf32>)
    -> (tensor<5x33x64xf32>, tensor<33x64xf32>) {
  %h = %h0
  for %x in %xs {
    %h = tanh(%x * %h + %b) * 0.5 + %h * 0.25
    collect %h into %hs
  }
  return %hs, %h
}
"""


def test_the_calling_thread_takes_the_blocks_a_late_pool_thread_has_not_claimed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS's pool thread, held (as a busy core would) until the calling thread has claimed
    every block of the loop: the calling thread runs them all, and the call ends. With the
    halves fixed as before, the hook would wait for blocks nobody claims, and the call with it."""
    import ctypes

    from gir.backend.cpu import team

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 33, 64), (33, 64), (64,))]
    want = gir.jit(SPLIT, "f", device="interp")(*args)
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    fn = gir.jit(SPLIT, "f")
    assert_all_close(fn(*args), want, what="split")
    if not isinstance(fn.stats.schedule.get("split"), list) or team.cpu_number() < 2:
        pytest.skip(f"split schedule unavailable here: {fn.stats.schedule.get('split')}")
    blocks = -(-33 // -(-33 // team.BLOCKS))
    timed_out: list[bool] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def hold(claim: int) -> None:  # until the caller has claimed every block (bounded: no hang)
        word = ctypes.c_int64.from_address(claim)
        for _ in range(200_000):
            if word.value >= blocks:
                return
            threading.Event().wait(0.0001)
        timed_out.append(True)

    team.set_pool_hook(hold)
    try:
        got = fn(*args)
    finally:
        team.set_pool_hook(None)
    assert not timed_out, "the calling thread left blocks to the held pool thread"
    assert_all_close(got, want, what="split, the pool thread held")
    caller, pool = fn.stats.split_blocks
    assert pool == 0 and caller == 5 * blocks  # every block of the 5 steps' loop on the calling thread
    assert_all_close(fn(*args), want, what="split again")
    assert sum(fn.stats.split_blocks) == 5 * blocks


def test_without_a_process_the_final_code_is_compiled_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no process can be started (an embedded interpreter), the -O3 job compiles in
    this process as before: the same final code."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("no interpreter to start")

    monkeypatch.setenv("GIR_CACHE", "0")
    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "Popen", refuse)
        here = gir.jit(RNN.format(t=5), "loss")
        assert here.compiled.wait_for_final_code(300), here.compiled.final_error
    monkeypatch.setenv("GIR_LLVM_TIER", "0")
    once = gir.jit(RNN.format(t=5), "loss")
    assert here.compiled.code.obj == once.compiled.code.obj


def test_the_governor_goes_to_one_thread_under_load_and_back_when_quiet() -> None:
    from gir.backend.cpu.blas_threads import Governor

    g = Governor()
    for _ in range(5):  # quiet: 10 ms, no switches
        assert not g.use_one_thread()
        g.record(0.010, 0, False)
    for seconds, switches in [(0.05, 3), (0.05, 4), (0.05, 0)]:  # two strikes, then a slow call that kept its core
        g.record(seconds, switches, False)
    assert not g.one_thread
    for _ in range(Governor.STRIKES):  # three slow calls in a row, each losing its core
        assert not g.use_one_thread()
        g.record(0.2, 5, False)
    assert g.one_thread and "one thread" in g.describe()
    ran = [g.use_one_thread() for _ in range(Governor.PROBE)]
    assert ran[:-1] == [True] * (Governor.PROBE - 1) and ran[-1] is False  # a probe on all threads
    for _ in range(Governor.KEEP):
        g.record(0.030, 1, True)
    g.record(0.2, 5, False)  # the probe, still slow: stays on one thread
    assert g.one_thread
    for _ in range(Governor.PROBE - 1):
        assert g.use_one_thread()
    assert not g.use_one_thread()
    g.record(0.012, 0, False)  # the probe, quiet again: faster than the one-thread median
    assert not g.one_thread and not g.use_one_thread()


def test_a_process_started_on_a_busy_machine_finds_one_thread_faster() -> None:
    """No quiet all-thread call to be slower than: the probe on one thread at call FIRST_PROBE
    decides (beside two busy processes LSTM-S took 265 ms on 2 threads, 53 ms on one)."""
    from gir.backend.cpu.blas_threads import Governor

    g = Governor()
    ran = []
    for _ in range(Governor.FIRST_PROBE - 1):  # slow from the start: never 2x its own best
        ran.append(g.use_one_thread())
        g.record(0.265, 4, False)
    assert ran == [False] * (Governor.FIRST_PROBE - 1) and not g.one_thread
    assert g.use_one_thread()  # the probe on one thread
    g.record(0.053, 1, True)
    assert g.one_thread and g.switches_to_one == 1

    quiet = Governor()
    for _ in range(Governor.FIRST_PROBE - 1):
        quiet.use_one_thread()
        quiet.record(0.016, 0, False)
    assert quiet.use_one_thread()
    quiet.record(0.0158, 0, True)  # one thread a little faster, not 2x: stays on all threads
    assert not quiet.one_thread
    probes = [quiet.use_one_thread() for _ in range(Governor.PROBE)]
    assert probes == [False] * (Governor.PROBE - 1) + [True]  # the next probe, PROBE calls later


def test_a_call_on_one_thread_runs_every_chunk_without_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from gir.backend.cpu import blas_threads

    src, args, want = training_step("lstm", 6, 3, 4, 5)
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")
    monkeypatch.setenv("GIR_CPU_SPLIT", "0")
    fn = gir.jit(src, "lstm_grads")
    assert_all_close(fn(*args), want, what="lstm")
    if isinstance(fn.stats.schedule.get("overlap"), str) or fn.compiled.governor is None:
        pytest.skip(f"two-core schedule unavailable here: {fn.stats.schedule.get('overlap')}")
    one = fn.compiled._setter(fn.compiled.layout)
    if one is None:
        pytest.skip("no per-thread BLAS setter here")
    threads = one.enter()  # the setting before, as the call sees it
    one.leave(threads)
    started: list[bool] = []
    monkeypatch.setattr(runtime, "worker_hook", lambda: started.append(True))
    monkeypatch.setattr(fn.compiled.governor, "use_one_thread", lambda: True)
    for _ in range(2):
        assert_all_close(fn(*args), want, what="lstm on one thread")
        assert fn.stats.worker_chunks == 0
    assert not started, "the worker ran on a call set to one thread"
    after = one.enter()
    one.leave(after)
    assert after == threads, "the BLAS thread setting was not restored"
    assert isinstance(blas_threads.Governor().describe(), str)


def test_one_thread_from_two_threads_restores_a_process_wide_setting() -> None:
    """OpenBLAS's setter is process-wide: calls overlapping from two threads, ending in either
    order, leave the setting as it was (the first saves and sets, the last restores)."""
    from gir.backend.cpu.blas_threads import OneThread

    setting = [2]

    def set_threads(n: int) -> int:
        before, setting[0] = setting[0], n
        return before

    one = OneThread(set_threads, process_wide=True)
    a = one.enter()
    b = one.enter()
    assert setting == [1]
    one.leave(a)
    assert setting == [1], "restored while another call still runs on one thread"
    one.leave(b)
    assert setting == [2]
    local = OneThread(set_threads, process_wide=False)
    token = local.enter()
    assert setting == [1] and token == 2
    local.leave(token)
    assert setting == [2]
