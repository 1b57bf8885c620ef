"""Running a placed function split between the CPU and the GPU (`gir.jit(..., device="auto")`).

The `place` pass (transforms/placement.py) leaves every op with a device (`{device = "gpu"}`; a
`scan` or `fused` op has its body ops') and a `transfer` wherever a value crosses. This module
cuts the function at those transfers, compiles each piece with its device's backend, and runs
the pieces in order, executing the transfers between them:

    func @f(%x, %y, %w) {                          stage 0 (cpu): @f.cpu0(%x, %y) -> %island
      %x_gpu = transfer %x {device = "gpu"}        h2d %x_gpu, %w_gpu
      %w_gpu = transfer %w {device = "gpu"}        stage 1 (gpu): @f.gpu1(%x_gpu, %w_gpu) -> %t
      %e = exp %x {device = "cpu"}                 d2h %t_cpu
      %island = add %e, %y {device = "cpu"}
      %m = matmul %x_gpu, %w_gpu {device = "gpu"}
      %t = tanh %m {device = "gpu"}
      %t_cpu = transfer %t {device = "cpu"}
      return %island, %t_cpu
    }

Terms.
- *Home* of a value: where it lives: a function argument on the CPU, a `transfer`'s result on
  its `device`, any other op's result on its op's device.
- *Stage*: top-level ops are scheduled as soon as their inputs allow (ASAP) into stages whose
  devices alternate, even stages on the CPU, odd ones on the GPU: an op runs in the first stage
  of its device not before any stage its inputs come from, a transfer to device D in the first
  stage of D after its source's. This needs the fewest alternations the dependences allow
  (every chain cpu -> gpu -> cpu ... in the graph is as long as the number of stages), so two
  independent islands on the CPU share a stage even if a GPU op stands between them in the text.
- *Segment*: the ops of one stage, in program order, outlined into a function of their own
  (`@f.gpu1`, its arguments the values it reads from elsewhere, its results the values read
  elsewhere) and compiled once by its backend, with a memory plan of its own: a CPU segment is
  one native call (llvmlite; no Python between its ops), a GPU segment the GPU backend's steps
  (its scans driven from the host over device buffers, as with device="gpu").
- *Crossing*: a `transfer` op, run between segments: host-to-device (h2d) uploads straight into
  the argument buffer of the first GPU segment that reads it, device-to-host (d2h) downloads
  into a new NumPy array. These are the only copies between host and device, except a GPU
  backend's read-back of a computed `index` (counted as `read_backs`). A GPU value read by a
  later GPU segment is copied device-to-device into that segment's argument buffer.

Loops: `place` puts a loop on one device, body and all (a loop body on both devices is its
error), and hoists transfers out of loop bodies; a loop is therefore inside one segment and no
transfer runs per step. A `scan` on the GPU stays host-driven, as with device="gpu".

Known gaps: each segment has its own memory (its own arena; values crossing between segments
are copied); segments run one after another on one stream, never overlapping (a CPU segment
does not run while the GPU computes); calls are serialised (a lock, as in the GPU backend).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analysis.memory.aliases import OPS, STRIDED
from ..analysis.memory.plan import MemoryPlan
from ..analysis.memory.planner import plan_memory
from ..errors import GirError
from ..ir.core import Function, Module, Operation, Value
from ..ir.interpreter import check_arguments
from ..ir.ops import make_op
from ..ir.printer import Printer, print_function
from ..ir.types import TensorType

CPU, GPU = "cpu", "gpu"
_PARITY = {CPU: 0, GPU: 1}


# ---------------------------------------------------------------------------------------------
# Where things run


def op_device(op: Operation) -> str | None:
    """The device a top-level op runs on: its `device` attribute; for `scan` and `fused`, which
    print none, their body ops'; None for a loop whose body computes nothing."""
    device = op.attrs.get("device")
    if device is not None:
        return device
    if not op.regions:
        return CPU  # not placed (no `place` in the pipeline, or an op kind placement leaves alone)
    for inner in op.walk():
        if inner is not op and not inner.spec.moves_device and "device" in inner.attrs:
            return inner.attrs["device"]
    return None


