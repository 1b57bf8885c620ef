"""gir against JAX itself (issue 30: a JAX user's program gives "the same losses as JAX in
float64"): the bidirectional GRU tagger of examples/train_gru_tagger.py, its loss function's
own source run under JAX (the names `gir` and `gnp` rebound to JAX's), against gir's compile of
it: loss, accuracy and every gradient, then three training steps (Adam after global-norm
clipping) against optax's. Skipped where JAX (or optax) is not installed: CI installs neither
(`pip install jax optax` to run them; 2026-11-28: JAX 0.10.2, optax on CPython 3.11)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import gir
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_gru_tagger.py"
_spec = importlib.util.spec_from_file_location("train_gru_tagger_vs_jax", EXAMPLE)
assert _spec is not None and _spec.loader is not None
tagger = importlib.util.module_from_spec(_spec)
sys.modules["train_gru_tagger_vs_jax"] = tagger
_spec.loader.exec_module(tagger)


def under_jax(fn: types.FunctionType, scope: dict) -> types.FunctionType:
    """fn's own code with its globals' `gir` and `gnp` rebound to JAX's (and its helpers to
    theirs): the test runs the example's source, not a transcription of it."""
    return types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)


def jax_namespace() -> dict:
    shim = types.SimpleNamespace(sigmoid=jax.nn.sigmoid, tanh=jnp.tanh, scan=jax.lax.scan,
                                 nn=types.SimpleNamespace(log_softmax=jax.nn.log_softmax))
    scope = {**tagger.__dict__, "gir": shim, "gnp": jnp}
    scope["gru_layer"] = under_jax(tagger.gru_layer, scope)
    return scope


def jax_loss():  # noqa: ANN201
    return under_jax(tagger.loss_fn, jax_namespace())


def problem(seed: int = 3):  # noqa: ANN201
    rng = np.random.default_rng(seed)
    params = tagger.init_params(rng, vocab=9, embed=4, hidden=5, dtype=np.float64)
    return params, *tagger.make_batch(rng, batch=3, length=6, vocab=9)


def max_rel(a, b) -> float:  # noqa: ANN001
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


@pytest.mark.parametrize("device", ["interp", "cpu"])
def test_tagger_loss_accuracy_and_gradients_equal_jax(device: str) -> None:
    params, ids, tags, mask = problem()
    (loss, accuracy), grads = gir.jit(gir.value_and_grad(tagger.loss_fn, has_aux=True), device=device)(
        params, ids, tags, mask)
    (j_loss, j_accuracy), j_grads = jax.jit(jax.value_and_grad(jax_loss(), has_aux=True))(
        params, jnp.asarray(ids), jnp.asarray(tags), jnp.asarray(mask))
    assert abs(float(loss) - float(j_loss)) <= 1e-12 * abs(float(j_loss))
    # count / count of integers is float32 in gir, as in JAX without x64 (docs/python.md); JAX
    # here runs with x64 on (float64 everywhere else), so the accuracy agrees to float32's precision
    assert np.asarray(accuracy).dtype == np.float32
    assert float(accuracy) == pytest.approx(float(j_accuracy), rel=1e-7)
    leaves, j_leaves = gir.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(j_grads)
    assert len(leaves) == len(j_leaves) == 9  # emb, 3 per direction, out, out_b
    for g, j in zip(leaves, j_leaves):
        assert np.shape(g) == np.shape(j) and max_rel(g, j) < 1e-10


def test_tagger_training_steps_equal_optax() -> None:
    optax = pytest.importorskip("optax")
    params, ids, tags, mask = problem(5)
    ours = gir.optim.chain(gir.optim.clip_by_global_norm(1.0), gir.optim.adam(1e-2))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    step = tagger.make_step(ours, "cpu")
    loss_of = jax_loss()

    @jax.jit
    def j_step(p, state, ids, tags, mask):  # noqa: ANN001, ANN202
        (loss, _), grads = jax.value_and_grad(loss_of, has_aux=True)(p, ids, tags, mask)
        updates, state = theirs.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    p, state = params, ours.init(params)
    jp, jstate = jax.tree_util.tree_map(jnp.asarray, params), theirs.init(params)
    rng = np.random.default_rng(7)
    for _ in range(3):
        ids, tags, mask = tagger.make_batch(rng, batch=3, length=6, vocab=9)
        p, state, loss, _ = step(p, state, ids, tags, mask)
        jp, jstate, j_loss = j_step(jp, jstate, ids, tags, mask)
        assert abs(float(loss) - float(j_loss)) <= 1e-12 * abs(float(j_loss))
    for a, b in zip(gir.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(jp)):
        assert max_rel(a, b) < 1e-10


def test_charlm_loss_and_gradients_equal_jax() -> None:
    """examples/train_charlm.py's loss (a GRU language model: embedding gather, scan, flat
    target indexing, logsumexp), its own source under JAX, in float64."""
    spec = importlib.util.spec_from_file_location("train_charlm_vs_jax", EXAMPLE.parent / "train_charlm.py")
    assert spec is not None and spec.loader is not None
    charlm = importlib.util.module_from_spec(spec)
    sys.modules["train_charlm_vs_jax"] = charlm
    spec.loader.exec_module(charlm)
    shim = types.SimpleNamespace(sigmoid=jax.nn.sigmoid, tanh=jnp.tanh, scan=jax.lax.scan, mean=jnp.mean,
                                 logsumexp=jax.scipy.special.logsumexp)
    scope = {**charlm.__dict__, "gir": shim}
    scope["gru_cell"] = under_jax(charlm.gru_cell, scope)
    j_loss_fn = under_jax(charlm.loss, scope)
    rng = np.random.default_rng(11)
    V, E, H, T, B = 7, 5, 6, 8, 3
    p = {k: v.astype(np.float64) for k, v in charlm.init(V, E, H, rng).items()}
    inputs = rng.integers(0, V, (T, B)).astype(np.int32)
    targets = charlm.flat_targets(rng.integers(0, V, (T, B)).astype(np.int32), V)
    h0 = np.zeros((B, H))
    value, grads = gir.jit(gir.value_and_grad(charlm.loss), device="cpu")(p, inputs, targets, h0)
    j_value, j_grads = jax.jit(jax.value_and_grad(j_loss_fn))(p, inputs, targets, h0)
    assert abs(float(value) - float(j_value)) <= 1e-12 * abs(float(j_value))
    assert sorted(grads) == sorted(j_grads)
    for name in grads:
        assert max_rel(grads[name], j_grads[name]) < 1e-10, name
