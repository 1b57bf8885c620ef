"""The `autodiff` pass: expands `grad @f(args) wrt (...)` by reverse mode.

Before:
    %loss, %dw = grad @f(%x, %w) wrt (%w) : tensor<f32>, tensor<4x4xf32>
After (f inlined, then its adjoint):
    %0 = matmul %x, %w : tensor<2x4xf32>
    %loss = sum %0 : tensor<f32>
    %1 = constant 1.0 : tensor<f32>
    %2 = broadcast %1 {shape = [2, 4]} : tensor<2x4xf32>
    %3 = transpose %x : tensor<4x2xf32>
    %dw = matmul %3, %2 : tensor<4x4xf32>

Phases for a grad op: (1) inline f (and every function it calls); (2) walk the inlined ops
in reverse, calling each op's VJP rule from the registry (ir/vjp.py) and summing cotangents;
(3) replace the grad op's results by the loss and the cotangents of the `wrt` arguments.

Through `scan` (`scan_vjp`): (a) *collect residuals*: while the backward body is built, every
forward body value a VJP rule reads is looked up through `residual()`: a value defined outside
the loop is used as it is (loop-invariant values are never stacked), a sequence element is
re-sliced from its sequence, anything else is stacked by the forward scan (appended in place);
(b) *build the reverse scan*: it slices those stacks and the cotangents of the stacked
outputs, threads the carry cotangents, and stacks the cotangents of the sequences;
(c) *accumulate invariant gradients*: cotangents of values the body closes over are summed in
carries (`acc + A_t @ B_t`), which scan-grad turns into one GEMM after the loop.
Nothing of the forward body is recomputed: the backward body reads forward values only
through stacks. Needs SSA form (run `ssa` first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..errors import GirTypeError, Location
from ..ir.core import Block, BlockArgument, Module, Operation, Region, Value
from ..ir.loops import LoopView
from ..ir.ops import REGISTRY, reduction_axes, slice_bounds, splat_value
from ..ir.types import TensorType
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Rewriter
from .inline import current, inline_call, inline_calls
from .loops import ScanParts, Sequence, append_stack, scan_parts


def _loc_of(v: Value) -> Location | None:
    """Where the user wrote v: the gradients summed into v's cotangent are about it."""
    op = v.defining_op
    return op.loc if op is not None else None


def _is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.is_float


class Emitter:
    """Where backward ops go: before an anchor op, or at the end of a (backward) block."""

    def __init__(self, rw: Rewriter, anchor: Operation | None = None, block: Block | None = None,
                 loc: Location | None = None):
        self.rw, self.anchor, self.block = rw, anchor, block
        self.loc = loc
        """Where ops go that name no location of their own: a backward body is filled before its
        scan op exists, so the rewriter cannot find the location from the block."""

    def op(self, name: str, operands: list[Value], loc: Any = None, **kw: Any) -> Operation:
        loc = loc or self.loc
        if self.anchor is not None:
            return self.rw.create(name, operands, before=self.anchor, loc=loc, **kw)
        return self.rw.create(name, operands, at_end=self.block, loc=loc, **kw)

    def zeros(self, t: TensorType, loc: Any = None) -> Value:
        if not t.is_static:  # a zero cotangent is a constant, and a constant needs its shape
            raise GirTypeError(f"autodiff needs a static shape here: a zero gradient of {t} (a loop carry or a "
                               "value no gradient reaches) cannot be made with `?` dims. Fix the shapes first: "
                               "gir.jit and gir.interpret do it on the arguments, `gir run` on --inputs or "
                               "--shape NAME=DIMS", loc or self.loc)
        return self.op("constant", [], loc=loc, attrs={"value": 0.0}, declared=[t]).result


