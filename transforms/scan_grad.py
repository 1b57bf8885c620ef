"""The `scan-grad` pass: the rewrites from "investigating Theano scan gradient speed".

1. Input-projection hoisting: `x_t @ W` (x_t a sequence element, W loop-invariant) becomes one
   GEMM over the whole sequence before the loop, fed to the scan as a new sequence:

       scan (%x in %xs) { %p = matmul %x, %w ... }
    -> %ps = matmul %xs, %w : tensor<TxBxH>;  scan (%x in %xs, %p in %ps) { ... }

2. GEMM merging: products sharing a left operand, `x @ U`, `x @ V` (U, V loop-invariant),
   become `x @ concat(U, V)` and slices; sums of products `a @ U + b @ V` become
   `concat(a, b) @ concat(U, V)` (K axis). Weight concats are built once, before the loop.
   Run before autodiff, gradients inherit the merged products (dU, dV come back as slices).

3. Accumulation push-out: a carry `acc` updated as `acc + A_t @ B_t` (either order, A or B
   possibly transposed), read nowhere else in the body, becomes one GEMM after the loop over
   the stacked operands: `acc_T = acc_0 + A^T_cat @ B_cat` with the stacks reshaped to
   (T*batch, ...). A stack that already exists is reused: a sequence element is its sequence,
   and a forward stack of a carry's *input* (h_{t-1}) is the stack of its output (h_t)
   shifted by one step with h_0 in front, so the GEMM is split into `h_0^T @ B_0` plus a GEMM
   over slices, and the forward copy of h_{t-1} dies. Candidates that would need more new
   stack memory than `max-extra-bytes` are left alone, with the reason in the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GirPassError
from ..ir.core import Block, Module, Operation, OpResult, Value
from ..ir.loops import LoopView
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics, Rewriter
from .loops import Carry, Sequence, append_stack, defined_inside, is_defined_inside, rebuild_scan, scan_parts


@dataclass(frozen=True)
class ScanGradOptions:
    max_extra_bytes: int = 1 << 32
    """Largest amount of new stacked memory one push-out may add."""
    hoist: bool = True
    merge: bool = True
    merge_sums: bool = True
    """Also `a @ U + b @ V -> concat(a, b) @ concat(U, V)` (part of `merge`). Off in the first
    run of a memory-budgeted pipeline: that run does not hoist input projections (the second
    one hoists them per checkpointed segment), and `x @ W + h @ U` would otherwise be merged
    into a product that stacks `concat(x, h)` per step (transforms/checkpoint.py)."""
    push_out: bool = True

    def validate(self, pass_name: str) -> None:
        if self.max_extra_bytes < 0:
            raise GirPassError(f"pass '{pass_name}': max-extra-bytes must be >= 0, got {self.max_extra_bytes}")


def _scans(module: Module) -> list[Operation]:
    return [op for op in module.walk() if op.name == "scan"]


def _is_seq_arg(scan: Operation, v: Value) -> Sequence | None:
    if v.defining_block is not scan.body:
        return None  # not even an argument of the body (most operands): no need to take the scan apart
    view = LoopView(scan)
    for outer, arg in zip(view.sequences, view.element_args):
        if arg is v:  # scan_parts(scan)'s Sequence, without taking the whole scan apart
            return Sequence(outer, arg)
    return None


# ---------------------------------------------------------------------------------------------
# 1. Input-projection hoisting


def hoist_projections(rw: Rewriter, scan: Operation, stats: PassStatistics) -> Operation:
    rw.current = "hoist-input-projection"
    for op in list(scan.body):
        if op.name != "matmul" or op.parent is None:
            continue
        a, w = op.operands
        if a.tensor_type.rank != 2 or w.tensor_type.rank != 2:
            continue
        seq = _is_seq_arg(scan, a) if not is_defined_inside(w, scan) else None
        if seq is not None:
            with rw.made_from(op):
                projected = rw.value("matmul", [seq.outer, w], before=scan)
        else:
            seq = _is_seq_arg(scan, w) if not is_defined_inside(a, scan) else None
            if seq is None:
                continue
            with rw.made_from(op):
                projected = rw.value("matmul", [a, seq.outer], before=scan)
        parts = scan_parts(scan)
        arg = scan.body.add_arg(op.result.type, op.result.name_hint, index=len(parts.sequences))
        parts.sequences.append(Sequence(projected, arg))
        rw.replace_op(op, [arg])
        view = LoopView(scan)  # the product may have been yielded: read the yield again
        for c, v in zip(parts.carries, view.yielded_carries):
            c.yielded = v
        for st, v in zip(parts.stacks, view.yielded_stacks):
            st.yielded = v
        scan = rebuild_scan(rw, parts)
        stats.count("scan-grad: input projections hoisted")
    return scan


# ---------------------------------------------------------------------------------------------
# 2. GEMM merging


def _invariant(v: Value, scan: Operation | None, inside: set[Value]) -> bool:
    return scan is not None and v not in inside


def merge_shared_operand(rw: Rewriter, block: Block, scan: Operation | None, stats: PassStatistics) -> None:
    """x @ U, x @ V -> slices of x @ concat(U, V); in a scan body U and V must be invariant,
    at the top level they must be defined before the first product."""
    rw.current = "merge-shared-operand"
    position = {op: i for i, op in enumerate(block)} if scan is None else {}
    groups: dict[tuple[Value, str | None], list[Operation]] = {}
    for op in block:
        if op.name == "matmul" and op.operands[1].tensor_type.rank == 2:
            # products pinned to different devices (`device` written in the input) stay apart
            groups.setdefault((op.operands[0], op.attrs.get("device")), []).append(op)
    for (x, _), products in groups.items():
        if len(products) < 2 or not all(p.result.tensor_type.is_static for p in products):
            continue
        first = products[0]
        weights = [p.operands[1] for p in products]
        if scan is not None:
            if any(is_defined_inside(w, scan) for w in weights):
                continue
            where = scan
        else:
            limit = position[first]
            if not all((d := w.defining_op) is None or position.get(d, limit) < limit for w in weights):
                continue
            where = first
        if len({w.tensor_type.dtype for w in weights}) != 1:
            continue
        with rw.made_from(first):
            cat = rw.value("concat", weights, before=where, attrs={"axis": 1})
            big = rw.value("matmul", [x, cat], before=first)
        offset = 0
        for p in products:
            n = p.result.tensor_type.static_shape_at(p.loc)[-1]
            shape = big.tensor_type.shape
            starts = [0] * len(shape)
            limits = list(shape)
            starts[-1], limits[-1] = offset, offset + n
            with rw.made_from(p):
                rw.replace_op(p, [rw.value("slice", [big], before=p, attrs={"starts": starts, "limits": limits})])
            offset += n
        stats.count("scan-grad: products merged (shared operand)", len(products))


def merge_sums(rw: Rewriter, scan: Operation, stats: PassStatistics) -> None:
    """a @ U + b @ V (U, V invariant) -> concat(a, b, K axis) @ concat(U, V)"""
    rw.current = "merge-sum-of-products"
    inside = defined_inside(scan)
    for op in list(scan.body):
        if op.name != "add" or op.parent is None:
            continue
        prods = [p for v in op.operands
                 if (p := v.defining_op) is not None and p.name == "matmul" and len(p.result.uses) == 1]
        if len(prods) != len(op.operands):
            continue
        (a, u), (b, v) = (p.operands for p in prods)
        if u in inside or v in inside or u.tensor_type.rank != 2 or v.tensor_type.rank != 2:
            continue
        if a.tensor_type.rank != 2 or b.tensor_type.rank != 2 or a.tensor_type.shape[0] != b.tensor_type.shape[0]:
            continue
        if op.result.type != prods[0].result.type or op.result.type != prods[1].result.type:
            continue
        if len({o.attrs.get("device") for o in (op, *prods)}) != 1:
            continue  # pinned to different devices
        with rw.made_from(op):
            w = rw.value("concat", [u, v], before=scan, attrs={"axis": 0})
            x = rw.value("concat", [a, b], before=op, attrs={"axis": 1})
            rw.replace_op(op, [rw.value("matmul", [x, w], before=op)])
        for p in prods:
            rw.erase(p)
        stats.count("scan-grad: sums of products merged")


# ---------------------------------------------------------------------------------------------
# 3. Accumulation push-out


@dataclass
class _Stacked:
    """How to get the (T, ...) stack of a per-step value after the loop."""

    whole: Value | None = None
    """An existing or new stack, step t at index t."""
    shifted_init: Value | None = None
    shifted_next: Value | None = None
    """Or: step t is `shifted_init` for t = 0 and shifted_next[t-1] after (h_{t-1} from h_t)."""
    extra_bytes: int = 0


def _forward_shift(stack: Value) -> tuple[Value, Value] | None:
    """If `stack` is a forward scan's stack of a carry's input, (init, stack of its output)."""
    op = stack.defining_op
    if op is None or op.name != "scan" or op.attrs["reverse"]:
        return None
    parts = scan_parts(op)
    s = next((s for s in parts.stacks if s.result is stack), None)
    if s is None:
        return None
    carry = next((c for c in parts.carries if c.arg is s.yielded), None)
    if carry is None:
        return None
    out = next((t.result for t in parts.stacks if t.yielded is carry.yielded), None)
    if out is None:
        return None
    return carry.init, out


def _stack_of(scan: Operation, v: Value) -> _Stacked | None:
    """Plans the stack of per-step value v of scan (a sequence element needs none)."""
    body = scan.body
    owner = v.defining_op
    if owner is None and v.defining_block is not body:
        return None  # loop-invariant: not an accumulation of per-step products
    seq = _is_seq_arg(scan, v)
    if seq is not None:
        shift = _forward_shift(seq.outer)
        if shift is not None:
            return _Stacked(shifted_init=shift[0], shifted_next=shift[1])
        return _Stacked(whole=seq.outer)
    if owner is not None and owner.parent is not body:
        return None
    existing = next((st.result for st in scan_parts(scan).stacks if st.yielded is v), None)
    if existing is not None:
        return _Stacked(whole=existing)
    steps = LoopView(scan).trip_count
    nbytes = v.tensor_type.nbytes()
    if steps is None or nbytes is None:
        return None
    return _Stacked(extra_bytes=steps * nbytes)


def _product_operands(p: Operation) -> tuple[Value, bool, Value, bool]:
    """matmul(A, B) with A and B possibly `transpose` of 2-D values -> (a, a_is_T, b, b_is_T)."""
    out = []
    for v in p.operands:
        d = v.defining_op
        if d is not None and d.name == "transpose" and v.tensor_type.rank == 2 and len(v.uses) == 1:
            out += [d.operands[0], True]
        else:
            out += [v, False]
    return out[0], out[1], out[2], out[3]  # type: ignore[return-value]


@dataclass
class _Accumulation:
    """A carry `acc + A_t @ B_t` accepted for push-out, with how to stack A and B."""

    carry: Carry
    update: Operation
    """The `add` giving the carry's next value."""
    product: Operation
    """The `matmul` added to the carry."""
    a: Value
    a_t: bool
    sa: _Stacked
    b: Value
    b_t: bool
    sb: _Stacked


