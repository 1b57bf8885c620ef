"""Device memory of a compiled function: the memplan arena as one device allocation, each
planned value a typed view of it at its planned offset (analysis/memory/; the plan is the one the
pipeline's `memplan` pass computed, else memplan's default plan).

Terms (memplan's): *planned values* (op results and scan carries' body arguments) get a slot
in the arena; *views* (`reshape`, `transfer`, `index`, a contiguous `slice`, a 2-D `transpose`
read only by matmuls, a scan sequence's element) read their source's memory; *registers*
(values inside `fused` ops) have none. What is a view is the plan's decision: the backend
makes exactly those views (an xp view of the source) and gives every other value storage.
The GPU's plan (`memplan{views=strided}`, analysis/memory/aliases.py) also counts the slices
this backend reads through strides as views (*strided views*: absorbed, walked and returned
slices of a kernel or GEMM result), holding their sources until their last readers, and puts
a join of arguments that is their home (packed arguments) outside the arena: the lowering
gives it a buffer of its own, the arguments' (aliasing.py). A plan made with the registry's
views only (`memplan` without the option) is still followed: those slices' sources then leave
the arena (aliasing.py), as the plan thinks them dead at the slice.

Without a plan every value that needs memory gets a device buffer of its own instead, still
allocated once per compiled function: when memplan cannot plan the function
(`MemoryPlan.unsupported`), or with GIR_GPU_ARENA=0 (a switch for
tests and for bisecting a suspected planning bug). `Memory.mode` says which.

Kept outside the arena, each in a buffer of its own allocated once:
- arguments: the call copies the caller's arrays into them (the plan never places arguments);
  an argument's buffer may be a view of another buffer outside the arena instead (a piece of a
  packed concat, the first row of a shifted carry's buffer: aliasing.py);
- a scan's loop buffers (two double buffers per double-buffered carry, T + 1 rows per shifted
  carry) and claimed concats: the GPU's plan gives the values they hold no slot
  (analysis/memory/loop_buffers.py; codegen.lower_scan, claim_pieces);
- constants: uploaded when compiling. Their arena blocks are reused by later values in every
  call, so keeping them there would cost a refill per call. A value the plan computes in place
  of a constant gets the constant's (unused) arena block, and reads the constant from its own
  buffer: still correct.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...analysis.memory.aliases import STRIDED
from ...analysis.memory.plan import MemoryPlan
from ...analysis.memory.planner import plan_memory
from ...config import current
from ...ir.core import Operation, Value
from ...ir.spec import view_source  # one rule for the plan and both backends
from .device import Device


class Memory:
    def __init__(self, function: Any, dev: Device, plan: MemoryPlan | None = None):
        self.dev = dev
        self.plan, self.reason = _plan(function, plan)
        self.mode = "arena" if self.plan is not None else "per-value"
        """arena: one device allocation laid out by the memory plan; per-value: a buffer each."""
        self.arena_bytes = self.plan.arena_bytes if self.plan is not None else 0
        self.arena = dev.empty((max(self.arena_bytes, 1),), np.dtype(np.uint8)) if self.plan is not None else None
        self.own_bytes = 0
        """Bytes of the buffers outside the arena (arguments, constants, per-value storage)."""
        self._storage: dict[Value, Any] = {}

    def is_view(self, v: Value, op: Operation) -> bool:
        if self.plan is not None:
            return v in self.plan.views
        return view_source(op) is not None

    def is_strided_view(self, v: Value, op: Operation) -> bool:
        """Whether the plan counts v a view of its source though the registry does not (a
        strided view, aliases.py): its source stays in the arena, held until v's last reader."""
        return self.plan is not None and v in self.plan.views and view_source(op) is None

    def storage(self, v: Value) -> Any:
        """v's device array (made once): its arena slot, or a buffer of its own (also for a value
        the plan has no slot for: a strided view or packed join the lowering stores after all)."""
        found = self._storage.get(v)
        if found is not None:
            return found
        t = v.tensor_type
        shape = tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
        slot = self.plan.slots.get(v) if self.plan is not None else None
        if slot is not None:
            nbytes = math.prod(shape) * t.numpy_dtype.itemsize
            array = self.arena[slot.offset : slot.offset + nbytes].view(t.numpy_dtype).reshape(shape)  # type: ignore[index]
        else:
            array = self.own(shape, t.numpy_dtype)
        self._storage[v] = array
        return array

    def share(self, v: Value, other: Value) -> None:
        """Without a plan, v lives in other's storage (a scan's final carry in its carry's);
        a plan decides that itself."""
        if self.plan is None:
            self._storage[v] = self.storage(other)

    def move_out(self, v: Value, buffer: Any) -> Any:
        """v's storage from now on is buffer (a buffer of its own: `own`), not its arena slot."""
        self._storage[v] = buffer
        return buffer

    def own(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A device buffer outside the arena."""
        self.own_bytes += math.prod(shape) * dtype.itemsize
        return self.dev.empty(shape, dtype)

    def constant(self, host: np.ndarray) -> Any:
        self.own_bytes += host.nbytes
        return self.dev.to_device(host)

    def describe(self) -> str:
        if self.plan is not None:
            return f"arena of {self.arena_bytes} bytes (naive {self.plan.naive_bytes})"
        return f"a buffer per value ({self.reason})"


def _plan(function: Any, plan: MemoryPlan | None) -> tuple[Any, str | None]:
    """(the memory plan to lay the arena out by or None, why there is none): the pipeline's
    plan (`memplan` pass) when given, else the plan gir.jit's GPU pipeline makes
    (`memplan{views=strided}`)."""
    if not current().gpu_arena:
        return None, "GIR_GPU_ARENA=0"
    if plan is None or plan.function is not function:
        plan = plan_memory(function, views=STRIDED)
    if not plan.supported:
        return None, f"not planned: {plan.unsupported}"
    return plan, None
