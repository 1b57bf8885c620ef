"""Liveness of values over the structured IR, one function at a time, and the passes that
report it: `liveness` (counts) and `print-liveness` (the sorted, stable printed form).

Terms.
- *Program point*: every op gets a number in a pre-order walk of the function, bodies
  included. A region op at point p (a loop, `scan` or `for`, or a `fused` op, whose body runs
  once per element: a loop too) has its body at p+1 .. end(p), where end(p) is the point of
  its `yield`. Function arguments are defined at point -1, before the first op.
- *live-in(op)* / *live-out(op)*: the values whose contents are still needed just before /
  just after op runs. For a loop op, live-in is before its first step and live-out after its
  last step; its body ops have their own sets.
- *Live range* of a value: [first, last], the points from its definition to the last point at
  which it is live. Two values whose ranges intersect need different memory (memplan.py).

Loops are followed around their back edge, so:
- a value defined outside a loop and used inside it is live for the whole loop (every step
  reads it again), through the loop's end point;
- carries live across steps: a carry's body argument is live for the whole body (its buffer
  holds the carry from one step to the next) and a yielded carry from its definition to the
  yield; a sequence is live for the whole loop (each step slices it), its body argument (the
  step's slice) from the body's start to its last use;
- stacked outputs are live from the loop's own point (they are filled step by step) to their
  last use after it; final carries are defined at the loop's end point.

Algorithm. In SSA form with structured loops, liveness is sparse: a value's range is fixed by
its definition and its reads, each read lifted out of the loops that do not define the value
(a read inside a loop is a read at the loop's end, since the next step reads it again). The
reads are every operand of every op plus those the loop rules add at each `yield` (the
carries' body arguments, the stacks and the sequences; for a `fused` op all its operands). A
read by an op in v's own block sets last(v) to the op's point at once; a read inside a loop
that does not define v becomes the fact "v is read at that loop's end", put on the worklist
once per (value, loop) and handled the same way in the loop's block. So the work is
O(ops + reads x loop depth), whatever the number of values live at once: no dense sets are
iterated, unlike a fixed-point dataflow over per-op sets (bench/memplan_scale.py measures both).
The per-op sets print-liveness shows are derived from the ranges in one sweep: live-in(op) is
{v: first(v) < point <= last(v)}, live-out {v: first(v) <= point < last(v)}, a loop's live-out
is taken at its end, and a yield's live-out is what the next step needs: the values defined
before its loop with last >= its point, but not the loop's body arguments.

Known gaps: a loop is assumed to run at least once (a zero-step loop's results are its initial
values and its stacks are empty, which needs no extra liveness); values are whole tensors
(no liveness of parts of a tensor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..ir.core import Block, BlockArgument, Function, Module, Operation, OpResult, Value
from ..ir.loops import LoopView, as_loop
from ..ir.printer import Printer


# How liveness reads a region op: a loop (`OpSpec.loop`: `scan`, `for`) through its LoopView;
# any other region op (`fused`) runs its body once per element of its `outputs` over its
# `inputs`, bound to the body's arguments, and yields its `outputs`.
def streamed(op: Operation) -> list[Value]:
    """Operands read again at every step: a loop's sequences, a fused op's inputs."""
    loop = as_loop(op)
    return loop.sequences if loop is not None else op.group("inputs")


def final_results(op: Operation) -> list[OpResult]:
    """Results defined when the region op ends (a scan's final carries, a fused op's outputs);
    a loop's stacked results are filled step by step, so live from the op's own point."""
    loop = as_loop(op)
    return loop.final_carries if loop is not None else op.result_group("outputs")


def yield_reads(op: Operation) -> list[Value]:
    """What the loop rules keep live to a region op's yield: the carries' body arguments, the
    stacks and the streamed operands."""
    loop = as_loop(op)
    if loop is None:
        return streamed(op)
    return [*loop.carry_args, *loop.stacked_results, *loop.sequences]


# Thin helpers over LoopView kept for tests/test_memplan.py and bench/memplan_scale.py; they
# answer [] for a region op that is not a loop.
def is_loop(op: Operation) -> bool:
    return op.spec.loop


def loop_inits(op: Operation) -> list[Value]:
    loop = as_loop(op)
    return loop.inits if loop is not None else []


def loop_carry_args(op: Operation) -> list[BlockArgument]:
    loop = as_loop(op)
    return loop.carry_args if loop is not None else []


def loop_carry_results(op: Operation) -> list[OpResult]:
    loop = as_loop(op)
    return loop.final_carries if loop is not None else []


def loop_stack_results(op: Operation) -> list[OpResult]:
    loop = as_loop(op)
    return loop.stacked_results if loop is not None else []


def yielded_carries(op: Operation) -> list[Value]:
    return LoopView(op).yielded_carries


def value_names(f: Function) -> dict[Value, str]:
    """Every value of f (arguments, results, body arguments) -> its printed name (`%h.1`):
    the printer's own naming, so names match `gir opt` output."""
    printer = Printer()
    printer.function(f)
    names = printer.names
    out: dict[Value, str] = {a: names[a] for a in f.args}
    for op in f.walk():
        for region in op.regions:
            for a in region.block.args:
                out[a] = names[a]
        for r in op.results:
            out[r] = names[r]
    return out


