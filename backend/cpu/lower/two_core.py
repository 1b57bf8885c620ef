"""The two-core side: overlap.py's schedule (`_Worker`: GEMMs deferred into a scan, run by a
worker thread) and team.py's split loops (`_Split`: a scan body's elementwise loops on
OpenBLAS's pool thread too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ....ir.core import Operation
from ....ir.loops import LoopView
from .. import externals, overlap, team
from ..llvm_types import I1, I8, I32, I64, PTR
from .gemm import _emit_gemm, call_external
from .lengths import _refuse_length
from .table import LOWER

if TYPE_CHECKING:  # the lowering's state; base.py imports this module
    from .base import Lowering


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
