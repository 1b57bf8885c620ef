"""The static memory plan: every intermediate tensor of a function gets an (offset, size) in
one arena, so that no two values live at the same time overlap; and the `memplan` pass, which
plans every function and reports the numbers.

Terms.
- *Planned values*: op results and the carries' body arguments. Function arguments live in
  the caller's memory and are never written; they are not in the arena, and neither are:
  *views*, results that read their operand's memory where it is (`view_source`: `reshape`,
  `transfer`, `index`, a contiguous `slice`, a 2-D `transpose` read only by matmuls, which
  the GEMM reads transposed; a sequence's body argument, one step of the sequence); and
  *registers*, the values inside a `fused` op (one element at a time). A view keeps the buffer
  it reads live for as long as the view is live.
- *Buffer*: bytes (a multiple of 64, at a 64-byte aligned offset) that one or more values
  occupy one after another: a value computed in place of an operand that dies at its op joins
  the operand's buffer. A buffer's live range runs from its first value's definition to its
  last value's last point (liveness.py).
- *Arena*: the bytes the buffers are placed in; its size is the plan's peak.

How values are put into buffers, in program order:
1. In place: an op whose spec names an operand it may overwrite (`OpSpec.inplace`; for a
   commutative op the other operand too, since it may swap them) takes that operand's buffer
   when the operand dies at the op, has the result's size, and is neither a function argument,
   a sequence step, nor pinned. An elementwise chain runs in one buffer.
2. Carries (`scan`): a carry's body argument is the carry's buffer, live for the whole body:
   it holds the carry from step to step, and the body reuses its buffers every step. It takes
   the initial value's buffer when that dies at the scan (else the initial value is copied in).
   The yielded value takes the carry's buffer when it is computed in place of the carry's body
   argument (a carry update `acc + x`), or when the argument is dead by then; otherwise the
   yield copies it in. The final carry (the scan's result) stays in the carry's buffer.
   Stacked outputs get their own buffers, live from the scan on; the yield copies each step's
   value into its row.
3. Otherwise a new buffer. A pinned value (`MemoryPlanner.pin`: buffers that must not move,
   like packed weights) gets a buffer of its own, reserved for the whole function.

Where buffers go (`strategy`):
- "size": largest buffer first (ties: the earlier first), each into the best-fitting free gap
  at least as large among the buffers already placed that are live at the same time,
  splitting the gap; when none fits, above them. A static planner knows every lifetime up
  front, so it can keep the big blocks contiguous (greedy by size, as in Pisarchyk and Lee,
  "Efficient memory management for deep neural net inference", 2020). When that misses the
  lower bound, it places again in their "greedy by breadth" order (the buffers live at the
  busiest point first, largest first among equals) and keeps the smaller arena; the plan's
  strategy then reads "breadth". Its cost is the number of (buffer, buffer live at the same
  time) pairs: quadratic when thousands of values are live at once, as in a long training step.
- "program": an online allocator in program order: a dead buffer's block goes back to a free
  list (merged with free neighbours); a new buffer takes the best-fitting free block at least
  as large, splitting the remainder, else grows the arena. What a runtime allocator can do,
  O(n log n); it may split a big free block that a later big buffer needed.
- "auto" (the default): "size" when there are at most SIZE_BUDGET pairs of buffers live at a
  common point per buffer on average (counted in O(n)), else "program". The plan's
  `strategy` says which one placed it.

The report: peak arena bytes; the naive total (every planned value its own buffer); the lower
bound, the most bytes of buffers live at one point (no placement of these buffers does
better); in-place reuses; block reuses (a buffer placed, at least partly, where a dead one
was: "reused block of %y", %y being the value that freed it most recently); carry shares.

The runtime contract the backends follow: at a scan, copy each initial carry into its carry's
buffer unless it is already there; every step, run the body; at the yield, first copy stacked
values into their rows, then each yielded carry not already in its carry's buffer into it (a
parallel copy: a carry's body argument yielded as another carry goes through a temporary).

Known gaps: static shapes only (a `?` dimension: the plan says so, the JIT plans after
specialising); one arena per function (calls are not planned across); pre-SSA IR (`var`,
`for`) is not planned; a value is never computed in place through a view, and a `fused` op's
results never overwrite its inputs (its spec declares no in-place operand).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import UNKNOWN, GirError, GirPassError, Location
from ..ir.core import BlockArgument, Function, Module, Operation, OpResult, Value
from ..ir.ops import REGISTRY
from ..ir.types import DTYPES, TensorType
from .base import Pass
from .liveness import (
    Liveness,
    is_loop,
    loop_carry_args,
    loop_carry_results,
    loop_inits,
    loop_sequence_args,
    loop_sequences,
    loop_stack_results,
    value_names,
    yielded_carries,
)
from .rewriter import PassStatistics

ALIGN = 64
"""Every buffer starts at a multiple of this many bytes and its size is rounded up to one."""

STRATEGIES = ("auto", "size", "program")

SIZE_BUDGET = 64
"""auto places by size while there are at most this many pairs of buffers live at a common
point per buffer (on average), else in program order."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class PlanError(GirPassError):
    """A memory plan breaks its own rules (found by check_plan): a bug in the planner."""


