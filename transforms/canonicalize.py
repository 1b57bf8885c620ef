"""The `canonicalize` pass: dead code elimination, common subexpression elimination (scoped by
regions), constant folding, algebraic identities, and scan clean-ups.

Before:
    %0 = constant 0.0 : tensor<f32>
    %1 = add %x, %0 : tensor<4xf32>          // x + 0 -> x (types agree)
    %2 = neg %1 : tensor<4xf32>
    %3 = neg %2 : tensor<4xf32>              // neg(neg(x)) -> x
    %4 = mul %x, %x : tensor<4xf32>          // unused -> erased
    return %3
After:
    return %x

Scan clean-ups: unused stacks and sequences are dropped; a carry whose final value is unused
and that feeds nothing else in the body is dropped; a carry yielded unchanged is replaced by
its initial value; pure ops whose operands are all defined outside a body are hoisted before
the loop. Rewrites apply only when the result type is unchanged (broadcasting may not be undone).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..ir.core import Block, Function, Module, Operation, OpResult, Value
from ..ir.loops import LoopView
from ..ir.ops import REGISTRY, splat_value
from ..ir.spec import fails_at_run_time
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Pattern, Rewriter, apply_patterns_greedily
from .loops import ScanParts, append_stack, is_defined_inside, rebuild_scan, scan_parts

FOLD_LIMIT = 1024
"""Constant folding never makes a non-splat constant larger than this many elements."""


def is_splat(v: Value, x: float) -> bool:
    s = splat_value(v)
    return s is not None and not isinstance(s, bool) and s == x


def _same(op: Operation, v: Value) -> bool:
    return v.type == op.result.type


class _Identity(Pattern):
    """Base for `op(x, c) -> x` identities."""

    def forward(self, op: Operation, v: Value, rw: Rewriter) -> bool:
        if not _same(op, v):
            return False
        rw.replace_op(op, [v])
        return True


class AddZero(_Identity):
    """x + 0 -> x, 0 + x -> x"""

    op_name = "add"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        a, b = op.operands
        if is_splat(b, 0):
            return self.forward(op, a, rw)
        if is_splat(a, 0):
            return self.forward(op, b, rw)
        return False


class SubZero(_Identity):
    """x - 0 -> x;  0 - x -> neg(x)"""

    op_name = "sub"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        a, b = op.operands
        if is_splat(b, 0):
            return self.forward(op, a, rw)
        if is_splat(a, 0) and _same(op, b):
            rw.replace_op(op, [rw.value("neg", [b], before=op)])
            return True
        return False


class MulOne(_Identity):
    """x * 1 -> x, 1 * x -> x;  x * -1 -> neg(x)"""

    op_name = "mul"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        a, b = op.operands
        if is_splat(b, 1):
            return self.forward(op, a, rw)
        if is_splat(a, 1):
            return self.forward(op, b, rw)
        for x, c in ((a, b), (b, a)):
            if is_splat(c, -1) and _same(op, x):
                rw.replace_op(op, [rw.value("neg", [x], before=op)])
                return True
        return False


class DivOne(_Identity):
    """x / 1 -> x"""

    op_name = "div"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        return is_splat(op.operands[1], 1) and self.forward(op, op.operands[0], rw)


class NegNeg(_Identity):
    """neg(neg(x)) -> x"""

    op_name = "neg"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        inner = op.operands[0].defining_op
        return inner is not None and inner.name == "neg" and self.forward(op, inner.operands[0], rw)


class TransposeTranspose(_Identity):
    """transpose(transpose(x, p), q) -> transpose(x, p[q]);  transpose(x, identity) -> x"""

    op_name = "transpose"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        x = op.operands[0]
        perm = _perm(op)
        if perm == list(range(len(perm))):
            return self.forward(op, x, rw)
        inner = x.defining_op
        if inner is None or inner.name != "transpose":
            return False
        p = _perm(inner)
        combined = [p[i] for i in perm]
        src = inner.operands[0]
        if combined == list(range(len(combined))):
            return self.forward(op, src, rw)
        rw.replace_op(op, [rw.value("transpose", [src], before=op, attrs={"perm": combined})])
        return True


def _perm(op: Operation) -> list[int]:
    perm = op.attrs["perm"]
    rank = op.result.tensor_type.rank
    return list(range(rank))[::-1] if perm is None else list(perm)


class ReshapeReshape(_Identity):
    """reshape(reshape(x)) -> reshape(x);  reshape(x) to x's own shape -> x"""

    op_name = "reshape"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        x = op.operands[0]
        if _same(op, x):
            return self.forward(op, x, rw)
        inner = x.defining_op
        if inner is None or inner.name != "reshape" or not op.result.tensor_type.is_static:
            return False  # a `?` in the shape attribute means "keep the input's dim", not "unknown"
        shape = list(op.result.tensor_type.shape)
        rw.replace_op(op, [rw.value("reshape", [inner.operands[0]], before=op, attrs={"shape": shape})])
        return True