def push_out_accumulations(rw: Rewriter, scan: Operation, options: ScanGradOptions,
                           stats: PassStatistics) -> None:
    """Rewrite 3 (module docstring): every accepted `acc + A_t @ B_t` carry passes through the
    loop unchanged, and its result becomes `acc_0 + one GEMM over the stacks` after the loop."""
    rw.current = "push-out-accumulation"
    found: list[_Accumulation] = []
    steps = LoopView(scan).trip_count
    for c in scan_parts(scan).carries:
        acc = _plan_accumulation(scan, c, steps, options, stats)
        if acc is None:
            continue
        # The carry now passes through unchanged; canonicalize drops it. Erased at once, not
        # after the loop: the next carry's checks count uses, and this product is gone.
        rw.replace_all_uses(c.yielded, c.arg)
        rw.erase(acc.update)
        rw.erase(acc.product)
        found.append(acc)
    if not found:
        return
    new_stacks = _append_new_stacks(scan, found)
    _add_post_loop_gemms(rw, scan, steps, found, new_stacks, stats)


def _accumulated_product(scan: Operation, c: Carry) -> tuple[Operation, Operation] | None:
    """(update, product) if carry c's next value is `c + product` with product a `matmul`
    of the loop body, else None: c is no push-out candidate."""
    update = c.yielded.defining_op
    if update is None or update.name != "add" or update.parent is not scan.body or c.arg not in update.operands:
        return None  # not an accumulation `acc + ...`
    other = update.operands[1] if update.operands[0] is c.arg else update.operands[0]
    prod = other.defining_op
    if prod is None or prod.name != "matmul":
        return None  # an accumulation of something other than a product
    return update, prod


