"""What an op kind is: `OpSpec`, and the registry that holds one per kind.

This module knows no IR node at run time (core.py imports it; ops.py fills the registry), so
`ir/` has no import cycle: types <- spec <- core <- ops, and printer/verifier/interpreter on top.

Terms.
- *Operand groups*: `operands` names each operand; a trailing `*` marks a variadic group
  (`("sequences*", "inits*")`). With more than one variadic group, the op's `segments` hold
  their sizes.
- *Block-argument and result groups*: `block_args` and `results` name the groups of a region
  op's body arguments and results. `"carries*=inits"` says the group has one entry per operand
  of group `inits`; `"stacks*=yield.stacks"` one per value of the body's yield group `stacks`;
  at most one group without `=` takes what is left. So a scan is read as
  `op.result_group("finals")`, never as `op.results[:n]`.
- *Facts*: the fields under "facts passes and backends ask" below replace every list of op
  names outside `ir/`. A new op kind states them here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from .types import TensorType, Type

if TYPE_CHECKING:
    from .core import Operation, Region, Value
    from .scalar import ScalarSemantics


class ShapeError(Exception):
    """Raised by a type rule; `make_op` turns it into a GirTypeError with the op's location."""


class InferContext:
    """What a type rule sees: operand types, attributes, declared result types, regions.

    It notes whether the rule read `declared` (`read_declared`): an op made without written
    types whose rule never looked at them has the result types the verifier's check (which
    passes the op's result types as declared) would infer, so the verifier need not infer
    them again (ops.infer_types_noting)."""

    __slots__ = ("spec", "types", "attrs", "_declared", "regions", "segments", "read_declared")

    def __init__(self, spec: OpSpec, types: list[Type], attrs: dict[str, Any], declared: list[TensorType] | None,
                 regions: Sequence[Region], segments: tuple[int, ...]):
        self.spec = spec
        self.types = types
        self.attrs = attrs
        self._declared = declared
        self.regions = regions
        self.segments = segments
        self.read_declared = False

    @property
    def declared(self) -> list[TensorType] | None:
        self.read_declared = True
        return self._declared

    def group(self, name: str) -> list[Type]:
        start, size = self.spec.segment_range(len(self.types), self.segments, name)
        return self.types[start : start + size]

    def tensor(self, i: int) -> TensorType:
        t = self.types[i]
        if not isinstance(t, TensorType):
            raise ShapeError(f"operand #{i} is a variable; read it with load")
        return t

    def need_declared(self, n: int = 1) -> list[TensorType]:
        declared = self.declared
        if declared is None or len(declared) != n:
            raise ShapeError(f"needs {n} result type(s) written after ':'")
        return declared


Kernel = Callable[..., Any]


