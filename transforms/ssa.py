"""The `ssa` pass: variables become SSA values and `for` loops become `scan`.

Before (what the frontend emits for `%h` assigned in a loop):

    %h = var : tensor<4xf32>
    store %h, %h0
    %hs = for (%x in %xs) {
      %h.1 = load %h : tensor<4xf32>
      %0 = add %h.1, %x : tensor<4xf32>
      store %h, %0
      yield () stack (%0)
    } : tensor<8x4xf32>
    %h.2 = load %h : tensor<4xf32>

After:

    %h.2, %hs = scan (%x in %xs) carry (%h.1 = %h0) {
      %0 = add %h.1, %x : tensor<4xf32>
      yield (%0) stack (%0)
    } : tensor<4xf32>, tensor<8x4xf32>

Each block is walked once in order, keeping the current value of every variable. A variable
stored inside a loop (at any depth) that has a value before the loop becomes a carry; one that
has none is local to each step, and reading it before the step stores it (or after the loop)
is an error: it would be read before it is assigned on some path. Strict SSA afterwards.
"""

from __future__ import annotations

from ..errors import GirTypeError, rebuilding
from ..ir.core import Block, Function, Module, Operation, Value
from ..ir.loops import LoopView
from ..ir.ops import make_op
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Rewriter


class SSA(Pass):
    name = "ssa"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rewriter = Rewriter(stats)
        for f in module.functions.values():
            _FunctionSSA(f, rewriter).run()
        return rewriter.changed


class _FunctionSSA:
    def __init__(self, function: Function, rewriter: Rewriter):
        self.function = function
        self.rewriter = rewriter
        self.stored_in: dict[Operation, list[Value]] = {}
        """Loop op -> the variables stored in its body at any depth, in first-store order."""

    def run(self) -> None:
        if not any(op.spec.pre_ssa for op in self.function.walk()):
            return
        vars_ = [op for op in self.function.walk() if op.name == "var"]
        self.collect_stores(self.function.body)
        self.block(self.function.body, {})
        self.rewriter.current = "promote-variables"
        for op in vars_:
            self.rewriter.erase(op)

    def collect_stores(self, block: Block) -> dict[Value, None]:
        stored: dict[Value, None] = {}
        for op in block:
            if op.name == "store":
                stored[op.operands[0]] = None
            for region in op.regions:
                inner = self.collect_stores(region.block)
                self.stored_in[op] = list(inner)
                stored.update(inner)
        return stored

    def block(self, block: Block, current: dict[Value, Value]) -> None:
        rw = self.rewriter
        for op in block:
            if op.name == "store":
                current[op.operands[0]] = op.operands[1]
                rw.current = "promote-variables"
                rw.erase(op)
            elif op.name == "load":
                value = current.get(op.operands[0])
                if value is None:
                    name = op.operands[0].name_hint or "?"
                    raise GirTypeError(f"%{name} is read before it is assigned on some path (a loop that runs "
                                       "zero times, or a step that reads it before storing it)", op.loc)
                rw.current = "promote-variables"
                rw.replace_op(op, [value])
            elif op.spec.loop:
                self.loop(op, current)

    def loop(self, op: Operation, current: dict[Value, Value]) -> None:
        """Turns a loop into a scan whose extra carries are the variables it stores."""
        rw = self.rewriter
        stored = self.stored_in.get(op, [])
        carried = [v for v in stored if v in current]
        loop = LoopView(op)
        seqs, inits = loop.sequences, loop.inits
        old_finals, old_stacks = loop.final_carries, loop.stacked_results
        body = op.body
        inner = dict(current)
        for v in stored:
            inner.pop(v, None)
        for v in carried:
            inner[v] = body.add_arg(current[v].type, v.name_hint, index=len(body.args))
        self.block(body, inner)
        if op.spec.pre_ssa or carried:  # a `for` always becomes a scan
            term = loop.yield_op
            old_carries, stacks = loop.yielded_carries, loop.yielded_stacks
            missing = [v for v in carried if v not in inner]
            if missing:  # cannot happen: a carried variable always has a value in the body
                raise AssertionError(f"no value for carried variables {missing}")
            new_carries = old_carries + [inner[v] for v in carried]
            rw.current = "for-to-scan"
            with rebuilding():  # the user's loop as a scan: an error on it needs no note on ssa
                rw.create("yield", new_carries + stacks, before=term, segments=(len(new_carries), len(stacks)))
                rw.erase(term)
                region = op.regions.pop()
                new = make_op("scan", seqs + inits + [current[v] for v in carried], attrs=dict(op.attrs),
                              regions=[region], loc=op.loc, segments=(len(seqs), len(inits) + len(carried)))
            op.parent.insert_before(op, new)  # type: ignore[union-attr]
            rw.adopt(new)
            scan = LoopView(new)
            finals = scan.final_carries
            for old, res in zip(old_finals, finals):
                rw.replace_all_uses(old, res)
            for old, res in zip(old_stacks, scan.stacked_results):
                res.name_hint = old.name_hint
                rw.replace_all_uses(old, res)
            for v, result in zip(carried, finals[len(old_finals):]):
                result.name_hint = v.name_hint
                current[v] = result
            rw.erase(op)
        for v in stored:
            if v not in carried:
                current.pop(v, None)
