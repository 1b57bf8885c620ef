"""The `inline` pass: every `call` is replaced by the callee's body.

Before:
    func @sq(%a: tensor<4xf32>) -> tensor<4xf32> { %0 = mul %a, %a : tensor<4xf32>  return %0 }
    %y = call @sq(%x) : tensor<4xf32>
After:
    %y = mul %x, %x : tensor<4xf32>

autodiff inlines the function it differentiates with the same helpers; backends run this pass
so that they never see `call`. Recursion is reported after 50 levels.
"""

from __future__ import annotations

from ..errors import GirTypeError
from ..ir.core import Function, Module, Operation, Value
from .base import Pass
from .rewriter import PassStatistics, Rewriter


def inline_call(rw: Rewriter, callee: Function, args: list[Value], anchor: Operation) -> tuple[list[Operation],
                                                                                                   list[Value]]:
    """Clones callee's body before anchor (calls inside are inlined too); returns the new ops
    and the values it returns."""
    mapping: dict[Value, Value] = dict(zip(callee.args, args))
    new_ops: list[Operation] = []
    returned: list[Value] = []
    for op in callee.body:
        if op.name == "return":
            returned = [mapping.get(v, v) for v in op.operands]
            break
        clone = rw.clone(op, mapping)
        anchor.parent.insert_before(anchor, clone)  # type: ignore[union-attr]
        new_ops.append(clone)
    return new_ops, returned


def inline_calls(rw: Rewriter, module: Module, ops: list[Operation], depth: int = 0) -> list[Operation]:
    """Replaces every `call` among ops (and in their regions) by the callee's body."""
    out: list[Operation] = []
    for op in ops:
        for region in op.regions:
            inline_calls(rw, module, region.block.ops, depth)
        if op.name != "call":
            out.append(op)
            continue
        if depth > 50:
            raise GirTypeError("autodiff: calls nest more than 50 deep (recursion?)", op.loc)
        callee = module.functions[op.attrs["callee"]]
        new_ops, returned = inline_call(rw, callee, list(op.operands), op)
        out.extend(inline_calls(rw, module, new_ops, depth + 1))
        rw.replace_op(op, returned)
    return out


class Inline(Pass):
    name = "inline"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        rw.current = "inline-call"
        for f in module.functions.values():
            inline_calls(rw, module, f.body.ops)
        return rw.changed
