"""The planner: which values need memory, and how they are put into buffers.

Values go into buffers in program order:
1. In place: an op whose spec names an operand it may overwrite (`OpSpec.inplace`; for a
   commutative op the other operand too, since it may swap them) takes that operand's buffer
   when the operand dies at the op, has the result's size, and is neither a function argument,
   a sequence step, a carry's body argument nor pinned, and no other operand of the op reads it
   through a view. An elementwise chain runs in one buffer.
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
Then arena.py places the buffers.

A value's memory is *held until* the latest of its own last point and those of the views that
read it (`held_until`).

Views are the op registry's (`view_source`) and, with `views=STRIDED` (the GPU backend's plan),
the strided views of aliases.py: a slice left as a strided view of a kernel or GEMM result is a
view like any other (no slot, its source held until its last reader), and a join of arguments
that is their home is outside the arena, like the arguments (`MemoryPlan.external`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import GirError, GirPassError
from ...ir.core import BlockArgument, Function, Operation, Value
from ...ir.loops import Carry, LoopView, as_loop
from ...ir.ops import REGISTRY
from ...ir.spec import view_source
from ...ir.types import TensorType
from ..liveness import Liveness
from .aliases import OPS, Aliases, ViewRules, find_aliases
from .arena import STRATEGIES, lower_bound, place_buffers
from .loop_buffers import outside_bytes
from .plan import CARRY, IN_PLACE, ITEMSIZE, NEW, PINNED, REUSED, Buffer, MemoryPlan, Slot, aligned, nbytes_of


def plan_memory(function: Function, liveness: Liveness | None = None, pinned: Iterable[Value] = (),
                strategy: str = "auto", views: ViewRules = OPS) -> MemoryPlan:
    """The plan of function; views: which strided views the backend makes (aliases.py)."""
    planner = MemoryPlanner(function, liveness, strategy, views)
    for v in pinned:
        planner.pin(v)
    return planner.run()


class MemoryPlanner:
    """Builds the MemoryPlan of one function: `MemoryPlanner(f).pin(v).run()`."""

    def __init__(self, function: Function, liveness: Liveness | None = None, strategy: str = "auto",
                 views: ViewRules = OPS):
        if strategy not in STRATEGIES:
            raise GirPassError(f"memory plan strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        self.function = function
        self.liveness = liveness if liveness is not None else Liveness(function)
        self.strategy = strategy
        self.view_rules = views
        self.aliases = find_aliases(function, views)
        """The strided views of function under views (aliases.py)."""
        self._pinned: dict[Value, None] = {}
        self.plan = MemoryPlan(function, self.liveness, strategy, view_rules=views)
        self.held: dict[Value, int] = {}
        self.children: dict[Value, list[Value]] = {}
        """A value -> the views that read it directly."""
        self.carry_of: dict[Value, BlockArgument] = {}
        """A value yielded as a carry by its own block's scan -> that carry's body argument."""
        self.carry_args: set[Value] = set()

    def pin(self, value: Value) -> MemoryPlanner:
        """Gives value a buffer that nothing else uses during the whole function."""
        owner = value.defining_op
        if owner is None:  # a block argument
            region_op = owner_op(value)
            if region_op is None:
                raise GirError("cannot pin a function argument: it lives in the caller's memory", self.function.loc)
            if carry_of_arg(value) is None:
                raise GirError(f"cannot pin a body argument of '{region_op.name}': it is a view of an operand",
                               region_op.loc)
        else:
            if view_source(owner) is not None or value in self.aliases.views:
                raise GirError(f"cannot pin the result of '{owner.name}': it is a view of its operand", owner.loc)
            if value in self.aliases.external:
                raise GirError(f"cannot pin the result of '{owner.name}': it is its arguments' home, outside "
                               "the arena", owner.loc)
            region_op = owner.parent_op
            if region_op is not None and not region_op.spec.loop:
                raise GirError(f"cannot pin a value inside '{region_op.name}': it lives in registers", owner.loc)
        self._pinned[value] = None
        return self

    def run(self) -> MemoryPlan:
        live = self.liveness
        plan = self.plan = MemoryPlan(self.function, live, self.strategy, pinned=list(self._pinned),
                                      view_rules=self.view_rules, external=self.aliases.external,
                                      why_external=self.aliases.why_external)
        plan.unsupported = unsupported_reason(live)
        if plan.unsupported is not None:
            return plan
        plan.views, plan.registers = find_views(live, self.aliases)
        plan.held_until = self.held = held_until(live, plan.views)
        self.children, self.carry_of, self.carry_args = {}, {}, set()
        for view, source in plan.views.items():
            self.children.setdefault(source, []).append(view)
        self._form()
        self._set_live_ranges()
        placed = [b for b in plan.buffers if b.size > 0]
        plan.strategy = place_buffers(placed, live.num_points, self.strategy)
        for b in plan.buffers:
            if b.size == 0:  # nothing to place; any offset inside the arena will do
                b.offset = 0
        for b in placed:
            head = plan.slots[b.values[0]]
            if head.kind == NEW and b.previous is not None:
                head.kind = REUSED
        plan.arena_bytes = max((b.end for b in placed), default=0)
        plan.naive_bytes = sum(aligned(s.nbytes) for s in plan.slots.values())
        plan.lower_bound = lower_bound(placed, live.num_points)
        plan.outside_bytes = outside_bytes(self.function) if self.view_rules.loop_buffers else 0
        return plan

    def _set_live_ranges(self) -> None:
        """Each buffer's [first, last]: its first value's definition to the last point any of
        its values' memory is needed; a pinned buffer the whole function."""
        first, held = self.liveness.first, self.held
        last_point = max(self.liveness.num_points - 1, 0)
        for b in self.plan.buffers:
            b.first = first[b.values[0]]
            b.last = max(held[v] for v in b.values) if len(b.values) > 1 else held[b.values[0]]
            if b.pinned:
                b.first, b.last = 0, last_point

    # -- putting values into buffers --------------------------------------------------------
    def _new(self, value: Value, nbytes: int | None = None) -> None:
        nbytes = nbytes_of(value.type) if nbytes is None else nbytes  # type: ignore[arg-type]
        pinned = value in self._pinned
        buf = Buffer([value], aligned(nbytes), pinned=pinned)
        self.plan.buffers.append(buf)
        self.plan.slots[value] = Slot(value, buf, nbytes, PINNED if pinned else NEW)

    def _join(self, value: Value, source: Value, kind: str, nbytes: int | None = None) -> None:
        buf = self.plan.slots[source].buffer
        buf.values.append(value)
        nbytes = nbytes_of(value.type) if nbytes is None else nbytes  # type: ignore[arg-type]
        self.plan.slots[value] = Slot(value, buf, nbytes, kind, source)

    def _free_tail(self, value: Value, nbytes: int) -> bool:
        """value is planned, the latest value of a buffer that is not pinned, of nbytes bytes."""
        slot = self.plan.slots.get(value)
        return (slot is not None and slot.nbytes == nbytes and slot.buffer.values[-1] is value
                and not slot.buffer.pinned)

    def _form(self) -> None:
        """Puts every value that needs memory into a buffer: one pass over the points."""
        live = self.liveness
        views, registers, external = self.plan.views, self.plan.registers, self.plan.external
        ending: list[tuple[int, Operation]] = []  # scans whose body is being walked: (end, scan)
        for point, op in enumerate(live.points):
            results = op.results
            if op.spec.loop:  # a scan: `for` is pre-SSA, refused by unsupported_reason
                self._scan_starts(op, point)
                ending.append((live.end_of[op], op))
            elif op.regions:  # fused: results in memory, the body in registers
                for r in results:
                    if r not in external:
                        self._new(r)
            elif len(results) == 1:
                r = results[0]
                if r not in views and r not in registers and r not in external:
                    self._op(op, r, point)
            else:
                for r in results:
                    if r not in external:
                        self._new(r)
            while ending and ending[-1][0] == point:
                self._scan_ends(ending.pop()[1])

    def _op(self, op: Operation, r: Value, point: int) -> None:
        """r, op's only result: in place of a dying operand, in its carry's buffer, or new."""
        nbytes = nbytes_of(r.type)  # type: ignore[arg-type]
        if r in self._pinned:
            self._new(r, nbytes)
            return
        candidates = inplace_operands(op)
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
        loop = LoopView(scan)
        carries = loop.carries
        external = self.plan.external  # the loop's own buffers (loop_buffers.py): no slot
        self.carry_args.update(c.arg for c in carries)
        for c in carries:
            nbytes = nbytes_of(c.arg.type)  # type: ignore[arg-type]
            if c.arg in external:
                continue
            if c.arg not in self._pinned and self.held[c.init] == point and self._free_tail(c.init, nbytes):
                self._join(c.arg, c.init, IN_PLACE)
            else:
                self._new(c.arg)
        for r in loop.stacked_results:
            if r not in external:
                self._new(r)
        for c in carries:
            if c.arg not in external:
                self.carry_of.setdefault(c.yielded, c.arg)

    def _scan_ends(self, scan: Operation) -> None:
        """The final carries stay in the carries' buffers (a loop-owned one: outside the arena)."""
        external = self.plan.external
        for c in LoopView(scan).carries:
            if c.result in external:
                continue
            slot = self.plan.slots.get(c.arg)
            if c.result in self._pinned or slot is None or slot.buffer.pinned:
                self._new(c.result)
            else:
                self._join(c.result, c.arg, CARRY)