@dataclass(eq=False)
class Segment:
    """The ops of one stage, outlined and compiled."""

    stage: int
    device: str
    ops: list[Operation]
    inputs: list[Value] = field(default_factory=list)
    """Values of the placed function it reads from elsewhere, in order of first use."""
    outputs: list[Value] = field(default_factory=list)
    """Values it defines that something elsewhere reads."""
    function: Function | None = None
    """The outlined function (`@f.gpu1`)."""
    compiled: Any = None
    """Its CPUFunction or GPUFunction."""

    @property
    def name(self) -> str:
        return f"{self.device}{self.stage}"


@dataclass(eq=False)
class Crossing:
    """One `transfer` op, run before the segment of its stage."""

    op: Operation
    stage: int
    direction: str
    """h2d, d2h, or `alias`: a transfer to where its source already lives (nothing moves)."""
    target: tuple[Segment, int] | None = None
    """For h2d: the GPU segment (and argument) whose argument buffer the upload fills."""


class _Scheduler:
    """Assigns stages (module docstring) to the top-level ops of one function."""

    def __init__(self, f: Function):
        self.f = f
        self.top: dict[Operation, Operation] = {}
        """Every op -> its top-level ancestor."""
        self.stage: dict[Operation, int] = {}
        self.device: dict[Operation, str] = {}
        self.inputs: dict[Operation, list[Value]] = {}
        """Top-level op -> the values it (or its body) reads from outside it."""
        for op in f.body:
            for inner in op.walk():
                self.top[inner] = op

    def owner(self, v: Value) -> Operation | None:
        """The top-level op defining v (or whose body does); None for a function argument."""
        op = v.defining_op
        if op is not None:
            return self.top[op]
        block = v.defining_block
        parent = block.parent_op if block is not None else None
        return None if parent is None else self.top[parent]

    def home(self, v: Value) -> tuple[str, int]:
        """(where v lives, the stage it is made in; -1 for an argument)."""
        owner = self.owner(v)
        return (CPU, -1) if owner is None else (self.device[owner], self.stage[owner])

    def external_inputs(self, op: Operation) -> list[Value]:
        """The values op and its body read that are defined outside op, in order of first use."""
        seen: dict[Value, None] = {}
        for inner in op.walk():
            for v in inner.operands:
                if isinstance(v.type, TensorType) and self.owner(v) is not op:
                    seen[v] = None
        return list(seen)

    def place(self, op: Operation) -> None:
        """Sets op's device and stage (its inputs are placed: program order is a topological one)."""
        inputs = self.inputs[op] = self.external_inputs(op)
        if op.spec.moves_device:
            to = op.attrs["device"]
            have, at = self.home(op.operands[0])
            self.device[op] = to
            self.stage[op] = at if have == to else _first_stage(to, at + 1)
            return
        device = op_device(op)
        if device is None:  # an empty loop moves data only: it stays with its inputs (as `place` decides)
            device = GPU if any(self.home(v)[0] == GPU for v in inputs) else CPU
        earliest = -1
        for v in inputs:
            have, at = self.home(v)
            if have != device:
                raise GirError(f"'{op.name}' runs on the {device} but reads a value that lives on the {have} with "
                               "no transfer between them (device=\"auto\" runs what the `place` pass decided)", op.loc)
            earliest = max(earliest, at)
        self.device[op] = device
        self.stage[op] = _first_stage(device, earliest)


def _first_stage(device: str, earliest: int) -> int:
    """The first stage of device at or after earliest (stage 0 is the CPU's, 1 the GPU's, ...)."""
    s = max(earliest, 0)
    return s if s % 2 == _PARITY[device] else s + 1


