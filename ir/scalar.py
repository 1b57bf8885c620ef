"""Elementwise scalar semantics: what each elementwise op computes on one element, described
once as a small expression over primitives that both backends emit directly.

    relu on floats:  select(or(gt(x0, 0.0), ne(x0, x0)), x0, 0.0)     a nan stays nan
    add on i1:       or(x0, x1)                                        NumPy's + on booleans

`install` puts each op's description in its spec's `scalar` field (as ir/vjp.py installs VJPs);
the CPU backend (backend/cpu/lower/elementwise.py) and the GPU backend (backend/gpu/kernels.py) each keep
only a table from primitive to emitter (LLVM builder calls; Python expression text) and build
every elementwise op, and the CPU's reduction loops, from these descriptions. The NumPy
interpreter (the kernels in ir/ops.py) does not read them: it stays an independent oracle, and
tests/test_scalar_semantics.py checks both backends against it on edge values.

Terms.
- *Dtype class*: `float` (f32, f64), `int` (i32, i64) or `bool` (i1). An op has one
  description per class it accepts (its type rule says which).
- *Compute dtype*: the dtype of the operand that picks the class, operand 0 or `select`'s
  lhs (`ScalarSemantics.dtype_operand`). Literals have the compute dtype, and so do the
  operands of every primitive but `select`'s condition and `and`/`or` (i1).
- *Primitives* (`PRIMITIVES`), on the compute dtype:
  `add sub mul neg`       wrapping on integers, IEEE on floats;
  `div`                   float division (x / 0 is +-inf or nan);
  `floordiv`              integer floor division (NumPy's `//`); a zero divisor flags a run-time
                          error (the runtime raises, as the interpreter does) and gives 0;
  `lt le gt ge eq ne`     comparisons giving i1: on floats false when either side is nan, but
                          `ne` true; signed on integers; false < true on i1;
  `and or`                on i1;
  `select`                select(cond, a, b) is a where cond holds, else b;
  `exp log tanh sqrt pow abs sin cos`
                          float math with IEEE edge results: exp overflows to inf, log(0) is
                          -inf, log and sqrt of a negative are nan; `abs` clears the sign bit;
  `cast`                  to the op's result dtype (float -> int truncates, x -> i1 is x != 0).
  A backend implements each as it likes (the CPU's float32 exp and tanh are vectorisable
  polynomials; the GPU guards math that raises in Python), as long as the results agree.

Known gaps: a float -> int cast of nan or inf has no defined result (NumPy warns and gives the
integer minimum; the backends give what their conversion gives).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .types import FLOAT_DTYPES, INT_DTYPES

if TYPE_CHECKING:
    from .core import Operation


@dataclass(frozen=True)
class Arg:
    """The op's operand `index`, as one element."""

    index: int

    def __str__(self) -> str:
        return f"x{self.index}"


@dataclass(frozen=True)
class Lit:
    """A literal of the compute dtype."""

    value: float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Prim:
    """A primitive (`PRIMITIVES`) applied to sub-expressions."""

    name: str
    args: tuple[Expr, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


Expr = Arg | Lit | Prim

PRIMITIVES: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "neg": 1, "floordiv": 2,
    "lt": 2, "le": 2, "gt": 2, "ge": 2, "eq": 2, "ne": 2,
    "and": 2, "or": 2, "select": 3,
    "exp": 1, "log": 1, "tanh": 1, "sqrt": 1, "pow": 2, "abs": 1, "sin": 1, "cos": 1,
    "cast": 1,
}
"""Every primitive and its arity (the module docstring says what each computes)."""

COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
APPROXIMATE = frozenset(("exp", "log", "tanh", "sqrt", "pow", "sin", "cos"))
"""Primitives a backend may compute within a few ulp of NumPy (the CPU's float32 polynomials);
every other primitive is exact, signed zeros included."""


def _prim(name: str) -> Callable[..., Prim]:
    def make(*args: Expr | float) -> Prim:
        assert len(args) == PRIMITIVES[name], name
        return Prim(name, tuple(a if isinstance(a, (Arg, Lit, Prim)) else Lit(a) for a in args))

    return make


add, sub, mul, div, neg, floordiv = (_prim(n) for n in ("add", "sub", "mul", "div", "neg", "floordiv"))
lt, le, gt, ge, eq, ne = (_prim(n) for n in COMPARISONS)
and_, or_, select = _prim("and"), _prim("or"), _prim("select")
exp, log, tanh, sqrt, pow_, abs_ = (_prim(n) for n in ("exp", "log", "tanh", "sqrt", "pow", "abs"))
sin, cos = _prim("sin"), _prim("cos")
cast = _prim("cast")

x0, x1, x2 = Arg(0), Arg(1), Arg(2)


def dtype_class(dtype: str) -> str:
    """float, int or bool."""
    return "float" if dtype in FLOAT_DTYPES else "int" if dtype in INT_DTYPES else "bool"


