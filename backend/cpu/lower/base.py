"""IR -> one LLVM module per entry function (llvmlite, opaque pointers).

The generated function is `void gir_main(ptr buffers, ptr counters, ptr fns)`:
`buffers` holds the argument pointers, then the output pointers, then the arena and the pinned
area (packed weights, which never move); `counters` is i64[4] (GEMM calls, pack calls, an
error flag, unused); `fns` is the table of external functions (`externals.SLOTS` order: BLAS,
syscall, sched_yield, the BLAS thread setters), filled by the runtime. Every external call loads
its pointer from `fns`, so object code holds no process address and names no symbol beyond
libc's and libm's: it is cached on disk, and links as it is into a shared library that a
cache hit loads without LLVM (runtime.py).

Storage: every value that needs memory gets a 64-byte aligned slot in the arena (one per value;
the memory plan of memplan can replace this layout). Code that serves every length (one `?`
dim read at run time, analysis/lengths.py) takes two more `buffers` entries: a pointer to the
length T (an i64) and the *length area*, where every value whose leading dim follows T has a
block of its own, placed per call (`Lowering.length_slot`); its loops, trip counts and GEMM
sizes are computed from T (`Lowering.shape`). Views need none: `reshape`, contiguous
`slice`, `index`, sequence elements of a scan, `transfer`. Values inside `fused` ops live in
registers. A `transpose` read only by matmuls is folded into the GEMM's transpose flag.

Lowering is a dispatch table from op kind to one function per op family; every error names
the op and its source location. It decides nothing: the BLAS family, each GEMM's path, the
packed weights, the split loops and the two-core windows come from the CpuSchedule
(schedule/), so the module is a pure function of (Function, MemoryPlan, CpuSchedule).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ....analysis.lengths import Extent, LengthDims, NotALength
from ....analysis.memory.plan import MemoryPlan
from ....analysis.memory.planner import plan_memory
from ....errors import GirError
from ....ir import scalar
from ....ir.core import Function, Operation, Value
from ....ir.interpreter import empty_reduction
from ....ir.loops import LoopView
from ....ir.ops import REGISTRY, reduction_axes
from ....ir.spec import OpSpec, dispatch_by_fact, view_source
from ....ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType
from .. import blas, externals, ir_loops, mathlib, overlap, packed_gemm, team
from ..layout import GemmSite, Layout, LengthLayout
from ..llvm_types import ALIGN, I1, I8, I32, I64, LLVM_TYPES, MEM_TYPES, PTR, _i64, _static, _strides
from ..schedule import CpuSchedule, op_ids
from ..schedule.gemms import gemm_operand as _gemm_operand
from ..schedule.gemms import is_gemm as _is_gemm
from ..schedule.gemms import packable as _packable


def _memory_plan(function: Function, plan: MemoryPlan | None, schedule: CpuSchedule) -> MemoryPlan | None:
    """The plan to lay the arena out by: the pipeline's (`memplan` pass), else memplan's default
    plan of function; None when the schedule says no arena plan (GIR_CPU_ARENA=0) or the
    function cannot be planned."""
    if not schedule.arena_plan:
        return None
    if plan is None or plan.function is not function:
        plan = plan_memory(function)
    return plan if plan.supported else None


class Lowering:
    def __init__(self, function: Function, plan: MemoryPlan | None, schedule: CpuSchedule, quick: bool = False,
                 lengths: LengthDims | None = None):
        self.function = function
        self.schedule = schedule
        """Every decision this lowering follows (schedule/): it decides nothing itself."""
        self.ids = op_ids(function)
        """op -> its id in the schedule."""
        self.lengths = lengths
        """The dims that follow the run-time length T (None: every dim is static)."""
        self.quick = quick
        """Lowered for the quick tier (tiers.py): each GEMM on its `quick_path` (no `gir-packed`
        GEMMs, whose kernels cost the quick compile ~40 ms and pay only in long runs); the -O3
        code is lowered again with them (llvm_jit.compile_code), where `schedule["quick_tier"]`
        says so."""
        self.module = ir.Module(name=f"gir.{function.name}")
        fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR])
        self.fn = ir.Function(self.module, fnty, name="gir_main")
        self.fn.args[0].add_attribute("noalias")
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.buffers, self.counters, self.fns = self.fn.args
        self.ptr: dict[Value, ir.Value] = {}
        self.root: dict[Value, Value] = {}
        """A view -> the value whose storage it lives in."""
        self.layout = Layout(schedule=_notes(schedule), provisional=[list(p) for p in schedule.provisional])
        if quick and schedule.quick_differs:
            self.layout.schedule["quick_tier"] = "BLAS paths for the GEMMs the -O3 code runs as gir-packed"
        self.pack_slots: dict[Operation, ir.Value] = {}
        self.loop_paths: dict[Operation, str] = {}
        """A GEMM with a loop-invariant weight -> its path in this code, once the scan that
        prepares its weight (the outermost it is invariant in) has done so."""
        self.shared_packs: dict[tuple, ir.Value] = {}
        """(path, weight, dtype, m, n, k, ta, tb) -> the pinned pack made for it: GEMMs on the
        same weight share it (the pack is made before the outermost loop it is invariant in,
        which comes before every later use in program order)."""
        self.gemm_family = schedule.family
        """One BLAS provider for the whole function (blas.FAMILIES)."""
        self.plan = _memory_plan(function, plan, schedule)
        """memplan's plan: values share arena memory when their lifetimes do not overlap."""
        if self.plan is not None:
            self.layout.arena_bytes = self.plan.arena_bytes
            self.layout.planned_bytes = self.plan.arena_bytes
        self.folded: set[Operation] = set()
        self.offsets: dict[Value, int] = {}
        """A value with storage of its own -> its byte offset in the arena."""
        self.stack_rows: dict[Value, ir.Value] = {}
        """A value stacked by the scan step being lowered -> its row of the stack (written in place)."""
        self.rows: tuple[ir.Value, ir.Value] | None = None
        """While a split loop's task is emitted: the range of the outer loop dimension it covers."""
        self.outlined = _kernels_to_outline(function) if lengths is None else set()
        """Top-level loop nests lowered in functions of their own (`_outline_kernels`); none in code
        for every length, whose sizes are computed from T in gir_main (an outlined function could
        not read them)."""
        self.team = _Split(self, {op for op, i in self.ids.items() if i in schedule.split_ids})
        """The split schedule: large elementwise loops of scan bodies on both cores (team.py)."""
        windows = [w for w in overlap.find_windows(function) if self.ids[w.scan] in schedule.window_ids]
        if lengths is not None and windows:  # its deferred GEMMs' chunks are laid out by static sizes
            windows = []
            self.layout.schedule["overlap"] = "off: the code serves every length (analysis/lengths.py)"
        self.worker = _Worker(self, windows)
        """Or the second thread's schedule: GEMMs deferred into a scan (overlap.py); empty if none."""
        n_args = len(function.args)
        n_outs = len(function.result_types)
        self.arena = self._load_ptr(self.buffers, n_args + n_outs)
        self.pinned = self._load_ptr(self.buffers, n_args + n_outs + 1)
        self.arg_index: dict[Value, int] = {arg: i for i, arg in enumerate(function.args)}
        """Argument -> its slot in `buffers`: its pointer is loaded again before each top-level
        op that reads it (`reload_arguments`), not once at entry."""
        for arg in function.args:
            self.ptr[arg] = self._load_ptr(self.buffers, self.arg_index[arg])
        self.length: ir.Value | None = None
        """T, read at run time (code for every length)."""
        if lengths is not None:
            self.length = self.b.load(self._load_ptr(self.buffers, n_args + n_outs + 2), typ=I64)
            self.length_area = self._load_ptr(self.buffers, n_args + n_outs + 3)
            self.length_end: ir.Value = ir.Constant(I64, 0)
            self.layout.lengths = LengthLayout(
                lengths.min_length, _length_dims(lengths, function.args), _length_dims(lengths, _results(function)),
                describe=lengths.describe())

    # -- sizes that follow the length -----------------------------------------------------------
    def extent(self, e: Extent) -> ir.Value:
        """e at this call's length (an i64)."""
        assert self.length is not None
        return self.b.add(self.b.mul(self.length, ir.Constant(I64, e.per_step)), ir.Constant(I64, e.offset))

    def follows_length(self, v: Value) -> bool:
        return self.lengths is not None and bool(self.lengths.dims(v))

    def shape(self, v: Value, op: Operation) -> tuple:
        """v's shape, a dim that follows the length as an i64 computed from it at run time."""
        shape: list = list(_static(v.tensor_type, op))
        if self.lengths is not None:
            for axis, e in self.lengths.dims(v).items():
                shape[axis] = self.extent(e)
        return tuple(shape)

    def product(self, dims: tuple | list) -> int | ir.Value:
        """The product of dims (an int when all are)."""
        out: int | ir.Value = 1
        for d in dims:
            out = _imul(self.b, out, d)
        return out

    def nbytes(self, v: Value, op: Operation) -> int | ir.Value:
        return _imul(self.b, self.product(self.shape(v, op)), v.tensor_type.numpy_dtype.itemsize)

    def length_slot(self, v: Value, op: Operation) -> ir.Value:
        """v's block in the length area, placed after the blocks before it: its offset is computed
        from T in the entry block (memplan's plan, made at one length, does not hold for others)."""
        t = v.tensor_type
        (axis, e), = self.lengths.dims(v).items()  # type: ignore[union-attr]
        if axis != 0:
            raise NotALength(f"'{op.name}' at {op.loc} would store {t} with the length in dim {axis}")
        row = t.numpy_dtype.itemsize * math.prod(_static(t, op)[1:])
        self.layout.lengths.blocks.append([e.per_step * row, e.offset * row])  # type: ignore[union-attr]
        with self.b.goto_block(self.entry):
            b = self.b
            size = b.add(b.mul(self.length, ir.Constant(I64, e.per_step * row)), ir.Constant(I64, e.offset * row))
            offset = self.length_end
            self.length_end = b.and_(b.add(b.add(offset, size), ir.Constant(I64, ALIGN - 1)), ir.Constant(I64, -ALIGN))
            p = b.gep(self.length_area, [offset], source_etype=I8)
        self.ptr[v] = p
        return p

    def scalar(self, op: Operation, dtype: str, reassociate: bool = False) -> Scalar:
        """Where one element of op is computed in dtype (gather.py builds its sums with it)."""
        return Scalar(self, op, dtype, reassociate)

    def path(self, site: str) -> str:
        """The GEMM path of a call site (an op's id, or `<id>#<chunk>`) in this tier's code."""
        choice = self.schedule.gemm(site)
        assert choice is not None, f"the schedule has no GEMM {site}"
        return choice.path_for(self.quick)

    # -- helpers ----------------------------------------------------------------------------
    def _load_ptr(self, base: ir.Value, index: int) -> ir.Value:
        return self.b.load(self.b.gep(base, [ir.Constant(I64, index)], source_etype=PTR), typ=PTR)

    def alloc(self, nbytes: int) -> ir.Value:
        """A slot in the arena (its address is arena + a constant offset)."""
        offset = self.layout.arena_bytes
        self.layout.arena_bytes += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return self.b.gep(self.arena, [ir.Constant(I64, offset)], source_etype=I8)

    def alloc_pinned(self, nbytes: int) -> ir.Value:
        offset = self.layout.pinned_bytes
        self.layout.pinned_bytes += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return self.b.gep(self.pinned, [ir.Constant(I64, offset)], source_etype=I8)

    def alias(self, view: Value, of: Value, ptr: ir.Value) -> None:
        """`view` is stored inside `of`'s storage (reshape, contiguous slice, index...)."""
        self.ptr[view] = ptr
        self.root[view] = self.root.get(of, of)

    def slot(self, v: Value, op: Operation) -> ir.Value:
        """v's storage: the row of a scan's stack it is stacked into (`in_place_stack`), its
        place in memplan's arena, or (not planned) a new slot above it."""
        t = v.tensor_type
        _static(t, op)
        direct = self.stack_rows.pop(v, None)
        if direct is not None:
            self.ptr[v] = direct
            return direct
        if self.follows_length(v):
            return self.length_slot(v, op)
        private = v.defining_op in self.worker.deferred  # written during its scan: outside the plan
        if self.plan is not None and v in self.plan.slots and not private:
            offset = self.plan.offset(v)
        else:
            offset = self.layout.arena_bytes
            self.alloc(t.nbytes() or 0)
            if private:  # memplan's plan has it born at its op; the worker writes it during the scan
                self.layout.schedule["worker_private_bytes"] = (
                    int(self.layout.schedule.get("worker_private_bytes", 0)) + self.layout.arena_bytes - offset)  # type: ignore[call-overload]
        p = self.b.gep(self.arena, [ir.Constant(I64, offset)], source_etype=I8)
        self.offsets[v] = offset
        self.ptr[v] = p
        return p

    def elem_ptr(self, base: ir.Value, dtype: str, index: ir.Value) -> ir.Value:
        return self.b.gep(base, [index], source_etype=MEM_TYPES[dtype])

    def load(self, base: ir.Value, dtype: str, index: ir.Value) -> ir.Value:
        v = self.b.load(self.elem_ptr(base, dtype, index), typ=MEM_TYPES[dtype])
        return self.b.trunc(v, I1) if dtype == "i1" else v

    def store(self, value: ir.Value, base: ir.Value, dtype: str, index: ir.Value) -> None:
        if dtype == "i1":
            value = self.b.zext(value, I8)
        self.b.store(value, self.elem_ptr(base, dtype, index))

    @contextmanager
    def for_range(self, count: int | ir.Value, name: str = "i", start: ir.Value | None = None) -> Iterator[ir.Value]:
        count = ir.Constant(I64, count) if isinstance(count, int) else count
        with ir_loops.counted(self.b, start if start is not None else ir.Constant(I64, 0), count, name) as i:
            yield i

    @contextmanager
    def loop_nest(self, shape: tuple[int, ...]) -> Iterator[list[ir.Value]]:
        """Nested loops over shape (row-major, innermost last); yields the index list."""
        with _nest(self, list(shape), []) as idx:
            yield idx

    def linear(self, idx: list[ir.Value], strides: list[int]) -> ir.Value:
        acc: ir.Value = ir.Constant(I64, 0)
        for i, s in zip(idx, strides):
            if s:
                acc = self.b.add(acc, self.b.mul(i, ir.Constant(I64, s)) if s != 1 else i)
        return acc

    def memcpy(self, dst: ir.Value, src: ir.Value, nbytes: int | ir.Value) -> None:
        fn = self.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        n = ir.Constant(I64, nbytes) if isinstance(nbytes, int) else nbytes
        self.b.call(fn, [dst, src, n, ir.Constant(I1, 0)])

    def flag_error(self, cond: ir.Value, message: str, op: Operation, value: ir.Value | None = None) -> None:
        """If cond holds at run time, record the error (the runtime raises it after the call);
        `value` (an i64), if given, replaces `{value}` in the message: the offending index."""
        self.layout.errors.append((message, op.loc))
        code = len(self.layout.errors)
        with self.b.if_then(cond, likely=False):
            p = self.b.gep(self.counters, [ir.Constant(I64, 2)], source_etype=I64)
            first = self.b.icmp_signed("==", self.b.load(p, typ=I64), ir.Constant(I64, 0))
            # The first error raised, as the interpreter stops at it (a gather's gradient would flag again).
            with self.b.if_then(first):
                self.b.store(ir.Constant(I64, code), p)
                if value is not None:
                    self.b.store(value, self.b.gep(self.counters, [ir.Constant(I64, 3)], source_etype=I64))

    def row_number(self, i: Value, n: ir.Value, rows: int | ir.Value, op: Operation, what: str = "index") -> ir.Value:
        """Element n of the integer tensor i as an i64 row number; outside [0, rows) it flags
        the error, worded as the interpreter's (ir/ops.py), and row 0 is read instead."""
        k = self.load(self.ptr[i], i.tensor_type.dtype, n)
        k = self.b.sext(k, I64) if k.type != I64 else k
        bad = self.b.or_(self.b.icmp_signed("<", k, ir.Constant(I64, 0)),
                         self.b.icmp_signed(">=", k, _i64(rows)))
        of = f"of {rows}" if isinstance(rows, int) else "(the sequence's length)"
        self.flag_error(bad, f"'{op.name}' failed at run time: {what} {{value}} is out of range for a leading dim "
                        f"{of}", op, k)
        return self.b.select(bad, ir.Constant(I64, 0), k)

    def count(self, slot: int) -> None:
        p = self.b.gep(self.counters, [ir.Constant(I64, slot)], source_etype=I64)
        self.b.store(self.b.add(self.b.load(p, typ=I64), ir.Constant(I64, 1)), p)

    def reload_arguments(self, op: Operation) -> None:
        """Loads the pointers of the arguments op reads (its regions included) right before it.
        Loaded once at entry, each would live across the whole function: a program of thousands
        of ops on thousands of arguments (a pytree of small leaves) kept thousands of pointers
        live at once, and LLVM's register allocation grew with their product (8,000 leaves: most
        of 45 s). Reloaded per top-level op, each lives only through the op's code."""
        reads = list(op.operands) + [v for r in op.regions for inner in r.block.walk() for v in inner.operands]
        for v in reads:
            i = self.arg_index.get(v)
            if i is not None:
                self.ptr[v] = self._load_ptr(self.buffers, i)

    def pointer_here(self, v: Value) -> ir.Value:
        """v's storage, its address computed again at the builder's position where it can be (an
        argument, a slot of the arena), so that the pointer made at v's op need not stay live to
        here: the results copied out at the end of a program of thousands of small ops were
        thousands of pointers live across all of it (see `reload_arguments`)."""
        i = self.arg_index.get(v)
        if i is not None:
            return self._load_ptr(self.buffers, i)
        offset = self.offsets.get(v)
        if offset is not None:
            return self.b.gep(self.arena, [ir.Constant(I64, offset)], source_etype=I8)
        return self.ptr[v]

    # -- driver -----------------------------------------------------------------------------
    def block(self, block: object) -> list[Value]:
        pending: list[Operation] = []  # outlined loop nests not emitted yet: consecutive ones share a function
        for op in block:  # type: ignore[attr-defined]
            if op in self.folded:
                continue
            if op in self.outlined:  # top-level ops only
                pending.append(op)
                if len(pending) == KERNELS_PER_FUNCTION:
                    _outline_kernels(self, pending)
                    pending = []
                continue
            if pending:
                _outline_kernels(self, pending)
                pending = []
            if op.spec.terminator:
                return list(op.operands)
            if block is self.function.body:
                self.reload_arguments(op)
            if op in self.team.split:
                self.team.run(op)
                continue
            self.lower_op(op)
        return []

    def lower_op(self, op: Operation) -> None:
        lower = LOWER.get(op.name)
        if lower is None:
            raise GirError(f"the CPU backend cannot compile '{op.name}'", op.loc)
        if lower not in LENGTH_AWARE:
            _refuse_length(self, op, "this op")
        try:
            lower(self, op)
        except GirError:
            raise
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            raise GirError(f"the CPU backend failed on '{op.name}': {type(e).__name__}: {e}", op.loc) from e