def find_views(live: Liveness, aliases: Aliases | None = None) -> tuple[dict[Value, Value], set[Value]]:
    """(views: view -> the value it reads, registers) of live's function: see plan.py's
    docstring; the strided views of aliases too."""
    views: dict[Value, Value] = {}
    registers: set[Value] = set()
    for op in live.points:
        if op.regions:
            loop = as_loop(op)
            if loop is not None:
                views.update(zip(loop.element_args, loop.sequences))
            else:
                for inner in op.body.walk():
                    registers.update(inner.results)
                registers.update(op.body.args)
        elif len(op.results) == 1 and op.spec.view is not None and op.results[0] not in registers:
            source = view_source(op)
            if source is not None:
                views[op.results[0]] = source
    if aliases is not None:
        views.update(aliases.views)
    return views, registers


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


def owner_op(v: Value) -> Operation | None:
    """The op that makes v: its defining op, or the region op whose body argument it is; None
    for a function argument."""
    op = v.defining_op
    if op is not None:
        return op
    block = v.defining_block
    return block.parent_op if block is not None else None


def carry_of_arg(v: Value) -> Carry | None:
    """The scan carry whose body argument v is, or None."""
    block = v.defining_block
    op = block.parent_op if block is not None else None
    loop = as_loop(op) if op is not None else None
    if loop is None:
        return None
    return next((c for c in loop.carries if c.arg is v), None)


