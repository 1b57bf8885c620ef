"""The op registry: every op kind, described once.

An `OpSpec` holds an op kind's operands (by name; a trailing `*` marks a variadic group), its
attributes with defaults, its result-type rule (shape inference with NumPy broadcasting), its
NumPy interpreter kernel and the hooks later stages read: `vjp` (autodiff), `inplace`
(memplan: which operand the result may overwrite), `gpu` (placement), `flops` (cost).
Passes and backends ask `REGISTRY`; nothing else keeps a list of op names.

Textual forms (the generic syntax; see docs/language.md):

    %r = add %a, %b : tensor<4x8xf32>
    %s = sum %x {axes = [1], keepdims = false} : tensor<4xf32>
    %c = constant 0.0 : tensor<f32>
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import UNKNOWN, GirTypeError, Location, created_at, did_you_mean
from .core import Operation, Region, Value
from .spec import REGISTRY, REQUIRED, InferContext, Kernel, OpSpec, Reduction, ShapeError, register, view_source
from .types import FLOAT_DTYPES, INT_DTYPES, Dim, TensorType, Type, VarType

__all__ = ["REGISTRY", "REQUIRED", "InferContext", "Kernel", "OpSpec", "Reduction", "ShapeError", "infer_types",
           "make_op", "register", "view_source"]


def make_op(
    name: str,
    operands: Sequence[Value],
    attrs: dict[str, Any] | None = None,
    regions: Sequence[Region] = (),
    loc: Location = UNKNOWN,
    declared: Sequence[TensorType] | None = None,
    segments: tuple[int, ...] = (),
    result_names: Sequence[str | None] = (),
) -> Operation:
    """Builds an op, filling attribute defaults and inferring result types from its spec. While
    a pass runs, `loc` is marked as the origin of an op that pass made (errors.created_at)."""
    loc = created_at(loc)
    spec = REGISTRY.get(name)
    if spec is None:
        raise GirTypeError(f"unknown op '{name}'", loc)
    attrs = normalize_attrs(spec, dict(attrs) if attrs else {}, loc) if attrs or spec.attrs else {}
    n_fixed, n_variadic = spec.arity
    if n_variadic or segments or len(operands) != n_fixed:  # check_arity's common case inlined (right count, no sizes)
        check_arity(spec, len(operands), segments, loc)
    operand_types = [v.type for v in operands]
    written = list(declared) if declared is not None else None
    try:
        types, read_declared = infer_types_noting(spec, operand_types, attrs, written, regions, segments)
    except ShapeError as e:
        raise GirTypeError(f"'{name}': {e}", loc) from None
    if written is not None and not declared_matches(types, written):
        shown = ", ".join(str(t) for t in types)
        given = ", ".join(str(t) for t in written)
        raise GirTypeError(f"'{name}' produces {shown or 'no results'} but the written type is {given}", loc)
    op = Operation(name, operands, types, attrs, regions, loc, segments, result_names, True)
    if not regions and not spec.num_regions and (VarType not in map(type, operand_types)
                                                   or variables_allowed(spec, operand_types)) and (
            not read_declared if written is None else verifier_declared(types) == written):
        # What the verifier checks of an op without regions holds: no variable operand, the
        # arity (above), and the result types, since its type rule call (declared = these
        # result types) is this very call, or one the rule cannot tell from it (it never read
        # `declared`). type_stamp, inlined for the common case of no attributes.
        op.checked = (name, operand_types, types, (), segments) if not attrs \
            else type_stamp(op, operand_types, types)
    return op


def variables_allowed(spec: OpSpec, types: list[Type]) -> bool:
    """Every operand of one of these types that is a variable is one the spec lets be one
    (`OpSpec.variable_operands`: `load` and `store`). Memoized by the kinds of the types
    (every `load` and `store` of a program asks the same)."""
    kinds = (spec.name, *map(type, types))
    allowed = _VARIABLES_ALLOWED.get(kinds)
    if allowed is None:
        names, variable = spec.operands, spec.variable_operands
        allowed = all(i < len(names) and names[i] in variable for i, t in enumerate(types) if isinstance(t, VarType))
        if len(_VARIABLES_ALLOWED) < _INFERRED_LIMIT:
            _VARIABLES_ALLOWED[kinds] = allowed
    return allowed


_VARIABLES_ALLOWED: dict[tuple, bool] = {}


def verifier_declared(results: list[Type]) -> list[Type]:
    """The declared types the verifier passes for an op with these result types: a variable's
    held type (`var` is written with the type it holds)."""
    if VarType in map(type, results):
        return [t.held if isinstance(t, VarType) else t for t in results]
    return results


def type_stamp(op: Operation, operand_types: list[Type], result_types: list[Type]) -> tuple:
    """What the checks of `op` (an op without regions) that depend on nothing but it saw when
    they passed (variable operands, arity, result types): the verifier skips them while all
    of it is unchanged (verifier.Verifier.block).
    Attribute lists are copied, so editing one in place is seen as a change."""
    attrs = op.attrs
    if not attrs:
        return (op.name, operand_types, result_types, (), op.segments)  # not the op's dict: it may grow
    snapshot = attrs.copy()
    if list in map(type, snapshot.values()):  # the exact type: checked in C
        snapshot = {k: _copy_attr(v) for k, v in attrs.items()}
    return (op.name, operand_types, result_types, snapshot, op.segments)


def stamp_holds(stamp: tuple, op: Operation, operand_types: list[Type], result_types: list[Type]) -> bool:
    """Whether `op` still has what `type_stamp` recorded: the same kind, operand and result
    types, segments and attributes (equal values of the same Python types, as the memo key
    of `infer_types` tells them apart: 1, 1.0 and True are equal in Python)."""
    name, types, results, attrs, segments = stamp
    if name != op.name or types != operand_types or results != result_types or segments != op.segments:
        return False
    now = op.attrs
    if not attrs:
        return not now
    return attrs == now and all(_same_kind(v, now[k]) for k, v in attrs.items())


def _same_kind(a: Any, b: Any) -> bool:
    """Equal attribute values (`a == b` holds) are told apart by their Python types, in lists too."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        kinds = list(map(type, a))
        return kinds == list(map(type, b)) and (list not in kinds or _attr_key(a) == _attr_key(b))
    return True


def _copy_attr(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy_attr(v) for v in value]
    return value


