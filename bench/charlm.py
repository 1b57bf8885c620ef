"""examples/train_charlm.py's model in gir and in PyTorch, trained side by side in one process.

Both train the same character-level GRU language model (embedding, GRU in the cuDNN / PyTorch
form, projection, softmax cross-entropy) from the same initial weights on the same batches with
the same Adam after the same global-norm clipping (PyTorch's `torch.optim.Adam`; gir's
`gir.optim`, compiled into the example's training step). The steps alternate, gir then
PyTorch, so both see the same machine load; each whole step (forward, backward, clipping and
the Adam update) is timed, and the medians are reported with the held-out bits per character
both reach.

    pip install -e '.[bench]'
    python bench/charlm.py --steps 300 --threads 1

PyTorch is not a dependency of gir; without it only gir runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import gir  # noqa: E402
import train_charlm as ex  # noqa: E402


def set_threads(n: int) -> object | None:
    from gir.backend.cpu import blas

    mkl = blas.providers().mkl
    if mkl is not None:
        mkl.MKL_Set_Num_Threads(n)
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(n)
    except ImportError:
        return None


def torch_model(params: dict[str, np.ndarray], V: int, E: int, H: int):  # noqa: ANN201
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(V, E)
            self.gru = nn.GRU(E, H)
            self.out = nn.Linear(H, V)

        def forward(self, inputs: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
            hs, _ = self.gru(self.emb(inputs), h0)
            return self.out(hs.reshape(-1, hs.shape[-1]))

    m = LM()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    with torch.no_grad():
        m.emb.weight.copy_(t(params["emb"]))
        # torch's gate order is (r, z, n); weights are (3H, in), transposed from gir's (in, H).
        m.gru.weight_ih_l0.copy_(t(np.concatenate([params[f"w{g}"].T for g in "rzn"])))
        m.gru.weight_hh_l0.copy_(t(np.concatenate([params[f"u{g}"].T for g in "rzn"])))
        m.gru.bias_ih_l0.copy_(t(np.concatenate([params[f"b{g}"] for g in "rzn"])))
        m.gru.bias_hh_l0.copy_(t(np.concatenate([np.zeros(2 * H, np.float32), params["bhn"]])))
        m.out.weight.copy_(t(params["out"].T))
        m.out.bias.copy_(t(params["bout"]))
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--embed", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    limits = set_threads(args.threads)
    data, chars = ex.encode(ex.corpus())
    train, held_out = ex.split(data)
    V, T, B, H = len(chars), args.seq, args.batch, args.hidden
    rng = np.random.default_rng(0)
    params = ex.init(V, args.embed, H, rng)
    try:
        import torch
        torch.set_num_threads(args.threads)
        model = torch_model(params, V, args.embed, H)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    except ImportError:
        torch = model = None  # type: ignore[assignment]
        print("PyTorch is not installed: gir only")
    adam = gir.optim.chain(gir.optim.clip_by_global_norm(5.0), gir.optim.adam(args.lr))
    step_fn = gir.jit(ex.make_train_step(adam))
    eval_fn = gir.jit(ex.loss)
    state = adam.init(params)
    h0 = np.zeros((B, H), np.float32)
    inputs, targets = ex.batch(train, T, B, rng)
    first, _, _ = step_fn(params, state, inputs, ex.flat_targets(targets, V), h0)  # compiles: not timed
    if model is not None:  # the same model: the same loss on the same batch before training
        with torch.no_grad():
            logits = model(torch.from_numpy(inputs.astype(np.int64)), torch.zeros(1, B, H))
            same = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets.reshape(-1).astype(
                np.int64))))
        if abs(same - float(first)) > 1e-4 * abs(same):
            raise SystemExit(f"PyTorch's loss {same} differs from gir's {float(first)}: not the same model")
    times: dict[str, list[float]] = {"gir": [], "pytorch": []}
    cpu: dict[str, list[float]] = {"gir": [], "pytorch": []}
    """CPU seconds of this process per step: on a shared machine, wall-clock time counts the
    time other processes held the cores; with one thread CPU time does not."""
    losses: dict[str, list[float]] = {"gir": [], "pytorch": []}
    for _ in range(args.steps):
        inputs, targets = ex.batch(train, T, B, rng)
        t0, c0 = time.perf_counter(), time.process_time()
        value, params, state = step_fn(params, state, inputs, ex.flat_targets(targets, V), h0)
        times["gir"].append(time.perf_counter() - t0)
        cpu["gir"].append(time.process_time() - c0)
        losses["gir"].append(float(value))
        if model is not None:
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            logits = model(torch.from_numpy(inputs.astype(np.int64)), torch.zeros(1, B, H))
            loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets.reshape(-1).astype(np.int64)))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            times["pytorch"].append(time.perf_counter() - t0)
            cpu["pytorch"].append(time.process_time() - c0)
            losses["pytorch"].append(float(loss.detach()))
    gir_bpc = ex.evaluate(eval_fn, params, held_out, T, B, H, 8)
    print(f"{args.steps} steps, T={T} batch={B} hidden={H} embed={args.embed} vocab={V}, {args.threads} thread(s)")
    print(f"  gir:     median step {statistics.median(times['gir']) * 1e3:7.1f} ms "
          f"({statistics.median(cpu['gir']) * 1e3:.1f} ms CPU), last-50 train loss "
          f"{np.mean(losses['gir'][-50:]) / math.log(2):.3f} bits/char, held-out {gir_bpc:.3f} bits/char")
    if model is not None:
        ev = np.random.default_rng(1234)
        total = 0.0
        with torch.no_grad():
            for _ in range(8):
                inputs, targets = ex.batch(held_out, T, B, ev)
                logits = model(torch.from_numpy(inputs.astype(np.int64)), torch.zeros(1, B, H))
                total += float(torch.nn.functional.cross_entropy(
                    logits, torch.from_numpy(targets.reshape(-1).astype(np.int64))))
        torch_bpc = total / 8 / math.log(2)
        ratio = statistics.median(times["pytorch"]) / statistics.median(times["gir"])
        print(f"  PyTorch: median step {statistics.median(times['pytorch']) * 1e3:7.1f} ms "
              f"({statistics.median(cpu['pytorch']) * 1e3:.1f} ms CPU), last-50 train loss "
              f"{np.mean(losses['pytorch'][-50:]) / math.log(2):.3f} bits/char, held-out {torch_bpc:.3f} bits/char")
        cpu_ratio = statistics.median(cpu["pytorch"]) / statistics.median(cpu["gir"])
        print(f"  PyTorch / gir step time: {ratio:.2f} wall-clock, {cpu_ratio:.2f} CPU  (torch {torch.__version__})")
    del limits
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
