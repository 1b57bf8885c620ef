"""A bidirectional GRU tagger with a masked loss, written as a JAX user writes it and trained
end to end in one jitted step (forward pass, back-propagation through both directions, Adam
with global-norm clipping).

The task (synthetic, nothing downloaded): sentences of random token ids of varying length,
padded to a common length; the tag of a token is 1 when the token is larger than both of its
neighbours (a local peak), so a tag needs the left and the right context. Padding is masked
out of the loss with a bool mask.

    python examples/train_gru_tagger.py                # 300 steps
    python examples/train_gru_tagger.py --steps 20     # a smoke run: prints `loss 0.693` lines

What it uses: `gir.scan` (forward and `reverse=True`), fused-gate slicing `gx[:, :H]`,
`gir.nn.log_softmax`, `gir.numpy.take_along_axis`, a bool mask times a float tensor
(promotion), `gir.value_and_grad(..., has_aux=True)` for the accuracy, and `gir.optim`.
"""

from __future__ import annotations

import argparse
import sys

import gir
import gir.numpy as gnp
import numpy as np


def make_batch(rng: np.random.Generator, batch: int, length: int, vocab: int) -> tuple[np.ndarray, ...]:
    """(ids T x B, tags T x B, mask T x B): time-major, padded with id 0 after each sentence."""
    lengths = rng.integers(length // 2, length + 1, size=batch)
    ids = rng.integers(1, vocab, size=(length, batch)).astype(np.int32)
    mask = np.arange(length)[:, None] < lengths[None, :]
    ids = np.where(mask, ids, 0).astype(np.int32)
    left = np.concatenate([np.zeros((1, batch), np.int32), ids[:-1]])
    right = np.concatenate([ids[1:], np.zeros((1, batch), np.int32)])
    right = np.where(np.arange(length)[:, None] + 1 < lengths[None, :], right, 0)
    tags = ((ids > left) & (ids > right) & mask).astype(np.int32)
    return ids, tags, mask


def init_params(rng: np.random.Generator, vocab: int, embed: int, hidden: int, dtype: type = np.float32) -> dict:
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

    def gru() -> dict:
        # fused gates: one input and one recurrent matrix for (reset, update, candidate)
        return {"wx": w(embed, 3 * hidden), "wh": w(hidden, 3 * hidden), "b": np.zeros(3 * hidden, dtype)}

    return {"emb": w(vocab, embed), "fwd": gru(), "bwd": gru(), "out": w(2 * hidden, 2), "out_b": np.zeros(2, dtype)}


def gru_layer(p: dict, xs, h0, reverse: bool):
    """A GRU over xs (T x B x E), reading backwards when reverse; the hidden state per step."""
    hidden = p["wh"].shape[0]
    gx = xs @ p["wx"] + p["b"]                       # every step's input projection: one GEMM

    def step(h, g):
        gh = h @ p["wh"]
        r = gir.sigmoid(g[:, :hidden] + gh[:, :hidden])
        z = gir.sigmoid(g[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
        n = gir.tanh(g[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        h = (1.0 - z) * n + z * h
        return h, h

    _, hs = gir.scan(step, h0, gx, reverse=reverse)
    return hs


def loss_fn(params: dict, ids, tags, mask):
    """Mean cross-entropy over the real (unmasked) tokens; aux: the tagging accuracy."""
    xs = params["emb"][ids]                          # T x B x E, a gather
    h0 = gnp.zeros((ids.shape[1], params["fwd"]["wh"].shape[0]), xs.dtype)
    both = gnp.concatenate([gru_layer(params["fwd"], xs, h0, False),
                            gru_layer(params["bwd"], xs, h0, True)], axis=-1)
    logits = both @ params["out"] + params["out_b"]  # T x B x 2
    logp = gir.nn.log_softmax(logits, axis=-1)
    picked = gnp.take_along_axis(logp, gnp.expand_dims(tags, -1), axis=-1)[..., 0]
    count = gnp.sum(mask)
    loss = -gnp.sum(picked * mask) / count           # bool mask times float: promoted
    correct = (gnp.argmax(logits, axis=-1) == tags) & mask
    return loss, gnp.sum(correct) / count


def make_step(optimizer: gir.optim.GradientTransformation, device: str = "cpu"):
    @gir.jit
    def train_step(params, opt_state, ids, tags, mask):
        (loss, accuracy), grads = gir.value_and_grad(loss_fn, has_aux=True)(params, ids, tags, mask)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return gir.optim.apply_updates(params, updates), opt_state, loss, accuracy

    return gir.jit(train_step.fn, device=device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    params = init_params(rng, args.vocab, 16, args.hidden)
    optimizer = gir.optim.chain(gir.optim.clip_by_global_norm(1.0), gir.optim.adam(args.lr))
    opt_state = optimizer.init(params)
    step = make_step(optimizer, args.device)
    every = max(1, args.steps // 10)
    for i in range(args.steps):
        ids, tags, mask = make_batch(rng, args.batch, args.length, args.vocab)
        params, opt_state, loss, accuracy = step(params, opt_state, ids, tags, mask)
        if i % every == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.4f}  accuracy {float(accuracy):.3f}", flush=True)
    ids, tags, mask = make_batch(np.random.default_rng(1), 256, args.length, args.vocab)
    _, accuracy = gir.jit(loss_fn, device=args.device)(params, ids, tags, mask)
    print(f"held-out accuracy {float(accuracy):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
