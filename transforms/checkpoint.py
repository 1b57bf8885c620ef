"""The `checkpoint` pass: two-level (√T) checkpointing of a forward scan and its backward scan.

Terms.
- *Pair*: a forward scan F and the backward scan B that autodiff built for it (docs/autodiff.md):
  in the same block, B after F, running the other way, the same static trip count T, and F's
  *residual stacks* (stacked results read by B's sequences and by nothing else) non-empty.
- *Segment* S: the steps recomputed together; N <= T // S segments cover the *main* steps
  [0, M), M = N·S; the *remainder* [M, T) runs un-checkpointed (its residuals kept): shorter
  than S where N = T // S (`segment=S`), longer where the budget leaves room for it.
- *Checkpoints*: the carries at the start of each segment, N rows per carry.

The rewrite (run after `autodiff`, before the second `scan-grad`):

    %cT, %r = scan (%x in %xs) carry (%c = %c0) { BODY; yield (%c2) stack (%res) }   // F
    %dc0    = scan reverse (%q in %r) carry (%d = %dT) { BBODY; yield (%d2) }          // B
 -> %cM, %ck = scan (%xk in reshape(slice(%xs, 0:M), NxS)) carry (%c = %c0) {
       %e = scan (%x in %xk) carry (%c' = %c) { BODY; yield (%c2) }                    // no residuals
       yield (%e) stack (%c)                                                           // checkpoints
    }
    %cT, %rr = scan (%x in slice(%xs, M:T)) carry (%c = %cM) { BODY; yield (%c2) stack (%res) }
    %dM = scan reverse (%q in %rr) carry (%d = %dT) { BBODY; yield (%d2) }             // remainder
    %dc0 = scan reverse (%k in %ck, %xk in ...) carry (%d = %dM) {
       %_, %rk = scan (%x in %xk) carry (%c' = %k) { BODY; yield (%c2) stack (%res) }  // recompute
       %d3 = scan reverse (%q in %rk) carry (%d' = %d) { BBODY; yield (%d2) }
       yield (%d3)
    }

Stacks of F that something else reads, and B's own stacks, are kept whole: the outer scans
stack them per segment and a reshape (plus a concat with the remainder's rows) gives them
their T rows back. Residual memory falls from T·r to max(S, R)·r + N·c (r: residual bytes per
step, c: carry bytes, R remainder steps: the backward loop holds the remainder's residuals, then
one segment's at a time); the price is one more forward pass over the M main steps (the
*recompute factor*, forward steps run / T, is 1 + M/T).

Why after autodiff: autodiff of a scan whose body is a scan stacks the inner residuals and
has the outer forward stack them again (docs/autodiff.md, "Through scan"): nesting the forward
before autodiff would save nothing. After autodiff, the pair names exactly what the backward
loop reads, so the rewrite needs no recompute marker and changes no VJP rule. Running before
the second `scan-grad` lets it push the weight-gradient accumulations of each recomputed
segment out of the inner backward loop: one GEMM per segment (docs/memplan.md).

Options: `segment=S` rewrites every pair whose trip count exceeds S; `budget=BYTES` ("256MB",
"1GB", or an integer) rewrites only when the function's planned peak (analysis/memory/) exceeds
it, pair by pair, largest residuals first, with the segment length and count chosen by planning
the rewritten function for candidate lengths around √T, each with as few segments as the
budget allows (the rest of T un-checkpointed): the choice that fits with the least
recomputation (in whole percents of T; ties: the longest segment), else the one with the
smallest peak.

Known gaps: pairs inside loop bodies are not rewritten (a nested scan inside F is recomputed
with F's body); a `?` trip count is left alone (gir.jit specialises shapes before the
pipeline runs, so compiled code has static trip counts; `gir opt` on a `?` program notes it);
two levels only (no binomial / revolve schedule); input projections hoisted out of F by the
first `scan-grad` stay T long (gir.jit's budgeted pipeline runs that `scan-grad` with
`hoist=false`, so the second one hoists them per segment instead).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dataclasses_replace
from typing import Any

from ..analysis.memory.aliases import OPS, VIEW_RULES, ViewRules
from ..analysis.memory.plan import nbytes_of
from ..analysis.memory.planner import plan_memory
from ..errors import GirArgumentError, GirPassError
from ..ir.core import Block, BlockArgument, Function, Module, Operation, Region, Value, erase_op
from ..ir.loops import LoopView
from ..ir.ops import make_op
from ..ir.spec import fails_at_run_time
from ..ir.types import TensorType
from ..passes.base import Pass
from ..passes.pipeline import parse_bytes
from ..passes.rewriter import PassStatistics, Rewriter
from .canonicalize import Canonicalize
from .fuse import Fuse
from .scan_grad import ScanGrad


@dataclass(frozen=True)
class CheckpointOptions:
    budget: str = ""
    """Bytes the function's planned peak must fit in ("256MB", "1GB", an integer); "": none."""
    segment: int = 0
    """Force this segment length on every pair longer than it (0: choose from `budget`)."""
    views: str = "ops"
    """The view rules of the plan the backend lays its memory out by, whose peak the budget
    bounds (analysis/memory/aliases.py; as `memplan{views=...}`): ops (the CPU's), strided
    (the GPU's: arena plus the loops' buffers outside it)."""

    def validate(self, pass_name: str) -> None:
        if self.views not in VIEW_RULES:
            raise GirPassError(f"pass '{pass_name}': views must be one of {', '.join(VIEW_RULES)}, not {self.views!r}")
        if self.segment < 0 or self.segment == 1:
            raise GirPassError(f"pass '{pass_name}': segment must be 0 (from the budget) or >= 2, got {self.segment}")
        try:
            parse_bytes(self.budget)
        except GirArgumentError as e:
            raise GirPassError(f"pass '{pass_name}': {e.message}") from None

    @property
    def budget_bytes(self) -> int | None:
        return parse_bytes(self.budget)


