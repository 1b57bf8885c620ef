"""The generator's layout, cast, gather/scatter and call steps (a mixin of programs._Gen).

Which op kinds exist, their attribute names, which operand takes integers and which have a
gradient come from the op registry (ir/spec.py, filled by ir/ops.py): a step is offered for
every registry kind of category `layout` (that the surface can write) with a builder below,
in `grad` programs only for kinds with a VJP; `cast` is the registry's `written_type`
elementwise kind. `tests/test_fuzz_campaigns.py` checks that every surface layout kind of the
registry has a builder here, so a new layout op is not silently left out of the campaign.

Every builder returns `(expression, shape)` or None where it does not apply. Indices are in
range by construction: a gather reads `%ids` (values in [0, H)) from a value of leading dim H,
a scalar index is a literal below the leading dim. Programs with `?` dims keep the invariant
of programs.py (a dim's size tells whether it is `?`): a step that makes new dims is taken
only where neither its operand nor its result has a dim of a `?` size; but a `reshape` of a
value with one `?` axis keeps that axis as `-1` and rearranges the static ones around it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import gir  # noqa: F401  (fills the registry)
from gir.ir.spec import REGISTRY, OpSpec

if TYPE_CHECKING:
    import random

Shape = tuple[int, ...]

NOT_GENERATED = {"transfer": "inserted by the place pass; not written in programs"}
"""Registry layout kinds the generator leaves out, and why."""


def layout_kinds(grad: bool) -> list[str]:
    """The registry's layout kinds a program may use (with a VJP in a differentiated one)."""
    return [n for n, s in REGISTRY.items() if s.category == "layout" and n not in NOT_GENERATED
            and (s.vjp is not None or not grad)]


def cast_kind() -> str:
    """The elementwise kind whose result dtype is written (`cast`)."""
    return next(n for n, s in REGISTRY.items() if s.category == "elementwise" and s.written_type)


def _kw(spec: OpSpec, attr: str, value: object) -> str:
    assert attr in spec.attrs, (spec.name, attr)  # the registry is the source of attribute names
    text = str(value).replace("(", "[").replace(")", "]").replace(",]", "]")
    return f"{attr}={text}"