_INFERRED: dict[tuple, tuple[list[Type], bool]] = {}
"""Result types, and whether the rule read `declared`, by everything a type rule of an op
without regions sees (`_infer_key`)."""
_INFERRED_LIMIT = 1 << 14
"""Entries kept at most (about 0.5 KB each): a program has few distinct (kind, types,
attributes) combinations, but a process compiling many shapes adds about ten per shape of a
small function, so the memo starts again when full (issue 31: it had stopped growing at 65,536
entries, about 32 MB, and then memoized nothing new)."""
_ATTR_LIST_LIMIT = 64
"""Attributes holding longer lists (a list literal) are not memoized: the key would cost what
the rule does."""


def infer_types(spec: OpSpec, types: list[Type], attrs: dict[str, Any], declared: list[TensorType] | None,
                regions: Sequence[Region], segments: tuple[int, ...]) -> list[Type]:
    """spec's result types for these operand types, attributes, declared types, regions and
    segments (raises ShapeError). A type rule is a function of exactly these, so the types of
    an op without regions are memoized: the parser, every pass's `make_op` and the verifier
    after each pass infer the same few combinations tens of thousands of times at 25k ops."""
    return infer_types_noting(spec, types, attrs, declared, regions, segments)[0]


def infer_types_noting(spec: OpSpec, types: list[Type], attrs: dict[str, Any], declared: list[TensorType] | None,
                       regions: Sequence[Region], segments: tuple[int, ...]) -> tuple[list[Type], bool]:
    """`infer_types`, and whether the rule read the declared types (InferContext.read_declared)."""
    if regions or spec.num_regions:
        key = None
    elif not attrs:  # _infer_key's first case, without the call (most ops)
        key = (spec.name, tuple(types), (), None if declared is None else tuple(declared), segments)
    else:
        key = _infer_key(spec, types, attrs, declared, segments)
    if key is not None:
        hit = _INFERRED.get(key)
        if hit is not None:
            return list(hit[0]), hit[1]
    ctx = InferContext(spec, types, attrs, declared, regions, segments)
    inferred = spec.infer(ctx)
    if key is not None:
        if len(_INFERRED) >= _INFERRED_LIMIT:
            _INFERRED.clear()
        _INFERRED[key] = (list(inferred), ctx.read_declared)
    return inferred, ctx.read_declared


def _infer_key(spec: OpSpec, types: list[Type], attrs: dict[str, Any], declared: list[TensorType] | None,
               segments: tuple[int, ...]) -> tuple | None:
    """A hashable key holding all a type rule sees, or None where an attribute has no cheap one."""
    if not attrs:
        return (spec.name, tuple(types), (), None if declared is None else tuple(declared), segments)
    frozen: list[Any] = []
    for name, value in attrs.items():
        v = _attr_key(value)
        if v is None:
            return None
        frozen.append(name)
        frozen.append(v)
    return (spec.name, tuple(types), tuple(frozen), None if declared is None else tuple(declared), segments)


def _attr_key(value: Any) -> Any:
    """A hashable stand-in equal only for attribute values no type rule tells apart: the type is
    part of it (1, 1.0 and True hash alike), a float's repr keeps -0.0 apart from 0.0."""
    kind = type(value)
    if kind is bool or kind is int or kind is str or value is None:
        return (kind, value)
    if kind is float:
        return (float, repr(value))
    if isinstance(value, (list, tuple)) and len(value) <= _ATTR_LIST_LIMIT:
        items = tuple(_attr_key(v) for v in value)
        return None if None in items else (type(value), items)
    return None


def declared_matches(types: Sequence[Type], declared: Sequence[TensorType]) -> bool:
    if len(types) != len(declared):
        return False
    return all(refines(t.held if isinstance(t, VarType) else t, d) for t, d in zip(types, declared))


def refines(inferred: Type, written: TensorType) -> bool:
    """A written `?` dim accepts any inferred size (as after gir.jit specialises a signature)."""
    if not isinstance(inferred, TensorType) or inferred.dtype != written.dtype or inferred.rank != written.rank:
        return False
    return all(w is None or w == i for i, w in zip(inferred.shape, written.shape))


def check_arity(spec: OpSpec, n: int, segments: tuple[int, ...], loc: Location) -> None:
    """The operand count, and `segments` (the sizes of the variadic operand groups): present
    exactly when the spec has more than one variadic group (scan, yield), one non-negative size
    per group, adding up with the fixed operands to n. Elsewhere segments are never read
    (OpSpec.segment_range), so sizes there would be a pass's mistake that nothing else sees."""
    n_fixed, n_variadic = spec.arity
    if n_variadic == 0 and n != n_fixed:
        raise GirTypeError(f"'{spec.name}' takes {n_fixed} operand(s), got {n}", loc)
    if n_variadic and n < n_fixed:
        raise GirTypeError(f"'{spec.name}' takes at least {n_fixed} operand(s), got {n}", loc)
    if n_variadic < 2 and segments:
        groups = "no variadic operand group" if n_variadic == 0 else "one variadic operand group"
        raise GirTypeError(f"'{spec.name}' has {groups} but carries operand group sizes {list(segments)}", loc)
    if n_variadic > 1 and (len(segments) != n_variadic or min(segments) < 0 or sum(segments) + n_fixed != n):
        sizes = ", ".join(f"{g.rstrip('*')}={s}" for g, s in zip((o for o in spec.operands if o.endswith("*")),
                                                                  segments))
        raise GirTypeError(f"'{spec.name}' operand groups do not add up: {n} operand(s), group sizes "
                           f"{list(segments)}" + (f" ({sizes})" if len(segments) == n_variadic else "")
                           + f" for {n_variadic} variadic group(s)", loc)


DEVICES = ("cpu", "gpu")
"""Where an op runs: every op kind accepts an optional `device` attribute (set by the `place`
pass, transforms/placement.py); `transfer` requires it (the device it moves its operand to)."""