@dataclass(frozen=True)
class CheckpointDecision:
    """What the pass did to one pair (reporting.py prints these for --memplan-report)."""

    function: str
    trip_count: int
    segment: int
    """0: not rewritten (see `reason`)."""
    checkpoints: int
    """Segments N: rows kept per carry."""
    remainder: int
    peak_before: int | None = None
    """Planned peak bytes of the function before / after this rewrite (None: not planned)."""
    peak_after: int | None = None
    reason: str = ""

    @property
    def recompute_factor(self) -> float:
        """Forward steps run / forward steps: 1 + recomputed steps / T."""
        return 1.0 + self.checkpoints * self.segment / self.trip_count if self.segment else 1.0

    def describe(self) -> str:
        peak = ""
        if self.peak_before is not None:
            after = f"{self.peak_after}" if self.peak_after is not None else "?"
            peak = f", planned peak {self.peak_before} -> {after} bytes"
        if not self.segment:
            return f"@{self.function}: scan of {self.trip_count} steps not checkpointed: {self.reason}{peak}"
        return (f"@{self.function}: scan of {self.trip_count} steps: segment {self.segment}, "
                f"{self.checkpoints} checkpoints, remainder {self.remainder}, "
                f"recompute factor {self.recompute_factor:.3f}{peak}" + (f" ({self.reason})" if self.reason else ""))


@dataclass
class CheckpointReport:
    """Every decision of one run on one function."""

    decisions: list[CheckpointDecision] = field(default_factory=list)


def checkpoint_decisions(records: list[Any]) -> list[CheckpointDecision]:
    """The decisions of every `checkpoint` run among a pass manager report's records."""
    return [d for r in records for d in r.stats.decisions if isinstance(d, CheckpointDecision)]


# ---------------------------------------------------------------------------------------------
# Finding pairs


@dataclass
class Pair:
    forward: Operation
    backward: Operation
    residual: list[int]
    """Indices (among F's stacked results) of the stacks only B reads."""
    trip_count: int


def residual_bytes(pair: Pair) -> int:
    stacks = LoopView(pair.forward).stacked_results
    return sum(nbytes_of(stacks[i].tensor_type) for i in pair.residual)


def find_pairs(block: Block) -> tuple[list[Pair], list[str]]:
    """The pairs of block (top level only), and why other forward scans are not pairs."""
    pairs, skipped = [], []
    for op in block:
        if op.name != "scan":
            continue
        found = _pair_of(op)
        if isinstance(found, Pair):
            pairs.append(found)
        elif found:
            skipped.append(found)
    return pairs, skipped


