"""`gir.jit(fn, device="gpu")` of a Python function: the same specialisation cache, run by the
GPU backend (Numba's CUDA simulator without a GPU: NUMBA_ENABLE_CUDASIM is set to 1 here before
numba is imported, unless it is set already)."""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")

import gir  # noqa: E402
from gir.backend.gpu.device import get_device  # noqa: E402

try:
    get_device()
except gir.GirError as e:  # numba.cuda was imported without the simulator, and there is no GPU
    pytest.skip(f"no GPU backend here: {e.message}", allow_module_level=True)

pytestmark = [pytest.mark.gpu]


def rnn_loss(params, xs, h0):
    def step(h, x):
        h = gir.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        return h, gir.sum(h * h)
    _, per_step = gir.scan(step, h0, xs)
    return gir.sum(per_step)


def test_value_and_grad_on_the_gpu_matches_the_interpreter() -> None:
    rng = np.random.default_rng(0)
    params = {"wx": (0.5 * rng.standard_normal((3, 4))).astype(np.float32),
              "wh": (0.5 * rng.standard_normal((4, 4))).astype(np.float32),
              "b": (0.1 * rng.standard_normal(4)).astype(np.float32)}
    xs, h0 = rng.standard_normal((3, 2, 3)).astype(np.float32), np.zeros((2, 4), np.float32)
    want_loss, want = gir.jit(gir.value_and_grad(rnn_loss), device="interp")(params, xs, h0)
    step = gir.jit(gir.value_and_grad(rnn_loss), device="gpu")
    loss, grads = step(params, xs, h0)
    np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-5)
    assert set(grads) == set(params)
    for k in params:
        np.testing.assert_allclose(np.asarray(grads[k]), want[k], rtol=1e-4, atol=1e-5)
    step(params, xs, h0)
    assert step.specialisations == 1
