"""IR -> a host program for the GPU: one *step* per op, run in order by the runtime, each
launching a generated kernel or calling xp (CuPy on a GPU) on device arrays.

Terms.
- *Env*: value -> device array, for one call. It starts from the compiled function's static
  arrays (every value's storage, the constants, the argument buffers); views are added as
  their steps run.
- *Step*: (op, run(env)). Lowering is a dispatch table from op kind to one function per op
  family, which returns the op's step (or None when the op needs no work at run time) and
  raises a GirError naming the op and its location when it cannot lower it.
- Elementwise: a `fused` op, or an elementwise op outside any group, is one generated kernel
  launch (kernels.py). matmul: `xp.matmul(a, b, out=...)`, cuBLAS through CuPy; a 2-D
  transpose read only by matmuls is a strided view, which cuBLAS takes as a transpose flag.
  Reductions: xp.sum / mean / max / min with `out=`, except a sum or mean read by one fused
  kernel, which computes it (*folded*: `_foldable`), and a sum, mean, max or min over the
  trailing axis in a row program (rows.py: one kernel, a block per row: `lower_row_program`).
  Layout: views where the memory plan has a registry view (memory.py); a slice read only by
  kernels and reductions *absorbed* (read in place through its strides; a strided view in the
  GPU's plan, which holds its source);
  concat/stack operands made by kernels *claimed* (written in place by them: `claim_pieces`);
  slices read only by `return` or walked by a scan, concats of arguments, initial and final
  carries aliased where aliasing.py decides; else an xp copy into the value's storage. Constants: uploaded once.
- *Placeable*: a value whose step writes wherever env says at run time (kernel outputs, GEMM
  results: `Lowering.redirectable`), so that a scan can put it in a stack row or a carry
  buffer instead of its storage. The scan's placement is decided from the IR by
  analysis/memory/loop_buffers.py (`place_loop`), which the memory plan asks too: the loop's
  own buffers are the only storage of the values they hold (no arena slot).
- `scan`: a loop on the host over device-resident buffers: a sequence's element is a view of
  row t; where each stacked value and carry goes is a decision made once (`ScanPlacement`:
  stack rows written in place, carries swapped by pointer, shifted or double-buffered, the
  rest copied at the yield). Nothing is read back to the host per step. The loop's pieces
  (`persistent.HostScan`: enter, step, leave) go to `persistent.scan_path`, which runs them,
  or runs the whole loop as one persistent kernel bound to the same placement.
- Counting: every kernel launch, GEMM, other xp launch and device copy goes through one
  method of Lowering (`launch`, `gemm`, `xp_call`, `copy`), which counts it (`Counters`; per
  scan step too).
- Run-time errors: kernels record integer division by zero in a device flag (kernels.py);
  `index` out of range is checked on the host. `index` by a computed (not constant) index
  reads that one scalar back to the host.

Known gaps: `call`, `grad` and pre-SSA ops must be gone (inline, autodiff, ssa); one stream,
so steps never overlap; on the host loop a kernel is launched per fused group per step (a whole
scan as one persistent kernel, where GIR_GPU_PERSISTENT asks and the body allows:
persistent.py); only sums and means over leading axes (`_foldable`) and sums, means, maxima
and minima over the trailing axis (row programs, rows.py) fold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...analysis.memory.aliases import read_by_kernels_and_reductions
from ...analysis.memory.loop_buffers import ScanPlacement, join_claims, place_loop
from ...analysis.memory.plan import MemoryPlan
from ...errors import GirError, Location
from ...ir.core import Block, Function, Operation, Value
from ...ir.interpreter import empty_reduction
from ...ir.loops import LoopView
from ...ir.ops import REGISTRY, norm_axis, reduction_axes
from ...ir.spec import OpSpec, dispatch_by_fact
from ...ir.types import INT_DTYPES
from .aliasing import PackedArguments, aliased_slice, carry_ends, packed_arguments, walked_sequences
from .device import Device
from .gather import lower_gather, lower_logsumexp, lower_scatter_add
from .graphs import gemm_call
from .kernels import (
    MAX_WHOLE_READS,
    ElementwiseKernel,
    GridTotal,
    InputLayout,
    KernelPart,
    ReductionRead,
    RowPhase,
    RowReduction,
    RowStage,
    chain_source,
    compile_kernel,
    fused_group_source,
    op_source,
    ranges_source,
    row_source,
    total_source,
)
from .memory import Memory
from .persistent import HostScan, scan_path
from .rows import RowProgram, read_in_place, role, row_programs

Env = dict[Value, Any]
Run = Callable[[Env], None]
Step = tuple[Operation, Run]


COUNTED = ("kernel_launches", "gemm_calls", "xp_launches", "copies", "graph_replays")
"""What a call does on the device, each counted at the one place it happens: generated kernel
launches (`ElementwiseKernel.launch`), GEMMs (`Lowering.gemm`), other xp work that launches
kernels (reductions, gathers, scatters, logsumexp: `Lowering.xp_call`), device-to-device copies
(`Lowering.copy`) and CUDA graph replays (runtime.py: one per call on the graph path)."""


@dataclass
class Counters:
    """What one call did (the runtime resets them per call)."""

    kernel_launches: int = 0
    gemm_calls: int = 0
    xp_launches: int = 0
    copies: int = 0
    graph_replays: int = 0
    read_backs: int = 0
    """Scalars read back to the host (`index` by a computed index, the range of computed
    gather and scatter indices)."""
    per_step: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per scan (`scan forward|reverse at FILE:LINE:COL`): each of COUNTED per time step, the
    loop's whole work (nested loops included) over its trip count, in this call."""

    def reset(self) -> None:
        for name in (*COUNTED, "read_backs"):
            setattr(self, name, 0)
        self.per_step = {}

    def snapshot(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTED)

    def record_steps(self, label: str, before: tuple[int, ...], steps: int) -> None:
        """The per-step counts of the loop `label` that started at `before` and ran `steps` steps."""
        if steps:
            after = self.snapshot()
            self.per_step[label] = {name: (b - a) / steps for name, a, b in zip(COUNTED, before, after)}


