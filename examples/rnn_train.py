"""A vanilla (Elman) RNN training step written in Python: the same model as examples/rnn.gir.

    h_t = tanh(x_t @ wx + h_{t-1} @ wh + b),   loss = sum over t of sum(h_t ** 2)

`rnn_loss` is traced into the IR that rnn.gir's @rnn_loss is (one `scan`); `gir.value_and_grad`
adds the `grad` op of @rnn_grads, so the same passes (autodiff, scan-grad) apply.

    python examples/rnn_train.py            # a few SGD steps on random data, on the CPU
    python examples/rnn_train.py --print    # the traced .gir text of one training step
"""

from __future__ import annotations

import sys

import gir
import numpy as np

T, BATCH, HIDDEN = 50, 32, 256  # the sizes of examples/rnn.gir


def rnn_loss(params, xs, h0):
    def step(carry, x):
        h, loss = carry
        h = gir.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        return (h, loss + gir.sum(h * h)), h          # carry (h, loss); stack h (rnn.gir's %hs)

    (h, loss), hs = gir.scan(step, (h0, 0.0), xs)
    return loss


def sgd_step(params, xs, h0, lr):
    """One training step: the loss, and the parameters after one step of gradient descent."""
    loss, grads = gir.value_and_grad(rnn_loss)(params, xs, h0)
    return loss, {k: params[k] - lr * grads[k] for k in params}


def init_params(rng: np.random.Generator, n_in: int = HIDDEN, n_hidden: int = HIDDEN) -> dict[str, np.ndarray]:
    scale = 1.0 / np.sqrt(n_hidden)
    return {"wx": (scale * rng.standard_normal((n_in, n_hidden))).astype(np.float32),
            "wh": (scale * rng.standard_normal((n_hidden, n_hidden))).astype(np.float32),
            "b": np.zeros(n_hidden, np.float32)}


def data(rng: np.random.Generator, t: int = T, batch: int = BATCH, n_in: int = HIDDEN):
    xs = rng.standard_normal((t, batch, n_in)).astype(np.float32)
    return xs, np.zeros((batch, HIDDEN), np.float32)


def main(argv: list[str]) -> None:
    rng = np.random.default_rng(0)
    params, (xs, h0) = init_params(rng), data(rng)
    if "--print" in argv:
        print(gir.trace(sgd_step, params, xs, h0, np.float32(0.01)))
        return
    step = gir.jit(sgd_step)
    for i in range(5):
        loss, params = step(params, xs, h0, np.float32(1e-4))
        print(f"step {i}: loss {float(loss):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