def _imul(b: ir.IRBuilder, x: int | ir.Value, y: int | ir.Value) -> int | ir.Value:
    """x * y: an int when both are, else an i64 computed at run time."""
    if isinstance(x, int) and isinstance(y, int):
        return x * y
    if isinstance(x, int) and x == 1:
        return y
    if isinstance(y, int) and y == 1:
        return x
    return b.mul(_i64(x), _i64(y))


def _iadd(b: ir.IRBuilder, x: int | ir.Value, y: int | ir.Value) -> int | ir.Value:
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    return b.add(_i64(x), _i64(y))


def _results(function: Function) -> list[Value]:
    """The values function returns, in order."""
    term = function.body.terminator
    return list(term.operands) if term is not None else []


def _length_dims(lengths: LengthDims, values: Sequence[Value]) -> list[list[int]]:
    """[index, axis, per_step, offset] of each dim of values that follows the length."""
    return [[i, axis, e.per_step, e.offset] for i, v in enumerate(values) for axis, e in lengths.dims(v).items()]


def _notes(schedule: CpuSchedule) -> dict[str, object]:
    """Layout.schedule (`fn.stats.schedule`) as the schedule starts it: its reasons, then what
    the lowering counts."""
    return {**dict(schedule.notes), "stack_copies_avoided": 0, "stack_copies": 0}


