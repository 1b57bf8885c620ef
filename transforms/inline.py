"""The `inline` pass: every `call` is replaced by the callee's body.

Before:
    func @sq(%a: tensor<4xf32>) -> tensor<4xf32> { %0 = mul %a, %a : tensor<4xf32>  return %0 }
    %y = call @sq(%x) : tensor<4xf32>
After:
    %y = mul %x, %x : tensor<4xf32>

autodiff inlines the function it differentiates with the same helpers; backends run this pass
so that they never see `call`. The verifier rejects call cycles; inlining checks for them too
(a module built through the API reaches this pass unverified), by the chain of callees it is
inside, so it always ends.
"""

from __future__ import annotations

from ..ir.core import Function, Module, Operation, Value
from ..ir.verifier import call_cycle_error
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Rewriter


def inline_call(rw: Rewriter, callee: Function, args: list[Value], anchor: Operation) -> tuple[list[Operation],
                                                                                                   list[Value]]:
    """Clones callee's body before anchor (calls inside are inlined too); returns the new ops
    and the values it returns."""
    mapping: dict[Value, Value] = dict(zip(callee.args, args))
    new_ops: list[Operation] = []
    returned: list[Value] = []
    for op in list(callee.body):  # a snapshot: anchor may sit in callee's own body
        if op.name == "return":
            returned = [mapping.get(v, v) for v in op.operands]
            break
        clone = rw.clone(op, mapping)
        anchor.parent.insert_before(anchor, clone)  # type: ignore[union-attr]
        new_ops.append(clone)
    return new_ops, returned


def inline_calls(rw: Rewriter, module: Module, ops: list[Operation],
                  inside: tuple[str, ...] = (), replaced: dict[Value, Value] | None = None) -> list[Operation]:
    """Replaces every `call` among ops (and in their regions) by the callee's body; `inside`
    names the functions whose bodies ops were copied from, outermost first. `replaced`, if
    given, gets each erased call result -> the value now standing for it (a caller holding a
    call result outside the IR, as autodiff holds the loss, reads it back with `current`)."""
    out: list[Operation] = []
    for op in ops:
        for region in op.regions:
            inline_calls(rw, module, region.block.ops, inside, replaced)
        if op.name != "call":
            out.append(op)
            continue
        name = op.attrs["callee"]
        if name in inside:
            raise call_cycle_error(inside[inside.index(name):], op)
        new_ops, returned = inline_call(rw, module.functions[name], list(op.operands), op)
        out.extend(inline_calls(rw, module, new_ops, (*inside, name), replaced))
        if replaced is not None:
            replaced.update(zip(op.results, returned))
        rw.replace_op(op, returned)
    return out


def current(v: Value, replaced: dict[Value, Value]) -> Value:
    """What stands for v after `inline_calls` (a chain where a callee returns a call's result)."""
    while v in replaced:
        v = replaced[v]
    return v


class Inline(Pass):
    name = "inline"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        rw.current = "inline-call"
        for f in module.functions.values():
            inline_calls(rw, module, f.body.ops, (f.name,))
        return rw.changed
