"""Compile time: first compiles, cache hits, `gir run` warm and `gir opt` at scale.

Every figure is taken in fresh processes (one per run; `--runs` runs, the median reported),
each with a cache directory prepared for the case:

- first compile: `gir.jit(examples/<model>.gir, "<model>_grads")` with no compiled entry.
  "tables only": the cache holds what a parse of valid text leaves (nothing since the fast
  parser's terminal table ships with gir; a parser-*.terminals.json built from Lark where the
  shipped table's key does not match, e.g. another Lark version), so GEMM paths come from the
  model and are measured in the background; "GEMM measured": the GEMM times of this machine are
  there as well; "nothing at all": an empty directory.
- cache hit: the same call after a compile, in a new process, and a second JitFunction of the
  same source in the same process.
- `gir run examples/lstm.gir` warm (compiled before), as a whole process.
- `gir opt` of generated programs (bench/passes_scale.py's units) of about 25k, 50k and 100k
  ops with the default pipeline, as a whole process.

In-process figures exclude `import gir` and are given as wall-clock seconds and as the CPU
seconds of the calling thread (`time.thread_time`); whole-process figures as wall-clock and
user+sys CPU seconds of the child (`resource.getrusage`). On a shared machine the CPU seconds
are the figure that other processes disturb least.

    python bench/compile_time.py [--runs 5] [--skip-opt] [--sizes 25000,50000,100000]
    python bench/compile_time.py --tiers gru,lstm --runs 5   # tiered compilation on/off, interleaved
    python bench/compile_time.py --lengths gru,lstm --runs 5 # the cost of a new sequence length
    python bench/compile_time.py --runs 5 --skip-opt --busy 2  # the same beside 2 busy processes

The cost of a new length (issue 28, target <= 50 ms): `examples/<model>.gir` with `%xs`'s
leading dim written `?`, compiled at the first of `--steps-list` lengths in a fresh process
(GEMM times measured, no compiled entry; its -O3 code waited for), then called at each
further length: the first call's wall time there less the second call's (the step itself),
with GIR_LENGTHS=1 (one compile for every length) and 0 (a specialisation per length),
interleaved run by run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))

JIT_ONCE = """\
import json, os, sys, time
t0 = time.perf_counter()
import gir
from gir.backend.cpu import blas
t1 = time.perf_counter()
w, c, p = time.perf_counter(), time.thread_time(), time.process_time()
fn = gir.jit(sys.argv[1], sys.argv[2])
w, c = time.perf_counter() - w, time.thread_time() - c
tier = fn.compiled.code.info.tier
# tiered: the -O3 code swapped in (and stored); with --busy, a bounded wait: beside CPU-bound
# processes the -O3 child at nice 19 may take minutes, and the cache keeps the quick code meanwhile
fn.compiled.wait_for_final_code(float(os.environ.get("GIR_BENCH_FINAL_WAIT", "600")))
final_wall, final_cpu = time.perf_counter() - t1, time.process_time() - p  # both threads' CPU
w2, c2 = time.perf_counter(), time.thread_time()
again = gir.jit(sys.argv[1], sys.argv[2])
w2, c2 = time.perf_counter() - w2, time.thread_time() - c2
info = fn.compiled.code.info  # the final code's
if sys.argv[3] == "wait":
    blas.wait_for_measurements()
print(json.dumps({"import": t1 - t0, "wall": w, "cpu": c, "from_cache": info.from_cache,
                  "again_wall": w2, "again_cpu": c2, "again_from_cache": again.compiled.code.info.from_cache,
                  "seconds": info.seconds, "opt_level": info.opt_level, "tier": tier,
                  "final_wall": final_wall, "final_cpu": final_cpu}))
"""

STEPS_ONCE = """\
import json, sys, time
import gir
from gir.ir.interpreter import random_inputs
t0 = time.perf_counter()
fn = gir.jit(sys.argv[1], sys.argv[2])
args = random_inputs(fn.signature, 0)
tiers = []
for _ in range(int(sys.argv[3])):
    fn(*args)
    tiers.append(fn.stats.compile.tier)
