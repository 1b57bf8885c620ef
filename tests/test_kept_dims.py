"""`?` dims kept whole by `slice` and `reshape` in `.gir` text (issue 30): `limits = [?, 6]`
takes an axis whole, `shape = [?, ?, 1]` keeps the input's dims at those positions. Both
parsers read it alike, the printer writes it back, the interpreter is the oracle against
NumPy, the CPU backend against the interpreter, the gradient against finite differences.
"""

from __future__ import annotations

import re

import gir
import numpy as np
import pytest
from gir.errors import GirError
from test_fast_parser import check  # type: ignore[import-not-found]

# The fused-gate pattern with a variable batch, and a T x B mask made T x B x 1.
GATES = """func @gates(%g: tensor<?x18xf64>, %m: tensor<?x?xf64>)
    -> (tensor<?x6xf64>, tensor<?x12xf64>, tensor<?x?x1xf64>) {
  %a = slice %g {starts = [0, 0], limits = [?, 6]} : tensor<?x6xf64>
  %b = slice %g {starts = [1, 6], limits = [?, 18], steps = [2, 1]} : tensor<?x12xf64>
  %r = reshape %m {shape = [?, ?, 1]} : tensor<?x?x1xf64>
  return %a, %b, %r
}

func @loss(%g: tensor<?x18xf64>, %m: tensor<?x?xf64>, %x: tensor<?x?x4xf64>) -> tensor<f64> {
  %z = slice(%g, starts=[0, 0], limits=[?, 6])
  %n = slice(%g, starts=[0, 6], limits=[?, 12])
  %h = tanh(%z) * %n
  %mask = reshape(%m, shape=[?, ?, 1])
  %flat = reshape(%x, shape=[?, -1])
  return sum(%h * %h) + sum(%mask * %x) + sum(%flat)
}

func @grads(%g: tensor<?x18xf64>, %m: tensor<?x?xf64>, %x: tensor<?x?x4xf64>)
    -> (tensor<f64>, tensor<?x18xf64>, tensor<?x?x4xf64>) {
  %l, %dg, %dx = grad @loss(%g, %m, %x) wrt (%g, %x)
  return %l, %dg, %dx
}
"""


def _inputs(rng: np.random.Generator, t: int = 4, b: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return rng.standard_normal((b, 18)), (rng.random((t, b)) > 0.5).astype(np.float64), rng.standard_normal((t, b, 4))


def _numpy_loss(g: np.ndarray, m: np.ndarray, x: np.ndarray) -> float:
    h = np.tanh(g[:, :6]) * g[:, 6:12]
    return float((h * h).sum() + (m[..., None] * x).sum() + x.reshape(x.shape[0], -1).sum())


def test_both_parsers_agree_and_the_printer_round_trips() -> None:
    module = gir.parse(GATES)
    printed = str(module)
    assert "limits = [?, 6]" in printed and "shape = [?, ?, 1]" in printed
    assert str(gir.parse(printed)) == printed
    with gir.config.override(parser="lark"):
        assert str(gir.parse(GATES)) == printed
    assert check(GATES, must_parse=True)  # the same AST, token by token (tests/test_fast_parser.py)
    assert check(GATES.replace("[?, 6]", "[?,, 6]")) is False  # both reject a stray comma


def _need(device: str) -> None:
    """The gpu case: a GPU, or numba's CUDA simulator (set above); skipped where neither runs."""
    if device != "gpu":
        return
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda")
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except GirError as e:
        pytest.skip(f"no GPU backend here: {e.message}")


@pytest.mark.parametrize("device", ["interp", "cpu", "gpu"])
@pytest.mark.parametrize("batch", [1, 5])
def test_values_against_numpy(device: str, batch: int) -> None:
    _need(device)
    rng = np.random.default_rng(batch)
    g, m, _ = _inputs(rng, 4, batch)
    a, b, r = gir.jit(GATES, "gates", device=device)(g, m)
    np.testing.assert_array_equal(a, g[:, :6])
    np.testing.assert_array_equal(b, g[1::2, 6:])
    np.testing.assert_array_equal(r, m[..., None])
    # the unspecialised module too: the interpreter on `?` types
    a, b, r = gir.interpret(gir.parse(GATES), "gates", g, m)
    assert r.shape == (4, batch, 1) and b.shape == (len(range(1, batch, 2)), 12)


@pytest.mark.parametrize("device", ["interp", "cpu", "gpu"])  # gpu: two whole sums in one kernel (each its own tree)
def test_gradient_against_finite_differences(device: str) -> None:
    _need(device)
    rng = np.random.default_rng(7)
    g, m, x = _inputs(rng)
    loss, dg, dx = gir.jit(GATES, "grads", device=device)(g, m, x)
    assert loss == pytest.approx(_numpy_loss(g, m, x), rel=1e-12)
    eps = 1e-6
    for arr, got in ((g, dg), (x, dx)):
        numeric = np.zeros_like(arr)
        for i in np.ndindex(*arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[i] += eps
            minus[i] -= eps
            args = [(plus if a is arr else a) for a in (g, m, x)], [(minus if a is arr else a) for a in (g, m, x)]
            numeric[i] = (_numpy_loss(*args[0]) - _numpy_loss(*args[1])) / (2 * eps)
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("text, message", [
    ("reshape %x {shape = [?, ?, ?, 1]} : tensor<?x?x?x1xf32>", "keeps an input dim, but the input has 2"),
    ("reshape %x {shape = [?, 5]} : tensor<?x5xf32>", "besides the kept dims, 4 elements against 5"),
    ("slice %x {starts = [0, 5], limits = [?, ?]} : tensor<?x0xf32>", "out of range for a dim of size 4"),
])
def test_bad_kept_dims_are_located_errors(text: str, message: str) -> None:
    program = f"func @f(%x: tensor<?x4xf32>) {{\n  %y = {text}\n  return %y\n}}\n"
    with pytest.raises(GirError, match=re.escape(message)) as e:
        gir.parse(program)
    assert ":2:" in str(e.value)
