"""`gir opt` as whole processes, two gir checkouts alternated in one run (A/B on a shared
machine: both sides see the same load). Reports the median user+sys CPU seconds of each.

    python bench/opt_ab.py --a /path/to/main-parent --b /path/to/branch-parent --ops 25000 --runs 7

`--a`/`--b` are what PYTHONPATH gets: the directory holding a `gir` checkout (for a worktree at
/work/wt/NAME/gir, /work/wt/NAME). The program is bench/passes_scale.py's of about --ops ops,
written once to a temporary file; each run is `python -m gir.cli opt FILE -o /dev/null` with
the default pipeline, in a fresh GIR_CACHE_DIR shared by both sides (parser tables only),
after one warm-up run of each side.

The children run without PYTHONDONTWRITEBYTECODE (set in some shells here), so the warm-up
writes each side's .pyc files and the runs read them, as an installed gir does: with the
variable set and no __pycache__, every process compiles gir's ~70 modules from source (~0.1 s,
which is not compile time of the program). `--keep-env` passes the environment unchanged.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from passes_scale import program_of_about  # noqa: E402


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="PYTHONPATH of side A")
    ap.add_argument("--b", required=True, help="PYTHONPATH of side B")
    ap.add_argument("--ops", type=int, default=25000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep-env", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"opt-{args.ops}.gir"
        path.write_text(program_of_about(args.ops))
        cmd = [sys.executable, "-m", "gir.cli", "opt", str(path), "-o", os.devnull]
        sides = {"A": args.a, "B": args.b}
        envs = {name: dict(os.environ, PYTHONPATH=root, GIR_CACHE_DIR=str(Path(tmp) / "cache"))
                for name, root in sides.items()}
        if not args.keep_env:
            for env in envs.values():
                env.pop("PYTHONDONTWRITEBYTECODE", None)
        for env in envs.values():
            cpu_of(cmd, env)  # warm-up: parser tables into the cache, .pyc files written
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.runs):
            for name, env in envs.items():
                times[name].append(cpu_of(cmd, env))
    for name, xs in times.items():
        print(f"{name} ({sides[name]}): median {statistics.median(xs):.3f} s CPU  "
              f"({', '.join(f'{x:.2f}' for x in xs)})")
    print(f"B/A: {statistics.median(times['B']) / statistics.median(times['A']):.3f}")


if __name__ == "__main__":
    main()
