"""The Python API a JAX or PyTorch user meets (issue 13, items 2, 3, 4, 6): named results,
the calling convention (keywords, Python values, the dtype rule), `gir.interpret` on modules
with `grad`, `fn.stats.compile`, the progress line, `gir --version`, `gir run -v`, and every
```python block of README.md run as written."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import gir
import gir.cli
import gir.driver.jitstats
import numpy as np
import pytest
from gir.backend.cpu import blas
from gir.driver.results import result_names

REPO = Path(__file__).resolve().parent.parent

SOURCE = """
func @f(%x: tensor<3xf32>, %w: tensor<3xf32>, %n: tensor<i32>) -> (tensor<f32>, tensor<3xf32>, tensor<i32>) {
  %loss = sum(%x * %w)
  %y = %x + %w
  return %loss, %y, %n * 2
}
"""


def args() -> list[np.ndarray]:
    return [np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, 0.25, 1.0], np.float32), np.array(4, np.int32)]


# ---------------------------------------------------------------------------------------------
# Named results


@pytest.mark.parametrize("device", ["interp", "cpu"])
def test_results_are_a_named_tuple_that_still_behaves_as_before(device: str) -> None:
    out = gir.jit(SOURCE, "f", device=device)(*args())
    assert isinstance(out, tuple) and len(out) == 3
    assert out._fields == ("loss", "y", "out2")
    assert float(out.loss) == 4.0 and out.loss is out[0] and out.y is out[1]
    assert list(out._asdict()) == ["loss", "y", "out2"]
    loss, y, doubled = out
    assert int(doubled) == 8 and out[-1] is doubled and out[:2] == (loss, y)
    assert out == [loss, y, doubled] and out == (loss, y, doubled)  # results used to be lists
    assert not (out != [loss, y, doubled]) and out != [loss, y]
    copy = pickle.loads(pickle.dumps(out))  # as a plain tuple
    assert type(copy) is tuple and all(np.array_equal(a, b) for a, b in zip(copy, out))
    assert "loss=" in repr(out)


@pytest.mark.parametrize("ret, names", [
    ("%a, %b", ("a", "b")),
    ("%a, %a", ("a", "out1")),                       # a duplicate: the later one is positional
    ("%a + %b, %b", ("out0", "b")),                 # a temporary
    ("%count, %_p", ("out0", "out1")),               # a tuple method; a leading underscore
    ("%out1, %a", ("out0", "a")),                    # would clash with result 1's fallback
    ("%x, %a", ("x", "a")),                          # a parameter returned as it is
])
def test_result_names(ret: str, names: tuple[str, ...]) -> None:
    module = gir.parse(f"""
