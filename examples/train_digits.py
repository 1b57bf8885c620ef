"""A GRU sequence classifier on scikit-learn's 8x8 digits, trained with gir: runs in under a minute.

Each image is read as a sequence of its 8 rows (8 pixels each); a GRU (`gir.scan`) reads them
and a softmax layer on its last state names the digit. The training step is
`gir.jit(gir.value_and_grad(loss))`; Adam runs in NumPy. The data ships with scikit-learn
(`sklearn.datasets.load_digits`, 1797 images; `pip install 'gir[examples]'`); 20% is held out.

    python examples/train_digits.py                 # 300 steps
    python examples/train_digits.py --steps 20      # a smoke run: prints `loss 1.234` lines
    mpiexec -n 2 python examples/train_digits.py --distributed   # data parallel (docs/distributed.md)

Prints the loss as it goes and the test accuracy at the end.
"""

from __future__ import annotations

import argparse
import math
import time

import gir
import numpy as np


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train x, train y, test x, test y); x as (8 rows, N, 8 pixels) in [0, 1], time-major."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install 'gir[examples]'") from None
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)  # (N, 8, 8)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_test = len(y) // 5
    to_seq = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))  # noqa: E731
    return to_seq(x[n_test:]), y[n_test:], to_seq(x[:n_test]), y[:n_test]


def init(H: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def uniform(*shape: int, fan_in: int) -> np.ndarray:
        k = 1.0 / math.sqrt(fan_in)
        return rng.uniform(-k, k, shape).astype(np.float32)

    p = {}
    for g in ("z", "r", "n"):
        p[f"w{g}"], p[f"u{g}"], p[f"b{g}"] = uniform(8, H, fan_in=8), uniform(H, H, fan_in=H), np.zeros(H, np.float32)
    p["out"], p["bout"] = uniform(H, 10, fan_in=H), np.zeros(10, np.float32)
    return p


def logits_of(p: dict, rows):  # noqa: ANN001, ANN201  (traced values)
    def step(h, x):  # noqa: ANN001, ANN202
        z = gir.sigmoid(x @ p["wz"] + h @ p["uz"] + p["bz"])
        r = gir.sigmoid(x @ p["wr"] + h @ p["ur"] + p["br"])
        n = gir.tanh(x @ p["wn"] + r * (h @ p["un"]) + p["bn"])
        return (1.0 - z) * n + z * h, None

    h0 = gir.zeros((rows.shape[1], p["uz"].shape[0]), rows.dtype)
    h, _ = gir.scan(step, h0, rows)
    return h @ p["out"] + p["bout"]


def loss(p: dict, rows, picked):  # noqa: ANN001, ANN201
    """Mean cross-entropy; `picked` holds the position of each label in the flattened logits."""
    logits = logits_of(p, rows)
    return gir.mean(gir.logsumexp(logits, axis=-1) - logits.reshape(-1)[picked])


def adam(params: dict, grads: dict, state: dict, lr: float) -> dict:
    state["t"] = t = state.get("t", 0) + 1
    out = {}
    for k, g in grads.items():
        m = state[("m", k)] = 0.9 * state.get(("m", k), 0.0) + 0.1 * g
        v = state[("v", k)] = 0.999 * state.get(("v", k), 0.0) + 0.001 * g * g
        out[k] = (params[k] - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)).astype(np.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distributed", action="store_true",
                    help="data parallel over MPI (run under mpiexec): each process takes --batch images a step")
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu", "interp"], help="where gir runs the model")
    args = ap.parse_args(argv)

    xs, ys, xt, yt = load(args.seed)
    rank, say = 0, print
    if args.distributed:
        from gir import distributed

        rank = distributed.world().Get_rank()
        say = print if rank == 0 else (lambda *a, **k: None)
    say(f"digits: {xs.shape[1]} training and {xt.shape[1]} test images, each 8 rows of 8 pixels")
    rng = np.random.default_rng(args.seed)
    params = init(args.hidden, rng)
    train_step = gir.jit(gir.value_and_grad(loss), device=args.device)
    if args.distributed:  # the same start everywhere; each step's loss and gradients averaged over processes
        params = distributed.broadcast(params)
        train_step = distributed.data_parallel(train_step)
        rng = np.random.default_rng([args.seed, rank])  # each process draws its own images
    predict = gir.jit(logits_of, device=args.device)
    state: dict = {}
    B = args.batch
    every = max(1, min(25, args.steps // 10))
    start, running = time.perf_counter(), []
    for step in range(1, args.steps + 1):
        idx = rng.choice(xs.shape[1], B, replace=False)
        picked = np.arange(B, dtype=np.int32) * 10 + ys[idx]
        value, grads = train_step(params, np.ascontiguousarray(xs[:, idx]), picked)
        params = adam(params, grads, state, args.lr)
        running.append(float(value))
        if step % every == 0 or step == args.steps:
            say(f"step {step:4d} loss {np.mean(running[-every:]):.3f}", flush=True)
    accuracy = float(np.mean(np.argmax(predict(params, xt), axis=1) == yt))
    say(f"trained {args.steps} steps in {time.perf_counter() - start:.1f} s; "
          f"test accuracy {accuracy:.3f} ({int(round(accuracy * len(yt)))}/{len(yt)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