@contextmanager
def _nest(low: Lowering, shape: list, idx: list[ir.Value]) -> Iterator[list[ir.Value]]:
    if not shape:
        yield idx
        return
    # In a split loop's task (_Split), the op's outer loop covers this call's rows only (taken
    # once: another loop the lowering might emit covers its whole range).
    start, stop = None, shape[0]
    if low.rows is not None and not idx:
        (start, stop), low.rows = low.rows, None
    with low.for_range(stop, f"d{len(idx)}", start) as i, _nest(low, shape[1:], idx + [i]) as inner:
        yield inner


# ---------------------------------------------------------------------------------------------
# Elementwise (fused) loops


def _bcast_strides(t: TensorType, out_shape: tuple[int, ...]) -> list[int]:
    shape = tuple(t.shape)
    strides = _strides(shape)
    lead = len(out_shape) - len(shape)
    out = [0] * lead
    for d, s in zip(shape, strides):
        out.append(0 if d == 1 else s)
    return out


@dataclass
class Scalar:
    """Where one element of an op is computed: what the primitive emitters see."""

    low: Lowering
    op: Operation
    dtype: str
    """The compute dtype (ir/scalar.py): of the literals and of the primitives' operands."""
    reassociate: bool = False
    """A float `add` may be reassociated (a sum reduction's accumulator: so that it vectorises)."""

    @property
    def b(self) -> ir.IRBuilder:
        return self.low.b

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def literal(self, value: float) -> ir.Value:
        return ir.Constant(LLVM_TYPES[self.dtype], float(value) if self.is_float else int(value))

    def primitive(self, name: str, args: list[ir.Value]) -> ir.Value:
        return PRIMITIVES[name](self, args)

    def build(self, expr: scalar.Expr, args: list[ir.Value]) -> ir.Value:
        return scalar.build(expr, args, self.literal, self.primitive)


def _scalar(low: Lowering, op: Operation, args: list[ir.Value]) -> ir.Value:
    """One element of op from its operands' elements (ir/scalar.py describes every op)."""
    if op.spec.splat is not None:  # a constant: every element is one scalar
        follows = low.lengths.constants.get(op.result) if low.lengths is not None else None
        if follows is not None:
            return _length_constant(low, op, *follows)
        value = op.spec.splat(op)
        if value is None:
            raise GirError(f"the CPU backend has no scalar for '{op.name}' (not one value for every element)", op.loc)
        return Scalar(low, op, op.result.tensor_type.dtype).literal(value)
    semantics = op.spec.scalar
    dtype = semantics.compute_dtype(op) if semantics is not None else op.result.tensor_type.dtype
    expr = semantics.expr(dtype) if semantics is not None else None
    if expr is None:
        raise GirError(f"the CPU backend has no scalar code for '{op.name}' on {dtype}", op.loc)
    return Scalar(low, op, dtype).build(expr, args)


def _length_constant(low: Lowering, op: Operation, e: Extent, reciprocal: bool) -> ir.Value:
    """A splat constant that follows the length (analysis/lengths.py): e at T, or 1/e, computed
    in double and rounded to the constant's dtype, as its literal was."""
    dtype = op.result.tensor_type.dtype
    if low.fn.name != "gir_main":  # T is read in gir_main only (not in a split loop's task)
        raise NotALength(f"the constant at {op.loc} follows the length in a loop split across two cores")
    n = low.extent(e)
    if dtype in INT_DTYPES and not reciprocal:
        return low.b.trunc(n, LLVM_TYPES[dtype]) if dtype != "i64" else n
    if dtype not in FLOAT_DTYPES:
        raise NotALength(f"a {dtype} constant at {op.loc} follows the length")
    f = low.b.sitofp(n, ir.DoubleType())
    if reciprocal:
        f = low.b.fdiv(ir.Constant(ir.DoubleType(), 1.0), f)
    return low.b.fptrunc(f, LLVM_TYPES[dtype]) if dtype == "f32" else f


def _compare(kind: str) -> Callable[[Scalar, list[ir.Value]], ir.Value]:
    def emit(s: Scalar, a: list[ir.Value]) -> ir.Value:
        if s.is_float:  # false on nan, but != is true on nan
            return s.b.fcmp_unordered(kind, *a) if kind == "!=" else s.b.fcmp_ordered(kind, *a)
        # i1 orders false < true (NumPy); as a signed 1-bit integer true would be -1.
        return s.b.icmp_unsigned(kind, *a) if s.dtype == "i1" else s.b.icmp_signed(kind, *a)

    return emit