def split_function(f: Function) -> list[Segment | Crossing]:
    """The schedule of a placed function: by stage, its crossings, then its segment; each
    segment's inputs and outputs filled in (not yet outlined or compiled)."""
    sched = _Scheduler(f)
    crossings: list[Crossing] = []
    by_stage: dict[int, Segment] = {}
    for op in f.body:
        if op.spec.terminator:
            continue
        sched.place(op)
        stage = sched.stage[op]
        if op.spec.moves_device:
            have = sched.home(op.operands[0])[0]
            direction = "alias" if have == op.attrs["device"] else ("h2d" if have == CPU else "d2h")
            crossings.append(Crossing(op, stage, direction))
            continue
        segment = by_stage.get(stage)
        if segment is None:
            segment = by_stage[stage] = Segment(stage, sched.device[op], [])
        segment.ops.append(op)
    segment_of = {op: seg for seg in by_stage.values() for op in seg.ops}
    for seg in by_stage.values():
        inputs: dict[Value, None] = {}
        for op in seg.ops:
            for v in sched.inputs[op]:
                owner = sched.owner(v)
                if owner is None or segment_of.get(owner) is not seg:
                    inputs[v] = None
        seg.inputs = list(inputs)
        seg.outputs = [r for op in seg.ops for r in op.results
                       if any(segment_of.get(sched.top[user]) is not seg for user, _ in r.uses)]
    crossings_at: dict[int, list[Crossing]] = {}
    for c in crossings:
        crossings_at.setdefault(c.stage, []).append(c)
    schedule: list[Segment | Crossing] = []
    for stage in sorted(set(crossings_at) | set(by_stage)):
        schedule.extend(crossings_at.get(stage, []))
        last = by_stage.get(stage)
        if last is not None and last.outputs:  # a segment nobody reads from computes nothing observable
            schedule.append(last)
    _set_targets(schedule)
    return schedule


def _set_targets(schedule: list[Segment | Crossing]) -> None:
    """Each h2d crossing uploads into the first GPU segment that reads its result."""
    for i, item in enumerate(schedule):
        if not isinstance(item, Crossing) or item.direction != "h2d":
            continue
        value = item.op.result
        for later in schedule[i + 1:]:
            if isinstance(later, Segment) and value in later.inputs:
                item.target = (later, later.inputs.index(value))
                break


def outline(f: Function, seg: Segment) -> Function:
    """The segment's ops as a function of their own: `@f.gpu1(inputs) -> outputs`."""
    g = Function(f"{f.name}.{seg.name}", [v.tensor_type for v in seg.inputs],
                 [v.tensor_type for v in seg.outputs], [v.name_hint for v in seg.inputs], f.loc)
    value_map: dict[Value, Value] = dict(zip(seg.inputs, g.args))
    for op in seg.ops:
        g.body.append(op.clone(value_map))
    g.body.append(make_op("return", [value_map[v] for v in seg.outputs], loc=f.loc))
    Module([g], f.module.filename if f.module is not None else "<split>")
    return g


# ---------------------------------------------------------------------------------------------
# The compiled function


@dataclass
class Stats:
    """What a call did (`fn.stats`: the calling thread's last call)."""

    h2d: int = 0
    """Host-to-device transfers executed (one per `transfer {device = "gpu"}` op)."""
    d2h: int = 0
    """Device-to-host transfers executed (one per `transfer {device = "cpu"}` op)."""
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    read_backs: int = 0
    """Scalars the GPU backend read back to the host (`index` by a computed index), not transfers in the IR."""
    device_copies: int = 0
    """GPU values copied device-to-device into a later GPU segment's argument buffer."""
    segments: list[tuple[str, float]] = field(default_factory=list)
    """(segment, seconds) in the order they ran."""
    kernel_launches: int = 0
    gemm_calls: int = 0
    """GEMMs on both devices."""
    seconds: float = 0.0
    compile: Any = None
    """How the function was compiled (gir.jit sets it: a `jitstats.CompileStats`)."""

    @property
    def transfers(self) -> dict[str, int]:
        return {"h2d": self.h2d, "d2h": self.d2h}