# Why a value is where it is: the `kind` of a Slot.
NEW = "new"
REUSED = "reused"
IN_PLACE = "in-place"
CARRY = "carry"
PINNED = "pinned"


@dataclass(eq=False, slots=True)
class Buffer:
    values: list[Value]
    """The values that occupy it, in program order."""
    size: int
    """Bytes, a multiple of ALIGN."""
    first: int = 0
    last: int = 0
    pinned: bool = False
    offset: int = -1
    previous: Buffer | None = None
    """The dead buffer whose block this one reuses (most recently freed), None for new memory."""
    _stamp: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(eq=False, slots=True)
class Slot:
    """Where one planned value lives."""

    value: Value
    buffer: Buffer
    nbytes: int
    kind: str
    """new | reused | in-place | carry | pinned."""
    source: Value | None = None
    """The value whose buffer it takes (in-place, carry)."""

    @property
    def offset(self) -> int:
        return self.buffer.offset


@dataclass(eq=False)
class MemoryPlan:
    """The plan of one function; `unsupported` says why there is none."""

    function: Function
    liveness: Liveness
    strategy: str = "auto"
    """The placement that made it: size or program (auto resolves to one of them)."""
    slots: dict[Value, Slot] = field(default_factory=dict)
    """Planned values in program order."""
    buffers: list[Buffer] = field(default_factory=list)
    views: dict[Value, Value] = field(default_factory=dict)
    """A view -> the value whose memory it reads (a sequence's body argument -> the sequence)."""
    registers: set[Value] = field(default_factory=set)
    """Values inside `fused` ops: no memory."""
    held_until: dict[Value, int] = field(default_factory=dict)
    """A value -> the last point its memory is needed: its own last point, or later when a
    view of it is live longer."""
    unsupported: str | None = None
    arena_bytes: int = 0
    naive_bytes: int = 0
    lower_bound: int = 0
    pinned: list[Value] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.unsupported is None

    def offset(self, value: Value) -> int:
        return self.slots[value].offset

    def size(self, value: Value) -> int:
        return self.slots[value].buffer.size

    def base(self, value: Value) -> Value:
        """The value whose memory value is or reads (itself unless a view)."""
        while value in self.views:
            value = self.views[value]
        return value

    def count(self, kind: str) -> int:
        return sum(1 for s in self.slots.values() if s.kind == kind)

    @property
    def in_place_reuses(self) -> int:
        return self.count(IN_PLACE)

    @property
    def block_reuses(self) -> int:
        return self.count(REUSED)

    @property
    def carry_shares(self) -> int:
        return self.count(CARRY)

    def counters(self) -> dict[str, int]:
        """The numbers --timing and --stats-json show."""
        return {"arena bytes": self.arena_bytes, "naive bytes": self.naive_bytes,
                "lower bound bytes": self.lower_bound, "in-place reuses": self.in_place_reuses,
                "block reuses": self.block_reuses, "carry shares": self.carry_shares}

    def summary(self) -> str:
        name = f"@{self.function.name}"
        if not self.supported:
            return f"memory plan of {name}: not planned: {self.unsupported}"
        ratio = self.arena_bytes / self.lower_bound if self.lower_bound else 1.0
        saved = 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0
        return (f"memory plan of {name} ({self.strategy}): arena {self.arena_bytes} bytes, {ratio:.3f}x the "
                f"lower bound {self.lower_bound}; naive {self.naive_bytes} ({saved:.0%} saved); "
                f"{self.in_place_reuses} in place, {self.block_reuses} reused blocks, "
                f"{self.carry_shares} carry shares")

    def reason(self, value: Value, names: dict[Value, str]) -> str:
        if value in self.views:
            return f"view of {names[self.views[value]]}"
        slot = self.slots[value]
        if slot.kind == IN_PLACE:
            return f"in place of {names[slot.source]}"  # type: ignore[index]
        if slot.kind == CARRY:
            return f"carry buffer of {names[slot.source]}"  # type: ignore[index]
        if slot.kind == REUSED:
            previous = slot.buffer.previous
            assert previous is not None
            return f"reused block of {names[previous.values[-1]]}"
        return slot.kind

    def report(self, names: dict[Value, str] | None = None) -> str:
        """The summary line, then one row per planned value and per view (not the steps of
        sequences) in program order: value, source line, bytes, live range (to the last point
        its memory is needed, through views too), offset, reason."""
        lines = [self.summary()]
        if not self.supported:
            return lines[0] + "\n"
        names = names if names is not None else value_names(self.function)
        rows = [("value", "line", "bytes", "live", "offset", "reason")]
        for v in self.liveness.values():
            if v not in self.slots and not (v in self.views and isinstance(v, OpResult)):
                continue
            first, last = self.liveness.range(v)
            last = max(last, self.held_until.get(v, last))
            line = _loc_of(v).line
            slot = self.slots.get(v)
            nbytes = slot.nbytes if slot is not None else _nbytes(v.tensor_type)
            rows.append((names[v], str(line) if line else "-", str(nbytes), f"[{first}, {last}]",
                         str(slot.offset) if slot is not None else "-", self.reason(v, names)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3].ljust(widths[3]),
                     r[4].rjust(widths[4]), r[5]]
            lines.append("  " + "  ".join(cells).rstrip())
        return "\n".join(lines) + "\n"


