"""`?` dims end to end (issue 13, item 1): `grad` over `?` dims through calls and nested loops,
in `gir.jit` on interp, cpu and gpu (the CUDA simulator), in `gir.interpret`, and in `gir run` /
`gir compile` (`--inputs`, `--shape`).

The main case trains a small GRU (its cell a function called in the loop) for a few SGD steps
through ONE `gir.jit` function, with batches of different sizes and sequences of different
lengths. Oracles: `gir.interpret` on the module as written (the reference), a NumPy GRU for
the loss, and central finite differences of the NumPy loss for the gradient (float64).
"""

from __future__ import annotations

from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.testing import assert_all_close

GRU = """
func @cell(%x: tensor<?x3xf64>, %h: tensor<?x4xf64>, %wz: tensor<3x4xf64>, %wn: tensor<3x4xf64>,
           %uz: tensor<4x4xf64>, %un: tensor<4x4xf64>, %bz: tensor<4xf64>) -> tensor<?x4xf64> {
  %z = sigmoid(%x @ %wz + %h @ %uz + %bz)
  %n = tanh(%x @ %wn + %h @ %un)
  return (1.0 - %z) * %n + %z * %h
}

func @gru_loss(%xs: tensor<?x?x3xf64>, %h0: tensor<?x4xf64>, %wz: tensor<3x4xf64>, %wn: tensor<3x4xf64>,
               %uz: tensor<4x4xf64>, %un: tensor<4x4xf64>, %bz: tensor<4xf64>) -> tensor<f64> {
  %h = %h0
  %loss = constant 0.0 : tensor<f64>
  for %x in %xs {
    %h = @cell(%x, %h, %wz, %wn, %uz, %un, %bz)
    %loss = %loss + mean(%h * %h)
  }
  return %loss
}

func @gru_grads(%xs: tensor<?x?x3xf64>, %h0: tensor<?x4xf64>, %wz: tensor<3x4xf64>, %wn: tensor<3x4xf64>,
                %uz: tensor<4x4xf64>, %un: tensor<4x4xf64>, %bz: tensor<4xf64>)
    -> (tensor<f64>, tensor<3x4xf64>, tensor<3x4xf64>, tensor<4x4xf64>, tensor<4x4xf64>, tensor<4xf64>) {
  %loss, %dwz, %dwn, %duz, %dun, %dbz = grad @gru_loss(%xs, %h0, %wz, %wn, %uz, %un, %bz)
      wrt (%wz, %wn, %uz, %un, %bz)
  return %loss, %dwz, %dwn, %duz, %dun, %dbz
}
"""
PARAMS = ("wz", "wn", "uz", "un", "bz")
SIZES = [(3, 2), (5, 4), (2, 3), (3, 2), (1, 1)]
"""(steps, batch) of each SGD step: lengths and batches differ; (3, 2) comes back."""


def numpy_gru_loss(xs: np.ndarray, h0: np.ndarray, wz: np.ndarray, wn: np.ndarray, uz: np.ndarray,
                   un: np.ndarray, bz: np.ndarray) -> float:
    h, loss = h0, 0.0
    for x in xs:
        z = 1.0 / (1.0 + np.exp(-(x @ wz + h @ uz + bz)))
        n = np.tanh(x @ wn + h @ un)
        h = (1.0 - z) * n + z * h
        loss += float(np.mean(h * h))
    return loss


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"wz": (3, 4), "wn": (3, 4), "uz": (4, 4), "un": (4, 4), "bz": (4,)}
    return {k: 0.5 * rng.standard_normal(s) for k, s in shapes.items()}


def batches(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((t, b, 3)), 0.1 * rng.standard_normal((b, 4))) for t, b in SIZES]


def train(device: str, steps: int = len(SIZES)) -> tuple[gir.jit, list[float]]:  # type: ignore[valid-type]
    """SGD through one gir.jit function; every step checked against the reference and NumPy."""
    module = gir.parse(GRU)
    fn = gir.jit(module, "gru_grads", device=device)
    params = init_params(np.random.default_rng(0))
    losses = []
    for step, (xs, h0) in enumerate(batches(1)[:steps]):
        out = fn(xs, h0, **params)  # keyword arguments by parameter name
        want = gir.interpret(module, "gru_grads", xs, h0, *params.values())
        assert_all_close(out, want, what=f"{device} step {step} {xs.shape}")
        assert out._fields == ("loss", "dwz", "dwn", "duz", "dun", "dbz")
        np.testing.assert_allclose(out.loss, numpy_gru_loss(xs, h0, **params), rtol=1e-12)
        losses.append(float(out.loss))
        params = {k: params[k] - 0.5 * out._asdict()["d" + k] for k in PARAMS}
    return fn, losses