class NoOp(_Identity):
    """op(x) -> x  when op's type is x's and its spec says `same_type_is_identity`
    (broadcast, cast, slice, a one-operand concat)"""

    def __init__(self, op_name: str):
        self.op_name = op_name

    @property
    def name(self) -> str:
        return "NoOpLayout"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        if len(op.operands) != 1:
            return False
        return self.forward(op, op.operands[0], rw)


class SelectSame(_Identity):
    """select(c, x, x) -> x"""

    op_name = "select"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        _, a, b = op.operands
        return a is b and self.forward(op, a, rw)


class AddDisjointConcats(Pattern):
    """concat(a, 0) + concat(0, b) -> concat(a, b)  (zero pieces, same axis, no overlap)

    The VJP of `slice` pads with zeros, so the gradient of a merged product read through
    several slices is a sum of padded pieces; this turns that sum back into one concat."""

    op_name = "add"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        lhs, rhs = (v.defining_op for v in op.operands)
        if lhs is None or rhs is None or lhs.name != "concat" or rhs.name != "concat":
            return False
        if lhs.attrs["axis"] != rhs.attrs["axis"] or not _same(op, op.operands[0]) or not _same(op, op.operands[1]):
            return False
        axis = lhs.attrs["axis"] % op.result.tensor_type.rank
        if any(v.tensor_type.shape[axis] is None for v in lhs.operands + rhs.operands):
            return False
        pieces = _segments(lhs, axis) + _segments(rhs, axis)
        cuts = sorted({p[0] for p in pieces} | {p[1] for p in pieces})
        out: list[Value | None] = []
        for lo, hi in zip(cuts, cuts[1:]):
            covering = [p for p in pieces if p[0] <= lo and hi <= p[1] and p[2] is not None]
            if len(covering) > 1:
                return False
            if covering:
                start, end, v = covering[0]
                if (start, end) != (lo, hi):
                    return False  # a value split across cuts: not a simple interleaving
                out.append(v)
            else:
                out.append(None)
        values: list[Value] = []
        for (lo, hi), v in zip(zip(cuts, cuts[1:]), out):
            if v is None:
                shape = list(op.result.tensor_type.shape)
                shape[axis] = hi - lo
                v = rw.constant(0.0 if op.result.tensor_type.is_float else 0,
                                op.result.tensor_type.with_shape(tuple(shape)), before=op)
            values.append(v)
        rw.replace_op(op, [rw.value("concat", values, before=op, attrs={"axis": axis})])
        return True


class AddIntoScatter(Pattern):
    """a + scatter_add(0, i, u) -> scatter_add(a, i, u)  (the scatter used only here)

    The VJP of `index` scatters into zeros; where the cotangent is accumulated (a table read at
    every step of a loop: a carry of the backward scan), this adds the rows to the accumulator
    directly, O(rows read) per step instead of a full-size zeros and add."""

    op_name = "add"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        for k in (0, 1):
            other, scatter = op.operands[1 - k], op.operands[k].defining_op
            if (scatter is None or scatter.name != "scatter_add" or len(op.operands[k].uses) != 1
                    or not is_splat(scatter.operands[0], 0) or not _same(op, other) or not _same(op, scatter.result)):
                continue
            _, rows, updates = scatter.operands
            rw.replace_op(op, [rw.value("scatter_add", [other, rows, updates], before=op)])
            # The old scatter is dead now. It may fail (an index out of range), so DCE would keep
            # it; the new one checks the same rows against the same leading dim, so it goes.
            rw.erase(scatter)
            return True
        return False