func @g(%x: tensor<2xf64>) -> (tensor<2xf64>, tensor<2xf64>) {{
  %a = %x * 2.0
  %b = %x + 1.0
  %count = %a * 3.0
  %_p = %b * 3.0
  %out1 = %a * 4.0
  return {ret}
}}""")
    assert result_names(module.functions["g"]) == names
    assert gir.jit(module, "g", device="interp")(np.ones(2))._fields == names


def test_names_survive_ssa_and_dumps() -> None:
    """After `ssa` a result is `%loss.1`: the suffix is dropped, so a dump that re-parses keeps
    its names. (gir.jit and `gir run` take the names from the module as written, before the
    passes: autodiff replaces `grad`'s results with values of its own.)"""
    from gir.passes.pass_manager import PassManager

    module = gir.load(str(REPO / "examples" / "rnn.gir"))
    PassManager("ssa").run(module)
    assert "return %loss." in str(module)
    assert result_names(gir.parse(str(module)).functions["rnn_loss"]) == ("loss",)


def test_no_results_is_an_empty_tuple() -> None:
    fn = gir.jit("func @e(%x: tensor<2xf32>) -> () {\n  return\n}", "e", device="interp")
    out = fn(np.ones(2, np.float32))
    assert out == [] and out == () and len(out) == 0 and out._fields == ()


# ---------------------------------------------------------------------------------------------
# The calling convention


def test_keyword_arguments_by_parameter_name() -> None:
    fn = gir.jit(SOURCE, "f")
    x, w, n = args()
    want = fn(x, w, n)
    for call in (lambda: fn(x=x, w=w, n=n), lambda: fn(x, n=n, w=w), lambda: fn(**{"%x": x, "w": w, "n": n})):
        got = call()
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_python_numbers_and_lists_take_the_parameter_dtype() -> None:
    fn = gir.jit(SOURCE, "f")
    out = fn([1, 2, 3], [0.5, 0.25, 1.0], 4)
    assert float(out.loss) == 4.0 and out.y.dtype == np.float32 and out[2].dtype == np.int32
    out = fn((1.0, 2.0, 3.0), np.array([0.5, 0.25, 1.0], np.float32), 4.0)  # an integral float for an int
    assert int(out[2]) == 8


def test_arrays_are_widened_exactly_and_never_narrowed() -> None:
    module = gir.parse("func @h(%x: tensor<2xf64>, %i: tensor<2xi64>) -> tensor<2xf64> {\n"
                       "  return %x * cast(%i, dtype=\"f64\")\n}")
    fn = gir.jit(module, "h")
    out = fn(np.array([1.5, 2.5], np.float32), np.array([2, 3], np.int32))  # f32 -> f64, i32 -> i64: exact
    np.testing.assert_array_equal(out[0], [3.0, 7.5])
    assert out[0].dtype == np.float64


ERRORS = [
    ((np.zeros(3, np.float64),), {}, "argument %x of @f must be tensor<3xf32>, got a float64 array; gir does not "
                                     "convert float64 to float32 implicitly (loses precision): pass "
                                     ".astype(np.float32) to convert"),
    ((np.zeros(3, np.int32),), {}, "got a int32 array; gir does not convert int32 to float32 implicitly "
                                   "(changes the kind of number)"),
    ((), {"x": [1.0, 2.0, 3.0], "w": [1.0, 2.0, 3.0], "n": 2.5}, "argument %n of @f is tensor<i32>: pass integers, "
                                                                  "not fractions"),
    ((), {"x": [1.0, 2.0, 3.0], "w": [1.0, 2.0, 3.0], "n": 2**40}, "is outside its range"),
    ((), {"x": [True, False, True], "w": [1.0, 2.0, 3.0], "n": 1}, "argument %x of @f is tensor<3xf32>: pass "
                                                                   "numbers, not bools"),
    ((), {"x": [[1.0], [2.0, 3.0]], "w": [1.0, 2.0, 3.0], "n": 1}, "a rectangular (nested) list of numbers, got "
                                                                   "a ragged list"),
    ((), {"x": [np.float64(1.0), 2.0, 3.0], "w": [1.0, 2.0, 3.0], "n": 1}, "got a float64 array; gir does not "
                                                                          "convert float64 to float32"),
    ((), {"x": "abc", "w": [1.0, 2.0, 3.0], "n": 1}, "argument %x of @f must be a NumPy array of tensor<3xf32> "
                                                     "(or a Python number or list), got str"),
    ((), {"x": [1.0, 2.0], "w": [1.0, 2.0, 3.0], "n": 1}, "argument %x of @f must be tensor<3xf32>, got an array "
                                                          "of shape (2,)"),
    ((), {"x": [1.0, 2.0, 3.0], "w": [1.0, 2.0, 3.0], "n": 1, "m": 1}, "@f has no parameter %m; its parameters "
                                                                       "are %x, %w, %n"),
    ((), {"xx": [1.0, 2.0, 3.0], "w": [1.0, 2.0, 3.0], "n": 1}, "@f has no parameter %xx; did you mean %x? its "
                                                                "parameters are %x, %w, %n"),
    (([1.0, 2.0, 3.0],), {"x": [1.0, 2.0, 3.0]}, "argument %x of @f is given by position and by name"),
    ((), {"x": [1.0, 2.0, 3.0]}, "@f is missing argument(s) %w, %n; it takes %x, %w, %n"),
    (([1.0, 2.0, 3.0],) * 4, {}, "@f takes 3 argument(s) (%x, %w, %n), got 4"),
]


@pytest.mark.parametrize("device", ["interp", "cpu"])
@pytest.mark.parametrize("positional, keywords, message", ERRORS,
                         ids=[f"case{i}" for i in range(len(ERRORS))])  # the messages would make the ids
def test_argument_errors_name_the_parameter(device: str, positional: tuple, keywords: dict, message: str) -> None:
    fn = gir.jit(SOURCE, "f", device=device)
    if len(positional) == 1 and not keywords:  # a bad first argument, the others fine
        positional = (*positional, *args()[1:])
    with pytest.raises(gir.GirArgumentError) as info:
        fn(*positional, **keywords)
    assert message in info.value.message, info.value.message
    assert str(info.value).startswith("<jit>:2:6: error: ")


def test_interpret_takes_the_same_arguments() -> None:
    module = gir.parse(SOURCE)
    out = gir.interpret(module, "f", [1, 2, 3], w=[0.5, 0.25, 1.0], n=4)
    assert out._fields == ("loss", "y", "out2") and float(out.loss) == 4.0
    with pytest.raises(gir.GirArgumentError, match="loses precision"):
        gir.interpret(module, "f", np.zeros(3), [1, 2, 3], 1)


# ---------------------------------------------------------------------------------------------
# gir.interpret runs autodiff itself


def test_interpret_differentiates_a_module_with_grad_and_leaves_it_unchanged() -> None:
    module = gir.load(str(REPO / "examples" / "rnn.gir"))
    text = str(module)
    small = gir.parse(text.replace("50x32x256", "4x2x3").replace("32x256", "2x3").replace("256x256", "3x3")
                      .replace("256xf32", "3xf32"))
    rng = np.random.default_rng(0)
    inputs = [(0.3 * rng.standard_normal(t.shape)).astype(np.float32) for t in small.functions["rnn_grads"].arg_types]
    before = str(small)
    out = gir.interpret(small, "rnn_grads", *inputs)
    assert str(small) == before  # autodiff ran on a copy
    assert_same = gir.jit(small, "rnn_grads", device="cpu")(*inputs)
    for a, b in zip(out, assert_same):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)
    assert out._fields == ("loss", "dwx", "dwh", "db")
    assert str(module) == text