@pytest.mark.parametrize("device", ["interp", "cpu"])
def test_gru_sgd_with_variable_batch_and_length(device: str) -> None:
    fn, losses = train(device)
    # one specialisation per distinct shape, reused; on the CPU one per batch, which serves every
    # length (docs/backend.md, "One compile for every length"): here as many
    assert fn.specialisations == len(set(SIZES))
    assert len(set(losses)) == len(losses)


def need_gpu() -> None:
    """Skips unless the GPU backend can run: a GPU, or numba's CUDA simulator (set above)."""
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda")
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except gir.GirError as e:
        pytest.skip(f"no GPU backend here: {e.message}")


def test_gru_sgd_on_the_gpu_simulator() -> None:
    need_gpu()
    fn, _ = train("gpu", steps=3)
    assert len(fn._compiled) == 3


def test_gru_gradient_matches_finite_differences_of_numpy() -> None:
    """The gradient gir.jit computes for a `?` program, against the NumPy loss alone."""
    rng = np.random.default_rng(5)
    params = init_params(rng)
    xs, h0 = rng.standard_normal((4, 3, 3)), 0.1 * rng.standard_normal((3, 4))
    out = gir.jit(GRU, "gru_grads")(xs, h0, **params)
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    eps = 1e-6
    plus = numpy_gru_loss(xs, h0, **{k: v + eps * direction[k] for k, v in params.items()})
    minus = numpy_gru_loss(xs, h0, **{k: v - eps * direction[k] for k, v in params.items()})
    analytic = sum(float(np.sum(out._asdict()["d" + k] * direction[k])) for k in PARAMS)
    np.testing.assert_allclose(analytic, (plus - minus) / (2 * eps), rtol=1e-6)


NESTED_GRAD = """
func @f(%xss: tensor<?x?x?x3xf64>, %h0: tensor<?x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
  %h = %h0
  %loss = constant 0.0 : tensor<f64>
  for %xs in %xss {
    for %x in %xs {
      %h = tanh(%x @ %w + %h)
    }
    %loss = %loss + sum(%h * %h)
  }
  return %loss
}

func @g(%xss: tensor<?x?x?x3xf64>, %h0: tensor<?x3xf64>, %w: tensor<3x3xf64>) -> (tensor<f64>, tensor<3x3xf64>) {
  %loss, %dw = grad @f(%xss, %h0, %w) wrt (%w)
  return %loss, %dw
}
"""


def numpy_nested(xss: np.ndarray, h0: np.ndarray, w: np.ndarray) -> float:
    h, loss = h0, 0.0
    for xs in xss:
        for x in xs:
            h = np.tanh(x @ w + h)
        loss += float(np.sum(h * h))
    return loss