def _floordiv(s: Scalar, a: list[ir.Value]) -> ir.Value:
    """NumPy's floor division. Never traps: a zero divisor is flagged (the runtime raises, as the
    interpreter does) and the division runs on 1 instead; x // -1 is -x (wrapping: the minimum
    // -1 is the minimum, where the hardware's division would trap)."""
    b = s.b
    x, y = a
    zero, one = ir.Constant(x.type, 0), ir.Constant(x.type, 1)
    by_zero = b.icmp_signed("==", y, zero)
    by_minus_one = b.icmp_signed("==", y, ir.Constant(x.type, -1))
    s.low.flag_error(by_zero, "integer division by zero", s.op)
    safe_y = b.select(b.or_(by_zero, by_minus_one), one, y)
    q = b.sdiv(x, safe_y)
    r = b.srem(x, safe_y)
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                                                 b.icmp_signed("<", safe_y, zero)))
    q = b.select(adjust, b.sub(q, one), q)
    q = b.select(by_minus_one, b.neg(x), q)
    return b.select(by_zero, zero, q)


def _cast(s: Scalar, a: list[ir.Value]) -> ir.Value:
    b = s.b
    src, dst = s.dtype, s.op.result.tensor_type.dtype
    x, to = a[0], LLVM_TYPES[dst]
    if src == dst:
        return x
    if src in FLOAT_DTYPES and dst in FLOAT_DTYPES:
        return b.fpext(x, to) if dst == "f64" else b.fptrunc(x, to)
    if src in FLOAT_DTYPES:
        return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0)) if dst == "i1" else b.fptosi(x, to)
    if dst in FLOAT_DTYPES:
        return b.uitofp(x, to) if src == "i1" else b.sitofp(x, to)
    if dst == "i1":
        return b.icmp_signed("!=", x, ir.Constant(x.type, 0))
    if src == "i1":
        return b.zext(x, to)
    return b.sext(x, to) if to.width > x.type.width else b.trunc(x, to)


def _fadd(s: Scalar, a: list[ir.Value]) -> ir.Value:
    return s.b.fadd(*a, flags=("reassoc", "nsz") if s.reassociate else ())


PRIMITIVES: dict[str, Callable[[Scalar, list[ir.Value]], ir.Value]] = {
    "add": lambda s, a: _fadd(s, a) if s.is_float else s.b.add(*a),
    "sub": lambda s, a: s.b.fsub(*a) if s.is_float else s.b.sub(*a),
    "mul": lambda s, a: s.b.fmul(*a) if s.is_float else s.b.mul(*a),
    "div": lambda s, a: s.b.fdiv(*a),
    "neg": lambda s, a: s.b.fneg(*a) if s.is_float else s.b.neg(*a),
    "floordiv": _floordiv,
    **{name: _compare(kind) for name, kind in zip(scalar.COMPARISONS, ("<", "<=", ">", ">=", "==", "!="))},
    "and": lambda s, a: s.b.and_(*a),
    "or": lambda s, a: s.b.or_(*a),
    "select": lambda s, a: s.b.select(*a),
    # float32 exp and tanh are vectorisable polynomials (mathlib.py); float64 calls libm.
    "exp": lambda s, a: mathlib.exp(s.b, *a),
    "log": lambda s, a: mathlib.log(s.b, *a),
    "tanh": lambda s, a: mathlib.tanh(s.b, *a),
    "sqrt": lambda s, a: mathlib.sqrt(s.b, *a),
    "pow": lambda s, a: mathlib.pow(s.b, *a),
    "abs": lambda s, a: mathlib.fabs(s.b, *a),
    "sin": lambda s, a: mathlib.sin(s.b, *a),
    "cos": lambda s, a: mathlib.cos(s.b, *a),
    "cast": _cast,
}
"""ir/scalar.py's primitive -> its LLVM code."""


def lower_fused(low: Lowering, op: Operation) -> None:
    body = op.body
    outs = op.results
    shape = low.shape(outs[0], op) if outs else ()
    for r in outs:
        low.slot(r, op)
    term = body.terminator
    assert term is not None
    with low.loop_nest(shape) as idx:
        vals: dict[Value, ir.Value] = {}
        for arg, outer in zip(body.args, op.operands):
            t = outer.tensor_type
            vals[arg] = low.load(low.ptr[outer], t.dtype, low.linear(idx, _bcast_strides(t, shape)))
        for inner in body:
            if inner is term:
                break
            vals[inner.result] = _scalar(low, inner, [vals[v] for v in inner.operands])
        out_index = low.linear(idx, _strides(shape))
        for r, v in zip(outs, term.operands):
            low.store(vals[v], low.ptr[r], r.tensor_type.dtype, out_index)


def lower_elementwise(low: Lowering, op: Operation) -> None:
    """An elementwise op outside a fused group: a loop of one op."""
    shape = low.shape(op.result, op)
    low.slot(op.result, op)
    with low.loop_nest(shape) as idx:
        args = [low.load(low.ptr[v], v.tensor_type.dtype, low.linear(idx, _bcast_strides(v.tensor_type, shape)))
                for v in op.operands]
        low.store(_scalar(low, op, args), low.ptr[op.result], op.result.tensor_type.dtype,
                  low.linear(idx, _strides(shape)))


def lower_constant(low: Lowering, op: Operation) -> None:
    t = op.result.tensor_type
    shape = low.shape(op.result, op)
    if op.operands:  # `fill`: a scalar known at run time
        src = low.ptr[op.operands[0]]
        low.slot(op.result, op)
        v = low.load(src, t.dtype, ir.Constant(I64, 0))
        with low.for_range(low.product(shape)) as i:
            low.store(v, low.ptr[op.result], t.dtype, i)
        return
    if op.spec.splat is None or op.spec.splat(op) is None:  # a list literal: a global constant
        data = np.asarray(op.attrs["value"], dtype=t.numpy_dtype).reshape(-1)
        ty = ir.ArrayType(MEM_TYPES[t.dtype], data.size)
        const = ir.Constant(ty, [ir.Constant(MEM_TYPES[t.dtype], float(x) if t.is_float else int(x)) for x in data])
        g = ir.GlobalVariable(low.module, ty, name=f"const.{len(low.module.globals)}")
        g.global_constant = True
        g.initializer = const
        g.linkage = "internal"
        low.ptr[op.result] = g
        return
    low.slot(op.result, op)
    scalar = _scalar(low, op, [])
    with low.for_range(low.product(shape)) as i:
        low.store(scalar, low.ptr[op.result], t.dtype, i)


# ---------------------------------------------------------------------------------------------
# Layout: views where possible, strided copies where not


def _copy(low: Lowering, dst: ir.Value, dst_strides: list[int], src: ir.Value, src_strides: list[int],
          shape: tuple, dtype: str) -> None:
    with low.loop_nest(shape) as idx:
        low.store(low.load(src, dtype, low.linear(idx, src_strides)), dst, dtype, low.linear(idx, dst_strides))


def lower_view(low: Lowering, op: Operation) -> None:
    low.alias(op.result, op.operands[0], low.ptr[op.operands[0]])


def lower_transpose(low: Lowering, op: Operation) -> None:
    if view_source(op) is not None:
        low.ptr[op.result] = low.ptr[op.operands[0]]  # folded into the GEMM's flags (see _gemm_operand)
        return
    src_t = op.operands[0].tensor_type
    out_shape = low.shape(op.result, op)
    perm = op.attrs["perm"] or list(range(src_t.rank))[::-1]
    src_strides = _strides(tuple(src_t.shape))
    low.slot(op.result, op)
    _copy(low, low.ptr[op.result], _strides(out_shape), low.ptr[op.operands[0]], [src_strides[p] for p in perm],
          out_shape, src_t.dtype)


def lower_broadcast(low: Lowering, op: Operation) -> None:
    out_shape = low.shape(op.result, op)
    low.slot(op.result, op)
    src = op.operands[0]
    _copy(low, low.ptr[op.result], _strides(out_shape), low.ptr[src], _bcast_strides(src.tensor_type, out_shape),
          out_shape, src.tensor_type.dtype)


