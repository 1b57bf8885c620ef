"""The `place` pass: puts every op on the CPU or the GPU in one global walk, and inserts
`transfer` ops where a value crosses devices (Theano's GraphToGPU, not node-by-node rewrites).

Before (`place{policy=lift,min-elements=1}`):
    func @f(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
      %0 = matmul %x, %w : tensor<8x8xf32>
      %1 = tanh %0 : tensor<8x8xf32>
      return %1
    }
After:
    func @f(%x: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
      %x_gpu = transfer %x {device = "gpu"} : tensor<8x8xf32>
      %w_gpu = transfer %w {device = "gpu"} : tensor<8x8xf32>
      %0 = matmul %x_gpu, %w_gpu {device = "gpu"} : tensor<8x8xf32>
      %1 = tanh %0 {device = "gpu"} : tensor<8x8xf32>
      %2 = transfer %1 {device = "cpu"} : tensor<8x8xf32>
      return %2
    }

Terms. An op is *placed* when it carries `device = "cpu"` or `"gpu"` (every op kind accepts
the attribute, ir/ops.py). A value lives where its definer runs: a function argument on the
CPU, an op result on its op's device, a loop-body argument on its loop's device, a transfer's
result on the transfer's `device`. A value's *root* is the value with the transfers in front
of it peeled off. *Top-level* ops are those directly in a function body; an op in a region
(`scan`, `fused`, `for`) *follows* its region op: one device for the whole loop, so a loop
never moves data per step.

What may run on the GPU: an op whose spec says `gpu` (a kernel exists), `scan` when every op
of its body may (the GPU backend drives the loop from the host over device buffers), never a
`matmul` on integers (cuBLAS multiplies f32 and f64 only: reason `dtype`). An op all of whose
values are scalars, or all under `min-elements` elements, stays on the CPU (`too small`: a
kernel launch costs more than the CPU loop); a scan's size is one step's: its body's values.

The policies (from Theano's GraphToGPU discussion), for ops that may run on the GPU:

- `aggressive`: every such op goes to the GPU, whatever its inputs. Fewest CPU ops; small
  CPU-side islands (an op on the function's arguments alone) pay transfers both ways.
- `lift` (the default): the forward walk puts `matmul` and `scan` on the GPU (the big ops),
  then any op with a non-scalar input already on the GPU; a backward walk then lifts an op
  every one of whose consumers is on the GPU (so a `transpose` or `zeros` feeding only GPU ops
  moves with them). What is left, islands that touch no GPU value, stays on the CPU.

Transfers appear only at device boundaries, one per root and device, right after the root's
definition: a value defined outside a GPU loop and read inside it is transferred before the
loop, never inside its body. Round trips fold: every use is rewired to the root when the root
already lives where the use runs (`transfer(transfer(x, gpu), cpu) -> x`), and transfers
nothing reads are erased. Function results end on the CPU (a `transfer` to the CPU before
`return`).

Placed IR keeps its placement: a `device` attribute found in the input is kept (so running
the pass twice changes nothing, whatever the options), and it counts as a fact for the lift
rules; a `gpu` attribute on an op that cannot run there is an error. `scan` and `fused` print
no attributes: their device is the one their body ops carry.

Known gaps: no cost model (a transfer is never weighed against a kernel launch: the policy
and `min-elements` decide); transfers are placed right after the definition, not sunk to the
first use; one GPU; `for` loops (pre-SSA) and `call` stay on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..analysis.placement import CPU, GPU, PlacementReport, PlaceOptions
from ..errors import GirPassError
from ..ir.core import Block, Function, Module, Operation, Value, erase_op
from ..ir.ops import REGISTRY, make_op
from ..ir.types import TensorType
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics

GEMM_DTYPES = ("f32", "f64")
"""The dtypes cuBLAS multiplies; a matmul on others stays on the CPU."""
_KIND = {"fused": "fused op", "for": "for loop"}
"""How the report names a region op in `follows its ...`."""


@dataclass
class _Summary:
    """What placement needs to know about an op and, for a region op, everything inside it."""

    blocked: str | None
    """Why it cannot run on the GPU (no kernel, dtype), or None."""
    elements: int | None
    """Elements of its largest value; None when a `?` dim makes one unknown."""
    scalar: bool
    """Every value it touches has rank 0."""
    pin: str | None
    """The device attribute it (or, for a loop, its body) carries in the input."""
    empty: bool = False
    """A loop whose body computes nothing: it only moves data."""


def _sizes(values: Sequence[Value], largest: int | None, scalar: bool) -> tuple[int | None, bool]:
    """Folds values into (largest element count or None if unknown, all scalars so far)."""
    for v in values:
        t = v.type
        if isinstance(t, TensorType):
            if t.shape:
                scalar = False
                n = t.num_elements()
                largest = None if n is None or largest is None else max(largest, n)
    return largest, scalar


def root(v: Value) -> Value:
    """v with the transfers in front of it peeled off."""
    op = v.defining_op
    while op is not None and op.name == "transfer":
        v = op.operands[0]
        op = v.defining_op
    return v


class _Placer:
    """Places one function: `decide` (the walks), then `materialize` (attributes, transfers)."""

    def __init__(self, f: Function, options: PlaceOptions):
        self.f = f
        self.options = options
        self.top: dict[Operation, Operation] = {}
        """Every op (but `return`) -> its top-level ancestor (itself at the top level)."""
        self.device: dict[Operation, str] = {}
        """Top-level op -> device; ops inside it follow it."""
        self.reason: dict[Operation, str] = {}
        self.pinned: dict[Operation, str] = {}
        """Top-level op -> the device attribute it (or its body) carries in the input."""
        self.boundaries: dict[Operation, tuple[Value, Operation]] = {}
        """Transfer kept or inserted -> (its root, the first op that reads it)."""
        self.created = 0
        self.removed = 0
        self.moved = 0
        """Transfers in the input that were rewired to their root or moved next to its definition."""
        self.transfers = 0
        """Transfers in the function after the pass (all of them at boundaries)."""
        self._last_after: dict[object, Operation] = {}
        """A definition (op, or block for arguments) -> the last transfer inserted after it."""

    # -- devices ------------------------------------------------------------------------------
    def op_device(self, op: Operation) -> str:
        return self.device[self.top[op]]

    def value_device(self, v: Value) -> str:
        """Where a root lives."""
        op = v.defining_op
        if op is not None:
            return self.op_device(op)
        block = v.defining_block
        owner = block.parent_op if block is not None else None
        return CPU if owner is None else self.op_device(owner)

    def required(self, user: Operation) -> str:
        """Where `user` reads its operands: its own device; results go back to the CPU."""
        return CPU if user.name == "return" else self.op_device(user)

    # -- what an op is ------------------------------------------------------------------------
    def summarize(self, op: Operation, top: Operation) -> _Summary:
        """Fills `top` for op and everything inside it; linear in the ops inside."""
        self.top[op] = top
        spec = REGISTRY[op.name]
        if op.name == "scan" or spec.gpu:
            blocked = None
        else:
            blocked = "no GPU kernel"
        if blocked is None and spec.category == "matmul":
            dtype = op.result.tensor_type.dtype
            if dtype not in GEMM_DTYPES:
                blocked = f"dtype: cuBLAS has no {dtype} matmul"
        pin = op.attrs.get("device")
        if not op.regions:
            largest, scalar = _sizes(op.results, *_sizes(op.operands, 0, True))
            return _Summary(blocked, largest, scalar, pin)
        # A region op: one step's values (body arguments and results inside), and every op inside.
        pins = {pin} if pin is not None else set()
        largest, scalar = 0, True
        for region in op.regions:
            largest, scalar = _sizes(region.block.args, largest, scalar)
            for inner in region.block:
                if inner.name == "transfer" or REGISTRY[inner.name].terminator:
                    self.top[inner] = top
                    continue
                s = self.summarize(inner, top)
                self.reason[inner] = f"follows its {_KIND.get(op.name, op.name)}"
                if blocked is None and s.blocked is not None:  # the innermost culprit, once
                    nested = s.blocked.endswith(" in its body)")
                    blocked = s.blocked if nested else f"{s.blocked} ('{inner.name}' in its body)"
                if s.pin is not None:
                    pins.add(s.pin)
                largest = None if largest is None or s.elements is None else max(largest, s.elements)
                scalar = scalar and s.scalar
        if len(pins) > 1:
            raise GirPassError(f"the ops of this '{op.name}' are placed on both devices; a loop runs on one", op.loc)
        empty = all(inner.name == "transfer" or REGISTRY[inner.name].terminator for inner in op.body)
        return _Summary(blocked, largest, scalar, pins.pop() if pins else None, empty)

    def policy(self, op: Operation, s: _Summary) -> tuple[str, str, bool]:
        """(device, reason, lift candidate) before the backward walk."""
        o = self.options
        if s.blocked is not None:
            return CPU, s.blocked, False
        if s.empty:  # no op inside records its device, so decide from the neighbours alone
            on_gpu = any(self.value_device(root(v)) == GPU for v in op.operands)
            return (GPU, "an empty loop: stays with its inputs", False) if on_gpu else \
                (CPU, "an empty loop: stays with its inputs", False)
        if s.scalar:
            return CPU, "too small: a scalar", False
        if s.elements is not None and s.elements < o.min_elements:
            return CPU, f"too small: {s.elements} elements < min-elements {o.min_elements}", False
        if o.policy == "aggressive":
            return GPU, "policy aggressive: it has a GPU kernel", False
        if op.name == "scan" or REGISTRY[op.name].category == "matmul":
            return GPU, f"policy lift: {op.name} starts on the GPU", False
        for v in op.operands:
            r = root(v)
            if isinstance(r.type, TensorType) and r.type.rank > 0 and self.value_device(r) == GPU:
                return GPU, "policy lift: an input is on the GPU", False
        return CPU, "policy lift: no input or consumer on the GPU", True

    def consumers_on_gpu(self, op: Operation) -> bool:
        """Every op reading op's results (through transfers) runs on the GPU, and there is one."""
        found = False
        stack: list[Value] = list(op.results)
        while stack:
            for user, _ in stack.pop().uses:
                if user.name == "transfer":
                    stack.append(user.result)
                elif self.required(user) != GPU:
                    return False
                else:
                    found = True
        return found

    # -- the walks ----------------------------------------------------------------------------
    def decide(self) -> None:
        candidates: list[Operation] = []
        for op in self.f.body:
            if op.name == "return":
                continue
            if op.name == "transfer":
                self.top[op] = op
                self.device[op] = op.attrs["device"]
                continue
            s = self.summarize(op, op)
            device, reason, candidate = self.policy(op, s)
            if s.pin is not None:
                self.pinned[op] = s.pin
                if s.pin == GPU and s.blocked is not None:
                    raise GirPassError(f"'{op.name}' is placed on the gpu but cannot run there ({s.blocked})", op.loc)
                if s.pin != device and not candidate:
                    reason = f"kept from the input (the policy says {device}: {reason})"
                device = s.pin
            self.device[op] = device
            self.reason[op] = reason
            if candidate:
                candidates.append(op)
        for op in reversed(candidates):  # the backward walk: consumers come later in program order
            lifted = self.consumers_on_gpu(op)
            decision = GPU if lifted else CPU
            if lifted:
                self.reason[op] = "policy lift: every consumer is on the GPU"
            pin = self.pinned.get(op)
            if pin is None:
                self.device[op] = decision
            elif pin != decision:
                self.reason[op] = f"kept from the input (the policy says {decision}: {self.reason[op]})"

    def materialize(self) -> bool:
        changed = False
        ops = list(self.f.walk())
        for op in ops:  # `scan`, `fused` and the rest of the structural ops print no attributes
            spec = REGISTRY[op.name]
            if spec.terminator or op.name == "transfer" or spec.category == "structural":
                continue
            device = self.op_device(op)
            if op.attrs.get("device") != device:
                op.attrs["device"] = device
                changed = True
        old = [op for op in ops if op.name == "transfer"]
        existing: dict[tuple[Value, str], Operation] = {}
        for t in old:
            existing.setdefault((root(t.operands[0]), t.attrs["device"]), t)
        canonical: dict[tuple[Value, str], Operation] = {}
        for op in ops:
            if op.name == "transfer":
                continue
            need = self.required(op)
            for i, v in enumerate(op.operands):
                if not isinstance(v.type, TensorType):
                    continue  # a pre-SSA variable: `var`, `load` and `store` all run on the CPU
                r = root(v)
                if self.value_device(r) == need:
                    new = r
                else:
                    transfer = canonical.get((r, need))
                    if transfer is None:
                        transfer = canonical[(r, need)] = self.claim(existing.get((r, need)), r, need, op)
                        self.boundaries[transfer] = (r, op)
                    new = transfer.result
                if v is not new:
                    op.set_operand(i, new)
                    changed = True
        kept = set(canonical.values())
        self.transfers = len(kept)
        for t in reversed(old):  # a chain's later transfers first
            if t in kept:
                continue
            assert not t.result.uses, "every reader was rewired to a root or a kept transfer"
            erase_op(t)
            self.removed += 1
        return changed or self.created > 0 or self.removed > 0 or self.moved > 0

    def claim(self, t: Operation | None, r: Value, device: str, reader: Operation) -> Operation:
        """The transfer of root r to device, right after r's definition: t if there is one."""
        if t is None:
            hint = r.name_hint if r.name_hint and not r.name_hint.isdigit() else None
            t = make_op("transfer", [r], attrs={"device": device}, loc=reader.loc,
                        result_names=[f"{hint}_{device}" if hint else None])
            self._insert_after_def(r, t)
            self.created += 1
            return t
        if t.operands[0] is not r:
            t.set_operand(0, r)
            self.moved += 1
        if not _sits_after_def(t, r):
            t.parent.unlink(t)  # type: ignore[union-attr]
            self._insert_after_def(r, t)
            self.moved += 1
        return t

    def _insert_after_def(self, r: Value, t: Operation) -> None:
        block, anchor = _def_site(r)
        assert block is not None
        key = anchor if anchor is not None else block
        last = self._last_after.get(key)
        if last is None:  # skip the transfers already there, so they stay in order
            nxt = anchor.next if anchor is not None else block.first
            while nxt is not None and nxt.name == "transfer":
                last, nxt = nxt, nxt.next
        at = last if last is not None else anchor
        if at is None:
            block.prepend(t)
        else:
            block.insert_after(at, t)
        self._last_after[key] = t


