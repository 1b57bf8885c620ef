"""A counted loop in LLVM IR (llvmlite.ir only): the one loop shape lower/ and
packed_gemm.py emit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

I64 = ir.IntType(64)


@contextmanager
def counted(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, name: str = "i") -> Iterator[ir.Value]:
    """for (i = lo; i < hi; i++): yields i (an i64 phi) with the builder in the loop's body;
    after the block the builder is past the loop."""
    pre = b.block
    header, body, end = (b.append_basic_block(f"{name}.{part}") for part in ("header", "body", "end"))
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(I64, name=name)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), body, end)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
    b.branch(header)
    b.position_at_end(end)
