"""JAX's functional updates on traced values: `x.at[idx].set(v)`, `.add(v)`, `.multiply(v)`,
`.divide(v)`, `.min(v)`, `.max(v)`, `.get()`.

A traced value is never written in place: `x.at[idx].add(v)` is a new tensor, x with v added
where `x[idx]` lies (v broadcast to that selection's shape and cast to x's dtype, as JAX does).
Each update is composed of ops that have gradient rules (ir/vjp.py), so it is differentiable in
x and in v with no rule of its own, and runs on every backend that runs those ops.

Terms.
- A *static* index has no traced value in it: ints (negative ones count from the end), slices
  (any step but 0), `...`, `None`, integer or bool NumPy arrays and lists, i.e. all of NumPy's
  indexing. Its *positions* are computed now, in NumPy: `np.arange(x.size).reshape(x.shape)[idx]`
  is the flat position of every selected element, so NumPy itself says what the index means
  and which errors it has. x is flattened and the update is one `scatter_add` at those
  positions (a constant index tensor), then reshaped back:
    add       scatter_add(x, positions, v)          (a repeated position adds every update)
    set       select(mask, scatter_add(0, unique positions, v at each last occurrence), x)
              (NumPy's rule: the last update of a repeated position wins; JAX: implementation-defined)
    multiply  x * select(mask_k, scatter_add(0, positions_k, v_k), 1), one product per layer k
              of repeated positions (a repeated position multiplies by every update); divide alike
    power     select(mask_k, pow(select(mask_k, x, 1), scatter_add(0, positions_k, v_k)), x)
    min, max  select(mask_k, min(x, scatter_add(0, positions_k, v_k)), x), per layer k (max alike)
    get       a `slice` (basic indexing, as x[idx]) or an `index` gather at the positions.
  With one `?` axis, kept whole by an index of ints and slices on the others, x is viewed as
  (its static elements, the `?` axis): rows updated as the flattened x is (`_variable_update`).
- A *traced* index `t` (an integer scalar or tensor) alone on one axis, every other axis whole
  (`x.at[t]`, `x.at[:, t]`, `x.at[..., t]`): that axis is moved to the front and the update is
  one `scatter_add` of rows at t (`add`), a `select` between x and the scattered rows where a
  scattered count is non-zero (`set`), or a `set` of `x[t] * v` (`multiply`; `divide`, `min`,
  `max`, `power` alike; scalar t only). A traced scalar t beside static indices on other axes: the slab
  x[.., t, ..] is read, updated by the static rule, and set back.

Known gaps (docs/python.md's table): a traced index tensor together with another non-whole
index on another axis (`x.at[ids, 1:3]`); `multiply`, `divide`, `min`, `max` with a traced
index tensor (a repeated index would have to apply twice); a repeated row in a traced index
tensor under `set` sums its updates (JAX keeps one of them); a traced index out of range (or
negative) is a run-time error, as `x[t]` is (JAX clamps gathers and drops such updates);
`.apply`, and `mode=`/`fill_value=`; static updates of a tensor with two `?` dims, or that
index its `?` axis (`.get()` with ints and slices takes what `x[idx]` takes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import Location
from .numpy_api import _getitem, _reshape, _transpose
from .tracer import GirTraceAttributeError, GirTraceError, Tracer, current_frame, emit1, to_value, user_location

_OPS = ("set", "add", "multiply", "divide", "power", "min", "max", "get")
_COMBINE = {"multiply": "mul", "divide": "div", "power": "pow", "min": "min", "max": "max"}
"""The elementwise op that combines x's element with an update, for the updates after set/add."""


class _AtIndexer:
    """`x.at`: indexing it gives the update of that selection (`x.at[idx]`)."""

    __slots__ = ("x",)

    def __init__(self, x: Tracer):
        self.x = x

    def __getitem__(self, idx: Any) -> _AtSelection:
        return _AtSelection(self.x, idx)

    def __repr__(self) -> str:
        return f"{self.x!r}.at"