def _rejection(c: Carry, update: Operation, prod: Operation, steps: int | None) -> str | None:
    """Why the accumulation of prod into carry c cannot be pushed out, whatever its operands
    are, or None if it can."""
    if steps is None or steps == 0:
        return "loop length unknown until run time" if steps is None else "loop of zero steps"
    if list(c.arg.users) != [update]:
        return "accumulator read elsewhere in the loop"
    if len(c.yielded.uses) != 1:
        return "accumulator value also stacked or used in the loop"
    if len(prod.result.uses) != 1 or prod.result.type != c.arg.type:
        return "product also used elsewhere, or broadcast into the accumulator"
    if prod.operands[0].tensor_type.rank != 2 or prod.operands[1].tensor_type.rank != 2 \
            or not prod.operands[0].tensor_type.is_static or not prod.operands[1].tensor_type.is_static:
        return "operands not static 2-D matrices"
    return None


def _reject(stats: PassStatistics, reason: str) -> None:
    """Counts a candidate left alone, by reason: the report accounts for every candidate."""
    stats.count(f"scan-grad: rejected ({reason})")


def _plan_accumulation(scan: Operation, c: Carry, steps: int | None, options: ScanGradOptions,
                       stats: PassStatistics) -> _Accumulation | None:
    """Carry c as an accumulation to push out, with its operands' stacks planned; None if c is
    no candidate, or a rejected one (counted)."""
    matched = _accumulated_product(scan, c)
    if matched is None:
        return None
    update, prod = matched
    reason = _rejection(c, update, prod, steps)
    if reason is not None:
        _reject(stats, reason)
        return None
    a, a_t, b, b_t = _product_operands(prod)
    sa, sb = _stack_of(scan, a), _stack_of(scan, b)
    if sa is None or sb is None:
        _reject(stats, "operand not a per-step value of the loop")
        return None
    if sa.shifted_init is not None and sb.shifted_init is not None:
        _reject(stats, "both operands are a carry's previous value")
        return None
    extra = sa.extra_bytes + sb.extra_bytes
    if extra > options.max_extra_bytes:
        _reject(stats, "max-extra-bytes")
        stats.notes.append(f"push-out of %{c.arg.name_hint} at {scan.loc} needs {extra} new bytes of stacks, "
                           f"more than max-extra-bytes={options.max_extra_bytes}")
        return None
    return _Accumulation(c, update, prod, a, a_t, sa, b, b_t, sb)