def _pair_of(f: Operation) -> Pair | str | None:
    """F's pair, or why F has none (a string worth a note), or None (no backward scan reads it)."""
    view = LoopView(f)
    readers: set[Operation] = set()
    residual = []
    for i, r in enumerate(view.stacked_results):
        users = {u for u, _ in r.uses}
        if len(users) != 1:
            continue  # read by several ops, or by none (then canonicalize drops it): not a residual
        (b,) = users
        if b.name == "scan" and b.parent is f.parent and LoopView(b).reverse != view.reverse \
                and all(k < len(LoopView(b).sequences) for _, k in r.uses):
            readers.add(b)
            residual.append(i)
    if not readers:
        return None
    if len(readers) > 1:
        return "its residual stacks are read by several backward scans"
    (b,) = readers
    t = view.trip_count
    if t is None:
        return "its trip count is `?` (gir.jit specialises shapes first)"
    if LoopView(b).trip_count != t:
        return None
    return Pair(f, b, residual, t)


# ---------------------------------------------------------------------------------------------
# Building blocks


class _Builder:
    """Creates the ops of one rewrite before an anchor op."""

    def __init__(self, rw: Rewriter, anchor: Operation, made: dict[tuple, Value] | None = None):
        self.rw = rw
        self.anchor = anchor
        self.made: dict[tuple, Value] = made if made is not None else {}
        """(op name, operand, attributes) -> the value made: the forward's and the backward's
        segments of one sequence are one value (made before the forward, which dominates)."""

    def _value(self, name: str, v: Value, attrs: dict) -> Value:
        key = (name, v, repr(attrs))
        found = self.made.get(key)
        if found is None:
            found = self.made[key] = self.rw.value(name, [v], before=self.anchor, attrs=attrs)
        return found

    def rows(self, v: Value, lo: int, hi: int) -> Value:
        """v[lo:hi] on the leading axis (v itself when that is all of it)."""
        shape = v.tensor_type.shape
        if lo == 0 and hi == shape[0]:
            return v
        return self._value("slice", v, {"starts": [lo] + [0] * (len(shape) - 1), "limits": [hi, *shape[1:]]})

    def reshape(self, v: Value, shape: list[int | None]) -> Value:
        if list(v.tensor_type.shape) == shape:
            return v
        return self._value("reshape", v, {"shape": shape})

    def segments(self, v: Value, n: int, s: int) -> Value:
        """The first n·s rows of v as n segments of s rows: `reshape(slice(v, 0:n·s), [n, s, ...])`."""
        return self.reshape(self.rows(v, 0, n * s), [n, s, *v.tensor_type.shape[1:]])

    def unsegment(self, v: Value) -> Value:
        shape = v.tensor_type.shape
        n, s = shape[0], shape[1]
        assert n is not None and s is not None  # made by `segments`: n segments of s rows
        return self.reshape(v, [n * s, *shape[2:]])

    def join(self, main: Value | None, rest: Value | None) -> Value:
        """Main rows then remainder rows, on the leading axis."""
        if main is None or rest is None:
            out = main if main is not None else rest
            assert out is not None
            return out
        return self.rw.value("concat", [main, rest], before=self.anchor, attrs={"axis": 0})


def clone_scan(rw: Rewriter, scan: Operation, sequences: list[Value], inits: list[Value], stacks: list[int],
               where: Operation | Block, length: int) -> Operation:
    """A copy of scan over new sequences (`length` rows each) and initial carries, stacking
    only its stacked results `stacks` (indices), put before op `where` or at the end of block
    `where`."""
    view = LoopView(scan)
    mapping: dict[Value, Value] = {}
    body = scan.body.clone(mapping)
    term = body.terminator
    assert term is not None
    yielded = [mapping.get(v, v) for v in view.yielded_carries]
    kept = [mapping.get(view.yielded_stacks[i], view.yielded_stacks[i]) for i in stacks]
    body.append(make_op("yield", yielded + kept, loc=term.loc, segments=(len(yielded), len(kept))))
    erase_op(term)
    _drop_dead(body)
    attrs = {"reverse": view.reverse, "length": None if sequences else length}
    new = make_op("scan", sequences + inits, attrs=attrs, regions=[Region(body)], loc=scan.loc,
                  segments=(len(sequences), len(inits)))
    for old, r in zip(view.final_carries, new.results):
        r.name_hint = old.name_hint
    if isinstance(where, Block):
        where.append(new)
    else:
        where.parent.insert_before(where, new)  # type: ignore[union-attr]
    rw.adopt(new)
    return new


