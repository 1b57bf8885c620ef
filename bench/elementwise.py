"""The elementwise part of a recurrent step alone (no GEMM): float32 activations in fused loops.

Three gir functions scanned over T=50 steps of a batch of 32 x 256 (the size of bench/rnn.py's
S models), median of 200 calls each, BLAS not involved:

- `tanh`: c = tanh(c) + x_t (8,192 tanh per step);
- `sigmoid`: c = c + sigmoid(x_t);
- `lstm cell`: the LSTM cell on precomputed gates (3 sigmoid, 2 tanh per element) and the
  loss sum(h * h): the forward elementwise work of bench/rnn.py's lstm at S.

and NumPy's `np.tanh` on one 32 x 256 array, in ns per element. To compare two versions of gir,
run it with PYTHONPATH set to each checkout's parent.

    python bench/elementwise.py
"""

from __future__ import annotations

import time

import numpy as np

T, B, H = 50, 32, 256

BODIES = {
    "tanh": "%c = tanh(%c) + slice(%g4, starts=[0, 0], limits=[B, H])",
    "sigmoid": "%c = %c + sigmoid(slice(%g4, starts=[0, 0], limits=[B, H]))",
    "lstm cell": ("%i = sigmoid(slice(%g4, starts=[0, 0], limits=[B, H]))\n"
                  "    %f = sigmoid(slice(%g4, starts=[0, H], limits=[B, H2]))\n"
                  "    %g = tanh(slice(%g4, starts=[0, H2], limits=[B, H3]))\n"
                  "    %o = sigmoid(slice(%g4, starts=[0, H3], limits=[B, H4]))\n"
                  "    %c = %f * %c + %i * %g\n"
                  "    %h = %o * tanh(%c)\n"
                  "    %loss = %loss + sum(%h * %h)"),
}


def source(body: str) -> str:
    for name, value in (("H4", 4 * H), ("H3", 3 * H), ("H2", 2 * H), ("B", B), ("H", H)):
        body = body.replace(name, str(value))
    return (f"func @cell(%gs: tensor<{T}x{B}x{4 * H}xf32>, %c0: tensor<{B}x{H}xf32>) -> "
            f"(tensor<f32>, tensor<{B}x{H}xf32>) {{\n  %c = %c0\n  %loss = constant 0.0 : tensor<f32>\n"
            f"  for %g4 in %gs {{\n    {body}\n  }}\n  return %loss, %c\n}}\n")


def median_ms(call, n: int = 200) -> float:  # noqa: ANN001
    call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    import gir
    from gir.backend.cpu import tiers

    rng = np.random.default_rng(0)
    gs = rng.standard_normal((T, B, 4 * H), dtype=np.float32)
    c0 = np.zeros((B, H), np.float32)
    for name, body in BODIES.items():
        fn = gir.jit(source(body), "cell")
        fn(gs, c0)
        tiers.wait_all()  # the -O3 code
        print(f"gir {name:10} {median_ms(lambda fn=fn: fn(gs, c0)):.3f} ms per {T} steps  ({gir.__file__})")
    x, out = gs[0, :, :H].copy(), np.empty((B, H), np.float32)
    ns = 1e6 * median_ms(lambda: np.tanh(x, out=out), 2000) / x.size
    print(f"np.tanh    {ns:.2f} ns per element")


if __name__ == "__main__":
    main()