print(json.dumps({"steps_wall": time.perf_counter() - t0, "quick_steps": tiers.count("quick")}))
fn.compiled.wait_for_final_code(600)
"""


LENGTHS_ONCE = """\
import json, re, sys, time
import numpy as np
import gir
from gir.backend.cpu import blas
text = re.sub(r"%xs: tensor<\\d+x", "%xs: tensor<?x", open(sys.argv[1]).read())
fn = gir.jit(text, sys.argv[2])
rng = np.random.default_rng(0)
costs, steps = [], []
for i, t in enumerate(int(x) for x in sys.argv[3].split(",")):
    args = [(0.1 * rng.standard_normal(tuple(t if d is None else d for d in a.shape))).astype(a.numpy_dtype)
            for a in fn.signature.arg_types]
    w = time.perf_counter()
    fn(*args)
    first = time.perf_counter() - w
    w = time.perf_counter()
    fn(*args)
    again = time.perf_counter() - w
    if i:  # the first length pays the compile
        costs.append(first - again)
        steps.append(again)
    else:  # its -O3 code and GEMM measurements done: later lengths do not compete with them
        fn.compiled.wait_for_final_code(600)
        blas.wait_for_measurements()
print(json.dumps({"costs": costs, "steps": steps, "specialisations": fn.specialisations,
                  "lengths": fn.stats.compile.lengths}))
"""


def run_child(args: list[str], env: dict[str, str]) -> tuple[str, float, float]:
    """(stdout, wall seconds, user+sys CPU seconds) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.stdout, wall, cpu


