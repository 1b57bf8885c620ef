"""The CPU backend's two-core schedule (backend/cpu/overlap.py) and in-place stacks.

The interpreter is the oracle: training steps of RNN, GRU, LSTM and two cells that are none
of them (a peephole LSTM, a two-layer GRU) compiled with the schedule forced on
(GIR_CPU_OVERLAP=1) give the interpreter's loss and gradients, again and again (the worker
thread runs at every call), and `fn.stats` says what ran.
"""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gir.testing import assert_all_close
from rnn_cases import bench_module, training_step


def _overlap_notes(fn) -> list:  # noqa: ANN001
    notes = fn.stats.schedule.get("overlap")
    return notes if isinstance(notes, list) else []


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_training_step_with_worker_matches_interpreter(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    src, args, want = training_step(model, 7, 3, 4, 5)
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")
    fn = gir.jit(src, f"{model}_grads")
    for _ in range(3):
        assert_all_close(fn(*args), want, what=model)
    notes = _overlap_notes(fn)
    if isinstance(fn.stats.schedule.get("overlap"), str):
        pytest.skip(f"two-core schedule unavailable here: {fn.stats.schedule['overlap']}")
    assert notes and all(n["used"] for n in notes), fn.stats.schedule
    assert notes[0]["deferred_gemms"] == 3  # dW (x), dU (h, steps 1..T-1) and dU (h0, step 0)
    # the deferred GEMMs ran as chunks on the worker: more GEMM calls than without it
    monkeypatch.setenv("GIR_CPU_OVERLAP", "0")
    off = gir.jit(src, f"{model}_grads")
    assert_all_close(off(*args), want, what=f"{model} without the worker")
    assert off.stats.schedule["overlap"] == "off: GIR_CPU_OVERLAP=0"
    assert fn.stats.gemm_calls > off.stats.gemm_calls


@pytest.mark.parametrize("model", ["peephole-lstm", "stacked-gru"])
def test_generic_cells_take_the_fast_paths(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = bench_module("generic_cell")
    src = cell.source(model, 6, 3, 4, 5)
    xs = cell.inputs(model, 6, 3, 4, 5)
    want = gir.jit(src, "grads", device="interp")(*xs)
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")
    fn = gir.jit(src, "grads")
    for _ in range(2):
        assert_all_close(fn(*xs), want, what=model)
    assert fn.stats.schedule["stack_copies_avoided"] > 0, fn.stats.schedule
    if isinstance(fn.stats.schedule.get("overlap"), str):
        pytest.skip(f"two-core schedule unavailable here: {fn.stats.schedule['overlap']}")
    assert all(n["used"] for n in _overlap_notes(fn)), fn.stats.schedule


def test_stacked_values_are_written_in_place() -> None:
    src = """
    func @f(%xs: tensor<4x3xf32>, %h0: tensor<3xf32>) -> (tensor<4x3xf32>, tensor<4x3xf32>, tensor<3xf32>) {
      %h = %h0
      for %x in %xs {
        %h = tanh(%x * %h + 1.0)
        %y = %h * 2.0
        collect %y into %ys
        collect %h into %hs
      }
      return %ys, %hs, %h
    }
    """
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    fn = gir.jit(src, "f")
    assert_all_close(fn(*args), gir.jit(src, "f", device="interp")(*args))
    sched = fn.stats.schedule
    assert sched["stack_copies_avoided"] >= 1, sched