def carry_of_result(v: Value) -> Carry | None:
    """The scan carry whose final value v is, or None."""
    op = v.defining_op
    loop = as_loop(op) if op is not None else None
    if loop is None:
        return None
    return next((c for c in loop.carries if c.result is v), None)


_INPLACE: dict[str, tuple[int, ...]] = {}
"""Cache: op kind -> the operand indices inplace_operands allows."""


def inplace_operands(op: Operation) -> list[Value]:
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
    tx, tr = x.tensor_type, r.tensor_type
    n = tx.num_elements()  # None: a `?` dim, never known to be the same
    return tx is tr or (n is not None and n == tr.num_elements() and ITEMSIZE[tx.dtype] == ITEMSIZE[tr.dtype])


def unsupported_reason(live: Liveness) -> str | None:
    """Why the function cannot be planned statically, or None."""
    args = set(live.function.args)
    for v in live.first:
        t = v.type
        if type(t) is TensorType and (None not in t.shape or v in args):
            continue
        owner = owner_op(v)
        if owner is None:
            continue
        if owner.spec.pre_ssa or type(t) is not TensorType:
            return f"'{owner.name}' at line {owner.loc.line} is pre-SSA IR: run the ssa pass first"
        return (f"'{owner.name}' at line {owner.loc.line} makes a value of dynamic shape {t}: plans need "
                "static shapes (the JIT plans after specialising on the argument shapes)")
    for op in live.points:
        if op.regions and op.spec.pre_ssa:  # scans and fused ops are the region ops it knows
            return f"'{op.name}' at line {op.loc.line} has a region the planner does not know (run ssa first)"
    return None
