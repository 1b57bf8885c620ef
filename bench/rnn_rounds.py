"""The training step of bench/rnn.py, timed in interleaved rounds: for a machine shared with
other work.

bench/rnn.py times each peer in its own process, one after the other: on a machine that
other people's jobs load unevenly, the peer that ran during a quiet minute wins. Here every
peer (and every gir variant) is one persistent process that sets up its step once; the
parent then runs rounds, each asking every process in turn (the order rotating per round)
for `--per-round` timed steps, with a pause between processes so that one process's BLAS
threads have stopped spinning before the next starts. Each peer's time is the median over all
its steps; the ratios peer / gir are taken per round and their median reported, so that a
loud minute weighs on both sides of a ratio.

Peers: `gir` (this checkout), `gir-nooverlap` (GIR_CPU_OVERLAP=0: without the two-core
schedule), `gir-whole` (GIR_CPU_OVERLAP=whole), `gir-1thread` (BLAS on one thread,
whatever --threads says), `gir-base=PATH`
(another checkout's gir: PATH is the folder holding its `gir` package, for before/after),
`pytorch`, `jax`, `numpy` (bench/rnn.py's setups). Gradients of every peer are checked
against the first gir's before timing.

    python bench/rnn_rounds.py --models lstm --sizes S --peers gir,gir-nooverlap,pytorch,jax,numpy \\
        --rounds 10 --per-round 5
"""

# ruff: noqa: E741
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import rnn as R  # noqa: E402


def serve(peer: str, model: str, size: str, threads: int, inputs: str) -> None:
    """A peer process: set up, answer `check` with the gradients file, `time N` with N times."""
    R.pin_to_cores(threads)
    keep = []
    base = peer.split("=")[0]
    if base.startswith("gir"):
        keep.append(R.gir_set_threads(1 if base == "gir-1thread" else threads))
    elif base == "numpy":
        keep.append(R.limit_blas_threads(threads))
    elif base == "pytorch":
        import torch

        torch.set_num_threads(threads)
    p = dict(np.load(inputs))
    step, to_gir = R.SETUP["gir" if base.startswith("gir") else base](model, p)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "check":
            loss, grads = to_gir(step())
            np.savez(cmd[1], loss=np.float64(loss), **grads)
            info = {}
            if base.startswith("gir"):
                st = R.setup_gir.fn.stats
                info = {"gemm_paths": st.gemm_paths, "schedule": getattr(st, "schedule", None)}
            print(json.dumps(info), flush=True)
        elif cmd[0] == "time":
            print(json.dumps(R.time_step(step, 1, int(cmd[1]))), flush=True)
    del keep


def start(peer: str, args: argparse.Namespace, model: str, size: str, inputs: str) -> subprocess.Popen:
    env = R.thread_env(args.threads)
    base, _, path = peer.partition("=")
    if base == "gir-nooverlap":
        env["GIR_CPU_OVERLAP"] = "0"
    if base == "gir-whole":  # the two-core schedule with the main thread's BLAS on one thread throughout
        env["GIR_CPU_OVERLAP"] = "whole"
    if base == "gir-1thread":  # gir with BLAS on one thread (on a machine as busy as 2 cores)
        env.update(R.thread_env(1))
    if base == "gir-base":
        env["PYTHONPATH"] = path
        env["GIR_CACHE_DIR"] = env.get("GIR_CACHE_DIR", "/tmp") + "-base"
    return subprocess.Popen([sys.executable, __file__, "--_serve", peer, "--_model", model, "--_size", size,
                             "--_inputs", inputs, "--threads", str(args.threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def ask(proc: subprocess.Popen, line: str):  # noqa: ANN201
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def run_case(args: argparse.Namespace, model: str, size: str, peers: list[str], tmp: Path) -> dict:
    T, B, I, H = R.SIZES[size]
    inputs = tmp / f"inputs-{model}-{size}.npz"
    np.savez(inputs, **R.make_inputs(model, T, B, I, H, args.seed))
    procs = {p: start(p, args, model, size, str(inputs)) for p in peers}
    info, ok = {}, []
    ref = None
    for p, proc in procs.items():
        info[p] = ask(proc, f"check {tmp / (p.replace('=', '_').replace('/', '_') + '.npz')}")
        got = dict(np.load(tmp / (p.replace("=", "_").replace("/", "_") + ".npz")))
        loss = float(got.pop("loss"))
        if ref is None:
            ref = (loss, got)
            ok.append(p)
            continue
        err, where = R.compare(ref[0], ref[1], loss, got)
        print(f"  {model}-{size} {p}: gradients {'match' if err < R.TOLERANCE else 'DISAGREE'} "
              f"(rel. error {err:.1e} in {where})", flush=True)
        if err < R.TOLERANCE:
            ok.append(p)
    times: dict[str, list[float]] = {p: [] for p in ok}
    ratios: dict[str, list[float]] = {p: [] for p in ok}
    for r in range(args.rounds):
        order = ok[r % len(ok):] + ok[:r % len(ok)]
        round_median = {}
        for p in order:
            time.sleep(args.pause)
            ts = ask(procs[p], f"time {args.per_round}")
            times[p] += ts
            round_median[p] = statistics.median(ts)
        for p in ok:
            ratios[p].append(round_median[p] / round_median[ok[0]])
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    return {"times": times, "ratios": ratios, "info": info, "load": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--sizes", default="S")
    ap.add_argument("--peers", default="gir,gir-nooverlap,pytorch,jax,numpy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every time and ratio here")
    ap.add_argument("--_serve", default=None)
    ap.add_argument("--_model", default=None)
    ap.add_argument("--_size", default=None)
    ap.add_argument("--_inputs", default=None)
    args = ap.parse_args()
    if args._serve:
        serve(args._serve, args._model, args._size, args.threads, args._inputs)
        return 0
    import tempfile

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for size in args.sizes.split(","):
                before = os.getloadavg()[0]
                res = run_case(args, model, size, peers, Path(tmp))
                results[f"{model}-{size}"] = res
                cells = []
                for p in res["times"]:
                    med = 1e3 * statistics.median(res["times"][p])
                    ratio = statistics.median(res["ratios"][p])
                    cells.append(f"{p.split('=')[0]} {med:.2f} ms ({ratio:.2f}x gir)")
                print(f"{model}-{size} threads={args.threads} load {before:.1f}->{res['load'][0]:.1f}: "
                      + " | ".join(cells), flush=True)
                for p, i in res["info"].items():
                    if i:
                        print(f"    {p.split('=')[0]}: {json.dumps(i)[:600]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
