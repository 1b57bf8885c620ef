"""An LSTM training step written in Python: the same model as examples/lstm.gir.

    i, f, o = sigmoid(x @ w_* + h @ u_* + b_*),  g = tanh(x @ w_g + h @ u_g + b_g)
    c = f * c + i * g,  h = o * tanh(c),  loss = sum over t of sum(h ** 2)

The carry is a pytree: a tuple ((h, c), loss).

    python examples/lstm_train.py           # a few SGD steps on random data, on the CPU
"""

from __future__ import annotations

import sys

import gir
import numpy as np

T, BATCH, HIDDEN = 50, 32, 256  # the sizes of examples/lstm.gir
GATES = ["i", "f", "g", "o"]


def lstm_loss(params, xs, h0, c0):
    w, u, b = params["w"], params["u"], params["b"]

    def gate(name, x, h):
        return x @ w[name] + h @ u[name] + b[name]

    def step(carry, x):
        (h, c), loss = carry
        i = gir.sigmoid(gate("i", x, h))
        f = gir.sigmoid(gate("f", x, h))
        g = gir.tanh(gate("g", x, h))
        o = gir.sigmoid(gate("o", x, h))
        c = f * c + i * g
        h = o * gir.tanh(c)
        return ((h, c), loss + gir.sum(h * h)), h

    ((h, c), loss), hs = gir.scan(step, ((h0, c0), 0.0), xs)
    return loss


def sgd_step(params, xs, h0, c0, lr):
    loss, grads = gir.value_and_grad(lstm_loss)(params, xs, h0, c0)
    new = {kind: {g: params[kind][g] - lr * grads[kind][g] for g in GATES} for kind in params}
    return loss, new


def init_params(rng: np.random.Generator, n_in: int = HIDDEN, n_hidden: int = HIDDEN) -> dict:
    scale = 1.0 / np.sqrt(n_hidden)
    return {"w": {g: (scale * rng.standard_normal((n_in, n_hidden))).astype(np.float32) for g in GATES},
            "u": {g: (scale * rng.standard_normal((n_hidden, n_hidden))).astype(np.float32) for g in GATES},
            "b": {g: np.zeros(n_hidden, np.float32) for g in GATES}}


def main(argv: list[str]) -> None:
    rng = np.random.default_rng(0)
    params = init_params(rng)
    xs = rng.standard_normal((T, BATCH, HIDDEN)).astype(np.float32)
    h0 = c0 = np.zeros((BATCH, HIDDEN), np.float32)
    step = gir.jit(sgd_step)
    for i in range(5):
        loss, params = step(params, xs, h0, c0, np.float32(1e-4))
        print(f"step {i}: loss {float(loss):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