def lower_slice(low: Lowering, op: Operation) -> None:
    src_t = op.operands[0].tensor_type
    src_shape = _static(src_t, op)  # for its strides, which the leading dim (maybe the length) is in none of
    out_shape = low.shape(op.result, op)
    starts = list(op.attrs["starts"])
    steps = list(op.attrs["steps"] or [1] * len(starts))
    strides = _strides(src_shape)
    offset = sum(s * st for s, st in zip(starts, strides))
    base = low.elem_ptr(low.ptr[op.operands[0]], src_t.dtype, ir.Constant(I64, offset))
    if view_source(op) is not None:  # contiguous: memplan's rule, so plan and code agree
        low.alias(op.result, op.operands[0], base)
        return
    low.slot(op.result, op)
    _copy(low, low.ptr[op.result], _strides(out_shape), base, [s * st for s, st in zip(strides, steps)], out_shape,
          src_t.dtype)


def _join(low: Lowering, op: Operation, axis: int, new_axis: bool) -> None:
    out_shape = low.shape(op.result, op)
    low.slot(op.result, op)
    out_strides = _strides(out_shape)
    start: int | ir.Value = 0
    for v in op.operands:
        t = v.tensor_type
        shape = low.shape(v, op)
        piece = shape[:axis] + (1,) + shape[axis:] if new_axis else shape
        dst = low.elem_ptr(low.ptr[op.result], t.dtype, _i64(_imul(low.b, start, out_strides[axis])))
        _copy(low, dst, out_strides, low.ptr[v], _strides(piece), piece, t.dtype)
        start = _iadd(low.b, start, 1 if new_axis else shape[axis])


def lower_concat(low: Lowering, op: Operation) -> None:
    _join(low, op, op.attrs["axis"] % op.result.tensor_type.rank, new_axis=False)


def lower_stack(low: Lowering, op: Operation) -> None:
    _join(low, op, op.attrs["axis"] % op.result.tensor_type.rank, new_axis=True)


def lower_index(low: Lowering, op: Operation) -> None:
    """By a scalar: a view of one row. By a tensor: a gather (gather.py)."""
    x, i = op.operands
    if i.tensor_type.rank:
        from ..gather import lower_gather
        lower_gather(low, op)
        return
    t = x.tensor_type
    shape = low.shape(x, op)
    k = low.row_number(i, ir.Constant(I64, 0), shape[0], op)
    row = math.prod(shape[1:])
    low.alias(op.result, x, low.elem_ptr(low.ptr[x], t.dtype, low.b.mul(k, ir.Constant(I64, row))))


# ---------------------------------------------------------------------------------------------
# Reductions: an accumulator per output element, the reduced axes innermost


def _identity(value: float, dtype: str) -> float | int:
    """A reduction's identity in dtype: an infinite one is the integer type's extreme."""
    if dtype not in INT_DTYPES:
        return value
    info = np.iinfo(DTYPES[dtype])
    return info.min if value == -math.inf else info.max if value == math.inf else int(value)


def lower_reduce(low: Lowering, op: Operation) -> None:
    """Over no element (a reduced axis of size 0, known here): `sum` stores its identity, `mean`
    0/0 = nan, and max/min (`Reduction.empty_is_error`) flag the interpreter's error when the
    op runs (not when it compiles: in a loop body that runs no step there is no error)."""
    reduction = op.spec.reduction
    assert reduction is not None
    x = op.operands[0]
    t = x.tensor_type
    shape = low.shape(x, op)
    axes = reduction_axes(op.attrs, t.rank)
    empty = empty_reduction(op, _static(t, op))
    if empty is not None:
        low.flag_error(ir.Constant(I1, 1), empty, op)
    for axis, e in low.lengths.dims(x).items() if low.lengths is not None else ():
        message = empty_reduction(op, tuple(0 if a == axis else d for a, d in enumerate(_static(t, op))))
        if axis in axes and message is not None:  # empty at lengths where its extent is 0
            low.flag_error(low.b.icmp_signed("==", low.extent(e), ir.Constant(I64, 0)), message, op)
    kept = [d for i, d in enumerate(shape) if i not in axes]
    strides = _strides(shape)
    low.slot(op.result, op)
    ty = LLVM_TYPES[t.dtype]
    init = ir.Constant(ty, _identity(reduction.identity, t.dtype))
    combine = REGISTRY[reduction.combine].scalar
    combine_expr = combine.expr(t.dtype) if combine is not None else None
    if combine_expr is None:
        raise GirError(f"the CPU backend cannot combine '{op.name}' elements of {t.dtype}", op.loc)
    element = Scalar(low, op, t.dtype, reassociate=True)
    with low.b.goto_block(low.entry):
        low.b.position_at_start(low.entry)
        acc = low.b.alloca(ty)
    kept_strides = [strides[i] for i in range(len(shape)) if i not in axes]
    red_shape = tuple(shape[i] for i in axes)
    red_strides = [strides[i] for i in axes]
    with low.loop_nest(tuple(kept)) as oidx:
        low.b.store(init, acc)
        base = low.linear(oidx, kept_strides)
        with low.loop_nest(red_shape) as ridx:
            v = low.load(low.ptr[x], t.dtype, low.b.add(base, low.linear(ridx, red_strides)))
            a = low.b.load(acc, typ=ty)
            low.b.store(element.build(combine_expr, [a, v]), acc)
        result = low.b.load(acc, typ=ty)
        count = low.product(red_shape)
        if reduction.divide_by_count and not isinstance(count, int):  # over the length: 0/0 is nan
            result = low.b.fdiv(result, low.b.sitofp(count, ty))
        elif reduction.divide_by_count:
            result = low.b.fmul(result, ir.Constant(ty, 1.0 / count if count else math.nan))  # 0 * nan: 0/0
        low.store(result, low.ptr[op.result], t.dtype, low.linear(oidx, _strides(tuple(kept))))


# ---------------------------------------------------------------------------------------------
# Matmul through BLAS


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


def _refuse_length(low: Lowering, op: Operation, what: str) -> None:
    """Raises NotALength where op reads or makes a value that follows the length: `what` is
    lowered for static sizes only (the driver then specialises the length)."""
    if low.lengths is not None and any(low.follows_length(v) for v in (*op.operands, *op.results)):
        raise NotALength(f"{what} ('{op.name}' at {op.loc}) is lowered for static sizes only")


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


# ---------------------------------------------------------------------------------------------
# scan: a native loop; sequence elements are views, carries and stacks have their own slots


def lower_scan(low: Lowering, op: Operation) -> None:
    loop = LoopView(op)
    steps: int | ir.Value | None = loop.trip_count
    if steps is None:
        raise GirError("the CPU backend needs a static trip count", op.loc)
    if loop.sequences:  # the sequences' leading dim: the length T where it follows it
        steps = low.shape(loop.sequences[0], op)[0]
    for c in loop.carries:
        p = low.slot(c.arg, op)
        low.memcpy(p, low.ptr[c.init], c.init.tensor_type.nbytes() or 0)
    for r in loop.stacked_results:
        low.slot(r, op)
    _pack_weights(low, op)
    carry_args = loop.carry_args
    low.worker.enter(op)
    with low.for_range(steps, "t") as i:
        t = low.b.sub(low.b.sub(_i64(steps), ir.Constant(I64, 1)), i) if loop.reverse else i
        for arg, seq in zip(loop.element_args, loop.sequences):
            st = seq.tensor_type
            row = math.prod(_static(st, op)[1:])
            low.ptr[arg] = low.elem_ptr(low.ptr[seq], st.dtype, low.b.mul(t, ir.Constant(I64, row)))
        rows = _stack_rows(low, loop, t)
        low.block(loop.body)
        for r, v in zip(loop.stacked_results, loop.yielded_stacks):
            if low.ptr[v] is rows[r]:  # computed in its row of the stack: nothing to copy
                low.layout.schedule["stack_copies_avoided"] += 1  # type: ignore[operator]
                continue
            low.layout.schedule["stack_copies"] += 1  # type: ignore[operator]
            low.memcpy(rows[r], low.ptr[v], v.tensor_type.nbytes() or 0)
        low.stack_rows.clear()
        new_carries = loop.yielded_carries
        # A carry yielded from another carry's storage (a swap) must not be overwritten before
        # it is read: copy those through a temporary slot.
        carry_set = set(carry_args)
        sources = []
        for v in new_carries:
            src = low.ptr[v]
            if low.root.get(v, v) in carry_set:
                tmp = low.alloc(v.tensor_type.nbytes() or 0)
                low.memcpy(tmp, src, v.tensor_type.nbytes() or 0)
                src = tmp
            sources.append(src)
        for arg, v, src in zip(carry_args, new_carries, sources):
            if v is not arg:
                low.memcpy(low.ptr[arg], src, v.tensor_type.nbytes() or 0)
        low.worker.step_done(op, i)
    for c in loop.carries:
        low.ptr[c.result] = low.ptr[c.arg]