def _segments(concat: Operation, axis: int) -> list[tuple[int, int, Value | None]]:
    """(start, end, value or None for a zero splat) for each piece along axis."""
    out, start = [], 0
    for v in concat.operands:
        size = v.tensor_type.shape[axis] or 0
        out.append((start, start + size, None if is_splat(v, 0) else v))
        start += size
    return out


class FoldConstants(Pattern):
    """op(constants...) -> constant (splat when all elements are equal)"""

    def __init__(self, op_name: str):
        self.op_name = op_name

    @property
    def name(self) -> str:
        return "FoldConstants"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        if not op.operands:
            return False
        consts = []
        for v in op.operands:  # bails out at the first operand that is not a constant (most ops)
            d = v.defining_op
            if d is None or d.spec.category != "constant":
                return False
            consts.append(d)
        t = op.result.tensor_type
        if not t.is_static:
            return False
        # A constant with an operand (`fill`) is known only when that operand is: not folded.
        if any(d.spec.kernel is None or d.operands for d in consts):
            return False
        # Sizes come from the static types, before any kernel runs: a constant of
        # tensor<100000x100000xf32> is one attribute here but 37 GiB as an array.
        sizes = [v.tensor_type.num_elements() for v in op.operands] + [t.num_elements()]
        if all(n is not None and n <= FOLD_LIMIT for n in sizes):
            out = self._run(op, [d.spec.kernel(d) for d in consts])  # type: ignore[misc]
        elif op.spec.category == "elementwise" and all(splat_value(v) is not None for v in op.operands):
            # Splats in, splat out: the kernel runs on one element of each operand.
            out = self._run(op, [np.array(splat_value(v), dtype=v.tensor_type.numpy_dtype) for v in op.operands])
        elif op.spec.category == "layout" and len(op.operands) == 1 and splat_value(op.operands[0]) is not None:
            # broadcast, reshape, transpose, slice of a splat move equal elements: the same splat
            # (autodiff's `ones` seed of a huge cotangent is one).
            out = np.array(splat_value(op.operands[0]), dtype=t.numpy_dtype)
        else:
            return False
        if out is None:
            return False
        flat = out.reshape(-1)
        if flat.size == 0 or t.num_elements() == 0:
            value: Any = np.zeros((), t.numpy_dtype).item()  # a splat of no elements: any value
        elif _all_equal(flat):
            value = flat[0].item()
        elif flat.size <= FOLD_LIMIT:
            value = out.tolist()
        else:
            return False
        rw.replace_op(op, [rw.constant(value, t, before=op)])
        return True

    @staticmethod
    def _run(op: Operation, arrays: list[np.ndarray]) -> np.ndarray | None:
        """The op's kernel on arrays as its result dtype; None on a run-time error (left to run time)."""
        try:
            with np.errstate(all="ignore"):
                return np.asarray(op.spec.kernel(op, *arrays), dtype=op.result.tensor_type.numpy_dtype)  # type: ignore[misc]
        except (ArithmeticError, ValueError, IndexError):
            return None


def _all_equal(flat: np.ndarray) -> bool:
    """Every element equals the first (not nan; 0.0 and -0.0 differ, as 1 / x shows)."""
    same = flat == flat[0]
    if flat.dtype.kind == "f":
        same &= np.signbit(flat) == np.signbit(flat[0])
    return bool(np.all(same)) and not (flat.dtype.kind == "f" and np.isnan(flat[0]))


