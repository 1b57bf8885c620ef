"""The Python frontend against the .gir text: the same training step, the same compiled code?

For each of examples/{rnn,gru,lstm}.gir (T=50, batch 32, hidden 256, float32) and its Python
twin examples/*_train.py, compiles the loss-and-gradients step for the CPU both ways
(`gir.jit(text, "*_grads")` and `gir.jit(gir.value_and_grad(*_loss))`), checks the results
agree, and times both interleaved in one process (A, B, A, B, ...): reports the median of
each, their ratio, and what the Python way adds before the first run (trace + compile).

    python bench/python_frontend.py [--repeat 7] [--models rnn,gru,lstm]

The machine should be otherwise idle: run it alone, not beside the test suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import gir
import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
N_STATES = {"rnn": 1, "gru": 1, "lstm": 2}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_train", EXAMPLES / f"{name}_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(params: dict) -> dict[str, np.ndarray]:
    out = {}
    for k, v in params.items():
        out.update({f"{k}_{g}": a for g, a in v.items()} if isinstance(v, dict) else {k: v})
    return out


def bench(name: str, repeat: int) -> None:
    example = _load(name)
    rng = np.random.default_rng(0)
    params = example.init_params(rng)
    xs = (0.5 * rng.standard_normal((50, 32, 256))).astype(np.float32)
    states = [(0.1 * rng.standard_normal((32, 256))).astype(np.float32) for _ in range(N_STATES[name])]

    t0 = time.perf_counter()
    text_fn = gir.jit(str(EXAMPLES / f"{name}.gir"), f"{name}_grads")
    names = [a.name_hint for a in text_fn.signature.args][1 + len(states):]
    flat = _flat(params)
    text_args = [xs, *states, *[flat[n] for n in names]]
    want = text_fn(*text_args)
    t_text = time.perf_counter() - t0

    t0 = time.perf_counter()
    py_fn = gir.jit(gir.value_and_grad(getattr(example, f"{name}_loss")))
    loss, grads = py_fn(params, xs, *states)
    t_py = time.perf_counter() - t0
    flat_grads = _flat(grads)
    scale = max(float(np.abs(w).max()) for w in want)
    err = max([abs(float(loss) - float(want[0]))] + [float(np.abs(flat_grads[n] - w).max()) for n, w in
                                                     zip(names, want[1:])]) / scale

    times: dict[str, list[float]] = {"text": [], "python": []}
    for _ in range(repeat):
        for key, run in [("text", lambda: text_fn(*text_args)), ("python", lambda: py_fn(params, xs, *states))]:
            t0 = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{name:5s} text {med['text'] * 1e3:8.1f} ms  python {med['python'] * 1e3:8.1f} ms  "
          f"ratio {med['python'] / med['text']:.3f}  | first call: text {t_text:.2f} s, python {t_py:.2f} s  "
          f"| max rel diff {err:.1e}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--models", default="rnn,gru,lstm")
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        bench(name, args.repeat)


if __name__ == "__main__":
    main(sys.argv[1:])