def environment(cache_dir: Path, tier: str | None = None) -> dict[str, str]:
    env = {**os.environ, "GIR_CACHE_DIR": str(cache_dir)}
    if tier is not None:
        env["GIR_LLVM_TIER"] = tier
    env.pop("GIR_GEMM_MEASURE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: gir's modules load from their .pyc files
    env["PYTHONPATH"] = str(ROOT.parent) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def jit_case(model: str, seed_dir: Path | None, runs: int, wait: bool) -> list[dict]:
    """Runs of JIT_ONCE, each in a copy of seed_dir (or an empty directory)."""
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cache_dir = Path(tmp) / "cache"
            if seed_dir is not None:
                shutil.copytree(seed_dir, cache_dir)
            text, _, _ = run_child([sys.executable, "-c", JIT_ONCE, str(EXAMPLES / f"{model}.gir"), f"{model}_grads",
                                    "wait" if wait else "-"], environment(cache_dir))
            out.append(json.loads(text))
    return out


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def prepare(base: Path, model: str) -> dict[str, Path]:
    """Cache directories: tables only; tables + GEMM times; tables + GEMM times + compiled."""
    tables, measured, compiled = base / "tables", base / f"measured-{model}", base / f"compiled-{model}"
    if not tables.exists():
        tables.mkdir(parents=True)  # a parse may leave nothing (the shipped terminal table serves)
        run_child([sys.executable, "-c", "import gir; gir.parse('func @f(%x: tensor<f32>) -> tensor<f32> "
                   "{ return %x }')"], environment(tables))
    shutil.copytree(tables, measured)
    run_child([sys.executable, "-c", JIT_ONCE, str(EXAMPLES / f"{model}.gir"), f"{model}_grads", "wait"],
              environment(measured))
    for sub in ("compiled", "objects"):
        shutil.rmtree(measured / sub, ignore_errors=True)
    shutil.copytree(measured, compiled)
    run_child([sys.executable, "-c", JIT_ONCE, str(EXAMPLES / f"{model}.gir"), f"{model}_grads", "-"],
              environment(compiled))
    return {"tables": tables, "measured": measured, "compiled": compiled}


def tier_table(base: Path, runs: int, models: list[str], steps: int = 10) -> list[str]:
    """First compiles with tiering on and off, interleaved run by run (GEMM times measured, no
    compiled entry): CPU seconds of the calling thread until callable, and until the -O3 code
    runs (wall, and CPU of the whole process: the background thread's included); then, in
    another fresh process, wall seconds from `gir.jit` until `steps` training steps are done."""
    rows = ["| model | GIR_LLVM_TIER | CPU s until callable | wall s until callable | "
            f"wall s until -O3 | process CPU s until -O3 | code first run | wall s until {steps} steps done "
            "(of them quick) |", "|---|---|---|---|---|---|---|---|"]
    for model in models:
        dirs = prepare(base, model)
        got: dict[str, list[dict]] = {"1": [], "0": []}
        for _ in range(runs):
            for tier in ("1", "0"):
                with tempfile.TemporaryDirectory() as tmp:
                    cache_dir = Path(tmp) / "cache"
                    shutil.copytree(dirs["measured"], cache_dir)
                    text, _, _ = run_child([sys.executable, "-c", JIT_ONCE, str(EXAMPLES / f"{model}.gir"),
                                            f"{model}_grads", "-"], environment(cache_dir, tier))
                    row = json.loads(text)
                    shutil.rmtree(cache_dir)
                    shutil.copytree(dirs["measured"], cache_dir)
                    text, _, _ = run_child([sys.executable, "-c", STEPS_ONCE, str(EXAMPLES / f"{model}.gir"),
                                            f"{model}_grads", str(steps)], environment(cache_dir, tier))
                    got[tier].append({**row, **json.loads(text)})
        for tier, rs in got.items():
            rows.append(f"| {model} | {tier} | {median(rs, 'cpu'):.3f} | {median(rs, 'wall'):.3f} | "
                        f"{median(rs, 'final_wall'):.3f} | {median(rs, 'final_cpu'):.3f} | "
                        f"{rs[0]['tier'] or 'one compile'} | {median(rs, 'steps_wall'):.3f} "
                        f"({median(rs, 'quick_steps'):.0f}) |")
        shutil.rmtree(dirs["measured"])
        shutil.rmtree(dirs["compiled"])
    return rows


def lengths_table(base: Path, runs: int, models: list[str], lengths: str) -> list[str]:
    """The cost of a new length (module docstring), GIR_LENGTHS=1 against 0, interleaved."""
    rows = ["| model | GIR_LENGTHS | lengths | cost of a new length, median ms (max) | step at it, median ms | "
            "specialisations |", "|---|---|---|---|---|---|"]
    for model in models:
        dirs = prepare(base, model)
        got: dict[str, list[dict]] = {"1": [], "0": []}
        for _ in range(runs):
            for switch in ("1", "0"):
                with tempfile.TemporaryDirectory() as tmp:
                    cache_dir = Path(tmp) / "cache"
                    shutil.copytree(dirs["measured"], cache_dir)
                    env = {**environment(cache_dir), "GIR_LENGTHS": switch}
                    text, _, _ = run_child([sys.executable, "-c", LENGTHS_ONCE, str(EXAMPLES / f"{model}.gir"),
                                            f"{model}_grads", lengths], env)
                    got[switch].append(json.loads(text))
        for switch, rs in got.items():
            costs = [c for r in rs for c in r["costs"]]
            steps = [s for r in rs for s in r["steps"]]
            rows.append(f"| {model} | {switch} | {lengths} | {1e3 * statistics.median(costs):.1f} "
                        f"({1e3 * max(costs):.1f}) | {1e3 * statistics.median(steps):.1f} | "
                        f"{rs[0]['specialisations']} |")
        shutil.rmtree(dirs["measured"])
        shutil.rmtree(dirs["compiled"])
    return rows


def jit_table(base: Path, runs: int) -> list[str]:
    rows = ["| case | model | wall s | CPU s | from cache | LLVM opt+emit s |",
            "|---|---|---|---|---|---|"]
    for model in ("gru", "lstm"):
        dirs = prepare(base, model)
        cases = [("first compile, nothing at all in the cache", None, False),
                 ("first compile, parser tables only (GEMM model)", dirs["tables"], False),
                 ("first compile, GEMM times measured", dirs["measured"], False),
                 ("cache hit, new process", dirs["compiled"], False)]
        for title, seed, wait in cases:
            got = jit_case(model, seed, runs, wait)
            llvm = statistics.median(r["seconds"].get("llvm_opt", 0) + r["seconds"].get("llvm_emit", 0)
                                     for r in got) if not got[0]["from_cache"] else 0.0
            rows.append(f"| {title} | {model} | {median(got, 'wall'):.3f} | {median(got, 'cpu'):.3f} | "
                        f"{got[0]['from_cache'] or 'no'} | {llvm:.3f} |")
            if title.startswith("cache hit"):
                rows.append(f"| cache hit, same process (2nd JitFunction) | {model} | "
                            f"{median(got, 'again_wall'):.4f} | {median(got, 'again_cpu'):.4f} | "
                            f"{got[0]['again_from_cache']} | 0 |")
    return rows


def process_rows(title: str, args: list[str], env: dict[str, str], runs: int) -> str:
    walls, cpus = [], []
    run_child(args, env)  # warm-up (and, for gir run, the compile)
    for _ in range(runs):
        _, wall, cpu = run_child(args, env)
        walls.append(wall)
        cpus.append(cpu)
    return f"| {title} | {statistics.median(walls):.2f} | {statistics.median(cpus):.2f} |"


def process_table(base: Path, runs: int, sizes: list[int], skip_opt: bool) -> list[str]:
    import passes_scale

    rows = ["| whole process | wall s | user+sys CPU s |", "|---|---|---|"]
    env = environment(base / "tables")
    rows.append(process_rows("python -c 'import gir'", [sys.executable, "-c", "import gir"], env, runs))
    rows.append(process_rows("gir run examples/lstm.gir (warm)",
                             [sys.executable, "-m", "gir.cli", "run", str(EXAMPLES / "lstm.gir")], env, runs))
    if skip_opt:
        return rows
    for n in sizes:
        path = base / f"opt-{n}.gir"
        path.write_text(passes_scale.program_of_about(n))
        rows.append(process_rows(f"gir opt, about {n // 1000}k ops, default pipeline",
                                 [sys.executable, "-m", "gir.cli", "opt", str(path), "-o", os.devnull], env, runs))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="25000,50000,100000")
    ap.add_argument("--skip-opt", action="store_true")
    ap.add_argument("--skip-jit", action="store_true")
    ap.add_argument("--tiers", default="", help="only the A/B of tiered compilation, for these models (gru,lstm)")
    ap.add_argument("--lengths", default="", help="only the cost of a new sequence length, for these models")
    ap.add_argument("--steps-list", default="40,41,42,43,57,100",
                    help="--lengths: the sequence lengths called, in order (the first one compiles)")
    ap.add_argument("--busy", type=int, default=0,
                    help="CPU-bound processes running beside every measurement (the same table under load)")
    args = ap.parse_args()
    if args.busy:
        os.environ["GIR_BENCH_FINAL_WAIT"] = "10"
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        _tables(args)
    finally:
        for p in busy:
            p.terminate()
            p.join()


def _spin() -> None:
    while True:
        pass


def _tables(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if args.lengths:
            print("\n".join(lengths_table(base, args.runs, args.lengths.split(","), args.steps_list)))
            return
        if args.tiers:
            print("\n".join(tier_table(base, args.runs, args.tiers.split(","))))
            return
        if not args.skip_jit:
            print("\n".join(jit_table(base, args.runs)))
            print()
        else:
            run_child([sys.executable, "-c", "import gir; gir.parse('func @f(%x: tensor<f32>) -> tensor<f32> "
                       "{ return %x }')"], environment(base / "tables"))
        print("\n".join(process_table(base, args.runs, [int(s) for s in args.sizes.split(",")], args.skip_opt)))


if __name__ == "__main__":
    main()
