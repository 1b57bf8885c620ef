"""Matmul: through BLAS on the path the schedule chose for each call site (mkl, openblas, their
packed or copied weights, gir's own packed kernel), an integer one as a loop nest; the
weights packed before a scan's loop; every external call through the table `fns`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llvmlite import ir

from ....analysis.lengths import NotALength
from ....errors import GirError
from ....ir.core import Operation, Value
from ....ir.types import TensorType
from .. import blas, externals, packed_gemm
from ..layout import GemmSite
from ..llvm_types import I8, I32, I64, LLVM_TYPES, PTR, _static, _strides
from ..schedule.gemms import gemm_operand as _gemm_operand
from ..schedule.gemms import is_gemm as _is_gemm
from ..schedule.gemms import packable as _packable
from .elementwise import _bcast_strides
from .lengths import _refuse_length

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


def lower_matmul(low: Lowering, op: Operation) -> None:
    a_val, b_val = op.operands
    ta_t, tb_t = a_val.tensor_type, b_val.tensor_type
    out_shape = _static(op.result.tensor_type, op)
    _static(ta_t, op)
    _static(tb_t, op)
    sizes = _gemm_sizes(low, op)
    low.slot(op.result, op)
    dtype = op.result.tensor_type.dtype
    if op in low.worker.deferred:  # computed by the worker during its scan: wait for it
        low.worker.wait_for(op)
        return
    if not _is_gemm(op):
        _refuse_length(low, op, "an integer matmul")
        return _naive_matmul(low, op)
    a_src, ta = _gemm_operand(a_val)
    b_src, tb = _gemm_operand(b_val)
    k = ta_t.shape[-1]
    n = tb_t.shape[-1]
    pa, pb, pc = low.ptr[a_src], low.ptr[b_src], low.ptr[op.result]
    if tb_t.rank == 2:  # one GEMM: the batch dims of A fold into M (A is contiguous)
        m = math.prod(out_shape[:-1])
        if ta and ta_t.rank != 2:
            raise GirError("a transposed batched left operand is not supported", op.loc)
        _emit_gemm(low, op, dtype, m, n, k, ta, tb, pa, pb, pc, _packable(op), sizes=sizes)  # type: ignore[arg-type]
        return
    # Batched right operand: one GEMM per batch element, broadcasting batch dims.
    _refuse_length(low, op, "a batched matmul")
    batch = out_shape[:-2]
    m = out_shape[-2]
    a_batch = _bcast_strides(TensorType(tuple(ta_t.shape[:-2]), dtype), batch) if ta_t.rank > 2 else [0] * len(batch)
    b_batch = _bcast_strides(TensorType(tuple(tb_t.shape[:-2]), dtype), batch)
    a_mat, b_mat, c_mat = m * k, k * n, m * n  # type: ignore[operator]
    with low.loop_nest(batch) as idx:
        pa_i = low.elem_ptr(pa, dtype, low.b.mul(low.linear(idx, a_batch), ir.Constant(I64, a_mat)))
        pb_i = low.elem_ptr(pb, dtype, low.b.mul(low.linear(idx, b_batch), ir.Constant(I64, b_mat)))
        pc_i = low.elem_ptr(pc, dtype, low.b.mul(low.linear(idx, _strides(batch)), ir.Constant(I64, c_mat)))
        _emit_gemm(low, op, dtype, m, n, k, ta, tb, pa_i, pb_i, pc_i, False)  # type: ignore[arg-type]


def _naive_matmul(low: Lowering, op: Operation) -> None:
    """Integer matmul (no BLAS): a loop nest over the batch, rows and columns, K innermost."""
    a, b = op.operands
    ta, tb = _static(a.tensor_type, op), _static(b.tensor_type, op)
    out_shape = _static(op.result.tensor_type, op)
    batch, m, n, k = out_shape[:-2], ta[-2], tb[-1], ta[-1]
    dtype = op.result.tensor_type.dtype
    ty = LLVM_TYPES[dtype]
    a_batch = [s * m * k for s in _bcast_strides(TensorType(ta[:-2], dtype), batch)]
    b_batch = [s * k * n for s in _bcast_strides(TensorType(tb[:-2], dtype), batch)]
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        cell = low.b.alloca(ty)
    with low.loop_nest(batch + (m, n)) as idx:
        *bi, i, j = idx
        a_row = low.b.add(low.linear(bi, a_batch), low.b.mul(i, ir.Constant(I64, k)))
        b_col = low.b.add(low.linear(bi, b_batch), j)
        low.b.store(ir.Constant(ty, 0), cell)
        with low.for_range(k, "kk") as kk:
            x = low.load(low.ptr[a], dtype, low.b.add(a_row, kk))
            y = low.load(low.ptr[b], dtype, low.b.add(b_col, low.b.mul(kk, ir.Constant(I64, n))))
            low.b.store(low.b.add(low.b.load(cell, typ=ty), low.b.mul(x, y)), cell)
        low.store(low.b.load(cell, typ=ty), low.ptr[op.result], dtype, low.linear(idx, _strides(out_shape)))


def _gemm_sizes(low: Lowering, op: Operation) -> tuple | None:
    """(m, n, k) of op's GEMM at this call's length, where one of them follows it (else None)."""
    if low.lengths is None or not any(low.follows_length(v) for v in (*op.operands, op.result)):
        return None
    a, b = (low.shape(v, op) for v in op.operands)
    out = low.shape(op.result, op)
    return (low.product(out[:-1]) if len(b) == 2 else out[-2]), b[-1], a[-1]


def call_external(low: Lowering, slot: str, sig: ir.FunctionType, args: list[ir.Value]) -> ir.Value:
    """Calls external `slot` through the table `fns` (module docstring); the layout lists the
    slots the code uses, so the runtime refuses to run it where one of them is missing."""
    if slot not in low.layout.externals:
        low.layout.externals.append(slot)
    cell = low.b.gep(low.fns, [ir.Constant(I64, externals.index(slot))], source_etype=PTR)
    return low.b.call(low.b.load(cell, typ=sig.as_pointer()), args)


def _emit_gemm(low: Lowering, op: Operation, dtype: str, m: int, n: int, k: int, ta: bool, tb: bool,
               pa: ir.Value, pb: ir.Value, pc: ir.Value, packable: bool, beta: float = 0.0,
               counter: int = 0, site: str | None = None, sizes: tuple | None = None) -> None:
    """C = A B (+ C when beta is 1) through the path the schedule chose for the call site (op's
    id, or site: a worker's chunk); counts the call in counters[counter]. sizes: (m, n, k) at
    this call's length, some computed at run time (`_gemm_sizes`); m, n, k are the sizes at the
    representative length, as the schedule saw them."""
    path = low.path(site if site is not None else low.ids[op])
    low.layout.gemms.append(GemmSite(f"{op.loc}", path, dtype, m, n, k, ta, tb))
    fty = LLVM_TYPES[dtype]
    s = "s" if dtype == "f32" else "d"
    i32 = lambda x: ir.Constant(I32, x) if isinstance(x, int) else low.b.trunc(x, I32)  # noqa: E731
    if sizes is not None:
        if path not in ("mkl", "openblas"):  # the packed paths lay weights out by static sizes
            raise NotALength(f"the GEMM at {op.loc} takes path {path}, which needs static sizes")
        m, n, k = sizes
    lda = m if ta else k
    ldb = k if tb else n
    t_a = blas.CBLAS_TRANS if ta else blas.CBLAS_NO_TRANS
    t_b = blas.CBLAS_TRANS if tb else blas.CBLAS_NO_TRANS
    low.count(counter)
    if path == "mkl":
        sig = ir.FunctionType(ir.VoidType(), [I32] * 6 + [fty, PTR, I32, PTR, I32, fty, PTR, I32])
        call_external(low, f"mkl_{s}gemm", sig,
                    [i32(blas.CBLAS_ROW_MAJOR), i32(t_a), i32(t_b), i32(m), i32(n), i32(k),
                                                  ir.Constant(fty, 1.0), pa, i32(lda), pb, i32(ldb),
                                                  ir.Constant(fty, beta), pc, i32(n)])
        return
    if path == "mkl-packed":
        packed = low.pack_slots.get(op)
        assert packed is not None, "the enclosing scan packs this weight before its loop"
        sig = ir.FunctionType(ir.VoidType(), [I32] * 6 + [PTR, I32, PTR, I32, fty, PTR, I32])
        call_external(low, f"mkl_{s}gemm_compute", sig,
                    [i32(blas.CBLAS_ROW_MAJOR), i32(t_a), i32(blas.CBLAS_PACKED), i32(m), i32(n), i32(k), pa, i32(lda),
                    packed, i32(ldb), ir.Constant(fty, 0.0), pc, i32(n)])
        return
    if path == "gir-packed":  # gir's own kernel on the weight packed before the loop
        return _gir_packed_gemm(low, op, packed_gemm.Shape(dtype, m, n, k, ta, tb, beta), pa, pc)
    if path == "openblas-copy":  # the weight, copied to the other orientation before the loop
        copied = low.pack_slots.get(op)
        assert copied is not None, "the enclosing scan copies this weight before its loop"
        pb, tb = copied, not tb
        ldb = k if tb else n
    # OpenBLAS, Fortran ABI, column-major: C^T = B^T A^T, every argument by reference; its
    # integers are 64-bit in NumPy's ILP64 build (blas.openblas()).
    fint = ir.IntType(low.schedule.openblas_int_bits)
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        cells = [low.b.alloca(I8), low.b.alloca(I8)] + [low.b.alloca(fint) for _ in range(6)] + \
                [low.b.alloca(fty), low.b.alloca(fty)]
    tra, trb, cn, cm, ck, cldb, clda, cldc, one, zero = cells
    for cell, value in ((tra, ord("T" if tb else "N")), (trb, ord("T" if ta else "N"))):
        low.b.store(ir.Constant(I8, value), cell)
    for cell, value in ((cn, n), (cm, m), (ck, k), (cldb, ldb), (clda, lda), (cldc, n)):
        low.b.store(ir.Constant(fint, value) if isinstance(value, int) else low.b.sext(value, fint)
                    if fint.width > 64 else low.b.trunc(value, fint) if fint.width < 64 else value, cell)
    low.b.store(ir.Constant(fty, 1.0), one)
    low.b.store(ir.Constant(fty, beta), zero)
    sig = ir.FunctionType(ir.VoidType(), [PTR] * 13)
    call_external(low, f"ob_{s}gemm", sig, [tra, trb, cn, cm, ck, one, pb, cldb, pa, clda, zero, pc, cldc])


def _pack_weights(low: Lowering, scan: Operation) -> None:
    """Before a scan's loop: pack (mkl-packed) or copy to the other orientation (openblas-copy)
    the loop-invariant weight of every GEMM in its body that takes one of those paths, and of
    every GEMM in a nested loop whose weight is invariant in this scan too (a checkpointed
    scan's segments run inner scans over the same weight: packed once per call, not once per
    segment). GEMMs with the same weight, shape and path share one pack."""
    for op in _loop_gemms(scan):
        if op in low.loop_paths:  # an enclosing scan packed it already
            continue
        a_src, ta = _gemm_operand(op.operands[0])
        b_src, tb = _gemm_operand(op.operands[1])
        dtype = op.result.tensor_type.dtype
        m = math.prod(_static(op.result.tensor_type, op)[:-1])
        k, n = op.operands[1].tensor_type.shape  # the (transposed) weight as the product sees it
        choice = low.schedule.gemm(low.ids[op])
        assert choice is not None and choice.loop_weight, f"the schedule has no loop weight for {op.loc}"
        path = choice.path_for(low.quick)
        low.loop_paths[op] = path
        if path not in ("mkl-packed", "gir-packed", "openblas-copy"):
            continue
        key = (path, b_src, dtype, m, n, k, ta, tb)
        shared = low.shared_packs.get(key)
        if shared is not None:
            low.pack_slots[op] = shared
            continue
        if path == "mkl-packed":
            low.pack_slots[op] = _mkl_pack(low, dtype, m, n, k, tb, low.ptr[b_src], choice.pack_bytes)  # type: ignore[arg-type]
        elif path == "gir-packed":
            low.pack_slots[op] = _gir_pack(low, packed_gemm.Shape(dtype, m, n, k, ta, tb), low.ptr[b_src])  # type: ignore[arg-type]
        else:
            low.pack_slots[op] = _transpose_copy(low, dtype, *((n, k) if tb else (k, n)), low.ptr[b_src])  # type: ignore[arg-type]
        low.shared_packs[key] = low.pack_slots[op]


def _loop_gemms(scan: Operation) -> list[Operation]:
    """The GEMMs whose weight _pack_weights packs before scan's loop: those of its body with a
    weight invariant in it, and those of nested loops whose weight is invariant in scan too."""
    found = []
    for op in scan.walk():
        if op is scan or not _is_gemm(op) or not _packable(op):
            continue
        weight = op.operands[1]
        if op.parent_op is scan or all(_defined_outside(v, scan) for v in (weight, _gemm_operand(weight)[0])):
            found.append(op)
    return found


def _defined_outside(v: Value, scan: Operation) -> bool:
    owner = v.defining_op
    if owner is not None:
        return not scan.is_ancestor_of(owner)
    block_owner = v.defining_block.parent_op if v.defining_block is not None else None
    return block_owner is None or not scan.is_ancestor_of(block_owner)


def _mkl_pack(low: Lowering, dtype: str, m: int, n: int, k: int, tb: bool, src: ir.Value, nbytes: int) -> ir.Value:
    dest = low.alloc_pinned(nbytes)
    fty = LLVM_TYPES[dtype]
    s = "s" if dtype == "f32" else "d"
    sig = ir.FunctionType(ir.VoidType(), [I32] * 6 + [fty, PTR, I32, PTR])
    i32 = lambda x: ir.Constant(I32, x)  # noqa: E731
    low.count(1)
    call_external(low, f"mkl_{s}gemm_pack", sig,
                [i32(blas.CBLAS_ROW_MAJOR), i32(blas.CBLAS_B_MATRIX),
                i32(blas.CBLAS_TRANS if tb else blas.CBLAS_NO_TRANS), i32(m), i32(n), i32(k),
                ir.Constant(fty, 1.0), src, i32(k if tb else n), dest])
    return dest


def _gir_pack(low: Lowering, shape: packed_gemm.Shape, src: ir.Value) -> ir.Value:
    """The weight at src packed into panels for gir's kernel (packed_gemm.py), in pinned memory.
    Counted as a pack call."""
    dest = low.alloc_pinned(shape.packed_bytes)
    low.count(1)
    sizes = [ir.Constant(I64, shape.n), ir.Constant(I64, shape.k)]
    low.b.call(packed_gemm.emit_pack(low.module, shape), [src, dest, *sizes])
    return dest


def _gir_packed_gemm(low: Lowering, op: Operation, shape: packed_gemm.Shape, pa: ir.Value, pc: ir.Value) -> None:
    """C = A times op's weight as `_gir_pack` packed it before the loop: the row blocks split
    across OpenBLAS's pool (`_Split.dispatch`)."""
    packed = low.pack_slots.get(op)
    assert packed is not None, "the enclosing scan packs this weight before its loop"
    task = packed_gemm.emit_task(low.module, shape, _level1_unit(low))
    low.team.dispatch(task, shape.blocks, [pc, pa, packed])
    threads = ("the calling thread (one row block)" if shape.blocks < 2
               else "the calling thread (OpenBLAS's blas_level1_thread is not usable here)"
               if low.schedule.level1 is None
               else "both, through blas_level1_thread, while OpenBLAS is set to two or more threads at run time")
    low.layout.append_note("packed_gemm",
        {"gemm": f"{op.loc}", "shape": f"{shape.m}x{shape.k} @ {shape.k}x{shape.n}", "row_blocks": shape.blocks,
         "threads": threads})


def _level1_unit(low: Lowering) -> int:
    """The bytes OpenBLAS advances a level-1 routine's `b` by per row (1 where its entry is not
    used: the task then runs all rows from 0)."""
    entry = low.schedule.level1
    return entry[1] if entry is not None else 1


def _transpose_copy(low: Lowering, dtype: str, rows: int, cols: int, src: ir.Value) -> ir.Value:
    """A new pinned cols x rows matrix: the transpose of the row-major rows x cols one at src,
    through OpenBLAS's ?omatcopy_ (Fortran ABI: column-major, so the source is a cols x rows
    matrix with leading dimension cols). Counted as a pack call."""
    fty = LLVM_TYPES[dtype]
    dest = low.alloc_pinned(rows * cols * (4 if dtype == "f32" else 8))
    fint = ir.IntType(low.schedule.openblas_int_bits)
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        order, trans, c_rows, c_cols, lda, ldb, alpha = [low.b.alloca(I8), low.b.alloca(I8)] + \
            [low.b.alloca(fint) for _ in range(4)] + [low.b.alloca(fty)]
    low.b.store(ir.Constant(I8, ord("C")), order)
    low.b.store(ir.Constant(I8, ord("T")), trans)
    for cell, value in ((c_rows, cols), (c_cols, rows), (lda, cols), (ldb, rows)):
        low.b.store(ir.Constant(fint, value), cell)
    low.b.store(ir.Constant(fty, 1.0), alpha)
    low.count(1)
    s = "s" if dtype == "f32" else "d"
    call_external(low, f"ob_{s}omatcopy", ir.FunctionType(ir.VoidType(), [PTR] * 9),
                [order, trans, c_rows, c_cols, alpha, src, lda, dest, ldb])
    return dest