class VJPContext:
    """What a VJP rule sees: one forward op, its operands and result as usable at the emission
    point, and small builders (`c.mul(a, b)`, `c.ub(g, i)`, ...)."""

    def __init__(self, bp: Backprop, op: Operation):
        self.bp, self.op = bp, op
        self.emit = bp.emitter
        self.loc = op.loc

    # -- the forward op ------------------------------------------------------------------------
    def x(self, i: int) -> Value:
        return self.bp.fwd(self.op.operands[i])

    @property
    def y(self) -> Value:
        return self.bp.fwd(self.op.result)

    def type(self, i: int) -> TensorType:
        return self.op.operands[i].tensor_type

    def attr(self, name: str) -> Any:
        return self.op.attrs[name]

    def rank(self, v: Value) -> int:
        return v.tensor_type.rank

    # -- builders -------------------------------------------------------------------------------
    def _v(self, name: str, *operands: Value, **kw: Any) -> Value:
        return self.emit.op(name, list(operands), loc=self.loc, **kw).result

    def const(self, value: float) -> Value:
        t = self.op.results[0].tensor_type if self.op.results[0].tensor_type.is_float else self.type(0)
        return self._v("constant", attrs={"value": value}, declared=[TensorType((), t.dtype)])

    def __getattr__(self, name: str) -> Callable[..., Value]:
        if name in REGISTRY and REGISTRY[name].category == "elementwise" and name != "cast":
            return lambda *operands: self._v(name, *operands)
        raise AttributeError(name)

    def cast(self, v: Value, dtype: str) -> Value:
        return self._v("cast", v, declared=[v.tensor_type.with_dtype(dtype)])

    def matmul(self, a: Value, b: Value) -> Value:
        return self._v("matmul", a, b)

    def transpose(self, v: Value, perm: list[int]) -> Value:
        return self._v("transpose", v, attrs={"perm": perm})

    def mT(self, v: Value) -> Value:
        r = self.rank(v)
        return self.transpose(v, list(range(r - 2)) + [r - 1, r - 2])

    def inverse_perm(self) -> list[int]:
        perm = self.op.attrs["perm"]
        rank = self.type(0).rank
        perm = list(range(rank))[::-1] if perm is None else list(perm)
        inv = [0] * rank
        for i, p in enumerate(perm):
            inv[p] = i
        return inv

    def reshape(self, v: Value, shape: tuple) -> Value:
        if v.tensor_type.shape == tuple(shape):
            return v
        total = v.tensor_type.num_elements()
        if -1 in shape and total is not None:  # with a `?` dim the -1 stays: reshape infers it
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(total // known if d == -1 else d for d in shape)
        return self._v("reshape", v, attrs={"shape": list(shape)})

    def broadcast(self, v: Value, shape: tuple) -> Value:
        if v.tensor_type.shape == tuple(shape):
            return v
        return self._v("broadcast", v, attrs={"shape": list(shape)})

    def sum_axes(self, v: Value, axes: list[int], keepdims: bool) -> Value:
        if not axes:
            return v
        return self._v("sum", v, attrs={"axes": axes, "keepdims": keepdims})

    def sum_all(self, v: Value) -> Value:
        return self._v("sum", v)

    def ub(self, g: Value, i: int) -> Value:
        """Sums g over the axes operand i was broadcast along, giving operand i's shape."""
        target = self.type(i).shape
        shape = g.tensor_type.shape
        if shape == target:
            return g
        lead = len(shape) - len(target)
        axes = list(range(lead)) + [lead + k for k, d in enumerate(target) if d == 1 and shape[lead + k] != 1]
        return self.reshape(self.sum_axes(g, axes, keepdims=False), target)

    def expand(self, g: Value, i: int) -> Value:
        """The cotangent of a reduction's result, broadcast back to operand i's shape."""
        t = self.type(i)
        if not t.is_static:
            raise GirTypeError(f"autodiff: the gradient of '{self.op.name}' over {t} needs static shapes (a `?` "
                               "dim cannot be broadcast back yet); gir.jit specialises shapes first", self.loc)
        axes = reduction_axes(self.op.attrs, t.rank)
        kept = tuple(1 if k in axes else d for k, d in enumerate(t.shape))
        return self.broadcast(self.reshape(g, kept), t.shape)

    def sum_like(self, v: Value) -> Value:
        """v reduced over the forward reduction's axes (with its keepdims)."""
        return self._v("sum", v, attrs={"axes": self.op.attrs["axes"], "keepdims": self.op.attrs["keepdims"]})

    def reduced_count(self) -> int:
        t = self.type(0)
        n = 1
        for k in reduction_axes(self.op.attrs, t.rank):
            n *= t.shape[k] or 0
        return n

    def slice_axis(self, v: Value, axis: int, start: int, stop: int) -> Value:
        shape = v.tensor_type.shape
        starts = [0] * len(shape)
        limits = list(shape)
        starts[axis], limits[axis] = start, stop
        return self._v("slice", v, attrs={"starts": starts, "limits": limits})

    def zeros_of(self, i: int) -> Value:
        """Zeros of operand i's type."""
        return self.emit.zeros(self.type(i), self.loc)

    def index(self, v: Value, i: Value) -> Value:
        return self._v("index", v, i)

    def scatter_add(self, base: Value, i: Value, updates: Value) -> Value:
        return self._v("scatter_add", base, i, updates)

    def pad_slice(self, g: Value) -> Value:
        """The cotangent of `slice`: g spread out by the steps and padded with zeros, axis by axis
        (`_unstride`, then concats)."""
        t = self.type(0)
        steps = self.op.attrs["steps"] or [1] * t.rank
        out = g
        for axis, (start, limit, _) in enumerate(slice_bounds(self.op.attrs, t.shape)):  # `?` limits: the axis's size
            size = t.shape[axis]
            if limit is None or size is None:
                raise GirTypeError("the gradient of 'slice' needs the sizes of its input (autodiff runs on "
                                   "specialised shapes: under gir.jit, gir.interpret or gir run)", self.loc)
            out = self._unstride(out, axis, steps[axis], limit - start)
            pieces = []
            shape = list(out.tensor_type.shape)
            if start:
                pieces.append(self.emit.zeros(out.tensor_type.with_shape(tuple(
                    shape[:axis] + [start] + shape[axis + 1:])), self.loc))
            pieces.append(out)
            if size - limit:
                pieces.append(self.emit.zeros(out.tensor_type.with_shape(tuple(
                    shape[:axis] + [size - limit] + shape[axis + 1:])), self.loc))
            if len(pieces) > 1:
                out = self._v("concat", *pieces, attrs={"axis": axis})
        return out

    def _unstride(self, g: Value, axis: int, step: int, length: int) -> Value:
        """g's n elements on `axis` placed every `step` positions, zeros between, cut to `length`:
        [a, b] with step 3 -> [a, 0, 0, b, 0, 0] -> its first `length` (4..6) elements."""
        if step == 1:
            return g
        shape = list(g.tensor_type.shape)
        n = g.tensor_type.static_shape_at(self.loc)[axis]  # autodiff runs on static shapes
        column = self.reshape(g, tuple(shape[:axis + 1] + [1] + shape[axis + 1:]))
        gap = self.emit.zeros(column.tensor_type.with_shape(tuple(shape[:axis + 1] + [step - 1] + shape[axis + 1:])),
                              self.loc)
        spread = self.reshape(self._v("concat", column, gap, attrs={"axis": axis + 1}),
                              tuple(shape[:axis] + [n * step] + shape[axis + 1:]))
        return self.slice_axis(spread, axis, 0, length) if length != n * step else spread


class Backprop:
    """Reverse accumulation over ops of one block.

    `fwd` maps a forward value to the value to use where backward ops are emitted; `is_local`
    says whether a value's cotangent is summed here (else it goes to `on_outer`, which a
    backward scan body uses to accumulate cotangents of values its loop closes over)."""

    def __init__(self, rw: Rewriter, emitter: Emitter, fwd: Callable[[Value], Value],
                 is_local: Callable[[Value], bool] | None = None,
                 on_outer: Callable[[Value, Value], None] | None = None):
        self.rw, self.emitter, self.fwd = rw, emitter, fwd
        self.is_local, self.on_outer = is_local, on_outer
        self.adj: dict[Value, Value] = {}

    def add(self, v: Value, g: Value | None) -> None:
        if g is None or not _is_float(v):
            return
        if self.is_local is not None and not self.is_local(v):
            assert self.on_outer is not None
            self.on_outer(v, g)
            return
        prev = self.adj.get(v)
        self.adj[v] = g if prev is None else self.emitter.op("add", [prev, g], loc=_loc_of(v)).result

    def run(self, ops: list[Operation]) -> None:
        for op in reversed(ops):
            gs = [self.adj.pop(r, None) for r in op.results]
            if all(g is None for g in gs):
                continue
            # An error on an op made here says it is part of the gradient of `op` (errors.Origin).
            with self.rw.made_from(op, "in the gradient of"):
                self.backprop_op(op, gs)

    def backprop_op(self, op: Operation, gs: list[Value | None]) -> None:
        if op.name == "scan":
            scan_vjp(self, op, gs)
            return
        spec = op.spec
        if spec.vjp is None:
            if spec.pre_ssa:
                raise GirTypeError(f"autodiff needs SSA form: run the ssa pass before it ('{op.name}')", op.loc)
            raise GirTypeError(f"autodiff: '{op.name}' has no gradient rule, and a gradient flows through it",
                               op.loc)
        (g,) = gs
        grads = spec.vjp(VJPContext(self, op), g)
        for v, dv in zip(op.operands, grads):
            self.add(v, dv)


@dataclass(eq=False)
class _BackwardScan:
    """What the phases of `scan_vjp` share: the forward scan, and the backward scan's body and
    operands as they are built. The backward body's arguments are kept in two lists (sequences,
    carries) and put in order only at the end, because residuals add sequences at any time."""

    bp: Backprop
    """The reverse pass the forward scan is part of: the backward scan goes where it emits."""
    fwd_scan: Operation
    parts: ScanParts
    body: Block = field(default_factory=Block)
    """The backward scan's body."""
    seq_args: list[tuple[Callable[[], Value], BlockArgument]] = field(default_factory=list)
    """(outer value maker, block argument): sequences of the backward scan, in argument order.
    The outer values are made by `_build_forward_stacks`, once the backward body is complete."""
    carry_args: list[tuple[Value, BlockArgument]] = field(default_factory=list)
    """(initial value, block argument): carries of the backward scan."""
    residual_memo: dict[Value, Value] = field(default_factory=dict)
    """Forward body value -> the backward body value standing for it."""
    outer_contrib: dict[Value, Value] = field(default_factory=dict)
    """Value the forward loop closes over -> its cotangent summed within one backward step."""
    seq_of_arg: dict[Value, Sequence] = field(init=False)
    """Forward body argument -> the sequence it is an element of."""
    emit_body: Emitter = field(init=False)
    inner: Backprop = field(init=False)
    """Reverse accumulation over the forward body, emitting into the backward body."""

    def __post_init__(self) -> None:
        self.seq_of_arg = {s.arg: s for s in self.parts.sequences}
        self.emit_body = Emitter(self.bp.rw, block=self.body, loc=self.fwd_scan.loc)
        self.inner = Backprop(self.bp.rw, self.emit_body, self.residual, is_local=self.is_local,
                              on_outer=self.on_outer)

    def is_local(self, v: Value) -> bool:
        """Defined at the top level of the forward body (asked afresh: results are appended
        to nested scans while the backward body is built)."""
        return _defined_at_top_of(v, self.fwd_scan.body)

    def new_seq(self, elem_type: TensorType, make_outer: Callable[[], Value], hint: str | None) -> Value:
        arg = self.body.add_arg(elem_type, hint)
        self.seq_args.append((make_outer, arg))
        return arg

    def residual(self, v: Value) -> Value:
        """Forward value v as seen in the backward body (phase a: collect residuals)."""
        found = self.residual_memo.get(v)
        if found is not None:
            return found
        bp, op = self.bp, self.fwd_scan
        if not self.is_local(v):
            found = bp.fwd(v)
        elif v in self.seq_of_arg:
            outer = self.seq_of_arg[v].outer
            found = self.new_seq(v.tensor_type, partial(bp.fwd, outer), v.name_hint)
        else:
            found = self.new_seq(v.tensor_type, partial(_forward_stack, bp, op, v), v.name_hint)
        self.residual_memo[v] = found
        return found

    def on_outer(self, v: Value, g: Value) -> None:
        prev = self.outer_contrib.get(v)
        self.outer_contrib[v] = g if prev is None else self.emit_body.op("add", [prev, g], loc=_loc_of(v)).result


def scan_vjp(bp: Backprop, op: Operation, gs: list[Value | None]) -> None:
    """The reverse of one forward scan (phases in the module docstring): seed the backward body
    with the result cotangents, differentiate the forward body into it (collecting residuals),
    yield carry cotangents and invariant-gradient accumulators, reuse forward values, build the
    forward stacks the residuals need, emit the reverse scan and pass its results on to `bp`."""
    back = _BackwardScan(bp, op, scan_parts(op))
    _seed_cotangents(back, gs)
    back.inner.run([o for o in op.body.ops if not o.spec.terminator])  # collects residuals as it goes
    yielded, targets = _carry_cotangents(back)
    acc_yielded, acc_targets = _accumulate_invariant_gradients(back)
    seq_targets = _yield_cotangents(back, yielded + acc_yielded)
    _reuse_forward_values(bp.rw, op, back.body, back.residual, back.residual_memo)
    reverse = _build_reverse_scan(back, _build_forward_stacks(back))
    for v, g in zip(targets + acc_targets + seq_targets, reverse.results):
        bp.add(v, g)


def _seed_cotangents(back: _BackwardScan, gs: list[Value | None]) -> None:
    """Phase b, in: takes the cotangents of the forward scan's results; gives the backward body
    its inputs: carry cotangents as carries (zero where none flows in), the cotangents of the
    stacked outputs as sequences."""
    view = LoopView(back.fwd_scan)
    cotangent = dict(zip(back.fwd_scan.results, gs))
    for c, final in zip(back.parts.carries, view.final_carries):
        g = cotangent[final]
        if not _is_float(c.arg):
            continue
        init = g if g is not None else back.bp.emitter.zeros(c.arg.tensor_type, back.fwd_scan.loc)
        arg = back.body.add_arg(c.arg.type, "d" + (c.arg.name_hint or ""))
        back.carry_args.append((init, arg))
        back.inner.add(c.yielded, arg)
    for s, stacked in zip(back.parts.stacks, view.stacked_results):
        g = cotangent[stacked]
        if g is not None:
            elem = g.tensor_type.with_shape(g.tensor_type.shape[1:])
            back.inner.add(s.yielded, back.new_seq(elem, partial(_itself, g), "d" + (s.yielded.name_hint or "")))


def _carry_cotangents(back: _BackwardScan) -> tuple[list[Value], list[Value]]:
    """Phase b, out: after the body is differentiated, gives the cotangents of the forward
    carries' block arguments (zero where none flowed), to yield, and the forward initial values
    the backward scan's matching results are cotangents of."""
    yielded: list[Value] = []
    targets: list[Value] = []
    for c in back.parts.carries:
        if not _is_float(c.arg):
            continue
        d = back.inner.adj.get(c.arg)
        yielded.append(d if d is not None else back.emit_body.zeros(c.arg.tensor_type, back.fwd_scan.loc))
        targets.append(c.init)
    return yielded, targets


def _accumulate_invariant_gradients(back: _BackwardScan) -> tuple[list[Value], list[Value]]:
    """Phase c: cotangents of values the forward loop closes over are summed across steps in new
    carries (`acc + g_t`, from zero). Gives the accumulators' next values, to yield, and the
    closed-over values the backward scan's matching results are cotangents of."""
    yielded: list[Value] = []
    targets: list[Value] = []
    for v, g in list(back.outer_contrib.items()):
        arg = back.body.add_arg(v.type, "acc" + (v.name_hint or ""))
        back.carry_args.append((back.bp.emitter.zeros(v.tensor_type, back.fwd_scan.loc), arg))
        yielded.append(back.emit_body.op("add", [arg, g], loc=back.fwd_scan.loc).result)
        targets.append(v)
    return yielded, targets


def _yield_cotangents(back: _BackwardScan, carries: list[Value]) -> list[Value]:
    """Ends the backward body with `yield (carries) stack (sequence cotangents)`; gives the
    forward sequences the backward scan's stacked results are cotangents of."""
    seq_grads = [(s, back.inner.adj[s.arg]) for s in back.parts.sequences if back.inner.adj.get(s.arg) is not None]
    back.bp.rw.create("yield", carries + [g for _, g in seq_grads], at_end=back.body, loc=back.fwd_scan.loc,
                      segments=(len(carries), len(seq_grads)))
    return [s.outer for s, _ in seq_grads]


def _build_forward_stacks(back: _BackwardScan) -> list[Value]:
    """Gives the backward scan's sequence operands, appending to the forward scan a stack of
    every residual the backward body still reads."""
    return [make() for make, _ in back.seq_args]



def _forward_stack(bp: Backprop, scan: Operation, v: Value) -> Value:
    """The stack of forward body value v over the forward scan's steps, as the reverse pass sees it."""
    return bp.fwd(append_stack(scan, v))


def _itself(v: Value) -> Value:
    return v

def _build_reverse_scan(back: _BackwardScan, outers: list[Value]) -> Operation:
    """Puts the backward body's arguments in order (sequences, then carries) and emits the
    scan running the other way over `outers`; a scan without sequences keeps the trip count."""
    body, op = back.body, back.fwd_scan
    body.args = [a for _, a in back.seq_args] + [a for _, a in back.carry_args]
    for i, a in enumerate(body.args):
        a.index = i
    attrs = {"reverse": not op.attrs["reverse"], "length": None if outers else LoopView(op).trip_count}
    return back.bp.emitter.op("scan", outers + [init for init, _ in back.carry_args], loc=op.loc, attrs=attrs,
                              regions=[Region(body)], segments=(len(outers), len(back.carry_args)))


def _reuse_forward_values(rw: Rewriter, fwd_scan: Operation, bwd: Block, residual: Callable[[Value], Value],
                          memo: dict[Value, Value]) -> None:
    """A backward op that repeats a forward op (same kind, attributes and operands, e.g. the
    `y * y` of tanh's rule when the forward also squared y) reads the forward value instead,
    from a stack: nothing of the forward body is recomputed."""
    def key(op: Operation, operand_key: Callable[[Value], Any]) -> tuple | None:
        if len(op.results) != 1 or op.regions or not op.spec.pure or op.spec.category == "constant":
            return None
        keys = [operand_key(v) for v in op.operands]
        if any(k is None for k in keys):
            return None
        return (op.name, repr(sorted(op.attrs.items())), str(op.result.type), tuple(keys))

    def constant_key(v: Value) -> Any:
        s = splat_value(v)
        return ("const", s, str(v.type)) if s is not None else None

    body = fwd_scan.body

    def fwd_operand(v: Value) -> Any:
        local = _defined_at_top_of(v, body)
        return constant_key(v) or (("fwd", id(v)) if local else ("outer", id(v)))

    forward: dict[tuple, Operation] = {}
    for f_op in body:
        k = key(f_op, fwd_operand)
        if k is not None:
            forward.setdefault(k, f_op)
    back_to_fwd = {b: f for f, b in memo.items()}

    def bwd_operand(v: Value) -> Any:
        if v in back_to_fwd:
            return fwd_operand(back_to_fwd[v])
        const = constant_key(v)
        if const is not None:
            return const
        return None if _defined_at_top_of(v, bwd) else ("outer", id(v))

    for b_op in list(bwd):
        k = key(b_op, bwd_operand)
        match = forward.get(k) if k is not None else None
        if match is None:
            continue
        value = residual(match.result)
        back_to_fwd[value] = match.result
        rw.replace_op(b_op, [value])


def _defined_at_top_of(v: Value, block: Block) -> bool:
    """v is an argument of block or a result of an op directly in it (not nested deeper)."""
    owner = v.defining_op
    return owner.parent is block if owner is not None else v.defining_block is block


def expand_grad(rw: Rewriter, module: Module, grad: Operation) -> None:
    rw.current = "expand-grad"
    callee = module.functions[grad.attrs["callee"]]
    wrt = list(grad.attrs["wrt"])
    for p in wrt:
        if not callee.arg_types[p].is_float:
            raise GirTypeError(f"grad: cannot differentiate @{callee.name} with respect to argument #{p} "
                               f"(%{callee.args[p].name_hint}) of integer or boolean type {callee.arg_types[p]}",
                               grad.loc)
    args = list(grad.operands)
    # A value passed in several positions gets a distinct copy per wrt position, so that each
    # gradient is that parameter's own (canonicalize removes the copies afterwards).
    for p in wrt:
        if args.count(args[p]) > 1:
            args[p] = rw.value("broadcast", [args[p]], before=grad, attrs={"shape": list(args[p].tensor_type.shape)})
    new_ops, returned = inline_call(rw, callee, args, grad)
    # The loss may be a call's result (`%l = @sq(%x)  return %l`): inlining that call erases it,
    # and the loss is what stands for it now.
    replaced: dict[Value, Value] = {}
    new_ops = inline_calls(rw, module, new_ops, replaced=replaced)
    loss, *aux = returned  # aux: the callee's other results (has_aux), passed through
    loss = current(loss, replaced)
    aux = [current(v, replaced) for v in aux]
    emitter = Emitter(rw, anchor=grad)
    bp = Backprop(rw, emitter, fwd=lambda v: v)
    rw.current = "reverse-mode"
    bp.adj[loss] = emitter.op("constant", [], loc=grad.loc, attrs={"value": 1.0}, declared=[loss.tensor_type]).result
    bp.run(new_ops)
    grads = []
    for p in wrt:
        g = bp.adj.get(args[p])
        grads.append(g if g is not None else emitter.zeros(args[p].tensor_type, grad.loc))
    rw.current = "expand-grad"
    rw.replace_op(grad, [loss, *aux] + grads)


class Autodiff(Pass):
    name = "autodiff"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        changed = False
        for _ in range(len(module.functions) + 1):  # callees' own grads first (grad of a grad)
            grads = [op for op in module.walk() if op.name == "grad"]
            ready = [g for g in grads
                     if not any(o.name == "grad" for o in module.functions[g.attrs["callee"]].walk())]
            if not grads:
                break
            if not ready:
                raise GirTypeError("autodiff: grad ops depend on each other in a cycle", grads[0].loc)
            for g in ready:
                expand_grad(rw, module, g)
                stats.count("grads expanded")
            changed = True
        return changed