@dataclass(eq=False)
class Lowering:
    """Lowers one function: owns its device memory, its static arrays and its kernels."""

    function: Function
    dev: Device
    plan: MemoryPlan | None = None
    """The pipeline's memory plan (memplan's default plan when None)."""
    memory: Memory = field(init=False)
    static: Env = field(default_factory=dict)
    """Values whose device array is fixed for the compiled function's life."""
    kernels: list[ElementwiseKernel] = field(default_factory=list)
    errors: list[tuple[str, Location]] = field(default_factory=list)
    """Run-time error code k (the value of the err flag) is errors[k - 1]: (message, location)."""
    counters: Counters = field(default_factory=Counters)
    host_scalars: dict[Value, int] = field(default_factory=dict)
    """Integer scalar constants, known on the host (an `index` by one needs no read-back)."""
    index_arguments: dict[Value, list[tuple[Operation, int]]] = field(default_factory=dict)
    """Arguments that gathers or scatters index by: argument -> (op, its leading dim) per use.
    The runtime checks their range when a call takes them, not the op when it runs (gather.py)."""
    index_failures: dict[Operation, GirError] = field(default_factory=dict)
    """This call's index arguments found out of range, per op: the op raises its error when an
    eager run reaches it (so an earlier op's error comes first); empty between calls."""
    absorbed: dict[Value, tuple[Value, InputLayout]] = field(default_factory=dict)
    """Slice results no step makes: the kernels reading them read their source in place,
    through the layout (lower_slice)."""
    pieces: dict[Value, tuple[Value, InputLayout, tuple]] = field(default_factory=dict)
    """Values a kernel writes straight into their place in a concat/stack result: value ->
    (that result, the layout of the value in it, the index of the value in it)."""
    extra_places: dict[Value, list[tuple[Value, InputLayout, tuple]]] = field(default_factory=dict)
    """A piece's places in other concat/stack results, which its kernel also stores it into."""
    folded: dict[Value, tuple[Value, ReductionRead]] = field(default_factory=dict)
    """Reduction results no step makes: the one fused kernel reading each computes it from the
    reduction's operand (value -> (that operand, how to reduce it): lower_reduce)."""
    sequence_rows: dict[Value, tuple[Value, InputLayout]] = field(default_factory=dict)
    """Slices no step makes that scans walk as sequences (aliasing.sequence_layout): slice ->
    (its source, the layout of its element in the source's row t): the body's kernels read
    that row in place."""
    returned_views: dict[Value, tuple[Value, tuple]] = field(default_factory=dict)
    """Slices read only by `return`, left strided views (aliasing.returned_only): slice -> (its
    source, the box): a download reads the source once for all its slices."""
    packs: list[PackedArguments] = field(default_factory=list)
    """Concats and stacks of arguments whose argument buffers are their pieces (aliasing.py)."""
    owned: set[Value] = field(default_factory=set)
    """Values moved out of the arena (own_storage)."""
    redirectable: set[Value] = field(default_factory=set)
    """Values whose step writes wherever env says at run time (kernel outputs, GEMM results):
    a scan may place them in a stack row or a carry buffer instead of their storage."""
    blas: Any = None
    """cuBLAS's C API on the capturing stream while a CUDA graph is captured, else None."""
    captured_arrays: list[Any] = field(default_factory=list)
    """Arrays allocated while capturing (copies), kept alive with the graph that uses them."""
    scan_paths: dict[str, Any] = field(default_factory=dict)
    """Per scan (its label): host loop or persistent kernel, and why (persistent.ScanPath)."""
    row_programs: list[RowProgram] = field(default_factory=list)
    """The row programs lowered (rows.py): each one kernel, a block per row."""
    _args: dict[tuple, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.memory = Memory(self.function, self.dev, self.plan)
        self.err = self.memory.own((1,), np.dtype(np.int32))
        self.err_arg = self.dev.kernel_arg(self.err)
        self.packs = packed_arguments(self, lambda op: LOWER.get(op.name) is lower_stack if _joins(op) else None)
        for arg in self.function.args:
            t = arg.tensor_type
            if arg not in self.static:  # else a piece of a packed concat
                self.static[arg] = self.memory.own(tuple(t.shape), t.numpy_dtype)  # type: ignore[arg-type]

    # -- helpers ----------------------------------------------------------------------------
    def storage(self, v: Value) -> Any:
        array = self.memory.storage(v)
        self.static[v] = array
        return array

    def own_storage(self, v: Value) -> Any:
        """v's storage moved to a buffer of its own, outside the arena (made once)."""
        if v not in self.owned:
            t = v.tensor_type
            self.static[v] = self.memory.move_out(v, self.memory.own(_shape(v), t.numpy_dtype))
            self.owned.add(v)
        return self.static[v]

    def place_outside(self, v: Value, array: Any) -> None:
        """v's storage is array, memory outside the arena (a loop's own buffers: lower_scan)."""
        self.static[v] = self.memory.move_out(v, array)
        self.owned.add(v)

    def kernel_arg(self, a: Any) -> Any:
        """a as a kernel argument. Every array a step sees is the function's own memory or a
        view of it, so wrappers are kept by address (a non-contiguous view is copied)."""
        if not a.flags.c_contiguous:  # a device copy first (counted)
            return self.dev.kernel_arg(self.duplicate(a))
        key = (self.dev.address(a), a.size, a.dtype.str)
        found = self._args.get(key)
        if found is None:
            found = self._args[key] = self.dev.kernel_arg(a)
        return found

    def copy(self, dst: Any, src: Any) -> None:
        """dst[...] = src on the device: every device-to-device copy goes through here."""
        dst[...] = src
        self.counters.copies += 1

    def launch(self, kernel: ElementwiseKernel, n: int, args: list[Any]) -> None:
        """A generated kernel over n elements: every kernel launch goes through here (none for
        n == 0)."""
        if n:
            kernel.launch(self.dev, n, args)
            self.counters.kernel_launches += 1

    def duplicate(self, a: Any) -> Any:
        """A new device array holding a copy of a (counted as a copy). While capturing, kept
        alive as long as the graph that writes it (graphs.py)."""
        self.counters.copies += 1
        copy = a.copy()
        if self.blas is not None:
            self.captured_arrays.append(copy)
        return copy

    def gemm(self, a: Any, b: Any, out: Any) -> None:
        """out = a @ b: every GEMM goes through here. cuBLAS through CuPy, or, while a CUDA
        graph is captured (CuPy refuses cuBLAS then), through cuBLAS's C API (graphs.py)."""
        if self.blas is None:
            self.dev.xp.matmul(a, b, out=out)
        else:
            self.blas.gemm(out.dtype, gemm_call(a, b, out, self.dev.address))
        self.counters.gemm_calls += 1

    def xp_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), an xp function launching device work (a reduction, a gather):
        every such launch goes through here (logsumexp, a few in one step, counts each). While
        capturing, what it returns is kept alive with the graph (its address is in the graph)."""
        self.counters.xp_launches += 1
        result = fn(*args, **kwargs)
        if self.blas is not None and result is not None:  # a new array the graph writes: keep it
            self.captured_arrays.append(result)
        return result

    def error_codes(self, sites: list[tuple[str, Operation]]) -> int:
        """The first of len(sites) new run-time error codes."""
        base = len(self.errors) + 1
        self.errors.extend((message, op.loc) for message, op in sites)
        return base

    def same_memory(self, a: Any, b: Any) -> bool:
        return a.nbytes == b.nbytes and a.dtype == b.dtype and self.dev.address(a) == self.dev.address(b) \
            and a.flags.c_contiguous and b.flags.c_contiguous

    def extent(self, a: Any) -> tuple[int, int]:
        """[low, high) of the bytes a touches."""
        if a.size == 0:
            return 0, 0
        low = high = self.dev.address(a)
        for d, s in zip(a.shape, a.strides):
            if s < 0:
                low += (d - 1) * s
            else:
                high += (d - 1) * s
        return low, high + a.itemsize

    # -- driver -----------------------------------------------------------------------------
    def block(self, block: Block) -> tuple[list[Step], list[Value]]:
        """The steps of block's ops and the values its terminator returns or yields."""
        steps: list[Step] = []
        claim_pieces(self, block)
        # Merges, most specific first: totals, row programs, chains (across other ops), runs (of
        # the rest).
        totals = fused_totals(block, {})
        taken = {o for f, pair in totals.items() for o in (f, *pair)}
        programs = row_programs(block, taken, set(self.pieces))
        in_programs = {o for p in programs.values() for o in p.ops}
        taken |= in_programs
        chains = fused_chains(block, taken)
        runs = fused_runs(block, taken | {o for chain in chains.values() for o in chain})
        merged = {later for run in runs.values() for later in run[1:]} | {o for pair in totals.values() for o in pair} \
            | {later for chain in chains.values() for later in chain[1:]} \
            | {o for p in programs.values() for o in p.ops[1:] if o not in _kept_steps(p)}
        for op in block:
            if op.spec.terminator:
                return steps, list(op.operands)
            if op in merged:
                continue  # lowered with the first op of its run
            lower = ((lambda low, first: lower_row_program(low, programs[first])) if op in programs
                     else (lambda low, first: lower_fused_ops(low, runs[first])) if op in runs
                     else (lambda low, first: lower_fused_total(low, first, *totals[first])) if op in totals
                     else (lambda low, first: lower_fused_chain(low, chains[first])) if op in chains
                     else LOWER.get(op.name))
            if lower is None:
                raise GirError(f"the GPU backend cannot compile '{op.name}'", op.loc)
            try:
                run = lower(self, op)
            except GirError:
                raise
            except (ValueError, TypeError, KeyError, AssertionError) as e:
                raise GirError(f"the GPU backend failed on '{op.name}': {type(e).__name__}: {e}", op.loc) from e
            if run is not None:
                steps.append((op, run))
        return steps, []


