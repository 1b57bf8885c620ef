"""A character-level GRU language model, trained with gir on Python's own standard library.

The text is the source of a few standard-library modules, read from the files of the Python
running this script (nothing is downloaded); every 10th block of 2048 characters is held out. The model: an embedding
lookup (`emb[ids]`, a gather), a GRU over the sequence (`gir.scan`), a projection to the
vocabulary and a softmax cross-entropy (`gir.logsumexp`). One training step -- the forward
pass, back-propagation through time, every gradient and the Adam update (`gir.optim`) -- is one
compiled function, `gir.jit(train_step)`, from (parameters, optimizer state, batch) to (loss,
new parameters, new optimizer state).

    python examples/train_charlm.py                   # 500 steps, hidden 128 (see docs/performance.md)
    python examples/train_charlm.py --steps 20        # a smoke run: prints `loss 4.123` lines
    python examples/train_charlm.py --device gpu      # on the GPU: the state never leaves it

With --device gpu the parameters and the optimizer state go to the GPU once (`gir.device_put`)
and stay there (donated to the step: it writes the new values over the old ones): each step
uploads only its batch (two small int32 arrays), and the losses are read back only when a line
is printed (docs/gpu.md *Training on the device*).

Prints the loss as it goes (a tqdm bar when tqdm is installed, plain lines otherwise), the
validation bits per character at the end, a few lines sampled from the model, and, when
matplotlib is installed and --plot PATH is given, writes the loss curve there (nothing is
written into the current directory by default).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import gir
import numpy as np

MODULES = ("textwrap", "string", "functools", "fractions", "argparse", "heapq")
"""Standard-library modules whose source is the corpus (about 150k characters)."""


# ---------------------------------------------------------------------------------------------
# Data


def corpus() -> str:
    parts = []
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            parts.append(Path(spec.origin).read_text(encoding="utf-8"))
    if not parts:
        raise SystemExit("no standard-library source found (a Python without .py files?)")
    return "\n".join(parts)


def encode(text: str) -> tuple[np.ndarray, list[str]]:
    """Character ids over printable ASCII plus newline; anything else becomes '?'."""
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    index = {c: i for i, c in enumerate(chars)}
    unknown = index["?"]
    return np.array([index.get(c, unknown) for c in text], np.int32), chars


def split(data: np.ndarray, block: int = 2048, every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(train, held out): every 10th block of 2048 characters is held out, so that the held-out
    text is drawn from every module (the last 10% would be mostly heapq's prose docstring)."""
    blocks = [data[i:i + block] for i in range(0, len(data), block)]
    held = [b for k, b in enumerate(blocks) if k % every == every - 1]
    kept = [b for k, b in enumerate(blocks) if k % every != every - 1]
    return np.concatenate(kept), np.concatenate(held)