def _row_and_softmax_lowerings() -> dict[str, Callable[[Lowering, Operation], None]]:
    from ..gather import lower_logsumexp, lower_scatter_add  # a module of its own; it imports this one
    return {"scatter_add": lower_scatter_add, "logsumexp": lower_logsumexp}


class _Worker:
    """Emits overlap.py's two-core schedule: in gir_main, a window's start (BLAS to one thread,
    wake the worker), the steps done after every step, the waits at the deferred GEMMs; and the
    `gir_worker` function, which runs the chunks. counters[4] (its low 32 bits) is the futex
    word that wakes the worker, counters[5] the steps done, counters[6] the chunks done,
    counters[7] the chunks' GEMM calls, counters[8] the chunks the calling thread ran,
    counters[9] the next chunk to claim.

    Degrading gracefully (issue 28): a chunk runs on whichever thread claims it first, by a
    compare-and-swap of counters[9] from its index to the next, in index order, and each chunk
    starts once the one before it is done (`gir_chunk`: chunks of one GEMM accumulate into one
    C in order). At a deferred GEMM the calling thread claims every chunk up to that GEMM's last
    that the worker has not, runs them itself, and then waits only for the chunk the worker is
    running, if any: when the second core is busy and the worker has not even started, the step
    costs about what the one-thread step does, instead of waiting for a time slice of that core.
    A worker that starts after `gir_main` returned finds every chunk claimed and touches nothing
    but the counters (the runtime joins it before the next call sets them to zero)."""

    FUTEX, PROGRESS, DONE, GEMMS, MAIN, NEXT = 4, 5, 6, 7, 8, 9

    def __init__(self, low: Lowering, windows: list[overlap.Window]):
        self.low = low
        self.windows = {w.scan: w for w in windows}
        self.deferred = {d.op: d for w in windows for d in w.deferred}
        self.base: dict[Operation, int] = {}
        """A window's scan -> the steps of the windows before it (progress counts them all)."""
        self.tasks: list[tuple[int, overlap.Deferred, overlap.Chunk]] = []
        total = 0
        for w in windows:
            self.base[w.scan] = total
            self.tasks += [(total + c.trigger, d, c) for d in w.deferred for c in d.chunks]
            total += LoopView(w.scan).trip_count or 0
        self.tasks.sort(key=lambda task: task[0])
        self.last = {d.op: max(i for i, task in enumerate(self.tasks) if task[1] is d) for d in self.deferred.values()}
        self.saved: ir.Value | None = None
        self.whole = bool(self.tasks) and low.schedule.main_one_thread
        """This thread's BLAS on one thread for the whole call, not only during the windows, when
        the schedule measured that faster (or GIR_CPU_OVERLAP=whole)."""
        self.chunk: ir.Function | None = None
        """`void gir_chunk(buffers, counters, fns, i64 index)`: runs one claimed chunk (emit)."""
        if self.tasks:
            self.chunk = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64]), name="gir_chunk")
            self.chunk.linkage = "internal"

    def _one_thread(self) -> None:
        b = self.low.b
        with b.goto_block(self.low.entry):
            b.position_at_start(self.low.entry)
            cell = b.alloca(I32)
        b.store(self._set_threads(ir.Constant(I32, 1)), cell)
        self.saved = cell

    def _restore(self) -> None:
        if self.saved is not None:
            self._set_threads(self.low.b.load(self.saved, typ=I32))

    def begin(self) -> None:
        if self.whole:
            self._one_thread()

    def end(self) -> None:
        if self.whole:
            self._restore()

    def _set_threads(self, count: ir.Value) -> ir.Value:
        """This thread's BLAS threads to count; returns the previous setting."""
        slot = "mkl_threads_local" if self.low.gemm_family == "mkl" else "ob_threads_local"
        return call_external(self.low, slot, ir.FunctionType(I32, [I32]), [count])

    def _word(self, slot: int) -> ir.Value:
        return self.low.b.gep(self.low.counters, [ir.Constant(I64, slot)], source_etype=I64)

    def _i32_word(self, slot: int) -> ir.Value:
        """The low 32 bits of counters[slot] (x86-64 is little-endian): the futex word."""
        return self._word(slot)

    def _futex(self, op: int, value: int) -> None:
        call_external(self.low, "syscall", ir.FunctionType(I64, [I64], var_arg=True),
                      [ir.Constant(I64, 202), self._word(self.FUTEX), ir.Constant(I32, op), ir.Constant(I32, value),
                       ir.Constant(PTR, None)])

    def _spin_until(self, slot: int, target: int) -> None:
        """Waits (yielding the core) until counters[slot] >= target."""
        b, fn = self.low.b, self.low.fn
        head, wait, done = (fn.append_basic_block(label) for label in ("spin", "spin.wait", "spin.done"))
        b.branch(head)
        b.position_at_end(head)
        v = b.load_atomic(self._word(slot), "acquire", 8, typ=I64)
        b.cbranch(b.icmp_signed(">=", v, ir.Constant(I64, target)), done, wait)
        b.position_at_end(wait)
        call_external(self.low, "sched_yield", ir.FunctionType(I32, []), [])
        b.branch(head)
        b.position_at_end(done)

    def enter(self, scan: Operation) -> None:
        """Before a window's loop: this thread's BLAS to one thread, and wake the worker."""
        if scan not in self.windows:
            return
        b = self.low.b
        if not self.whole:
            self._one_thread()
        b.atomic_rmw("xchg", self._i32_word(self.FUTEX), ir.Constant(I32, 1), "release")
        self._futex(1 | 128, 1)  # FUTEX_WAKE_PRIVATE, one waiter

    def step_done(self, scan: Operation, i: ir.Value) -> None:
        if scan in self.windows:
            done = self.low.b.add(i, ir.Constant(I64, self.base[scan] + 1))
            self.low.b.atomic_rmw("xchg", self._word(self.PROGRESS), done, "release")

    def _claim_and_run(self, limit: int, counted: int | None) -> None:
        """Claims the next chunks (compare-and-swap of counters[NEXT]) while their index is
        below limit, running each here; counts them in counters[counted] (None: not counted)."""
        b, fn = self.low.b, self.low.fn
        labels = ("claim", "claim.try", "claim.run", "claim.done")
        head, claim, run, done = (fn.append_basic_block(label) for label in labels)
        b.branch(head)
        b.position_at_end(head)
        index = b.load_atomic(self._word(self.NEXT), "acquire", 8, typ=I64)
        b.cbranch(b.icmp_signed("<", index, ir.Constant(I64, limit)), claim, done)
        b.position_at_end(claim)
        swapped = b.cmpxchg(self._word(self.NEXT), index, b.add(index, ir.Constant(I64, 1)), "acq_rel", "acquire")
        b.cbranch(b.extract_value(swapped, 1), run, head)
        b.position_at_end(run)
        if counted is not None:
            b.atomic_rmw("add", self._word(counted), ir.Constant(I64, 1), "monotonic")
        b.call(self.chunk, [self.low.buffers, self.low.counters, self.low.fns, index])
        b.branch(head)
        b.position_at_end(done)

    def wait_for(self, op: Operation) -> None:
        """At a deferred GEMM: run here the chunks up to its last that the worker has not
        claimed, then wait for the one it runs; after a window's last one, restore BLAS threads."""
        self._claim_and_run(self.last[op] + 1, self.MAIN)
        self._spin_until(self.DONE, self.last[op] + 1)
        window = next(w for w in self.windows.values() if any(d.op is op for d in w.deferred))
        if window.deferred[-1].op is op and not self.whole:
            self._restore()

    def _pointer(self, a: overlap.Address, extra: int) -> ir.Value:
        low = self.low
        args = low.function.args
        if a.root in args:
            base = low._load_ptr(low.buffers, list(args).index(a.root))
        else:
            base = low.arena
            extra += low.offsets[a.root]
        return low.b.gep(base, [ir.Constant(I64, a.offset + extra)], source_etype=I8)

    def emit(self) -> None:
        """`gir_chunk` (one chunk by index) and `void gir_worker(ptr buffers, ptr counters, ptr
        fns)`: wait to be woken, then claim and run chunks until none is left."""
        if not self.tasks:
            return
        self._emit_chunk()
        low = self.low
        fn = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR]), name="gir_worker")
        low.fn, low.entry = fn, fn.append_basic_block("entry")
        low.b = ir.IRBuilder(low.entry)
        low.buffers, low.counters, low.fns = fn.args
        b = low.b
        head, sleep, awake = (fn.append_basic_block(label) for label in ("woken", "sleep", "awake"))
        b.branch(head)
        b.position_at_end(head)
        word = b.load_atomic(self._i32_word(self.FUTEX), "acquire", 4, typ=I32)
        b.cbranch(b.icmp_signed("!=", word, ir.Constant(I32, 0)), awake, sleep)
        b.position_at_end(sleep)
        self._futex(0 | 128, 0)  # FUTEX_WAIT_PRIVATE while the word is 0
        b.branch(head)
        b.position_at_end(awake)
        # BLAS to one thread only once a chunk is claimed: a late worker that claims none must
        # not change the setting (OpenBLAS's "local" setter is process-wide, blas_threads.py)
        first = b.load_atomic(self._word(self.NEXT), "acquire", 8, typ=I64)
        with b.if_then(b.icmp_signed("<", first, ir.Constant(I64, len(self.tasks)))):
            self._set_threads(ir.Constant(I32, 1))
        self._claim_and_run(len(self.tasks), None)
        b.ret_void()

    def _emit_chunk(self) -> None:
        """`gir_chunk(buffers, counters, fns, index)`: waits until the chunk's steps are done and
        the chunk before it is done, runs its GEMM, and publishes it done."""
        low = self.low
        fn = self.chunk
        assert fn is not None
        low.fn, low.entry = fn, fn.append_basic_block("entry")
        low.b = ir.IRBuilder(low.entry)
        low.buffers, low.counters, low.fns, index = fn.args
        n = len(low.function.args) + len(low.function.result_types)
        low.arena = low._load_ptr(low.buffers, n)
        b = low.b
        end = fn.append_basic_block("end")
        switch = b.switch(index, end)
        for i, (trigger, d, c) in enumerate(self.tasks):
            block = fn.append_basic_block(f"chunk{i}")
            switch.add_case(ir.Constant(I64, i), block)
            b.position_at_end(block)
            self._spin_until(self.PROGRESS, trigger)
            self._spin_until(self.DONE, i)
            item = d.op.result.tensor_type.numpy_dtype.itemsize
            pa = self._pointer(d.a, c.k0 * d.m * item)
            pb = self._pointer(d.b, c.k0 * d.n * item)
            pc = self._pointer(overlap.Address(d.op.result, 0), 0)
            _emit_gemm(low, d.op, "f32", d.m, d.n, c.k1 - c.k0, True, False, pa, pb, pc, False, c.beta, self.GEMMS,
                       f"{low.ids[d.op]}#{d.chunks.index(c)}")
            # lda/ldb of a chunk are the whole operands' (m, n): the chunk is a block of rows
            b.atomic_rmw("xchg", self._word(self.DONE), ir.Constant(I64, i + 1), "release")
            b.branch(end)
        b.position_at_end(end)
        b.ret_void()