def run_steps(steps: list[Step], env: Env) -> None:
    for op, run in steps:
        try:
            run(env)
        except GirError:
            raise
        except Exception as e:  # an xp or numba failure at run time: say which op
            raise GirError(f"'{op.name}' failed on the GPU at run time: {type(e).__name__}: {e}", op.loc) from e


def _shape(v: Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.tensor_type.shape)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Elementwise: generated kernels


def _launch(low: Lowering, ops: list[Operation], kernel: ElementwiseKernel, inputs: list[Value],
            scratch: tuple[Any, ...] = (), rows: int | None = None) -> Run | None:
    """The step launching kernel for ops (one, a merged run of one shape, a group and its
    grid total's group, or a row program: launched over its rows), scratch arrays last."""
    results = [r for op in ops for r in op.results]
    if not results:
        return None
    low.kernels.append(kernel)
    for r in results:
        if r not in low.pieces:
            low.storage(r)
            low.redirectable.add(r)
    outs = [v for op in ops for v in _output_places(low, op)[0]]  # a piece: its whole(s)
    views = [(r, low.pieces[r][0], low.pieces[r][2]) for r in results if r in low.pieces]
    n = rows if rows is not None else max(math.prod(_shape(op.results[0])) for op in ops if op.results)  # largest
    extra = (low.err_arg, low.error_codes(kernel.error_sites)) if kernel.error_sites else ()
    extra = (*extra, *(low.kernel_arg(a) for a in scratch))
    arg = low.kernel_arg

    def run(env: Env) -> None:  # outputs from env: a scan may place them (lower_scan)
        low.launch(kernel, n, [*(arg(env[r]) for r in outs), *(arg(env[v]) for v in inputs), *extra])
        for r, whole, where in views:  # for readers through xp: a strided view, no copy
            env[r] = env[whole][where]

    return run


def _through_absorbed(low: Lowering, inputs: list[Value]) -> tuple[list[Value], dict[int, InputLayout]]:
    """The values a kernel is launched with for inputs (an absorbed slice's source in its
    place) and the layouts to read those sources through."""
    layouts = {k: low.absorbed[v][1] for k, v in enumerate(inputs) if v in low.absorbed}
    return [low.absorbed[v][0] if v in low.absorbed else v for v in inputs], layouts


def _output_places(low: Lowering, op: Operation) -> tuple[list[Value], dict[int, InputLayout], list[int]]:
    """Per output parameter of op's kernel: the value whose env array it writes (a result, or
    the concat/stack a piece of it is written into), the layouts of those written as pieces,
    and which result each writes. A result claimed by two concats has two parameters: its
    kernel stores it twice, once in each."""
    outs: list[Value] = []
    layouts: dict[int, InputLayout] = {}
    repeat: list[int] = []
    for k, r in enumerate(op.results):
        places = ([low.pieces[r]] if r in low.pieces else []) + low.extra_places.get(r, [])
        if not places:
            outs.append(r)
            repeat.append(k)
        for whole, layout, _ in places:
            layouts[len(outs)] = layout
            outs.append(whole)
            repeat.append(k)
    return outs, layouts, repeat


def _kernel_part(low: Lowering, op: Operation) -> tuple[list[Value], KernelPart]:
    """(what the kernel is launched with for op's operands, how op's part of it reads and
    writes): absorbed slices and pieces through their layouts, a reduction op alone reads
    (lower_reduce) computed inside."""
    operands = list(op.operands)
    folded = {k: low.folded[v] for k, v in enumerate(operands) if v in low.folded}
    inputs, layouts = _through_absorbed(low, [folded[k][0] if k in folded else v for k, v in enumerate(operands)])
    for k in folded:
        layouts.pop(k, None)  # a folded operand's layout is in its ReductionRead
    reductions = {k: read for k, (_, read) in folded.items()}
    _, out_layouts, repeat = _output_places(low, op)
    return inputs, KernelPart(op, layouts, out_layouts, reductions, tuple(repeat))


def lower_fused(low: Lowering, op: Operation) -> Run | None:
    """A kernel for the group."""
    return lower_fused_ops(low, [op])


def lower_fused_ops(low: Lowering, ops: list[Operation]) -> Run | None:
    """One kernel for a run of fused ops (fused_runs; or one op). A run whose parts take a
    whole-array reduction (one block) is launched op by op instead: a grid cannot be one block."""
    parts = [_kernel_part(low, op) for op in ops]
    if len(ops) > 1 and any(r.whole for _, part in parts for r in part.reductions.values()):
        runs = [r for r in (_launch(low, [op], compile_kernel(low.dev, fused_group_source([part])), inputs)
                            for op, (inputs, part) in zip(ops, parts)) if r is not None]

        def each(env: Env) -> None:
            for one in runs:
                one(env)

        return each
    for later in ops[1:]:  # the plan may have put one in place of an earlier op's input, read by
        for r in later.results:  # other threads of the same launch now: a buffer of its own
            if r not in low.pieces:
                low.own_storage(r)
    inputs = [v for launched, _ in parts for v in launched]
    same = all(_shape(op.results[0]) == _shape(ops[0].results[0]) for op in ops)
    source = (fused_group_source if same else ranges_source)([part for _, part in parts])
    return _launch(low, ops, compile_kernel(low.dev, source), inputs)


