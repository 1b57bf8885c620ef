"""A GRU training step written in Python: the same model as examples/gru.gir (cuDNN form).

    z = sigmoid(x @ w_z + h @ u_z + b_z),  r = sigmoid(x @ w_r + h @ u_r + b_r)
    n = tanh(x @ w_n + b_n + r * (h @ u_n + b_hn)),  h = (1 - z) * n + z * h
    loss = sum over t of sum(h ** 2)

    python examples/gru_train.py            # a few SGD steps on random data, on the CPU
"""

from __future__ import annotations

import sys

import gir
import numpy as np

T, BATCH, HIDDEN = 50, 32, 256  # the sizes of examples/gru.gir
WEIGHTS = ["w_z", "w_r", "w_n", "u_z", "u_r", "u_n"]
BIASES = ["b_z", "b_r", "b_n", "b_hn"]


def gru_loss(params, xs, h0):
    p = params

    def step(carry, x):
        h, loss = carry
        z = gir.sigmoid(x @ p["w_z"] + h @ p["u_z"] + p["b_z"])
        r = gir.sigmoid(x @ p["w_r"] + h @ p["u_r"] + p["b_r"])
        n = gir.tanh(x @ p["w_n"] + p["b_n"] + r * (h @ p["u_n"] + p["b_hn"]))
        h = (1.0 - z) * n + z * h
        return (h, loss + gir.sum(h * h)), h

    (h, loss), hs = gir.scan(step, (h0, 0.0), xs)
    return loss


def sgd_step(params, xs, h0, lr):
    loss, grads = gir.value_and_grad(gru_loss)(params, xs, h0)
    return loss, {k: params[k] - lr * grads[k] for k in params}


def init_params(rng: np.random.Generator, n_in: int = HIDDEN, n_hidden: int = HIDDEN) -> dict[str, np.ndarray]:
    scale = 1.0 / np.sqrt(n_hidden)
    params = {k: (scale * rng.standard_normal((n_in if k[0] == "w" else n_hidden, n_hidden))).astype(np.float32)
              for k in WEIGHTS}
    params.update({k: np.zeros(n_hidden, np.float32) for k in BIASES})
    return params


def main(argv: list[str]) -> None:
    rng = np.random.default_rng(0)
    params = init_params(rng)
    xs = rng.standard_normal((T, BATCH, HIDDEN)).astype(np.float32)
    h0 = np.zeros((BATCH, HIDDEN), np.float32)
    step = gir.jit(sgd_step)
    for i in range(5):
        loss, params = step(params, xs, h0, np.float32(1e-4))
        print(f"step {i}: loss {float(loss):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