class _AtSelection:
    """`x.at[idx]`: the functional updates of x at idx (module docstring)."""

    __slots__ = ("x", "idx")

    def __init__(self, x: Tracer, idx: Any):
        self.x = x
        self.idx = idx

    def set(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] replaced by values (broadcast to x[idx]'s shape, cast to x's dtype)."""
        return _update("set", self.x, self.idx, values, options, user_location())

    def add(self, values: Any, **options: Any) -> Tracer:
        """x with values added at x[idx] (a repeated position adds each of its updates)."""
        return _update("add", self.x, self.idx, values, options, user_location())

    def multiply(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] multiplied by values (a repeated position multiplies by each)."""
        return _update("multiply", self.x, self.idx, values, options, user_location())

    def divide(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] divided by values (a repeated position divides by each)."""
        return _update("divide", self.x, self.idx, values, options, user_location())

    def power(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] raised to values (floats; a repeated position raises once per update)."""
        return _update("power", self.x, self.idx, values, options, user_location())

    def min(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] replaced by the minimum of it and values."""
        return _update("min", self.x, self.idx, values, options, user_location())

    def max(self, values: Any, **options: Any) -> Tracer:
        """x with x[idx] replaced by the maximum of it and values."""
        return _update("max", self.x, self.idx, values, options, user_location())

    def get(self, **options: Any) -> Tracer:
        """x[idx] (all of NumPy's static indexing; a traced index alone on one axis)."""
        return _update("get", self.x, self.idx, None, options, user_location())

    def __getattr__(self, name: str) -> Any:
        have = ", ".join(f".{o}()" for o in _OPS)
        raise GirTraceAttributeError(f"x.at[...].{name} is not supported; gir has {have}", user_location())


def _update(op: str, x: Tracer, idx: Any, values: Any, options: dict[str, Any], loc: Location) -> Tracer:
    if options:
        raise GirTraceError(f"x.at[...].{op}() takes no {', '.join(sorted(options))} (JAX's mode, "
                            "indices_are_sorted, unique_indices, fill_value): gir has one behaviour, "
                            "docs/python.md", loc)
    key = idx if isinstance(idx, tuple) else (idx,)
    if op == "power" and x.type.dtype not in ("f32", "f64"):
        raise GirTraceError(f"x.at[...].power() on {x.type}: the `pow` op takes floats; convert with "
                            ".astype(float) first", loc)
    if any(isinstance(k, Tracer) for k in key):
        return _traced_update(op, x, key, values, loc)
    if x.type.dtype == "i1" and op not in ("set", "get"):
        raise GirTraceError(f"x.at[...].{op}() on a bool tensor: convert it with .astype('int32') first", loc)
    if op == "get":
        return _static_get(x, key, loc)
    return _static_update(op, x, key, values, loc)


# -- static indices -------------------------------------------------------------------------------


def _positions(x: Tracer, key: tuple[Any, ...], loc: Location) -> np.ndarray:
    """The flat position in x of every element of x[key], in x[key]'s shape (NumPy's indexing)."""
    shape = x.type.shape
    if any(d is None for d in shape):
        raise GirTraceError(f"x.at[...] with a static index on {x.type}: its `?` dims must be known; trace with "
                            "concrete sizes (gir.jit specialises on the arguments) or index one axis with a traced "
                            "integer", loc)
    dims = tuple(d for d in shape if d is not None)
    key = tuple(np.asarray(k) if isinstance(k, list) else k for k in key)
    try:
        return np.arange(int(np.prod(dims, dtype=np.int64)), dtype=np.int64).reshape(dims)[key]
    except (IndexError, ValueError, TypeError) as e:
        raise GirTraceError(f"x.at[{_show(key)}] on {x.type}: {e}", loc) from None


def _show(key: tuple[Any, ...]) -> str:
    """The index as the user wrote it (`1:3, ...`), for messages."""
    def one(k: Any) -> str:
        if isinstance(k, slice):
            bounds = ["" if b is None else str(b) for b in (k.start, k.stop)]
            return ":".join(bounds + ([] if k.step is None else [str(k.step)]))
        return "..." if k is Ellipsis else repr(k)
    return ", ".join(one(k) for k in key)


def _basic(key: tuple[Any, ...]) -> bool:
    """Indexing that `x[key]` emits as one slice (ints, slices of positive steps, ..., None)."""
    return all(k is None or k is Ellipsis or (isinstance(k, (int, np.integer)) and not isinstance(k, bool))
               or (isinstance(k, slice) and (k.step is None or (isinstance(k.step, (int, np.integer))
                                                                and k.step > 0)))
               for k in key)


def _static_get(x: Tracer, key: tuple[Any, ...], loc: Location) -> Tracer:
    if _basic(key) and not x.type.is_static:
        return _getitem(x, key, loc)  # x[idx] keeps a `?` axis whole (the fused-gate gx[:, :H])
    positions = _positions(x, key, loc)  # NumPy's errors (out of range, step 0) for every kind of index
    if _basic(key):
        return _getitem(x, key, loc)
    flat = _reshape(x, (-1,), loc)
    rows = emit1("index", [flat.value, to_value(positions.reshape(-1), loc=loc)], loc=loc)
    return _reshape(rows, positions.shape, loc)


def _static_update(op: str, x: Tracer, key: tuple[Any, ...], values: Any, loc: Location) -> Tracer:
    if not x.type.is_static:
        return _variable_update(op, x, key, values, loc)
    positions = _positions(x, key, loc)
    v = _updates(x, values, positions.shape, loc)
    if positions.size == 0:
        return x
    is_bool = x.type.dtype == "i1"
    flat = _reshape(_as_i32(x, loc) if is_bool else x, (-1,), loc)
    v = _reshape(_as_i32(v, loc) if is_bool else v, (-1,), loc)
    out = _reshape(_update_rows(op, flat, positions.reshape(-1), v, loc), x.type.shape, loc)
    return emit1("ne", [out.value, to_value(0, "i32", loc)], loc=loc) if is_bool else out


def _update_rows(op: str, rows: Tracer, p: np.ndarray, v: Tracer, loc: Location) -> Tracer:
    """rows (N, ...) updated at rows p (static, maybe repeated) by v's rows (len(p), ...)."""
    if op == "add":
        return _scatter(rows, p, v, loc)
    if op == "set":
        last = np.arange(p.size) if len(np.unique(p)) == p.size else _last_occurrences(p)
        return _select_at(rows, p[last], _rows(v, last, loc), loc)
    out = rows
    for layer in _layers(p):  # each layer's positions are distinct: one select each
        out = _combine_at(op, out, p[layer], _rows(v, layer, loc), loc)
    return out


def _variable_update(op: str, x: Tracer, key: tuple[Any, ...], values: Any, loc: Location) -> Tracer:
    """A static update of x with one `?` axis that the index keeps whole (`gx.at[:, :H]` with a
    variable batch): x as rows of its static elements, one column per `?` index, updated as the
    flattened x is (`_update_rows`), then put back."""
    shape, rank = x.type.shape, x.type.rank
    full = _full_key(key, rank)
    unknown = [a for a, d in enumerate(shape) if d is None]
    if len(unknown) != 1 or full is None or not _basic(full) or full[unknown[0]] != slice(None):
        raise GirTraceError(f"x.at[{_show(key)}] on {x.type}: an update of a tensor with a `?` dim takes one `?` "
                            "axis, kept whole (:), and ints and slices on the others; trace with concrete sizes "
                            "(gir.jit specialises on the arguments) or index one axis with a traced integer", loc)
    a = unknown[0]
    static_shape = tuple(d for d in shape if d is not None)
    try:
        positions = np.arange(int(np.prod(static_shape, dtype=np.int64)), dtype=np.int64).reshape(static_shape)[
            full[:a] + full[a + 1:]]
    except (IndexError, ValueError, TypeError) as e:
        raise GirTraceError(f"x.at[{_show(key)}] on {x.type}: {e}", loc) from None
    like = _getitem(x, full, loc)  # x[idx]: the selection's shape, `?` axis included
    v = _updates(x, values, like.type.shape, loc, like)
    if positions.size == 0:
        return x
    is_bool = x.type.dtype == "i1"
    a_selected = a - sum(1 for k in full[:a] if not isinstance(k, slice))  # ints before a drop their axes
    rows = _columns(_as_i32(x, loc) if is_bool else x, a, loc)
    out = _update_rows(op, rows, positions.reshape(-1), _columns(_as_i32(v, loc) if is_bool else v, a_selected, loc),
                       loc)
    out = _from_front(_reshape(_transpose(out, None, loc), (-1, *static_shape), loc), a, 1, loc)
    return emit1("ne", [out.value, to_value(0, "i32", loc)], loc=loc) if is_bool else out


def _columns(x: Tracer, axis: int, loc: Location) -> Tracer:
    """x (its `?` axis at `axis`) as (its static elements, the `?` axis): a transpose of x with
    that axis first, flattened after it."""
    front = _to_front(x, axis, 1, loc)
    static = [d for d in front.type.shape[1:] if d is not None]  # all of them: the one `?` axis is first
    return _transpose(_reshape(front, (-1, int(np.prod(static, dtype=np.int64))), loc), None, loc)


def _full_key(key: tuple[Any, ...], rank: int) -> tuple[Any, ...] | None:
    """key with its `...` expanded and whole slices added to reach rank; None with a None in it
    or more entries than axes."""
    if any(k is None for k in key) or sum(k is Ellipsis for k in key) > 1:
        return None
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (rank - len(key) + 1) + key[i + 1:]
    return key + (slice(None),) * (rank - len(key)) if len(key) <= rank else None


def _layers(p: np.ndarray) -> list[np.ndarray]:
    """The occurrences of p split into layers of distinct positions: layer k holds, for each
    position that occurs more than k times, its (k+1)-th occurrence (indices into p)."""
    order = np.argsort(p, kind="stable")
    sorted_p = p[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_p)) + 1]
    rank = np.arange(p.size) - np.repeat(starts, np.diff(np.r_[starts, p.size]))
    return [np.sort(order[rank == k]) for k in range(int(rank.max()) + 1)]


