"""The `checkpoint` pass and the memory budget (transforms/checkpoint.py, docs/memplan.md).

The interpreter is the oracle: every rewritten program is run before and after on random
inputs. Gradients of the RNN, GRU and LSTM (float64) with checkpointing forced must equal the
un-checkpointed ones to 1e-10 relative, on the interpreter and the CPU; random programs with
nested loops (tests/fuzz/programs.py) keep their gradients under a forced segment.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.errors import GirArgumentError, GirPassError
from gir.ir.interpreter import random_inputs
from gir.ir.loops import LoopView
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import (
    BACKEND_PIPELINE,
    DEFAULT_PIPELINE,
    get_mode,
    parse_bytes,
    parse_pipeline,
    with_memory_budget,
)
from gir.passes.rewriter import PassStatistics
from gir.testing import assert_all_close
from gir.transforms.checkpoint import Checkpoint, candidate_segments, find_pairs
from rnn_cases import bench_module

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import programs  # noqa: E402

FILECHECK = Path(__file__).resolve().parent / "filecheck" / "checkpoint.gir"


def checkpointed(pipeline: str, segment: int) -> str:
    """pipeline with `checkpoint{segment=S}` after autodiff's canonicalize."""
    return pipeline.replace("autodiff,canonicalize,", f"autodiff,canonicalize,checkpoint{{segment={segment}}},", 1)


def max_relative(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0)
                     / max(float(np.max(np.abs(b), initial=0.0)), 1e-300)) for a, b in zip(got, want))


# ---------------------------------------------------------------------------------------------
# The rewrite on the FileCheck file's programs, against the interpreter


@pytest.mark.parametrize("segment", [2, 3, 4])
@pytest.mark.parametrize("entry", ["pair", "even", "short", "dyn", "kept", "rev", "nested"])
def test_rewrite_keeps_results(entry: str, segment: int) -> None:
    module = gir.load(str(FILECHECK))
    f = module.functions[entry]
    if entry == "dyn":  # `?` steps: gir.jit specialises on the argument, then checkpoints
        args = [np.random.default_rng(1).standard_normal((10, 2)).astype(np.float32),
                np.random.default_rng(2).standard_normal(2).astype(np.float32)]
    else:
        args = random_inputs(f, 0)
    want = gir.jit(module, entry, device="interp", pipeline="")(*args)
    fn = gir.jit(module, entry, device="interp", pipeline=f"checkpoint{{segment={segment}}}")
    got = fn(*args)
    assert_all_close(list(got), list(want), rtol=1e-5)
    rewritten = any(d.startswith(f"@{entry}:") and f"segment {segment}," in d for d in fn.stats.compile.checkpoints)
    steps = {"pair": 10, "even": 9, "short": 2, "dyn": 10, "kept": 7, "rev": 8, "nested": 7}[entry]
    assert rewritten == (segment < steps), fn.stats.compile.checkpoints


def test_scan_counts_after_the_rewrite() -> None:
    """@pair (T = 10, S = 3): 2 outer scans, 2 remainder scans, 3 inner scans; the residual is
    never stacked T rows long."""
    module = gir.load(str(FILECHECK))
    PassManager("checkpoint{segment=3}").run(module)
    f = module.functions["pair"]
    top = [op for op in f.body if op.name == "scan"]
    assert len(top) == 4
    inner = [op for op in f.walk() if op.name == "scan" and op.parent_op is not None]
    assert len(inner) == 3
    for op in f.walk():
        if op.name == "scan":
            assert all(r.tensor_type.shape[0] <= 3 for r in LoopView(op).stacked_results)


def test_pairs_found_and_refused() -> None:
    module = gir.load(str(FILECHECK))
    pairs, skipped = find_pairs(module.functions["pair"].body)
    assert len(pairs) == 1 and pairs[0].trip_count == 10 and pairs[0].residual == [0]
    pairs, skipped = find_pairs(module.functions["dyn"].body)
    assert not pairs and len(skipped) == 1 and "`?`" in skipped[0]


# ---------------------------------------------------------------------------------------------
# RNN, GRU, LSTM gradients, float64


