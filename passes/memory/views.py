"""Views: results that read their operand's memory where it is, so they need no buffer.

`view_source(op)` is the one definition; the planner, the checker and both backends use it,
and a backend must make exactly these views. (An op-registry field will replace it, so that
no list of op names lives outside ir/.)
"""

from __future__ import annotations

from ...ir.core import Operation, Value

VIEW_OPS = frozenset(("reshape", "transfer", "index", "slice", "transpose"))
"""The op kinds view_source may answer for: a cheap filter before asking it."""


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