def test_readme_python_blocks_run_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of README.md, in order, in one namespace, from the repository root."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(REPO)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i}", "exec"), namespace)  # noqa: S102


# ---------------------------------------------------------------------------------------------
# Telling the user what happens


def test_stats_report_the_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    # GEMM paths measured before compiling: a path from the model (measured in the background)
    # is compiled again once measured, and the second gir.jit below would be that recompile.
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    source = (REPO / "examples" / "rnn.gir").read_text().replace("50x32x256", "3x2x8").replace("32x256", "2x8") \
        .replace("256x256", "8x8").replace("256xf32", "8xf32")
    fn = gir.jit(source, "rnn_grads")
    fn(*[np.ones(t.shape, np.float32) for t in fn.signature.arg_types])
    c = fn.stats.compile
    assert c.entry == "rnn_grads" and c.device == "cpu" and c.cache == "miss"
    assert c.shapes == ((3, 2, 8), (2, 8), (8, 8), (8, 8), (8,))
    assert list(c.stages)[:6] == ["specialize", "passes", "codegen", "llvm-optimize", "emit-object", "load"]
    assert all(v >= 0 for v in c.stages.values()) and c.seconds >= sum(c.stages.values()) * 0.99
    assert {"ssa", "autodiff", "memplan"} <= set(c.passes)
    assert c.threads and c.threads >= 1
    assert c.gemms and {g.path for g in c.gemms} <= set(blas.PATHS)
    assert sum(fn.stats.gemm_paths.values()) == len(c.gemms)  # one GEMM site per product compiled
    assert all(re.fullmatch(r"<jit>:\d+:\d+", g.where) for g in c.gemms)
    text = c.describe()
    assert "code cache: miss" in text and "GEMM <jit>:" in text and "llvm-optimize" in text
    again = gir.jit(source, "rnn_grads")  # a new function, the same code: the disk cache has it
    assert again.stats.compile.cache == "hit" and "cache-load" in again.stats.compile.stages


