"""device="auto": a placed function runs split between the CPU backend and the GPU backend
(backend/split.py), and the compile modes (passes/pipeline.py MODES).

In the CUDA simulator unless NUMBA_ENABLE_CUDASIM is set (as tests/test_gpu_backend.py), with
tiny shapes and `min-elements=1`, so `place` puts small ops on the GPU too. What is checked:
results equal the interpreter's (the oracle) under both policies; the transfers a call executes
(`fn.stats`) are the ones the placement report counts; on a linear RNN, Theano's GraphToGPU
checks hold on the executed program (every input transferred once, nothing per step, one back).
"""

from __future__ import annotations

from pathlib import Path

import gir
import gir.cli
import gir.passes.pipeline
import numpy as np
import pytest
from gir.backend.split import Segment, SplitFunction
from gir.driver.jit import JitFunction
from gir.ir.interpreter import random_inputs
from gir.passes.pipeline import MODES, get_mode
from gir.testing import assert_all_close
from gpu_support import device_or_skip

device_or_skip()

pytestmark = [pytest.mark.gpu]

REPO = Path(__file__).resolve().parent.parent


def pipeline(policy: str, mode: str = "fast-run") -> str:
    """The mode's pipeline for device="auto" with `policy`, and small ops placed on the GPU too."""
    m = get_mode(mode)
    text = m.pipeline("auto")
    assert f"place{{policy={m.policy}}}" in text
    return text.replace(f"place{{policy={m.policy}}}", f"place{{policy={policy},min-elements=1}}")


def run_split(source: str, entry: str, policy: str, args: list[np.ndarray] | None = None,
              mode: str = "fast-run") -> tuple[JitFunction, SplitFunction]:
    """@entry with device="auto": asserts it equals the interpreter and executed exactly the
    transfers its placement report counts; returns the function and its split."""
    if args is None:
        args = random_inputs(gir.parse(source).functions[entry], 0)
    want = gir.jit(source, entry, device="interp")(*args)
    fn = gir.jit(source, entry, device="auto", pipeline=pipeline(policy, mode))
    got = fn(*args)
    assert_all_close(got, want, rtol=1e-5)
    split = fn.compiled
    assert isinstance(split, SplitFunction)
    assert split.placement.transfer_counts() == fn.stats.transfers, (split.describe(), fn.stats)
    return fn, split


def devices(split: SplitFunction) -> list[str]:
    return [s.name for s in split.schedule if isinstance(s, Segment)]


# ---------------------------------------------------------------------------------------------
# The policies, where they differ (docs/placement.md's graph)


ISLAND = """\
func @f(%x: tensor<4x4xf32>, %y: tensor<4x4xf32>, %w: tensor<4x4xf32>)
    -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %e = exp %x : tensor<4x4xf32>
  %island = add %e, %y : tensor<4x4xf32>
  %m = matmul %x, %w : tensor<4x4xf32>
  %t = tanh %m : tensor<4x4xf32>
  return %island, %t
}
"""


def test_island_lift_runs_it_on_the_cpu() -> None:
    fn, split = run_split(ISLAND, "f", "lift")
    assert devices(split) == ["cpu0", "gpu1"]
    assert fn.stats.transfers == {"h2d": 2, "d2h": 1}  # %x, %w in; %t out
    assert fn.stats.h2d_bytes == 2 * 64 and fn.stats.d2h_bytes == 64
    assert fn.stats.gemm_calls == 1 and fn.stats.kernel_launches == 1  # tanh; exp+add ran natively


def test_island_aggressive_runs_everything_on_the_gpu() -> None:
    fn, split = run_split(ISLAND, "f", "aggressive")
    assert devices(split) == ["gpu1"]
    assert fn.stats.transfers == {"h2d": 3, "d2h": 2}  # %x, %y, %w in; %island, %t out
    assert fn.stats.kernel_launches == 2


def test_counts_are_per_call() -> None:
    fn, _ = run_split(ISLAND, "f", "lift")
    args = random_inputs(gir.parse(ISLAND).functions["f"], 1)
    for _ in range(2):
        fn(*args)
        assert fn.stats.transfers == {"h2d": 2, "d2h": 1}


# ---------------------------------------------------------------------------------------------
# Segments: ASAP stages, values passed between segments of one device


PINNED = """\
func @f(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %a = matmul %x, %w {device = "gpu"} : tensor<4x4xf32>
  %b = exp %a {device = "cpu"} : tensor<4x4xf32>
  %c = matmul %b, %w {device = "gpu"} : tensor<4x4xf32>
  %d = add %c, %a {device = "gpu"} : tensor<4x4xf32>
  %e = matmul %w, %x {device = "cpu"} : tensor<4x4xf32>
  %f = add %d, %e {device = "cpu"} : tensor<4x4xf32>
  return %f
}
"""