def _loc_of(v: Value) -> Location:
    if isinstance(v, OpResult):
        return v.op.loc
    assert isinstance(v, BlockArgument)
    owner = v.block.parent_op
    if owner is not None:
        return owner.loc
    f = v.block.parent.parent if v.block.parent is not None else None  # type: ignore[union-attr]
    return getattr(f, "loc", UNKNOWN)


_ITEMSIZE = {name: dt.itemsize for name, dt in DTYPES.items()}


def _nbytes(t: TensorType) -> int:
    """Bytes of a static tensor type."""
    return math.prod(t.shape) * _ITEMSIZE[t.dtype]  # type: ignore[arg-type]


def view_source(op: Operation) -> Value | None:
    """The operand whose memory op's result reads where it is (so the result needs no buffer),
    or None. Backends make exactly these views: `reshape` and `transfer` (the same bytes),
    `index` (a row), a contiguous `slice` (every axis after the first cut one whole, steps 1),
    a 2-D `transpose` read only by matmuls (the GEMM reads its operand transposed)."""
    name = op.name
    if name in ("reshape", "transfer", "index"):
        return op.operands[0]
    if name == "slice":
        src, out = op.operands[0].tensor_type.shape, op.result.tensor_type.shape
        steps = op.attrs["steps"] or [1] * len(src)
        cut = next((i for i, (o, d) in enumerate(zip(out, src)) if o != d), len(src))
        contiguous = (all(st == 1 for st in steps) and all(o == 1 for o in out[:cut])
                      and all(o == d for o, d in zip(out[cut + 1:], src[cut + 1:])))
        return op.operands[0] if contiguous else None
    if name == "transpose":
        r = op.result
        if r.uses and r.tensor_type.rank == 2 and all(u.name == "matmul" for u, _ in r.uses):
            return op.operands[0]
    return None