def rnn_case(model: str, steps: int) -> tuple[str, list[np.ndarray]]:
    rnn = bench_module("rnn")
    src = rnn.gir_source(model, steps, 2, 3, 4).replace("f32", "f64")
    p = rnn.make_inputs(model, steps, 2, 3, 4, 0)
    return src, [p["xs"]] + [p[n] for n in rnn.param_names(model)]


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("steps,segment", [(10, 3), (9, 3), (7, 2), (2, 3)])
def test_rnn_gradients_interp(model: str, steps: int, segment: int) -> None:
    src, args = rnn_case(model, steps)
    want = gir.jit(src, f"{model}_grads", device="interp")(*args)
    fn = gir.jit(src, f"{model}_grads", device="interp",
                 pipeline=checkpointed(DEFAULT_PIPELINE, segment) + "," + BACKEND_PIPELINE)
    assert max_relative(list(fn(*args)), list(want)) < 1e-10
    assert any(f"segment {segment}" in d for d in fn.stats.compile.checkpoints) == (segment < steps)


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_rnn_gradients_cpu(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))  # compiled here: a cache hit runs no pass to report
    src, args = rnn_case(model, 10)
    want = gir.jit(src, f"{model}_grads", device="interp")(*args)
    fn = gir.jit(src, f"{model}_grads", pipeline=checkpointed(DEFAULT_PIPELINE, 3) + "," + BACKEND_PIPELINE)
    assert max_relative(list(fn(*args)), list(want)) < 1e-10
    assert "segment 3, 3 checkpoints, remainder 1" in fn.stats.compile.checkpoints[0]
    assert fn.stats.compile.planned_peak and fn.stats.compile.arena_bytes