def _last_occurrences(p: np.ndarray) -> np.ndarray:
    """Indices into p of the last occurrence of each distinct position."""
    _, first_from_end = np.unique(p[::-1], return_index=True)
    return np.sort(p.size - 1 - first_from_end)


def _rows(v: Tracer, which: np.ndarray, loc: Location) -> Tracer:
    """v[which] (all of v when which is every index in order: no gather)."""
    if which.size == v.type.shape[0] and np.array_equal(which, np.arange(which.size)):
        return v
    return emit1("index", [v.value, to_value(which, loc=loc)], loc=loc)


def _combine_at(op: str, out: Tracer, positions: np.ndarray, v: Tracer, loc: Location) -> Tracer:
    """out with out[p] = OP(out[p], v) at the (distinct) positions. multiply, divide: by a factor
    that is 1 elsewhere (x * 1 and x / 1 are x exactly, and no 0 divides in the gradient);
    power: a select of pow(base, scattered v), base 1 where unselected (1 ** 0: no log of a
    negative x in the gradient of the branch the select drops); min, max: a select of
    OP(out, scattered v) (the elements it drops get no gradient)."""
    if op in ("multiply", "divide"):
        factor = _select_at(_ones_like(out, loc), positions, v, loc)
        return emit1(_COMBINE[op], [out.value, factor.value], loc=loc)
    mask = to_value(_mask(out, positions), loc=loc)
    base = emit1("select", [mask, out.value, _ones_like(out, loc).value], loc=loc) if op == "power" else out
    combined = emit1(_COMBINE[op], [base.value, _scatter(_zeros_like(out, loc), positions, v, loc).value], loc=loc)
    return emit1("select", [mask, combined.value, out.value], loc=loc)


