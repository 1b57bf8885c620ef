"""`gir.jit(fn, device="gpu")` of a Python function: the same specialisation cache, run by the
GPU backend (Numba's CUDA simulator without a GPU: NUMBA_ENABLE_CUDASIM is set to 1 by
tests/conftest.py before numba is imported, unless it is set already)."""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gpu_support import device_or_skip

device_or_skip()

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


def test_jax_surface_on_the_gpu_matches_the_interpreter() -> None:
    """has_aux, stop_gradient, softmax, take_along_axis, cumsum, sin/cos, a bool mask and an
    Adam step of gir.optim, on the GPU backend against the interpreter (issue 30)."""
    import gir.numpy as gnp

    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
    x = rng.standard_normal((6, 4)).astype(np.float32)
    tags = rng.integers(0, 3, size=6).astype(np.int32)
    mask = np.array([True, True, False, True, False, True])
    opt = gir.optim.adam(1e-2)

    def loss(p, x, tags, mask):
        logits = gnp.cumsum(gir.sin(x) * gir.cos(x), axis=1) @ p["w"] + p["b"]
        logp = gir.nn.log_softmax(logits)
        picked = gnp.take_along_axis(logp, tags[:, None], axis=1)[:, 0]
        value = -gnp.sum(picked * mask) / gnp.sum(mask)
        return value + 0.0 * gnp.sum(gir.stop_gradient(logits)), gnp.argmax(logits, axis=1)

    def step(p, state, x, tags, mask):
        (value, best), grads = gir.value_and_grad(loss, has_aux=True)(p, x, tags, mask)
        updates, state = opt.update(grads, state, p)
        return value, best, gir.optim.apply_updates(p, updates), state

    state = opt.init(params)
    want = gir.jit(step, device="interp")(params, state, x, tags, mask)
    got = gir.jit(step, device="gpu")(params, state, x, tags, mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    for k in params:
        np.testing.assert_allclose(got[2][k], want[2][k], rtol=1e-5, atol=1e-6)


def test_vmap_batched_scan_and_grad_on_the_gpu_match_the_interpreter() -> None:
    """gir.vmap's batched scan (a per-sequence RNN) and batched grad (per-example gradients)
    on the GPU backend against the interpreter."""
    rng = np.random.default_rng(6)
    w = (0.5 * rng.standard_normal((3, 4))).astype(np.float32)
    xs = rng.standard_normal((5, 6, 3)).astype(np.float32)

    def per_sequence(w, seq):
        def loss(w):
            h, _ = gir.scan(lambda h, x: (gir.tanh(x @ w + h), None), gir.numpy.zeros(4, "f32"), seq)
            return gir.sum(h * h)
        return gir.value_and_grad(loss)(w)

    mapped = gir.vmap(per_sequence, in_axes=(None, 0))
    want = gir.jit(mapped, device="interp")(w, xs)
    got = gir.jit(mapped, device="gpu")(w, xs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)
