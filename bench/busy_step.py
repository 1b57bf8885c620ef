"""A training step beside busy processes: 2 BLAS threads against 1 (issue 28).

Starts `--busy` CPU-bound processes (a Python loop each), then runs one of bench/rnn.py's
models' training steps in fresh processes, alternating 1 and 2 BLAS threads, `--rounds` times
each, and prints the median, 90th percentile and worst step of each thread count; `--quiet`
runs the same without the busy processes first. The target (issue 28): with two busy
processes, 2 threads at most 1.1x the 1-thread median; on a quiet machine faster than 1 thread.

    python bench/busy_step.py --model lstm --size S --busy 2 --steps 100 --rounds 3 --quiet
    python bench/busy_step.py --model lstm --size S --busy 2 --steps 3 --rounds 1   # smoke

Each step process compiles first and waits for its -O3 code and GEMM measurements before it
times (as a long training run would see), so the numbers are steady-state steps.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _busy() -> None:
    while True:
        pass


def child(model: str, size: str, threads: int, steps: int) -> None:
    """One process: the step's times (ms) as a JSON line."""
    sys.path.insert(0, str(HERE))
    import rnn

    T, B, I, H = rnn.SIZES[size]  # noqa: E741
    # MKL's count too, through gir's handle: threadpoolctl alone, called before gir loads MKL,
    # left MKL on every core, and "1 thread" ran the GEMMs on two.
    limits = rnn.gir_set_threads(threads)  # noqa: F841 (kept alive while the steps run)
    step, _ = rnn.setup_gir(model, rnn.make_inputs(model, T, B, I, H, 0))
    step()
    from gir.backend.cpu import blas, tiers

    tiers.wait_all(600)
    blas.wait_for_measurements(600)
    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps(times))


def _run(model: str, size: str, threads: int, steps: int) -> list[float]:
    out = subprocess.run([sys.executable, __file__, "--child", model, size, str(threads), str(steps)],
                         capture_output=True, text=True, check=True, env=rnn_thread_env(threads))
    return json.loads(out.stdout.strip().splitlines()[-1])


def rnn_thread_env(threads: int) -> dict[str, str]:
    """bench/rnn.py's environment for `threads` (OMP/MKL/OpenBLAS counts), as a user sets it."""
    sys.path.insert(0, str(HERE))
    import rnn

    return rnn.thread_env(threads)


def _table(label: str, results: dict[int, list[float]]) -> None:
    print(f"{label}:")
    for threads, times in sorted(results.items()):
        times = sorted(times)
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        print(f"  {threads} thread{'s' if threads > 1 else ' '}: median {statistics.median(times):8.2f} ms, "
              f"p90 {p90:8.2f} ms, worst {times[-1]:8.2f} ms ({len(times)} steps)")
    if 1 in results and 2 in results:
        ratio = statistics.median(results[2]) / statistics.median(results[1])
        print(f"  2 threads / 1 thread (medians): {ratio:.2f}x")


def _measure(args: argparse.Namespace) -> dict[int, list[float]]:
    results: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for threads in (1, 2):  # alternated: drift in the machine's load hits both
            results[threads] += _run(args.model, args.size, threads, args.steps)
    return results


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lstm")
    ap.add_argument("--size", default="S")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the step")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quiet", action="store_true", help="also measure without the busy processes, first")
    args = ap.parse_args()
    if args.quiet:
        _table("quiet", _measure(args))
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        _table(f"{args.busy} busy processes beside it", _measure(args))
    finally:
        for p in busy:
            p.terminate()
            p.join()


if __name__ == "__main__":
    main()
