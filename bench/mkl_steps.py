"""Does MKL pay on this machine? Whole training steps with MKL against without, interleaved.

The question behind the `gir[mkl]` extra (issue 30): MKL and its Intel runtime are most of a
fresh install's size, so they are in the default install only if whole training steps are
faster with them by a margin. For each (threads, size, model) of bench/rnn.py two worker
processes compile the same `<model>_grads`:

- `mkl`: the default where MKL is installed (the schedule may pick MKL, OpenBLAS or gir's own
  packed kernel per GEMM, from measurements),
- `no-mkl`: `GIR_NO_MKL=1` (MKL never loaded: OpenBLAS and gir's packed kernel), what a
  default install without the extra gets,

each with its own fresh GIR_CACHE_DIR and `GIR_GEMM_MEASURE=now` (both measure every GEMM path
they may use before they are timed) and timed once the -O3 code is in. The parent then asks
them in turn for --chunk steps, --rounds times (A, B, A, B, ...; half a second apart, for the
other's BLAS threads to stop spinning), so both see the same machine, and prints the medians,
their ratio and the providers each function calls.

    python bench/mkl_steps.py                                   # S and M, 1 and 2 threads
    python bench/mkl_steps.py --sizes S --threads 2 --rounds 10 --out docs/performance-mkl.md

The machine should be otherwise idle. Needs MKL installed (`pip install -e '.[mkl]'`).
"""

# ruff: noqa: E741  (I is the input size, as in T, B, I, H)
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {"mkl": {}, "no-mkl": {"GIR_NO_MKL": "1"}}
SETTLE = 0.5
"""Seconds between one process's chunk and the other's: BLAS thread pools spin-wait after
their last call (OpenBLAS's threads, MKL's OpenMP ones for KMP_BLOCKTIME, 200 ms), and a
chunk started at once shares the cores with the spinning pool of the process that just
stopped (measured: the same code 15 ms alone, 16-28 ms when chunks followed at once)."""


def worker(model: str, size: str, threads: int) -> None:
    """Compiles, warms up, then answers `run N` lines with N step times (JSON) until EOF."""
    import gir
    from gir.backend.cpu import tiers
    from rnn import SIZES, gir_set_threads, gir_source, make_inputs, param_names, pin_to_cores

    pin_to_cores(threads)
    keep = gir_set_threads(threads)
    T, B, I, H = SIZES[size]
    p = make_inputs(model, T, B, I, H, seed=0)
    args = [p["xs"]] + [p[n] for n in param_names(model)]
    fn = gir.jit(gir_source(model, T, B, I, H), f"{model}_grads")
    fn(*args)
    tiers.wait_all(600)  # time the -O3 code, not the quick code or its compile beside the step
    for _ in range(5):
        fn(*args)
    from gir.backend.cpu import blas

    ready = {"paths": sorted(fn.stats.gemm_paths), "mkl_loaded": blas.providers().has_mkl}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line.split()[1])):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
        print(json.dumps(times), flush=True)
    del keep


def start(variant: str, model: str, size: str, threads: int) -> tuple[subprocess.Popen, dict]:
    from rnn import thread_env

    env = thread_env(threads)
    env.update(VARIANTS[variant], GIR_CACHE_DIR=tempfile.mkdtemp(prefix=f"gir-mkl-steps-{variant}-"),
               GIR_GEMM_MEASURE="now")
    proc = subprocess.Popen([sys.executable, __file__, "--_worker", f"{model},{size},{threads}"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())  # type: ignore[union-attr]


def case(model: str, size: str, threads: int, rounds: int, chunk: int) -> dict:
    procs = {v: start(v, model, size, threads) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for v, (proc, _) in procs.items():
            time.sleep(SETTLE)
            proc.stdin.write(f"run {chunk}\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            times[v] += json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    for proc, _ in procs.values():
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait()
    med = {v: statistics.median(t) for v, t in times.items()}
    return {"model": model, "size": size, "threads": threads, "median_ms": {v: m * 1e3 for v, m in med.items()},
            "ratio": med["no-mkl"] / med["mkl"], "paths": {v: info["paths"] for v, (_, info) in procs.items()},
            "mkl_loaded": {v: info["mkl_loaded"] for v, (_, info) in procs.items()}, "steps": len(times["mkl"])}


def row(r: dict) -> str:
    m = r["median_ms"]
    return (f"| {r['model']} | {r['size']} | {r['threads']} | {m['mkl']:.2f} | {m['no-mkl']:.2f} | {r['ratio']:.2f} "
            f"| {', '.join(r['paths']['mkl'])} | {', '.join(r['paths']['no-mkl'])} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--sizes", default="S,M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=8, help="A/B rounds (default 8)")
    ap.add_argument("--chunk", type=int, default=5, help="steps per process per round (default 5)")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        model, size, threads = args._worker.split(",")
        worker(model, size, int(threads))
        return 0
    lines = ["| model | size | threads | with MKL ms | without MKL ms | without / with | with MKL calls "
             "| without MKL calls |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for threads in (int(t) for t in args.threads.split(",")):
        for size in args.sizes.split(","):
            for model in args.models.split(","):
                r = case(model, size, threads, args.rounds, args.chunk)
                if not r["mkl_loaded"]["mkl"] or r["mkl_loaded"]["no-mkl"]:
                    print(f"MKL loaded: {r['mkl_loaded']}: not the comparison asked for", file=sys.stderr)
                    return 1
                lines.append(row(r))
                print(lines[-1], flush=True)
    if args.out:
        cmd = "python bench/mkl_steps.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.out).write_text(f"Training step medians ({os.cpu_count()} cores), `{cmd.strip()}`:\n\n"
                                  + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