_DIGITS = re.compile(r"(\d+)")


def name_key(name: str) -> tuple:
    """Natural order: %2 < %10 < %h < %h.1 < %h.2 < %h.10."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in _DIGITS.split(name) if t)


def sorted_names(values: Iterable[Value], names: dict[Value, str]) -> list[str]:
    return sorted((names[v] for v in values), key=name_key)


class Liveness:
    """Liveness of every value of one function (see the module docstring for the rules).

    `range(v)` is (first, last); `last_use(v)` is the last point at which v is read (a read
    inside a loop counts at that loop's end), without the whole-body extension of carries;
    `live_in(op)` / `live_out(op)` are the sets at an op."""

    def __init__(self, function: Function):
        self.function = function
        self.points: list[Operation] = []
        """Ops in pre-order: points[i] is the op at point i."""
        self.point_of: dict[Operation, int] = {}
        self.end_of: dict[Operation, int] = {}
        """Region op (loop, fused) -> the point of its yield (the last point of its body)."""
        self._yield_uses: dict[Operation, list[Value]] = {}
        self._home: dict[Value, Block] = {}
        """Value -> the block that defines it (a loop's body for its body arguments)."""
        self.first: dict[Value, int] = {}
        self.last: dict[Value, int] = {}
        self.visits = 0
        """Reads looked at plus (value, loop) facts the worklist processed."""
        self._sets: dict[Operation, tuple[set[Value], set[Value]]] | None = None
        self._number(function.body)
        self._define()
        self._solve()

    # -- construction -----------------------------------------------------------------------
    def _number(self, block: Block) -> None:
        points, point_of = self.points, self.point_of
        for op in block:
            point_of[op] = len(points)
            points.append(op)
            if op.regions:
                self._number(op.body)
                self.end_of[op] = len(points) - 1
                term = op.body.last
                if term is not None and term.name == "yield":
                    self._yield_uses[term] = yield_reads(op)

    def uses(self, op: Operation) -> list[Value]:
        """op's operands; for a yield also the values the loop rules keep live to it."""
        extra = self._yield_uses.get(op)
        return op.operands if extra is None else op.operands + extra

    def _define(self) -> None:
        first, last, home = self.first, self.last, self._home
        body = self.function.body
        for a in self.function.args:
            first[a] = last[a] = -1
            home[a] = body
        for point, op in enumerate(self.points):
            if op.regions:
                inner = op.body
                for a in inner.args:
                    first[a] = last[a] = point
                    home[a] = inner
                loop = as_loop(op)
                for r in loop.stacked_results if loop is not None else ():
                    first[r] = last[r] = point
                end = self.end_of[op]
                for r in final_results(op):
                    first[r] = last[r] = end
                for r in op.results:
                    home[r] = op.parent  # type: ignore[assignment]
            else:
                block = op.parent
                for r in op.results:
                    first[r] = last[r] = point
                    home[r] = block  # type: ignore[assignment]

    def _solve(self) -> None:
        """Reads in a value's own block set its last point at once; a read inside a loop that
        does not define the value becomes the fact (value, loop): read at the loop's end."""
        last, end_of, home = self.last, self.end_of, self._home
        work: list[tuple[Value, Operation]] = []
        yield_uses = self._yield_uses
        visits = 0
        for point, op in enumerate(self.points):
            block = op.parent
            reads = yield_uses.get(op)
            for v in op.operands if reads is None else op.operands + reads:
                visits += 1
                if home[v] is block:
                    if point > last[v]:
                        last[v] = point
                else:
                    work.append((v, block.parent_op))  # type: ignore[union-attr,arg-type]
        lifted: set[tuple[Value, Operation]] = set()
        while work:
            fact = work.pop()
            if fact in lifted:
                continue
            lifted.add(fact)
            visits += 1
            v, loop = fact
            block = loop.parent
            if home[v] is block:
                if end_of[loop] > last[v]:
                    last[v] = end_of[loop]
            else:
                work.append((v, block.parent_op))  # type: ignore[union-attr,arg-type]
        self.visits = visits

    # -- queries ----------------------------------------------------------------------------
    def point(self, op: Operation) -> int:
        return self.point_of[op]

    def end(self, loop: Operation) -> int:
        return self.end_of[loop]

    @property
    def num_points(self) -> int:
        return len(self.points)

    def range(self, value: Value) -> tuple[int, int]:
        return self.first[value], self.last[value]

    def values(self) -> list[Value]:
        """Every value of the function: arguments, then in order of definition."""
        return sorted(self.first, key=lambda v: (self.first[v], _rank(v)))

    def last_use(self, value: Value) -> int:
        """The last point that reads value: a read inside a loop that does not define value
        counts at that loop's end. Unlike `range`, a carry's body argument is not kept live to
        the yield unless the yield reads it."""
        home = self._home[value]
        best = self.first[value]
        for user, _ in value.uses:
            op = user
            point = self.point_of[op]
            while op.parent is not home:
                loop = op.parent.parent_op if op.parent is not None else None
                if loop is None:
                    break
                point = self.end_of[loop]
                op = loop
            if point > best:
                best = point
        return best

    def live_in(self, op: Operation) -> set[Value]:
        return self._op_sets()[op][0]

    def live_out(self, op: Operation) -> set[Value]:
        return self._op_sets()[op][1]

    def _op_sets(self) -> dict[Operation, tuple[set[Value], set[Value]]]:
        """Every op's (live-in, live-out), from the ranges in one sweep over the points."""
        if self._sets is not None:
            return self._sets
        n = len(self.points)
        born: list[list[Value]] = [[] for _ in range(n + 1)]
        dies: list[list[Value]] = [[] for _ in range(n + 1)]
        for v, f in self.first.items():
            born[f + 1].append(v)  # in live-in sets from the point after its definition
            dies[self.last[v] + 1].append(v)  # ... up to and including its last point
        sets: dict[Operation, tuple[set[Value], set[Value]]] = {}
        active: set[Value] = set()
        loops: list[Operation] = []
        for point, op in enumerate(self.points):
            active.difference_update(dies[point])
            active.update(v for v in born[point] if self.last[v] >= point)
            live_in = set(active)
            if op.regions:
                sets[op] = (live_in, set())  # live-out when the loop ends
                loops.append(op)
                continue
            live_out = {v for v in active if self.last[v] > point}
            live_out.update(r for r in op.results if self.last[r] > point)
            if op.name == "yield" and loops and self.end_of[loops[-1]] == point:
                live_out = self._after_step(loops[-1], live_in)
            sets[op] = (live_in, live_out)
            while loops and self.end_of[loops[-1]] == point:
                loop = loops.pop()
                sets[loop][1].update(v for v in active if self.last[v] > point)
                sets[loop][1].update(r for r in final_results(loop) if self.last[r] > point)
        self._sets = sets
        return sets

    def _after_step(self, loop: Operation, live_in: set[Value]) -> set[Value]:
        """What the next step of loop (or the code after it) needs after its yield."""
        p = self.point_of[loop]
        args = set(loop.body.args)
        return {v for v in live_in if self.first[v] <= p and v not in args}

    def max_live(self) -> int:
        """The most values live at once (live-in of any op), from the ranges."""
        delta = [0] * (len(self.points) + 2)
        for v, f in self.first.items():
            last = self.last[v]
            if last > f:
                delta[f + 1] += 1
                delta[last + 1] -= 1
        best = running = 0
        for d in delta:
            running += d
            best = max(best, running)
        return best

    # -- printed form -----------------------------------------------------------------------
    def format(self, names: dict[Value, str] | None = None) -> str:
        """For each op in program order: its point, a short form of the op, and its live-in
        and live-out sets as naturally sorted printer names. Nested ops are indented."""
        names = names if names is not None else value_names(self.function)
        lines = [f"liveness of @{self.function.name}"]
        depth: dict[Operation, int] = {}
        for point, op in enumerate(self.points):
            parent = op.parent_op
            d = depth[op] = 0 if parent is None else depth[parent] + 1
            pad = "  " * (d + 1)
            head = ", ".join(names[r] for r in op.results)
            text = (head + " = " if head else "") + op.name
            if op.operands:
                text += " " + ", ".join(names[v] for v in op.operands)
            lines.append(f"{pad}{point}: {text}")
            for label, values in (("live-in:", self.live_in(op)), ("live-out:", self.live_out(op))):
                shown = sorted_names(values, names)
                lines.append(f"{pad}    {label}" + (" " + ", ".join(shown) if shown else ""))
        return "\n".join(lines) + "\n"


def _rank(v: Value) -> int:
    """Order among values defined at one point: arguments by position, results by index."""
    return v.index  # type: ignore[attr-defined]


def liveness_of(module: Module) -> dict[str, Liveness]:
    return {name: Liveness(f) for name, f in module.functions.items()}