@dataclass(frozen=True)
class Reduction:
    """How a reduction combines elements; the backends build their loops from it."""

    combine: str
    """The binary elementwise op kind that folds two partial results (`add`, `max`, `min`)."""
    identity: float
    """The value of a reduction over no element (`-inf` for max); nan where it has none."""
    divide_by_count: bool = False
    """`mean`: the combined value is divided by the number of elements."""
    empty_is_error: bool = False
    """A reduction over no element has no value (max/min): the interpreter raises."""


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    operands: tuple[str, ...]
    infer: Callable[[InferContext], list[Type]]
    kernel: Kernel | None = None
    """NumPy semantics: kernel(op, *arrays) -> array or tuple of arrays."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """Attribute names and defaults; a default of REQUIRED must be given."""
    category: str = "other"
    """elementwise | reduction | matmul | layout | constant | structural | other."""
    pure: bool = True
    """No side effects: DCE may erase it when unused and CSE may merge it."""
    may_fail: Callable[[Operation], bool] | None = None
    """Whether this op can raise a run-time error for some inputs (an integer division by zero,
    an `index` out of range, a `max` over an axis that may be empty). DCE keeps such an op even
    when unused, and hoisting leaves it in a loop that may run no step: a backend must raise
    exactly where the interpreter does (`fails_at_run_time`)."""
    terminator: bool = False
    num_regions: int = 0
    block_args: tuple[str, ...] = ()
    """Named groups of the body's arguments (see the module docstring)."""
    results: tuple[str, ...] = ()
    """Named groups of the results; empty: the results are not grouped."""
    literal: bool = False
    """The op is written with a leading literal: `constant 0.0 : tensor<f32>`."""
    own_syntax: bool = False
    """Written in a form of its own (`scan (...) carry (...) {...}`, `call @f(...)`, `return`),
    never in the generic form `name %a, %b {attrs} : T`."""
    written_type: bool = False
    """Its result type is written, not inferred from operands: `: T` in the generic form, `dtype=`
    and `shape=` when called as a function (`zeros(shape=[2], dtype="f32")`)."""
    one_argument_alias: str | None = None
    """The function name that means this op when called with one argument (`max(%x)` is
    `reduce_max`; `max(%a, %b)` is the elementwise `max`)."""
    commutative: bool = False
    vjp: Callable[..., Any] | None = None
    """Filled by autodiff's rule table (one line per op)."""
    inplace: int | None = None
    """Operand index whose buffer the result may take when that operand dies here."""
    gpu: bool = False
    """A GPU kernel exists for this op."""
    integer_operands: tuple[str, ...] = ()
    """Operands that only take integers: a number literal written there is i64 (`index(%x, 1)`)."""
    flops: Callable[[Operation], int] | None = None

    # -- facts passes and backends ask (each replaces a list of op names) ------------------------
    loop: bool = False
    """Runs its body once per step over the leading axis of its `sequences` (`scan`, `for`)."""
    pre_ssa: bool = False
    """Exists only before the `ssa` pass (`var`, `load`, `store`, `for`)."""
    view: Callable[[Operation], int | None] | None = None
    """The operand whose memory the result may read where it is (no copy, no buffer of its own),
    or None; memplan and both backends follow this one rule (`view_source`)."""
    reads_transposed: bool = False
    """Run as a GEMM (operand dtype in `gemm_dtypes`), reads a 2-D operand made by `transpose`
    without the copy (the GEMM's transpose flag)."""
    gemm_dtypes: tuple[str, ...] = ()
    """Dtypes for which the CPU backend runs the op as a BLAS GEMM."""
    reduction: Reduction | None = None
    """For reductions: how elements combine (identity, mean's division)."""
    splat: Callable[[Operation], float | None] | None = None
    """For constants: the one value every element has, or None (a list literal, a run-time fill)."""
    scalar: ScalarSemantics | None = None
    """For elementwise ops: what one element computes, per dtype class, as an expression over
    primitives both backends emit (filled by ir/scalar.py)."""
    same_type_is_identity: bool = False
    """When the result's type equals the operand's, the result is the operand (`broadcast`,
    `cast`, `slice`, a one-operand `concat`): canonicalize forwards it."""
    callee_results: Callable[[Operation, Sequence[Type], Sequence[Type]], list[Type]] | None = None
    """For ops that refer to another function (`callee`: `call`, `grad`): their result types from
    the callee's argument and result types. Such ops are never hoisted or merged by CSE."""
    region_arg_types: Callable[[InferContext], list[Type]] | None = None
    """For region ops: the body's argument types from the operands (a loop: one step's slice of
    each sequence, then the carries); what re-typing a cloned body (`specialize`) needs."""
    joins: str | None = None
    """Puts its operands side by side in its result: "axis" along an existing axis (`concat`),
    "new-axis" along a new one (`stack`); memplan's strided views ask it (packed arguments)."""
    moves_device: bool = False
    """Moves its operand between devices (`transfer`); placement inserts and removes these."""
    variable_operands: tuple[str, ...] = ()
    """Fixed operands that take a variable made by `var` (`load`, `store`): the only places a
    variable may be used (the verifier checks it)."""
    shape_attrs: tuple[str, ...] = ()
    """Attributes that only restate the result's shape (reshape's `shape`, slice's `limits`):
    where the shape follows a run-time length, they may too (analysis/lengths.py)."""

    @cached_property
    def arity(self) -> tuple[int, int]:
        """(fixed operands, variadic groups)."""
        n_variadic = sum(o.endswith("*") for o in self.operands)
        return len(self.operands) - n_variadic, n_variadic

    @cached_property
    def _operand_index(self) -> dict[str, int]:
        return {o.rstrip("*"): i for i, o in enumerate(self.operands)}

    @cached_property
    def _variadic(self) -> tuple[bool, ...]:
        return tuple(o.endswith("*") for o in self.operands)

    def segment_range(self, n_operands: int, segments: tuple[int, ...], name: str) -> tuple[int, int]:
        """(start, size) of operand group `name` in an op with n_operands and these segments."""
        i = self._operand_index.get(name)
        if i is None:
            raise KeyError(f"{self.name} has no operand group {name!r}")
        variadic = self._variadic
        n_fixed, n_variadic = self.arity
        if n_variadic == 0:
            return i, 1
        if n_variadic == 1:
            rest = n_operands - n_fixed
            return sum(rest if v else 1 for v in variadic[:i]), rest if variadic[i] else 1
        fixed_before, k = self._layout[i]  # the fixed operands before group i, and its segment
        return fixed_before + sum(segments[:k]), segments[k] if variadic[i] else 1

    @cached_property
    def _layout(self) -> tuple[tuple[int, int], ...]:
        """Per operand group: (fixed operands before it, variadic groups before it)."""
        out, fixed, k = [], 0, 0
        for v in self._variadic:
            out.append((fixed, k))
            if v:
                k += 1
            else:
                fixed += 1
        return tuple(out)

    def segment_of(self, op: Operation, name: str) -> tuple[int, int]:
        return self.segment_range(len(op.operands), op.segments, name)

    def has_operand_group(self, name: str) -> bool:
        return name in self._operand_index

    def derived_range(self, op: Operation, groups: tuple[str, ...], total: int, name: str) -> tuple[int, int]:
        """(start, size) of group `name` among `groups` (block_args or results) of op."""
        names, likes, variadic = _parse_groups(groups)
        if name not in names:
            raise KeyError(f"{self.name} has no group {name!r}")
        i = names.index(name)
        sizes = [self._sized_like(op, like) if like else (None if star else 1)
                 for like, star in zip(likes[: i + 1], variadic[: i + 1])]
        if None in sizes:  # the one unsized group takes what the others leave
            rest = [self._sized_like(op, like) if like else (0 if star else 1)
                    for like, star in zip(likes[i + 1:], variadic[i + 1:])]
            fill = total - (sum(s for s in sizes if s is not None) + sum(rest))
        else:
            fill = 0  # no unsized group before this one
        counts = [fill if s is None else s for s in sizes]
        return sum(counts[:i]), counts[i]

    @cached_property
    def _variadic_index(self) -> dict[str, int]:
        """Variadic operand group name -> its index in `segments`."""
        names = [o.rstrip("*") for o in self.operands if o.endswith("*")]
        return {name: k for k, name in enumerate(names)}

    def group_size(self, op: Operation, name: str) -> int:
        """The number of operands of op's group `name` (0 when the spec has no such group)."""
        i = self._operand_index.get(name)
        if i is None:
            return 0
        if not self._variadic[i]:
            return 1
        n_fixed, n_variadic = self.arity
        return len(op.operands) - n_fixed if n_variadic == 1 else op.segments[self._variadic_index[name]]

    def _sized_like(self, op: Operation, like: str) -> int:
        if like.startswith("yield."):
            term = op.regions[0].block.terminator
            return 0 if term is None else term.spec.group_size(term, like[6:])
        return self.group_size(op, like)

    @property
    def interprocedural(self) -> bool:
        return self.callee_results is not None

    @property
    def is_elementwise(self) -> bool:
        return self.category == "elementwise"