def _drop_dead(body: Block) -> None:
    """Erases pure ops whose results nothing reads: the arithmetic only the dropped residual
    stacks needed (canonicalize would too; this keeps the IR the pass prints to what runs)."""
    for op in reversed(body.ops):
        if op.spec.pure and not op.spec.terminator and not any(r.uses for r in op.results) \
                and not fails_at_run_time(op):
            erase_op(op)


def _new_loop(args: list[TensorType], names: list[str | None]) -> tuple[Block, list[BlockArgument]]:
    block = Block(args, names)
    return block, list(block.args)


# ---------------------------------------------------------------------------------------------
# The rewrite


def checkpoint_pair(rw: Rewriter, pair: Pair, segment: int, segments: int | None = None) -> None:
    """Rewrites pair into checkpointed form with `segments` segments of `segment` steps (all
    that fit when None), the remaining steps un-checkpointed (module docstring)."""
    f, b = pair.forward, pair.backward
    t, s = pair.trip_count, segment
    n = t // s if segments is None else segments
    m = n * s
    fv = LoopView(f)
    assert 2 <= s < t and 1 <= n <= t // s
    build = _Builder(rw, f)
    f_seqs = list(fv.sequences)
    n_stacks = len(fv.stacked_results)
    kept = [i for i in range(n_stacks) if i not in pair.residual]

    def forward_main(inits: list[Value]) -> Operation:
        return _outer_forward(rw, f, build, f_seqs, inits, kept, n, s)

    def forward_rest(inits: list[Value]) -> Operation:
        return clone_scan(rw, f, [build.rows(x, m, t) for x in f_seqs], inits, list(range(n_stacks)), f, t - m)

    outer_f, rest_f, inits = _chain(forward_main, forward_rest, fv.reverse, list(fv.inits), with_rest=m != t)
    n_carries = len(fv.inits)
    outer_stacks = LoopView(outer_f).stacked_results  # the checkpoints, then the kept stacks
    checkpoints, main_stacks = outer_stacks[:n_carries], outer_stacks[n_carries:]
    kept_stacks = [(fv.stacked_results[i], j, i) for j, i in enumerate(kept)]
    _replace_results(rw, build, fv, inits, main_stacks, rest_f, kept_stacks)
    _rewrite_backward(rw, pair, s, n, checkpoints, rest_f, build.made)
    rw.erase(b)
    rw.erase(f)


def _chain(main: Callable[[list[Value]], Operation], rest: Callable[[list[Value]], Operation], reverse: bool,
           inits: list[Value], with_rest: bool) -> tuple[Operation, Operation | None, list[Value]]:
    """The segment loop and the remainder loop (when with_rest) built in the order the scan runs
    (the remainder first for a reverse scan), each starting from the carries the other ended
    with: (the segment loop, the remainder loop or None, the final carries)."""
    made: dict[Callable[[list[Value]], Operation], Operation] = {}
    for make in ((main, rest) if not reverse else (rest, main)):
        if make is rest and not with_rest:
            continue
        made[make] = op = make(inits)
        inits = list(LoopView(op).final_carries)
    return made[main], made.get(rest), inits


def _replace_results(rw: Rewriter, build: _Builder, old: LoopView, finals: list[Value], main_stacks: Sequence[Value],
                     rest_op: Operation | None, stacks: Sequence[tuple[Value, int, int]]) -> None:
    """The old loop's results replaced: its final carries by finals; each (old stack, its index
    among main_stacks, its index among the remainder loop's stacks) by the segments' rows
    unsegmented, joined to the remainder's."""
    for o, new in zip(old.final_carries, finals):
        rw.replace_all_uses(o, new)
    rest_stacks = LoopView(rest_op).stacked_results if rest_op is not None else None
    for stacked, j, i in stacks:
        rest = rest_stacks[i] if rest_stacks is not None else None
        rw.replace_all_uses(stacked, build.join(build.unsegment(main_stacks[j]), rest))