def _append_new_stacks(scan: Operation, found: list[_Accumulation]) -> dict[Value, OpResult]:
    """Makes the scan stack every operand that has no stack yet (once per value, even when
    several accumulations read it); gives value -> its new stack."""
    new_stacks: dict[Value, OpResult] = {}
    for acc in found:
        for v, s in ((acc.a, acc.sa), (acc.b, acc.sb)):
            if s.whole is None and s.shifted_init is None and v not in new_stacks:
                new_stacks[v] = append_stack(scan, v)
    return new_stacks


def _add_post_loop_gemms(rw: Rewriter, scan: Operation, steps: int | None, found: list[_Accumulation],
                         new_stacks: dict[Value, OpResult], stats: PassStatistics) -> None:
    """Right after the loop, replaces each pushed-out carry's result by `acc_0 + GEMM`."""
    after = scan.next
    assert after is not None  # a scan is never a block's terminator
    for acc in found:
        c = acc.carry
        # The GEMM goes after the loop, next to an unrelated op: it is made from the update.
        with rw.made_from(acc.update):
            total = _post_loop_gemm(rw, after, steps, acc.a, acc.a_t, acc.sa, acc.b, acc.b_t, acc.sb, new_stacks)
            final = rw.value("add", [c.init, total], before=after)
        assert c.result is not None  # carries read from a scan op always have a result
        rw.replace_all_uses(c.result, final)
        stats.count("scan-grad: accumulations pushed out")


def _flat(rw: Rewriter, stack: Value, before: Operation, transposed: bool) -> Value:
    """(T, r, c) -> (T*r, c) rows; for an operand used transposed the rows are the K axis."""
    t = stack.tensor_type
    steps, r, c = t.shape
    if transposed:  # A_t = X_t^T with X_t (K, M): sum_t X_t^T B_t = X_cat^T B_cat
        flat = rw.value("reshape", [stack], before=before, attrs={"shape": [steps * r, c]})  # type: ignore[operator]
        return rw.value("transpose", [flat], before=before, attrs={"perm": [1, 0]})
    # A_t (M, K) untransposed: concat over t on the K axis
    moved = rw.value("transpose", [stack], before=before, attrs={"perm": [1, 0, 2]})
    return rw.value("reshape", [moved], before=before, attrs={"shape": [r, steps * c]})  # type: ignore[operator]


