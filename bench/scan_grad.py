"""Benchmark of the `scan-grad` pass: RNN and GRU training steps with and without it.

Runs the `*_grads` function of examples/rnn.gir and examples/gru.gir (T=50, batch 32,
hidden 256, float32: the loss and the gradient of every weight) with the NumPy reference
interpreter (`gir.interpret`), after the default pipeline and after the same pipeline with
its two `scan-grad` entries removed. Reports the median of N runs of each, the matmuls per
step of the forward and backward scans, and the GEMMs outside the loops; checks that both
pipelines give the same results (float32, 1e-5 relative to the largest magnitude).

    python bench/scan_grad.py [--repeat 5] [--models rnn,gru] [--seed 0]

The machine should be otherwise idle: run it alone, not beside the test suite.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gir
import numpy as np
from gir.ir.core import Function, Operation
from gir.ir.interpreter import random_inputs
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE, split_pipeline

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

WITHOUT_SCAN_GRAD = ",".join(p for p in split_pipeline(DEFAULT_PIPELINE) if not p.startswith("scan-grad"))
PIPELINES = {"without scan-grad": WITHOUT_SCAN_GRAD, "default (scan-grad)": DEFAULT_PIPELINE}


@dataclass
class Row:
    model: str
    pipeline: str
    forward_per_step: int
    backward_per_step: int
    gemms_outside: int
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _matmuls(ops: list[Operation]) -> int:
    return sum(1 for op in ops if op.name == "matmul")


def structure(f: Function) -> tuple[int, int, int]:
    """(matmuls per forward step, per backward step, matmuls outside any loop) of f."""
    scans = [op for op in f.body if op.name == "scan"]
    forward = [op for op in scans if not op.attrs["reverse"]]
    backward = [op for op in scans if op.attrs["reverse"]]
    per_step = [sum(_matmuls(list(s.body.walk())) for s in group) for group in (forward, backward)]
    return per_step[0], per_step[1], _matmuls(list(f.body))


def bench(model: str, repeat: int, seed: int, device: str = "interp") -> list[Row]:
    path = EXAMPLES / f"{model}.gir"
    entry = f"{model}_grads"
    rows, results = [], []
    inputs: list[np.ndarray] | None = None
    for label, pipeline in PIPELINES.items():
        module = gir.load(str(path))
        PassManager(pipeline).run(module)
        f = module[entry]
        if inputs is None:
            inputs = random_inputs(f, seed)
        if device == "cpu":  # the same pipeline, then compiled (the backend pipeline adds inline,fuse)
            run = gir.jit(module, entry, pipeline=BACKEND_PIPELINE)
        else:
            run = _interpreter(module, entry)
        run(*inputs)  # warm-up: first-touch allocations, caches
        seconds = []
        for _ in range(repeat):
            start = time.perf_counter()
            out = run(*inputs)
            seconds.append(time.perf_counter() - start)
        results.append(out)
        rows.append(Row(model, label, *structure(f), seconds))
    # One GEMM over T*batch rows sums in another order than T accumulated ones: float32
    # rounding that BLAS makes visible (the interpreter's NumPy matmul hides less of it).
    _check_same(model, *results, rtol=2e-4 if device == "cpu" else 1e-5)
    return rows


def _interpreter(module: gir.Module, entry: str):  # noqa: ANN202
    return lambda *a: gir.interpret(module, entry, *a)


def _check_same(model: str, before: list[np.ndarray], after: list[np.ndarray], rtol: float = 1e-5) -> None:
    for i, (want, got) in enumerate(zip(before, after)):
        scale = float(np.max(np.abs(want)))
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        if diff > rtol * max(scale, 1e-30):
            sys.exit(f"{model}: out{i} differs with and without scan-grad: {diff:.3g} (largest {scale:.3g})")


def table(rows: list[Row]) -> str:
    head = ("| model | pipeline | matmuls / forward step | matmuls / backward step | GEMMs outside loops "
            "| median s | min s | speedup |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    base: dict[str, float] = {}
    for r in rows:
        base.setdefault(r.model, r.median)
        lines.append(f"| {r.model}_grads | {r.pipeline} | {r.forward_per_step} | {r.backward_per_step} "
                     f"| {r.gemms_outside} | {r.median:.3f} | {min(r.seconds):.3f} "
                     f"| {base[r.model] / r.median:.2f}x |")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per pipeline (median reported)")
    parser.add_argument("--models", default="rnn,gru", help="comma-separated examples (rnn, gru, lstm)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--device", choices=["interp", "cpu"], default="interp",
                        help="interp: gir.interpret; cpu: compiled by the CPU backend")
    args = parser.parse_args(argv)
    rows = [row for model in args.models.split(",")
            for row in bench(model.strip(), args.repeat, args.seed, args.device)]
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("OPENBLAS_NUM_THREADS") or "default"
    runner = "gir.interpret" if args.device == "interp" else "gir.jit (CPU backend)"
    print(f"{runner}, T=50, batch 32, hidden 256, float32; median of {args.repeat} runs after 1 warm-up")
    print(f"{cpu_name()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, NumPy {np.__version__}, BLAS threads: {threads}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