def normalize_attrs(spec: OpSpec, attrs: dict[str, Any], loc: Location) -> dict[str, Any]:
    for key in attrs:
        if key == "device":
            if attrs[key] not in DEVICES:
                raise GirTypeError(f"'{spec.name}': device must be \"cpu\" or \"gpu\", got {attrs[key]!r}", loc)
            continue
        if key not in spec.attrs:
            known = ", ".join(sorted(spec.attrs)) or "none"
            raise GirTypeError(f"'{spec.name}' has no attribute '{key}' (known: {known})"
                               + did_you_mean(key, spec.attrs), loc)
    for key, default in spec.attrs.items():
        if key not in attrs:
            if default is REQUIRED:
                raise GirTypeError(f"'{spec.name}' needs the attribute '{key}'", loc)
            attrs[key] = default
    return attrs


# ---------------------------------------------------------------------------------------------
# Shape helpers


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    first = shapes[0]
    if all(s == first for s in shapes) and None not in first:  # the common case, kept cheap
        return first
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError("shapes " + ", ".join(_shape_str(s) for s in shapes) + " do not broadcast")
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def _shape_str(shape: tuple[Dim, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def same_dtype(ctx: InferContext, *indices: int) -> str:
    dtypes = {ctx.tensor(i).dtype for i in indices}
    if len(dtypes) != 1:
        raise ShapeError("operand dtypes differ: " + ", ".join(str(ctx.tensor(i)) for i in indices))
    return dtypes.pop()


def norm_axis(axis: int, rank: int) -> int:
    if not _is_int(axis):
        raise ShapeError(f"axis must be an integer, got {axis!r}")
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        raise ShapeError(f"{what} must be a list of integers")
    return list(value)


def _shape_attr(value: Any) -> tuple[int, ...]:
    """A `shape = [...]` attribute that is a whole shape (no -1): non-negative integers."""
    shape = _int_list(value, "shape")
    if any(d < 0 for d in shape):
        raise ShapeError(f"shape {shape} has a negative dim")
    return tuple(shape)


def _bool_attr(attrs: dict[str, Any], name: str) -> bool:
    value = attrs[name]
    if not isinstance(value, bool):
        raise ShapeError(f"{name} must be true or false, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Elementwise ops


def _binary_type(ctx: InferContext) -> TensorType:
    dtype = same_dtype(ctx, 0, 1)
    return TensorType(broadcast_shapes(ctx.tensor(0).shape, ctx.tensor(1).shape), dtype)


def _infer_binary(ctx: InferContext) -> list[Type]:
    return [_binary_type(ctx)]


def _infer_float_binary(ctx: InferContext) -> list[Type]:
    t = _binary_type(ctx)
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"needs float operands, got {t.dtype}")
    return [t]


def _infer_compare(ctx: InferContext) -> list[Type]:
    dtype = same_dtype(ctx, 0, 1)
    del dtype
    return [TensorType(broadcast_shapes(ctx.tensor(0).shape, ctx.tensor(1).shape), "i1")]


def _infer_numeric_binary(ctx: InferContext) -> list[Type]:
    t = _binary_type(ctx)
    if t.dtype == "i1":
        raise ShapeError("needs numeric operands, got i1; cast them first")
    return [t]


def _infer_logical(ctx: InferContext) -> list[Type]:
    t = _binary_type(ctx)
    if t.dtype != "i1":
        raise ShapeError(f"needs i1 operands, got {t.dtype}")
    return [t]


def _infer_unary(ctx: InferContext) -> list[Type]:
    return [ctx.tensor(0)]


def _infer_float_unary(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"needs a float operand, got {t}")
    return [t]


def _infer_numeric_unary(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    if t.dtype == "i1":
        raise ShapeError(f"needs a numeric operand, got {t}")
    return [t]


def _elementwise_flops(op: Operation) -> int:
    return op.result.tensor_type.num_elements() or 0


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # A zero divisor is an error only where a division happens: a result of no element (a
    # 3x0x2 operand broadcast against [0, 1]) divides nothing, as in the backends' loops.
    if np.any(b == 0) and 0 not in np.broadcast_shapes(a.shape, b.shape):
        raise FloatingPointError("integer division by zero")
    return np.floor_divide(a, b)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(x / 2)) never overflows, unlike 1 / (1 + exp(-x)).
    half = x.dtype.type(0.5)
    return half * (1 + np.tanh(half * x))


def _quiet(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def kernel(*args: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return f(*args)

    return kernel


def _elementwise(name: str, summary: str, arity: int, infer: Callable[[InferContext], list[Type]],
                 fn: Callable[..., np.ndarray], commutative: bool = False, inplace: int = 0,
                 may_fail: Callable[[Operation], bool] | None = None) -> None:
    operands = ("lhs", "rhs") if arity == 2 else ("x",) if arity == 1 else ("cond", "lhs", "rhs")
    register(OpSpec(
        name, summary, operands, infer,
        kernel=lambda op, *xs: fn(*xs),
        category="elementwise", commutative=commutative,
        inplace=inplace, gpu=True, flops=_elementwise_flops, may_fail=may_fail,
    ))


_elementwise("add", "a + b", 2, _infer_binary, np.add, commutative=True)
_elementwise("sub", "a - b", 2, _infer_numeric_binary, np.subtract)
_elementwise("mul", "a * b", 2, _infer_binary, np.multiply, commutative=True)
_elementwise("div", "a / b (floor division on integers)", 2, _infer_numeric_binary, _div,
             may_fail=lambda op: not op.operands[1].tensor_type.is_float)  # an integer zero divisor
_elementwise("pow", "a ** b", 2, _infer_float_binary, _quiet(np.power))
_elementwise("max", "elementwise maximum", 2, _infer_binary, np.maximum, commutative=True)
_elementwise("min", "elementwise minimum", 2, _infer_binary, np.minimum, commutative=True)
_elementwise("neg", "-x", 1, _infer_numeric_unary, np.negative)
_elementwise("abs", "|x|", 1, _infer_numeric_unary, np.abs)
_elementwise("exp", "e ** x", 1, _infer_float_unary, _quiet(np.exp))
_elementwise("log", "natural logarithm", 1, _infer_float_unary, _quiet(np.log))
_elementwise("tanh", "hyperbolic tangent", 1, _infer_float_unary, np.tanh)
_elementwise("sigmoid", "1 / (1 + exp(-x))", 1, _infer_float_unary, _sigmoid)
_elementwise("relu", "max(x, 0)", 1, _infer_numeric_unary, lambda x: np.maximum(x, x.dtype.type(0)))
_elementwise("sqrt", "square root", 1, _infer_float_unary, _quiet(np.sqrt))
_elementwise("sin", "sine (radians)", 1, _infer_float_unary, _quiet(np.sin))
_elementwise("cos", "cosine (radians)", 1, _infer_float_unary, _quiet(np.cos))
# The identity whose gradient is zero (jax.lax.stop_gradient): an op of its own, as nothing
# composed of the others blocks a cotangent; the backends compute it as a copy.
_elementwise("stop_gradient", "x, with no gradient flowing back through it", 1, _infer_unary, lambda x: x.copy())
for _name, _fn in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                   ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]:
    _elementwise(_name, f"comparison ({_fn.__name__}), gives i1", 2, _infer_compare, _fn)
_elementwise("and", "logical and of i1", 2, _infer_logical, np.logical_and, commutative=True)
_elementwise("or", "logical or of i1", 2, _infer_logical, np.logical_or, commutative=True)


def _infer_select(ctx: InferContext) -> list[Type]:
    if ctx.tensor(0).dtype != "i1":
        raise ShapeError(f"the condition must be i1, got {ctx.tensor(0)}")
    dtype = same_dtype(ctx, 1, 2)
    shape = broadcast_shapes(ctx.tensor(0).shape, ctx.tensor(1).shape, ctx.tensor(2).shape)
    return [TensorType(shape, dtype)]


_elementwise("select", "cond ? a : b", 3, _infer_select, np.where, inplace=1)


def _infer_cast(ctx: InferContext) -> list[Type]:
    (t,) = ctx.need_declared()
    src = ctx.tensor(0)
    if not refines(src.with_dtype(t.dtype), t) and not refines(t, src.with_dtype(t.dtype)):
        raise ShapeError(f"cannot change the shape from {src} to {t}")
    return [src.with_dtype(t.dtype)]


register(OpSpec("cast", "converts the dtype: `cast %x : tensor<4xf64>`", ("x",), _infer_cast, written_type=True,
                kernel=lambda op, x: x.astype(op.result.tensor_type.numpy_dtype),
                category="elementwise", gpu=True, flops=_elementwise_flops, same_type_is_identity=True))


# ---------------------------------------------------------------------------------------------
# Constants


def _literal_shape(value: Any) -> tuple[int, ...]:
    shape: list[int] = []
    while isinstance(value, (list, tuple)):
        shape.append(len(value))
        value = value[0] if value else 0.0
    return tuple(shape)


def _is_number_literal(value: Any) -> bool:
    """A number, true/false, or a list of them (nested): what the printer can write back."""
    if isinstance(value, (list, tuple)):
        return all(_is_number_literal(v) for v in value)
    return isinstance(value, (int, float))


def _infer_constant(ctx: InferContext) -> list[Type]:
    (t,) = ctx.need_declared()
    value = ctx.attrs["value"]
    if not _is_number_literal(value):
        raise ShapeError(f"the literal must be a number or a list of numbers, got {value!r}")
    is_list = isinstance(value, (list, tuple))
    if is_list and _literal_shape(value) != t.shape:
        raise ShapeError(f"the literal has shape {_literal_shape(value)} but the type is {t}")
    if not is_list and not t.is_static:
        raise ShapeError(f"a constant needs a static shape, got {t}")
    try:
        with np.errstate(over="raise"):  # a finite float too large for f32 would become inf
            np.array(value, dtype=t.numpy_dtype)
    except FloatingPointError:
        raise ShapeError(f"the literal does not fit {t.dtype} (write inf for an infinity)") from None
    except OverflowError as e:
        raise ShapeError(f"the literal does not fit {t.dtype} ({e})") from None
    except (ValueError, TypeError):
        if is_list:
            raise ShapeError("the literal is ragged or has non-numbers") from None
        raise ShapeError(f"the literal {value!r} does not fit {t.dtype}") from None
    return [t]


def _constant_kernel(op: Operation) -> np.ndarray:
    t = op.result.tensor_type
    return np.broadcast_to(np.array(op.attrs["value"], dtype=t.numpy_dtype), t.static_shape_at(op.loc)).copy()


def _constant_splat(op: Operation) -> Any | None:
    value = op.attrs["value"]
    return None if isinstance(value, (list, tuple)) else value


def splat_value(v: Value) -> Any | None:
    """The scalar every element of v equals, if a constant op (`OpSpec.splat`) made v; else None."""
    op = v.defining_op
    if op is None or op.spec.splat is None:
        return None
    return op.spec.splat(op)


register(OpSpec("constant", "a literal; a scalar literal fills the whole type",
                (), _infer_constant, kernel=_constant_kernel, attrs={"value": REQUIRED},
                category="constant", literal=True, gpu=True, splat=_constant_splat, written_type=True))


def _declared_type(ctx: InferContext) -> TensorType:
    (t,) = ctx.need_declared()
    if not t.is_static:
        raise ShapeError(f"needs a static shape, got {t}")
    return t


def _infer_declared(ctx: InferContext) -> list[Type]:
    return [_declared_type(ctx)]


register(OpSpec("zeros", "a tensor of zeros", (), _infer_declared, category="constant", gpu=True, written_type=True,
                splat=lambda op: 0,
                kernel=lambda op: np.zeros(op.result.tensor_type.shape, op.result.tensor_type.numpy_dtype)))
register(OpSpec("ones", "a tensor of ones", (), _infer_declared, category="constant", gpu=True, written_type=True,
                splat=lambda op: 1,
                kernel=lambda op: np.ones(op.result.tensor_type.shape, op.result.tensor_type.numpy_dtype)))


def _infer_fill(ctx: InferContext) -> list[Type]:
    t = _declared_type(ctx)
    if ctx.tensor(0).shape != () or ctx.tensor(0).dtype != t.dtype:
        raise ShapeError(f"fills with a scalar of the result's dtype, got {ctx.tensor(0)}")
    return [t]


register(OpSpec("fill", "a tensor filled with a scalar value", ("value",), _infer_fill, gpu=True,
                category="constant", splat=lambda op: splat_value(op.operands[0]), written_type=True,
                kernel=lambda op, v: np.full(op.result.tensor_type.shape, v, op.result.tensor_type.numpy_dtype)))


# ---------------------------------------------------------------------------------------------
# Linear algebra and layout


def _infer_matmul(ctx: InferContext) -> list[Type]:
    a, b = ctx.tensor(0), ctx.tensor(1)
    dtype = same_dtype(ctx, 0, 1)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"needs operands of rank >= 2, got {a} and {b}")
    ka, kb = a.shape[-1], b.shape[-2]
    if ka is not None and kb is not None and ka != kb:
        raise ShapeError(f"contraction sizes differ: {a} @ {b} ({ka} != {kb})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorType(batch + (a.shape[-2], b.shape[-1]), dtype)]


def _matmul_flops(op: Operation) -> int:
    a = op.operands[0].tensor_type
    out = op.result.tensor_type.num_elements() or 0
    return 2 * out * (a.shape[-1] or 0)


register(OpSpec("matmul", "matrix product (batched over leading dims)", ("lhs", "rhs"), _infer_matmul,
                kernel=lambda op, a, b: np.matmul(a, b), category="matmul", gpu=True, flops=_matmul_flops,
                reads_transposed=True, gemm_dtypes=("f32", "f64")))


def _transpose_perm(op_attrs: dict[str, Any], rank: int) -> list[int]:
    perm = op_attrs["perm"]
    if perm is None:
        return list(range(rank))[::-1]
    perm = _int_list(perm, "perm")
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"perm {perm} is not a permutation of {rank} axes")
    return perm


def _infer_transpose(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    perm = _transpose_perm(ctx.attrs, t.rank)
    return [t.with_shape(tuple(t.shape[p] for p in perm))]


def _transpose_view(op: Operation) -> int | None:
    """A 2-D transpose read only by GEMMs, which read a transposed operand as it is (their
    transpose flag). Integer products are no GEMM (no BLAS) and read the transpose's copy."""
    r = op.result
    t = r.tensor_type
    if t.rank != 2 or _transpose_perm(op.attrs, 2) != [1, 0]:
        return None  # perm = [0, 1] is a copy, not a transpose the GEMM's flag could stand for
    if r.uses and all(u.spec.reads_transposed and t.dtype in u.spec.gemm_dtypes for u, _ in r.uses):
        return 0
    return None


register(OpSpec("transpose", "permutes axes (default: reverses them)", ("x",), _infer_transpose,
                attrs={"perm": None}, category="layout", gpu=True, view=_transpose_view,
                kernel=lambda op, x: np.ascontiguousarray(np.transpose(x, _transpose_perm(op.attrs, x.ndim)))))


def _kept_list(value: Any, what: str) -> list[int | None]:
    """A list attribute whose entries are integers or `?` (None: a dim kept whole)."""
    if not isinstance(value, (list, tuple)) or not all(v is None or _is_int(v) for v in value):
        raise ShapeError(f"{what} must be a list of integers (or ?)")
    return list(value)


def reshape_dims(attrs: dict[str, Any], shape: tuple[Dim, ...]) -> list[Dim]:
    """`reshape`'s `shape` attribute on an input of `shape`: each `?` entry (None) replaced by
    the input's dim at that position (itself `?`, None, where unknown); -1 left to infer."""
    dims = _kept_list(attrs["shape"], "shape")
    for i, d in enumerate(dims):
        if d is None:
            if i >= len(shape):
                raise ShapeError(f"shape {format_dims(dims)}: `?` at position {i} keeps an input dim, but the input "
                                 f"has {len(shape)}")
            dims[i] = shape[i]
    return dims


def format_dims(dims: Sequence[int | None]) -> str:
    """[2, ?, -1]: an attribute list as the text writes it."""
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _infer_reshape(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    written = _kept_list(ctx.attrs["shape"], "shape")
    if written.count(-1) > 1 or any(d is not None and d < -1 for d in written):
        raise ShapeError(f"bad shape {format_dims(written)}")
    kept = {i for i, d in enumerate(written) if d is None}
    dims = reshape_dims(ctx.attrs, t.shape)
    # the kept dims are the same on both sides: the others hold the same number of elements
    rest_in = [d for i, d in enumerate(t.shape) if i not in kept]
    total = None if None in rest_in else math.prod(d for d in rest_in if d is not None)
    known = math.prod(d for i, d in enumerate(dims) if i not in kept and d != -1 and d is not None)
    if -1 in dims:
        at = dims.index(-1)
        if total is None:
            dims[at] = None
        elif known == 0 or total % known:
            raise ShapeError(f"cannot reshape {t} to {format_dims(written)}")
        else:
            dims[at] = total // known
    elif total is not None and known != total and kept:
        raise ShapeError(f"cannot reshape {t} to {format_dims(written)}: besides the kept dims, {total} elements "
                         f"against {known}")
    elif total is not None and known != total:
        raise ShapeError(f"cannot reshape {t} ({total} elements) to {format_dims(written)} ({known} elements)")
    return [t.with_shape(tuple(dims))]


register(OpSpec("reshape", "same elements, new shape (one dim may be -1, a `?` keeps the input's dim there)",
                ("x",), _infer_reshape, attrs={"shape": REQUIRED}, category="layout", gpu=True, view=lambda op: 0,
                shape_attrs=("shape",),
                kernel=lambda op, x: np.reshape(x, [-1 if d is None else d for d in reshape_dims(op.attrs, x.shape)])
                .copy()))  # on an array every dim is known: no None is left


def _infer_broadcast(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    shape = _shape_attr(ctx.attrs["shape"])
    if broadcast_shapes(t.shape, shape) != shape:
        raise ShapeError(f"cannot broadcast {t} to {list(shape)}")
    return [t.with_shape(shape)]


register(OpSpec("broadcast", "NumPy broadcast_to a shape", ("x",), _infer_broadcast,
                attrs={"shape": REQUIRED}, category="layout", gpu=True, same_type_is_identity=True,
                shape_attrs=("shape",), kernel=lambda op, x: np.broadcast_to(x, op.result.tensor_type.shape).copy()))


def _infer_concat(ctx: InferContext) -> list[Type]:
    ts = [ctx.tensor(i) for i in range(len(ctx.types))]
    if not ts:
        raise ShapeError("needs at least one operand")
    same_dtype(ctx, *range(len(ts)))
    rank = ts[0].rank
    if rank == 0 or any(t.rank != rank for t in ts):
        raise ShapeError("needs operands of one rank >= 1, got " + ", ".join(map(str, ts)))
    axis = norm_axis(ctx.attrs["axis"], rank)
    shape: list[Dim] = list(ts[0].shape)
    for t in ts[1:]:
        for i, (d, e) in enumerate(zip(shape, t.shape)):
            if i != axis and d is not None and e is not None and d != e:
                raise ShapeError("shapes differ off the concat axis: " + ", ".join(map(str, ts)))
    sizes = [t.shape[axis] for t in ts]
    shape[axis] = None if None in sizes else sum(s for s in sizes if s is not None)
    return [ts[0].with_shape(tuple(shape))]


register(OpSpec("concat", "joins tensors along an existing axis", ("inputs*",), _infer_concat,
                attrs={"axis": 0}, category="layout", gpu=True, same_type_is_identity=True, joins="axis",
                kernel=lambda op, *xs: np.concatenate(xs, axis=op.attrs["axis"])))


def slice_bounds(attrs: dict[str, Any], shape: tuple[Dim, ...]) -> list[tuple[int, Dim, int]]:
    """`slice`'s (start, limit, step) per axis of an input of `shape`; a limit written `?`
    (None) is the axis's size: the whole axis from start (itself None where the size is `?`)."""
    starts = _int_list(attrs["starts"], "starts")
    limits = _kept_list(attrs["limits"], "limits")
    steps = _int_list(attrs["steps"], "steps") if attrs["steps"] is not None else [1] * len(starts)
    if not len(starts) == len(limits) == len(steps) == len(shape):
        raise ShapeError(f"starts, limits and steps need one entry per axis ({len(shape)})")
    bounds: list[tuple[int, Dim, int]] = []
    for s, lim, st, d in zip(starts, limits, steps, shape):
        limit = d if lim is None else lim
        if st < 1 or s < 0 or (limit is not None and limit < s) or (d is not None and limit is not None and limit > d):
            shown = "?" if lim is None else lim
            raise ShapeError(f"slice [{s}:{shown}:{st}] is out of range for a dim of size {'?' if d is None else d}")
        bounds.append((s, limit, st))
    return bounds


def _infer_slice(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    bounds = slice_bounds(ctx.attrs, t.shape)
    return [t.with_shape(tuple(None if lim is None else -(-(lim - s) // st) for s, lim, st in bounds))]


def _slice_view(op: Operation) -> int | None:
    """A contiguous slice: every axis after the first cut one whole, steps 1."""
    src, out = op.operands[0].tensor_type.shape, op.result.tensor_type.shape
    steps = op.attrs["steps"] or [1] * len(src)
    cut = next((i for i, (o, d) in enumerate(zip(out, src)) if o != d), len(src))
    contiguous = (all(st == 1 for st in steps) and all(o == 1 for o in out[:cut])
                  and all(o == d for o, d in zip(out[cut + 1:], src[cut + 1:])))
    return 0 if contiguous else None


register(OpSpec("slice", "a strided box: `slice %x {starts = [0, 0], limits = [2, 4]}`", ("x",), _infer_slice,
                attrs={"starts": REQUIRED, "limits": REQUIRED, "steps": None}, category="layout", gpu=True,
                view=_slice_view, same_type_is_identity=True, shape_attrs=("limits",),
                kernel=lambda op, x: x[tuple(slice(s, lim, st) for s, lim, st in slice_bounds(op.attrs, x.shape))]
                .copy()))


def _infer_index(ctx: InferContext) -> list[Type]:
    t, i = ctx.tensor(0), ctx.tensor(1)
    if t.rank == 0:
        raise ShapeError("cannot index a scalar")
    if i.dtype not in INT_DTYPES:
        raise ShapeError(f"the index must be an integer scalar or tensor, got {i}")
    return [t.with_shape(i.shape + t.shape[1:])]


def _checked_rows(i: np.ndarray, rows: int, what: str) -> np.ndarray:
    """The indices as an int64 array; any outside [0, rows) is an error (no wrap-around)."""
    k = np.asarray(i, dtype=np.int64)
    bad = k[(k < 0) | (k >= rows)]
    if bad.size:
        raise IndexError(f"{what} {int(bad.flat[0])} is out of range for a leading dim of {rows}")
    return k


def _index_kernel(op: Operation, x: np.ndarray, i: np.ndarray) -> np.ndarray:
    return x[_checked_rows(i, x.shape[0], "index")].copy()


def _index_view(op: Operation) -> int | None:
    """One row (a scalar index) lies where it is in x; a gather of many rows is a copy."""
    return 0 if op.operands[1].tensor_type.rank == 0 else None


register(OpSpec("index", "x[i] on the leading axis: i an integer scalar (one row) or tensor (a gather of rows)",
                ("x", "index"), _infer_index, kernel=_index_kernel, category="layout", gpu=True,
                integer_operands=("index",), view=_index_view, may_fail=lambda op: True))  # an index out of range


def _infer_scatter_add(ctx: InferContext) -> list[Type]:
    base, i, updates = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    if base.rank == 0:
        raise ShapeError("cannot scatter into a scalar")
    if i.dtype not in INT_DTYPES:
        raise ShapeError(f"the index must be an integer scalar or tensor, got {i}")
    same_dtype(ctx, 0, 2)
    want = i.shape + base.shape[1:]
    if len(updates.shape) != len(want) or any(
            a is not None and b is not None and a != b for a, b in zip(updates.shape, want)):
        raise ShapeError(f"the updates must have the index's shape then the base's rows, "
                         f"{base.with_shape(want)}, got {updates}")
    return [base]


def _scatter_add_kernel(op: Operation, base: np.ndarray, i: np.ndarray, updates: np.ndarray) -> np.ndarray:
    out = base.copy()
    np.add.at(out, _checked_rows(i, base.shape[0], "scatter_add index"), updates)  # repeated rows accumulate
    return out


register(OpSpec("scatter_add", "base with updates[j] added to row i[j] (repeated rows accumulate): "
                "the transpose of `index`", ("base", "index", "updates"), _infer_scatter_add,
                kernel=_scatter_add_kernel, category="layout", gpu=True, integer_operands=("index",),
                inplace=0, flops=lambda op: op.operands[2].tensor_type.num_elements() or 0,
                may_fail=lambda op: True))  # an index out of range


def _infer_stack(ctx: InferContext) -> list[Type]:
    ts = [ctx.tensor(i) for i in range(len(ctx.types))]
    if not ts:
        raise ShapeError("needs at least one operand")
    if any(t != ts[0] for t in ts):
        raise ShapeError("needs operands of one type, got " + ", ".join(map(str, ts)))
    axis = norm_axis(ctx.attrs["axis"], ts[0].rank + 1)
    shape = list(ts[0].shape)
    shape.insert(axis, len(ts))
    return [ts[0].with_shape(tuple(shape))]


register(OpSpec("stack", "joins tensors along a new axis", ("inputs*",), _infer_stack,
                attrs={"axis": 0}, category="layout", gpu=True, joins="new-axis",
                kernel=lambda op, *xs: np.stack(xs, axis=op.attrs["axis"])))


# ---------------------------------------------------------------------------------------------
# Reductions


def reduction_axes(attrs: dict[str, Any], rank: int) -> list[int]:
    axes = attrs["axes"]
    if axes is None:
        return list(range(rank))
    out = sorted({norm_axis(a, rank) for a in _int_list(axes, "axes")})
    return out


def _infer_reduce(ctx: InferContext) -> list[Type]:
    t = ctx.tensor(0)
    axes = reduction_axes(ctx.attrs, t.rank)
    if ctx.spec.name == "mean" and not t.is_float:
        raise ShapeError(f"needs a float operand, got {t}")
    if t.dtype == "i1":
        raise ShapeError(f"cannot reduce i1 values; cast them first, got {t}")
    if _bool_attr(ctx.attrs, "keepdims"):
        shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    return [t.with_shape(shape)]


def _reduction(name: str, summary: str, fn: Callable[..., np.ndarray], reduction: Reduction,
               alias: str | None = None) -> None:
    def kernel(op: Operation, x: np.ndarray) -> np.ndarray:
        axes = tuple(reduction_axes(op.attrs, x.ndim))
        return np.asarray(fn(x, axis=axes, keepdims=op.attrs["keepdims"]), dtype=x.dtype)

    def may_fail(op: Operation) -> bool:
        """A reduction with no value over no element, over an axis that is or may be empty."""
        shape = op.operands[0].tensor_type.shape
        return reduction.empty_is_error and any(shape[a] in (0, None) for a in reduction_axes(op.attrs, len(shape)))

    register(OpSpec(name, summary, ("x",), _infer_reduce, kernel=kernel,
                    attrs={"axes": None, "keepdims": False}, category="reduction", gpu=True, reduction=reduction,
                    one_argument_alias=alias, may_fail=may_fail,
                    flops=lambda op: op.operands[0].tensor_type.num_elements() or 0))


_reduction("sum", "sum over axes (all by default)", np.sum, Reduction("add", 0.0))
_reduction("mean", "mean over axes (all by default)", np.mean, Reduction("add", 0.0, divide_by_count=True))
_reduction("reduce_max", "maximum over axes (surface: max(%x))", np.max,
           Reduction("max", -math.inf, empty_is_error=True), alias="max")
_reduction("reduce_min", "minimum over axes (surface: min(%x))", np.min,
           Reduction("min", math.inf, empty_is_error=True), alias="min")


def _logsumexp(x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log(sum(exp(x))) with the maximum shifted out, so no exp overflows or underflows to an
    all-zero sum; an all -inf slice (or an empty one) gives -inf, a +inf element +inf."""
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.sum(np.exp(x - shift), axis=axes, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axes)


def _infer_logsumexp(ctx: InferContext) -> list[Type]:
    if not ctx.tensor(0).is_float:
        raise ShapeError(f"needs a float operand, got {ctx.tensor(0)}")
    return _infer_reduce(ctx)


register(OpSpec("logsumexp", "log(sum(exp(x))) over axes (all by default), computed without overflow",
                ("x",), _infer_logsumexp, attrs={"axes": None, "keepdims": False}, category="reduction", gpu=True,
                kernel=lambda op, x: np.asarray(
                    _logsumexp(x, tuple(reduction_axes(op.attrs, x.ndim)), op.attrs["keepdims"]), dtype=x.dtype),
                flops=lambda op: 3 * (op.operands[0].tensor_type.num_elements() or 0)))


# ---------------------------------------------------------------------------------------------
# Structure: functions, loops, variables. Their kernels need the interpreter (see interpreter.py).


def _all_tensors(ctx: InferContext) -> None:
    """Every operand is a tensor: a variable (pre-SSA `var`) is read with `load` first."""
    for i in range(len(ctx.types)):
        ctx.tensor(i)


def _no_results(ctx: InferContext) -> list[Type]:
    _all_tensors(ctx)  # `yield () stack (%v)` of a variable %v: a located error, not an assertion in the loop's rule
    return []


def _infer_declared_any(ctx: InferContext) -> list[Type]:
    _all_tensors(ctx)
    if ctx.declared is None:
        raise ShapeError("needs its result types written after ':'")
    return list(ctx.declared)


register(OpSpec("return", "ends a function: `return %a, %b`", ("values*",), _no_results,
                pure=False, terminator=True, category="structural", own_syntax=True))
register(OpSpec("yield", "ends a loop body: `yield (%carry, ...) stack (%v, ...)`", ("carries*", "stacks*"),
                _no_results, pure=False, terminator=True, category="structural", own_syntax=True))
def _grad_results(op: Operation, args: Sequence[Type], results: Sequence[Type]) -> list[Type]:
    """The callee's results (the first the scalar that is differentiated, the others auxiliary
    values passed through, as `jax.grad(has_aux=True)`), then one gradient per `wrt` position,
    typed as that argument."""
    return list(results) + [args[p] for p in op.attrs["wrt"]]


register(OpSpec("call", "calls a function: `call @f(%a, %b) : tensor<f32>`", ("args*",), _infer_declared_any,
                attrs={"callee": REQUIRED}, category="structural",
                callee_results=lambda op, args, results: list(results), own_syntax=True,
                # The callee's body is not a region of the call: an op there may fail, so an
                # unused call stays until inline exposes its ops, which then have their own facts.
                may_fail=lambda op: True))
register(OpSpec("grad", "f's results (the first a scalar) and the first's gradients wrt the listed argument positions",
                ("args*",), _infer_declared_any, attrs={"callee": REQUIRED, "wrt": REQUIRED},
                category="structural", callee_results=_grad_results, own_syntax=True,
                may_fail=lambda op: True))  # runs the callee, as `call` does


def _infer_var(ctx: InferContext) -> list[Type]:
    (t,) = ctx.need_declared()
    return [VarType(t)]


def _infer_load(ctx: InferContext) -> list[Type]:
    t = ctx.types[0]
    if not isinstance(t, VarType):
        raise ShapeError("loads from a variable made by 'var'")
    return [t.held]


def _infer_store(ctx: InferContext) -> list[Type]:
    var, value = ctx.types
    if not isinstance(var, VarType):
        raise ShapeError("stores into a variable made by 'var'")
    if value != var.held:
        raise ShapeError(f"the variable holds {var.held} but the value is {value}")
    return []


register(OpSpec("var", "a mutable variable (pre-SSA): `%h = var : tensor<4xf32>`", (), _infer_var,
                pure=False, category="structural", pre_ssa=True))
register(OpSpec("load", "reads a variable (pre-SSA)", ("var",), _infer_load, pure=False, category="structural",
                pre_ssa=True, variable_operands=("var",)))
register(OpSpec("store", "writes a variable (pre-SSA): `store %h, %v`", ("var", "value"), _infer_store,
                pure=False, category="structural", pre_ssa=True, variable_operands=("var",)))


def loop_trip_count(ctx_seq_types: Sequence[Type], length: int | None) -> Dim:
    """The number of steps of a scan/for: the sequences' shared leading dim or `length`."""
    dims: set[Dim] = set()
    for t in ctx_seq_types:
        if not isinstance(t, TensorType) or t.rank == 0:
            raise ShapeError(f"a sequence must be a tensor of rank >= 1, got {t}")
        dims.add(t.shape[0])
    known = {d for d in dims if d is not None}
    if length is not None:
        known.add(length)
    if len(known) > 1:
        raise ShapeError(f"sequence lengths and 'length' disagree: {sorted(known)}")
    if known:
        return known.pop()
    if not dims:
        raise ShapeError("a loop with no sequence needs 'length N'")
    return None


def _infer_loop(ctx: InferContext) -> list[Type]:
    seqs = ctx.group("sequences")
    inits = ctx.group("inits") if ctx.spec.has_operand_group("inits") else []
    steps = loop_trip_count(seqs, ctx.attrs["length"])
    block = ctx.regions[0].block if ctx.regions else None
    if block is None:
        raise ShapeError("needs a body")
    expected = [t.with_shape(t.shape[1:]) for t in seqs] + list(inits)  # type: ignore[union-attr]
    got = [a.type for a in block.args]
    if got != expected:
        raise ShapeError("block arguments " + ", ".join(map(str, got)) + " do not match the sequence elements"
                         " and carries " + ", ".join(map(str, expected)))
    term = block.terminator
    if term is None or term.name != "yield":
        raise ShapeError("the body must end with 'yield'")
    carries = [v.type for v in term.group("carries")]
    if carries != list(inits):
        raise ShapeError("yielded carries " + ", ".join(map(str, carries)) + " do not match the initial values "
                         + ", ".join(map(str, inits)))
    stacks = [v.tensor_type for v in term.group("stacks")]
    return list(inits) + [TensorType((steps,) + t.shape, t.dtype) for t in stacks]


def _loop_arg_types(ctx: InferContext) -> list[Type]:
    seqs = [ctx.tensor(i) for i in range(*_span(ctx, "sequences"))]
    inits = ctx.group("inits") if ctx.spec.has_operand_group("inits") else []
    return [t.with_shape(t.shape[1:]) for t in seqs] + list(inits)


def _span(ctx: InferContext, name: str) -> tuple[int, int]:
    start, size = ctx.spec.segment_range(len(ctx.types), ctx.segments, name)
    return start, start + size


register(OpSpec("scan", "a loop with sequences, carries and stacked outputs (as jax.lax.scan)",
                ("sequences*", "inits*"), _infer_loop, attrs={"reverse": False, "length": None},
                num_regions=1, category="structural", loop=True, region_arg_types=_loop_arg_types,
                block_args=("elements*=sequences", "carries*=inits"),
                results=("finals*=inits", "stacks*=yield.stacks"), own_syntax=True))
register(OpSpec("for", "a pre-SSA loop over sequences; the body may load and store variables",
                ("sequences*",), _infer_loop, attrs={"reverse": False, "length": None},
                num_regions=1, pure=False, category="structural", loop=True, pre_ssa=True,
                region_arg_types=_loop_arg_types,
                block_args=("elements*=sequences",), results=("stacks*=yield.stacks",), own_syntax=True))
def _infer_fused(ctx: InferContext) -> list[Type]:
    block = ctx.regions[0].block if ctx.regions else None
    if block is None:
        raise ShapeError("needs a body")
    if [a.type for a in block.args] != ctx.types:
        raise ShapeError("block arguments do not match the inputs")
    term = block.terminator
    if term is None or term.name != "yield" or term.group("stacks"):
        raise ShapeError("the body must end with 'yield (...)' and stack nothing")
    for op in block:
        if op is not term and op.spec.category not in ("elementwise", "constant"):
            raise ShapeError(f"only elementwise ops may be fused, not '{op.name}'")
    results = [v.type for v in term.group("carries")]
    if not results:
        raise ShapeError("yields nothing: a fused group runs over the shape of its results, so it needs one")
    return results


register(OpSpec("fused", "elementwise ops run as one loop nest: `fused (%a = %x) { ... yield (%r) }`",
                ("inputs*",), _infer_fused, num_regions=1, category="structural", gpu=True,
                region_arg_types=lambda ctx: list(ctx.types),
                block_args=("inputs*=inputs",), results=("outputs*=yield.carries",), own_syntax=True))
register(OpSpec("transfer", "moves a tensor to a device: `transfer %x {device = \"gpu\"}`", ("x",),
                _infer_unary, attrs={"device": REQUIRED}, category="layout", kernel=lambda op, x: x,
                view=lambda op: 0, moves_device=True))


def _install_vjps() -> None:
    from .vjp import install

    install(REGISTRY)


_install_vjps()


def _install_scalar_semantics() -> None:
    from .scalar import install

    install(REGISTRY)


_install_scalar_semantics()


ONE_ARGUMENT_ALIASES: dict[str, str] = {s.one_argument_alias: n for n, s in REGISTRY.items() if s.one_argument_alias}
"""Function name called with one argument -> the op it means (`max(%x)` -> `reduce_max`)."""
