"""The memory plan's data model: buffers, the slot of each planned value, and the plan.

Terms.
- *Planned values*: op results and the carries' body arguments. Function arguments live in
  the caller's memory and are never written; they are not in the arena, and neither are:
  *views*, results that read their operand's memory where it is (`view_source`, ir/spec.py; also a sequence's
  body argument, one step of the sequence; with strided views, the slices aliases.py lists);
  and *registers*, the values inside a `fused` op
  (one element at a time). A view keeps the buffer it reads live for as long as the view is
  live (`MemoryPlan.held_until`).
- *Buffer*: bytes (a multiple of ALIGN, at an ALIGN-aligned offset) that one or more values
  occupy one after another: a value computed in place of an operand that dies at its op joins
  the operand's buffer. A buffer's live range runs from its first value's definition to its
  last value's last point (liveness.py).
- *Arena*: the bytes the buffers are placed in; its size is the plan's peak.
- *Slot kind*, why a value is where it is: new, reused (a new buffer placed, at least partly,
  where a dead one was), in-place, carry, pinned.

The numbers of a plan: peak arena bytes; the naive total (every planned value its own
buffer); the lower bound, the most bytes of buffers live at one point (no placement of these
buffers does better); in-place reuses; block reuses ("reused block of %y", %y being the value
that freed it most recently); carry shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import UNKNOWN, GirPassError, Location
from ...ir.core import Function, Value
from ...ir.types import DTYPES, TensorType
from ..liveness import Liveness
from .aliases import OPS, ViewRules

ALIGN = 64
"""Every buffer starts at a multiple of this many bytes and its size is rounded up to one."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


ITEMSIZE = {name: dt.itemsize for name, dt in DTYPES.items()}


def nbytes_of(t: TensorType) -> int:
    """Bytes of a static tensor type."""
    return math.prod(t.shape) * ITEMSIZE[t.dtype]  # type: ignore[arg-type]


def value_loc(v: Value) -> Location:
    """Where v comes from in the source: its op, or the op or function owning its block."""
    op = v.defining_op
    if op is not None:
        return op.loc
    block = v.defining_block
    assert block is not None
    owner = block.parent_op
    if owner is not None:
        return owner.loc
    f = block.parent.parent if block.parent is not None else None
    return getattr(f, "loc", UNKNOWN)


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
    """Scratch for arena.place_by_size: marks a buffer already looked at for the current one."""

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
    """The placement that made it: size, breadth or program (auto resolves to one of them)."""
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
    view_rules: ViewRules = OPS
    """Which strided views the plan counts as views (aliases.py): `ops` (the registry's only,
    the CPU backend's) or `strided` (the GPU backend's)."""
    external: frozenset[Value] = frozenset()
    """Values outside the arena although an op makes them: a join of arguments that is their
    home (aliases.py); claimed joins and the values a scan keeps in buffers of its own
    (loop_buffers.py). The backend gives each a buffer of its own."""
    why_external: dict[Value, str] = field(default_factory=dict)
    """An external value -> why (aliases.Aliases.why_external)."""
    outside_bytes: int = 0
    """Bytes of the buffers the loops' values outside the arena live in (loop_buffers.
    outside_bytes: double buffers, shifted stacks, claimed joins); 0 without loop buffers."""

    @property
    def peak_bytes(self) -> int:
        """The memory the plan says the function needs besides its arguments and constants: the
        arena and the loops' buffers outside it (what a memory budget is compared with)."""
        return self.arena_bytes + self.outside_bytes

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
        """The plan in one line: strategy, arena against the lower bound and naive, reuses."""
        name = f"@{self.function.name}"
        if not self.supported:
            return f"memory plan of {name}: not planned: {self.unsupported}"
        ratio = self.arena_bytes / self.lower_bound if self.lower_bound else 1.0
        saved = 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0
        return (f"memory plan of {name} ({self.strategy}): arena {self.arena_bytes} bytes, {ratio:.3f}x the "
                f"lower bound {self.lower_bound}; naive {self.naive_bytes} ({saved:.0%} saved); "
                f"{self.in_place_reuses} in place, {self.block_reuses} reused blocks, "
                f"{self.carry_shares} carry shares"
                + (f"; loop buffers outside the arena {self.outside_bytes} bytes" if self.outside_bytes else ""))

    def reason(self, value: Value, names: dict[Value, str]) -> str:
        """Why value is where it is, with the printer's names: `in place of %x`, `view of %x`..."""
        if value in self.views:
            return f"view of {names[self.views[value]]}"
        if value in self.external:
            return f"{self.why_external.get(value, 'outside')} (outside the arena)"
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