def _outer_forward(rw: Rewriter, f: Operation, build: _Builder, f_seqs: list[Value], inits: list[Value],
                   kept: list[int], n: int, s: int) -> Operation:
    """scan over n segments: the forward steps of each (stacking only `kept`), the carries at
    each segment's start stacked as checkpoints."""
    fv = LoopView(f)
    segs = [build.segments(x, n, s) for x in f_seqs]
    seg_types = [x.tensor_type.with_shape(x.tensor_type.shape[1:]) for x in segs]
    no_names: list[str | None] = [None] * len(segs)
    body, args = _new_loop(seg_types + [v.tensor_type for v in inits], no_names + [a.name_hint for a in fv.carry_args])
    seq_args, carry_args = args[: len(segs)], args[len(segs):]
    inner = LoopView(clone_scan(rw, f, list(seq_args), list(carry_args), kept, body, s))
    finals = inner.final_carries
    stacks: list[Value] = [*carry_args, *inner.stacked_results]
    body.append(make_op("yield", list(finals) + stacks, loc=f.loc, segments=(len(finals), len(stacks))))
    outer = make_op("scan", segs + inits, attrs={"reverse": fv.reverse, "length": None if segs else n},
                    regions=[Region(body)], loc=f.loc, segments=(len(segs), len(inits)))
    f.parent.insert_before(f, outer)  # type: ignore[union-attr]
    rw.adopt(outer)
    return outer


def _rewrite_backward(rw: Rewriter, pair: Pair, s: int, n: int, checkpoints: Sequence[Value],
                      rest_f: Operation | None, made: dict[tuple, Value]) -> None:
    f, b = pair.forward, pair.backward
    fv, bv = LoopView(f), LoopView(b)
    t, m = pair.trip_count, n * s
    build = _Builder(rw, b, made)
    stack_index: dict[Value, int] = {r: i for i, r in enumerate(fv.stacked_results)}
    residual = set(pair.residual)
    b_seqs = list(bv.sequences)

    def backward_rest(inits: list[Value]) -> Operation:
        assert rest_f is not None
        rest_stacks = LoopView(rest_f).stacked_results
        seqs = [rest_stacks[stack_index[x]] if stack_index.get(x) in residual else build.rows(x, m, t) for x in b_seqs]
        return clone_scan(rw, b, seqs, inits, list(range(len(bv.stacked_results))), b, t - m)

    def backward_main(inits: list[Value]) -> Operation:
        return _outer_backward(rw, pair, build, checkpoints, inits, n, s)

    outer_b, rest_b, inits = _chain(backward_main, backward_rest, bv.reverse, list(bv.inits),
                                    with_rest=rest_f is not None)
    _replace_results(rw, build, bv, inits, LoopView(outer_b).stacked_results, rest_b,
                     [(old, i, i) for i, old in enumerate(bv.stacked_results)])


def _outer_backward(rw: Rewriter, pair: Pair, build: _Builder, checkpoints: Sequence[Value], inits: list[Value],
                    n: int, s: int) -> Operation:
    """scan over the n segments, the other way: recompute a segment's forward from its
    checkpoint (stacking the residuals), then run the backward steps over them."""
    f, b = pair.forward, pair.backward
    fv, bv = LoopView(f), LoopView(b)
    stack_index: dict[Value, int] = {r: i for i, r in enumerate(fv.stacked_results)}
    residual = set(pair.residual)
    f_seqs = list(fv.sequences)
    f_segs = [build.segments(x, n, s) for x in f_seqs]
    # B's other sequences, less those F also reads (xs, read by both: one outer sequence)
    generic = list(dict.fromkeys(x for x in bv.sequences if stack_index.get(x) not in residual and x not in f_seqs))
    g_segs = [build.segments(x, n, s) for x in generic]
    outer_seqs = list(checkpoints) + f_segs + g_segs
    types = [x.tensor_type.with_shape(x.tensor_type.shape[1:]) for x in outer_seqs]
    body, args = _new_loop(types + [v.tensor_type for v in inits],
                           [c.name_hint for c in fv.carry_args] + [None] * (len(f_segs) + len(g_segs))
                           + [a.name_hint for a in bv.carry_args])
    k = len(checkpoints)
    ck_args, f_args = args[:k], args[k: k + len(f_segs)]
    g_args = args[k + len(f_segs): len(outer_seqs)]
    carry_args = args[len(outer_seqs):]
    recompute = clone_scan(rw, f, list(f_args), list(ck_args), pair.residual, body, s)
    recomputed = dict(zip(pair.residual, LoopView(recompute).stacked_results))
    g_map = dict(zip(generic, g_args)) | dict(zip(f_seqs, f_args))
    seqs: list[Value] = [recomputed[stack_index[x]] if stack_index.get(x) in residual else g_map[x]
                         for x in bv.sequences]
    inner = clone_scan(rw, b, seqs, list(carry_args), list(range(len(bv.stacked_results))), body, s)
    inner_view = LoopView(inner)
    finals, stacks = list(inner_view.final_carries), list(inner_view.stacked_results)
    body.append(make_op("yield", finals + stacks, loc=b.loc, segments=(len(finals), len(stacks))))
    outer = make_op("scan", outer_seqs + inits, attrs={"reverse": bv.reverse, "length": None if outer_seqs else n},
                    regions=[Region(body)], loc=b.loc, segments=(len(outer_seqs), len(inits)))
    b.parent.insert_before(b, outer)  # type: ignore[union-attr]
    rw.adopt(outer)
    return outer


