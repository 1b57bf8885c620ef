"""The checker: `check_plan(plan)` raises PlanError when a plan breaks its rules.

The rules: every value that needs memory (not an argument, view or register) has a buffer at
an aligned offset inside the arena (a join of arguments that is their home, with strided
views, is outside it: aliases.py); values share a buffer only one after another (the earlier
one's memory, views included, no longer needed when the later one is written, or *handed
over* at an op allowed to overwrite it, or between a carry's initial value, body argument,
yielded value and final value); and no two buffers needed at one point overlap in the arena.

Lifetimes come from the liveness and the views are found again here, not taken from the plan.
O(n log n): a sweep in time keeping the live buffers sorted by offset.
"""

from __future__ import annotations

import bisect
import heapq

from ...ir.core import Value
from ...ir.loops import as_loop
from ..liveness import Liveness
from .aliases import find_aliases
from .plan import ALIGN, Buffer, MemoryPlan, PlanError, value_loc
from .planner import carry_of_arg, carry_of_result, find_views, held_until, inplace_operands

Span = tuple[int, int, Buffer]
"""(first, last, buffer): the points during which a buffer's memory is needed."""


def check_plan(plan: MemoryPlan) -> None:
    """Raises PlanError unless plan keeps the rules in this module's docstring."""
    if not plan.supported:
        return
    live = plan.liveness
    aliases = find_aliases(plan.function, plan.view_rules)
    if aliases.external != plan.external:
        raise PlanError(f"@{plan.function.name}: the plan's values outside the arena are not the ones the IR has")
    views, registers = find_views(live, aliases)
    if views != plan.views:
        raise PlanError(f"@{plan.function.name}: the plan's views are not the ones the IR has")
    held = held_until(live, views)
    _check_membership(plan, views, registers | aliases.external)
    children: dict[Value, list[Value]] = {}
    for view, source in views.items():
        children.setdefault(source, []).append(view)
    buffers = {id(s.buffer): s.buffer for s in plan.slots.values()}.values()
    spans = [span for b in buffers if (span := _check_buffer(plan, b, children, held)) is not None]
    _check_overlaps(plan, spans)


def _check_membership(plan: MemoryPlan, views: dict[Value, Value], registers: set[Value]) -> None:
    """Exactly the values that need memory of their own have a slot."""
    f = plan.function
    args = set(f.args)
    for v in plan.slots:
        if v in views or v in registers or v in args:
            raise PlanError(f"@{f.name}: '{v.name_hint or '?'}' is in the arena but needs no memory of its own")
    missing = [v for v in _planned_values(plan.liveness)
               if v not in views and v not in registers and v not in plan.slots]
    if missing:
        raise PlanError(f"@{f.name}: {len(missing)} value(s) have no buffer, the first at line "
                        f"{value_loc(missing[0]).line}")


def _check_buffer(plan: MemoryPlan, b: Buffer, children: dict[Value, list[Value]],
                  held: dict[Value, int]) -> Span | None:
    """Checks one buffer on its own (its values, size, alignment, handovers); returns its span,
    or None for an empty buffer, which takes no room."""
    name = plan.function.name
    if any(plan.slots[v].buffer is not b for v in b.values):
        raise PlanError(f"@{name}: a value is listed in two buffers")
    if any(plan.slots[v].nbytes > b.size for v in b.values):
        raise PlanError(f"@{name}: a buffer of {b.size} bytes is too small for one of its values")
    if b.pinned and len(b.values) != 1:
        raise PlanError(f"@{name}: a pinned buffer is shared")
    if b.size == 0:
        return None
    if b.offset < 0 or b.offset % ALIGN or b.size % ALIGN or b.end > plan.arena_bytes:
        raise PlanError(f"@{name}: a buffer at {b.offset} of {b.size} bytes is misaligned or outside "
                        f"the arena of {plan.arena_bytes} bytes")
    live = plan.liveness
    if len(b.values) > 1:
        ordered = sorted(b.values, key=lambda v: live.first[v])
        for a, c in zip(ordered, ordered[1:]):
            _check_handover(plan, children, held, a, c)
    if b.pinned:
        return 0, max(live.num_points - 1, 0), b
    return min(live.first[v] for v in b.values), max(held[v] for v in b.values), b


def _check_overlaps(plan: MemoryPlan, spans: list[Span]) -> None:
    """No two spans that meet in time overlap in the arena."""
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
                    raise PlanError(f"@{plan.function.name}: buffers of {_describe(o)} and {_describe(b)} are live "
                                    f"at once and overlap in the arena ([{o.offset}, {o.end}) and "
                                    f"[{b.offset}, {b.end}))")
        by_offset.insert(k, (b.offset, b.end, index))
        heapq.heappush(ending, (last, index, b))


def _describe(b: Buffer) -> str:
    v = b.values[0]
    return f"'{v.name_hint or '?'}' (line {value_loc(v).line})"


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
    raise PlanError(f"@{plan.function.name}: '{c.name_hint or '?'}' (line {value_loc(c).line}) is written into the "
                    f"buffer of '{a.name_hint or '?'}' (line {value_loc(a).line}) while that is still needed")


def _no_view_of(a: Value, c: Value, views: dict[Value, Value]) -> bool:
    """c's op reads a only directly, not also through a view."""
    op = c.defining_op
    assert op is not None, "c is written in place of a, so it is an op's result"
    for v in op.operands:
        while v in views:
            v = views[v]
            if v is a:
                return False
    return True


def _carry_pair(a: Value, c: Value) -> bool:
    """a is a carry's body argument and c the value yielded for that carry, or c is the
    carry's final value and a its argument or yielded value."""
    carry = carry_of_arg(a)
    if carry is not None:
        return carry.yielded is c or carry.result is c
    carry = carry_of_result(c)
    return carry is not None and carry.yielded is a


def _allowed_inplace(a: Value, c: Value) -> bool:
    op = c.defining_op
    return op is not None and not op.regions and a in inplace_operands(op)


def _init_to_carry(a: Value, c: Value) -> bool:
    carry = carry_of_arg(c)
    return carry is not None and carry.init is a


def _planned_values(live: Liveness) -> list[Value]:
    """Every value that needs memory unless a view or register: op results, carries' body
    arguments."""
    out: list[Value] = []
    for op in live.points:
        loop = as_loop(op)
        if loop is not None:
            out.extend(loop.carry_args)
        out.extend(op.results)
    return out