@dataclass(frozen=True)
class ScalarSemantics:
    """One elementwise op's semantics on one element: an expression per dtype class."""

    by_class: Mapping[str, Expr]
    """Dtype class -> the expression; a class the op does not accept is absent."""
    dtype_operand: int = 0
    """The operand whose dtype is the compute dtype (`select`: 1, its lhs)."""

    def compute_dtype(self, op: Operation) -> str:
        return op.operands[self.dtype_operand].tensor_type.dtype

    def expr(self, dtype: str) -> Expr | None:
        """The expression on compute dtype `dtype`, or None when the op does not take it."""
        return self.by_class.get(dtype_class(dtype))

    def approximate(self, dtype: str) -> bool:
        """Whether the result on `dtype` may differ from NumPy's by a few ulp (it uses an
        APPROXIMATE primitive)."""
        expr = self.expr(dtype)
        return expr is not None and _uses(expr, APPROXIMATE)


def _uses(expr: Expr, names: frozenset[str]) -> bool:
    return isinstance(expr, Prim) and (expr.name in names or any(_uses(a, names) for a in expr.args))


# ---------------------------------------------------------------------------------------------
# The descriptions. NumPy's maximum(a, b) is `a > b or isnan(a) ? a : b` (so maximum(-0.0, 0.0)
# is 0.0, and a nan on either side is the result); on i1, + and maximum are `or`, * and
# minimum are `and`.

_ARITHMETIC = {"add": add(x0, x1), "sub": sub(x0, x1), "mul": mul(x0, x1), "neg": neg(x0)}
_EVERY_CLASS = {**{c: _prim(c)(x0, x1) for c in COMPARISONS}, "select": select(x0, x1, x2), "cast": cast(x0)}

FLOAT: dict[str, Expr] = {
    **_ARITHMETIC, **_EVERY_CLASS,
    "div": div(x0, x1),
    "pow": pow_(x0, x1),
    "max": select(or_(gt(x0, x1), ne(x0, x0)), x0, x1),
    "min": select(or_(lt(x0, x1), ne(x0, x0)), x0, x1),
    "abs": abs_(x0),
    "exp": exp(x0),
    "log": log(x0),
    "tanh": tanh(x0),
    "sqrt": sqrt(x0),
    "sin": sin(x0),
    "cos": cos(x0),
    "stop_gradient": x0,
    # exp(-x) overflowing to inf gives 0, as it should. (The interpreter's 0.5 * (1 + tanh(x / 2))
    # is the same function; this form costs one exp where tanh costs an exp and a polynomial.)
    "sigmoid": div(1.0, add(1.0, exp(neg(x0)))),
    "relu": select(or_(gt(x0, 0.0), ne(x0, x0)), x0, 0.0),
}
INT: dict[str, Expr] = {
    **_ARITHMETIC, **_EVERY_CLASS,
    "div": floordiv(x0, x1),
    "max": select(gt(x0, x1), x0, x1),
    "min": select(lt(x0, x1), x0, x1),
    "abs": select(lt(x0, 0), neg(x0), x0),
    "relu": select(gt(x0, 0), x0, 0),
    "stop_gradient": x0,
}
BOOL: dict[str, Expr] = {
    **_EVERY_CLASS,
    "add": or_(x0, x1),
    "mul": and_(x0, x1),
    "max": or_(x0, x1),
    "min": and_(x0, x1),
    "and": and_(x0, x1),
    "or": or_(x0, x1),
    "stop_gradient": x0,
}
BY_CLASS = {"float": FLOAT, "int": INT, "bool": BOOL}


def semantics(name: str) -> ScalarSemantics | None:
    """The description of op kind `name`, or None when no class describes it."""
    by_class = {cls: table[name] for cls, table in BY_CLASS.items() if name in table}
    if not by_class:
        return None
    return ScalarSemantics(by_class, dtype_operand=1 if name == "select" else 0)


def install(registry: dict[str, Any]) -> None:
    """Fills `OpSpec.scalar` of every elementwise op kind."""
    for name, spec in registry.items():
        if spec.is_elementwise:
            registry[name] = replace(spec, scalar=semantics(name))


# ---------------------------------------------------------------------------------------------
# Building a description with a backend's emitters

T = TypeVar("T")


def build(expr: Expr, args: Sequence[T], literal: Callable[[float], T], primitive: Callable[[str, list[T]], T]) -> T:
    """expr over the operands `args`, made with the backend's literal and primitive emitters;
    a sub-expression used twice is made once."""
    made: dict[Expr, T] = {}

    def make(e: Expr) -> T:
        found = made.get(e)
        if found is not None:
            return found
        match e:
            case Arg(index):
                out = args[index]
            case Lit(value):
                out = literal(value)
            case Prim(name, operands):
                out = primitive(name, [make(o) for o in operands])
        made[e] = out
        return out

    return make(expr)