def test_interp_stats_have_the_compile_too() -> None:
    fn = gir.jit(SOURCE, "f", device="interp")
    fn(*args())
    assert fn.stats.compile.cache == "none" and "passes" in fn.stats.compile.stages


def test_a_slow_compile_says_so_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gir.driver.jitstats, "PROGRESS_AFTER", 0.0)
    monkeypatch.delenv("GIR_PROGRESS", raising=False)
    gir.jit(SOURCE, "f", device="interp")  # stderr is not a terminal here: no progress unless asked
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("GIR_PROGRESS", "1")
    fn = gir.jit(SOURCE, "f", device="interp")
    fn(*args())
    err = capsys.readouterr().err
    assert "gir: compiling @f for interp (3, 3, scalar) ..." in err
    assert re.search(r"gir: compiled @f in \d+\.\d s", err), err
    monkeypatch.setenv("GIR_PROGRESS", "0")
    gir.jit(SOURCE, "f", device="interp")
    assert capsys.readouterr().err == ""


def test_jit_docstring_covers_what_a_user_asks() -> None:
    doc = gir.jit.__doc__ or ""
    for topic in ('"cpu"', '"gpu"', '"interp"', "DEFAULT_PIPELINE", "`?` dims", "Results:", "fn.stats", "fn.ir",
                  "fn.llvm_ir", "fn.asm", "GirArgumentError", "by parameter name"):
        assert topic in doc, topic


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        gir.cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"gir {gir.__version__}"


def test_run_verbose_reports_the_compile(tmp_path: Path) -> None:
    path = tmp_path / "m.gir"
    path.write_text(SOURCE.replace("tensor<3xf32>", "tensor<3x3xf32>").replace("%x + %w", "%x @ %w"))
    proc = subprocess.run([sys.executable, "-m", "gir.cli", "run", str(path), "-v"], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "GIR_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "@f on cpu:"
    assert "compiled @f for cpu (3x3, 3x3, scalar)" in proc.stderr and "code cache: miss" in proc.stderr
    assert "BLAS threads:" in proc.stderr and "stages: specialize" in proc.stderr
    assert re.search(rf"GEMM {re.escape(str(path))}:4:\d+: f32 3x3 @ 3x3 -> (mkl|openblas)", proc.stderr), proc.stderr
    # the providers this function calls, not the ones installed (issue 30)
    path_of = re.search(r"f32 3x3 @ 3x3 -> (\S+)", proc.stderr).group(1)  # type: ignore[union-attr]
    from gir.backend.cpu.blas import provider_of
    assert f"BLAS: the code calls {provider_of(path_of)}" in proc.stderr, proc.stderr


def test_adamw_without_params_is_a_gir_error() -> None:
    """The weight decay needs the parameters: a GirArgumentError saying how to call it, not a
    raw ValueError."""
    opt = gir.optim.adamw(1e-2)
    params = {"w": np.ones(3)}
    with pytest.raises(gir.GirError, match=r"optimizer.update\(grads, state, params\)"):
        opt.update(params, opt.init(params))


@pytest.mark.parametrize("op", ["//", "%"])
def test_floor_ops_on_floats_are_located_errors(op: str) -> None:
    """// and % exist on integers only: on floats a GirError at the user's line that says so."""
    def f(x):  # noqa: ANN001, ANN202
        return x // 2.0 if op == "//" else x % 2.0

    with pytest.raises(gir.GirError, match=rf"{re.escape(op)} on f64: gir has no floor for floats") as info:
        gir.jit(f, device="interp")(np.ones(3))
    assert "test_api.py:" in str(info.value)