class SplitFunction:
    """A placed function compiled as CPU and GPU segments (module docstring)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None):
        self.function = function
        self.schedule = split_function(function)
        self.segments = [s for s in self.schedule if isinstance(s, Segment)]
        self.crossings = [c for c in self.schedule if isinstance(c, Crossing)]
        strategy = plan.strategy if plan is not None else "auto"  # the pipeline's memplan options
        self.dev: Any = None
        for seg in self.segments:
            seg.function = outline(function, seg)
            # a GPU segment's plan knows the views and loop buffers the GPU lowering makes, as
            # device="gpu"'s (memplan{views=strided}); a CPU segment's, the registry's views
            seg_plan = plan_memory(seg.function, strategy=strategy, views=STRIDED if seg.device == GPU else OPS)
            if seg.device == GPU:
                from .gpu.runtime import GPUFunction

                seg.compiled = GPUFunction.compile(seg.function, seg_plan)
                self.dev = seg.compiled.dev
            else:
                from .cpu.runtime import CPUFunction

                seg.compiled = CPUFunction.compile(seg.function, seg_plan)
        if self.dev is None and any(c.direction != "alias" for c in self.crossings):
            from .gpu.device import get_device

            self.dev = get_device()
        self.results = _returned(function)
        self._lock = threading.Lock()
        """Held for a whole call: GPU segments own one set of device buffers (gpu/runtime.py)."""
        self._local = threading.local()
        self._last_stats = Stats()
        self.ir = ""
        """The placed IR (set by gir.jit)."""
        self.placement: Any = None
        """The `place` pass's PlacementReport of the function (set by gir.jit; None without one)."""
        self.compile_stats: Any = None
        """How the driver compiled it (a driver/jitstats.CompileStats, set by the driver)."""
        self.compile_seconds: dict[str, float] = {}
        self.code_info: Any = None
        self.gemms: list[Any] = []
        self.workspace_bytes: int | None = None

    @classmethod
    def compile(cls, function: Function, plan: MemoryPlan | None = None) -> SplitFunction:
        """Splits and compiles a placed function; plan (the pipeline's `memplan` result, for the
        whole function) gives the strategy each segment's own plan uses."""
        return cls(function, plan)

    # -- inspection ---------------------------------------------------------------------------
    @property
    def stats(self) -> Stats:
        return getattr(self._local, "stats", self._last_stats)

    @property
    def preparing(self) -> str:
        """Better code a CPU segment is making in the background ('' none): its `preparing`."""
        return next((s.compiled.preparing for s in self.segments if s.compiled is not None and s.compiled.preparing),
                    "")

    def describe(self) -> str:
        """The schedule, one line per crossing or segment, in the order a call runs them."""
        printer = Printer()
        printer.function(self.function)
        names = printer.names  # the placed IR's names (fn.ir)
        lines = [f"split of @{self.function.name}: {len(self.segments)} segment(s), "
                 f"{sum(c.direction == 'h2d' for c in self.crossings)} h2d and "
                 f"{sum(c.direction == 'd2h' for c in self.crossings)} d2h transfer(s) per call"]
        for item in self.schedule:
            if isinstance(item, Crossing):
                src = item.op.operands[0]
                lines.append(f"  {item.direction:<5} {names[src]} -> {names[item.op.result]}")
            else:
                g = item.function
                assert g is not None
                ops = sum(1 for op in g.walk() if not op.spec.terminator)  # nested ops too
                ins = ", ".join(names[v] for v in item.inputs)
                outs = ", ".join(names[v] for v in item.outputs)
                lines.append(f"  {item.device:<5} @{g.name}({ins}) -> ({outs})  [{ops} ops]")
        return "\n".join(lines) + "\n"

    @property
    def segments_ir(self) -> str:
        """The outlined segment functions, printed."""
        return "\n".join(print_function(s.function) for s in self.segments)  # type: ignore[arg-type]

    @property
    def llvm_ir(self) -> str:
        """Each segment's: LLVM IR for the CPU ones, kernel sources for the GPU ones."""
        return "\n".join(f"; ---- {s.device} segment @{s.function.name}\n{s.compiled.llvm_ir}"  # type: ignore[union-attr]
                         for s in self.segments)

    @property
    def asm(self) -> str:
        return "\n".join(f"; ---- {s.device} segment @{s.function.name}\n{s.compiled.asm}"  # type: ignore[union-attr]
                         for s in self.segments)

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> list[np.ndarray]:
        # A view is as good as an array (as on the GPU): copied where the CPU needs contiguity.
        return self.run(check_arguments(self.function, args))

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """A call on arguments checked already (count, dtype, shape: `check_arguments`)."""
        arrays = [a if a.flags.c_contiguous else a.copy(order="C") for a in arrays]
        with self._lock:
            return self._run(arrays)

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        start = time.perf_counter()
        stats = Stats()
        env: dict[Value, Any] = dict(zip(self.function.args, arrays))
        for item in self.schedule:
            if isinstance(item, Crossing):
                self._cross(item, env, stats)
            else:
                began = time.perf_counter()
                self._segment(item, env, stats)
                stats.segments.append((item.name, time.perf_counter() - began))
        outs: list[np.ndarray] = []
        seen: set[int] = set()
        for v in self.results:
            a = env[v]
            if id(a) in seen or v.defining_op is None:  # a result twice, or an argument: a copy of its own
                a = np.array(a, copy=True)
            seen.add(id(a))
            outs.append(a)
        stats.seconds = time.perf_counter() - start
        self._local.stats = self._last_stats = stats
        return outs

    def _cross(self, c: Crossing, env: dict[Value, Any], stats: Stats) -> None:
        src = env[c.op.operands[0]]
        if c.direction == "alias":
            env[c.op.result] = src
        elif c.direction == "h2d":
            if c.target is not None:
                seg, index = c.target
                dst = seg.compiled.arg_buffers[index]
                self.dev.upload(dst, src)
            else:
                dst = self.dev.to_device(src)
            env[c.op.result] = dst
            stats.h2d += 1
            stats.h2d_bytes += src.nbytes
        else:
            host = self.dev.download(src)
            if not host.flags.c_contiguous:  # a strided view's copy, as CuPy may return it: the CPU needs C order
                host = host.copy(order="C")
            env[c.op.result] = host
            stats.d2h += 1
            stats.d2h_bytes += host.nbytes

    def _segment(self, seg: Segment, env: dict[Value, Any], stats: Stats) -> None:
        compiled = seg.compiled
        if seg.device == CPU:
            outs = compiled.run([env[v] for v in seg.inputs])  # the split's own values: checked by their making
            stats.gemm_calls += compiled.stats.gemm_calls
        else:
            for buffer, v in zip(compiled.arg_buffers, seg.inputs):
                value = env[v]
                if value is not buffer:  # a value of an earlier GPU segment
                    buffer[...] = value
                    stats.device_copies += 1
            outs = compiled.run_on_device()
            counters = compiled.lowering.counters
            stats.kernel_launches += counters.kernel_launches
            stats.gemm_calls += counters.gemm_calls
            stats.read_backs += counters.read_backs
        for v, a in zip(seg.outputs, outs):
            env[v] = a


def _returned(f: Function) -> list[Value]:
    last = f.body.last
    assert last is not None and last.spec.terminator
    return list(last.operands)


__all__ = ["Crossing", "Segment", "SplitFunction", "Stats", "op_device", "split_function"]