# ---------------------------------------------------------------------------------------------
# Choosing the segment from the memory plan


def planned_peak(function: Function, views: ViewRules = OPS) -> int | None:
    """The memory plan's peak bytes of function under the backend's view rules (None: not
    plannable, e.g. `?` dims): the arena, and with the GPU's rules (`strided`) also the loops'
    buffers outside it (`MemoryPlan.peak_bytes`), which grow with the trip count as the arena
    does (a shifted carry's stack of T + 1 rows)."""
    plan = plan_memory(function, views=views)
    return plan.peak_bytes if plan.supported else None


def candidate_segments(t: int) -> list[int]:
    """Segment lengths worth planning for a trip count t: around √t (the two-level optimum
    when carries and residuals per step weigh alike) and long segments (less recomputation)."""
    r = max(2, math.isqrt(t))
    found = {r // 4, r // 2, r, r + 1, 2 * r, 4 * r, 8 * r} | {-(-t // k) for k in (2, 3, 4, 8)}
    return sorted(s for s in found if 2 <= s < t)


def projected_peak(function: Function, position: int | None = None, segment: int = 0,
                   segments: int | None = None, views: ViewRules = OPS) -> int | None:
    """The planned peak of a copy of function after what the budgeted pipeline runs next
    (canonicalize, scan-grad, canonicalize: scan-grad's push-out drops stacks, so planning
    the IR as it is now would overstate both peaks), with the pair whose forward scan is the
    op at `position` checkpointed with `segments` segments of `segment` steps first, if given."""
    copy = function.clone()
    module = Module([copy])
    if position is not None:
        pair = _pair_of(copy.body.ops[position])
        assert isinstance(pair, Pair)
        checkpoint_pair(Rewriter(), pair, segment, segments)
    passes = [Canonicalize(), ScanGrad(), Canonicalize()]
    if views.any:  # strided views and loop buffers are decided on fused IR (kernels' readers)
        passes.append(Fuse())
    for p in passes:
        p.run(module, PassStatistics())
    return planned_peak(copy, views)


@dataclass(frozen=True)
class Choice:
    """A checkpointing of one pair: `segments` segments of `segment` steps, the rest of the
    trip count un-checkpointed; its planned peak and whether that fits the budget."""

    segment: int
    segments: int
    peak: int | None
    fits: bool


def choose_segment(function: Function, pair: Pair, budget: int, views: ViewRules = OPS) -> Choice:
    """For each candidate length S, first with every segment that fits in T (N = T // S, a
    remainder shorter than S), then, where that plan fits the budget, with fewer segments: the
    steps left out run un-checkpointed, their residuals kept, so the budget's slack decides how
    many (`_fewer_segments`). Of the choices that fit, the one recomputing the fewest steps
    (N·S in whole percents of T: S = 101 recomputing 9,999 steps of 10,000 is no better than
    S = 200 recomputing all of them), then the longest segment (fewer outer steps, larger
    per-segment GEMMs); else the one with the smallest peak."""
    position = function.body.ops.index(pair.forward)
    t = pair.trip_count
    per_step = max(1, residual_bytes(pair) // t)
    fitting: list[Choice] = []
    tried: list[Choice] = []
    for s in candidate_segments(t):
        peak = projected_peak(function, position, s, t // s, views)
        if peak is None:
            continue
        if peak > budget:
            tried.append(Choice(s, t // s, peak, False))
            continue
        fitting.append(_fewer_segments(function, position, Choice(s, t // s, peak, True), budget, per_step, t,
                                       views))
    if fitting:
        return min(fitting, key=lambda c: (round(100 * c.segments * c.segment / t), -c.segment))
    if not tried:
        return Choice(0, 0, None, False)
    return min(tried, key=lambda c: (c.peak or 0, -c.segment))


def _fewer_segments(function: Function, position: int, full: Choice, budget: int, per_step: int, t: int,
                    views: ViewRules = OPS) -> Choice:
    """The fewest segments of full.segment steps whose plan still fits, given that full (all
    segments) fits: while the backward loop runs the un-checkpointed rest, its residuals
    (per_step bytes a step) are live instead of one segment's, so the slack beside full's peak
    holds that many more steps. That guess is planned; where it does not fit, the count halves
    its distance to full's (three plans at most)."""
    s = full.segment
    rest = s + (budget - (full.peak or 0)) // per_step
    guess = max(1, -(-(t - rest) // s))
    for _ in range(3):
        if guess >= full.segments:
            break
        peak = projected_peak(function, position, s, guess, views)
        if peak is not None and peak <= budget:
            return Choice(s, guess, peak, True)
        guess = -(-(guess + full.segments) // 2)
    return full


# ---------------------------------------------------------------------------------------------
# The pass


class Checkpoint(Pass):
    """`checkpoint{segment=S}` / `checkpoint{budget=1GB}`: two-level checkpointing of the
    forward/backward scan pairs autodiff made (module docstring). Without options it changes
    nothing. Each decision is a note (`--timing`) and a `CheckpointDecision` in the pass's
    statistics (`gir opt --memplan-report`, `fn.stats.compile.checkpoints`).

        %cT, %r = scan (%x in %xs) ... stack (%res)     ->  segments of S steps: carries kept
        %d = scan reverse (%q in %r) ...                     every S steps, residuals recomputed
    """

    name = "checkpoint"
    Options = CheckpointOptions

    def run(self, module: Module, stats: PassStatistics) -> bool:
        o: CheckpointOptions = self.options
        if not o.segment and o.budget_bytes is None:
            return False
        rw = Rewriter(stats)
        rw.current = "checkpoint"
        for f in module.functions.values():
            report = CheckpointReport()
            self._function(rw, f, report, stats)
            for d in report.decisions:
                stats.notes.append(d.describe())
                stats.decisions.append(d)
                if d.segment:
                    stats.count(f"@{f.name}: scans checkpointed")
        return rw.changed

    def _function(self, rw: Rewriter, f: Function, report: CheckpointReport, stats: PassStatistics) -> None:
        o: CheckpointOptions = self.options
        views = VIEW_RULES[o.views]
        pairs, skipped = find_pairs(f.body)
        for why in skipped:
            stats.notes.append(f"@{f.name}: a scan not checkpointed: {why}")
        if o.segment:
            before = projected_peak(f, views=views) if pairs else None
            for pair in pairs:
                after = None
                if before is not None and 2 <= o.segment < pair.trip_count:
                    after = projected_peak(f, f.body.ops.index(pair.forward), o.segment, views=views)
                report.decisions.append(self._apply(rw, f, pair, o.segment, before, after))
                before = after
            return
        budget = o.budget_bytes
        assert budget is not None
        peak = projected_peak(f, views=views) if pairs else None
        for pair in sorted(pairs, key=residual_bytes, reverse=True):
            if peak is None or peak <= budget:
                break
            choice = choose_segment(f, pair, budget, views)
            after = choice.peak
            if not choice.fits and (after is None or after >= peak):  # recomputing would cost time for nothing
                report.decisions.append(CheckpointDecision(
                    f.name, pair.trip_count, 0, 0, 0, peak, peak,
                    reason="no segment length lowers the planned peak"))
                continue
            decision = self._apply(rw, f, pair, choice.segment, peak, after, choice.segments)
            if not choice.fits:
                decision = dataclasses_replace(decision, reason="the budget is not met even so")
            report.decisions.append(decision)
            peak = after

    @staticmethod
    def _apply(rw: Rewriter, f: Function, pair: Pair, segment: int, before: int | None,
               after: int | None, segments: int | None = None) -> CheckpointDecision:
        t = pair.trip_count
        if segment < 2 or segment >= t:
            return CheckpointDecision(f.name, t, 0, 0, 0, before, before,
                                      reason=f"{t} steps, not more than one segment of {segment}")
        n = t // segment if segments is None else segments
        checkpoint_pair(rw, pair, segment, n)
        return CheckpointDecision(f.name, t, segment, n, t - n * segment, before, after)