def _mask(base: Tracer, positions: np.ndarray) -> np.ndarray:
    """True at the given rows of base (its leading dim known), shaped to broadcast over its rows."""
    rows = base.type.shape[0] or 0
    mask = np.zeros(rows, dtype=np.bool_)
    mask[positions] = True
    return mask.reshape((rows,) + (1,) * (base.type.rank - 1))


def _scatter(base: Tracer, positions: np.ndarray, v: Tracer, loc: Location) -> Tracer:
    return emit1("scatter_add", [base.value, to_value(positions, loc=loc), v.value], loc=loc)


def _select_at(base: Tracer, positions: np.ndarray, v: Tracer, loc: Location) -> Tracer:
    """base with the (distinct) positions replaced by v: a select on a constant mask."""
    scattered = _scatter(_zeros_like(base, loc), positions, v, loc)
    return emit1("select", [to_value(_mask(base, positions), loc=loc), scattered.value, base.value], loc=loc)


def _zeros(x: Tracer, loc: Location) -> Tracer:
    return emit1("zeros", [], declared=[x.type], loc=loc)


def _ones(x: Tracer, loc: Location) -> Tracer:
    return emit1("ones", [], declared=[x.type], loc=loc)


def _as_i32(x: Tracer, loc: Location) -> Tracer:
    return emit1("cast", [x.value], declared=[x.type.with_dtype("i32")], loc=loc)