def _def_site(r: Value) -> tuple[Block | None, Operation | None]:
    """(the block that defines r, the op that does or None for a block argument)."""
    op = r.defining_op
    return (op.parent, op) if op is not None else (r.defining_block, None)


def _sits_after_def(t: Operation, r: Value) -> bool:
    """t stands in r's block with only transfers between r's definition and it."""
    block, anchor = _def_site(r)
    if t.parent is not block:
        return False
    prev = t.prev
    while prev is not None and prev is not anchor:
        if prev.name != "transfer":
            return False
        prev = prev.prev
    return prev is anchor


# ---------------------------------------------------------------------------------------------
# The pass


class Place(Pass):
    """`place{policy=aggressive|lift,min-elements=N}`: see the module docstring."""

    name = "place"
    Options = PlaceOptions

    def run(self, module: Module, stats: PassStatistics) -> bool:
        changed = False
        for f in module.functions.values():
            placer = _Placer(f, self.options)
            placer.decide()
            changed |= placer.materialize()
            device = {op: placer.op_device(op) for op in placer.reason}
            self.analyses.put(f, PlacementReport(f, self.options, device, placer.reason, placer.boundaries,
                                                 placer.created, placer.removed))
            for d in (CPU, GPU):
                stats.count(f"ops on the {d}", sum(1 for x in device.values() if x == d))
            stats.count("transfers", placer.transfers)
            stats.count("transfers inserted", placer.created)
            stats.count("transfers removed", placer.removed)
        return changed
