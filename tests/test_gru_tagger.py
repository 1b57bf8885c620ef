"""examples/train_gru_tagger.py: its masked loss equals a NumPy forward pass in float64, its
gradients equal finite differences of that NumPy loss, and a short run learns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gir
import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_gru_tagger.py"
_spec = importlib.util.spec_from_file_location("train_gru_tagger", EXAMPLE)
assert _spec is not None and _spec.loader is not None
tagger = importlib.util.module_from_spec(_spec)
sys.modules["train_gru_tagger"] = tagger
_spec.loader.exec_module(tagger)


def numpy_loss(params: dict, ids: np.ndarray, tags: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    def gru(p, xs, reverse):
        hidden = p["wh"].shape[0]
        h = np.zeros((xs.shape[1], hidden))
        out = [None] * xs.shape[0]
        for t in (reversed(range(xs.shape[0])) if reverse else range(xs.shape[0])):
            g, gh = xs[t] @ p["wx"] + p["b"], h @ p["wh"]
            r = sigmoid(g[:, :hidden] + gh[:, :hidden])
            z = sigmoid(g[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
            n = np.tanh(g[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
            h = (1 - z) * n + z * h
            out[t] = h
        return np.stack(out)

    xs = params["emb"][ids]
    both = np.concatenate([gru(params["fwd"], xs, False), gru(params["bwd"], xs, True)], axis=-1)
    logits = both @ params["out"] + params["out_b"]
    m = logits.max(-1, keepdims=True)
    logp = logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))
    picked = np.take_along_axis(logp, tags[..., None], axis=-1)[..., 0]
    loss = -(picked * mask).sum() / mask.sum()
    accuracy = ((logits.argmax(-1) == tags) & mask).sum() / mask.sum()
    return float(loss), float(accuracy)


@pytest.mark.parametrize("device", ["interp", "cpu"])
def test_loss_and_gradients_match_numpy_in_float64(device) -> None:
    rng = np.random.default_rng(3)
    params = tagger.init_params(rng, vocab=7, embed=3, hidden=4, dtype=np.float64)
    ids, tags, mask = tagger.make_batch(rng, batch=3, length=5, vocab=7)
    (loss, accuracy), grads = gir.jit(gir.value_and_grad(tagger.loss_fn, has_aux=True), device=device)(
        params, ids, tags, mask)
    want_loss, want_accuracy = numpy_loss(params, ids, tags, mask)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(accuracy, want_accuracy, rtol=1e-6)
    eps = 1e-6
    for path in [("emb",), ("fwd", "wx"), ("fwd", "wh"), ("bwd", "wh"), ("bwd", "b"), ("out",), ("out_b",)]:
        leaf = params
        grad = grads
        for k in path:
            leaf, grad = leaf[k], grad[k]
        for index in list(np.ndindex(leaf.shape))[::3]:
            saved = leaf[index]
            leaf[index] = saved + eps
            plus = numpy_loss(params, ids, tags, mask)[0]
            leaf[index] = saved - eps
            minus = numpy_loss(params, ids, tags, mask)[0]
            leaf[index] = saved
            np.testing.assert_allclose(grad[index], (plus - minus) / (2 * eps), atol=1e-8, err_msg=str(path))


def test_a_short_run_learns(capsys: pytest.CaptureFixture[str]) -> None:
    assert tagger.main(["--steps", "40", "--batch", "16", "--hidden", "16"]) == 0
    out = capsys.readouterr().out
    losses = [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if "loss " in line]
    assert losses[-1] < losses[0] - 0.15, out
    held_out = float(out.rsplit("held-out accuracy ", 1)[1])
    assert held_out > 0.8, out