class DeadCode(Pattern):
    """op with no used results and no side effects -> (erased)"""

    def __init__(self, op_name: str):
        self.op_name = op_name

    @property
    def name(self) -> str:
        return "DeadCode"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        for r in op.results:
            if r.uses:
                return False
        if op.regions and any(not inner.spec.pure and not inner.spec.terminator
                              for region in op.regions for inner in region.block.walk()):
            return False  # e.g. a pre-SSA loop that stores into an outer variable
        if fails_at_run_time(op):
            return False  # its error is part of what the program does (an integer division by zero)
        rw.erase(op)
        return True


class ScanDropUnused(Pattern):
    """scan whose stack, sequence or carry is unused -> scan without it

    A carry is dead when its final value is unused and its block argument feeds only values
    that flow back into dead carries (found as a fixed point over the carries)."""

    op_name = "scan"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        g = LoopView(op).groups()
        if all(r.uses for r in g.stacked_results) and all(r.uses for r in g.final_carries) \
                and all(a.uses for a in g.element_args):
            return False  # every piece is used: nothing to drop (the common case, checked cheaply)
        parts = scan_parts(op)
        stacks = [s for s in parts.stacks if s.result is not None and s.result.uses]
        live_carries = _live_carries(parts)
        carries = [c for i, c in enumerate(parts.carries) if i in live_carries]
        seqs = [s for s in parts.sequences if s.arg.uses]
        if not seqs and parts.sequences and LoopView(op).trip_count is None:
            seqs = parts.sequences[:1]  # the only record of a `?` trip count
        if len(stacks) == len(parts.stacks) and len(carries) == len(parts.carries) and len(seqs) == len(
                parts.sequences):
            return False
        parts.stacks, parts.carries, parts.sequences = stacks, carries, seqs
        rebuild_scan(rw, parts)
        return True


def _live_carries(parts: ScanParts) -> set[int]:
    """Indices of carries needed: final value used outside, or read by a live body value."""
    body = parts.op.body
    arg_index = {c.arg: i for i, c in enumerate(parts.carries)}
    live: set[int] = {i for i, c in enumerate(parts.carries) if c.result is not None and c.result.uses}
    if len(live) == len(parts.carries):
        return live  # all used after the loop: nothing to find
    roots = [s.yielded for s in parts.stacks if s.result is not None and s.result.uses]
    for op in body:
        if (not op.spec.pure and not op.spec.terminator) or fails_at_run_time(op):
            # The op stays (rebuild_scan keeps it), and so does all it reads, including what
            # the ops in its regions read from here (a nested loop's body that stacks a carry).
            for inner in op.walk():
                roots.extend(inner.operands)
    seen: set[Value] = set()
    frontier = list(roots) + [parts.carries[i].yielded for i in live]
    while True:
        while frontier:
            v = frontier.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in arg_index and arg_index[v] not in live:
                live.add(arg_index[v])
                frontier.append(parts.carries[arg_index[v]].yielded)
            owner = v.defining_op
            if owner is not None and owner.parent_op is not None and parts.op.is_ancestor_of(owner):
                frontier.extend(owner.operands)
                for inner in owner.walk():
                    frontier.extend(inner.operands)
        return live


class ScanForwardInvariantCarries(Pattern):
    """scan carry (%a = %init) { ... yield (%a) } -> uses of %a and of the result become %init"""

    op_name = "scan"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        g = LoopView(op).groups()
        if not any(y is a for y, a in zip(g.yielded_carries, g.carry_args)):
            return False
        parts = scan_parts(op)
        invariant = [c for c in parts.carries if c.yielded is c.arg]
        if not invariant:
            return False
        dropped = {i for i, c in enumerate(parts.carries) if c in invariant}
        for c in invariant:
            rw.replace_all_uses(c.arg, c.init)
            if c.result is not None:
                rw.replace_all_uses(c.result, c.init)
        parts = scan_parts(op)  # yielded values may have been the forwarded arguments: read them again
        parts.carries = [c for i, c in enumerate(parts.carries) if i not in dropped]
        rebuild_scan(rw, parts)
        return True