class MemoryPlanner:
    """Builds the MemoryPlan of one function: `MemoryPlanner(f).pin(v).run()`."""

    def __init__(self, function: Function, liveness: Liveness | None = None, strategy: str = "auto"):
        if strategy not in STRATEGIES:
            raise GirPassError(f"memory plan strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        self.function = function
        self.liveness = liveness if liveness is not None else Liveness(function)
        self.strategy = strategy
        self._pinned: dict[Value, None] = {}

    def pin(self, value: Value) -> MemoryPlanner:
        """Gives value a buffer that nothing else uses during the whole function."""
        if isinstance(value, BlockArgument) and value.block.parent_op is None:
            raise GirError("cannot pin a function argument: it lives in the caller's memory", self.function.loc)
        owner = value.op if isinstance(value, OpResult) else value.block.parent_op  # type: ignore[attr-defined]
        if isinstance(value, BlockArgument) and value not in loop_carry_args(owner):
            raise GirError(f"cannot pin a body argument of '{owner.name}': it is a view of an operand", owner.loc)
        if isinstance(value, OpResult) and view_source(owner) is not None:
            raise GirError(f"cannot pin the result of '{owner.name}': it is a view of its operand", owner.loc)
        region_op = owner.parent_op
        if isinstance(value, OpResult) and region_op is not None and not is_loop(region_op):
            raise GirError(f"cannot pin a value inside '{region_op.name}': it lives in registers", owner.loc)
        self._pinned[value] = None
        return self

    def run(self) -> MemoryPlan:
        live = self.liveness
        plan = MemoryPlan(self.function, live, self.strategy, pinned=list(self._pinned))
        self.plan = plan
        plan.unsupported = _unsupported(live)
        if plan.unsupported is not None:
            return plan
        plan.views, plan.registers = find_views(live)
        plan.held_until = self.held = held_until(live, plan.views)
        self.children: dict[Value, list[Value]] = {}
        for view, source in plan.views.items():
            self.children.setdefault(source, []).append(view)
        self.carry_of: dict[Value, BlockArgument] = {}
        """A value yielded as a carry by its own block's scan -> that carry's body argument."""
        self.carry_args: set[Value] = set()
        self._form()
        first, held = live.first, self.held
        last_point = max(live.num_points - 1, 0)
        for b in plan.buffers:
            b.first = first[b.values[0]]
            b.last = max(held[v] for v in b.values) if len(b.values) > 1 else held[b.values[0]]
            if b.pinned:
                b.first, b.last = 0, last_point
        placed = [b for b in plan.buffers if b.size > 0]
        by_size = self.strategy == "size" or (
            self.strategy == "auto" and _overlapping_pairs(placed, live.num_points) <= SIZE_BUDGET * len(placed))
        n = live.num_points
        if by_size:
            plan.strategy = "size"
            _place_by_size(placed, n, lambda b: (-b.size, b.first, -b.last))
            arena = max((b.end for b in placed), default=0)
            if arena > _lower_bound(placed, n):  # try the buffers of the busiest points first
                by_size_offsets = [b.offset for b in placed]
                peak = _busiest(placed, n)
                _place_by_size(placed, n, lambda b: (-peak[b], -b.size, b.first))
                if max((b.end for b in placed), default=0) < arena:
                    plan.strategy = "breadth"
                else:
                    for b, offset in zip(placed, by_size_offsets):
                        b.offset = offset
        else:
            plan.strategy = "program"
            _place_in_program_order(placed)
        for b in plan.buffers:
            if b.size == 0:
                b.offset = 0
        _find_previous(placed)
        slots = plan.slots
        for b in placed:
            head = slots[b.values[0]]
            if head.kind == NEW and b.previous is not None:
                head.kind = REUSED
        plan.arena_bytes = max((b.end for b in placed), default=0)
        plan.naive_bytes = sum(aligned(s.nbytes) for s in slots.values())
        plan.lower_bound = _lower_bound(placed, live.num_points)
        return plan

    # -- putting values into buffers --------------------------------------------------------
    def _new(self, value: Value, nbytes: int | None = None) -> None:
        nbytes = _nbytes(value.type) if nbytes is None else nbytes  # type: ignore[arg-type]
        pinned = value in self._pinned
        buf = Buffer([value], aligned(nbytes), pinned=pinned)
        self.plan.buffers.append(buf)
        self.plan.slots[value] = Slot(value, buf, nbytes, PINNED if pinned else NEW)

    def _join(self, value: Value, source: Value, kind: str, nbytes: int | None = None) -> None:
        buf = self.plan.slots[source].buffer
        buf.values.append(value)
        nbytes = _nbytes(value.type) if nbytes is None else nbytes  # type: ignore[arg-type]
        self.plan.slots[value] = Slot(value, buf, nbytes, kind, source)

    def _free_tail(self, value: Value, nbytes: int) -> bool:
        """value is planned, the latest value of a buffer that is not pinned, of nbytes bytes."""
        slot = self.plan.slots.get(value)
        return (slot is not None and slot.nbytes == nbytes and slot.buffer.values[-1] is value
                and not slot.buffer.pinned)

    def _form(self) -> None:
        """Puts every value that needs memory into a buffer: one pass over the points."""
        live = self.liveness
        views, registers = self.plan.views, self.plan.registers
        ending: list[tuple[int, Operation]] = []  # scans whose body is being walked: (end, scan)
        for point, op in enumerate(live.points):
            results = op.results
            if op.name == "scan":
                self._scan_starts(op, point)
                ending.append((live.end_of[op], op))
            elif op.regions:  # fused: results in memory, the body in registers
                for r in results:
                    self._new(r)
            elif len(results) == 1:
                r = results[0]
                if r not in views and r not in registers:
                    self._op(op, r, point)
            else:
                for r in results:
                    self._new(r)
            while ending and ending[-1][0] == point:
                self._scan_ends(ending.pop()[1])

    def _op(self, op: Operation, r: Value, point: int) -> None:
        """r, op's only result: in place of a dying operand, in its carry's buffer, or new."""
        nbytes = _nbytes(r.type)  # type: ignore[arg-type]
        if r in self._pinned:
            self._new(r, nbytes)
            return
        candidates = _inplace_operands(op)
        carry_arg = self.carry_of.get(r)
        if carry_arg is not None and self._free_tail(carry_arg, nbytes):
            dead_at = max(self.liveness.last_use(carry_arg), self._views_held(carry_arg))
            if dead_at < point:
                self._join(r, carry_arg, CARRY, nbytes)
                return
            if dead_at == point and carry_arg in candidates and self._sole_reader(op, carry_arg):
                self._join(r, carry_arg, IN_PLACE, nbytes)
                return
        held = self.held
        for x in candidates:
            if (held[x] == point and self._free_tail(x, nbytes) and _same_elements(x, r)
                    and x not in self.carry_args and self._sole_reader(op, x)):
                self._join(r, x, IN_PLACE, nbytes)
                return
        self._new(r, nbytes)

    def _views_held(self, value: Value) -> int:
        """The last point a view of value is needed (-1 if it has none)."""
        return max((self.held[w] for w in self.children.get(value, ())), default=-1)

    def _sole_reader(self, op: Operation, x: Value) -> bool:
        """No other operand of op reads x's memory through a view (it would read clobbered
        elements once op starts writing)."""
        views = self.plan.views
        return all(v is x or self.plan.base(v) is not x for v in op.operands if v in views)

    def _scan_starts(self, scan: Operation, point: int) -> None:
        """The carries' buffers (in place of initial values that die here) and the stacks."""
        args = loop_carry_args(scan)
        self.carry_args.update(args)
        for arg, init in zip(args, loop_inits(scan)):
            nbytes = _nbytes(arg.type)  # type: ignore[arg-type]
            if arg not in self._pinned and self.held[init] == point and self._free_tail(init, nbytes):
                self._join(arg, init, IN_PLACE)
            else:
                self._new(arg)
        for r in loop_stack_results(scan):
            self._new(r)
        for y, arg in zip(yielded_carries(scan), args):
            self.carry_of.setdefault(y, arg)

    def _scan_ends(self, scan: Operation) -> None:
        """The final carries stay in the carries' buffers."""
        for r, arg in zip(loop_carry_results(scan), loop_carry_args(scan)):
            buf = self.plan.slots[arg].buffer
            if r in self._pinned or buf.pinned:
                self._new(r)
            else:
                self._join(r, arg, CARRY)


def find_views(live: Liveness) -> tuple[dict[Value, Value], set[Value]]:
    """(views: view -> the value it reads, registers) of live's function: see the module
    docstring."""
    views: dict[Value, Value] = {}
    registers: set[Value] = set()
    for op in live.points:
        if op.regions:
            if is_loop(op):
                views.update(zip(loop_sequence_args(op), loop_sequences(op)))
            else:
                for inner in op.body.walk():
                    registers.update(inner.results)
                registers.update(op.body.args)
        elif len(op.results) == 1 and op.name in _VIEW_OPS and op.results[0] not in registers:
            source = view_source(op)
            if source is not None:
                views[op.results[0]] = source
    return views, registers


_VIEW_OPS = frozenset(("reshape", "transfer", "index", "slice", "transpose"))


def held_until(live: Liveness, views: dict[Value, Value]) -> dict[Value, int]:
    """Every value -> the last point its memory is needed: the latest of its own last point and
    those of the views that read it (through views of views)."""
    held = dict(live.last)
    first = live.first
    for v in sorted(views, key=lambda v: -first[v]):  # a view after its source: latest first
        source = views[v]
        if held[v] > held[source]:
            held[source] = held[v]
    return held


def plan_memory(function: Function, liveness: Liveness | None = None, pinned: Iterable[Value] = (),
                strategy: str = "auto") -> MemoryPlan:
    planner = MemoryPlanner(function, liveness, strategy)
    for v in pinned:
        planner.pin(v)
    return planner.run()


def _is_carry_arg(v: Value) -> bool:
    if type(v) is not BlockArgument:
        return False
    loop = v.block.parent_op
    return loop is not None and loop.name == "scan" and v in loop_carry_args(loop)


_INPLACE: dict[str, tuple[int, ...]] = {}


def _inplace_operands(op: Operation) -> list[Value]:
    """The operands op's result may overwrite: the spec's, and for a commutative binary op
    also the other one (the backend may swap the operands)."""
    indices = _INPLACE.get(op.name)
    if indices is None:
        spec = REGISTRY[op.name]
        i = spec.inplace
        indices = () if i is None else (i, 1 - i) if spec.commutative and i in (0, 1) else (i,)
        _INPLACE[op.name] = indices
    operands = op.operands
    out: list[Value] = []
    for i in indices:
        if i < len(operands) and operands[i] not in out:
            out.append(operands[i])
    return out


def _same_elements(x: Value, r: Value) -> bool:
    tx, tr = x.type, r.type
    return tx is tr or (math.prod(tx.shape) == math.prod(tr.shape)  # type: ignore[union-attr]
                        and _ITEMSIZE[tx.dtype] == _ITEMSIZE[tr.dtype])  # type: ignore[union-attr]


def _unsupported(live: Liveness) -> str | None:
    """Why the function cannot be planned statically, or None."""
    args = set(live.function.args)
    for v in live.first:
        t = v.type
        if type(t) is TensorType and (None not in t.shape or v in args):
            continue
        owner = v.op if isinstance(v, OpResult) else v.block.parent_op  # type: ignore[attr-defined]
        if owner is None:
            continue
        if owner.name in ("for", "var") or type(t) is not TensorType:
            return f"'{owner.name}' at line {owner.loc.line} is pre-SSA IR: run the ssa pass first"
        return (f"'{owner.name}' at line {owner.loc.line} makes a value of dynamic shape {t}: plans need "
                "static shapes (the JIT plans after specialising on the argument shapes)")
    for op in live.points:
        if op.name == "for" or (op.regions and op.name not in ("scan", "fused")):
            return f"'{op.name}' at line {op.loc.line} has a region the planner does not know (run ssa first)"
    return None


# -- placement ------------------------------------------------------------------------------
_CHUNK = 16
"""Points per bucket of the time index that finds the placed buffers live during a range."""


def _overlapping_pairs(buffers: list[Buffer], num_points: int) -> int:
    """How many pairs of buffers are live at a common point (each counted where the later one
    starts): what placing by size costs."""
    starting = [0] * (num_points + 1)
    ending = [0] * (num_points + 2)
    for b in buffers:
        starting[b.first] += 1
        ending[b.last + 1] += 1
    pairs = live = 0
    for point in range(num_points):
        live -= ending[point]
        n = starting[point]
        pairs += n * live + n * (n - 1) // 2
        live += n
    return pairs


def _busiest(buffers: list[Buffer], num_points: int) -> dict[Buffer, int]:
    """Each buffer -> the most bytes live at one point of its range (a sparse table of the
    bytes live at each point answers each range in O(1))."""
    delta = [0] * (num_points + 1)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    row, running = [], 0
    for d in delta[:num_points]:
        running += d
        row.append(running)
    table = [row]
    width = 1
    while 2 * width <= num_points:
        prev = table[-1]
        table.append(list(map(max, prev[: len(prev) - width], prev[width:])))
        width *= 2
    out: dict[Buffer, int] = {}
    for b in buffers:
        k = (b.last - b.first + 1).bit_length() - 1
        level = table[k]
        out[b] = max(level[b.first], level[b.last - (1 << k) + 1])
    return out


def _place_by_size(buffers: list[Buffer], num_points: int, order: Callable[[Buffer], tuple]) -> None:
    """In the given order, each buffer into the best-fitting gap among the placed buffers live
    at the same time; above them when none fits."""
    chunks: list[list[Buffer]] = [[] for _ in range(num_points // _CHUNK + 1)]
    for b in buffers:
        b._stamp = 0  # marks a buffer already looked at for the current one
    stamp = 0
    for b in sorted(buffers, key=order):
        stamp += 1
        first, last, size = b.first, b.last, b.size
        lo, hi = first // _CHUNK, last // _CHUNK
        occupied: list[tuple[int, int]] = []
        for c in range(lo, hi + 1):
            for o in chunks[c]:
                if o._stamp != stamp:
                    o._stamp = stamp
                    if o.first <= last and o.last >= first:
                        occupied.append((o.offset, o.offset + o.size))
        occupied.sort()
        best, best_gap, top = -1, 0, 0
        for start, end in occupied:
            gap = start - top
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = top, gap
            if end > top:
                top = end
        b.offset = best if best >= 0 else top
        for c in range(lo, hi + 1):
            chunks[c].append(b)


class _FreeList:
    """Free blocks of an arena that grows at its top: best fit by size, merged on release."""

    def __init__(self) -> None:
        self.by_size: list[tuple[int, int]] = []
        """(size, offset), sorted."""
        self.size_at: dict[int, int] = {}
        """offset -> size of the free block starting there."""
        self.start_of_end: dict[int, int] = {}
        """end -> offset of the free block ending there."""
        self.top = 0

    def _remove(self, offset: int) -> int:
        size = self.size_at.pop(offset)
        del self.start_of_end[offset + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, offset)))
        return size

    def _add(self, offset: int, size: int) -> None:
        if offset + size == self.top:  # the block under the top: give it back to the top
            self.top = offset
            return
        self.size_at[offset] = size
        self.start_of_end[offset + size] = offset
        bisect.insort(self.by_size, (size, offset))

    def allocate(self, size: int) -> int:
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i < len(self.by_size):
            block_size, offset = self.by_size[i]
            self._remove(offset)
            if block_size > size:
                self._add(offset + size, block_size - size)
            return offset
        offset = self.top
        self.top += size
        return offset

    def release(self, offset: int, size: int) -> None:
        end = offset + size
        before = self.start_of_end.get(offset)
        if before is not None:
            size += self._remove(before)
            offset = before
        if end in self.size_at:
            size += self._remove(end)
        self._add(offset, size)


def _place_in_program_order(buffers: list[Buffer]) -> None:
    free = _FreeList()
    ending: list[tuple[int, int, Buffer]] = []
    for i, b in enumerate(sorted(buffers, key=lambda b: (b.first, -b.size, b.last))):
        while ending and ending[0][0] < b.first:
            _, _, dead = heapq.heappop(ending)
            free.release(dead.offset, dead.size)
        b.offset = free.allocate(b.size)
        heapq.heappush(ending, (b.last, i, b))


def _find_previous(buffers: list[Buffer]) -> None:
    """Sets each buffer's `previous`: of the buffers placed before it in time over any of its
    bytes, the one that died last. A sweep in time order over a map of the arena's bytes ->
    the buffer that used them last (non-overlapping segments sorted by offset)."""
    starts: list[int] = []
    ends: list[int] = []
    owners: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (b.first, b.offset)):
        lo, hi = b.offset, b.end
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or ends[i] <= lo:
            i += 1
        j = i
        previous: Buffer | None = None
        while j < len(starts) and starts[j] < hi:
            o = owners[j]
            if previous is None or o.last > previous.last:
                previous = o
            j += 1
        b.previous = previous
        new_starts, new_ends, new_owners = [lo], [hi], [b]
        if i < j and starts[i] < lo:
            new_starts.insert(0, starts[i])
            new_ends.insert(0, lo)
            new_owners.insert(0, owners[i])
        if i < j and ends[j - 1] > hi:
            new_starts.append(hi)
            new_ends.append(ends[j - 1])
            new_owners.append(owners[j - 1])
        starts[i:j], ends[i:j], owners[i:j] = new_starts, new_ends, new_owners


