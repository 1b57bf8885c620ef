"""One typed view of a loop op (`scan`, `for`): every consumer reads a loop through it.

    %h.1, %hs = scan (%x in %xs) carry (%h.0 = %h0) { ... yield (%h.2) stack (%h.2) }

    view = LoopView(op)
    view.sequences        [%xs]     outer values sliced on their leading axis
    view.element_args     [%x]      the body arguments holding one step's slice
    view.inits            [%h0]     initial carries (scan only)
    view.carry_args       [%h.0]    the body arguments holding the carry during a step
    view.yielded_carries  [%h.2]    the next step's carries
    view.yielded_stacks   [%h.2]    values stacked per step
    view.final_carries    [%h.1]    results: the carries after the last step
    view.stacked_results  [%hs]     results: the stacks, one row per step
    view.carries          [Carry(init, arg, yielded, result)]  the same, one record per carry

The groups come from the op's spec (`operands`, `block_args`, `results`), so a new kind of
loop result is declared once, in ir/ops.py, and this view reads it; nothing takes a loop's
results or block arguments apart by position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # names for annotations only: printer.py imports this module, core.py imports printer
    from .core import Block, BlockArgument, Operation, OpResult, Value
    from .types import Dim


class Carry(NamedTuple):
    """One carry of a scan: its initial value, body argument, yielded value and final result."""

    init: Value
    arg: BlockArgument
    yielded: Value
    result: OpResult


class LoopGroups(NamedTuple):
    """Every group of a loop at once (`LoopView.groups`), for a pass that reads them all."""

    sequences: list[Value]
    element_args: list[BlockArgument]
    inits: list[Value]
    carry_args: list[BlockArgument]
    yielded_carries: list[Value]
    yielded_stacks: list[Value]
    final_carries: list[OpResult]
    stacked_results: list[OpResult]


class LoopView:
    """A typed view of a `scan` or `for` op (an op whose spec says `loop`).

    The loop specs (ir/ops.py) declare the layout: operands `sequences*, inits*`, body arguments
    `elements*` (one per sequence) then `carries*` (one per init), results `finals*` (one per
    init) then `stacks*` (one per yielded stack), the yield's `carries*` then `stacks*`. The
    view reads the group sizes from the spec and takes the op apart here, the one place that
    does (tests/test_ir_core.py checks it against the spec's generic `arg_group` and
    `result_group`); it is cheap because passes make one per scan visit."""

    __slots__ = ("op",)

    def __init__(self, op: Operation):
        assert op.spec.loop, f"{op.name} is not a loop"
        self.op = op

    def _sizes(self) -> tuple[int, int]:
        """(number of sequences, number of carries)."""
        op = self.op
        spec = op.spec
        return spec.group_size(op, "sequences"), spec.group_size(op, "inits")

    @property
    def is_scan(self) -> bool:
        """It has carries (a `scan`), rather than variables (a pre-SSA `for`)."""
        return self.op.spec.has_operand_group("inits")

    @property
    def reverse(self) -> bool:
        return bool(self.op.attrs["reverse"])

    @property
    def length(self) -> int | None:
        return self.op.attrs["length"]

    @property
    def sequences(self) -> list[Value]:
        n_seq, _ = self._sizes()
        return self.op.operands[:n_seq]

    @property
    def inits(self) -> list[Value]:
        n_seq, n_carry = self._sizes()
        return self.op.operands[n_seq : n_seq + n_carry]

    @property
    def body(self) -> Block:
        return self.op.body

    @property
    def element_args(self) -> list[BlockArgument]:
        n_seq, _ = self._sizes()
        return self.op.body.args[:n_seq]

    @property
    def carry_args(self) -> list[BlockArgument]:
        n_seq, n_carry = self._sizes()
        return self.op.body.args[n_seq : n_seq + n_carry]

    @property
    def yield_op(self) -> Operation:
        term = self.op.body.terminator
        assert term is not None and term.spec.terminator and term.spec.has_operand_group("stacks"), \
            f"{self.op.name} body without yield"
        return term

    @property
    def yielded_carries(self) -> list[Value]:
        return self.yield_op.group("carries")

    @property
    def yielded_stacks(self) -> list[Value]:
        return self.yield_op.group("stacks")

    @property
    def final_carries(self) -> list[OpResult]:
        _, n_carry = self._sizes()
        return self.op.results[:n_carry]

    @property
    def stacked_results(self) -> list[OpResult]:
        _, n_carry = self._sizes()
        return self.op.results[n_carry:]

    @property
    def carries(self) -> list[Carry]:
        op = self.op
        n_seq, n_carry = self._sizes()
        return [Carry(*parts) for parts in zip(op.operands[n_seq : n_seq + n_carry],
                                               op.body.args[n_seq : n_seq + n_carry],
                                               self.yielded_carries, op.results[:n_carry])]

    def groups(self) -> LoopGroups:
        """All the groups, the sizes read once (a pass taking a scan apart reads every group;
        the properties above each read the sizes again)."""
        op = self.op
        n_seq, n_carry = self._sizes()
        end = n_seq + n_carry
        args = op.body.args
        term = self.yield_op
        return LoopGroups(op.operands[:n_seq], args[:n_seq], op.operands[n_seq:end], args[n_seq:end],
                          term.group("carries"), term.group("stacks"), op.results[:n_carry], op.results[n_carry:])

    @property
    def trip_count(self) -> Dim:
        """The number of steps: a sequence's known leading dim, else `length`; None when `?`."""
        for s in self.sequences:
            n = s.tensor_type.shape[0]
            if n is not None:
                return n
        return self.length


def as_loop(op: Operation) -> LoopView | None:
    """The loop view of op, or None when op is not a loop."""
    return LoopView(op) if op.spec.loop else None