class ScanMergeDuplicateStacks(Pattern):
    """scan { ... yield (...) stack (%v, %v) } -> one stack of %v (the other's uses move over)"""

    op_name = "scan"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        yielded = LoopView(op).yielded_stacks
        if len(set(yielded)) == len(yielded):
            return False  # no value is stacked twice
        parts = scan_parts(op)
        first: dict[Value, Any] = {}
        changed = False
        for s in parts.stacks:
            kept = first.setdefault(s.yielded, s)
            if kept is not s and s.result is not None and s.result.uses:
                rw.replace_all_uses(s.result, kept.result)
                changed = True
        return changed  # the now unused duplicate is dropped by ScanDropUnused


class ConcatOfStacks(Pattern):
    """concat(stack_t(a_t), stack_t(b_t), axis=k) -> stack_t(concat(a_t, b_t, axis=k-1))   (k >= 1)

    Gradients of a merged GEMM come out of the backward loop as one stack per slice and are
    concatenated after it, while the body usually concatenates the same values already (for
    the merged product's cotangent): stacking that concat instead drops the separate stacks."""

    op_name = "concat"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        axis = op.attrs["axis"] % op.result.tensor_type.rank
        scans = {v.defining_op for v in op.operands}
        if axis == 0 or len(scans) != 1:
            return False
        scan = scans.pop()
        if scan is None or scan.name != "scan":
            return False
        parts = scan_parts(scan)
        by_result: dict[Value, Value] = {st.result: st.yielded for st in parts.stacks if st.result is not None}
        if not all(v in by_result for v in op.operands):
            return False
        yielded = [by_result[v] for v in op.operands]
        body = scan.body
        inner = next((u for u in yielded[0].users if u.name == "concat" and u.parent is body
                      and u.operands == yielded and u.attrs["axis"] % u.result.tensor_type.rank == axis - 1), None)
        if inner is None:
            inner = rw.create("concat", yielded, before=body.terminator, attrs={"axis": axis - 1})
        existing = next((st.result for st in parts.stacks if st.yielded is inner.result), None)
        rw.replace_op(op, [existing if existing is not None else append_stack(scan, inner.result)])
        return True


class ScanHoistInvariants(Pattern):
    """scan { %v = f(outer values) ... } -> %v = f(outer values); scan { ... }"""

    op_name = "scan"

    def match_and_rewrite(self, op: Operation, rw: Rewriter) -> bool:
        hoisted = False
        runs = (LoopView(op).trip_count or 0) > 0
        body = op.body
        for inner in body:
            spec = inner.spec
            if inner.regions or not spec.pure or spec.terminator or spec.callee_results is not None:
                continue  # (callee_results: spec.interprocedural, without the property call)
            if not runs and fails_at_run_time(inner):
                continue  # out of a loop that may run no step, it would fail where the loop does not
            if not _all_outside(inner.operands, op, body):
                continue
            rw.move_before(inner, op)  # its results are outside now, for the ops after it
            hoisted = True
        return hoisted


def _all_outside(values: list[Value], scan: Operation, body: Block) -> bool:
    """No value is defined inside scan (`is_defined_inside`), with the common answers first: a
    result of an op of the body itself, or an argument of the body, is inside."""
    for v in values:
        if type(v) is OpResult:
            if v.op.parent is body:
                return False
        elif v.defining_block is body:
            return False
        if is_defined_inside(v, scan):
            return False
    return True


def _cse_kinds() -> dict[str, bool]:
    """The op kinds CSE may merge (pure, not a terminator, not a call), each with whether it is
    commutative: looked up once per CSE walk rather than per op."""
    return {name: spec.commutative for name, spec in REGISTRY.items()
            if spec.pure and not spec.terminator and not spec.interprocedural}