def batch(data: np.ndarray, T: int, B: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """B random windows of T + 1 characters: inputs (T, B) and targets (T, B), time-major."""
    starts = rng.integers(0, len(data) - T - 1, B)
    windows = np.stack([data[s:s + T + 1] for s in starts], axis=1)
    return np.ascontiguousarray(windows[:-1]), np.ascontiguousarray(windows[1:])


def flat_targets(targets: np.ndarray, V: int) -> np.ndarray:
    """Positions of the target logits in the flattened (T * B, V) logits."""
    rows = np.arange(targets.size, dtype=np.int32)
    return rows * V + targets.reshape(-1)


# ---------------------------------------------------------------------------------------------
# Model


def init(V: int, E: int, H: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def uniform(*shape: int, fan_in: int) -> np.ndarray:
        k = 1.0 / math.sqrt(fan_in)
        return rng.uniform(-k, k, shape).astype(np.float32)

    p = {"emb": (0.1 * rng.standard_normal((V, E))).astype(np.float32)}
    for g in ("z", "r", "n"):
        p[f"w{g}"] = uniform(E, H, fan_in=E)
        p[f"u{g}"] = uniform(H, H, fan_in=H)
        p[f"b{g}"] = np.zeros(H, np.float32)
    p["bhn"] = np.zeros(H, np.float32)
    p["out"] = uniform(H, V, fan_in=H)
    p["bout"] = np.zeros(V, np.float32)
    return p


def gru_cell(p: dict, h, x):  # noqa: ANN001, ANN201  (traced values)
    """The cuDNN / PyTorch GRU: the reset gate applies to h @ u_n + b_hn."""
    z = gir.sigmoid(x @ p["wz"] + h @ p["uz"] + p["bz"])
    r = gir.sigmoid(x @ p["wr"] + h @ p["ur"] + p["br"])
    n = gir.tanh(x @ p["wn"] + p["bn"] + r * (h @ p["un"] + p["bhn"]))
    return (1.0 - z) * n + z * h


def loss(p: dict, inputs, targets, h0):  # noqa: ANN001, ANN201
    """Mean cross-entropy (nats per character) of predicting targets from inputs."""
    def step(h, x):  # noqa: ANN001, ANN202
        h = gru_cell(p, h, x)
        return h, h

    _, hs = gir.scan(step, h0, p["emb"][inputs])  # hs: (T, B, H)
    T, B, H = hs.shape
    logits = hs.reshape(T * B, H) @ p["out"] + p["bout"]
    return gir.mean(gir.logsumexp(logits, axis=-1) - logits.reshape(-1)[targets])


def next_char(p: dict, h, ids):  # noqa: ANN001, ANN201
    """One step of generation: the new state and the logits of the next character."""
    h = gru_cell(p, h, p["emb"][ids])
    return h, h @ p["out"] + p["bout"]


# ---------------------------------------------------------------------------------------------
# Training


def make_train_step(opt: gir.optim.GradientTransformation):  # noqa: ANN201
    """One training step as one function for `gir.jit`: loss, gradients and the optimizer
    update. Parameters and optimizer state go in and come out as pytrees, so on the GPU they
    stay device arrays from one step to the next."""
    def train_step(params: dict, state, inputs, targets, h0):  # noqa: ANN001, ANN202
        value, grads = gir.value_and_grad(loss)(params, inputs, targets, h0)
        updates, state = opt.update(grads, state, params)
        return value, gir.optim.apply_updates(params, updates), state

    return train_step


def progress(total: int, quiet: bool):  # noqa: ANN201
    """tqdm's bar when tqdm is installed (and not --quiet), else None (plain lines)."""
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)


def evaluate(eval_fn, params: dict, data: np.ndarray, T: int, B: int, H: int, batches: int) -> float:  # noqa: ANN001
    """Mean loss in bits per character over fixed held-out windows."""
    rng = np.random.default_rng(1234)
    h0 = np.zeros((B, H), np.float32)
    total = 0.0
    for _ in range(batches):
        inputs, targets = batch(data, T, B, rng)
        total += float(gir.device_get(eval_fn(params, inputs, flat_targets(targets, len(params["bout"])), h0)))
    return total / batches / math.log(2)


def sample(step_fn, params: dict, chars: list[str], H: int, prompt: str, n: int,  # noqa: ANN001
           temperature: float, rng: np.random.Generator) -> str:
    index = {c: i for i, c in enumerate(chars)}
    h = np.zeros((1, H), np.float32)
    logits = None
    for c in prompt:
        h, logits = step_fn(params, h, np.array([index.get(c, index["?"])], np.int32))
    out = []
    for _ in range(n):
        z = gir.device_get(logits)[0].astype(np.float64) / temperature
        probs = np.exp(z - z.max())
        k = int(rng.choice(len(chars), p=probs / probs.sum()))
        out.append(chars[k])
        h, logits = step_fn(params, h, np.array([k], np.int32))
    return prompt + "".join(out)


def plot(path: str, steps: list[int], losses: list[float], val: list[tuple[int, float]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [x / math.log(2) for x in losses], lw=0.8, label="training batch")
    if val:
        ax.plot([s for s, _ in val], [b for _, b in val], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per character")
    ax.set_title("char-level GRU on stdlib source, trained with gir")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seq", type=int, default=64, help="characters per sequence (T)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--embed", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu", "interp"], help="where gir runs the model")
    ap.add_argument("--plot", default="", help="write the loss curve to this PNG (default: none)")
    ap.add_argument("--sample", type=int, default=240, help="characters to sample at the end (0: none)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar: plain `loss` lines only")
    return ap.parse_args(argv)


def train(args: argparse.Namespace, train_step, eval_loss, params, state, h0,  # noqa: ANN001
          data: tuple[np.ndarray, np.ndarray], V: int, rng: np.random.Generator):  # noqa: ANN201
    """args.steps steps of train_step: (params, steps, losses, held-out (step, bits/char),
    seconds in the compiled step)."""
    (train_data, held_out), T, B, H = data, args.seq, args.batch, args.hidden
    bar = progress(args.steps, args.quiet)
    say = bar.write if bar is not None else print
    every = max(1, min(10, args.steps // 20))
    steps, losses, val = [], [], []
    pending = []  # this line's losses: on the GPU device arrays, read back together when it prints
    chars_seen, train_time = 0, 0.0
    for step in range(1, args.steps + 1):
        inputs, targets = batch(train_data, T, B, rng)  # NumPy: the only upload of a step
        t0 = time.perf_counter()
        value, params, state = train_step(params, state, inputs, flat_targets(targets, V), h0)
        pending.append(value)
        log = step % every == 0 or step == args.steps
        if log:
            losses += [float(v) for v in gir.device_get(pending)]  # on the GPU: waits for the steps
            pending = []
        train_time += time.perf_counter() - t0
        chars_seen += T * B
        steps.append(step)
        if bar is not None:
            bar.update(1)
        if log:
            rate = f"{chars_seen / train_time:,.0f}"
            if bar is not None:
                bar.set_postfix(loss=f"{losses[-1]:.3f}", chars_per_s=rate)
            say(f"step {step:5d} loss {np.mean(losses[-every:]):.3f} ({rate} chars/s)")
        if step % args.eval_every == 0 or step == args.steps:
            val.append((step, evaluate(eval_loss, params, held_out, T, B, H, args.eval_batches)))
            say(f"step {step:5d} held-out {val[-1][1]:.3f} bits/char")
    if bar is not None:
        bar.close()
    return params, steps, losses, val, train_time


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    data, chars = encode(corpus())
    train_data, held_out = split(data)
    V, T, B, H = len(chars), args.seq, args.batch, args.hidden
    print(f"corpus: {len(data)} characters of {', '.join(MODULES)}; vocabulary {V}; "
          f"train {len(train_data)}, held out {len(held_out)}")
    rng = np.random.default_rng(args.seed)
    opt = gir.optim.chain(gir.optim.clip_by_global_norm(5.0), gir.optim.adam(args.lr))  # clip: BPTT spikes
    params = init(V, args.embed, H, rng)
    # --device gpu: uploaded once, then device arrays in and out of every step (else NumPy, as they are)
    params, state, h0 = gir.device_put((params, opt.init(params), np.zeros((B, H), np.float32)), args.device)
    # donated (as jax.jit's donate_argnums): on the GPU each step writes the new parameters and
    # state over the buffers it hands back, so passing them in again copies nothing
    train_step = gir.jit(make_train_step(opt), device=args.device, donate_argnums=(0, 1))
    eval_loss = gir.jit(loss, device=args.device)

    start = time.perf_counter()
    inputs, targets = batch(train_data, T, B, rng)
    # compiles it; the result is dropped (our params and state are only read: donation
    # overwrites only the buffers a step hands back)
    train_step(params, state, inputs, flat_targets(targets, V), h0)
    print(f"compiled the training step in {time.perf_counter() - start:.1f} s")
    params, steps, losses, val, train_time = train(args, train_step, eval_loss, params, state, h0,
                                                   (train_data, held_out), V, rng)
    wall = time.perf_counter() - start
    print(f"trained {args.steps} steps in {wall:.1f} s ({train_time:.1f} s in the compiled step, "
          f"{T * B * args.steps / train_time:,.0f} chars/s); held-out {val[-1][1]:.3f} bits/char")
    if args.sample:
        step_fn = gir.jit(next_char, device=args.device)
        text = sample(step_fn, params, chars, H, "def ", args.sample, 0.8, np.random.default_rng(args.seed))
        print("sampled:\n" + "\n".join("    " + line for line in text.splitlines()[:8]))
    if args.plot and plot(args.plot, steps, losses, val):
        print(f"loss curve: {args.plot}")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