def _lower_bound(buffers: list[Buffer], num_points: int) -> int:
    delta = [0] * (num_points + 2)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    best = running = 0
    for d in delta:
        running += d
        if running > best:
            best = running
    return best


# -- the checker ----------------------------------------------------------------------------
def check_plan(plan: MemoryPlan) -> None:
    """Raises PlanError unless: every value that needs memory (not an argument, view or
    register) has a buffer at an aligned offset inside the arena; values share a buffer only
    one after another (the earlier one's memory no longer needed when the later one is
    written, or handed over at an op allowed to overwrite it); and no two buffers needed at one
    point overlap in the arena. Lifetimes come from the liveness and the views are found
    again here, not taken from the planner. O(n log n)."""
    if not plan.supported:
        return
    live = plan.liveness
    f = plan.function
    views, registers = find_views(live)
    if views != plan.views:
        raise PlanError(f"@{f.name}: the plan's views are not the ones the IR has")
    held = held_until(live, views)
    children: dict[Value, list[Value]] = {}
    for view, source in views.items():
        children.setdefault(source, []).append(view)
    args = set(f.args)
    for v in plan.slots:
        if v in views or v in registers or v in args:
            raise PlanError(f"@{f.name}: '{v.name_hint or '?'}' is in the arena but needs no memory of its own")
    missing = [v for v in _planned_values(live) if v not in views and v not in registers and v not in plan.slots]
    if missing:
        raise PlanError(f"@{f.name}: {len(missing)} value(s) have no buffer, the first at line "
                        f"{_loc_of(missing[0]).line}")
    spans: list[tuple[int, int, Buffer]] = []
    last_point = max(live.num_points - 1, 0)
    for b in {id(s.buffer): s.buffer for s in plan.slots.values()}.values():
        if any(plan.slots[v].buffer is not b for v in b.values):
            raise PlanError(f"@{f.name}: a value is listed in two buffers")
        if any(plan.slots[v].nbytes > b.size for v in b.values):
            raise PlanError(f"@{f.name}: a buffer of {b.size} bytes is too small for one of its values")
        if b.pinned and len(b.values) != 1:
            raise PlanError(f"@{f.name}: a pinned buffer is shared")
        if b.size == 0:
            continue
        if b.offset < 0 or b.offset % ALIGN or b.size % ALIGN or b.end > plan.arena_bytes:
            raise PlanError(f"@{f.name}: a buffer at {b.offset} of {b.size} bytes is misaligned or outside "
                            f"the arena of {plan.arena_bytes} bytes")
        if len(b.values) > 1:
            ordered = sorted(b.values, key=lambda v: live.first[v])
            for a, c in zip(ordered, ordered[1:]):
                _check_handover(plan, children, held, a, c)
        first = min(live.first[v] for v in b.values)
        last = max(held[v] for v in b.values)
        if b.pinned:
            first, last = 0, last_point
        spans.append((first, last, b))
    # Sweep in time; the buffers live now are disjoint in the arena (checked as they come), so
    # a new one can only collide with its neighbours in offset order.
    spans.sort(key=lambda s: s[0])
    ending: list[tuple[int, int, Buffer]] = []
    by_offset: list[tuple[int, int, int]] = []  # (offset, end, index into spans)
    for index, (first, last, b) in enumerate(spans):
        while ending and ending[0][0] < first:
            _, i, o = heapq.heappop(ending)
            by_offset.pop(bisect.bisect_left(by_offset, (o.offset, o.end, i)))
        k = bisect.bisect_left(by_offset, (b.offset, b.end, index))
        for j in (k - 1, k):
            if 0 <= j < len(by_offset):
                o = spans[by_offset[j][2]][2]
                if o.offset < b.end and b.offset < o.end:
                    raise PlanError(f"@{f.name}: buffers of {_describe(o)} and {_describe(b)} are live at once "
                                    f"and overlap in the arena ([{o.offset}, {o.end}) and [{b.offset}, {b.end}))")
        by_offset.insert(k, (b.offset, b.end, index))
        heapq.heappush(ending, (last, index, b))


