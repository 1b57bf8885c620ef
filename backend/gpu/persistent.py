"""A scan as one persistent GPU kernel: every time step in one cooperative launch, the
recurrent weights held in shared memory across the steps (GIR_GPU_PERSISTENT; docs/gpu.md
*Persistent scans*).

Terms.
- *Host loop*: codegen.lower_scan's path: per time step the body's steps from Python (a GEMM
  through cuBLAS, one or two generated kernels), all of it captured in the function's CUDA graph.
- *Persistent scan*: one numba-cuda kernel running all T steps. Per step its *phases* are the
  body's device work in order, a grid-wide sync (`cuda.cg.this_grid().sync()`, which makes
  numba-cuda launch the kernel cooperatively) after each: the recurrent GEMM `carry @ W`
  (`W` loop-invariant; each block owns column tiles of the result and holds `W[:, its tiles]`
  in shared memory, loaded once before the time loop) and the body's generated kernels, each
  the same source as on the host loop inlined, its names prefixed per phase (grid-stride loops,
  so any grid size is correct; a kernel written for one block runs in block 0 only). Inlined,
  not device functions: numba-cuda types a call to a device function for the current device,
  which compile_ptx without a GPU does not have.
- *Decision* (`ScanPath`): built by `decide` from the IR and the device before any code is
  generated: a `PersistentPlan` (the GEMM's tiling, the grid) or the reason the scan stays a
  host loop; `fn.stats.persistent` prints it.
- *Binding*: where each phase's arrays are in step i (a flat base array and an element offset:
  stack row t, the carry buffer of i's parity, the initial carry read in place at step 0). It is
  found once, at the first call, by running the host loop's step functions with the device work
  recorded instead of issued (`_trace`): the addresses are the function's own for its life, the
  invariant the CUDA graph path rests on too. Two tables (base choice and offset per step and
  slot) are uploaded once; the kernel's source depends only on the structure, never on addresses.
  The trace refuses what a persistent kernel cannot hold: a device copy or an xp launch per
  step (a reduction not folded into a kernel, a copied carry), a read-back per step.

Known gaps: at most one GEMM per step, its W in shared memory (a slice over `SHARED_BUDGET` per block is
refused, not read from global memory); the GEMM is a plain loop per output element (no tensor
cores, no register tiling); a sync after every phase, also between independent ones; never run
on a GPU yet (docs/gpu.md).
"""

from __future__ import annotations

import io
import keyword
import re
import time
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...config import current
from ...errors import GirError
from ...ir.core import Operation, Value
from ...ir.loops import LoopView
from .kernels import NUMBA_TYPES, ElementwiseKernel, KernelSource, compile_kernel, kernel_body

if TYPE_CHECKING:
    from .codegen import Lowering
    from .device import Device

Env = dict[Value, Any]

SHARED_BUDGET = 48 * 1024
"""Bytes of static shared memory a block may declare on any CUDA GPU (more needs an opt-in per
kernel): W's tiles and the phases' own shared arrays together."""

PHASE_SHARED = 8 * 1024
"""Kept back from SHARED_BUDGET for the phases' shared arrays (a grid total's tree: 256 slots)."""


@dataclass(frozen=True)
class HostScan:
    """The host loop of a scan, as codegen.lower_scan built it: `enter` (the initial carries),
    `step(env, i, t)` (time step t, the i-th run: env bound to its rows and buffers, the body's
    steps, the yield) and `leave` (the final carries)."""

    label: str
    order: tuple[int, ...]
    enter: Callable[[Env], None]
    step: Callable[[Env, int, int], None]
    leave: Callable[[Env], None]
    carry_args: tuple[Value, ...]

    def loop(self, low: Lowering, env: Env) -> None:
        before = low.counters.snapshot()  # per step: the loop alone, not the carries in and out
        for i, t in enumerate(self.order):
            self.step(env, i, t)
        low.counters.record_steps(self.label, before, len(self.order))

    def run(self, low: Lowering, env: Env) -> None:
        self.enter(env)
        self.loop(low, env)
        self.leave(env)


