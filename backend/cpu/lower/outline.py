"""Outlining for very large functions (issue 30: compile time linear in pytree leaves): past
`OUTLINE_AFTER` top-level loop nests, runs of them are lowered as small internal functions and
the results are copied out in calls of `COPY_CHUNK`, so that no LLVM function grows with the
program (LLVM's codegen is superlinear in the size of one function)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ....ir.core import Function, Operation, Value
from ..llvm_types import I1, I64, PTR

if TYPE_CHECKING:
    from .base import Lowering


OUTLINE_AFTER = 128
"""A function with more top-level loop nests (fused groups, lone elementwise ops, reductions:
ops whose lowering writes their own slots and aliases nothing) than this
has each of them lowered as an internal function of its own, and its results copied out in
calls of `COPY_CHUNK` copies. LLVM's codegen is superlinear in the size of one function: Loop
Strength Reduction grows with the loops of the function times their number, the machine
scheduler with the size of one basic block (the copies at the end are one). A pytree of 2,000
two-element leaves, 2,000 fused loops in `gir_main`, took 6 s of LLVM (1,000: 1.9 s, 500: 0.6
s); outlined, each function is small and LLVM's time linear in the leaves. Below this count,
the loops stay in `gir_main`, where LLVM sees that slots of one arena do not overlap."""

KERNELS_PER_FUNCTION = 32
"""Consecutive outlined loop nests per function: fewer functions, less of LLVM's cost per
function, each still small (see `OUTLINE_AFTER`)."""

COPY_CHUNK = 64
"""Results copied out per call of a `gir_copy_out<k>` function (see `OUTLINE_AFTER`)."""


def _kernels_to_outline(function: Function) -> set[Operation]:
    loops = [op for op in function.body
             if op.name == "fused" or op.spec.is_elementwise or op.spec.reduction is not None]
    return set(loops) if len(loops) > OUTLINE_AFTER else set()


def _outline_kernels(low: Lowering, ops: list[Operation]) -> None:
    """Consecutive top-level loop nests as `internal noinline void gir_kernel<k>(values...,
    counters, fns)`, called here with the pointers of the values they read and write
    (`OUTLINE_AFTER` says why)."""
    for op in ops:
        for r in op.results:
            low.slot(r, op)
    values = list(dict.fromkeys(v for op in ops for v in list(op.operands) + list(op.results)))
    for v in values:  # arguments: loaded where the call is
        i = low.arg_index.get(v)
        if i is not None:
            low.ptr[v] = low._load_ptr(low.buffers, i)
    pointers = [low.ptr[v] for v in values]
    saved = (low.fn, low.entry, low.b, low.counters, low.fns, low.ptr, low.stack_rows)
    fn = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [PTR] * (len(values) + 2)),
                     name=f"gir_kernel{len(low.module.globals)}")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    low.fn, low.entry = fn, fn.append_basic_block("entry")
    low.b = ir.IRBuilder(low.entry)
    *inner, low.counters, low.fns = fn.args
    low.ptr, low.stack_rows = dict(low.ptr), {}
    made = {r for op in ops for r in op.results}
    for v, p in zip(values, inner):
        low.ptr[v] = p
        if v in made:
            low.stack_rows[v] = p  # slot() returns it
    try:
        for op in ops:
            low.lower_op(op)
        low.b.ret_void()
    finally:
        low.fn, low.entry, low.b, low.counters, low.fns, low.ptr, low.stack_rows = saved
    low.b.call(fn, pointers + [low.counters, low.fns])


def _copy_out(low: Lowering, returned: list[Value]) -> None:
    """The results copied into the caller's output buffers, each pointer made where its copy is
    (`Lowering.pointer_here`); with many loops (`OUTLINE_AFTER`), in calls of `COPY_CHUNK`."""
    n_args = len(low.function.args)
    if not low.outlined:
        term = low.function.body.terminator
        assert term is not None
        for i, v in enumerate(returned):  # a result may follow the run-time length (Lowering.nbytes)
            low.memcpy(low._load_ptr(low.buffers, n_args + i), low.pointer_here(v), low.nbytes(v, term))
        return
    for start in range(0, len(returned), COPY_CHUNK):
        chunk = returned[start:start + COPY_CHUNK]
        sources = [low.pointer_here(v) for v in chunk]
        fn = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [PTR] * (len(chunk) + 1)),
                         name=f"gir_copy_out{start}")
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        buffers, *inner = fn.args
        copy = low.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        for i, (v, src) in enumerate(zip(chunk, inner)):
            out = b.load(b.gep(buffers, [ir.Constant(I64, n_args + start + i)], source_etype=PTR), typ=PTR)
            b.call(copy, [out, src, ir.Constant(I64, v.tensor_type.nbytes() or 0), ir.Constant(I1, 0)])
        b.ret_void()
        low.b.call(fn, [low.buffers] + sources)