def _describe(b: Buffer) -> str:
    v = b.values[0]
    return f"'{v.name_hint or '?'}' (line {_loc_of(v).line})"


def _check_handover(plan: MemoryPlan, children: dict[Value, list[Value]], held: dict[Value, int], a: Value,
                    c: Value) -> None:
    """a and then c occupy one buffer: a's memory must not be needed once c is written."""
    live = plan.liveness
    at = live.first[c]
    dead = held[a]
    carry = _carry_pair(a, c)
    if carry:  # c is the carry a's buffer holds next: a counts as dead after its last read
        dead = max([live.last_use(a)] + [held[w] for w in children.get(a, ())])
    if dead < at:
        return
    if dead == at and (carry or _init_to_carry(a, c) or (_allowed_inplace(a, c) and _no_view_of(a, c, plan.views))):
        return
    raise PlanError(f"@{plan.function.name}: '{c.name_hint or '?'}' (line {_loc_of(c).line}) is written into the "
                    f"buffer of '{a.name_hint or '?'}' (line {_loc_of(a).line}) while that is still needed")


def _no_view_of(a: Value, c: Value, views: dict[Value, Value]) -> bool:
    """c's op reads a only directly, not also through a view."""
    for v in c.op.operands:  # type: ignore[attr-defined]
        while v in views:
            v = views[v]
            if v is a:
                return False
    return True