class _Split:
    """Emits team.py's split loops. Each is outlined once as `gir_task<j>(m, n, k, args, lda,
    b)`, OpenBLAS's legacy level-1 routine signature (its float `alpha` comes in a vector
    register, so it is left out): `args` holds the pointers the loop reads and writes, then
    counters and fns; n is the row count, m the rows of this call, and `b` (advanced by
    OpenBLAS by `unit` bytes a row from 0) says where they start. In the scan body, the loop
    is a call of `blas_level1_thread`, which runs the first rows here and the rest on
    OpenBLAS's pool thread, and returns when both are done."""

    def __init__(self, low: Lowering, split: set[Operation]):
        self.low = low
        self.split = split
        self.count = 0
        self.alpha: ir.GlobalVariable | None = None
        """32 zero bytes: OpenBLAS reads `alpha` through this pointer."""

    def run(self, op: Operation) -> None:
        """A split loop in the scan body."""
        low = self.low
        _refuse_length(low, op, "a loop split across two cores")
        for r in op.results:
            low.slot(r, op)
        values = [low.ptr[v] for v in op.operands] + [low.ptr[r] for r in op.results] + [low.counters, low.fns]
        entry = low.schedule.level1
        assert entry is not None, "the schedule splits loops only where the probe found the entry"
        rows = int(op.results[0].tensor_type.shape[0])  # type: ignore[arg-type]
        self.dispatch(self._outline(op, len(values), entry[1]), rows, values, claims=True)

    def dispatch(self, task: ir.Function, rows: int, values: list[ir.Value], claims: bool = False) -> None:
        """Runs `task` (OpenBLAS's level-1 routine signature) over `rows` rows, its `args` the
        addresses `values` (and, with claims, a word after them: the next block to claim, set to
        0 here): through `blas_level1_thread` on both threads when OpenBLAS is set to two or
        more now and the entry was found, else on this thread alone."""
        low, b = self.low, self.low.b
        with b.goto_block(low.entry):  # on gir_main's stack: the arena is memplan's (and per call anyway)
            b.position_at_start(low.entry)
            words = b.alloca(I64, size=ir.Constant(I64, len(values) + int(claims)))
        for i, p in enumerate(values):
            b.store(b.ptrtoint(p, I64), b.gep(words, [ir.Constant(I64, i)]))
        if claims:
            b.store_atomic(ir.Constant(I64, 0), b.gep(words, [ir.Constant(I64, len(values))]), "release", 8)
        args = b.bitcast(words, PTR)
        entry = low.schedule.level1
        null, zero, count = ir.Constant(PTR, None), ir.Constant(I64, 0), ir.Constant(I64, rows)
        if entry is None or rows < 2:
            b.call(task, [count, count, zero, args, zero, null])
            return
        if self.alpha is None:
            self.alpha = ir.GlobalVariable(low.module, ir.ArrayType(I64, 4), name="gir_split_alpha")
            self.alpha.initializer = ir.Constant(ir.ArrayType(I64, 4), [0] * 4)
            self.alpha.global_constant = True
        sig = ir.FunctionType(I32, [I32, I64, I64, I64, PTR, PTR, I64, PTR, I64, PTR, I64, PTR, I32])
        with b.if_else(b.icmp_signed(">=", self._blas_threads(), ir.Constant(I32, 2))) as (both, alone):
            with both:
                call_external(low, "ob_level1_thread", sig, [ir.Constant(I32, entry[0]), count, count, zero,
                                                             self.alpha, args, zero, null, ir.Constant(I64, 1),
                                                             null, zero, task, ir.Constant(I32, 2)])
            with alone:  # OpenBLAS set to one thread now: the whole loop here
                b.call(task, [count, count, zero, args, zero, null])

    def _blas_threads(self) -> ir.Value:
        """OpenBLAS's thread setting now (an i32 read through the externals table)."""
        low = self.low
        if "ob_cpu_number" not in low.layout.externals:
            low.layout.externals.append("ob_cpu_number")
        cell = low.b.gep(low.fns, [ir.Constant(I64, externals.index("ob_cpu_number"))], source_etype=PTR)
        return low.b.load(low.b.load(cell, typ=PTR), typ=I32)

    def _outline(self, op: Operation, n_values: int, unit: int) -> ir.Function:
        """`gir_task<j>`: op's loop, in blocks of rows that the two threads claim (issue 28):
        each call, whatever rows OpenBLAS gave it (`m` from `b / unit`), takes the next block by
        an atomic add on the word after `args`' pointers until none is left. So when OpenBLAS's
        pool thread starts late (its core busy) the calling thread runs the blocks it has not
        claimed instead of leaving them to it; OpenBLAS still waits for the pool thread to
        return (an empty call then), which no gir code can shorten. Blocks run by each side are
        counted in counters[SPLIT_CALLER] and counters[SPLIT_POOL]. The pointers come from
        memory, so LLVM cannot tell the results from the operands and does not vectorize the
        loop (~4x slower than gir_main's); the task checks at run time that no result overlaps
        an operand and then runs a copy of the loop whose result pointers are `noalias`."""
        low = self.low
        fn = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [I64, I64, I64, PTR, I64, PTR]),
                         name=f"gir_task{self.count}")
        self.count += 1
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        _, rows, _, args, _, start = fn.args
        loaded = [b.inttoptr(b.load(b.gep(args, [ir.Constant(I64, 8 * i)], source_etype=I8), typ=I64), PTR)
                  for i in range(n_values)]
        claim = b.gep(args, [ir.Constant(I64, 8 * n_values)], source_etype=I8)
        counters, fns = loaded[-2], loaded[-1]
        caller = b.icmp_unsigned("==", b.ptrtoint(start, I64), ir.Constant(I64, 0))  # OpenBLAS's first share
        with b.if_then(b.not_(caller)):
            self._pool_hook(b, fns, claim)
        block = max(1, -(-int(op.results[0].tensor_type.shape[0]) // team.BLOCKS))  # type: ignore[arg-type]
        slot = b.select(caller, ir.Constant(I64, self.SPLIT_CALLER), ir.Constant(I64, self.SPLIT_POOL))
        ran = b.gep(counters, [slot], source_etype=I64)
        fast, slow = self._body(op, fn.name, True), self._body(op, fn.name, False)
        apart = b.not_(self._overlap(b, op, loaded))
        head, body, done = (fn.append_basic_block(label) for label in ("claim", "claim.run", "claim.done"))
        b.branch(head)
        b.position_at_end(head)
        index = b.atomic_rmw("add", claim, ir.Constant(I64, 1), "acq_rel")
        lo = b.mul(index, ir.Constant(I64, block))
        b.cbranch(b.icmp_signed("<", lo, rows), body, done)
        b.position_at_end(body)
        hi = b.add(lo, ir.Constant(I64, block))
        hi = b.select(b.icmp_signed("<", hi, rows), hi, rows)
        call = [lo, hi, *loaded]
        with b.if_else(apart) as (no_alias, aliased):
            with no_alias:
                b.call(fast, call)
            with aliased:
                b.call(slow, call)
        b.atomic_rmw("add", ran, ir.Constant(I64, 1), "monotonic")
        b.branch(head)
        b.position_at_end(done)
        b.ret_void()
        return fn

    SPLIT_CALLER, SPLIT_POOL = 10, 11
    """counters[] slots: blocks of split loops run by the calling thread, by OpenBLAS's pool."""

    @staticmethod
    def _pool_hook(b: ir.IRBuilder, fns: ir.Value, claim: ir.Value) -> None:
        """Tests (team.pool_hook): on the pool thread, before it claims, call the hook if set."""
        cell = b.load(b.gep(fns, [ir.Constant(I64, externals.index("split_hook"))], source_etype=PTR), typ=PTR)
        hook = b.load(cell, typ=ir.FunctionType(ir.VoidType(), [PTR]).as_pointer())
        with b.if_then(b.icmp_unsigned("!=", b.ptrtoint(hook, I64), ir.Constant(I64, 0))):
            b.call(hook, [claim])

    @staticmethod
    def _overlap(b: ir.IRBuilder, op: Operation, ptrs: list[ir.Value]) -> ir.Value:
        """Whether any result's storage overlaps any operand's (an i1)."""
        values = list(op.operands) + list(op.results)
        ranges = []
        for v, p in zip(values, ptrs):
            begin = b.ptrtoint(p, I64)
            ranges.append((begin, b.add(begin, ir.Constant(I64, v.tensor_type.nbytes() or 0))))
        hit: ir.Value = ir.Constant(I1, 0)
        for r0, r1 in ranges[len(op.operands):]:
            for o0, o1 in ranges[:len(op.operands)]:
                hit = b.or_(hit, b.and_(b.icmp_unsigned("<", r0, o1), b.icmp_unsigned("<", o0, r1)))
        return hit

    def _body(self, op: Operation, name: str, noalias: bool) -> ir.Function:
        """`<name>.fast|slow(lo, hi, operands..., results..., counters, fns)`: op's loop over
        rows [lo, hi); with noalias, the result pointers are `noalias`."""
        low = self.low
        saved = (low.fn, low.entry, low.b, low.counters, low.fns, low.ptr, low.stack_rows)
        n = len(op.operands) + len(op.results)
        fn = ir.Function(low.module, ir.FunctionType(ir.VoidType(), [I64, I64] + [PTR] * (n + 2)),
                         name=f"{name}.{'fast' if noalias else 'slow'}")
        fn.linkage = "internal"
        lo, hi, *ptrs = fn.args
        if noalias:
            for p in ptrs[len(op.operands):n]:
                p.add_attribute("noalias")
        low.fn, low.entry = fn, fn.append_basic_block("entry")
        low.b = ir.IRBuilder(low.entry)
        low.counters, low.fns = ptrs[n:]
        low.ptr, low.stack_rows = dict(low.ptr), {}
        for v, p in zip(list(op.operands) + list(op.results), ptrs):
            low.ptr[v] = p
        for r, p in zip(op.results, ptrs[len(op.operands):n]):
            low.stack_rows[r] = p  # slot() returns it
        low.rows = (lo, hi)
        try:
            LOWER[op.name](low, op)
        finally:
            low.rows = None
        low.b.ret_void()
        low.fn, low.entry, low.b, low.counters, low.fns, low.ptr, low.stack_rows = saved
        return fn


def _stack_rows(low: Lowering, loop: LoopView, t: ir.Value) -> dict[Value, ir.Value]:
    """Each stacked result's row for step t. A stacked value that a body op computes into
    storage of its own (not a view, not a value from outside the body, stacked once) is
    computed in that row directly (`Lowering.slot`), saving a copy per step: memplan's plan
    keeps the value live to the end of the step, so no other value was planned into its slot
    while it lives, and its arena slot simply goes unused."""
    rows: dict[Value, ir.Value] = {}
    seen: set[Value] = set()
    for r, v in zip(loop.stacked_results, loop.yielded_stacks):
        nbytes = v.tensor_type.nbytes() or 0
        rows[r] = low.b.gep(low.ptr[r], [low.b.mul(t, ir.Constant(I64, nbytes))], source_etype=I8)
        d = v.defining_op
        if v in seen or d is None or d.parent is not loop.body or view_source(d) is not None:
            seen.add(v)
            continue
        seen.add(v)
        low.stack_rows[v] = rows[r]
    return rows


def _lowerings() -> dict[str, Callable[[Lowering, Operation], None]]:
    """Op kind -> lowering function: the kinds with a family of their own by name, every other
    kind by its spec's facts (elementwise, constant, reduction, GEMM, device move)."""
    table: dict[str, Callable[[Lowering, Operation], None]] = {
        "fused": lower_fused,
        "scan": lower_scan,
        "reshape": lower_view,
        "transpose": lower_transpose,
        "broadcast": lower_broadcast,
        "slice": lower_slice,
        "concat": lower_concat,
        "stack": lower_stack,
        "index": lower_index,
        **_row_and_softmax_lowerings(),
    }
    by_fact: list[tuple[Callable[[OpSpec], bool], Callable[[Lowering, Operation], None]]] = [
        (lambda spec: spec.is_elementwise, lower_elementwise),
        (lambda spec: spec.category == "constant", lower_constant),
        (lambda spec: spec.reduction is not None, lower_reduce),
        (lambda spec: bool(spec.gemm_dtypes), lower_matmul),
        (lambda spec: spec.moves_device, lower_view),  # the whole function runs on the CPU
    ]
    return dispatch_by_fact(table, by_fact)


LOWER = _lowerings()
"""Op kind -> lowering function."""

LENGTH_AWARE = {lower_fused, lower_elementwise, lower_constant, lower_view, lower_transpose, lower_broadcast,
                lower_slice, lower_concat, lower_stack, lower_index, lower_reduce, lower_matmul, lower_scan,
                LOWER["scatter_add"]}
"""The lowerings that compute sizes that follow the run-time length from it (`Lowering.shape`);
any other op reading or making such a value refuses (`_refuse_length`)."""

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


def lower_function(function: Function, plan: MemoryPlan | None, schedule: CpuSchedule,
                   quick: bool = False, lengths: LengthDims | None = None) -> tuple[ir.Module, Layout]:
    """function as an LLVM module and the layout the runtime needs, following schedule (a pure
    function of the three); quick: for the quick tier (`Lowering.quick`); lengths: the dims that
    follow the run-time length (code for every length; raises NotALength where some op cannot
    serve them)."""
    low = Lowering(function, plan, schedule, quick, lengths)
    body = function.body
    low.worker.begin()
    returned = low.block(body)
    _copy_out(low, returned)
    low.worker.end()
    low.b.ret_void()
    low.worker.emit()
    return low.module, low.layout
