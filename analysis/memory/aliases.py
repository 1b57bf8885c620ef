"""Strided views: the views a backend makes beyond the op registry's, as facts of the IR.

The op registry's views (`view_source`, ir/spec.py: reshape, a contiguous slice, ...) are the
ones every backend makes. A backend whose kernels read their operands through strides (the GPU
backend: `kernels.InputLayout`) also leaves some non-contiguous slices where they are, and
takes a join of arguments as the arguments' home. The memory plan must know, or it frees the
source at the slice and reserves a slot the slice never uses. Which of these a backend makes is
an option of the plan (`ViewRules`, the `memplan{views=...}` pass option), so the plan a backend
lays its arena out by is the plan that knows; the decision is here, once, as IR facts:

- *absorbed slice*: a slice read only by kernels (`fused` ops, elementwise ops) and
  reductions; the readers take its elements from the source through the slice's strides;
- *walked slice*: a slice only scans walk as a sequence, every row of the source kept (the
  first axis whole, step 1), each step's element read only by kernels: row t of the source,
  read through the slice's strides;
- *returned slice*: a slice read only by the function's `return`: the result is handed out from
  the source;
- *packed arguments*: a top-level `concat` or `stack` whose operands are distinct function
  arguments read by it alone: its buffer is the arguments' storage (the call's arguments land in
  their places), outside the arena like the arguments themselves (`Aliases.external`).

Each slice kind needs a source that is its own C-contiguous array: the result of a kernel or a
GEMM (`fused`, an elementwise op, a matmul). A strided view is a view in the plan (`MemoryPlan.
views`): no slot of its own, its source held until the view's last reader (for a walked slice,
the scan's end). The CPU backend makes none of these (it copies non-contiguous slices): its plan
uses the registry's views only (`OPS`, the default).

With `ViewRules.loop_buffers` (part of STRIDED) the values a scan keeps in buffers of its own and
the claimed concats (loop_buffers.py) are outside the arena too (`Aliases.external`,
`why_external`).

Known gaps: only slices of kernel and GEMM results; a join of arguments among other operands,
or of an argument read elsewhere too, is not a home.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.core import Function, Operation, Value
from ...ir.loops import as_loop
from ...ir.spec import view_source
from .loop_buffers import find_loop_buffers

ABSORBED = "absorbed"
WALKED = "walked"
RETURNED = "returned"
ARGUMENTS_HOME = "arguments' home"


@dataclass(frozen=True)
class ViewRules:
    """Which strided views a backend makes (module docstring), by name."""

    name: str
    absorbed_slices: bool = False
    walked_slices: bool = False
    returned_slices: bool = False
    packed_arguments: bool = False
    loop_buffers: bool = False
    """Claimed joins and the values scans keep in buffers of their own (loop_buffers.py) are
    outside the arena."""

    @property
    def any(self) -> bool:
        return (self.absorbed_slices or self.walked_slices or self.returned_slices or self.packed_arguments
                or self.loop_buffers)


OPS = ViewRules("ops")
"""The op registry's views only: what the CPU backend makes (memplan's default)."""
STRIDED = ViewRules("strided", absorbed_slices=True, walked_slices=True, returned_slices=True,
                    packed_arguments=True, loop_buffers=True)
"""Every strided view above, and the loop buffers: what the GPU backend makes."""
VIEW_RULES = {r.name: r for r in (OPS, STRIDED)}


@dataclass(frozen=True)
class Aliases:
    """The strided views of one function under some ViewRules."""

    views: dict[Value, Value] = field(default_factory=dict)
    """A strided slice -> its source."""
    kinds: dict[Value, str] = field(default_factory=dict)
    """A strided slice -> absorbed | walked | returned."""
    external: frozenset[Value] = frozenset()
    """Values outside the arena: results of packed-argument joins (the arguments' home) and,
    with loop buffers, claimed joins and loop-owned values (loop_buffers.py)."""
    why_external: dict[Value, str] = field(default_factory=dict)
    """An external value -> why (ARGUMENTS_HOME, loop_buffers.CLAIMED_JOIN, LOOP_OWNED)."""


def find_aliases(function: Function, rules: ViewRules) -> Aliases:
    """The strided views of function that rules allow (module docstring)."""
    if not rules.any:
        return Aliases()
    views: dict[Value, Value] = {}
    kinds: dict[Value, str] = {}
    for op in _ops_outside_fused(function):
        kind = slice_kind(op, rules)
        if kind is not None:
            views[op.result] = op.operands[0]
            kinds[op.result] = kind
    why: dict[Value, str] = {op.result: ARGUMENTS_HOME for op in function.body
                             if rules.packed_arguments and packed_arguments(op, function)}
    if rules.loop_buffers:
        for v, reason in find_loop_buffers(function).items():
            why.setdefault(v, reason)
    return Aliases(views, kinds, frozenset(why), why)


def _ops_outside_fused(function: Function) -> list[Operation]:
    """Every op of function, scan bodies included, but not the insides of `fused` ops (one
    element at a time: registers)."""
    out: list[Operation] = []
    stack = [function.body]
    while stack:
        for op in stack.pop():
            out.append(op)
            if as_loop(op) is not None:
                stack.append(op.body)
    return out


def slice_kind(op: Operation, rules: ViewRules) -> str | None:
    """absorbed | walked | returned when op is a slice (not a registry view) that rules let stay
    a strided view of its source, else None."""
    if op.name != "slice" or view_source(op) is not None or not made_contiguous(op.operands[0]):
        return None
    r = op.result
    if rules.absorbed_slices and read_by_kernels_and_reductions(r):
        return ABSORBED
    if rules.walked_slices and walked_only(op):
        return WALKED
    if rules.returned_slices and returned_only(op):
        return RETURNED
    return None


def made_contiguous(x: Value) -> bool:
    """Whether x is the result of a kernel or a GEMM: an array of its own, C-contiguous."""
    made_by = x.defining_op
    return made_by is not None and (made_by.name == "fused" or made_by.spec.is_elementwise
                                    or made_by.spec.category == "matmul")


def read_by_kernels(v: Value) -> bool:
    """Whether v is read, and only by kernels (`fused` ops, elementwise ops)."""
    return bool(v.users) and all(u.name == "fused" or u.spec.is_elementwise for u in v.users)


def read_by_kernels_and_reductions(v: Value) -> bool:
    """Whether v is read, and only by kernels and reductions."""
    return bool(v.users) and all(u.name == "fused" or u.spec.is_elementwise or u.spec.reduction is not None
                                 for u in v.users)


def returned_only(op: Operation) -> bool:
    """Whether op's result is read only by its function's `return`."""
    users = op.result.users
    return bool(users) and all(u.spec.terminator and u.parent_op is None for u in users)


def walked_only(op: Operation) -> bool:
    """Whether slice op keeps every row of its source (the first axis whole, step 1) and only
    scans walk its result as a sequence, each step's element read only by kernels."""
    x, r = op.operands[0], op.result
    shape = x.tensor_type.shape
    starts, limits = op.attrs["starts"], op.attrs["limits"]
    steps = op.attrs["steps"] or [1] * len(starts)
    if len(shape) < 2 or (starts[0], limits[0], steps[0]) != (0, shape[0], 1) or not r.users:
        return False
    for scan in r.users:
        loop = as_loop(scan)
        if loop is None or r in loop.inits:
            return False
        if any(not read_by_kernels(a) for s, a in zip(loop.sequences, loop.element_args) if s is r):
            return False
    return True


def packed_arguments(op: Operation, function: Function) -> bool:
    """Whether op is a join at the top of function whose operands are distinct arguments of
    function, each read by op alone."""
    if op.spec.joins is None or op.parent is not function.body or not op.operands:
        return False
    args = set(function.args)
    return len(set(op.operands)) == len(op.operands) and all(v in args and v.users == [op] for v in op.operands)


__all__ = ["ABSORBED", "ARGUMENTS_HOME", "OPS", "RETURNED", "STRIDED", "VIEW_RULES", "WALKED", "Aliases", "ViewRules",
           "find_aliases", "made_contiguous", "packed_arguments", "read_by_kernels",
           "read_by_kernels_and_reductions", "returned_only", "slice_kind", "walked_only"]