class LayoutSteps:
    """Needs from the host: rng, side (a second random stream), is_float, dtype, smooth, grad, h,
    ids (Val | None), unknown (set of `?` sizes), lit(), unary(), fresh(), emit()."""

    rng: random.Random

    # -- entry points ------------------------------------------------------------------------
    def layout_step(self, pool: list, a) -> tuple[str, Shape] | None:
        kinds = layout_kinds(self.grad) + [cast_kind()]
        self.rng.shuffle(kinds)
        for kind in kinds[:3]:
            got = getattr(self, "_" + kind)(pool, a)
            if got is not None and self._shape_ok(a.shape, got[1], kind):
                return got
        return None

    def same_shape(self, v) -> str:
        """An expression of v's shape and dtype computed from v by layout ops (a loop carry's
        producer): a slice/concat round trip, a reshape round trip, a transpose pair, a
        scatter_add of gathered rows, or a cast round trip."""
        r, s = self.rng, v.shape
        forms = [self._cast_round_trip(v.name)]
        if s and not any(d in self.unknown for d in s):  # a slice cannot keep a `?` axis whole
            forms.append(f"reshape(reshape({v.name}, shape=[{math.prod(s)}]), shape={list(s)})")
            axis = r.randrange(len(s))
            k = r.randint(0, s[axis])
            lo = [0] * len(s)
            hi = list(s)
            mid_hi, mid_lo = hi.copy(), lo.copy()
            mid_hi[axis], mid_lo[axis] = k, k
            forms.append(f"concat(slice({v.name}, starts={lo}, limits={mid_hi}), "
                         f"slice({v.name}, starts={mid_lo}, limits={hi}), axis={axis - len(s) * r.randint(0, 1)})")
        if len(s) >= 2:
            perm = list(range(len(s)))
            r.shuffle(perm)
            inverse = [perm.index(i) for i in range(len(s))]
            forms.append(f"transpose(transpose({v.name}, perm={perm}), perm={inverse})")
        if s and s[0] == self.h and self.ids is not None:
            forms.append(f"scatter_add({v.name}, {self.ids.name}, index({self.unary(v)}, {self.ids.name}))")
        return r.choice(forms)

    def _shape_ok(self, before: Shape, after: Shape, kind: str) -> bool:
        if not self.unknown or kind in ("transpose", "scatter_add", cast_kind()):
            return True
        if kind == "index" and len(after) < len(before):  # a row: no new dim
            return True
        if kind == "reshape":  # a `?` axis is only ever written -1 (_reshape_unknown): kept, not made
            return sum(d in self.unknown for d in before) == sum(d in self.unknown for d in after)
        return not any(d in self.unknown for d in before + after)

    # -- one builder per registry kind ---------------------------------------------------------
    def _transpose(self, pool: list, a) -> tuple[str, Shape] | None:
        rank = len(a.shape)
        if rank < 2:
            return None
        if rank == 2 and self.rng.random() < 0.5:
            return f"transpose({a.name})", a.shape[::-1]
        perm = list(range(rank))
        self.rng.shuffle(perm)
        return f"transpose({a.name}, {_kw(REGISTRY['transpose'], 'perm', perm)})", tuple(a.shape[p] for p in perm)

    def _reshape(self, pool: list, a) -> tuple[str, Shape] | None:
        r, s = self.rng, a.shape
        size = math.prod(s)
        options: list[list[int]] = [[size], [1, *s], [*s, 1]]
        if len(s) >= 2:
            i = r.randrange(len(s) - 1)
            options.append([*s[:i], s[i] * s[i + 1], *s[i + 2:]])
        for i, d in enumerate(s):
            for f in (2, 3):
                if d and d % f == 0:
                    options.append([*s[:i], f, d // f, *s[i + 1:]])
        new = r.choice(options)
        written = list(new)
        if size and r.random() < 0.5:
            written[r.randrange(len(written))] = -1
        if any(d in self.unknown for d in s):  # (rng's draws above kept: a seed's other programs stay)
            return self._reshape_unknown(a)
        return f"reshape({a.name}, {_kw(REGISTRY['reshape'], 'shape', written)})", tuple(new)

    def _reshape_unknown(self, a) -> tuple[str, Shape] | None:
        """A reshape of a value with one `?` axis: that axis written `-1` (so the result's dim
        there is `?`, the operand's size), the static axes merged, split, or given a unit axis
        around it. None where the static dims hold a 0 (`-1` would be ambiguous), where two axes
        are `?`, or where a new static dim has a `?` size (its type would not tell)."""
        r, s = self.side, a.shape  # type: ignore[attr-defined]
        unknown_axes = [i for i, d in enumerate(s) if d in self.unknown]
        if len(unknown_axes) != 1 or any(d == 0 for i, d in enumerate(s) if i != unknown_axes[0]):
            return None
        j = unknown_axes[0]
        marked: list[int | None] = [None if i == j else d for i, d in enumerate(s)]  # None: the `?` axis
        options = [marked[:i] + [1] + marked[i:] for i in range(len(s) + 1)]
        for i in range(len(s) - 1):
            if i != j and i + 1 != j:
                options.append(marked[:i] + [s[i] * s[i + 1]] + marked[i + 2:])
        for i, d in enumerate(marked):
            if d is not None and d > 1:
                options += [marked[:i] + [f, d // f] + marked[i + 1:] for f in (2, 3) if d % f == 0]
            if d == 1:
                options.append(marked[:i] + marked[i + 1:])
        options = [o for o in options if not any(d in self.unknown for d in o if d is not None)]
        if not options:
            return None
        new = r.choice(options)
        written = [-1 if d is None else d for d in new]
        return f"reshape({a.name}, {_kw(REGISTRY['reshape'], 'shape', written)})", \
            tuple(s[j] if d is None else d for d in new)

    def _slice(self, pool: list, a) -> tuple[str, Shape] | None:
        r, s = self.rng, a.shape
        if not s:
            return None
        starts, limits, steps = [], [], []
        for d in s:
            lo = r.randint(0, d)
            hi = r.randint(lo, d)
            starts.append(lo)
            limits.append(hi)
            steps.append(r.choice([1, 1, 2, 3]))
        spec = REGISTRY["slice"]
        kws = [_kw(spec, "starts", starts), _kw(spec, "limits", limits)]
        if any(st != 1 for st in steps) or r.random() < 0.2:
            kws.append(_kw(spec, "steps", steps))
        else:
            steps = [1] * len(s)
        shape = tuple(len(range(lo, hi, st)) for lo, hi, st in zip(starts, limits, steps))
        return f"slice({a.name}, {', '.join(kws)})", shape

    def _concat(self, pool: list, a) -> tuple[str, Shape] | None:
        r, s = self.rng, a.shape
        if not s:
            return None
        axis = r.randrange(len(s))
        fits = [v for v in pool if len(v.shape) == len(s)
                and all(x == y for i, (x, y) in enumerate(zip(v.shape, s)) if i != axis)
                and not any(d in self.unknown for d in v.shape)]
        if not fits:
            return None
        parts = [a] + [r.choice(fits) for _ in range(r.randint(1, 2))]
        names = [p.name if r.random() < 0.7 else f"{self.unary(p)}" for p in parts]
        shape = tuple(sum(p.shape[axis] for p in parts) if i == axis else d for i, d in enumerate(s))
        written = axis - len(s) if r.random() < 0.3 else axis
        return f"concat({', '.join(names)}, {_kw(REGISTRY['concat'], 'axis', written)})", shape

    def _stack(self, pool: list, a) -> tuple[str, Shape] | None:
        r = self.rng
        same = [v for v in pool if v.shape == a.shape]
        parts = [a] + [r.choice(same) for _ in range(r.randint(1, 2))]
        axis = r.randint(0, len(a.shape))
        shape = a.shape[:axis] + (len(parts),) + a.shape[axis:]
        return f"stack({', '.join(p.name for p in parts)}, {_kw(REGISTRY['stack'], 'axis', axis)})", shape

    def _broadcast(self, pool: list, a) -> tuple[str, Shape] | None:
        r = self.rng
        shape = tuple(r.choice([2, 3]) if d == 1 and r.random() < 0.5 else d for d in a.shape)
        shape = (r.choice([1, 2, 3]),) * r.randint(0, 1) + shape
        return f"broadcast({a.name}, {_kw(REGISTRY['broadcast'], 'shape', list(shape))})", shape

    def _index(self, pool: list, a) -> tuple[str, Shape] | None:
        r, s = self.rng, a.shape
        if not s:
            return None
        if self.ids is not None and s[0] == self.h and r.random() < 0.6:
            if self.ids.shape[0] and r.random() < 0.3:  # by a computed index: a row of %ids
                j = r.randrange(self.ids.shape[0])
                return f"index({a.name}, index({self.ids.name}, {j}))", self.ids.shape[1:] + s[1:]
            return f"index({a.name}, {self.ids.name})", self.ids.shape + s[1:]
        if s[0] == 0:
            return None
        return f"index({a.name}, {r.randrange(s[0])})", s[1:]

    def _scatter_add(self, pool: list, a) -> tuple[str, Shape] | None:
        s = a.shape
        if self.ids is None or not s or s[0] != self.h:
            return None
        same = [v for v in pool if v.shape == s]
        b = self.rng.choice(same)
        if self.rng.random() < 0.5:
            updates = f"index({self.unary(b)}, {self.ids.name})"
        else:  # updates broadcast from a row
            row = f"index({b.name}, {self.rng.randrange(s[0])})"
            updates = f"broadcast({row}, shape={list(self.ids.shape + s[1:])})"
        return f"scatter_add({a.name}, {self.ids.name}, {updates})", s

    def _cast(self, pool: list, a) -> tuple[str, Shape] | None:
        return self._cast_round_trip(a.name), a.shape

    def _cast_round_trip(self, name: str) -> str:
        """A cast away and back to the program's dtype, on values where both casts are defined
        (no float-to-integer cast of a value out of the integer's range). A float goes to an
        integer as `tanh(x) * 99.5`: truncation jumps at integers, and a saturated tanh times
        100 sat on one (1.0 on the CPU, 0.99999994 in NumPy: 100 against 99, finding 10)."""
        r, d = self.rng, self.dtype
        if self.grad:  # differentiable: the identity cast
            return f"cast({name}, dtype=\"{d}\")"
        if self.is_float:
            other = "f64" if d == "f32" else "f32"
            forms = [f"cast(cast({name}, dtype=\"{other}\"), dtype=\"{d}\")",
                     f"cast(cast(tanh({name}) * 99.5, dtype=\"{r.choice(['i32', 'i64'])}\"), dtype=\"{d}\")",
                     f"cast(cast({name}, dtype=\"i1\"), dtype=\"{d}\")"]
        else:
            other = "i64" if d == "i32" else "i32"  # i64 -> i32 wraps, as NumPy's astype does
            forms = [f"cast(cast({name}, dtype=\"{other}\"), dtype=\"{d}\")",
                     f"cast(cast({name}, dtype=\"i1\"), dtype=\"{d}\")"]
            if d == "i32":  # every i32 is an f64
                forms.append(f"cast(cast({name}, dtype=\"f64\"), dtype=\"{d}\")")
        return r.choice(forms)
