"""Length dims: the `?` dims a compiled function may take at run time (issue 28).

A *length* is a `?` dim that only sets scan trip counts and the leading dim of the arrays
scanned over or stacked (and of what is computed from those). Code for one length serves
every length: the trip count is read at run time, every array whose leading dim follows the
length is sized per call, and its strides do not change (row-major: the leading dim is in no
stride).

How it is found (no symbolic shape algebra in the op specs): the driver makes the function
at two representative lengths t1 < t2 and runs the whole pipeline on both; `compare` walks
the two results side by side. They must be the same program: the same ops in the same order,
reading the same operands, with the same attributes, except those that only restate a result
shape (`OpSpec.shape_attrs`: reshape's `shape`, slice's `limits`). Every dim that differs must
be `per_step * t + offset` (an `Extent`, integral in both), on axis 0, except the second axis
of a transpose that is a view read by GEMMs (its transpose flag; nothing is laid out by it).
A splat constant that differs must be an extent or its reciprocal (the count a `mean`'s
gradient divides by, N or 1/N): the code computes it from T. As two points fit any line, such
constants are checked at a third length (`verify`, which the driver runs when there are some).
Whatever the pipeline decided from the length (a constant 1/T, a folded loop, a slice that
starts at T-1) shows up as a difference that is not an `Extent`, and the function is then
specialised per length as before; `LengthDims.reason` says why.

What the two runs cannot show is a decision that holds for both representatives but not for
every length. The passes rely on one such fact: a loop with a known trip count of at least
one runs (canonicalize hoists an op that may fail out of it). So the code serves lengths of
at least `min_length` (>= 1, and large enough that no extent is negative); a shorter length
(0 included) is specialised on its own.

Known gaps: one length per function (a second `?` leading dim is specialised); the memory
plan places values that follow the length nowhere (the CPU backend gives each a block of
its own, sized per call: no reuse among them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..ir.core import Function, Module, Operation, Value
from ..ir.spec import view_source
from ..ir.types import TensorType


@dataclass(frozen=True)
class Extent:
    """A dim that follows the length t: `per_step * t + offset`."""

    per_step: int
    offset: int

    def at(self, t: int) -> int:
        return self.per_step * t + self.offset

    def __str__(self) -> str:
        a = "T" if self.per_step == 1 else f"{self.per_step}*T"
        return a if not self.offset else f"{a}{self.offset:+d}"


@dataclass(frozen=True, eq=False)
class LengthDims:
    """The dims of one function (specialised at `representative`) that follow its length."""

    function: Function
    """The function at the representative length, after the pipeline: what is compiled."""
    representative: int
    extents: dict[Value, dict[int, Extent]] = field(default_factory=dict)
    """A value of `function` -> its axes that follow the length."""
    min_length: int = 1
    """The shortest length the code serves (module docstring)."""
    constants: dict[Value, tuple[Extent, bool]] = field(default_factory=dict)
    """A splat constant of `function` -> the extent it is, or (True) whose reciprocal it is."""

    def dims(self, v: Value) -> dict[int, Extent]:
        return self.extents.get(v, {})

    def arguments(self) -> list[tuple[int, int, Extent]]:
        """(argument, axis, extent) of every argument dim that follows the length."""
        return [(i, axis, e) for i, a in enumerate(self.function.args) for axis, e in self.dims(a).items()]

    def describe(self) -> str:
        """`%xs dim 0 = T, ...; N values follow the length`: sorted, stable."""
        args = [f"%{self.function.args[i].name_hint or i} dim {axis} = {e}" for i, axis, e in self.arguments()]
        consts = f"; {len(self.constants)} constants follow the length" if self.constants else ""
        return (f"{', '.join(args)}; {len(self.extents)} values follow the length{consts}; "
                f"lengths >= {self.min_length}")


class NotALength(Exception):
    """The dims compared do not make a length (the message says why)."""


def compare(a: Function, b: Function, ta: int, tb: int) -> LengthDims:
    """The dims of a (at length ta) that follow the length, from b (the same function at tb);
    raises NotALength where the two are not one program."""
    if ta == tb:
        raise NotALength("the two representative lengths are equal")
    walk = _Walk(ta, tb)
    walk.values(list(a.args), list(b.args), f"@{a.name}")
    for arg in a.args:
        if any(axis != 0 for axis in walk.extents.get(arg, {})):
            raise NotALength(f"@{a.name}: the length is not the leading dim of %{arg.name_hint}")
    ops_a, ops_b = list(a.walk()), list(b.walk())
    if len(ops_a) != len(ops_b):
        raise NotALength(f"the pipeline made {len(ops_a)} ops at length {ta} and {len(ops_b)} at length {tb}")
    for x, y in zip(ops_a, ops_b):
        walk.op(x, y)
    if not walk.extents:
        raise NotALength("no dim follows the length")
    return LengthDims(a, ta, walk.extents, walk.min_length(), walk.constants)


def verify(lengths: LengthDims, c: Function, tc: int) -> None:
    """Raises NotALength unless c (the function at a third length tc) is lengths.function with
    every dim and constant that follows the length at tc."""
    a = lengths.function
    walk = _Walk(lengths.representative, tc, lengths.extents, lengths.constants)
    walk.values(list(a.args), list(c.args), f"@{a.name}")
    ops_a, ops_c = list(a.walk()), list(c.walk())
    if len(ops_a) != len(ops_c):
        raise NotALength(f"the pipeline made {len(ops_a)} ops at length {lengths.representative} and {len(ops_c)} "
                         f"at length {tc}")
    for x, y in zip(ops_a, ops_c):
        walk.op(x, y)


def module_extents(a: Module, b: Module, ta: int, tb: int) -> dict[Value, dict[int, Extent]]:
    """The dims of every function of a (at length ta) that follow the length, from b (at tb);
    raises NotALength where the two are not one program. With `conforms`: a Python function's
    trace, which may read a length as a Python int (module docstring)."""
    walk = _Walk(ta, tb)
    _walk_modules(walk, a, b)
    return walk.extents


def conforms(a: Module, extents: dict[Value, dict[int, Extent]], c: Module, ta: int, tc: int) -> str | None:
    """None when c (at length tc) is a (at ta) with every dim in extents at tc and every other
    dim, op and attribute as in a; else what differs. Two representatives fit any dim with a
    line and see one side of a Python `if` on the length: a trace checked this way at each
    length is the program the code for every length runs."""
    try:
        _walk_modules(_Walk(ta, tc, extents), a, c)
    except NotALength as e:
        return str(e)
    return None


def _walk_modules(walk: _Walk, a: Module, b: Module) -> None:
    if sorted(a.functions) != sorted(b.functions):
        raise NotALength("other functions at the two lengths")
    for name in sorted(a.functions):
        fa, fb = a.functions[name], b.functions[name]
        walk.values(list(fa.args), list(fb.args), f"@{name}")
        ops_a, ops_b = list(fa.walk()), list(fb.walk())
        if len(ops_a) != len(ops_b):
            raise NotALength(f"@{name} has {len(ops_a)} ops at length {walk.ta} and {len(ops_b)} at {walk.tb}")
        for x, y in zip(ops_a, ops_b):
            walk.op(x, y)


class _Walk:
    def __init__(self, ta: int, tb: int, expected: dict[Value, dict[int, Extent]] | None = None,
                 expected_constants: dict[Value, tuple[Extent, bool]] | None = None):
        self.ta, self.tb = ta, tb
        self.expected = expected
        """Checking (`conforms`, `verify`): the extents of a's values that b's dims must have at tb."""
        self.expected_constants = expected_constants or {}
        self.same: dict[Value, Value] = {}
        self.extents: dict[Value, dict[int, Extent]] = {}
        self.constants: dict[Value, tuple[Extent, bool]] = {}

    def op(self, x: Operation, y: Operation) -> None:
        where = f"'{x.name}' at {x.loc}"
        if x.name != y.name or x.segments != y.segments or len(x.regions) != len(y.regions):
            raise NotALength(f"{where}: the pipeline made other ops at the two lengths")
        if len(x.operands) != len(y.operands) or any(self.same.get(p) is not q for p, q in zip(x.operands, y.operands)):
            raise NotALength(f"{where} reads other values at the two lengths")
        restated = set(x.spec.shape_attrs)
        if x.spec.splat is not None and x.results and self.splat_follows(x, y, where):
            restated |= set(x.attrs)  # its value follows the length (checked there)
        for key in set(x.attrs) | set(y.attrs):
            if key not in restated and x.attrs.get(key) != y.attrs.get(key):
                raise NotALength(f"{where}: attribute {key} depends on the length ({x.attrs.get(key)} at {self.ta}, "
                                 f"{y.attrs.get(key)} at {self.tb})")
        for rx, ry in zip(x.regions, y.regions):
            self.values(list(rx.block.args), list(ry.block.args), where)
        self.values(list(x.results), list(y.results), where)
        for v, axes in ((r, self.extents.get(r, {})) for r in x.results):
            if any(axis != 0 for axis in axes) and not _transposed_view(x):
                raise NotALength(f"{where}: the length is in dim {sorted(axes)} of {v.type}, not the leading one")

    def splat_follows(self, x: Operation, y: Operation, where: str) -> bool:
        """Whether x and y are splat constants whose value follows the length (recorded)."""
        vx, vy = x.spec.splat(x), y.spec.splat(y)  # type: ignore[misc]
        if isinstance(vx, bool) or not isinstance(vx, (int, float)) or not isinstance(vy, (int, float)):
            return False
        dtype = x.result.tensor_type.numpy_dtype
        expected = self.expected_constants.get(x.result) if self.expected is not None else None
        if expected is not None:  # checking: y's value is the extent's at tb
            if _same(_constant_at(*expected, self.tb), vy, dtype):
                return True
            want = _constant_at(*expected, self.tb)
            raise NotALength(f"{where}: the constant {vy} is not {want} at length {self.tb}")
        if vx == vy or self.expected is not None:
            return False
        for reciprocal in (False, True):
            if reciprocal and (vx == 0 or vy == 0):
                continue
            nx, ny = (round(1 / vx), round(1 / vy)) if reciprocal else (round(vx), round(vy))
            per_step, rem = divmod(ny - nx, self.tb - self.ta)
            e = Extent(per_step, nx - per_step * self.ta)
            if not rem and per_step > 0 and _same(_constant_at(e, reciprocal, self.ta), vx, dtype) \
                    and _same(_constant_at(e, reciprocal, self.tb), vy, dtype):
                self.constants[x.result] = (e, reciprocal)
                return True
        return False

    def values(self, xs: list[Value], ys: list[Value], where: str) -> None:
        if len(xs) != len(ys):
            raise NotALength(f"{where}: other values at the two lengths")
        for x, y in zip(xs, ys):
            self.same[x] = y
            if self.expected is not None:
                self.check(x, y.type, where)
                continue
            axes = self.dims(x.type, y.type, where)
            if axes:
                self.extents[x] = axes

    def dims(self, tx: object, ty: object, where: str) -> dict[int, Extent]:
        if not isinstance(tx, TensorType) or not isinstance(ty, TensorType):
            if tx != ty:
                raise NotALength(f"{where}: {tx} against {ty}")
            return {}
        if tx.dtype != ty.dtype or tx.rank != ty.rank or not (tx.is_static and ty.is_static):
            raise NotALength(f"{where}: {tx} against {ty}")
        axes = {}
        for axis, (dx, dy) in enumerate(zip(tx.static_shape, ty.static_shape)):
            if dx == dy:
                continue
            per_step, rem = divmod(dy - dx, self.tb - self.ta)
            if rem or per_step <= 0 or min(dx, dy) < 2:
                # a dim of 0 or 1 at a representative would make broadcasting differ from other lengths
                raise NotALength(f"{where}: dim {axis} is {dx} at length {self.ta} and {dy} at {self.tb}")
            axes[axis] = Extent(per_step, dx - per_step * self.ta)
        if len(axes) > 1:
            raise NotALength(f"{where}: more than one dim of {tx} follows the length")
        return axes

    def check(self, x: Value, ty: object, where: str) -> None:
        """ty is x's type with x's expected extents at tb."""
        tx = x.type
        axes = self.expected.get(x, {})  # type: ignore[union-attr]
        if axes and isinstance(tx, TensorType):
            tx = tx.with_shape(tuple(axes[i].at(self.tb) if i in axes else d for i, d in enumerate(tx.shape)))
        if tx != ty:
            raise NotALength(f"{where}: {ty} where the code for every length has {tx}")

    def min_length(self) -> int:
        """The shortest length at which no extent is negative, and at least 1."""
        low = 1
        for axes in self.extents.values():
            for e in axes.values():
                low = max(low, math.ceil(-e.offset / e.per_step))
        return low


def _constant_at(e: Extent, reciprocal: bool, t: int) -> float:
    return 1.0 / e.at(t) if reciprocal else float(e.at(t))


def _same(value: float, literal: float, dtype: np.dtype) -> bool:
    """value, rounded to dtype, is literal (as the constant holds it in dtype)."""
    return bool(np.asarray(value).astype(dtype) == np.asarray(literal).astype(dtype))


def _transposed_view(op: Operation) -> bool:
    """A 2-D transpose that GEMMs read through their transpose flag (no copy, no layout)."""
    return op.name == "transpose" and view_source(op) is not None
