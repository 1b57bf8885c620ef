"""Compiling a function for the GPU and calling it on NumPy arrays.

A `GPUFunction` owns its device memory (memory.py: the arena or a buffer per value, argument
buffers, constants), allocated once and reused by every call. A call checks the arguments
against the signature before anything runs on the device, copies them to their device buffers
(the only host-to-device transfers), runs the steps (codegen.py), then reads the error flag
and copies the results back as new NumPy arrays (the only device-to-host transfers, but for
`index` by a computed index).

Threads: calls are serialised. A call uses the function's one set of device buffers
(arguments, arena, error flag) and its launch counters, so two overlapping calls would
overwrite each other's values; a lock makes a call from a second thread wait until the first
has copied its results back. This costs little on a GPU, where calls issued on the default
stream run one after another anyway. (Overlapping calls would need a set of buffers per thread
and a stream each.) The CUDA simulator's kernel launches are not thread-safe across functions
either: there every launch also holds one process-wide lock (device.SIMULATOR_LAUNCHES).
`stats` is per thread, as on the CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...analysis.memory.plan import MemoryPlan
from ...config import current
from ...errors import GirError
from ...ir.core import Function
from ...ir.interpreter import check_arguments
from ..cpu.runtime import check_fits, host_memory_bytes
from .codegen import lower_function, run_steps
from .device import get_device, is_device_array
from .gather import check_index_range, device_index_range
from .graphs import CallGraph


@dataclass
class Stats:
    """What a call did (`fn.stats`: the calling thread's last call). The device work is counted
    where it happens (codegen.Lowering: `launch`, `gemm`, `xp_call`, `copy`)."""

    kernel_launches: int = 0
    """Generated (numba.cuda) kernels launched."""
    gemm_calls: int = 0
    """GEMMs (cuBLAS through CuPy)."""
    copies: int = 0
    """Device-to-device copies (layout ops, concat pieces, carries and stack rows a scan could
    not place, initial and final carries)."""
    seconds: float = 0.0
    """The whole call, transfers included."""
    memory: str = ""
    """How values are stored: the arena and its size, or a buffer per value and why."""
    device: str = ""
    compile: Any = None
    """How the function was compiled (gir.jit sets it: a `jitstats.CompileStats`)."""
    h2d: int = 0
    """Host-to-device transfers: one per NumPy argument, but one per packed concat for its
    arguments (aliasing.PackedArguments)."""
    d2h: int = 0
    """Device-to-host transfers: one per result (but one per source for returned slices:
    aliasing.py), and one per `index` by a computed index."""
    xp_launches: int = 0
    """Other xp calls that launch device work: reductions, gathers, scatters, logsumexp's parts."""
    graph_replays: int = 0
    """CUDA graph launches: 1 per call on the graph path (docs/gpu.md), else 0. On that path
    the other counts are the graph's work (captured once, replayed by this call), not Python
    calls: `host_launches` is what Python issued."""
    graph: str = ""
    """The call's path: `replayed` (a CUDA graph captured at the second call, after one eager
    call that compiles and allocates), `eager: WHY`
    (capture refused for this function, and why), or `off` (GIR_GPU_GRAPHS=0)."""
    per_step: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per scan (`scan forward|reverse at FILE:LINE:COL`), per time step: kernel_launches,
    gemm_calls, xp_launches, copies, graph_replays (nested loops' work included)."""

    @property
    def launches(self) -> int:
        """Everything that puts work on the device: kernels, GEMMs, other xp launches and copies
        (each a kernel or a memcpy on a GPU; graph replays one each)."""
        return self.kernel_launches + self.gemm_calls + self.xp_launches + self.copies + self.graph_replays

    @property
    def host_launches(self) -> int:
        """Device work issued from Python in this call: everything on the eager path; on the
        graph path one graph launch plus the copies of device-array arguments into their buffers
        and of the results out of them, and the range checks of device-array index arguments."""
        if not self.graph_replays:
            return self.launches
        return self.graph_replays + self.device_arg_copies + self.result_copies + self.index_check_launches

    device_arg_copies: int = 0
    """Device-array arguments copied into their buffers before the graph ran (in `copies`; a
    NumPy argument in a packed concat with device arrays too goes through the device, a copy)."""
    index_check_launches: int = 0
    """The range checks of device-array index arguments (gather.py): 3 xp launches each (min,
    max, their stack; in `xp_launches`), issued from Python before the call's device work."""
    persistent: dict[str, str] = field(default_factory=dict)
    """Per scan (its label): `persistent (on|measure): the plan`, or `host loop: why` (the
    decision, persistent.ScanPath; with GIR_GPU_PERSISTENT=measure, the first call's times)."""
    result_copies: int = 0
    """Results copied out of the arena as fresh device arrays (a call with device-array
    arguments; else strided results made contiguous for their download), issued from Python
    after the graph ran."""


class GPUFunction:
    """A function compiled for the GPU (or the CUDA simulator)."""

    def __init__(self, function: Function, plan: MemoryPlan | None = None):
        self.dev = get_device()
        self.function = function
        # Device memory is allocated while lowering: check sizes first (arguments, constants
        # and per-value buffers outside the arena are bounded by the per-value check alone).
        check_fits(function, plan.arena_bytes if plan is not None else 0, _device_memory_bytes(self.dev),
                   "the device" if not self.dev.simulated else "this machine")
        self.lowering, self.steps, self.results = lower_function(function, self.dev, plan)
        self.memory = self.lowering.memory
        self._lock = threading.Lock()
        """Held for a whole call: calls share the device buffers (module docstring)."""
        self._local = threading.local()
        """This thread's last `Stats` (`.stats`)."""
        self._last_stats = Stats(memory=self.memory.describe(), device=self.dev.name)
        """The last call completed on any thread (what `stats` is in a thread that made none)."""
        self.ir = ""
        """The IR compiled (set by gir.jit)."""
        self.compile_stats: Any = None
        """How the driver compiled it (a driver/jitstats.CompileStats, set by the driver)."""
        self.compile_seconds: dict[str, float] = {}
        self.preparing = ""
        """No second tier: the code compiled is the code that runs."""
        self.code_info: Any = None
        self.gemms: list[Any] = []
        """GEMMs run through CuPy: no BLAS path to choose."""
        self.graphs = CallGraph(self, current().gpu_graphs)
        """The CUDA-graph path: captured at the second call, replayed by every later call (graphs.py)."""
        self.workspace_bytes: int | None = None
        """Device memory is the device's: no per-thread workspace to report."""
        self.donations: tuple[tuple[int, int], ...] = ()
        """(result, argument) pairs whose argument the caller donates (`donate`)."""
        self._donated: set[int] = set()
        """The results handed out as their argument's buffer (the pairs `issue_steps` applied)."""

    @classmethod
    def compile(cls, function: Function, plan: MemoryPlan | None = None) -> GPUFunction:
        """Compiles function, its device arena laid out by plan (the pipeline's `memplan`
        result; memplan's default plan when None)."""
        return cls(function, plan)

    def donate(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Donation (gir.jit's donate_argnums; docs/gpu.md *Training on the device*): for each
        (result, argument) pair, of the same shape and dtype, the call's last device work copies
        the result into the argument's buffer (inside the CUDA graph: no Python call) and hands
        that buffer out as the result, which a caller passing it back as that argument next call
        does not copy in again. A caller's old array for a donated argument then holds the new
        value. Set before the first call (the graph captures it)."""
        if self.graphs.calls:
            raise GirError("donate: set before the function's first call (its CUDA graph captures the donation)",
                           self.function.loc)
        self.donations = tuple(pairs)

    @property
    def stats(self) -> Stats:
        """The last call this thread completed; in a thread that has completed none, the last
        call completed by any thread."""
        return getattr(self._local, "stats", self._last_stats)

    @property
    def kernel_sources(self) -> list[str]:
        """The generated kernels' Python source, once each, in program order."""
        return list(dict.fromkeys(k.source.text for k in self.lowering.kernels))

    @property
    def llvm_ir(self) -> str:
        """For the GPU: the numba.cuda kernels' Python source (numba makes the LLVM IR and PTX)."""
        return "\n".join(self.kernel_sources)

    @property
    def asm(self) -> str:
        """The kernels' PTX on a GPU, for the argument types they were launched with (empty in
        the simulator, and before the first call)."""
        if self.dev.simulated:
            return ""
        texts = []
        for kernel in dict.fromkeys(k.kernel for k in self.lowering.kernels):
            texts.extend(kernel.inspect_asm().values())
        return "\n".join(texts)

    def __call__(self, *args: Any) -> list[Any]:
        """Runs the function. Arguments: NumPy arrays (copied to the device), or device arrays
        (is_device_array: CuPy, PyTorch, JAX on the GPU; copied on the device, never through the
        host). Results: NumPy arrays; device arrays (xp arrays, fresh copies) when any argument
        was a device array, as CuPy's and JAX's functions answer device arrays with device
        arrays."""
        args = tuple(self.dev.as_device(a) if is_device_array(a) else a for a in args)
        return self.run(check_arguments(self.function, args, is_device_array))

    def run(self, arrays: Sequence[Any]) -> list[Any]:
        """A call on arguments checked already (count, dtype, shape: `check_arguments`)."""
        with self._lock, self.graphs.stream_context():
            return self._run(list(arrays))

    def _run(self, arrays: list[Any]) -> list[Any]:
        dev = self.dev
        start = time.perf_counter()
        on_device = [is_device_array(a) for a in arrays]
        index_reads, check_launches = self._check_index_arguments(arrays)
        h2d, arg_copies = self._fill_arguments(arrays, on_device)
        results = self._run_in_order() if self.lowering.index_failures else self.graphs.run()
        c = self.lowering.counters
        copies_before, downloads = c.copies, 0
        if any(on_device):  # fresh copies (the arena is reused by the next call), but donated results
            outs = [r if k in self._donated else self.lowering.duplicate(r) for k, r in enumerate(results)]
        else:
            outs, downloads = self._download(results)
        self._local.stats = self._last_stats = Stats(
            c.kernel_launches, c.gemm_calls, c.copies + arg_copies, time.perf_counter() - start,
            self.memory.describe(), dev.name, h2d=h2d,
            d2h=(0 if any(on_device) else downloads) + c.read_backs + index_reads,
            xp_launches=c.xp_launches + check_launches, index_check_launches=check_launches,
            graph_replays=c.graph_replays, per_step=dict(c.per_step), graph=self.graphs.path,
            device_arg_copies=arg_copies, result_copies=c.copies - copies_before,
            persistent={label: path.render() for label, path in self.lowering.scan_paths.items()})
        return outs

    def _run_in_order(self) -> list[Any]:
        """A call with an index argument out of range: run eagerly (not replayed, not captured),
        so that the first failing op in program order raises (the gather's own, or an earlier
        op's: a division by zero the error flag holds), as the interpreter does; a gather that
        never runs (in a scan of no step) raises nothing, as there."""
        try:
            return self.run_on_device(check_indices=False)
        finally:
            self.lowering.index_failures.clear()

    def _check_index_arguments(self, arrays: Sequence[Any]) -> tuple[int, int]:
        """Checks the range of the arguments that gathers and scatters index by
        (`Lowering.index_arguments`) before any device work: a NumPy array on the host, a device
        array by three xp launches and one read-back, outside the call's work (a CUDA graph may
        hold no read-back). An op whose argument is out of range is noted
        (`Lowering.index_failures`), not raised: it raises when a run reaches it. Returns
        (read-backs, xp launches) made."""
        reads, launches = 0, 0
        self.lowering.index_failures.clear()

        def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal launches
            launches += 1
            return fn(*args, **kwargs)

        for k, arg in enumerate(self.function.args):
            uses = self.lowering.index_arguments.get(arg)
            if not uses or not arrays[k].size:
                continue
            if is_device_array(arrays[k]):
                lo, hi = device_index_range(self.lowering, self.dev.as_device(arrays[k]), call)
                reads += 1
            else:
                lo, hi = int(np.min(arrays[k])), int(np.max(arrays[k]))
            for op, rows in uses:
                try:
                    check_index_range(op, rows, lo, hi)
                except GirError as e:
                    self.lowering.index_failures[op] = e
        return reads, launches

    def _fill_arguments(self, arrays: list[Any], on_device: list[bool]) -> tuple[int, int]:
        """Copies the arguments into their buffers: (uploads, device-to-device copies). The
        arguments of a packed concat (aliasing.PackedArguments: their buffers are its pieces),
        all NumPy arrays, are put together on the host and uploaded as one."""
        dev = self.dev
        index: dict[Any, int] = {a: k for k, a in enumerate(self.function.args)}
        done: set[int] = set()
        uploads = copies = 0
        for pack in self.lowering.packs:
            ks = [index[a] for a in pack.args]
            if not any(on_device[k] for k in ks):
                dev.upload(self.lowering.static[pack.op.result], pack.pack([arrays[k] for k in ks]))
                done.update(ks)
                uploads += 1
        for k, (buffer, a) in enumerate(zip(self.arg_buffers, arrays)):
            if k in done:
                continue
            if not on_device[k] and buffer.flags.c_contiguous:
                dev.upload(buffer, a)
                uploads += 1
                continue
            if not on_device[k]:  # a piece of a pack with device arrays among its arguments
                a = dev.to_device(a)
                uploads += 1
            a = dev.as_device(a)
            if self.lowering.same_memory(a, buffer) and a.strides == buffer.strides:
                continue  # the buffer itself, handed out as a donated result: nothing to copy
            buffer[...] = a  # device to device
            copies += 1
        return uploads, copies

    def _download(self, results: list[Any]) -> tuple[list[np.ndarray], int]:
        """The results as new NumPy arrays. A returned slice (a strided view: aliasing.py) is cut
        on the host from its source, downloaded once for all its slices, so that no device copy
        makes it contiguous first. Also says how many downloads that took."""
        views = self.lowering.returned_views
        sources: dict[Any, np.ndarray] = {}
        outs = []
        for v, r in zip(self.results, results):
            if v not in views:
                outs.append(self.dev.download(r))
                continue
            x, box = views[v]
            if x not in sources:
                sources[x] = self.dev.download(self.lowering.static[x])
            outs.append(np.array(sources[x][box], order="C"))  # its own memory, as other results
        return outs, len(results) - len([v for v in self.results if v in views]) + len(sources)

    # -- for an executor that keeps values on the device between functions (backend/split.py) --
    @property
    def arg_buffers(self) -> list[Any]:
        """The device arrays the arguments are read from, one per argument, allocated once:
        a caller of `run_on_device` fills them (an upload or a device-to-device copy)."""
        return [self.lowering.static[a] for a in self.function.args]

    def run_on_device(self, check_indices: bool = True) -> list[Any]:
        """Runs the steps on what is in `arg_buffers` and returns the results as device arrays:
        this function's own memory (arena, constants, argument buffers), valid until its next
        call. Moves nothing between host and device but the error flag, `index` by a computed
        index and, unless the caller checked them (check_indices False: `_run` did), the range
        of index arguments in their buffers. The caller serialises calls (`__call__` holds the
        lock)."""
        low = self.lowering
        low.counters.reset()
        if check_indices:
            reads, launches = self._check_index_arguments(self.arg_buffers)
            low.counters.read_backs += reads
            low.counters.xp_launches += launches
        try:
            env = self.issue_steps()
        except GirError:
            # A check on the host (an `index` out of range, a `max` over no element) raises at
            # once, but a kernel launched before it may have flagged an error (a division by
            # zero) that the flag only tells now: that one came first, as in the interpreter.
            self._raise_flagged()
            raise
        self._raise_flagged()
        return [env[v] for v in self.results]

    def issue_steps(self) -> dict[Any, Any]:
        """Issues the whole call's device work (the error flag's reset, then the steps) on the
        current stream, and returns the values' device arrays. Run eagerly, or once while a
        CUDA graph is captured (graphs.CallGraph)."""
        low = self.lowering
        if low.errors:  # no kernel can flag one: nothing to reset (nor to read: _raise_flagged)
            low.err[...] = 0
        env = dict(low.static)
        if self.dev.simulated:
            with np.errstate(all="ignore"):  # inf and nan as on a GPU (this thread's xp work)
                run_steps(self.steps, env)
        else:
            run_steps(self.steps, env)
        self._donate_results(env)
        return env

    def _donate_results(self, env: dict[Any, Any]) -> None:
        """Copies each donated result into its argument's buffer, the last device work of the
        call, and makes the buffer the result. A pair is left out (the result copied out as
        usual) where the buffer overlaps what another result is read from (it would be
        overwritten before that is copied out) or overlaps its own result without being it."""
        low, self._donated = self.lowering, set()
        sources = [env[v] for v in self.results]
        for r, a in self.donations:
            src, dst = sources[r], low.static[self.function.args[a]]
            if any(_overlap(low.extent(dst), low.extent(x)) for k, x in enumerate(sources) if k != r):
                continue
            if not (low.same_memory(src, dst) and src.strides == dst.strides):
                if _overlap(low.extent(dst), low.extent(src)):
                    continue
                low.copy(dst, src)
            env[self.results[r]] = dst
            self._donated.add(r)

    def _raise_flagged(self) -> None:
        """Raises the run-time error a kernel recorded in the error flag, if any. Where no
        kernel can record one (every float program: low.errors is empty), the flag is not read:
        no read-back, so a call with device arrays in and out does not wait for the device."""
        low = self.lowering
        if not low.errors:
            return
        code = int(self.dev.download(low.err)[0])
        if code:
            message, loc = low.errors[code - 1]
            raise GirError(f"{message} at run time", loc)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _device_memory_bytes(dev: Any) -> int | None:
    """The GPU's total memory (host memory in the simulator, where device memory is host memory)."""
    if dev.simulated:
        return host_memory_bytes()
    try:
        return int(dev.xp.cuda.runtime.memGetInfo()[1])
    except Exception:  # noqa: BLE001 (no CUDA query: no bound, as before)
        return None


__all__ = ["GPUFunction", "Stats"]