def fused_totals(block: Block, runs: dict[Operation, list[Operation]]
                 ) -> dict[Operation, tuple[Operation, Operation]]:
    """`fused` ops F followed by a float sum or mean R of one of F's results over all its axes
    and a one-element `fused` op G that alone reads R (the loss term: `loss + sum(h * h)` after
    the step's group): F -> (R, G), each lowered as one kernel (lower_fused_total). G's other
    operands are single elements made before F. Constants between them do not count (they are
    uploaded when compiling)."""
    ops = [op for op in block if op.spec.category != "constant"]  # constants: no step, so no order
    in_runs = {o for run in runs.values() for o in run}
    found: dict[Operation, tuple[Operation, Operation]] = {}
    for f, r, g in zip(ops, ops[1:], ops[2:]):
        red = r.spec.reduction
        if f.name != "fused" or g.name != "fused" or not f.results or not g.results or f in in_runs \
                or g in in_runs or red is None or red.combine != "add" or not r.operands \
                or r.operands[0] not in f.results or not r.operands[0].tensor_type.is_float:
            continue
        x = r.operands[0]
        axes = tuple(reduction_axes(r.attrs, x.tensor_type.rank))
        others = [v for v in g.operands if v is not r.result]
        if sorted(axes) != list(range(x.tensor_type.rank)) or r.result.users != [g] \
                or list(g.operands).count(r.result) != 1 or math.prod(_shape(g.results[0])) != 1 \
                or not math.prod(_shape(x)) or any(math.prod(_shape(v)) != 1 or v in f.results for v in others):
            continue
        found[f] = (r, g)
    return found


def lower_fused_total(low: Lowering, f: Operation, r: Operation, g: Operation) -> Run | None:
    """f, the sum r of one of its results and the one-element group g on it, as one kernel
    (kernels.GridTotal): one launch where there were two. Where f folds a whole-array
    reduction itself (one block), the three are lowered one by one."""
    inputs, part = _kernel_part(low, f)
    if any(read.whole for read in part.reductions.values()) or any(v in low.folded or v in low.absorbed
                                                                    for v in g.operands):
        steps = [s for s in (lower_fused(low, f), lower_reduce(low, r), lower_fused(low, g)) if s is not None]

        def each(env: Env) -> None:
            for one in steps:
                one(env)

        return each
    x = r.operands[0]
    k = list(g.operands).index(r.result)
    inputs2, part2 = _kernel_part(low, g)
    inputs2[k] = x  # a parameter the kernel does not read (the total stands for it)
    term = f.body.terminator
    assert term is not None
    reduction = r.spec.reduction
    assert reduction is not None
    at = next(i for i, res in enumerate(f.results) if res is x)
    total = GridTotal(term.operands[at], math.prod(_shape(x)), reduction.divide_by_count,
                      part2, k)
    dtype = x.tensor_type.numpy_dtype
    scratch = (low.memory.constant(np.zeros((1,), dtype)), low.memory.constant(np.zeros((1,), np.int32)))
    return _launch(low, [f, g], compile_kernel(low.dev, total_source(part, total)), [*inputs, *inputs2], scratch)


def fused_chains(block: Block, taken: set[Operation]) -> dict[Operation, list[Operation]]:
    """Chains of `fused` ops of one result shape where each later one reads results of earlier
    ones at the same index (operands of the shape) and otherwise only values made before the
    first (the groups of a backward step, which the fuse pass leaves apart around reductions):
    first op -> the chain, lowered as one kernel at the first op's place (lower_fused_chain).
    Ops in `taken` (runs, totals) stay out."""
    ops = list(block)
    position = {op: i for i, op in enumerate(ops)}
    claimed = set(taken)
    chains: dict[Operation, list[Operation]] = {}
    for i, first in enumerate(ops):
        if first.name != "fused" or not first.results or first in claimed:
            continue
        shape = _shape(first.results[0])
        chain, made = [first], set(first.results)
        for later in ops[i + 1:]:
            if later.name != "fused" or not later.results or later in claimed or _shape(later.results[0]) != shape:
                continue
            links = [v for v in later.operands if v in made]
            late = [v for v in later.operands if v not in made and v.defining_op is not None
                    and position.get(v.defining_op, -1) > i]
            if links and not late and all(_shape(v) == shape for v in links):
                chain.append(later)
                made |= set(later.results)
        if len(chain) > 1:
            chains[first] = chain
            claimed |= set(chain)
    return chains


def lower_fused_chain(low: Lowering, chain: list[Operation]) -> Run | None:
    """A chain (fused_chains) as one kernel, each later group reading the earlier groups'
    results from registers (kernels.chain_source). The later groups now run before the ops
    between them and the first: their results get buffers of their own (the plan may have given
    their slots to those ops' values). With a whole-array reduction in a part (one block), op
    by op instead."""
    for later in chain[1:]:
        for r in later.results:
            if r not in low.pieces:
                low.own_storage(r)
    parts = [_kernel_part(low, op) for op in chain]
    if any(read.whole for _, part in parts for read in part.reductions.values()):
        steps = [s for s in (lower_fused(low, op) for op in chain) if s is not None]

        def each(env: Env) -> None:
            for one in steps:
                one(env)

        return each
    made = {r: (j, y) for j, op in enumerate(chain) for y, r in enumerate(op.results)}
    links = [{k: made[v] for k, v in enumerate(op.operands) if v in made and made[v][0] < j}
             for j, op in enumerate(chain)]
    inputs = [v for launched, _ in parts for v in launched]
    source = chain_source([part for _, part in parts], links)
    return _launch(low, chain, compile_kernel(low.dev, source), inputs)


def fused_runs(block: Block, taken: set[Operation]) -> dict[Operation, list[Operation]]:
    """Runs of consecutive `fused` ops, none reading a result of an earlier one in the run (the
    bias-gradient accumulations of a backward step, and the `dh` sum before them): first op ->
    the run (two or more), each lowered as one kernel (over the largest shape, each op on the
    indices below its size: kernels.ranges_source, where the shapes differ). Constants and the
    ops in `taken` (merged elsewhere) between them are passed over, unless a later op reads
    what one of those makes."""
    runs: dict[Operation, list[Operation]] = {}
    run: list[Operation] = []
    passed: set[Value] = set()  # results of the taken ops passed over since the run began
    for op in block:
        if run and (op in taken or op.spec.category == "constant"):
            passed |= set(op.results)
            continue
        made = {r for prior in run for r in prior.results} | passed
        free = op.name == "fused" and op.results and op not in taken
        if free and run and not any(v in made for v in op.operands):
            run.append(op)
            continue
        if len(run) > 1:
            runs[run[0]] = run
        run, passed = ([op] if free else []), set()
    if len(run) > 1:
        runs[run[0]] = run
    return runs


def _kept_steps(program: RowProgram) -> set[Operation]:
    """The reshapes and broadcasts of a row program that keep a step of their own (a view or a
    copy, at their place, after the program made their operand): those read outside the
    program, or by one such (a broadcast of a reshape). The program reads them in place."""
    ops = set(program.ops)
    kept: set[Operation] = set()
    for op in reversed(program.ops):
        if read_in_place(op) and any(u not in ops or u in kept for u in op.result.users):
            kept.add(op)
    return kept


def _broadcast_layout(op: Operation) -> InputLayout:
    """A broadcast of `lead x 1 ...` to `lead x ...` read in place: stride 0 on the broadcast axes."""
    x, r = op.operands[0], op.result
    strides = _strides_of(_shape(x))
    return InputLayout(0, tuple(0 if dx == 1 and dr != 1 else s for dx, dr, s in zip(_shape(x), _shape(r), strides)))


