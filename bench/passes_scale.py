"""How `ssa` and `canonicalize` scale with program size (DESIGN.md §4: linear or near-linear,
a 25,000-op graph is a normal case; target: 25k ops through both passes in under 1 s).

Generates surface-form programs of about 1k, 10k, 25k and 100k ops (counted after parsing,
pre-SSA: `var`/`load`/`store` included). Each is a chain of units; a unit is

    for %x in %xs {                          loop-carried names (%h, %s) and a name
      %h = tanh(%x @ %w + %h @ (%u * 1.0) + %b * 2.0)    local to a step (%tK): ssa's work
      %tK = %h * 1.0 + 0.0
      %tK = %tK * %x
      %s = %s + sum(%tK * %tK)
      collect %tK into %cK
    }
    %yK = %h + 0.0                           identities, duplicates, dead code and a
    %h = %yK @ %w + %yK @ %w                 loop-invariant product: canonicalize's work
    %deadK = exp(%h)
    %h = %h + sum(%cK, axes = [0])

Parsing is not timed. Each pass is timed on a fresh parse (ssa on the parsed program,
canonicalize on ssa's output) with PassManager(verify_each=False); median of 3. Times are
CPU seconds of this process (`time.process_time`: the passes are single-threaded Python, so
on an idle machine this is the wall-clock time, and on a shared one it leaves out the time
other processes took); `both wall` is the wall-clock time of both passes, for comparison.

    python bench/passes_scale.py [--sizes 1000,10000,25000,100000] [--repeat 3] [--profile N]
    python bench/passes_scale.py --pipeline default [--sizes 25000]   # a whole pipeline, as gir opt
                                                                       # runs it (verifying after each pass)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import time

import gir
from gir.passes.pass_manager import PassManager

HEADER = """\
func @chain(%xs: tensor<4x8x8xf32>, %h0: tensor<8x8xf32>, %w: tensor<8x8xf32>, %u: tensor<8x8xf32>,
            %b: tensor<8xf32>) -> (tensor<8x8xf32>, tensor<f32>) {
  %h = %h0
  %s = constant 0.0 : tensor<f32>
"""

UNIT = """\
  for %x in %xs {
    %h = tanh(%x @ %w + %h @ (%u * 1.0) + %b * 2.0)
    %t{k} = %h * 1.0 + 0.0
    %t{k} = %t{k} * %x
    %s = %s + sum(%t{k} * %t{k})
    collect %t{k} into %c{k}
  }
  %y{k} = %h + 0.0
  %h = %y{k} @ %w + %y{k} @ %w
  %dead{k} = exp(%h)
  %h = %h + sum(%c{k}, axes = [0])
"""

FOOTER = "  return %h, %s\n}\n"


def program(units: int) -> str:
    return HEADER + "".join(UNIT.replace("{k}", str(k)) for k in range(units)) + FOOTER


def ops_per_unit() -> tuple[int, int]:
    """(ops of the fixed part, ops per unit), measured by parsing (two units and more make
    the loop element %x a reassigned name too)."""
    two, three = (gir.parse(program(n)).num_ops() for n in (2, 3))
    return two - 2 * (three - two), three - two


def program_of_about(n_ops: int) -> str:
    fixed, per_unit = ops_per_unit()
    return program(max(1, round((n_ops - fixed) / per_unit)))


def time_passes(text: str, repeat: int) -> tuple[int, int, int, float, float, float]:
    """(ops parsed, ops after ssa, ops after canonicalize, then medians: ssa CPU s,
    canonicalize CPU s, both wall-clock s)."""
    ssa_times, canon_times, walls = [], [], []
    sizes = (0, 0, 0)
    for _ in range(repeat):
        module = gir.parse(text)
        n0 = module.num_ops()
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        PassManager("ssa", verify_each=False).run(module)
        ssa_times.append(time.process_time() - cpu)
        n1 = module.num_ops()
        cpu = time.process_time()
        PassManager("canonicalize", verify_each=False).run(module)
        canon_times.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
        sizes = (n0, n1, module.num_ops())
    return (*sizes, statistics.median(ssa_times), statistics.median(canon_times), statistics.median(walls))


def time_pipeline(text: str, pipeline: str, repeat: int) -> tuple[int, int, float, float]:
    """(ops parsed, ops after, median CPU s, median wall s) of the whole pipeline, verified after
    every pass as `gir opt` runs it."""
    cpus, walls, sizes = [], [], (0, 0)
    for _ in range(repeat):
        module = gir.parse(text)
        n0 = module.num_ops()
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        PassManager(pipeline).run(module)
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
        sizes = (n0, module.num_ops())
    return (*sizes, statistics.median(cpus), statistics.median(walls))


def profile(text: str) -> None:
    """cProfile of each pass on one program: where the time goes."""
    module = gir.parse(text)
    for name in ("ssa", "canonicalize"):
        prof = cProfile.Profile()
        prof.enable()
        PassManager(name, verify_each=False).run(module)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
        print(f"--- cProfile: {name} ---")
        print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,25000,100000", help="target op counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, metavar="N", help="also print a cProfile of both passes at N ops")
    ap.add_argument("--pipeline", help="time this whole pipeline instead ('default': gir opt's default)")
    args = ap.parse_args()
    if args.pipeline:
        from gir.passes.pipeline import DEFAULT_PIPELINE

        pipeline = DEFAULT_PIPELINE if args.pipeline == "default" else args.pipeline
        print(f"pipeline: {pipeline}\n{'N ops':>8} {'after':>8} {'CPU s':>8} {'wall s':>8}")
        for target in (int(s) for s in args.sizes.split(",")):
            n0, n1, cpu, wall = time_pipeline(program_of_about(target), pipeline, args.repeat)
            print(f"{n0:8d} {n1:8d} {cpu:8.3f} {wall:8.3f}", flush=True)
        return
    print(f"{'N ops':>8} {'after ssa':>9} {'after canon':>11} {'ssa s':>8} {'canon s':>8} {'both s':>8} "
          f"{'both wall':>9} {'ssa s/1k':>9} {'canon s/1k':>10} {'both s/1k':>9}")
    for target in (int(s) for s in args.sizes.split(",")):
        n0, n1, n2, t_ssa, t_canon, wall = time_passes(program_of_about(target), args.repeat)
        k = n0 / 1000
        print(f"{n0:8d} {n1:9d} {n2:11d} {t_ssa:8.3f} {t_canon:8.3f} {t_ssa + t_canon:8.3f} {wall:9.3f} "
              f"{t_ssa / k:9.4f} {t_canon / k:10.4f} {(t_ssa + t_canon) / k:9.4f}", flush=True)
    if args.profile:
        profile(program_of_about(args.profile))


if __name__ == "__main__":
    main()