def _updates(x: Tracer, values: Any, shape: tuple[Any, ...], loc: Location, like: Tracer | None = None) -> Tracer:
    """values as a tensor of x's dtype broadcast to `shape` (the selection's); where `shape` has
    a `?` dim, broadcast against `like`, a tensor of that shape (a select on like == like, both
    branches the values: a run-time shape without an op for one)."""
    frame = current_frame()
    assert frame is not None
    dtype = x.type.dtype
    v = to_value(values, dtype, loc)
    if v.tensor_type.dtype != dtype:
        v = emit1("cast", [v], declared=[v.tensor_type.with_dtype(dtype)], loc=loc).value
    have = v.tensor_type.shape
    if have == tuple(shape):
        return Tracer(v, frame, frame.block)
    if like is not None and any(d is None for d in (*have, *shape)):
        same = emit1("eq", [like.value, like.value], loc=loc)
        return emit1("select", [same.value, v, v], loc=loc)
    if any(d is None for d in (*have, *shape)):
        raise GirTraceError(f"the update {v.tensor_type} must have the selection's shape {list(shape)} when a dim "
                            "is `?` (no broadcasting over a `?` dim here)", loc)
    known = tuple(d for d in shape if d is not None)  # none is `?` here
    try:
        ok = np.broadcast_shapes(tuple(d for d in have if d is not None), known) == known
    except ValueError:
        ok = False
    if not ok:
        raise GirTraceError(f"the update {v.tensor_type} does not broadcast to the selection's shape "
                            f"{list(shape)}", loc)
    return emit1("broadcast", [v], attrs={"shape": list(shape)}, loc=loc)


# -- a traced index ---------------------------------------------------------------------------------


def _traced_axis(x: Tracer, key: tuple[Any, ...], loc: Location) -> tuple[int, Tracer, tuple[Any, ...] | None]:
    """(axis, t, rest) for a key with one traced integer t on one axis: rest is None where every
    other axis is whole, else the static index of the other axes (t a scalar only)."""
    rank = x.type.rank
    if sum(k is Ellipsis for k in key if not isinstance(k, Tracer)) > 1:
        raise GirTraceError("an index can have only one ...", loc)
    if Ellipsis in [k for k in key if not isinstance(k, Tracer)]:
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (rank - len(key) + 1) + key[i + 1:]
    traced = [(a, k) for a, k in enumerate(key) if isinstance(k, Tracer)]
    others = tuple(k for k in key if not isinstance(k, Tracer))
    if len(traced) != 1 or len(key) > rank or any(k is None for k in others):
        raise GirTraceError("x.at[...] takes one traced index (on one axis, no None beside it)", loc)
    axis, t = traced[0]
    if t.type.dtype not in ("i32", "i64"):
        raise GirTraceError(f"a traced index must be an integer scalar or tensor, got {t.type}", loc)
    if all(isinstance(k, slice) and k == slice(None) for k in others):
        return axis, t, None
    if t.type.rank:
        raise GirTraceError("x.at[...] with a traced index tensor takes it alone on one axis, every other axis "
                            "whole (x.at[ids], x.at[:, ids]); a traced scalar index may have static indices "
                            "beside it (x.at[t, 1:3])", loc)
    return axis, t, others


def _to_front(x: Tracer, axis: int, count: int, loc: Location) -> Tracer:
    """x with its axes axis .. axis+count-1 moved to the front (unchanged when axis is 0)."""
    if axis == 0:
        return x
    rank = x.type.rank
    moved = list(range(axis, axis + count))
    return _transpose(x, moved + [a for a in range(rank) if a not in moved], loc)


def _from_front(x: Tracer, axis: int, count: int, loc: Location) -> Tracer:
    """The inverse of `_to_front`."""
    if axis == 0:
        return x
    rank = x.type.rank
    moved = list(range(axis, axis + count))
    perm = moved + [a for a in range(rank) if a not in moved]
    return _transpose(x, [perm.index(a) for a in range(rank)], loc)