@dataclass(frozen=True)
class _Phase:
    """A phase of a row kernel, with its op, the values it is launched with and those it writes."""

    phase: RowPhase
    op: Operation
    reads: tuple[Value, ...]
    writes: tuple[Value, ...]
    """Each in a buffer of its own (a group's results) or a piece of a concat."""
    width: int
    """Elements of a row its loop runs over (kernels.row_source keys loops by it)."""
    at_i: tuple[Value, ...] = ()
    """Of reads, those read at the loop's index `i` itself (no layout, the operand's shape the
    group's: the element this thread writes)."""
    own: tuple[Value, ...] = ()
    """Of writes, a group's results in their own buffers (at `i`; not pieces)."""


def _stages(phases: list[_Phase]) -> list[tuple[list[_Phase], list[_Phase]]]:
    """The phases by stage, each (its loops' phases, its `after` groups: kernels.RowStage). A
    phase's stage is one after the last stage writing a value it reads (each phase writes
    buffers of its own, so only reads after writes order them), except where a thread reads
    back what it wrote itself, needing no barrier:
    - a value a group writes at `i` in a loop of the reader's width, read at `i`: the reader
      joins the group's stage and loop, after it (LayerNorm's `x - mean` and the sum of its
      squares in one pass);
    - a row's reduction result or an `after` group's, read at `i` by a group of one element per
      row: that runs on thread 0 alone, at i = row, where thread 0 stored them, so it joins the
      stage as an `after` group (a row's `sqrt(var + eps)` right after its variance).
    Within a stage, program order."""
    # value -> (its stage, how it is written: at i in the loops of that width, -1 elsewhere in
    # the loops (a piece), None after the trees (a reduction's result, an after group's))
    where: dict[Value, tuple[int, int | None]] = {}
    stages: list[tuple[list[_Phase], list[_Phase]]] = []
    for p in phases:
        one = isinstance(p.phase, KernelPart) and p.width == 1
        needs: list[tuple[int, bool]] = [(0, False)]  # (stage at least, there only as an after group)
        for v in p.reads:
            if v in where:
                stage, how = where[v]
                same = v in p.at_i and (one if how is None else how == p.width)
                needs.append((stage, how is None) if same else (stage + 1, False))
        k = max(stage for stage, _ in needs)
        after = any(stage == k and late for stage, late in needs)
        stages += [([], []) for _ in range(k + 1 - len(stages))]
        stages[k][1 if after else 0].append(p)
        for v in p.writes:
            how = (None if isinstance(p.phase, RowReduction) else -1 if v not in p.own
                   else None if after else p.width)
            if k >= where.get(v, (-1, None))[0]:
                where[v] = (k, how)
    return stages


