"""How liveness and the memory plan scale with program size (issue 6: 4k ops in under 50 ms,
linear growth), and what the worklist buys over a fixed-point liveness.

Generates two families of SSA programs (built directly as IR, f32, 32x64 activations, 64x64
weights), about 1k, 4k, 25k and 100k ops each:

- `layers`: units of a matmul, a bias, tanh and a product, every fourth unit an RNN-like
  `scan` of 8 steps (two GEMMs, a carried state, a carried loss, a stacked output), each unit
  followed at once by its "backward" (its saved values die within a few ops): the number of
  values live at once stays small whatever the size;
- `training`: the same forward units, but every unit saves its activation (and every scan its
  stack) until a backward pass at the end consumes them in reverse: the number of values live
  at once grows with the size, like a real training step.

For each: `Liveness(f)` (the sparse worklist of analysis/liveness.py), `plan_memory(f)` for each
placement strategy (the liveness excluded), and `check_plan`. Then, on the smaller programs, a
fixed-point liveness written here: the textbook dataflow over per-op live sets on the ops'
control-flow graph (back edges from each yield), re-run over all ops until nothing changes, as
PaddlePaddle's memory optimizer did; once sweeping the ops in program order (as it did) and
once in reverse order (the best order for a backward problem). Its sets are checked against
the worklist's. Times are the median of --repeat runs (one run where it takes over 5 s, and
at most --repeat - 2 above 30k ops) with the garbage collector paused.

    python bench/memplan_scale.py [--sizes 1000,4000,25000,100000] [--repeat 3]
                                  [--fixed-point-max 4000] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from gir.analysis.liveness import Liveness, loop_stack_results
from gir.analysis.memory.arena import STRATEGIES
from gir.analysis.memory.checker import check_plan
from gir.analysis.memory.planner import plan_memory
from gir.ir.core import Block, Function, Module, Operation, Region, Value
from gir.ir.ops import make_op
from gir.ir.types import TensorType

ACT = TensorType((32, 64), "f32")
WEIGHT = TensorType((64, 64), "f32")
BIAS = TensorType((64,), "f32")
SEQ = TensorType((8, 32, 64), "f32")


class _Gen:
    def __init__(self, f: Function):
        self.f = f
        self.w, self.u, self.b, self.xs, self.h0 = f.args

    def op(self, block: Block, name: str, operands: list[Value], **kw: Any) -> Operation:
        return block.append(make_op(name, operands, **kw))

    def v(self, block: Block, name: str, *operands: Value, **kw: Any) -> Value:
        return self.op(block, name, list(operands), **kw).result

    def dense_unit(self, block: Block, h: Value) -> tuple[Value, list[Value]]:
        m = self.v(block, "matmul", h, self.w)
        a = self.v(block, "add", m, self.b)
        t = self.v(block, "tanh", a)
        g = self.v(block, "mul", t, t)
        return self.v(block, "sub", t, g), [t]

    def scan_unit(self, block: Block, h: Value) -> tuple[Value, list[Value]]:
        zero = self.v(block, "zeros", declared=[TensorType((), "f32")])
        body = Block([ACT, ACT, TensorType((), "f32")])
        x, c, acc = body.args
        p = self.v(body, "matmul", x, self.w)
        q = self.v(body, "matmul", c, self.u)
        r = self.v(body, "add", p, q)
        r2 = self.v(body, "add", r, self.b)
        n = self.v(body, "tanh", r2)
        sq = self.v(body, "mul", n, n)
        sm = self.v(body, "sum", sq)
        acc2 = self.v(body, "add", acc, sm)
        body.append(make_op("yield", [n, acc2, n], segments=(2, 1)))
        scan = self.op(block, "scan", [self.xs, h, zero], regions=[Region(body)], segments=(1, 2))
        h2, _, stack = scan.results
        return h2, [stack]

    def backward(self, block: Block, g: Value, saved: Value) -> Value:
        if saved.tensor_type.rank == 3:  # a stack
            s = self.v(block, "sum", saved, attrs={"axes": [0]})
            return self.v(block, "add", g, s)
        d = self.v(block, "mul", g, saved)
        wt = self.v(block, "transpose", self.w)  # read only by the matmul: a view
        e = self.v(block, "matmul", d, wt)
        return self.v(block, "add", e, g)


def program(n_ops: int, family: str) -> Module:
    """A function of about n_ops ops (loop bodies included), deterministic."""
    f = Function("big", [WEIGHT, WEIGHT, BIAS, SEQ, ACT], [ACT, ACT], ["w", "u", "b", "xs", "h0"])
    gen = _Gen(f)
    block = f.body
    h, g = gen.h0, gen.h0
    saved: list[Value] = []
    count, unit = 0, 0
    per_unit = 5 + 4 + 3  # forward ops + backward ops, roughly; a scan unit has 12 + 2
    while count + per_unit < n_ops:
        if unit % 4 == 3:
            h, keep = gen.scan_unit(block, h)
            count += 12
        else:
            h, keep = gen.dense_unit(block, h)
            count += 5
        unit += 1
        if family == "layers":
            for s in keep:
                g = gen.backward(block, g, s)
                count += 2 if s.tensor_type.rank == 3 else 4
        else:
            saved.extend(keep)
            count += sum(2 if s.tensor_type.rank == 3 else 4 for s in keep)
    for s in reversed(saved):
        g = gen.backward(block, g, s)
    block.append(make_op("return", [h, g]))
    return Module([f])


# -- the fixed-point liveness, for comparison ----------------------------------------------
def fixed_point_liveness(f: Function, reverse: bool, budget_s: float) -> tuple[list[set[Value]], int, bool]:
    """Per-op live-in sets by the textbook equations, every op recomputed each sweep until a
    sweep changes nothing. Returns (live-in per point, sweeps, finished within the budget)."""
    live = Liveness(f)  # only for the op numbering and the yields' extra reads
    ops = live.points
    index = {op: i for i, op in enumerate(ops)}
    uses = [set(live.uses(op)) for op in ops]
    defs = [set(op.body.args) | set(loop_stack_results(op)) if op.regions else set(op.results) for op in ops]
    succ: list[list[tuple[int, set[Value]]]] = []
    for op in ops:
        loop = op.parent_op
        if op.regions:
            succ.append([(index[op.body.first], set())])  # type: ignore[index]
        elif op.name == "yield" and loop is not None:
            succ.append([(index[loop.body.first], set(loop.body.args)),  # type: ignore[index]
                         (index[loop.next], set(loop.results))])  # type: ignore[index]
        else:
            succ.append([(index[op.next], set())] if op.next is not None else [])
    live_in: list[set[Value]] = [set() for _ in ops]
    order = range(len(ops) - 1, -1, -1) if reverse else range(len(ops))
    start = time.perf_counter()
    sweeps, changed = 0, True
    while changed:
        if time.perf_counter() - start > budget_s:
            return live_in, sweeps, False
        changed = False
        sweeps += 1
        for i in order:
            out: set[Value] = set()
            for s, kill in succ[i]:
                out |= live_in[s] - kill if kill else live_in[s]
            new = uses[i] | (out - defs[i])
            if new != live_in[i]:
                live_in[i] = new
                changed = True
    return live_in, sweeps, True


# -- measuring -----------------------------------------------------------------------------
def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
        if times[-1] > 5.0:  # a run this slow is not repeated
            break
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,4000,25000,100000")
    ap.add_argument("--families", default="layers,training")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size-max", type=int, default=25000,
                    help="force the size strategy on programs up to this many ops (it is quadratic on training)")
    ap.add_argument("--fixed-point-max", type=int, default=4000,
                    help="run the fixed-point liveness on programs up to this many ops")
    ap.add_argument("--fixed-point-budget", type=float, default=120.0, help="seconds per fixed-point run")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = []
    print("| family | ops | max live | liveness ms | " + " | ".join(f"plan {s} ms" for s in STRATEGIES)
          + " | check ms | arena / lower bound (" + ", ".join(STRATEGIES) + ") | liveness+plan us/op |")
    print("|---|---:|---:|---:|" + "---:|" * len(STRATEGIES) + "---:|---|---:|")
    for family in args.families.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            f = program(n, family).functions["big"]
            ops = f.num_ops()
            repeat = args.repeat if ops <= 30000 else max(1, args.repeat - 2)
            t_live, live = timed(lambda: Liveness(f), repeat)  # noqa: B023
            row: dict[str, Any] = {"family": family, "ops": ops, "max_live": live.max_live(),
                                   "liveness_s": t_live, "plan_s": {}, "ratio": {}}
            for strategy in STRATEGIES:
                if strategy == "size" and ops > args.size_max:
                    row["plan_s"][strategy] = row["ratio"][strategy] = None
                    continue
                t_plan, plan = timed(lambda: plan_memory(f, liveness=live, strategy=strategy), repeat)  # noqa: B023
                row["plan_s"][strategy] = t_plan
                row["ratio"][strategy] = plan.arena_bytes / plan.lower_bound
                if strategy == STRATEGIES[0]:
                    row["auto_chose"] = plan.strategy
                    t_check, _ = timed(lambda: check_plan(plan), 1)  # noqa: B023
                    row["check_s"] = t_check
            default = row["plan_s"][STRATEGIES[0]]
            rows.append(row)
            cells = []
            for strategy in STRATEGIES:
                t_plan = row["plan_s"][strategy]
                cell = "skipped" if t_plan is None else f"{t_plan * 1e3:.1f}"
                cells.append(cell + (f" ({row['auto_chose']})" if strategy == "auto" else ""))
            ratios = ", ".join("-" if row["ratio"][s] is None else f"{row['ratio'][s]:.3f}" for s in STRATEGIES)
            print(f"| {family} | {ops} | {row['max_live']} | {t_live * 1e3:.1f} | " + " | ".join(cells)
                  + f" | {row['check_s'] * 1e3:.1f} | {ratios} | {(t_live + default) / ops * 1e6:.1f} |", flush=True)
    print()
    print("| family | ops | worklist liveness ms | fixed point, program order | fixed point, reverse order |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        if row["ops"] > args.fixed_point_max:
            continue
        f = program(row["ops"], row["family"]).functions["big"]
        live = Liveness(f)
        cells = []
        for reverse in (False, True):
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                sets, sweeps, done = fixed_point_liveness(f, reverse, args.fixed_point_budget)
                seconds = time.perf_counter() - start
            finally:
                gc.enable()
            if done:
                assert all(sets[i] == live.live_in(op) for i, op in enumerate(live.points)), "sets differ"
            cells.append(f"{seconds * 1e3:.0f} ms, {sweeps} sweeps" if done else
                         f"> {seconds:.0f} s (stopped after {sweeps} sweeps)")
            row["fixed_point_program_order" if not reverse else "fixed_point_reverse_order"] = {
                "seconds": seconds, "sweeps": sweeps, "finished": done}
        print(f"| {row['family']} | {row['ops']} | {row['liveness_s'] * 1e3:.1f} | {cells[0]} | {cells[1]} |",
              flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"python": sys.version.split()[0], "rows": rows}, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
