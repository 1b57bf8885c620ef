"""The loop buffers (analysis/memory/loop_buffers.py): a scan's shifted stacks, double-buffered
carries and claimed concats live in exactly one place, the loop's own buffers, which the GPU's
memory plan (`memplan{views=strided}`) leaves out of the arena and the lowering allocates. Each
program runs against the interpreter (the oracle) in the arena and with a buffer per value,
eager and replayed as a CUDA graph, forward and reverse, nested; and the plan and the lowering
are checked to agree value by value.

Runs in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set already (as
tests/test_gpu_backend.py)."""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gir.analysis.memory.loop_buffers import CLAIMED_JOIN, LOOP_OWNED, place_loop
from gir.driver.jit import JitFunction
from gir.ir.core import Block
from gir.ir.loops import LoopView, as_loop
from gpu_support import device_or_skip

DEVICE = device_or_skip()

pytestmark = [pytest.mark.gpu]

SHIFTED = """\
func @s(%xs: tensor<4x2x3xf32>, %h0: tensor<2x3xf32>, %w: tensor<3x3xf32>)
    -> (tensor<4x2x3xf32>, STACKS tensor<4x2x6xf32>, tensor<2x3xf32>, tensor<2x3xf32>) {
  %z = constant 0.5 : tensor<2x3xf32>
  %h.1, %a.1, %hs, NS %cs = scan DIR(%x in %xs) carry (%h = %h0, %a = %z) {
    %m = matmul %h, %w : tensor<2x3xf32>
    %n = tanh(%m + %x)
    %b = %a * 0.5 + %n
    %p = %n * 2.0
    %q = %n - %x
    %c = concat %p, %q {axis = 1} : tensor<2x6xf32>
    yield (%n, %b) stack (%h, YN %c)
  } : tensor<2x3xf32>, tensor<2x3xf32>, tensor<4x2x3xf32>, STACKS tensor<4x2x6xf32>
  %o = exp(%a.1) + %h.1
  %k = %o * 3.0
  return %hs, NS %cs, %k, %a.1
}
"""
"""A BPTT forward in miniature: `stack (%h)` stacks the carry itself (shifted: one buffer of
T + 1 rows holds %hs and, with `stacked`, %ns a row apart; without, %h's next values go to the
buffer's other rows); %a double-buffered, its initial value a constant read in place; %c a
concat its kernels write in place (claimed), stacked; the final carries read after the loop by
kernels whose results the plan may place anywhere in the arena."""


def _shifted(direction: str, stacked: bool) -> str:
    with_n = {"STACKS": "tensor<4x2x3xf32>,", "NS": "%ns,", "YN": "%n,"}
    src = SHIFTED.replace("DIR", direction)
    for key, text in with_n.items():
        src = src.replace(key, text if stacked else "")
    return src


NESTED = """\
func @g(%xss: tensor<3x4x2x3xf32>, %h0: tensor<2x3xf32>, %w: tensor<3x3xf32>)
    -> (tensor<3x4x2x3xf32>, tensor<2x3xf32>, tensor<3x2x3xf32>) {
  %z = constant 0.25 : tensor<2x3xf32>
  %s.1, %hss, %as = scan (%xs in %xss) carry (%s = %h0) {
    %h.1, %a.1, %hs = scan reverse (%x in %xs) carry (%h = %s, %a = %z) {
      %m = matmul %h, %w : tensor<2x3xf32>
      %n = tanh(%m + %x)
      %b = %a + %n * %n
      yield (%n, %b) stack (%h)
    } : tensor<2x3xf32>, tensor<2x3xf32>, tensor<4x2x3xf32>
    %t = %h.1 * 0.5 + %a.1
    yield (%t) stack (%hs, %a.1)
  } : tensor<2x3xf32>, tensor<3x4x2x3xf32>, tensor<3x2x3xf32>
  return %hss, %s.1, %as
}
"""
"""The inner scan (reverse, shifted with its next values in the buffer's other rows, a
double-buffered carry) runs once per outer step in the same loop buffers; its stack and final
carries are read by the outer step (stacked, copied into the outer stacks) before the next
outer step overwrites them."""


def _outside_arena(fn: JitFunction, array: object) -> bool:
    low = fn.compiled.lowering
    lo, hi = low.extent(low.memory.arena)
    a_lo, a_hi = low.extent(array)
    return a_hi <= lo or hi <= a_lo


def _scans(block: Block) -> list[LoopView]:
    out = []
    for op in block:
        loop = as_loop(op)
        if loop is not None:
            out += [loop, *_scans(loop.body)]
    return out


def _check_agreement(fn: JitFunction) -> int:
    """The plan leaves out of the arena exactly the values the lowering keeps in the loops' own
    buffers or claimed concats, and the lowering keeps each of them outside the arena; returns
    how many there are."""
    low = fn.compiled.lowering
    plan = low.memory.plan
    assert plan is not None and plan.view_rules.loop_buffers
    loop_owned = {v for v, why in plan.why_external.items() if why in (LOOP_OWNED, CLAIMED_JOIN)}
    for v in loop_owned:
        assert v not in plan.slots
        assert v in low.static and _outside_arena(fn, low.static[v]), v
    for loop in _scans(low.function.body):
        place = place_loop(loop)
        for j in (*place.double_buffered, *place.shifted):
            c = loop.carries[j]
            assert {c.arg, c.yielded, c.result} <= loop_owned
        for a, k in place.shifted.values():
            assert {loop.stacked_results[i] for i in (a, k) if i is not None} <= loop_owned
    return len(loop_owned)


