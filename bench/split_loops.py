"""Where splitting an elementwise loop across the two cores starts to pay (backend/cpu/team.py,
MIN_ELEMENTS): a 50-step scan whose body is one fused loop of R x C float32 elements (tanh,
sigmoid, products: an LSTM cell's work), compiled unsplit (GIR_CPU_SPLIT=0) and split
(GIR_CPU_SPLIT=1), called interleaved in one process; medians per step of the scan.

    python bench/split_loops.py [--rounds 200] [--sizes 8x64,16x128,32x128,32x256,64x512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

SRC = """
func @f(%xs: tensor<50x{R}x{C}xf32>, %h0: tensor<{R}x{C}xf32>, %c0: tensor<{R}x{C}xf32>)
    -> (tensor<{R}x{C}xf32>, tensor<{R}x{C}xf32>) {{
  %h = %h0
  %c = %c0
  for %x in %xs {{
    %c = sigmoid(%x + %h) * %c + sigmoid(%x - %h) * tanh(%x * %h)
    %h = sigmoid(%x * 0.5 + %h) * tanh(%c)
  }}
  return %h, %c
}}
"""


def compile_with(src: str, split: str):  # noqa: ANN201
    import gir

    os.environ["GIR_CPU_SPLIT"] = split
    try:
        fn = gir.jit(src, "f")
        return fn
    finally:
        os.environ.pop("GIR_CPU_SPLIT", None)


def one_size(rows: int, cols: int, rounds: int) -> None:
    src = SRC.format(R=rows, C=cols)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((50, rows, cols), (rows, cols), (rows, cols))]
    fns = {split: compile_with(src, split) for split in ("0", "1")}
    for fn in fns.values():
        fn(*args)
        fn.compiled.wait_for_final_code(300)
        fn(*args)
    loops = sum(n["split_loops"] for n in fns["1"].stats.schedule["split"]) if isinstance(
        fns["1"].stats.schedule["split"], list) else 0
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn(*args)
            times[k].append(time.perf_counter() - start)
    off, on = (statistics.median(times[k]) / 50 * 1e6 for k in ("0", "1"))
    print(f"{rows}x{cols} ({rows * cols} elements, {loops} split loops): unsplit {off:.2f} us, split {on:.2f} us "
          f"a step; unsplit/split = {off / on:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--sizes", default="8x64,16x128,32x64,32x128,32x256,64x512")
    args = ap.parse_args()
    for size in args.sizes.split(","):
        rows, cols = (int(x) for x in size.split("x"))
        one_size(rows, cols, args.rounds)


if __name__ == "__main__":
    main()