def _rows(rw: Rewriter, stack: Value, before: Operation, transposed: bool) -> Value:
    """B side: B_t (K, N) concatenated over t on the K axis -> (T*K, N)."""
    t = stack.tensor_type
    steps, r, c = t.shape
    if transposed:  # B_t = Y_t^T with Y_t (N, K)
        moved = rw.value("transpose", [stack], before=before, attrs={"perm": [0, 2, 1]})
        return rw.value("reshape", [moved], before=before, attrs={"shape": [steps * c, r]})  # type: ignore[operator]
    return rw.value("reshape", [stack], before=before, attrs={"shape": [steps * r, c]})  # type: ignore[operator]


def _slice0(rw: Rewriter, v: Value, start: int, stop: int, before: Operation) -> Value:
    shape = v.tensor_type.shape
    return rw.value("slice", [v], before=before,
                    attrs={"starts": [start] + [0] * (len(shape) - 1), "limits": [stop] + list(shape[1:])})


def _post_loop_gemm(rw: Rewriter, before: Operation, steps: int | None, a: Value, a_t: bool, sa: _Stacked,
                    b: Value, b_t: bool, sb: _Stacked, new: dict[Value, OpResult]) -> Value:
    def whole(v: Value, s: _Stacked) -> Value:
        return s.whole if s.whole is not None else new[v]

    if sa.shifted_init is None and sb.shifted_init is None:
        return rw.value("matmul", [_flat(rw, whole(a, sa), before, a_t), _rows(rw, whole(b, sb), before, b_t)],
                        before=before)
    # One side is h_{t-1}: step 0 uses h_0, steps 1.. use the output stack shifted by one.
    assert steps is not None
    if sa.shifted_init is not None:
        init, nxt = sa.shifted_init, sa.shifted_next
        other = whole(b, sb)
        first = rw.value("matmul", [_t(rw, init, a_t, before), _t(rw, _index0(rw, other, before), b_t, before)],
                         before=before)
        if steps == 1:
            return first
        rest = rw.value("matmul", [_flat(rw, _slice0(rw, nxt, 0, steps - 1, before), before, a_t),  # type: ignore[arg-type]
                                   _rows(rw, _slice0(rw, other, 1, steps, before), before, b_t)], before=before)
    else:
        assert sb.shifted_init is not None and sb.shifted_next is not None  # one side is shifted
        init, nxt = sb.shifted_init, sb.shifted_next
        other = whole(a, sa)
        first = rw.value("matmul", [_t(rw, _index0(rw, other, before), a_t, before), _t(rw, init, b_t, before)],
                         before=before)
        if steps == 1:
            return first
        rest = rw.value("matmul", [_flat(rw, _slice0(rw, other, 1, steps, before), before, a_t),
                                   _rows(rw, _slice0(rw, nxt, 0, steps - 1, before), before, b_t)],
                        before=before)
    return rw.value("add", [first, rest], before=before)


def _t(rw: Rewriter, v: Value, transposed: bool, before: Operation) -> Value:
    return rw.value("transpose", [v], before=before, attrs={"perm": [1, 0]}) if transposed else v


def _index0(rw: Rewriter, stack: Value, before: Operation) -> Value:
    shape = stack.tensor_type.shape
    first = _slice0(rw, stack, 0, 1, before)
    return rw.value("reshape", [first], before=before, attrs={"shape": list(shape[1:])})


class ScanGrad(Pass):
    name = "scan-grad"
    Options = ScanGradOptions
    idempotent = True
    """A run leaves no projection to hoist, no products to merge and no accumulation to push out
    (tests/test_canonicalize_rounds.py runs it twice): the default pipeline's second run is
    skipped when nothing changed the IR since the first (no `grad` for autodiff to expand)."""

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        o: ScanGradOptions = self.options
        for scan in _scans(module):
            if o.hoist:
                scan = hoist_projections(rw, scan, stats)
            if o.push_out:
                push_out_accumulations(rw, scan, o, stats)
        if o.merge:
            for f in module.functions.values():
                merge_shared_operand(rw, f.body, None, stats)
            for scan in _scans(module):
                merge_shared_operand(rw, scan.body, scan, stats)
                if o.merge_sums:
                    merge_sums(rw, scan, stats)
        return rw.changed