def _row_phase(low: Lowering, op: Operation, read: list[tuple[Value, InputLayout | None]], rows: int) -> _Phase:
    """op's phase in a row kernel of `rows` rows, its operands read from read (source, layout)."""
    sources = tuple(source for source, _ in read)
    if op.spec.reduction is not None:
        x, reduction = op.operands[0], op.spec.reduction
        columns = math.prod(_shape(x)) // rows
        return _Phase(RowReduction(x, op.result, columns, reduction.divide_by_count, read[0][1], reduction.combine),
                      op, sources, (op.result,), columns, sources if read[0][1] is None else ())
    outs, out_layouts, repeat = _output_places(low, op)
    layouts = {k: layout for k, (_, layout) in enumerate(read) if layout is not None}
    at_i = tuple(source for v, (source, layout) in zip(op.operands, read)
                 if layout is None and _shape(v) == _shape(op.results[0]))
    return _Phase(KernelPart(op, layouts, out_layouts, {}, tuple(repeat)), op, sources, tuple(outs),
                  math.prod(_shape(op.results[0])) // rows, at_i, tuple(r for r in op.results if r in outs))


def lower_row_program(low: Lowering, program: RowProgram) -> Run | None:
    """A row program (rows.py) as one kernel (kernels.row_source): its groups and row
    reductions as phases, values it made read back from their memory (a piece through its
    place in the concat, a reshape as its operand, a broadcast through stride 0). The ops after
    the first now run before the ops between: their results get buffers of their own (the plan
    may have given their slots to those ops' values), as a chain's do."""
    low.row_programs.append(program)
    made: dict[Value, tuple[Value, InputLayout | None]] = {}
    phases: list[_Phase] = []
    views: list[Run] = []
    for op in program.ops:
        if role(op) == "slice":  # of a value made before: first (an absorbed view, or a copy of its own)
            low.own_storage(op.result)
            view_step = lower_slice(low, op)
            views += [view_step] if view_step is not None else []
            continue
        if read_in_place(op):
            source, layout = made[op.operands[0]]
            assert layout is None, "rows.py reads only program-made values of their own buffer in place"
            made[op.result] = (source, _broadcast_layout(op) if role(op) == "broadcast" else None)
            continue
        if op is not program.ops[0]:
            for r in op.results:
                if r not in low.pieces:
                    low.own_storage(r)
        read = [made.get(v) or low.absorbed.get(v) or (v, None) for v in op.operands]
        phases.append(_row_phase(low, op, read, program.rows))
        made.update({r: low.absorbed[r] if r in low.pieces and op.spec.reduction is None else (r, None)
                     for r in op.results})
    stages = _stages(phases)
    ordered = [p for loops, after in stages for p in loops + after]
    after_parts = [tuple(p.phase for p in after if isinstance(p.phase, KernelPart)) for _, after in stages]
    assert [len(parts) for parts in after_parts] == [len(after) for _, after in stages], "after: groups only"
    kernel_source = row_source([RowStage(tuple(p.phase for p in loops), parts)
                                for (loops, _), parts in zip(stages, after_parts)], program.rows)
    kernel = _launch(low, [p.op for p in ordered], compile_kernel(low.dev, kernel_source),
                     [v for p in ordered for v in p.reads], rows=program.rows)
    if not views:
        return kernel

    def run(env: Env) -> None:
        for view in views:
            view(env)
        if kernel is not None:
            kernel(env)

    return run


def lower_elementwise(low: Lowering, op: Operation) -> Run | None:
    """An elementwise op outside a fused group: a kernel of one op."""
    inputs, layouts = _through_absorbed(low, list(dict.fromkeys(op.operands)))
    _, out_layouts, repeat = _output_places(low, op)
    return _launch(low, [op], compile_kernel(low.dev, op_source(op, layouts, out_layouts, len(repeat))), inputs)


# ---------------------------------------------------------------------------------------------
# GEMMs and reductions through xp


def lower_matmul(low: Lowering, op: Operation) -> Run:
    a, b = op.operands
    r = op.result
    low.storage(r)
    low.redirectable.add(r)

    def run(env: Env) -> None:
        low.gemm(env[a], env[b], env[r])

    return run


_XP_REDUCTIONS = {"add": "sum", "max": "max", "min": "min"}
"""`Reduction.combine` -> the xp function folding with it (`mean` where it divides by the count)."""


def _foldable(low: Lowering, op: Operation, axes: tuple[int, ...]) -> tuple[Value, ReductionRead] | None:
    """(what to launch with, how to reduce it) where the fused kernel that alone reads this
    reduction can compute it itself, saving a launch (`acc + sum(x, axes = [0])`, the loss
    term `loss + sum(h * h)`): a float sum or mean over the leading axes of a non-empty
    operand, read once, by a `fused` op of the reduction's shape in the same block; the
    operand C-contiguous (a kernel or GEMM result, an argument) or a 2-D concat piece or
    absorbed slice. A reduction to one element takes one block (kernels.ReductionRead). The
    operand is now read by the consumer, later than the plan knows: a kernel or GEMM result
    moves out of the arena (the plan could give its slot to the consumer's own result)."""
    reduction = op.spec.reduction
    x, r = op.operands[0], op.result
    users, shape = r.users, _shape(x)
    if reduction is None or reduction.combine != "add" or not x.tensor_type.is_float \
            or len(users) != 1 or users[0].name != "fused" or users[0].parent is not op.parent \
            or list(users[0].operands).count(r) != 1 or not math.prod(shape):
        return None
    if axes != tuple(range(len(axes))) or _shape(users[0].results[0]) != _shape(r) or r in low.pieces:
        return None
    rows = math.prod(shape[: len(axes)])
    columns = math.prod(shape[len(axes):])
    if columns == 1 and sum(v in low.folded for v in users[0].operands) >= MAX_WHOLE_READS:
        return None  # the consumer's one block holds a shared-memory tree per whole reduction
    mean = reduction.divide_by_count
    if x in low.absorbed:
        source, layout = low.absorbed[x]
        if len(shape) != 2 or columns == 1:
            return None
        low.own_storage(source)  # read at the consumer: later than a strided view holds it
        return source, ReductionRead(rows, columns, mean, layout)
    if x in low.function.args:
        return x, ReductionRead(rows, columns, mean)
    if x in low.redirectable:
        low.own_storage(x)  # read later than the plan knows: out of the arena (as absorbed slices)
        return x, ReductionRead(rows, columns, mean)
    return None


def lower_reduce(low: Lowering, op: Operation) -> Run | None:
    """Over no element (a reduced axis of size 0, known here): `sum` is its identity, `mean`
    nan (0/0, written without xp's warning), and max/min (`Reduction.empty_is_error`) raise the
    interpreter's error when the op runs (not when it compiles: in a loop body that runs no
    step there is no error)."""
    reduction = op.spec.reduction
    assert reduction is not None
    x = op.operands[0]
    shape = x.tensor_type.shape
    axes = tuple(reduction_axes(op.attrs, x.tensor_type.rank))
    keepdims = op.attrs["keepdims"]
    folded = _foldable(low, op, axes)
    if folded is not None:
        low.folded[op.result] = folded
        return None
    out = low.storage(op.result)
    xp = low.dev.xp
    empty = empty_reduction(op, shape)  # type: ignore[arg-type]  # static: the backend specialised
    if empty is not None:
        def fail(env: Env) -> None:
            raise GirError(f"{empty} at run time", op.loc)  # as flagged errors read

        return fail
    if reduction.divide_by_count and math.prod(shape[a] for a in axes) == 0:  # type: ignore[misc]
        def nan(env: Env) -> None:
            out[...] = math.nan

        return nan
    reduce = getattr(xp, "mean" if reduction.divide_by_count else _XP_REDUCTIONS[reduction.combine])
    # Accumulate a sum in the operand's dtype, as the interpreter's result is (NumPy would widen i32).
    options = {"dtype": x.tensor_type.numpy_dtype} if reduction.combine == "add" else {}

    def run(env: Env) -> None:
        low.xp_call(reduce, env[x], axis=axes, keepdims=keepdims, out=out, **options)

    return run


# ---------------------------------------------------------------------------------------------
# Constants


def lower_constant(low: Lowering, op: Operation) -> None:
    """constant, zeros, ones: the interpreter's value, uploaded once."""
    t = op.result.tensor_type
    host = np.asarray(REGISTRY[op.name].kernel(op), dtype=t.numpy_dtype)  # type: ignore[misc]
    low.static[op.result] = low.memory.constant(host)
    if t.shape == () and t.dtype in INT_DTYPES:
        low.host_scalars[op.result] = int(host)
    return None


def lower_fill(low: Lowering, op: Operation) -> Run:
    value = op.operands[0]
    out = low.storage(op.result)

    def run(env: Env) -> None:
        low.copy(out, env[value])

    return run


# ---------------------------------------------------------------------------------------------
# Layout: views where the memory plan has one, copies into storage where not


def _view_or_copy(low: Lowering, op: Operation, make: Callable[[Any], Any]) -> Run:
    """A step setting op's result to make(operand), as a view or copied into storage."""
    x, r = op.operands[0], op.result
    if low.memory.is_view(r, op):
        def view(env: Env) -> None:
            env[r] = make(env[x])

        return view
    out = low.storage(r)

    def copy(env: Env) -> None:
        low.copy(out, make(env[x]))

    return copy


def lower_reshape(low: Lowering, op: Operation) -> Run:
    shape = _shape(op.result)
    return _view_or_copy(low, op, lambda a: a.reshape(shape))


def lower_transfer(low: Lowering, op: Operation) -> Run:
    """The whole function runs on the GPU: a transfer is the value itself."""
    return _view_or_copy(low, op, lambda a: a)


def lower_transpose(low: Lowering, op: Operation) -> Run:
    rank = op.operands[0].tensor_type.rank
    perm = tuple(op.attrs["perm"] or range(rank)[::-1])
    transpose = low.dev.xp.transpose
    return _view_or_copy(low, op, lambda a: transpose(a, perm))


def lower_slice(low: Lowering, op: Operation) -> Run | None:
    """A view where the plan has a registry view. Else, where only kernels and reductions read
    it and its source is a kernel or GEMM result (always a C-contiguous array: its storage, a
    stack row, a carry buffer), it is *absorbed*: no copy; the kernels read the source through
    the slice's strides (kernels.InputLayout), a reduction through a strided xp view (the step
    sets it: no device work) or its layout (folded). Walked and returned slices likewise
    (aliasing.py). Where the plan counts the slice a strided view (memplan{views=strided}) the
    source stays in its arena slot, held until the slice's last reader; else the source gets a
    buffer of its own, outside the arena: the plan, which saw it die at the slice, may give its
    slot to a value written before those readers run. Else a copy into storage (a strided
    view the plan knows but the lowering cannot read in place: an xp view, correct for any
    reader)."""
    starts, limits = op.attrs["starts"], op.attrs["limits"]
    steps = op.attrs["steps"] or [1] * len(starts)
    x, r = op.operands[0], op.result
    box = tuple(slice(s, lim, st) for s, lim, st in zip(starts, limits, steps))

    def view(env: Env) -> None:
        env[r] = env[x][box]

    strided = low.memory.is_strided_view(r, op)  # the plan keeps x live for r's readers
    in_place = strided or not low.memory.is_view(r, op)
    if in_place and x in low.redirectable and read_by_kernels_and_reductions(r):
        element = _strides_of(_shape(x))
        low.absorbed[r] = (x, InputLayout(sum(s * e for s, e in zip(starts, element)),
                                          tuple(e * k for e, k in zip(element, steps))))
        if not strided:
            low.own_storage(x)
        return view
    if in_place and x in low.redirectable and aliased_slice(low, op, box, planned=strided):
        return view  # walked by a scan or returned: a strided view (aliasing.py)
    if strided:
        return view
    return _view_or_copy(low, op, lambda a: a[box])


def _strides_of(shape: tuple[int, ...]) -> list[int]:
    """C-order strides in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def lower_broadcast(low: Lowering, op: Operation) -> Run:
    x, out = op.operands[0], low.storage(op.result)

    def run(env: Env) -> None:
        low.copy(out, env[x])  # broadcasting, on the device

    return run


def _join_pieces(op: Operation) -> list[tuple[Value, tuple, InputLayout]]:
    """Per operand of a concat or stack: (it, where it goes in the result, its layout there)."""
    r = op.result
    new_axis = LOWER.get(op.name) is lower_stack
    axis = norm_axis(op.attrs["axis"], r.tensor_type.rank)
    element = _strides_of(_shape(r))
    pieces = []
    start = 0
    for v in op.operands:
        width = 1 if new_axis else _shape(v)[axis]
        where = start if new_axis else slice(start, start + width)
        strides = tuple(e for a, e in enumerate(element) if not (new_axis and a == axis))
        pieces.append((v, (slice(None),) * axis + (where,), InputLayout(start * element[axis], strides)))
        start += width
    return pieces


def claim_pieces(low: Lowering, block: Block) -> None:
    """Decides, before block's ops are lowered, which operands of its concat and stack ops
    their kernels write straight into the result (Lowering.pieces; the rule is the memory
    plan's, loop_buffers.join_claims): an operand made by a kernel in this block, once, read
    otherwise only by kernels (which then read it in place, as an absorbed slice), reductions
    and other concats or stacks (through a strided view); a value claimed by two results is
    stored into both. The result lives out of the arena (from its first piece's kernel on: a
    span the plan does not know; the GPU's plan reserves no slot for it), unless a scan places
    it in a stack row or carry buffer."""
    for op, positions in join_claims(block).items():
        pieces = _join_pieces(op)
        for i in positions:
            v, where, layout = pieces[i]
            if v in low.pieces:  # claimed by an earlier concat: stored here too
                low.extra_places.setdefault(v, []).append((op.result, layout, where))
            else:
                low.pieces[v] = (op.result, layout, where)
                low.absorbed[v] = (op.result, layout)
        low.own_storage(op.result)


def _joins(op: Operation) -> bool:
    """Whether op puts its operands side by side (its lowering is _join's: concat, stack)."""
    return LOWER.get(op.name) in (lower_concat, lower_stack)


def _join(low: Lowering, op: Operation, new_axis: bool) -> Run | None:
    """The operands not written in place by their kernels (claim_pieces) copied into the
    result, wherever env has it (a scan may place it)."""
    r = op.result
    low.storage(r)
    if any(pack.op is op for pack in low.packs):
        return None  # its pieces are the arguments' buffers: filled when the call starts
    low.redirectable.add(r)
    def claimed(v: Value, where: tuple) -> bool:
        places = ([low.pieces[v]] if v in low.pieces else []) + low.extra_places.get(v, [])
        return any(whole is r and at == where for whole, _, at in places)

    copied = [(v, where) for v, where, _ in _join_pieces(op) if not claimed(v, where)]  # all but those claimed
    if not copied:
        return None

    def run(env: Env) -> None:
        out = env[r]
        for v, where in copied:
            low.copy(out[where], env[v])

    return run


def lower_concat(low: Lowering, op: Operation) -> Run | None:
    return _join(low, op, new_axis=False)


def lower_stack(low: Lowering, op: Operation) -> Run | None:
    return _join(low, op, new_axis=True)


def lower_index(low: Lowering, op: Operation) -> Run:
    """By a scalar: one row, a view where memplan has one. By a tensor: a gather (gather.py)."""
    x, i = op.operands
    if i.tensor_type.rank:
        return lower_gather(low, op)
    r = op.result
    rows = _shape(x)[0]
    known = low.host_scalars.get(i)
    dev, counters = low.dev, low.counters
    out = None if low.memory.is_view(r, op) else low.storage(r)

    def run(env: Env) -> None:
        if known is not None:
            k = known
        else:  # a computed index: one read-back
            k = int(dev.download(env[i]))
            counters.read_backs += 1
        if not 0 <= k < rows:
            raise GirError(f"'index' out of range at run time: index {k} for a leading dim of {rows}", op.loc)
        if out is None:
            env[r] = env[x][k]
        else:
            low.copy(out, env[x][k])

    return run


# ---------------------------------------------------------------------------------------------
# scan: a host loop over device-resident buffers


def check_placement(low: Lowering, loop: LoopView, place: ScanPlacement) -> None:
    """The placement was made from the IR before the body was lowered (the memory plan's too:
    loop_buffers.py); every value it writes into a stack row or a loop buffer must be one whose
    step writes wherever env says (`redirectable`), or the step would write it elsewhere and
    the row stay unwritten: a bug in the analysis, raised, never run. A value the lowering could
    place but the analysis does not is copied at the yield (correct; a lowering that learns to
    write a new kind of value anywhere adds it to `loop_buffers.writes_anywhere`)."""
    placed = [*place.in_stack.values(), *(loop.yielded_carries[j] for j in place.double_buffered),
              *(loop.yielded_carries[j] for j, (_, k) in place.shifted.items() if k is None)]
    for v in placed:
        if v not in low.redirectable:
            raise GirError(f"the GPU backend's scan placement (analysis/memory/loop_buffers.py) puts a value made "
                           f"by '{v.defining_op.name}' where its lowering does not write it", loop.op.loc)  # type: ignore[union-attr]


def _shifted_stacks(low: Lowering, loop: LoopView, args_stack: int, values_stack: int | None, steps: int
                    ) -> tuple[Any, Any, Any]:
    """(stack of the carry's argument, rows of its next value, the argument's first row) as
    views of one buffer of steps + 1 rows, one row apart (ScanPlacement.shifted); the scan
    results stacked there (the value rows' too, unless values_stack is None) live there from
    now on."""
    r_args = loop.stacked_results[args_stack]
    shape = _shape(r_args)
    buf = low.memory.own((shape[0] + 1, *shape[1:]), r_args.tensor_type.numpy_dtype)
    early, late = buf[:-1], buf[1:]
    args_rows, value_rows = (late, early) if loop.reverse else (early, late)
    moved = [(r_args, args_rows)]
    if values_stack is not None:
        moved.append((loop.stacked_results[values_stack], value_rows))
    for r, view in moved:
        low.static[r] = low.memory.move_out(r, view)
    first_row = buf[0] if not steps else args_rows[steps - 1] if loop.reverse else args_rows[0]
    return args_rows, value_rows, first_row


def _loop_buffers(low: Lowering, loop: LoopView, place: ScanPlacement, steps: int
                  ) -> tuple[dict[int, tuple[Any, Any]], dict[int, tuple[Any, Any, Any]]]:
    """The loop's own buffers, made before its body is lowered: two per double-buffered carry,
    one of steps + 1 rows per shifted carry (_shifted_stacks). With at least one step, each
    loop-owned value (loop_buffers.loop_owned: the carry's argument, yielded and final value)
    has its storage there, where the GPU's plan reserves no slot for it: its step writes there
    (the scan binds it per step), and nothing is allocated for it twice."""
    buffers = {}
    for j in sorted(place.double_buffered):
        arg = loop.carry_args[j]
        shape, dtype = _shape(arg), arg.tensor_type.numpy_dtype
        buffers[j] = (low.memory.own(shape, dtype), low.memory.own(shape, dtype))
    shifted = {j: _shifted_stacks(low, loop, a, k, steps) for j, (a, k) in place.shifted.items()}
    if steps:
        last = 0 if loop.reverse else steps - 1
        places = [(loop.carries[j], pair[0], pair[1], pair[steps % 2]) for j, pair in buffers.items()]
        places += [(loop.carries[j], first_row, rows[last], rows[last])
                   for j, (_, rows, first_row) in shifted.items()]
        for c, arg, yielded, final in places:
            for v, array in ((c.arg, arg), (c.yielded, yielded), (c.result, final)):
                low.place_outside(v, array)
    return buffers, shifted


def lower_scan(low: Lowering, op: Operation) -> Run:
    loop = LoopView(op)
    steps = loop.trip_count
    if steps is None:
        raise GirError("the GPU backend needs a static trip count", op.loc)
    seq_args, inits, carry_args = loop.element_args, loop.inits, loop.carry_args
    place = place_loop(loop)  # from the IR, as the memory plan's (loop_buffers.py)
    buffers, shifted_rows = _loop_buffers(low, loop, place, steps)
    carries = [low.storage(a) for a in carry_args]
    stacks = [low.storage(r) for r in loop.stacked_results]
    final_storage = _final_storage(low, loop)
    walked = walked_sequences(low, loop)  # a sequence slice's source, read in place
    body_steps, _ = low.block(loop.body)
    check_placement(low, loop, place)  # `redirectable` now knows the body
    first = [buffers[j][0] if j in buffers else c for j, c in enumerate(carries)]
    hidden = _shift(place, shifted_rows, stacks, first)
    yielded_carries, yielded_stacks = loop.yielded_carries, loop.yielded_stacks
    order = range(steps - 1, -1, -1) if loop.reverse else range(steps)
    label = f"scan {'reverse' if loop.reverse else 'forward'} at {op.loc}"
    copy_carries = _carry_copier(low, carries, place.copied_carries, yielded_carries)
    ends = carry_ends(low, loop, place, buffers, hidden, stacks, first)
    final_storage = [ends.left_in.get(j, f) for j, f in enumerate(final_storage)]

    def enter(env: Env) -> None:
        """The initial carries into their buffers (or read in place)."""
        for j, (init, arg, buffer) in enumerate(zip(inits, carry_args, first)):
            if j not in ends.read_in_place and not low.same_memory(env[init], buffer):
                low.copy(buffer, env[init])
            env[arg] = env[init] if j in ends.read_in_place else buffer

    def step(env: Env, i: int, t: int) -> None:
        """Time step t (the i-th run): env bound to its rows and buffers, the body, the yield."""
        for arg, seq in zip(seq_args, walked):
            env[arg] = env[seq][t]
        for k, v in place.in_stack.items():
            env[v] = stacks[k][t]
        for j, pair in buffers.items():
            env[yielded_carries[j]] = pair[(i + 1) % 2]
        for j, rows in hidden.items():
            env[yielded_carries[j]] = rows[t]
        run_steps(body_steps, env)
        for k in place.copied_stacks:
            low.copy(stacks[k][t], env[yielded_stacks[k]])
        copy_carries(env)
        for j, k in place.carry_from_stack.items():
            env[carry_args[j]] = env[place.in_stack[k]]
        for j in (*buffers, *hidden):
            env[carry_args[j]] = env[yielded_carries[j]]

    def leave(env: Env) -> None:
        """The final carries into their storage (where not left in place)."""
        for j, (arg, final) in enumerate(zip(carry_args, final_storage)):
            if j not in ends.unread and not low.same_memory(env[arg], final):
                low.copy(final, env[arg])

    host = HostScan(label, tuple(order), enter, step, leave, tuple(carry_args))
    return scan_path(low, op, loop, host)


def _final_storage(low: Lowering, loop: LoopView) -> list[Any]:
    """Per carry, where its final value goes: the carry's own storage unless the loop owns it."""
    final_storage = []
    for c in loop.carries:
        if c.result not in low.owned:
            low.memory.share(c.result, c.arg)  # the final carry stays in the carry's storage
        final_storage.append(low.storage(c.result))
    return final_storage


def _shift(place: ScanPlacement, shifted_rows: dict[int, tuple[Any, Any, Any]], stacks: list[Any],
           first: list[Any]) -> dict[int, Any]:
    """Binds each shifted carry's buffer (ScanPlacement.shifted): its stack, the rows its next
    values are written into and its first row, updating stacks and first. Returns carry j -> those
    rows where they are in no stack of the scan's (k None)."""
    hidden: dict[int, Any] = {}
    for j, (a, k) in place.shifted.items():
        stacks[a], rows, first[j] = shifted_rows[j]
        if k is None:
            hidden[j] = rows
        else:
            stacks[k] = rows
    return hidden


def _carry_copier(low: Lowering, carries: list[Any], copied: tuple[int, ...], yielded: list[Value]
                  ) -> Callable[[Env], None]:
    """The copies of the carries `copied` at the yield: each yielded value into its carry's
    storage (through a temporary when it overlaps the storage of a carry copied here: a swap),
    the body argument pointing at the storage throughout."""
    extents = [low.extent(carries[j]) for j in copied]
    args = carries

    def overlaps_a_carry(a: Any) -> bool:
        lo, hi = low.extent(a)
        return any(lo < c_hi and c_lo < hi for c_lo, c_hi in extents)

    def copy(env: Env) -> None:
        pending = []
        for j in copied:
            value = env[yielded[j]]
            if low.same_memory(value, args[j]):
                continue
            if overlaps_a_carry(value):  # read before any carry is overwritten
                value = low.duplicate(value)
            pending.append((args[j], value))
        for carry, value in pending:
            low.copy(carry, value)

    return copy


def _row_and_softmax_lowerings() -> dict[str, Callable[[Lowering, Operation], Run | None]]:
    return {"scatter_add": lower_scatter_add, "logsumexp": lower_logsumexp}


def _lowerings() -> dict[str, Callable[[Lowering, Operation], Run | None]]:
    """Op kind -> lowering function: the kinds with a family of their own by name, every other
    kind by its spec's facts (elementwise, constant, reduction, matmul, device move)."""
    table: dict[str, Callable[[Lowering, Operation], Run | None]] = {
        "fused": lower_fused,
        "scan": lower_scan,
        "fill": lower_fill,
        "reshape": lower_reshape,
        "transpose": lower_transpose,
        "broadcast": lower_broadcast,
        "slice": lower_slice,
        "concat": lower_concat,
        "stack": lower_stack,
        "index": lower_index,
        **_row_and_softmax_lowerings(),
    }
    by_fact: list[tuple[Callable[[OpSpec], bool], Callable[[Lowering, Operation], Run | None]]] = [
        (lambda spec: spec.is_elementwise, lower_elementwise),
        (lambda spec: spec.category == "constant", lower_constant),
        (lambda spec: spec.reduction is not None, lower_reduce),
        (lambda spec: spec.category == "matmul", lower_matmul),
        (lambda spec: spec.moves_device, lower_transfer),
    ]
    return dispatch_by_fact(table, by_fact)


LOWER = _lowerings()
"""Op kind -> lowering function."""


def lower_function(function: Function, dev: Device, plan: MemoryPlan | None = None
                   ) -> tuple[Lowering, list[Step], list[Value]]:
    low = Lowering(function, dev, plan)
    steps, returned = low.block(function.body)
    return low, steps, returned