def _against_interpreter(source: str, entry: str, args: list[np.ndarray], arena: str,
                         monkeypatch: pytest.MonkeyPatch) -> JitFunction:
    """Eager, then replayed twice (new arguments each time), equal to the interpreter's results."""
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(source, entry, device="gpu")
    oracle = gir.jit(source, entry, device="interp")
    for call in range(3):
        scaled = [a * (1.0 + 0.5 * call) for a in args]
        for g, w in zip(fn(*scaled), oracle(*scaled)):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())),
                                       err_msg=f"call {call + 1}")
    assert fn.stats.graph == "replayed", fn.stats.graph
    return fn


@pytest.mark.parametrize("arena", ["1", "0"])
@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("direction", ["", "reverse "])
def test_shifted_double_buffered_and_claimed(direction: str, stacked: bool, arena: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    source = _shifted(direction, stacked)
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((4, 2, 3), (2, 3), (3, 3))]
    fn = _against_interpreter(source, "s", args, arena, monkeypatch)
    loop = _scans(fn.compiled.lowering.function.body)[0]
    place = place_loop(loop)
    assert place.shifted == {0: (0, 1 if stacked else None)} and place.double_buffered == {1}
    if arena == "1":
        assert _check_agreement(fn) >= 7  # h, n, h.1, a, b, a.1, hs (ns), the concat
    assert fn.stats.copies == 0, fn.stats


@pytest.mark.parametrize("arena", ["1", "0"])
def test_nested_loop_buffers(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(12)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4, 2, 3), (2, 3), (3, 3))]
    fn = _against_interpreter(NESTED, "g", args, arena, monkeypatch)
    if arena == "1":
        assert _check_agreement(fn) >= 6


@pytest.mark.parametrize("arena", ["1", "0"])
@pytest.mark.parametrize("model", ["rnn", "gru", "lstm", "peephole"])
def test_training_steps_with_loop_buffers(model: str, arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training steps (forward + BPTT) at T=5, batch 2, input 3, hidden 4, eager and replayed:
    the interpreter's results, the plan and the lowering agreeing on every loop buffer."""
    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    src = rnn.gir_source(model, 5, 2, 3, 4)
    p = rnn.make_inputs(model, 5, 2, 3, 4, 0)
    args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
    fn = _against_interpreter(src, f"{model}_grads", args, arena, monkeypatch)
    if arena == "1":
        assert _check_agreement(fn) > 0


def test_gpu_plan_of_a_training_step_reserves_no_loop_buffer() -> None:
    """Without the loop buffers (`memplan{views=strided}` made them: compare with a plan made
    with the strided views but without them) the LSTM's plan reserves arena slots for the
    values its loops keep in buffers of their own; with them it reserves none and is smaller."""
    import dataclasses

    from gir.analysis.memory.aliases import STRIDED
    from gir.analysis.memory.checker import check_plan
    from gir.analysis.memory.planner import plan_memory
    from rnn_cases import bench_module

    src = bench_module("rnn").gir_source("lstm", 5, 2, 3, 4)
    fn = gir.jit(src, "lstm_grads", device="gpu")
    p = bench_module("rnn").make_inputs("lstm", 5, 2, 3, 4, 0)
    fn(*[p["xs"]] + [p[n] for n in bench_module("rnn").param_names("lstm")])
    f = fn.compiled.lowering.function
    with_buffers = plan_memory(f, views=STRIDED)
    without = plan_memory(f, views=dataclasses.replace(STRIDED, name="strided-no-loops", loop_buffers=False))
    check_plan(with_buffers)
    check_plan(without)
    owned = {v for v, why in with_buffers.why_external.items() if why == LOOP_OWNED}
    assert owned and owned <= without.slots.keys() and not owned & with_buffers.slots.keys()
    assert with_buffers.arena_bytes < without.arena_bytes


def test_outside_bytes_are_the_loop_buffers() -> None:
    """plan.outside_bytes, by hand for SHIFTED (2x3 float32 rows of 24 bytes, T = 4): %a's two
    double buffers (48), the shifted buffer of T + 1 rows for %hs and %ns (120), the claimed
    concat %c (48); the plan's peak is the arena plus those."""
    fn = gir.jit(_shifted("", True), "s", device="gpu")
    plan = fn.compiled.memory.plan
    assert plan.outside_bytes == 48 + 120 + 48
    assert plan.peak_bytes == plan.arena_bytes + 216 == fn.stats.compile.planned_peak


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_memory_budget_on_the_gpu_bounds_the_gpus_plan(model: str) -> None:
    """gir.jit(..., device="gpu", memory_budget=...) budgets the plan the GPU lays its memory out
    by (`checkpoint{views=strided}`: the arena and the loops' buffers outside it, projected on
    fused IR), and the compiled function's memory fits: half the peak at T = 40, the
    interpreter's gradients. (Budgeted by the CPU's plan instead, the LSTM's came out 1-12 %
    over the budget.)"""
    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    src = rnn.gir_source(model, 40, 2, 4, 4)
    p = rnn.make_inputs(model, 40, 2, 4, 4, 0)
    args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
    base = gir.jit(src, f"{model}_grads", device="gpu")
    base(*args)
    peak = base.stats.compile.planned_peak
    assert peak and peak == base.compiled.memory.plan.peak_bytes
    budget = peak // 2
    fn = gir.jit(src, f"{model}_grads", device="gpu", memory_budget=budget)
    assert f"checkpoint{{budget={budget},views=strided}}" in fn.pipeline
    want = gir.jit(src, f"{model}_grads", device="interp")(*args)
    for g, w in zip(fn(*args), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))
    plan = fn.compiled.memory.plan
    assert fn.stats.compile.planned_peak == plan.peak_bytes <= budget
    assert fn.compiled.memory.arena_bytes + plan.outside_bytes <= budget
    (line,) = fn.stats.compile.checkpoints
    assert "scan of 40 steps: segment" in line, line