def _carry_pair(a: Value, c: Value) -> bool:
    """a is a carry's body argument and c the value yielded for that carry, or c is the
    carry's final value and a its argument or yielded value."""
    if _is_carry_arg(a):
        loop = a.block.parent_op  # type: ignore[attr-defined]
        i = loop_carry_args(loop).index(a)
        return yielded_carries(loop)[i] is c or loop_carry_results(loop)[i] is c
    if isinstance(c, OpResult) and c in loop_carry_results(c.op):
        i = loop_carry_results(c.op).index(c)
        return yielded_carries(c.op)[i] is a
    return False


def _allowed_inplace(a: Value, c: Value) -> bool:
    return isinstance(c, OpResult) and not c.op.regions and a in _inplace_operands(c.op)


def _init_to_carry(a: Value, c: Value) -> bool:
    if not _is_carry_arg(c):
        return False
    loop = c.block.parent_op  # type: ignore[attr-defined]
    return loop_inits(loop)[loop_carry_args(loop).index(c)] is a


def _planned_values(live: Liveness) -> list[Value]:
    out: list[Value] = []
    for op in live.points:
        if op.regions:
            out.extend(loop_carry_args(op))
        out.extend(op.results)
    return out


# -- drawing --------------------------------------------------------------------------------
_COLORS = {NEW: "#4878d0", REUSED: "#6acc64", IN_PLACE: "#ee854a", CARRY: "#d65f5f", PINNED: "#956cb4"}


