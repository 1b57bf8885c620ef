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

This module holds the `Lowering` (its state, storage and the loop over a block) and
`lower_function`; the op families are lowered in the package's other modules (lower/__init__.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from ....analysis.lengths import Extent, LengthDims, NotALength
from ....analysis.memory.plan import MemoryPlan
from ....analysis.memory.planner import plan_memory
from ....errors import GirError
from ....ir.core import Function, Operation, Value
from .. import ir_loops, overlap
from ..layout import Layout, LengthLayout
from ..llvm_types import ALIGN, I1, I8, I64, MEM_TYPES, PTR, _i64, _static
from ..schedule import CpuSchedule, op_ids
from .elementwise import Scalar
from .lengths import _imul, _length_dims, _refuse_length, _results
from .outline import KERNELS_PER_FUNCTION, _copy_out, _kernels_to_outline, _outline_kernels
from .table import LENGTH_AWARE, LOWER
from .two_core import _Split, _Worker


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
        self._read_buffers(function, lengths)

    def _read_buffers(self, function: Function, lengths: LengthDims | None) -> None:
        """gir_main's entry: the arena, the pinned area, the arguments, the results and (code for
        every length) T and the length area, from `buffers` (module docstring)."""
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