@dataclass(frozen=True)
class PersistentPlan:
    """How a scan runs as one kernel: `grid` blocks of `threads`; the step's GEMM (rows x depth
    @ depth x columns) cut into tiles of `tile` columns, block b owning tiles b, b + grid, ...,
    at most `tiles_per_block`, whose W columns it keeps in `shared_bytes` of shared memory."""

    steps: int
    rows: int
    depth: int
    columns: int
    dtype: str
    grid: int
    threads: int
    tile: int
    tiles_per_block: int

    @property
    def tiles(self) -> int:
        return -(-self.columns // self.tile) if self.tile else 0

    @property
    def shared_bytes(self) -> int:
        return self.tiles_per_block * self.depth * self.tile * _itemsize(self.dtype)

    def render(self) -> str:
        if not self.columns:
            return f"one launch for {self.steps} steps, grid {self.grid} x {self.threads}, no GEMM"
        return (f"one launch for {self.steps} steps, grid {self.grid} x {self.threads}, W {self.depth}x{self.columns} "
                f"{self.dtype} on chip in {self.tiles} tile(s) of {self.tile} columns "
                f"({self.tiles_per_block} per block, {self.shared_bytes} B shared)")


@dataclass(frozen=True)
class Measurement:
    """GIR_GPU_PERSISTENT=measure at the first call: one eager run each way (compiling), then
    each timed (CUDA events on a GPU, the best of `MEASURE_REPEATS`); the faster is kept. In
    the simulator the times are Python's, meaningless for a GPU: the host loop is kept."""

    host_seconds: float
    persistent_seconds: float
    chosen: str
    why: str

    def render(self) -> str:
        return (f"measured host loop {self.host_seconds * 1e3:.3f} ms, "
                f"persistent {self.persistent_seconds * 1e3:.3f} ms ({self.why})")


@dataclass(frozen=True)
class ScanPath:
    """The decision for one scan: the mode asked for, the plan where eligible, else why not."""

    label: str
    mode: str
    plan: PersistentPlan | None
    refusal: str | None
    measured: Measurement | None = None
    """GIR_GPU_PERSISTENT=measure: the first call's times and the choice."""

    @property
    def wanted(self) -> bool:
        return self.plan is not None and self.mode in ("on", "measure")

    def render(self) -> str:
        if self.plan is None:
            return f"host loop: {self.refusal}"
        if self.mode == "off":
            return f"host loop: GIR_GPU_PERSISTENT=off (eligible: {self.plan.render()})"
        if self.measured is not None:
            return f"{self.measured.chosen} ({self.mode}): {self.plan.render()}; {self.measured.render()}"
        return f"persistent ({self.mode}): {self.plan.render()}"


MEASURE_REPEATS = 3


def _itemsize(dtype: str) -> int:
    return {"f32": 4, "f64": 8, "i32": 4, "i64": 8, "i1": 1}.get(dtype, 8)


# ---------------------------------------------------------------------------------------------
# The decision (analysis: the IR and the device, no code)


def _refusal(loop: LoopView) -> tuple[list[Operation], str | None]:
    """(the step's GEMMs, None) where the body is one a persistent kernel can run (at most one
    GEMM), else why not. What only the trace sees (a copy or xp launch per step) it refuses later."""
    if loop.trip_count is None:
        return [], "no static trip count"
    if not loop.trip_count:
        return [], "no time step"
    ops = list(loop.body)
    nested = next((op for op in ops if op.spec.loop), None)
    if nested is not None:
        return [], f"a nested loop at {nested.loc}"
    outer = _enclosing_loop(loop.op)
    if outer is not None:  # its rows and buffers move with the outer step: the binding is per call
        return [], f"inside the loop at {outer.loc}"
    gemms = [op for op in ops if op.spec.category == "matmul"]
    if len(gemms) > 1:
        return gemms, f"{len(gemms)} GEMMs per step (at most one is supported)"
    body_values = {r for op in ops for r in op.results} | set(loop.body.args)
    for gemm in gemms:
        a, w = gemm.operands
        if a.tensor_type.rank != 2 or w.tensor_type.rank != 2:
            return gemms, f"the step's GEMM is not 2-D @ 2-D at {gemm.loc}"
        if w.tensor_type.dtype not in ("f32", "f64") or a.tensor_type.dtype != w.tensor_type.dtype:
            return gemms, f"the step's GEMM is not float32 or float64 at {gemm.loc}"
        if w in body_values:
            return gemms, f"the step's GEMM has no loop-invariant right operand at {gemm.loc}"
    return gemms, None


def _enclosing_loop(op: Operation) -> Operation | None:
    block = op.parent
    while block is not None:
        owner = block.parent_op
        if owner is None:
            return None
        if owner.spec.loop:
            return owner
        block = owner.parent
    return None


def decide(loop: LoopView, label: str, dev: Device, mode: str) -> ScanPath:
    """The scan's path (module docstring): the plan where the body and the device allow it."""
    gemms, why = _refusal(loop)
    if why is not None:
        return ScanPath(label, mode, None, why)
    steps, blocks, threads = int(loop.trip_count), multiprocessors(dev), dev.threads_per_block  # type: ignore[arg-type]
    if not gemms:  # an elementwise recurrence: its kernels' phases alone
        return ScanPath(label, mode, PersistentPlan(steps, 0, 0, 0, "", blocks, threads, 0, 0), None)
    gemm = gemms[0]
    rows, depth = (int(d) for d in gemm.operands[0].tensor_type.shape)  # type: ignore[arg-type]
    columns = int(gemm.operands[1].tensor_type.shape[1])  # type: ignore[arg-type]
    if not rows * depth * columns:
        return ScanPath(label, mode, None, "an empty GEMM")
    tile = max(1, min(-(-columns // blocks), threads))  # the simulator: several tiles a block
    tiles = -(-columns // tile)
    grid = min(blocks, tiles)
    plan = PersistentPlan(steps, rows, depth, columns, gemm.result.tensor_type.dtype, grid, threads, tile,
                          -(-tiles // grid))
    if plan.shared_bytes > SHARED_BUDGET - PHASE_SHARED:
        return ScanPath(label, mode, None, f"W's columns per block need {plan.shared_bytes} B of shared memory, "
                        f"over the budget of {SHARED_BUDGET - PHASE_SHARED} B")
    return ScanPath(label, mode, plan, None)


def multiprocessors(dev: Device) -> int:
    """Blocks of the cooperative grid: one per multiprocessor (all resident at once). The
    simulator runs a cooperative grid as one block."""
    if dev.simulated:
        return 1
    return int(dev.cuda.get_current_device().MULTIPROCESSOR_COUNT)


# ---------------------------------------------------------------------------------------------
# The trace: the host loop's step functions, device work recorded instead of issued


class Refused(GirError):
    """The trace met device work a persistent kernel does not hold (a copy, an xp launch). A
    GirError so that the body's steps pass it on as it is (codegen.run_steps); never reaches
    the user: the scan stays a host loop, the reason in its ScanPath."""


@dataclass
class Phase:
    """One phase of a step: a generated kernel (with its launch size and arguments) or the GEMM."""

    kernel: ElementwiseKernel | None
    n: int = 0
    args: list[Any] = field(default_factory=list)
    """A kernel's arguments (kernel arguments, ints); the GEMM's (a, w, out) xp arrays."""


def _trace(low: Lowering, host: HostScan, env: Env) -> tuple[list[list[Phase]], list[Env]]:
    """Per step, its phases; and env as each step left it (copies: the real env is not touched),
    the last as the loop leaves it. Gathers, scatters and unfolded reductions are xp launches
    (refused); an `index` by a computed index reads its scalar back (refused)."""
    env = dict(env)
    steps: list[list[Phase]] = []
    seen: list[Env] = []

    def launch(kernel: ElementwiseKernel, n: int, args: list[Any]) -> None:
        if n:
            steps[-1].append(Phase(kernel, n, list(args)))

    def gemm(a: Any, b: Any, out: Any) -> None:
        steps[-1].append(Phase(None, 0, [a, b, out]))

    def refuse(what: str) -> Callable[..., Any]:
        def fail(*_: Any, **__: Any) -> Any:
            raise Refused(what)
        return fail

    patched = {"launch": launch, "gemm": gemm, "xp_call": refuse("an xp launch per step (a reduction, gather "
                                                                  "or scatter not folded into a kernel)"),
               "duplicate": refuse("a device copy per step"), "copy": lambda dst, src: None}
    for name, fn in patched.items():
        setattr(low, name, fn)
    try:
        host.enter(env)  # its copies are outside the loop: not recorded
        low.copy = refuse("a device copy per step")  # type: ignore[method-assign]
        reads = low.counters.read_backs
        for i, t in enumerate(host.order):
            steps.append([])
            host.step(env, i, t)
            seen.append(dict(env))
            if low.counters.read_backs != reads:  # `index` by a computed index: its row differs per step
                raise Refused("a scalar read back to the host per step")
    finally:
        for name in patched:
            delattr(low, name)
    return steps, seen


# ---------------------------------------------------------------------------------------------
# The binding: per step and array, a base (a flat kernel argument) and an offset in it


@dataclass
class Slot:
    """One array a phase reads or writes, over the steps: the bases it lies in (indices into
    Binding.bases), per step which of those (`choice`) and where in it (`offset`, elements)."""

    bases: list[int]
    size: int
    """Elements of a kernel argument (its slice of the base); 0 for a GEMM operand."""
    choice: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    strides: tuple[int, ...] = ()
    """A GEMM operand's strides, in elements (the same every step)."""


@dataclass
class Binding:
    """Where every phase's arrays are in every step (module docstring)."""

    bases: list[Any] = field(default_factory=list)
    """Kernel arguments (flat device arrays) the slots lie in."""
    base_types: list[str] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    phases: list[tuple[ElementwiseKernel | None, int, list[int | str]]] = field(default_factory=list)
    """Per phase: its kernel (None: the GEMM), n, its arguments (a slot index, or a literal as text)."""
    _keys: dict[tuple, int] = field(default_factory=dict)

    def base(self, key: tuple, wrapper: Any) -> int:
        found = self._keys.get(key)
        if found is None:
            found = self._keys[key] = len(self.bases)
            self.bases.append(wrapper)
            self.base_types.append(f"{NUMBA_TYPES[_DTYPE_NAMES[key[2]]]}[::1]")
        return found


_DTYPE_NAMES = {"<f4": "f32", "<f8": "f64", "<i4": "i32", "<i8": "i64", "|b1": "i1"}


class _Places:
    """Finds the base of an array: the arrays the function owns (its static arrays, env's,
    the arena as each dtype), C-contiguous, the largest that holds it first."""

    def __init__(self, low: Lowering, envs: list[Env]):
        self.low = low
        self.keys = {id(w): key for key, w in low._args.items()}
        self.keys[id(low.err_arg)] = (low.dev.address(low.err), 1, low.err.dtype.str)
        arrays = [*low.static.values(), *(a for env in envs for a in env.values())]
        arena = low.memory.arena
        if arena is not None:
            for dtype in _DTYPE_NAMES:
                size = _bytes(dtype)
                arrays.append(arena[: arena.size - arena.size % size].view(dtype))
        found = {}
        for a in arrays:
            if hasattr(a, "flags") and a.flags.c_contiguous and a.size:
                lo, hi = low.extent(a)
                found[(lo, hi, a.dtype.str)] = a
        self.candidates = sorted(found.items(), key=lambda kv: kv[0][0] - kv[0][1])  # largest first

    def locate(self, lo: int, hi: int, dtype: str, binding: Binding) -> tuple[int, int]:
        """(base, element offset of lo in it) for the bytes [lo, hi) of dtype."""
        for (c_lo, c_hi, c_dtype), array in self.candidates:
            if c_dtype == dtype and c_lo <= lo and hi <= c_hi and (lo - c_lo) % array.itemsize == 0:
                key = (c_lo, array.size, dtype)
                return binding.base(key, self.low.kernel_arg(array)), (lo - c_lo) // array.itemsize
        raise Refused("an array outside the function's own buffers")


def bind(low: Lowering, plan: PersistentPlan, steps: list[list[Phase]], envs: list[Env]) -> Binding:
    """The binding of the traced steps; Refused where they differ in structure (kernels, sizes,
    the GEMM's W) or from the plan, or an array lies outside the function's buffers."""
    first = steps[0]
    shape = [(p.kernel, p.n, len(p.args)) for p in first]
    if any([(p.kernel, p.n, len(p.args)) for p in step] != shape for step in steps):
        return _refuse("the steps launch different work")
    if not first:
        return _refuse("no device work in a step")
    if sum(p.kernel is None for p in first) != (1 if plan.columns else 0):
        return _refuse("the step's GEMMs are not the plan's")
    places, binding = _Places(low, envs), Binding()
    for k, phase in enumerate(first):
        column = [step[k] for step in steps]
        args: list[int | str]
        if phase.kernel is None:
            args = [_gemm_slot(low, places, binding, [p.args[j] for p in column], j == 1) for j in range(3)]
        else:
            args = [_kernel_slot(places, binding, [p.args[j] for p in column]) for j in range(len(phase.args))]
        binding.phases.append((phase.kernel, phase.n, args))
    return binding


SHARED_ARRAY = re.compile(r"cuda\.shared\.array\((\d+), (\w+)\)")
"""A shared array in a generated kernel's source (kernels.py writes them with literal sizes)."""


def phase_shared_bytes(binding: Binding) -> int:
    """Shared memory the phases' own arrays take (a grid total's tree, whole-array reductions):
    once per phase, since each inlined `cuda.shared.array` is an allocation of its own."""
    return sum(int(size) * _itemsize(dtype) for kernel, _, _ in binding.phases if kernel is not None
               for size, dtype in SHARED_ARRAY.findall(kernel.source.text))


def _refuse(why: str) -> Any:
    raise Refused(why)


def _kernel_slot(places: _Places, binding: Binding, per_step: list[Any]) -> int | str:
    """A kernel argument over the steps: a literal (an int), else a slot."""
    if isinstance(per_step[0], int):
        if any(a != per_step[0] for a in per_step):
            raise Refused("a kernel's scalar argument changes from step to step")
        return str(per_step[0])
    keys = [places.keys.get(id(a)) for a in per_step]
    if any(key is None for key in keys) or len({key[1:] for key in keys}) != 1:  # type: ignore[index]
        raise Refused("a kernel argument the trace cannot place")
    slot = Slot([], keys[0][1])  # type: ignore[index]
    if len(set(keys)) == 1:  # the same array every step: itself the base
        slot.bases.append(binding.base(keys[0], per_step[0]))  # type: ignore[arg-type]
        slot.choice, slot.offset = [0] * len(per_step), [0] * len(per_step)
    else:
        for address, size, dtype in keys:  # type: ignore[misc]
            _place(slot, *places.locate(address, address + size * _bytes(dtype), dtype, binding))
    binding.slots.append(slot)
    return len(binding.slots) - 1


def _gemm_slot(low: Lowering, places: _Places, binding: Binding, per_step: list[Any], invariant: bool) -> int:
    """A GEMM operand (a strided xp array) over the steps; W (`invariant`) the same every step."""
    strides = {tuple(s // a.itemsize for s in a.strides) for a in per_step}
    if len(strides) != 1 or any(s % a.itemsize or s < 0 for a in per_step for s in a.strides):
        raise Refused("a GEMM operand's layout changes from step to step (or runs backwards)")
    if invariant and len({low.dev.address(a) for a in per_step}) != 1:
        raise Refused("the GEMM's W changes from step to step")
    slot = Slot([], 0, strides=strides.pop())
    for a in per_step:
        lo, hi = low.extent(a)
        _place(slot, *places.locate(lo, hi, a.dtype.str, binding))  # strides >= 0: lo is a[0, 0]
    binding.slots.append(slot)
    return len(binding.slots) - 1


def _place(slot: Slot, base: int, offset: int) -> None:
    if base not in slot.bases:
        slot.bases.append(base)
    slot.choice.append(slot.bases.index(base))
    slot.offset.append(offset)


def _bytes(dtype: str) -> int:
    return int(dtype[-1])


# ---------------------------------------------------------------------------------------------
# The kernel's source

STEP = " " * 8
"""Statements inside the time loop."""

KEEP = frozenset({"cuda", "math", "f32", "f64", "i32", "i64", "INF", "NAN", "range", "abs", "min", "max", "int",
                  "float", "bool", "True", "False", "None"})
"""Names a kernel's source shares with its module (kernels._define): never renamed."""


def kernel_source(plan: PersistentPlan, binding: Binding) -> KernelSource:
    """The persistent kernel: W's tiles into shared memory, then per step each phase and a grid
    sync. Parameters: the choice and offset tables (step-major, a row per step), the bases.
    The kernel's own names start `q_`; phase p's, inlined, `p{p}_` (a numba variable has one
    type, and the phases' `x0` may differ)."""
    params = ["q_sel", "q_off", *(f"q_b{j}" for j in range(len(binding.bases)))]
    types = ["int32[::1]", "int64[::1]", *binding.base_types]
    gemm = next((args for kernel, _, args in binding.phases if kernel is None), None)
    lines = ["@cuda.jit", f"def gir_elementwise({', '.join(params)}):", "    q_grid = cuda.cg.this_grid()",
             *(_load_w(plan, binding, int(gemm[1])) if gemm is not None else []),
             f"    for q_i in range({plan.steps}):"]
    for p, (kernel, n, args) in enumerate(binding.phases):
        if kernel is None:
            lines += _gemm_lines(plan, binding, [int(a) for a in args])
        else:
            lines += _phase_lines(binding, p, kernel, n, args)
        lines.append(f"{STEP}q_grid.sync()")
    # The phases' error codes are literals in their calls, registered when they were lowered.
    return KernelSource("\n".join(lines) + "\n", f"void({', '.join(types)})")


def _phase_lines(binding: Binding, p: int, kernel: ElementwiseKernel, n: int, args: list[int | str]) -> list[str]:
    """Phase p: its kernel's body inlined, its parameters bound to this step's arrays. A kernel
    written for one block (a whole-array reduction) runs in block 0 alone."""
    names, body = kernel_body(kernel.source)
    lines = [f"{STEP}p{p}_n = {n}"]
    for name, a in zip(names[1:], args):
        if isinstance(a, int):
            lines += _select(binding, a, f"p{p}_{name}", STEP)
        else:
            lines.append(f"{STEP}p{p}_{name} = {a}")
    indent = STEP if not kernel.source.single_block else STEP + "    "
    if kernel.source.single_block:
        lines.append(f"{STEP}if cuda.blockIdx.x == 0:")
    return lines + [indent + line[4:] for line in _renamed(body, f"p{p}_")]


def _renamed(lines: list[str], prefix: str) -> list[str]:
    """lines with every local name prefixed (not attributes, keywords or KEEP)."""
    text = "\n".join(line[4:] if line.startswith("    ") else line for line in lines) + "\n"
    out, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) and tok.string not in KEEP \
                and previous != ".":
            tok = tok._replace(string=prefix + tok.string)
        out.append(tok)
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT):
            previous = tok.string
    return ["    " + line for line in tokenize.untokenize(out).rstrip("\n").split("\n")]


def _select(binding: Binding, k: int, name: str, indent: str, step: str = "q_i") -> list[str]:
    """Statements binding `name` to slot k's array in step `step` (its slice of its base)."""
    slot, row = binding.slots[k], f"{step} * {len(binding.slots)} + {k}"
    off = f"q_o{k}"
    piece = (lambda j: f"q_b{j}[{off}:{off} + {slot.size}]") if slot.size else (lambda j: f"q_b{j}")
    lines = [f"{indent}{off} = q_off[{row}]"]
    if len(slot.bases) == 1:
        return [*lines, f"{indent}{name} = {piece(slot.bases[0])}"]
    lines.append(f"{indent}q_s{k} = q_sel[{row}]")
    for c, j in enumerate(slot.bases):
        head = "else:" if c == len(slot.bases) - 1 else f"{'if' if c == 0 else 'elif'} q_s{k} == {c}:"
        lines += [indent + head, f"{indent}    {name} = {piece(j)}"]
    return lines


def _load_w(plan: PersistentPlan, binding: Binding, w: int) -> list[str]:
    """Before the time loop: each block's tiles of W into its shared memory (`q_wsh`)."""
    s0, s1 = binding.slots[w].strides
    size = plan.depth * plan.tile
    return [f"    q_wsh = cuda.shared.array({plan.tiles_per_block * size}, {plan.dtype})",
            *_select(binding, w, "q_w", "    ", "0"),
            "    q_nt = 0", f"    for q_tile in range(cuda.blockIdx.x, {plan.tiles}, cuda.gridDim.x):",
            f"        for q_e in range(cuda.threadIdx.x, {size}, cuda.blockDim.x):",
            f"            q_col = q_tile * {plan.tile} + q_e % {plan.tile}",
            f"            if q_col < {plan.columns}:",
            f"                q_wsh[q_nt * {size} + q_e] = q_w[q_o{w} + (q_e // {plan.tile}) * {s0} + q_col * {s1}]",
            "        q_nt += 1", "    cuda.syncthreads()"]


def _gemm_lines(plan: PersistentPlan, binding: Binding, args: list[int]) -> list[str]:
    """One step's `out = a @ W`: each block its tiles' columns, W from shared memory."""
    a, _, out = args
    a0, a1 = binding.slots[a].strides
    o0, o1 = binding.slots[out].strides
    size, d, tile = plan.depth * plan.tile, plan.dtype, plan.tile
    return [*_select(binding, a, "q_ga", STEP), *_select(binding, out, "q_go", STEP),
            f"{STEP}q_nt = 0", f"{STEP}for q_tile in range(cuda.blockIdx.x, {plan.tiles}, cuda.gridDim.x):",
            f"{STEP}    for q_e in range(cuda.threadIdx.x, {plan.rows * tile}, cuda.blockDim.x):",
            f"{STEP}        q_r = q_e // {tile}", f"{STEP}        q_c = q_e % {tile}",
            f"{STEP}        q_col = q_tile * {tile} + q_c", f"{STEP}        if q_col < {plan.columns}:",
            f"{STEP}            q_acc = {d}(0)", f"{STEP}            for q_k in range({plan.depth}):",
            f"{STEP}                q_acc = {d}(q_acc + q_ga[q_o{a} + q_r * {a0} + q_k * {a1}]"
            f" * q_wsh[q_nt * {size} + q_k * {tile} + q_c])",
            f"{STEP}            q_go[q_o{out} + q_r * {o0} + q_col * {o1}] = q_acc",
            f"{STEP}    q_nt += 1"]


# ---------------------------------------------------------------------------------------------
# Running it


@dataclass(eq=False)
class PersistentKernel:
    """The compiled persistent kernel, launched like a generated kernel (Lowering.launch counts
    it): `grid` blocks of `threads`, cooperatively (numba-cuda does so for a grid sync)."""

    source: KernelSource
    kernel: Any
    grid: int
    threads: int

    @property
    def error_sites(self) -> list[tuple[str, Operation]]:
        return []

    def launch(self, dev: Device, n: int, args: list[Any]) -> None:
        dev.launch(self.kernel, (self.grid, self.threads), tuple(args))


def scan_path(low: Lowering, op: Operation, loop: LoopView, host: HostScan) -> Callable[[Env], None]:
    """The scan's step: the host loop, or one persistent kernel where decided (`decide`)."""
    path = decide(loop, host.label, low.dev, current().gpu_persistent)
    low.scan_paths[host.label] = path
    if not path.wanted:
        return lambda env: host.run(low, env)
    return PersistentScan(low, host, path).run


@dataclass(eq=False)
class PersistentScan:
    """A scan run as one kernel: traced and compiled at its first run (module docstring)."""

    low: Lowering
    host: HostScan
    path: ScanPath
    kernel: PersistentKernel | None = None
    args: list[Any] = field(default_factory=list)
    final: Env = field(default_factory=dict)
    """The carries' body arguments after the loop (where the last step left them)."""
    refused: bool = False

    def run(self, env: Env) -> None:
        if self.kernel is None and not self.refused:
            self._prepare(env)
        measured = self.path.measured
        if self.refused or (measured is not None and measured.chosen == "host loop"):
            self.host.run(self.low, env)
        elif self.path.mode == "measure" and measured is None:
            self._measure(env)
        else:
            self._launch(env)

    def _settle(self, **change: Any) -> None:
        self.path = replace(self.path, **change)
        self.low.scan_paths[self.host.label] = self.path

    def _prepare(self, env: Env) -> None:
        import numpy as np

        low, plan = self.low, self.path.plan
        assert plan is not None
        try:
            steps, seen = _trace(low, self.host, env)
            binding = bind(low, plan, steps, [env, *seen])
        except Refused as e:
            self.refused = True
            self._settle(plan=None, refusal=f"at the first call: {e.message}")
            return
        shared = plan.shared_bytes + phase_shared_bytes(binding)
        if shared > SHARED_BUDGET:
            self.refused = True
            self._settle(plan=None, refusal=f"at the first call: W's tiles and the phases' shared arrays need "
                                            f"{shared} B of shared memory, over {SHARED_BUDGET} B")
            return
        rows = len(binding.slots)
        sel = np.array([[s.choice[i] for s in binding.slots] for i in range(plan.steps)], np.int32).reshape(-1)
        off = np.array([[s.offset[i] for s in binding.slots] for i in range(plan.steps)], np.int64).reshape(-1)
        tables = [low.memory.constant(t if rows else np.zeros(1, t.dtype)) for t in (sel, off)]
        source = kernel_source(plan, binding)
        self.kernel = PersistentKernel(source, compile_kernel(low.dev, source).kernel, plan.grid, plan.threads)
        low.kernels.append(self.kernel)  # type: ignore[arg-type]
        self.args = [*(low.kernel_arg(t) for t in tables), *binding.bases]
        self.final = {a: seen[-1][a] for a in self.host.carry_args}

    def _launch(self, env: Env) -> None:
        low, host = self.low, self.host
        assert self.kernel is not None
        host.enter(env)
        before = low.counters.snapshot()
        try:
            low.launch(self.kernel, 1, self.args)  # type: ignore[arg-type]
        except Exception as e:  # on a GPU: a cooperative grid too large for it, say
            if low.dev.simulated or low.blas is not None:
                raise
            self.refused = True
            self._settle(plan=None, refusal=f"the cooperative launch failed: {type(e).__name__}: {e}")
            host.loop(low, env)
            host.leave(env)
            return
        low.counters.record_steps(host.label, before, len(host.order))
        env.update(self.final)
        host.leave(env)

    def _measure(self, env: Env) -> None:
        """Both ways once (compiling), then timed; the faster kept (the host loop in the
        simulator, whose times say nothing of a GPU's)."""
        low, host = self.low, self.host
        host.run(low, env)
        self._launch(env)
        if self.refused:
            return
        repeats = 1 if low.dev.simulated else MEASURE_REPEATS
        timer = _timer(low.dev)
        host_s = min(timer(lambda: host.run(low, env)) for _ in range(repeats))
        mine = min(timer(lambda: self._launch(env)) for _ in range(repeats))
        if low.dev.simulated:
            chosen, why = "host loop", "the simulator's times say nothing of a GPU: host loop kept"
        else:
            chosen, why = ("persistent", "faster") if mine < host_s else ("host loop", "faster")
        self._settle(measured=Measurement(host_s, mine, chosen, why))


def _timer(dev: Device) -> Callable[[Callable[[], None]], float]:
    """Seconds a piece of device work takes: CUDA events on a GPU, the clock in the simulator."""
    def clock(work: Callable[[], None]) -> float:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    if dev.simulated:
        return clock
    cuda = dev.xp.cuda

    def events(work: Callable[[], None]) -> float:
        start, end = cuda.Event(), cuda.Event()
        start.record()
        work()
        end.record()
        end.synchronize()
        return float(cuda.get_elapsed_time(start, end)) / 1e3

    return events
