"""Tiered compilation when the -O3 code is lowered again (backend/cpu/llvm_jit.compile_code):
the quick code leaves `gir-packed` GEMMs out (BLAS paths), the final code takes them, so the two
codes have different layouts (pinned area, GEMM paths, externals, schedule). Everything that
reports on or runs "the code" must follow the code calls run: results (the interpreter's),
run-time errors (their numbering is the layout's), `fn.stats` (its counters, `schedule` and
`.compile`), calls from several threads across the swap, and the two-core schedule.

Every test forces the model's path choice (GIR_GEMM_MEASURE=off) in a fresh cache folder, so
the loop-invariant weights' GEMMs take gir-packed in the final code and a BLAS path in the
quick code.
"""

from __future__ import annotations

import itertools
import threading
import time

import gir
import numpy as np
import pytest
from gir.backend.cpu import tiers
from gir.backend.cpu.runtime import has_worker
from gir.testing import assert_all_close
from rnn_cases import training_step
from test_concurrency import Size

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def _tiered_with_model_paths(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    monkeypatch.setenv("GIR_LLVM_TIER", "1")
    for name in ("GIR_LLVM_OPT", "GIR_GEMM_PATH", "GIR_CPU_OVERLAP", "GIR_CPU_SPLIT"):
        monkeypatch.delenv(name, raising=False)
    yield
    assert tiers.wait_all(60)  # no job of this test runs on under the next test's environment


def _relowered(fn: gir.JitFunction) -> None:
    """Skips unless fn runs quick code that left gir-packed to the final code."""
    if fn.stats.compile.cache != "miss" or fn.compiled.tier != "quick":
        pytest.skip("not a tiered compile")
    if "quick_tier" not in fn.stats.schedule:
        pytest.skip("the model chose no gir-packed GEMM here")


def _swapped(fn: gir.JitFunction) -> None:
    assert tiers.wait_all(60)
    assert fn.compiled.wait_for_final_code(60), fn.compiled.final_error
    assert fn.compiled.tier == "final"


def test_compile_stats_follow_the_final_code() -> None:
    """After the swap, `fn.stats.compile` (its GEMM list, as `describe()` prints it) names the
    paths of the code that ran, as `fn.stats.gemm_paths` does."""
    src, args, want = training_step("gru", 5, 6, 4, 12)
    fn = gir.jit(src, "gru_grads")
    assert_all_close(fn(*args), want, what="quick code")
    _relowered(fn)

    def paths(stats: object) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in stats.compile.gemms:  # type: ignore[attr-defined]
            out[g.path] = out.get(g.path, 0) + 1
        return out

    assert paths(fn.stats) == fn.stats.gemm_paths, (paths(fn.stats), fn.stats.gemm_paths)
    _swapped(fn)
    assert_all_close(fn(*args), want, what="-O3 code")
    assert fn.stats.gemm_paths.get("gir-packed", 0) > 0, fn.stats.gemm_paths
    assert fn.stats.compile.tier == "final"
    assert paths(fn.stats) == fn.stats.gemm_paths, (paths(fn.stats), fn.stats.gemm_paths)
    assert "gir-packed" in fn.stats.compile.describe()


RNN_STEP = Size(steps=6, batch=8, hidden=16, threads=1, calls=1).source()
"""test_concurrency.py's RNN training step with an integer division (a zero divisor raises)."""


def _rnn_inputs(seed: int, zero_divisor: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    n = rng.integers(-1000, 1000, 8).astype(np.int32)
    d = rng.integers(1, 9, 8).astype(np.int32)
    if zero_divisor:
        d[seed % 8] = 0
    return [f32(6, 8, 16), f32(8, 16), f32(16, 16), f32(16, 16), f32(16), n, d]


def test_division_by_zero_from_quick_and_final_code() -> None:
    """The run-time error of either code is its own layout's message, at the division."""
    fn = gir.jit(RNN_STEP, "train_step")
    interp = gir.jit(RNN_STEP, "train_step", device="interp")
    good, bad = _rnn_inputs(1, False), _rnn_inputs(2, True)
    assert_all_close(fn(*good), interp(*good), what="quick code")
    _relowered(fn)
    for tier in ("quick", "final"):
        with pytest.raises(gir.GirError, match="integer division by zero at run time") as e:
            fn(*bad)
        assert e.value.loc is not None and "%n / %d" in RNN_STEP.splitlines()[e.value.loc.line - 1], e.value.loc
        assert fn.compiled.tier == tier
        if tier == "quick":
            _swapped(fn)
    assert_all_close(fn(*good), interp(*good), what="-O3 code")
    assert fn.stats.gemm_paths.get("gir-packed", 0) > 0, fn.stats.gemm_paths


def test_calls_from_threads_across_the_swap() -> None:
    """Threads call the function from the quick code's first call until well after the swap:
    every result is the interpreter's, every zero divisor raises in its own thread, and each
    thread's workspace follows the code it runs (the final code's pinned area is larger)."""
    fn = gir.jit(RNN_STEP, "train_step")
    interp = gir.jit(RNN_STEP, "train_step", device="interp")
    cases = [(_rnn_inputs(s, s % 5 == 4), s % 5 == 4) for s in range(10)]
    want = [None if bad else interp(*args) for args, bad in cases]
    fn(*cases[0][0])
    _relowered(fn)
    wrong: list[str] = []
    tiers_seen: set[str] = set()
    barrier = threading.Barrier(4)

    def worker(t: int) -> None:
        barrier.wait()
        after = 0
        deadline = time.monotonic() + 120  # calls go on until the -O3 code came (slow on a loaded machine)
        for c in itertools.count():
            if time.monotonic() > deadline:
                return
            i = (t + c) % len(cases)
            tier = fn.compiled.tier
            try:
                got = fn(*cases[i][0])
            except gir.GirError as e:
                if not (cases[i][1] and "integer division by zero" in e.message):
                    wrong.append(f"thread {t} call {c}: {e.message}")
                continue
            if cases[i][1]:
                wrong.append(f"thread {t} call {c}: no error")
                continue
            try:
                assert_all_close(got, want[i], what=f"thread {t} call {c} ({tier})")
            except AssertionError as e:
                wrong.append(str(e).splitlines()[0])
            tiers_seen.add(tier)
            after += tier == "final"
            if after >= 10:
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not wrong, "\n".join(wrong[:10])
    _swapped(fn)
    assert "final" in tiers_seen
    assert fn.compiled.workspace().fits(fn.compiled.layout)


@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_two_core_schedule_with_the_relowered_code(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIR_CPU_OVERLAP=1: the quick and the final code (each lowered with its own two-core
    schedule, gir_worker included) give the interpreter's results."""
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")
    src, args, want = training_step(model, 5, 6, 4, 12)
    fn = gir.jit(src, f"{model}_grads")
    assert_all_close(fn(*args), want, what="quick code")
    _relowered(fn)
    quick = fn.stats.schedule.get("overlap")
    _swapped(fn)
    for _ in range(3):
        assert_all_close(fn(*args), want, what="-O3 code")
    assert fn.stats.gemm_paths.get("gir-packed", 0) > 0, fn.stats.gemm_paths
    assert fn.stats.compile.tier == "final"
    assert quick is not None and fn.stats.schedule.get("overlap") is not None
    assert has_worker(fn.compiled.layout), fn.stats.schedule.get("overlap")  # the final code's gir_worker ran


def test_final_code_is_lowered_under_the_compiles_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A switch changed after `gir.jit` returned (here GIR_PACKED_GEMM=0, while an earlier job
    still holds the background thread) must not change the code cached under the key of the
    environment the function was compiled in. (Before: the job lowered the final code under
    GIR_PACKED_GEMM=0 and both caches stored it under the default environment's key: the next
    compile there was a hit without gir-packed.) Now the job makes no code; the quick code
    keeps running and `final_error` says why."""
    release = threading.Event()
    blocker = tiers.submit(tiers.FinalCompile(lambda: release.wait(30)))
    try:
        src, args, want = training_step("gru", 5, 6, 4, 12)
        fn = gir.jit(src, "gru_grads")
        assert_all_close(fn(*args), want, what="quick code")
        _relowered(fn)
        monkeypatch.setenv("GIR_PACKED_GEMM", "0")  # for what this process compiles next
    finally:
        release.set()
    assert blocker.wait(30) and tiers.wait_all(60)
    assert_all_close(fn(*args), want, what="after the job")
    if fn.compiled.tier == "final":
        assert fn.stats.gemm_paths.get("gir-packed", 0) > 0, fn.stats.gemm_paths
    else:
        assert "changed" in str(fn.compiled.final_error), fn.compiled.final_error
    monkeypatch.delenv("GIR_PACKED_GEMM")
    again = gir.jit(src, "gru_grads")  # what the caches hold under the first compile's key
    assert_all_close(again(*args), want, what="compiled again")
    if again.compiled.tier == "quick":
        _swapped(again)
        assert_all_close(again(*args), want, what="compiled again, -O3 code")
    assert again.stats.gemm_paths.get("gir-packed", 0) > 0, (again.stats.compile.cache, again.stats.gemm_paths)


def test_store_when_final_reads_the_code_once() -> None:
    """compile_cache.store_when_final with the swap landing between its reads of `compiled.code`
    (the first the quick code, the next the final code, whose `final` is None): it registers
    the store with the quick code's job (before: `tiers.add_key(None, key)`, an AttributeError
    out of gir.jit)."""
    from types import SimpleNamespace

    from gir.driver import compile_cache

    job = tiers.FinalCompile(lambda: None)
    quick, final = SimpleNamespace(final=job), SimpleNamespace(final=None)
    later: list[object] = []

    class Swapping:
        reads = 0

        @property
        def code(self) -> SimpleNamespace:
            self.reads += 1
            return quick if self.reads == 1 else final

        def when_final(self, callback: object) -> None:
            later.append(callback)

    compile_cache.store_when_final("review2-key", Swapping())
    assert tiers._pending_keys.get("review2-key") is job and len(later) == 1
    job.cancel()
    assert "review2-key" not in tiers._pending_keys