@cache
def _parse_groups(groups: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[bool, ...]]:
    """`("carries*=inits", "stacks*")` -> (names, the group each is sized like, variadic flags)."""
    parts = [g.partition("=") for g in groups]
    return (tuple(head.rstrip("*") for head, _, _ in parts), tuple(like for _, _, like in parts),
            tuple(head.endswith("*") for head, _, _ in parts))


REQUIRED = object()
REGISTRY: dict[str, OpSpec] = {}
"""Every op kind by name; filled by ops.py (imported with the package `gir.ir`)."""


def register(spec: OpSpec) -> OpSpec:
    assert spec.name not in REGISTRY, spec.name
    REGISTRY[spec.name] = spec
    return spec


T = TypeVar("T")


def dispatch_by_fact(by_name: dict[str, T], by_fact: Sequence[tuple[Callable[[OpSpec], bool], T]]) -> dict[str, T]:
    """Op kind -> T: `by_name` for the kinds named there, else the first `by_fact` entry whose
    fact the kind's spec has (kinds with neither are left out). How a backend builds its table
    of lowerings, so a new op with known facts needs no entry."""
    table = dict(by_name)
    for name, spec in REGISTRY.items():
        found = next((value for fact, value in by_fact if fact(spec)), None)
        if found is not None:
            table.setdefault(name, found)
    return table


def view_source(op: Operation) -> Value | None:
    """The operand whose memory op's result reads where it is, or None (`OpSpec.view`)."""
    rule = op.spec.view
    if rule is None:
        return None
    index = rule(op)
    return None if index is None else op.operands[index]


def fails_at_run_time(op: Operation) -> bool:
    """Whether op, or an op in its regions, can raise a run-time error (OpSpec.may_fail)."""
    may_fail = op.spec.may_fail
    if may_fail is not None and may_fail(op):
        return True
    return any(fails_at_run_time(inner) for region in op.regions for inner in region.block)
