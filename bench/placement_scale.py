"""How the `place` pass scales with program size (DESIGN.md §4: a 25,000-op graph is a normal
case; target: `place` on 25k ops in under 1 s, with either policy).

Generates SSA programs of about 1k, 10k, 25k and 100k ops (counted after parsing, loop bodies
included). Each is a chain of units mixing what placement decides between: GEMMs and a scan
(the big ops), elementwise ops fed by them, a reduction to a scalar and scalar arithmetic
(too small), a small island on a 64-element argument (too small), and a large island on the
arguments alone (on the GPU with `aggressive`, on the CPU with `lift`):

    %m = matmul %h, %w                            %s = sum %t                (a scalar result)
    %a = add %m, %b                               %i = mul %big, %big        (the island:
    %t = tanh %a                                  %r = reduce_max %i          gpu or cpu)
    %wt = transpose %w  (lifted: read by a GEMM)  %d = mul %s, %r            (scalars: cpu)
    %e = exp %v         (64 elements: cpu)        %c' = add %c, %d
    %hh, %ys = scan (%x in %xs) carry (%hc = %t) {
      %p = matmul %x, %wt ; %q = add %p, %hc ; %n = tanh %q ; yield (%n) stack (%n)
    }
    %h' = add %hh, %h0

Parsing is not timed. `place` is timed on a fresh parse for each policy with
PassManager(verify_each=False); median of 3 runs of CPU seconds of this process
(`time.process_time`); `place twice` times a second run on the placed IR (it changes nothing).

    python bench/placement_scale.py [--sizes 1000,10000,25000,100000] [--repeat 3] [--profile N]
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
func @chain(%xs: tensor<4x64x64xf32>, %h0: tensor<64x64xf32>, %w: tensor<64x64xf32>, %b: tensor<64xf32>,
            %v: tensor<64xf32>, %big: tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<f32>) {
  %h_0 = add %h0, %big : tensor<64x64xf32>
  %c_0 = constant 0.0 : tensor<f32>
"""

UNIT = """\
  %m_{k} = matmul %h_{j}, %w : tensor<64x64xf32>
  %a_{k} = add %m_{k}, %b : tensor<64x64xf32>
  %t_{k} = tanh %a_{k} : tensor<64x64xf32>
  %s_{k} = sum %t_{k} : tensor<f32>
  %i_{k} = mul %big, %big : tensor<64x64xf32>
  %r_{k} = reduce_max %i_{k} : tensor<f32>
  %d_{k} = mul %s_{k}, %r_{k} : tensor<f32>
  %c_{k} = add %c_{j}, %d_{k} : tensor<f32>
  %e_{k} = exp %v : tensor<64xf32>
  %f_{k} = mul %e_{k}, %v : tensor<64xf32>
  %wt_{k} = transpose %w : tensor<64x64xf32>
  %hh_{k}, %ys_{k} = scan (%x_{k} in %xs) carry (%hc_{k} = %t_{k}) {
    %p_{k} = matmul %x_{k}, %wt_{k} : tensor<64x64xf32>
    %q_{k} = add %p_{k}, %hc_{k} : tensor<64x64xf32>
    %n_{k} = tanh %q_{k} : tensor<64x64xf32>
    yield (%n_{k}) stack (%n_{k})
  } : tensor<64x64xf32>, tensor<4x64x64xf32>
  %h_{k} = add %hh_{k}, %h0 : tensor<64x64xf32>
"""


def program(units: int) -> str:
    body = "".join(UNIT.replace("{k}", str(k)).replace("{j}", str(k - 1)) for k in range(1, units + 1))
    return HEADER + body + f"  return %h_{units}, %c_{units}\n}}\n"


def program_of_about(n_ops: int) -> str:
    one, two = (gir.parse(program(n)).num_ops() for n in (1, 2))
    per_unit = two - one
    return program(max(1, round((n_ops - (one - per_unit)) / per_unit)))


def time_place(text: str, policy: str, repeat: int) -> tuple[int, int, int, float, float]:
    """(ops parsed, ops after place, transfers, median CPU s of place, median CPU s of a second place)."""
    firsts, seconds = [], []
    n0 = n1 = transfers = 0
    for _ in range(repeat):
        module = gir.parse(text)
        n0 = module.num_ops()
        gc.collect()
        cpu = time.process_time()
        PassManager(f"place{{policy={policy}}}", verify_each=False).run(module)
        firsts.append(time.process_time() - cpu)
        n1 = module.num_ops()
        transfers = sum(1 for op in module.walk() if op.name == "transfer")
        cpu = time.process_time()
        report = PassManager(f"place{{policy={policy}}}", verify_each=False).run(module)
        seconds.append(time.process_time() - cpu)
        assert not report.records[0].changed, "a second place changed the IR"
    return n0, n1, transfers, statistics.median(firsts), statistics.median(seconds)


def profile(text: str) -> None:
    module = gir.parse(text)
    prof = cProfile.Profile()
    prof.enable()
    PassManager("place", verify_each=False).run(module)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
    print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,25000,100000", help="target op counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, metavar="N", help="also print a cProfile of place at N ops")
    args = ap.parse_args()
    print(f"{'N ops':>8} {'policy':>10} {'after':>8} {'transfers':>9} {'place s':>8} {'s/1k ops':>9} "
          f"{'place twice s':>13}")
    for target in (int(s) for s in args.sizes.split(",")):
        text = program_of_about(target)
        for policy in ("lift", "aggressive"):
            n0, n1, transfers, first, second = time_place(text, policy, args.repeat)
            print(f"{n0:8d} {policy:>10} {n1:8d} {transfers:9d} {first:8.3f} {first / (n0 / 1000):9.4f} "
                  f"{second:13.3f}", flush=True)
    if args.profile:
        profile(program_of_about(args.profile))


if __name__ == "__main__":
    main()