@pytest.mark.parametrize("path", ["mkl-packed", "openblas-copy"])
def test_weights_packed_once_per_call_not_per_segment(path: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU: a weight used by GEMMs inside the segments' scans is packed (or copied) before the
    outermost loop, once per call, shared by the forward, recomputation and remainder scans:
    the pack count does not grow with the number of segments."""
    from gir.backend.cpu.blas import providers

    if path == "mkl-packed" and not providers().has_mkl:
        pytest.skip("MKL is not installed")
    monkeypatch.setenv("GIR_GEMM_PATH", path)
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    src, args = rnn_case("lstm", 12)
    want = gir.jit(src, "lstm_grads", device="interp")(*args)
    packs = {}
    for segment in (2, 3, 6):
        fn = gir.jit(src, "lstm_grads", pipeline=checkpointed(DEFAULT_PIPELINE, segment) + "," + BACKEND_PIPELINE)
        assert max_relative(list(fn(*args)), list(want)) < 1e-10
        assert fn.stats.gemm_paths.get(path, 0) >= 1, fn.stats.gemm_paths
        packs[segment] = fn.stats.pack_calls
    plain = gir.jit(src, "lstm_grads")
    plain(*args)
    assert packs[2] == packs[3] == packs[6] <= plain.stats.pack_calls + 1, (packs, plain.stats.pack_calls)


def test_weight_gradient_is_one_gemm_per_segment() -> None:
    """scan-grad after checkpoint: inside the backward outer loop, no matmul accumulates
    per step into a weight gradient; the recurrent weight's gradient is GEMMs over the
    segment's stacks, in the outer body."""
    src, _ = rnn_case("rnn", 10)
    module = gir.parse(src)
    PassManager(with_memory_budget(DEFAULT_PIPELINE, 1)).run(module)
    f = module.functions["rnn_grads"]
    outer_backward = [op for op in f.body if op.name == "scan" and LoopView(op).reverse
                      and any(inner.name == "scan" for inner in op.body)]
    assert len(outer_backward) == 1
    body = outer_backward[0].body
    per_segment = [op for op in body if op.name == "matmul"]
    assert len(per_segment) >= 2  # dW_h (h_0 term and the shifted stack) and dW_x, one GEMM each
    for inner in body:
        if inner.name == "scan" and LoopView(inner).reverse:
            for c in LoopView(inner).carries:  # no weight-sized accumulator is carried per step
                assert c.arg.tensor_type.shape != (4, 4)


# ---------------------------------------------------------------------------------------------
# The budget


def test_budget_bounds_the_plan_of_the_pipelines_backend() -> None:
    """with_memory_budget budgets the plan the pipeline's last memplan makes: the GPU's
    (`memplan{views=strided}`) gets `checkpoint{views=strided}`, the CPU's the default."""
    gpu = with_memory_budget(get_mode("fast-run").pipeline("gpu"), 1000)
    cpu = with_memory_budget(get_mode("fast-run").pipeline("cpu"), 1000)
    assert "checkpoint{budget=1000,views=strided}" in gpu and "checkpoint{budget=1000}" in cpu
    with pytest.raises(GirPassError, match="views must be one of"):
        parse_pipeline("checkpoint{budget=1000,views=cuda}")


def test_budget_fits_and_keeps_gradients() -> None:
    src, args = rnn_case("lstm", 40)
    base = gir.jit(src, "lstm_grads", device="interp")
    want = base(*args)
    peak = base.stats.compile.planned_peak
    assert peak
    fn = gir.jit(src, "lstm_grads", device="interp", memory_budget=peak // 2)
    assert "checkpoint{budget=" in fn.pipeline and "hoist=false" in fn.pipeline
    assert max_relative(list(fn(*args)), list(want)) < 1e-10
    assert fn.stats.compile.planned_peak <= peak // 2
    (line,) = fn.stats.compile.checkpoints
    assert "scan of 40 steps: segment" in line and "recompute factor" in line and "planned peak" in line


@pytest.mark.parametrize("fraction", [0.9, 0.75])
def test_budget_with_room_recomputes_less(fraction: float) -> None:
    """A budget a little under the peak: fewer segments than fit in T, the rest of the steps
    un-checkpointed (a remainder longer than a segment), so fewer steps are recomputed than
    with every segment that fits; still within the budget, the same gradients."""
    src, args = rnn_case("lstm", 40)
    base = gir.jit(src, "lstm_grads", device="interp")
    want = base(*args)
    peak = base.stats.compile.planned_peak
    budget = int(peak * fraction)
    fn = gir.jit(src, "lstm_grads", device="interp", memory_budget=budget)
    (line,) = fn.stats.compile.checkpoints
    m = re.search(r"segment (\d+), (\d+) checkpoints, remainder (\d+)", line)
    assert m, line
    segment, segments, remainder = map(int, m.groups())
    assert segments * segment + remainder == 40 and remainder > segment and segments < 40 // segment, line
    assert fn.stats.compile.planned_peak <= budget
    assert max_relative(list(fn(*args)), list(want)) < 1e-10


def test_budget_that_fits_changes_nothing_but_the_pipeline() -> None:
    src, args = rnn_case("rnn", 12)
    base = gir.jit(src, "rnn_grads", device="interp")
    fn = gir.jit(src, "rnn_grads", device="interp", memory_budget="1GB")
    assert fn.stats.compile.checkpoints == []
    assert max_relative(list(fn(*args)), list(base(*args))) < 1e-12


def test_no_budget_no_change() -> None:
    assert gir.jit(rnn_case("rnn", 3)[0], "rnn_grads", device="interp").pipeline == \
        DEFAULT_PIPELINE + "," + BACKEND_PIPELINE
    module = gir.load(str(FILECHECK))
    assert not Checkpoint().run(module, PassStatistics())


def test_candidates_are_around_the_square_root() -> None:
    c = candidate_segments(10_000)
    assert 100 in c and 50 in c and 200 in c and all(2 <= s < 10_000 for s in c)
    assert candidate_segments(3) == [2]
    assert candidate_segments(2) == []


@pytest.mark.parametrize("text,n", [("256MB", 256_000_000), ("1GB", 10**9), ("1 GiB", 2**30), ("512kb", 512_000),
                                    (4096, 4096), ("4096", 4096), ("1e9", 10**9), ("1.5GB", 1_500_000_000)])
def test_parse_bytes(text: object, n: int) -> None:
    assert parse_bytes(text) == n  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["lots", "-1GB", "1 parsec", 0, -5, True, "GB"])
def test_parse_bytes_refuses(bad: object) -> None:
    with pytest.raises(GirArgumentError, match="memory budget"):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_jit_refuses_a_bad_budget() -> None:
    with pytest.raises(GirArgumentError, match="memory budget"):
        gir.jit(rnn_case("rnn", 3)[0], "rnn_grads", memory_budget="a lot")


@pytest.mark.parametrize("text,match", [("checkpoint{segment=1}", "segment must be"),
                                        ("checkpoint{budget=huge}", "memory budget"),
                                        ("checkpoint{segmnt=3}", "has no option")])
def test_pipeline_option_errors(text: str, match: str) -> None:
    with pytest.raises(GirPassError, match=match):
        parse_pipeline(text)


def test_with_memory_budget() -> None:
    got = with_memory_budget(DEFAULT_PIPELINE, 1000)
    assert got == ("ssa,canonicalize,scan-grad{hoist=false,merge-sums=false},canonicalize,autodiff,canonicalize,"
                   "checkpoint{budget=1000},scan-grad,canonicalize")
    assert with_memory_budget("ssa", 5) == "ssa,checkpoint{budget=5}"
    assert with_memory_budget("checkpoint{segment=3}", 5) == "checkpoint{segment=3}"
    assert with_memory_budget("scan-grad{merge=false},autodiff", 5) == \
        "scan-grad{merge=false,hoist=false,merge-sums=false},autodiff,checkpoint{budget=5}"


# ---------------------------------------------------------------------------------------------
# The command line


def gir_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gir.cli", *argv], capture_output=True, text=True, timeout=600)


def test_cli_opt_memory_budget_report(tmp_path: Path) -> None:
    path = tmp_path / "rnn.gir"
    path.write_text(rnn_case("rnn", 20)[0])
    r = gir_cli("opt", str(path), "--memory-budget", "2KB", "--memplan-report")
    assert r.returncode == 0, r.stderr
    assert "checkpoint @rnn_grads: scan of 20 steps: segment" in r.stderr
    assert "checkpoints" in r.stderr and "recompute factor" in r.stderr and "planned peak" in r.stderr
    assert "memory plan of @rnn_grads" in r.stderr
    pytest.importorskip("matplotlib")
    r = gir_cli("opt", str(path), "--memory-budget", "2KB", "--memplan-plot", str(tmp_path / "plan.png"),
                "-o", str(tmp_path / "out.gir"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.png").stat().st_size > 1000
    r = gir_cli("opt", str(path), "--memory-budget", "two", "-o", str(tmp_path / "out.gir"))
    assert r.returncode == 1 and "memory budget 'two'" in r.stderr and "Traceback" not in r.stderr


def test_cli_run_memory_budget(tmp_path: Path) -> None:
    path = tmp_path / "rnn.gir"
    path.write_text(rnn_case("rnn", 8)[0])
    plain = gir_cli("run", str(path), "-e", "rnn_grads", "--device", "interp")
    budget = gir_cli("run", str(path), "-e", "rnn_grads", "--device", "interp", "--memory-budget", "1KB")
    assert plain.returncode == 0 and budget.returncode == 0, budget.stderr
    assert plain.stdout == budget.stdout  # the summaries print 4 significant digits of each result


# ---------------------------------------------------------------------------------------------
# Random programs with nested loops


def test_random_grad_programs() -> None:
    """Generated `grad` programs (loops that nest, `?` lengths, zero-length sequences) with
    segment 2 forced: the same results; most of them have a pair to rewrite."""
    rewritten = nested = 0
    for seed in range(30):
        p = programs.generate(random.Random(9000 + seed), want_grad=True)
        module = gir.parse(p.text, filename="program.gir")
        try:
            want = gir.jit(module, p.entry, device="interp")(*p.args)
        except gir.GirError:
            continue  # fails without checkpointing too (e.g. on purpose)
        fn = gir.jit(module, p.entry, device="interp",
                     pipeline=checkpointed(DEFAULT_PIPELINE, 2) + "," + BACKEND_PIPELINE)
        got = fn(*p.args)
        assert_all_close(list(got), list(want), rtol=1e-9 if p.dtype == "f64" else 1e-4, what=f"seed {9000 + seed}")
        done = [d for d in fn.stats.compile.checkpoints if "segment 2," in d]
        rewritten += bool(done)
        nested += bool(done) and p.text.count("for ") > 1
    assert rewritten >= 2 and nested >= 1, (rewritten, nested)


def _chain(rng: random.Random, carry: str, seq: str, weight: str, tag: str, lines: list[str]) -> str:
    """Ops of one step: `carry @ weight + seq`, then a few random smooth ops over the values so
    far, then tanh (bounded); returns the last value's name."""
    t = "tensor<2x3xf64>"
    lines += [f"%{tag}m = matmul %{carry}, %{weight} : {t}", f"%{tag}a = add %{tag}m, %{seq} : {t}"]
    pool = [carry, seq, f"{tag}a"]
    for i in range(rng.randint(1, 4)):
        a, b = rng.choice(pool), rng.choice(pool)
        op = rng.choice(["tanh", "sigmoid", "mul", "add", "matmul"])
        operands = {"tanh": f"%{a}", "sigmoid": f"%{a}", "mul": f"%{a}, %{b}", "add": f"%{a}, %{b}",
                    "matmul": f"%{a}, %{weight}"}[op]
        lines.append(f"%{tag}{i} = {op} {operands} : {t}")
        pool.append(f"{tag}{i}")
    lines.append(f"%{tag}out = tanh %{pool[-1]} : {t}")
    return f"{tag}out"


def random_nested_program(rng: random.Random) -> tuple[str, int, int]:
    """(source of @grads, T, K): an outer scan over T steps (`?` in the signature one time in
    three), maybe reverse, whose body runs an inner scan over K rows (K = 0: no inner scan),
    random smooth ops in both; the gradient of the summed squares with respect to h0 and both
    weights."""
    steps, rows = rng.choice([1, 2, 3, 4, 5, 7, 10]), rng.choice([0, 0, 1, 2, 3])
    t, lead = "tensor<2x3xf64>", "?" if rng.random() < 1 / 3 else str(steps)
    xs = f"tensor<{lead}x{rows}x2x3xf64>" if rows else f"tensor<{lead}x2x3xf64>"
    body: list[str] = []
    if rows:
        inner: list[str] = []
        out = _chain(rng, "g", "y", "u", "i", inner)
        body.append(f"%gk = scan {'reverse ' if rng.random() < 0.3 else ''}(%y in %x) carry (%g = %h) {{")
        body += ["  " + line for line in inner] + [f"  yield (%{out})", f"}} : {t}"]
        out = _chain(rng, "h", "gk", "w", "o", body)
    else:
        out = _chain(rng, "h", "x", "w", "o", body)
    body += [f"%sq = mul %{out}, %{out} : {t}", "%s = sum %sq : tensor<f64>", "%l2 = add %l, %s : tensor<f64>",
             f"yield (%{out}, %l2)"]
    params = f"%xs: {xs}, %h0: {t}, %w: tensor<3x3xf64>, %u: tensor<3x3xf64>"
    text = "\n".join([
        f"func @loss({params}) -> tensor<f64> {{",
        "  %zero = constant 0.0 : tensor<f64>",
        f"  %hT, %lT = scan {'reverse ' if rng.random() < 0.3 else ''}(%x in %xs) carry (%h = %h0, %l = %zero) {{",
        *["    " + line for line in body],
        f"  }} : {t}, tensor<f64>",
        "  return %lT",
        "}",
        f"func @grads({params}) -> (tensor<f64>, {t}, tensor<3x3xf64>, tensor<3x3xf64>) {{",
        "  %l, %dh, %dw, %du = grad @loss(%xs, %h0, %w, %u) wrt (1, 2, 3)",
        "  return %l, %dh, %dw, %du",
        "}"])
    return text, steps, rows


@pytest.mark.parametrize("seed", range(16))
def test_random_nested_scans(seed: int) -> None:
    """Generated nested (and reverse, `?`-long, short) scans, segments 2 and 3: the same
    gradients, float64, to 1e-10 relative; rewritten exactly when T exceeds the segment."""
    rng = random.Random(seed)
    text, steps, rows = random_nested_program(rng)
    np_rng = np.random.default_rng(seed)
    args = [np_rng.standard_normal((steps, rows, 2, 3) if rows else (steps, 2, 3))]
    args += [0.5 * np_rng.standard_normal(shape) for shape in ((2, 3), (3, 3), (3, 3))]
    module = gir.parse(text)
    want = gir.jit(module, "grads", device="interp")(*args)
    for segment in (2, 3):
        fn = gir.jit(module, "grads", device="interp",
                     pipeline=checkpointed(DEFAULT_PIPELINE, segment) + "," + BACKEND_PIPELINE)
        assert max_relative(list(fn(*args)), list(want)) < 1e-10, text
        done = [d for d in fn.stats.compile.checkpoints if f"segment {segment}," in d]
        assert bool(done) == (steps > segment), (fn.stats.compile.checkpoints, text)


GPU_SCRIPT = """
import numpy as np, gir, sys
sys.path.insert(0, sys.argv[1])
from test_checkpoint import BACKEND_PIPELINE, DEFAULT_PIPELINE, checkpointed, max_relative, rnn_case
src, args = rnn_case("lstm", 7)
want = gir.jit(src, "lstm_grads", device="interp")(*args)
fn = gir.jit(src, "lstm_grads", device="gpu", pipeline=checkpointed(DEFAULT_PIPELINE, 3) + "," + BACKEND_PIPELINE)
print("max relative error", max_relative(list(fn(*args)), list(want)))
"""


@pytest.mark.gpu
def test_lstm_gradients_gpu(tmp_path: Path) -> None:
    """The checkpointed LSTM gradient on the GPU backend (the CUDA simulator without a GPU, in
    a fresh process: the simulator is chosen when numba is imported)."""
    env = {**os.environ, "GIR_CACHE_DIR": str(tmp_path)}
    env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    r = subprocess.run([sys.executable, "-c", GPU_SCRIPT, str(Path(__file__).resolve().parent)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split("max relative error")[1]) < 1e-10


def test_python_frontend_memory_budget() -> None:
    """gir.jit(python function, memory_budget=...) checkpoints the traced scan; float64 results
    equal the un-checkpointed ones."""
    def loss(params: dict, xs: object, h0: object) -> object:
        def step(h: object, x: object) -> tuple:
            h = gir.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
            return h, gir.sum(h * h)
        _, per_step = gir.scan(step, h0, xs)
        return gir.sum(per_step)

    rng = np.random.default_rng(0)
    p = {"wx": rng.standard_normal((3, 4)), "wh": 0.5 * rng.standard_normal((4, 4)), "b": rng.standard_normal(4)}
    xs, h0 = rng.standard_normal((40, 2, 3)), rng.standard_normal((2, 4))
    want = gir.jit(gir.value_and_grad(loss), device="interp")(p, xs, h0)
    fn = gir.jit(gir.value_and_grad(loss), device="interp", memory_budget=2000)
    got = fn(p, xs, h0)
    assert max_relative([got[0]] + [got[1][k] for k in p], [want[0]] + [want[1][k] for k in p]) < 1e-12
    assert "scan of 40 steps: segment" in fn.stats.compile.checkpoints[0]


TWO_LAYERS = """
func @loss(%xs: tensor<11x2x3xf64>, %h0: tensor<2x4xf64>, %w1: tensor<3x4xf64>, %u1: tensor<4x4xf64>,
           %w2: tensor<4x4xf64>, %u2: tensor<4x4xf64>) -> tensor<f64> {
  %h = %h0
  for %x in %xs {
    %h = tanh(%x @ %w1 + %h @ %u1)
    collect %h into %hs
  }
  %g = %h0
  %loss = constant 0.0 : tensor<f64>
  for %y in %hs {
    %g = tanh(%y @ %w2 + %g @ %u2)
    %loss = %loss + sum(%g * %g)
  }
  return %loss
}

func @grads(%xs: tensor<11x2x3xf64>, %h0: tensor<2x4xf64>, %w1: tensor<3x4xf64>, %u1: tensor<4x4xf64>,
            %w2: tensor<4x4xf64>, %u2: tensor<4x4xf64>)
    -> (tensor<f64>, tensor<2x4xf64>, tensor<3x4xf64>, tensor<4x4xf64>, tensor<4x4xf64>, tensor<4x4xf64>) {
  %l, %a, %b, %c, %d, %e = grad @loss(%xs, %h0, %w1, %u1, %w2, %u2) wrt (%h0, %w1, %u1, %w2, %u2)
  return %l, %a, %b, %c, %d, %e
}
"""


def test_two_layers() -> None:
    """Two stacked recurrent layers: two pairs, the second layer's forward reading the first's
    stacked outputs (a kept stack) and its backward stacking their cotangents for the first's.
    Forced segments rewrite both; a budget rewrites pairs largest first and leaves a pair alone
    when no segment length lowers the peak."""
    module = gir.parse(TWO_LAYERS)
    args = random_inputs(module.functions["grads"], 0)
    want = gir.jit(module, "grads", device="interp")(*args)
    for segment in (2, 3, 5):
        fn = gir.jit(module, "grads", device="interp",
                     pipeline=checkpointed(DEFAULT_PIPELINE, segment) + "," + BACKEND_PIPELINE)
        assert max_relative(list(fn(*args)), list(want)) < 1e-12
        assert sum(f"segment {segment}," in d for d in fn.stats.compile.checkpoints) == 2
    for budget in (1500, 3500, 4000):
        fn = gir.jit(module, "grads", device="interp", memory_budget=budget)
        assert max_relative(list(fn(*args)), list(want)) < 1e-12
        decisions = fn.stats.compile.checkpoints
        assert decisions and "segment" in decisions[0]
        if budget == 1500:
            assert "not met" in decisions[0] and "no segment length lowers" in decisions[1]
        else:
            assert len(decisions) == 1 and fn.stats.compile.planned_peak <= budget


NESTED_BY_HAND = """
func @loss(%xs: tensor<4x3x2xf64>, %h0: tensor<2xf64>, %w: tensor<2xf64>) -> tensor<f64> {
  %zero = constant 0.0 : tensor<f64>
  %hT, %lT = scan (%x in %xs) carry (%h = %h0, %l = %zero) {
    %gk = scan (%y in %x) carry (%g = %h) {
      %a = mul %g, %w : tensor<2xf64>
      %b = add %a, %y : tensor<2xf64>
      %c = tanh %b : tensor<2xf64>
      yield (%c)
    } : tensor<2xf64>
    %s = sum %gk : tensor<f64>
    %l2 = add %l, %s : tensor<f64>
    yield (%gk, %l2)
  } : tensor<2xf64>, tensor<f64>
  return %lT
}
func @grads(%xs: tensor<4x3x2xf64>, %h0: tensor<2xf64>, %w: tensor<2xf64>) -> (tensor<f64>, tensor<2xf64>) {
  %l, %dw = grad @loss(%xs, %h0, %w) wrt (2)
  return %l, %dw
}
"""


def test_autodiff_of_nested_scans_stacks_every_inner_step() -> None:
    """Why `checkpoint` runs after autodiff (docs/autodiff.md): a forward written as segments
    (an outer scan over a scan) is differentiated by stacking every inner step's residuals
    through the outer scan, T_outer x T_inner rows, not by recomputing the inner scan."""
    module = gir.parse(NESTED_BY_HAND)
    PassManager("autodiff,canonicalize").run(module)
    (forward,) = [op for op in module.functions["grads"].body if op.name == "scan" and not LoopView(op).reverse]
    stacks = LoopView(forward).stacked_results
    assert stacks and all(r.tensor_type.shape[:2] == (4, 3) for r in stacks)