def _traced_update(op: str, x: Tracer, key: tuple[Any, ...], values: Any, loc: Location) -> Tracer:
    axis, t, rest = _traced_axis(x, key, loc)
    if rest is not None:
        return _traced_row_update(op, x, axis, t, rest, values, loc)
    rows = _to_front(x, axis, 1, loc)
    r = t.type.rank
    if op == "get":
        picked = emit1("index", [rows.value, t.value], loc=loc)
        return _from_front(picked, axis, r, loc)
    selection = x.type.shape[:axis] + t.type.shape + x.type.shape[axis + 1:]
    like = _from_front(emit1("index", [rows.value, t.value], loc=loc), axis, r, loc) \
        if any(d is None for d in selection) else None
    if x.type.dtype == "i1":
        if op != "set":
            raise GirTraceError(f"x.at[...].{op}() on a bool tensor: convert it with .astype('int32') first", loc)
        v = _as_i32(_updates(x, values, selection, loc, like), loc)
        out = _traced_update("set", _as_i32(x, loc), key, v, loc)
        return emit1("ne", [out.value, to_value(0, "i32", loc)], loc=loc)
    v = _to_front(_updates(x, values, selection, loc, like), axis, r, loc)
    if op == "add":
        out = emit1("scatter_add", [rows.value, t.value, v.value], loc=loc)
    elif op == "set":
        out = _traced_set(rows, t, v, loc)
    else:
        if r:
            raise GirTraceError(f"x.at[ids].{op}() with a traced index tensor is not supported (a repeated index "
                                "would have to apply twice); use a traced scalar index, or a static index", loc)
        picked = emit1("index", [rows.value, t.value], loc=loc)
        out = _traced_set(rows, t, emit1(_COMBINE[op], [picked.value, v.value], loc=loc), loc)
    return _from_front(out, axis, 1, loc)


def _traced_row_update(op: str, x: Tracer, axis: int, t: Tracer, rest: tuple[Any, ...], values: Any,
                       loc: Location) -> Tracer:
    """x.at[..., t, ...] with static indices beside a traced scalar t: the slab x[.., t, ..]
    (axis dropped) is read, updated at the static rest, and set back; with t a scalar, x[key]
    is that slab indexed by the rest, in NumPy as here."""
    alone = (slice(None),) * axis + (t,)
    slab = _traced_update("get", x, alone, None, loc)
    if op == "get":
        return _update("get", slab, rest, None, {}, loc)
    return _traced_update("set", x, alone, _update(op, slab, rest, values, {}, loc), loc)


def _traced_set(rows: Tracer, t: Tracer, v: Tracer, loc: Location) -> Tracer:
    """rows with rows[t] replaced by v: where a scattered count of ones is non-zero, the
    scattered v (a row repeated in t sums its updates: docstring)."""
    frame = current_frame()
    assert frame is not None
    zero = _zeros_like(rows, loc)
    count = emit1("scatter_add", [zero.value, t.value, _ones_like(v, loc).value], loc=loc)
    hit = emit1("ne", [count.value, to_value(0, rows.type.dtype, loc)], loc=loc)
    scattered = emit1("scatter_add", [zero.value, t.value, v.value], loc=loc)
    return emit1("select", [hit.value, scattered.value, rows.value], loc=loc)


def _zeros_like(x: Tracer, loc: Location) -> Tracer:
    """Zeros of x's type, `?` dims too (numpy_api's zeros_like: a select on x == x there)."""
    if x.type.is_static:
        return _zeros(x, loc)
    same = emit1("eq", [x.value, x.value], loc=loc)
    zero = to_value(0, x.type.dtype, loc)
    return emit1("select", [same.value, zero, zero], loc=loc)


def _ones_like(x: Tracer, loc: Location) -> Tracer:
    if x.type.is_static:
        return _ones(x, loc)
    same = emit1("eq", [x.value, x.value], loc=loc)
    one = to_value(1, x.type.dtype, loc)
    return emit1("select", [same.value, one, one], loc=loc)


def _at(self: Tracer) -> _AtIndexer:
    return _AtIndexer(self)


Tracer.at = property(_at)  # type: ignore[attr-defined]
"""Installed as numpy_api.py installs the operators: `x.at` on every traced value."""