def test_alternating_segments_in_asap_order() -> None:
    """Written cpu/gpu five times over; `%e` depends on an argument only, so it runs in the
    first CPU stage, before the first GPU op it follows in the text. The second GPU segment
    reads %w (uploaded once, into the first's buffer) and %a (made by the first): both are
    copied on the device, not transferred again."""
    fn, split = run_split(PINNED, "f", "lift")
    assert devices(split) == ["cpu0", "gpu1", "cpu2", "gpu3", "cpu4"]
    assert fn.stats.transfers == {"h2d": 3, "d2h": 2}  # %x, %w, %b in; %a, %d out
    assert fn.stats.device_copies == 2
    assert fn.stats.gemm_calls == 3  # two on the gpu, one on the cpu
    gpu3 = next(s for s in split.segments if s.name == "gpu3")
    assert [v.name_hint for v in gpu3.inputs] == ["b_gpu", "w_gpu", "a"]
    text = split.describe()
    assert "  gpu   @f.gpu3(%b_gpu, %w_gpu, %a) -> (%d)" in text, text


def test_unknown_dims_and_views() -> None:
    """A `?` dim is specialised per shape, each split and compiled; a non-contiguous argument
    is as good as an array (copied where the CPU needs it)."""
    source = """\
func @f(%x: tensor<?x4xf32>, %w: tensor<4x4xf32>) -> (tensor<?x4xf32>, tensor<?x4xf32>) {
  %m = matmul %x, %w : tensor<?x4xf32>
  return tanh(%m), exp(%x)
}
"""
    fn = gir.jit(source, "f", device="auto", pipeline=pipeline("lift"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    for rows in (2, 3):
        x = rng.standard_normal((4, rows)).astype(np.float32).T
        assert not x.flags.c_contiguous
        assert_all_close(fn(x, w), gir.jit(source, "f", device="interp")(x, w), rtol=1e-5)
        assert fn.stats.transfers == {"h2d": 2, "d2h": 1}
        assert devices(fn.compiled) == ["cpu0", "gpu1"]  # exp(%x) is an island: lift leaves it


def test_a_value_on_the_wrong_device_without_a_transfer_is_an_error() -> None:
    """device="auto" runs what `place` decided: a pipeline without it, on IR whose device
    attributes disagree, is an error at the op, not a wrong answer."""
    with pytest.raises(gir.GirError, match="'matmul' runs on the gpu but reads a value that lives on the cpu"):
        gir.jit(PINNED, "f", device="auto", pipeline="canonicalize")


def test_without_place_everything_runs_on_the_cpu() -> None:
    """No `place`, no device attributes: one CPU segment (no GPU needed), no transfer."""
    text = (REPO / "examples" / "mlp.gir").read_text()
    fn = gir.jit(text, device="auto", pipeline=MODES["fast-run"].pipeline("cpu"))
    args = random_inputs(fn.signature, 0)
    assert_all_close(fn(*args), gir.jit(text, device="interp")(*args), rtol=1e-4)
    assert [s.device for s in fn.compiled.segments] == ["cpu"]
    assert fn.stats.transfers == {"h2d": 0, "d2h": 0}


# ---------------------------------------------------------------------------------------------
# Loops: Theano's GraphToGPU checks on a linear RNN, on the executed program


LINEAR_RNN = """\
func @f(%u: tensor<TxBxf32>, %x0: tensor<Bxf32>, %w_in: tensor<f32>, %w: tensor<f32>) -> tensor<TxBxf32> {
  %x = %x0
  for %u_t in %u {
    %x = %u_t * %w_in + %x * %w
    collect %x into %xs
  }
  return %xs
}
"""


def linear_rnn(steps: int, batch: int) -> str:
    shape = f"{steps}x{batch}x" if batch else f"{steps}x"
    return LINEAR_RNN.replace("TxBx", shape).replace("Bx", f"{batch}x" if batch else "")


@pytest.mark.parametrize("policy", ["lift", "aggressive"])
def test_linear_rnn_graph_to_gpu_checks(policy: str) -> None:
    """Theano's test_one_sequence_one_output_weights_gpu: x[t] = u[t] * w_in + x[t-1] * w, here
    over a batch of 8 (gir keeps a computation on scalars alone on the CPU: next test). The scan
    runs in one GPU segment; its body holds no transfer; every input goes over once and the
    result comes back once, whatever the number of steps."""
    for steps in (2, 5):
        fn, split = run_split(linear_rnn(steps, 8), "f", policy)
        assert devices(split) == ["gpu1"], split.describe()
        assert fn.stats.transfers == {"h2d": 4, "d2h": 1}
        assert sorted(c.op.operands[0].name_hint for c in split.crossings if c.direction == "h2d") == \
            ["u", "w", "w_in", "x0"]
        (seg,) = split.segments
        scan = next(op for op in seg.function.body if op.regions)
        body = list(scan.walk())[1:]
        assert body and not any(op.spec.moves_device for op in body)
        assert all(op.attrs.get("device", "gpu") == "gpu" for op in body)
        assert fn.stats.kernel_launches == steps  # one fused kernel per step, host-driven


def test_scan_beside_an_island_policies_differ() -> None:
    """lift leaves the island (an op on arguments alone) on the CPU, in a CPU segment of its
    own; aggressive runs it in the scan's GPU segment, for one more transfer each way."""
    source = linear_rnn(3, 8).replace("%x0: tensor<8xf32>,", "%x0: tensor<8xf32>, %y: tensor<8xf32>,") \
        .replace("-> tensor<3x8xf32> {", "-> (tensor<3x8xf32>, tensor<8xf32>) {") \
        .replace("  return %xs", "  %z = exp(%y) + %y\n  return %xs, %z")
    fn, split = run_split(source, "f", "lift")
    assert devices(split) == ["cpu0", "gpu1"] and fn.stats.transfers == {"h2d": 4, "d2h": 1}
    fn, split = run_split(source, "f", "aggressive")
    assert devices(split) == ["gpu1"] and fn.stats.transfers == {"h2d": 5, "d2h": 2}


def test_scalar_linear_rnn_stays_on_the_cpu() -> None:
    """On rank-0 values every op is `too small: a scalar`: one CPU segment, no transfer."""
    fn, split = run_split(linear_rnn(4, 0), "f", "aggressive")
    assert devices(split) == ["cpu0"] and fn.stats.transfers == {"h2d": 0, "d2h": 0}


SMALL_RNN = [("50x32x256", "3x2x4"), ("32x256", "2x4"), ("256x256", "4x4"), ("<256x", "<4x")]


@pytest.mark.parametrize("mode", ["fast-run", "fast-compile"])
@pytest.mark.parametrize("policy", ["lift", "aggressive"])
def test_rnn_gradients_split(mode: str, policy: str) -> None:
    """examples/rnn.gir's gradients at T=3, batch 2, hidden 4, in both modes, both policies."""
    text = (REPO / "examples" / "rnn.gir").read_text()
    for old, new in SMALL_RNN:
        text = text.replace(old, new)
    fn, split = run_split(text, "rnn_grads", policy, mode=mode)
    assert any(s.device == "gpu" for s in split.segments)
    for seg in split.segments:  # no transfer inside any segment, loops included
        assert not any(op.spec.moves_device for op in seg.function.walk())  # type: ignore[union-attr]
    assert fn.stats.h2d >= 5  # every argument the GPU reads


def test_gpu_segments_plan_with_the_gpus_views_and_loop_buffers() -> None:
    """A GPU segment is planned as device="gpu" plans (memplan{views=strided}): its plan counts
    the slices the GPU reads through strides as views and leaves the loops' own buffers out of
    the arena, so the lowering keeps the strided views' sources in their slots; a CPU segment
    keeps the registry's views. The results are the interpreter's."""
    from rnn_cases import training_step

    text, args, _ = training_step("lstm", 3, 2, 3, 4)
    _, split = run_split(text, "lstm_grads", "aggressive", args)
    gpu = [s for s in split.segments if s.device == "gpu"]
    assert gpu
    for seg in split.segments:
        plan = seg.compiled.memory.plan if seg.device == "gpu" else None  # type: ignore[union-attr]
        if plan is not None:
            low = seg.compiled.lowering  # type: ignore[union-attr]
            assert plan.view_rules.name == "strided"
            assert low.sequence_rows or low.absorbed or low.returned_views
            assert not {plan.views[r] for r in (*low.sequence_rows, *low.returned_views)} & low.owned
    plans = [seg.compiled.memory.plan for seg in gpu]  # type: ignore[union-attr]
    assert any("loop's own buffer" in p.why_external.values() for p in plans if p is not None)


# ---------------------------------------------------------------------------------------------
# device="gpu" keeps running the whole function on the GPU, and counts its transfers too


def test_device_gpu_runs_the_whole_function_and_counts_its_transfers() -> None:
    fn = gir.jit(ISLAND, "f", device="gpu")
    args = random_inputs(fn.signature, 0)
    fn(*args)
    assert (fn.stats.h2d, fn.stats.d2h) == (3, 2)
    assert "place" not in fn.pipeline


# ---------------------------------------------------------------------------------------------
# Modes


def test_modes_are_named_pipelines() -> None:
    fast_run, fast_compile = MODES["fast-run"], MODES["fast-compile"]
    assert "place{policy=lift}" in fast_run.pipeline("auto") and "place" not in fast_run.pipeline("cpu")
    assert "place{policy=aggressive}" in fast_compile.pipeline("auto")
    assert len(gir.passes.pipeline.split_pipeline(fast_compile.pipeline("cpu"))) < \
        len(gir.passes.pipeline.split_pipeline(fast_run.pipeline("cpu")))
    assert "scan-grad" not in fast_compile.pipeline("cpu")
    assert gir.jit(ISLAND, "f").pipeline == fast_run.pipeline("cpu")  # the default
    assert gir.jit(ISLAND, "f", mode="fast-compile").pipeline == fast_compile.pipeline("cpu")


def test_unknown_mode_and_mode_with_pipeline_are_errors() -> None:
    with pytest.raises(gir.GirArgumentError, match="unknown mode 'fast'; modes: fast-run, fast-compile"):
        gir.jit(ISLAND, "f", mode="fast")
    with pytest.raises(gir.GirArgumentError, match="a mode or a pipeline, not both"):
        gir.jit(ISLAND, "f", mode="fast-run", pipeline="ssa")


@pytest.mark.parametrize("example", ["rnn.gir", "mlp.gir"])
def test_fast_compile_on_the_cpu_matches_the_interpreter(example: str) -> None:
    text = (REPO / "examples" / example).read_text()
    for old, new in SMALL_RNN if example == "rnn.gir" else []:
        text = text.replace(old, new)
    fn = gir.jit(text, mode="fast-compile")
    args = random_inputs(fn.signature, 0)
    assert_all_close(fn(*args), gir.jit(text, device="interp")(*args), rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# The command line


def gir_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = gir.cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_run_device_auto_shows_the_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rnn.gir"
    path.write_text(linear_rnn(3, 8))
    code, out, err = gir_main(capsys, "run", str(path), "--device", "interp")
    assert code == 0
    want = out.replace("on interp:", "on auto:")  # `gir run` names the entry and the device
    code, out, err = gir_main(capsys, "run", str(path), "--device", "auto", "-v")
    assert code == 0, err
    assert out == want
    assert "split of @f: 1 segment(s), 0 h2d and 0 d2h transfer(s) per call" in err  # 8 elements: too small
    assert "transfers executed: 0 h2d (0 bytes), 0 d2h (0 bytes)" in err


def test_cli_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "island.gir"
    path.write_text(ISLAND.replace("4x4", "64x64"))
    code, out, err = gir_main(capsys, "opt", str(path), "--mode", "fast-compile", "--placement-report")
    assert code == 0, err
    assert "placement of @f (policy=aggressive, min-elements=1024)" in err
    assert "5 transfers (3 to the gpu, 2 to the cpu)" in err
    code, out, err = gir_main(capsys, "run", str(path), "--device", "auto", "--mode", "fast-compile", "-v")
    assert code == 0, err
    assert "transfers executed: 3 h2d (49152 bytes), 2 d2h (32768 bytes)" in err
    code, out, err = gir_main(capsys, "run", str(path), "--mode", "fast")
    assert code == 1 and "unknown mode 'fast'; modes: fast-run, fast-compile" in err
    code, out, err = gir_main(capsys, "opt", str(path), "--mode", "fast-run", "-p", "ssa")
    assert code == 1 and "give -p or --mode, not both" in err
    code, out, err = gir_main(capsys, "compile", str(path), "--mode", "fast-compile", "--emit", "llvm",
                              "-o", str(tmp_path / "f.ll"))
    assert code == 0, err
    assert "define" in (tmp_path / "f.ll").read_text()


def test_auto_without_a_gpu_is_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """device="auto" means the best this machine has: with no GPU (and no simulator) it is the
    CPU, not an error; device="gpu" there stays one."""
    import gir.backend.gpu.device as gpu_device

    monkeypatch.setattr(gpu_device, "available", lambda: False)
    source = linear_rnn(3, 8)
    fn = gir.jit(source, device="auto")
    assert fn.device == "cpu"
    args = [np.ones(t.shape, t.numpy_dtype) for t in fn.signature.arg_types]
    gir.testing.assert_all_close(fn(*args), gir.jit(source, device="interp")(*args))
    path = tmp_path / "rnn.gir"
    path.write_text(source)
    code, out, err = gir_main(capsys, "run", str(path), "--device", "auto")
    assert code == 0 and out.startswith("@f on cpu:"), err