def plot_plans(plans: list[MemoryPlan], path: str) -> None:
    """Draws each plan's buffers as boxes: program points across, arena offsets up; colour by
    how the buffer's first value got it. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        raise GirError("--memplan-plot needs matplotlib: pip install 'gir[plot]' (or pip install matplotlib)") \
            from None
    plans = [p for p in plans if p.supported and p.buffers]
    if not plans:
        raise GirError("no function has a memory plan to draw (dynamic shapes or no values)")
    fig, axes = plt.subplots(len(plans), 1, figsize=(11, 3.8 * len(plans)), squeeze=False)
    for ax, plan in zip(axes[:, 0], plans):
        names = value_names(plan.function)
        live = plan.liveness
        scale, unit = (1024 * 1024, "MiB") if plan.arena_bytes >= 1024 * 1024 else (1024, "KiB")
        for op, end in live.end_of.items():
            if op.name == "scan":
                ax.axvspan(live.point(op) - 0.5, end + 0.5, color="gray", alpha=0.08, linewidth=0)
        for v, slot in plan.slots.items():
            if slot.buffer.size == 0:
                continue
            first, held = live.first[v], plan.held_until[v]
            if slot.buffer.pinned:
                first, held = 0, max(live.num_points - 1, 0)
            ax.add_patch(Rectangle((first - 0.5, slot.offset / scale), held - first + 1, slot.buffer.size / scale,
                                   facecolor=_COLORS[slot.kind], edgecolor="black", linewidth=0.3, alpha=0.85))
            if slot.buffer.size >= 0.15 * plan.arena_bytes and slot.buffer.values[0] is v:
                ax.text(first - 0.3, (slot.offset + slot.buffer.size / 2) / scale, names[v], fontsize=7,
                        va="center")
        ax.axhline(plan.lower_bound / scale, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xlim(-1, live.num_points)
        ax.set_ylim(0, max(plan.arena_bytes, 1) / scale * 1.08)
        ax.set_xlabel("program point (shaded: scan bodies)")
        ax.set_ylabel(f"arena offset ({unit})")
        ax.set_title(f"@{plan.function.name}: arena {plan.arena_bytes / scale:.2f} {unit}, lower bound "
                     f"{plan.lower_bound / scale:.2f} {unit} (dashed), naive {plan.naive_bytes / scale:.2f} {unit}",
                     fontsize=10)
    handles = [Patch(color=c, label=k) for k, c in _COLORS.items()]
    axes[0, 0].legend(handles=handles, loc="lower right", fontsize=7, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plan_module(module: Module, strategy: str = "auto") -> list[MemoryPlan]:
    return [plan_memory(f, strategy=strategy) for f in module.functions.values()]


# -- the pass -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemplanOptions:
    strategy: str = "auto"
    """auto, size (largest first, best-fitting gap) or program (online best fit in program order)."""
    check: bool = True
    """Run check_plan on every plan (a failure is a planner bug)."""


class Memplan(Pass):
    """`memplan`: plans the memory of every function and records, per function, the arena's
    peak bytes, the naive total, the lower bound, in-place reuses, block reuses and carry
    shares as counters (shown by --timing and --stats-json). The IR is unchanged; the backends
    compute the same plan with plan_memory. `gir opt --memplan-report` prints the per-value
    table and `--memplan-plot FILE.png` draws it.

        %1 = exp %x          ->  %1 at offset 0 (new)
        %2 = neg %1          ->  %2 at offset 0 (in place of %1)
        %3 = add %2, %x      ->  %3 at offset 0 (in place of %2)
    """

    name = "memplan"
    Options = MemplanOptions

    def run(self, module: Module, stats: PassStatistics) -> bool:
        o: MemplanOptions = self.options
        if o.strategy not in STRATEGIES:
            raise GirPassError(f"memplan: strategy must be one of {', '.join(STRATEGIES)}, not {o.strategy!r}")
        for f in module.functions.values():
            plan = plan_memory(f, strategy=o.strategy)
            if not plan.supported:
                stats.notes.append(f"@{f.name}: not planned: {plan.unsupported}")
                continue
            if o.check:
                check_plan(plan)
            for key, n in plan.counters().items():
                stats.count(f"@{f.name}: {key}", n)
            if plan.lower_bound:
                stats.notes.append(f"@{f.name}: arena {plan.arena_bytes / plan.lower_bound:.3f}x the lower bound, "
                                   f"{plan.arena_bytes / max(plan.naive_bytes, 1):.3f}x naive")
        return False
