"""Edge cases where every entry point and every device must say the same thing.

- Call cycles: gir has no control flow to end a recursion, so a function that calls itself
  (directly, through other functions, or through `grad`) is a verifier error at the call that
  closes the cycle, from gir.parse, gir.jit, the passes (a module built through the API reaches
  `inline` unverified) and the CLI, which prints file:line:col and exits 1, never hangs.
- Reductions over an empty axis: `sum` gives 0, `mean` gives nan (0/0), `reduce_max` and
  `reduce_min` raise the same GirError at the op on the interpreter, the CPU and the GPU.
- Integer division of the minimum by -1 wraps to the minimum (NumPy) on every device.
- A loop of zero steps over a `?` sequence: the initial carries and empty stacks of the
  right shape, on the interpreter (run on the IR as written, `?` dims and all) as on the CPU.

GPU cases run in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.errors import GirError
from gir.passes.pipeline import parse_pipeline
from gir.passes.rewriter import PassStatistics
from gir.testing import assert_all_close

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's mean of no element


def _gpu_missing() -> str | None:
    """Why the gpu backend cannot run here, or None."""
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "the GPU backend needs numba-cuda (pip install 'gir[gpu]')"
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except GirError as e:
        return f"no GPU backend here: {e.message}"
    return None


GPU_MISSING = _gpu_missing()
GPU = pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu] + ([pytest.mark.skip(reason=GPU_MISSING)]
                                                                if GPU_MISSING else []))
DEVICES = ["interp", "cpu", GPU]


@pytest.fixture(autouse=True, scope="module")
def fresh_code_cache(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The CPU backend's disk cache of its own: code compiled by the backend as it is now."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIR_CACHE_DIR", str(tmp_path_factory.mktemp("gir-cache")))
        yield


# ---------------------------------------------------------------------------------------------
# Call cycles

SELF = """\
func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  return @f(%a)
}
"""

MUTUAL = """\
func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = @g(%a)
  return %b
}

func @g(%a: tensor<4xf32>) -> tensor<4xf32> {
  %c = tanh(%a)
  return @f(%c)
}
"""

THROUGH_GRAD = """\
func @loss(%a: tensor<4xf32>) -> tensor<f32> {
  %l, %d = grad @loss(%a) wrt (%a)
  return sum(%d)
}
"""

NOT_A_CYCLE = """\
func @sq(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a * %a
}