def _cse_key(op: Operation, kinds: dict[str, bool]) -> tuple | None:
    """What two ops that compute the same value share: kind, operands (sorted where the kind is
    commutative), attributes and result types; None for an op CSE leaves alone."""
    commutative = kinds.get(op.name)
    if commutative is None or op.regions:
        return None
    operands = [id(v) for v in op.operands]
    if commutative:
        operands.sort()
    attrs = op.attrs
    results = op.results
    types = (results[0].type,) if len(results) == 1 else tuple(r.type for r in results)
    return (op.name, tuple(operands), _freeze_attrs(attrs) if attrs else (), types)


_SCALAR_NAMES = {int: "int", bool: "bool", str: "str"}


def _freeze_attrs(attrs: dict[str, Any]) -> tuple:
    """`_freeze(attrs)`, the same tuple, with the common case of one scalar attribute (a
    constant's value) made without the general recursion."""
    if len(attrs) == 1:
        ((k, v),) = attrs.items()
        kind = type(v)
        if kind is float:
            return ((k, ("float", repr(v))),)
        name = _SCALAR_NAMES.get(kind)
        if name is not None:
            return ((k, (name, v)),)
    return _freeze(attrs)


def _freeze(x: Any) -> Any:
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, float):
        return ("float", repr(x))  # keeps -0.0 apart from 0.0, and nan equal to nan
    return (type(x).__name__, x)


def cse(function: Function, rw: Rewriter) -> bool:
    """Scoped CSE: an op may reuse an equal op of its own block or of any enclosing block."""
    rw.current = "CSE"
    stats = rw.stats.pattern("CSE")
    start = time.perf_counter()
    changed = False
    scopes: list[dict[tuple, Operation]] = []
    kinds = _cse_kinds()

    def walk(block: Block) -> None:
        nonlocal changed
        scopes.append({})
        for op in block:
            key = _cse_key(op, kinds)
            if key is not None:
                stats.tried += 1
                found = _lookup(scopes, key)
                if found is not None:
                    for old, new in zip(op.results, found.results):
                        if old.name_hint and not new.name_hint:
                            new.name_hint = old.name_hint
                    rw.replace_op(op, found.results)
                    stats.applied += 1
                    changed = True
                    continue
                scopes[-1][key] = op
            for region in op.regions:
                walk(region.block)
        scopes.pop()

    walk(function.body)
    stats.seconds += time.perf_counter() - start
    return changed


def _lookup(scopes: list[dict[tuple, Operation]], key: tuple) -> Operation | None:
    """The op of the innermost scope that has key, or None."""
    for scope in reversed(scopes):
        found = scope.get(key)
        if found is not None:
            return found
    return None


def canonicalization_patterns() -> list[Pattern]:
    patterns: list[Pattern] = [AddDisjointConcats(), AddIntoScatter(), AddZero(), SubZero(), MulOne(), DivOne(),
                               NegNeg(), TransposeTranspose(), ReshapeReshape(), SelectSame(),
                               ScanForwardInvariantCarries(), ScanMergeDuplicateStacks(), ScanDropUnused(),
                               ScanHoistInvariants(), ConcatOfStacks()]
    patterns += [NoOp(name) for name, spec in REGISTRY.items() if spec.same_type_is_identity]
    for name, spec in REGISTRY.items():
        if spec.kernel is not None and spec.category != "constant" and not spec.moves_device:
            patterns.append(FoldConstants(name))
        if spec.pure and not spec.terminator:
            patterns.append(DeadCode(name))
    return patterns


class Canonicalize(Pass):
    name = "canonicalize"
    idempotent = True

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        patterns = canonicalization_patterns()
        changed = False
        self.converged = True
        """Every function reached a round with nothing to do (so another run would do nothing)."""
        for f in module.functions.values():
            # Patterns and CSE expose work for each other; a few rounds suffice. CSE finds
            # nothing in its own output, so after the first round, a round whose patterns
            # changed nothing ends the loop without running CSE on IR it has already seen.
            for round_ in range(10):
                rewrote = apply_patterns_greedily(f, patterns, rw)
                if not rewrote and round_ > 0:
                    break
                merged = cse(f, rw)
                changed |= rewrote or merged
                if not (rewrote or merged):
                    break
            else:
                self.converged = False
        return changed