@pytest.mark.parametrize("device", ["interp", "cpu", "gpu"])
def test_grad_through_nested_loops_with_unknown_dims(device: str) -> None:
    if device == "gpu":
        need_gpu()
    rng = np.random.default_rng(2)
    module = gir.parse(NESTED_GRAD)
    fn = gir.jit(module, "g", device=device)
    w = 0.3 * rng.standard_normal((3, 3))
    for shape in ((2, 3, 2, 3), (3, 1, 4, 3)):
        xss, h0 = rng.standard_normal(shape), rng.standard_normal((shape[2], 3))
        out = fn(xss, h0, w)
        assert_all_close(out, gir.interpret(module, "g", xss, h0, w), what=f"{device} {shape}")
        np.testing.assert_allclose(out.loss, numpy_nested(xss, h0, w), rtol=1e-12)
        d = rng.standard_normal((3, 3))
        eps = 1e-6
        fd = (numpy_nested(xss, h0, w + eps * d) - numpy_nested(xss, h0, w - eps * d)) / (2 * eps)
        np.testing.assert_allclose(np.sum(out.dw * d), fd, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# The command line


@pytest.fixture
def gru_file(tmp_path: Path) -> Path:
    path = tmp_path / "gru.gir"
    path.write_text(GRU)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = gir.cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("device", ["interp", "cpu", "gpu"])
def test_run_inputs_specialises_a_grad_over_unknown_dims(gru_file: Path, tmp_path: Path, device: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    if device == "gpu":
        need_gpu()
    xs, h0 = batches(3)[1]
    params = init_params(np.random.default_rng(3))
    np.savez(tmp_path / "in.npz", xs=xs, h0=h0, **params)
    code, out, err = run_cli(capsys, "run", gru_file, "--inputs", tmp_path / "in.npz", "--device", device,
                             "--outputs", tmp_path / "out.npz")
    assert code == 0, err
    assert out.splitlines()[0] == f"@gru_grads on {device}:"
    assert out.splitlines()[1].startswith("loss: shape () float64")
    with np.load(tmp_path / "out.npz") as data:
        np.testing.assert_allclose(data["loss"], numpy_gru_loss(xs, h0, **params), rtol=1e-12)
        want = gir.interpret(gir.parse(GRU), "gru_grads", xs, h0, **params)
        for i, name in enumerate(want._fields):
            np.testing.assert_allclose(data[f"out{i}"], want[i], rtol=1e-10, atol=1e-12)
            np.testing.assert_array_equal(data[name], data[f"out{i}"])


def test_run_shape_flag_makes_random_inputs(gru_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", gru_file, "--shape", "xs=4x2x3,h0=2x4", "--random", "1")
    assert code == 0, err
    same = run_cli(capsys, "run", gru_file, "--shape", "xs=4x2x3", "--shape", "%h0=2x4", "--random", "1",
                   "--device", "interp")
    assert same[0] == 0 and same[1].splitlines()[1] == out.splitlines()[1]  # the same seeded inputs


@pytest.mark.parametrize("flags, message", [
    ((), "random inputs (--random) needs static shapes: %xs of @gru_grads is tensor<?x?x3xf64>; give its "
         "sizes with --shape xs=NxNx3"),
    (("--shape", "xs=4x2x3"), "%h0 of @gru_grads is tensor<?x4xf64>"),
    (("--shape", "xs=4x2"), "%xs of @gru_grads is tensor<?x?x3xf64>, of rank 3, not 2"),
    (("--shape", "xs=4x2x5,h0=2x4"), "dim 2 is 3, not 5"),
    (("--shape", "ys=4x2x3"), "@gru_grads has no parameter %ys; its parameters are %xs, %h0, %wz"),
    (("--shape", "xs=4xbx3"), "'b' is not a size"),
    (("--shape", "xs"), "write NAME=DIMS"),
    (("--shape", "xs=4x?x3,h0=2x4"), "%xs of @gru_grads is tensor<4x?x3xf64>"),
])
def test_run_shape_errors(gru_file: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
                          message: str) -> None:
    code, out, err = run_cli(capsys, "run", gru_file, *flags)
    assert code == 1 and out == ""
    assert "Traceback" not in err and message in err, err


def test_compile_needs_and_takes_shapes(gru_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "compile", gru_file, "--emit", "llvm", "-o", tmp_path / "a.ll")
    assert code == 1 and "gir compile needs static shapes: %xs" in err and "--shape xs=" in err
    code, _, err = run_cli(capsys, "compile", gru_file, "--emit", "llvm", "-o", tmp_path / "a.ll",
                           "--shape", "xs=6x2x3,h0=2x4")
    assert code == 0, err
    assert "define void @gir_main" in (tmp_path / "a.ll").read_text()


def test_opt_says_how_to_fix_a_grad_over_a_dynamic_carry(gru_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gir opt` has no arguments to specialise on: autodiff names the problem and the fixes."""
    code, _, err = run_cli(capsys, "opt", gru_file)
    assert code == 1
    assert err.startswith(f"{gru_file}:13:3: error: autodiff needs a static shape here: a zero gradient of "
                          "tensor<?x4xf64>"), err
    assert "--shape NAME=DIMS" in err