func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = @sq(%a)
  return @sq(%b) + @sq(%a)
}
"""


@pytest.mark.parametrize(("source", "where", "message"), [
    (SELF, "2:10", "@f calls itself"),
    (MUTUAL, "8:10", "@f calls itself through @g"),
    (THROUGH_GRAD, "2:12", "@loss calls itself"),
], ids=["self", "mutual", "grad"])
def test_a_call_cycle_is_a_located_error(source: str, where: str, message: str) -> None:
    line, col = map(int, where.split(":"))
    for entry in (lambda: gir.parse(source, filename="cycle.gir"), lambda: gir.jit(source, "f")):
        with pytest.raises(gir.GirVerifyError) as info:
            entry()
        assert info.value.message == message
        assert (info.value.loc.line, info.value.loc.col) == (line, col)


def test_a_function_called_twice_is_no_cycle() -> None:
    x = np.arange(4, dtype=np.float32)
    (y,) = gir.jit(NOT_A_CYCLE, "f")(x)
    np.testing.assert_allclose(y, x**4 + x**2)


def _closed_into_cycle() -> gir.Module:
    """MUTUAL, parsed with @g calling a harmless @h, then @g's call pointed at @f: nothing has
    verified the module since."""
    module = gir.parse(MUTUAL.replace("return @f(%c)", "return @h(%c)")
                       + "\nfunc @h(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a\n}\n")
    call = next(op for op in module.functions["g"].walk() if op.name == "call")
    call.attrs["callee"] = "f"
    return module


def test_inline_stops_at_a_cycle_in_an_unverified_module() -> None:
    (inline,) = parse_pipeline("inline")
    with pytest.raises(gir.GirVerifyError, match="@f calls itself through @g") as info:
        inline.run(_closed_into_cycle(), PassStatistics())
    assert (info.value.loc.line, info.value.loc.col) == (8, 10)
    with pytest.raises(gir.GirVerifyError, match="@f calls itself through @g"):
        gir.verify(_closed_into_cycle())


def test_jit_of_an_unverified_module_reports_its_own_error() -> None:
    """gir.jit verifies a Module it is given, so the cycle is not blamed on the first pass."""
    with pytest.raises(gir.GirVerifyError) as info:
        gir.jit(_closed_into_cycle(), "f")
    assert info.value.message == "@f calls itself through @g"
    assert (info.value.loc.line, info.value.loc.col) == (8, 10)


def test_the_interpreter_stops_at_a_cycle_in_an_unverified_module() -> None:
    module = _closed_into_cycle()
    with pytest.raises(gir.GirVerifyError, match="calls itself"):
        gir.interpret(module, "f", np.zeros(4, np.float32))


CLI_CASES = {
    "opt": ["opt"],
    "opt-inline": ["opt", "-p", "inline"],
    "run": ["run", "--random", "0"],
    "compile": ["compile", "-e", "f", "--emit", "llvm", "-o", "out.ll"],
}


@pytest.mark.parametrize("argv", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_cli_reports_a_call_cycle_without_traceback(tmp_path: Path, argv: list[str]) -> None:
    path = tmp_path / "mutual.gir"
    path.write_text(MUTUAL)
    proc = subprocess.run([sys.executable, "-m", "gir.cli", *argv, str(path)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"{path}:8:10: error: @f calls itself through @g\n"), proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------
# Reductions over an empty axis

EMPTY_REDUCTIONS = """\
func @f(%x: tensor<0x3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<0xf32>) {
  %s = sum(%x, axes=[0])
  %m = mean(%x, axes=[0])
  %all = mean(%x)
  %rows = max(%x, axes=[1])
  return %s, %m, %all, %rows
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_sum_and_mean_over_no_element(device: str) -> None:
    s, m, total, rows = gir.jit(EMPTY_REDUCTIONS, "f", device=device)(np.zeros((0, 3), np.float32))
    np.testing.assert_array_equal(s, np.zeros(3, np.float32))
    assert m.shape == (3,) and np.isnan(m).all(), m
    assert total.shape == () and np.isnan(total), total
    assert rows.shape == (0,)  # max over a non-empty axis of no row: no element, no error


def _empty_max(name: str, dtype: str) -> str:
    return (f"func @f(%x: tensor<2x0x{dtype}>, %y: tensor<2x{dtype}>) -> tensor<2x{dtype}> {{\n"
            f"  %z = {name}(%x, axes=[1])\n"
            f"  return %z + %y\n"
            "}\n")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dtype", ["f32", "i64"])
def test_max_and_min_over_no_element_raise_at_the_op(device: str, name: str, dtype: str) -> None:
    fn = gir.jit(_empty_max(name, dtype), "f", device=device)  # compiles: the error is the call's
    args = [np.zeros((2, 0), dtype=dtype.replace("f", "float").replace("i", "int")),
            np.ones(2, dtype=dtype.replace("f", "float").replace("i", "int"))]
    with pytest.raises(GirError) as info:
        fn(*args)
    assert info.value.message == (f"'reduce_{name}' of no element has no value: axis 1 of its 2x0 operand is empty"
                                  " at run time")
    assert (info.value.loc.line, info.value.loc.col) == (2, 8)


LOOP_OF_EMPTY_MAX = """\
func @f(%xs: tensor<?x0xf32>, %h: tensor<f32>) -> tensor<f32> {
  %out = scan (%x in %xs) carry (%c = %h) {
    %c.1 = %c + max(%x)
    yield (%c.1)
  } : tensor<f32>
  return %out
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_max_in_a_loop_raises_only_when_a_step_runs(device: str) -> None:
    fn = gir.jit(LOOP_OF_EMPTY_MAX, "f", device=device)
    h = np.array(2.0, np.float32)
    (out,) = fn(np.zeros((0, 0), np.float32), h)
    assert out == 2.0
    with pytest.raises(GirError, match="'reduce_max' of no element has no value"):
        fn(np.zeros((3, 0), np.float32), h)


# ---------------------------------------------------------------------------------------------
# Integer division at the minimum


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["i32", "i64"])
def test_minimum_divided_by_minus_one_wraps(device: str, dtype: str) -> None:
    source = f"func @f(%x: tensor<2x{dtype}>, %y: tensor<2x{dtype}>) -> tensor<2x{dtype}> {{\n  return %x / %y\n}}\n"
    np_dtype = np.dtype(dtype.replace("i", "int"))
    low = np.iinfo(np_dtype).min
    x = np.array([low, low], np_dtype)
    y = np.array([-1, 1], np_dtype)
    (q,) = gir.jit(source, "f", device=device)(x, y)
    np.testing.assert_array_equal(q, np.floor_divide(x, y))
    np.testing.assert_array_equal(q, np.array([low, low], np_dtype))


# ---------------------------------------------------------------------------------------------
# Loops of zero steps

ZERO_STEPS = """\
func @f(%xs: tensor<?x3xf32>, %h: tensor<3xf32>) -> (tensor<3xf32>, tensor<?x3xf32>, tensor<?x2x3xf32>) {
  %last, %hs, %pairs = scan (%x in %xs) carry (%c = %h) {
    %c.1 = tanh(%c + %x)
    %pair = stack(%c, %c.1, axis=0)
    yield (%c.1) stack (%c.1, %pair)
  } : tensor<3xf32>, tensor<?x3xf32>, tensor<?x2x3xf32>
  return %last, %hs, %pairs
}
"""


@pytest.mark.parametrize("steps", [0, 2])
def test_a_loop_of_zero_steps_over_an_unknown_length(steps: int) -> None:
    xs = np.ones((steps, 3), np.float32)
    h = np.array([0.5, -0.5, 0.0], np.float32)
    want = gir.interpret(gir.parse(ZERO_STEPS), "f", xs, h)  # the IR as written: `?` stacks
    assert_all_close(gir.jit(ZERO_STEPS, "f", device="interp")(xs, h), want)  # specialised first
    assert_all_close(gir.jit(ZERO_STEPS, "f", device="cpu")(xs, h), want)
    if steps == 0:
        np.testing.assert_array_equal(want[0], h)
        assert want[1].shape == (0, 3) and want[2].shape == (0, 2, 3)


UNKNOWN_ELEMENT = ZERO_STEPS.replace("3xf32", "?xf32")
"""ZERO_STEPS with every 3 a `?`: the stacked values' element shapes are unknown too."""


def test_a_loop_of_zero_steps_whose_element_has_unknown_dims() -> None:
    """The IR as written cannot tell the empty stack's shape, but the arguments do: the
    interpreter specialises the `?` dims on them, as gir.jit does, and gives the CPU backend's
    answer (it refused before: 'cannot tell the shape of its stacked tensor')."""
    xs, h = np.ones((0, 3), np.float32), np.zeros(3, np.float32)
    module = gir.parse(UNKNOWN_ELEMENT)
    want = gir.interpret(module, "f", xs, h)
    assert want[1].shape == (0, 3) and want[2].shape == (0, 2, 3)
    assert_all_close(gir.jit(module, "f", device="interp")(xs, h), want)
    assert_all_close(gir.jit(module, "f", device="cpu")(xs, h), want)
