"""The frontend's AST: what the parser's transformer builds and `emitter.py` turns into IR.

One frozen dataclass per grammar rule that means something (rules that only group, like
`targets` or `expr_list`, become tuples). Nodes hold the Lark `Token`s they were read from:
a token is the name's text (`str(token)` is `%x`, `@f`, `tanh`, `+`) and its line and column.
The file name is not in the tree: the emitter, which knows which file it is emitting, makes
`Location`s from tokens, so one parser (built once, ~0.3 s) serves every file and thread. A
written `loc("file":line:col)` is kept as the `Location` it spells.

    grammar rule (grammar.lark)                 node
    func                                        Func(name, params, result_types, body, loc)
    param                                       Param(name, type, loc)
    assign         %a, %b = rhs                 Assign(targets, value, loc)
    bare_op        store %v, %x                 BareOp(op, loc)
    return_stmt    return %a, %b                Return(keyword, values, loc)
    for_stmt       for %x in %xs, ... { }       For(keyword, sequences, body)
    collect_stmt   collect e into %ys           Collect(keyword, value, into)
    yield_stmt     yield (%h) stack (%y)        Yield(keyword, carries, stacks, loc)
    seq_bind / surface_seq   %x in %xs          SeqBind(element, sequence)
    carry_bind     %h = %h0                     Binding(name, value)
  op forms (right-hand sides):
    generic        add %a, %b {k = v} : T       Generic(name, operands, literal, attrs, types)
    call_op        call @f(%a) : T              Call(keyword, callee, args, types)
    grad_op        grad @f(e) wrt (%a, 1)       Grad(keyword, callee, args, wrt, types)
    loop_op        scan reverse (...) carry(...) { }   Loop(keyword, reverse, length, sequences,
                                                      carries, body, yield_, types)
    fused_op       fused (%a = %x) { }          Fused(keyword, inputs, body, yield_, types)
  surface expressions:
    name_ref       %x                           Name(token)
    number_ref     1.5, 2, inf, nan             Num(value, token)
    binary         a + b, a @ b                 Binary(op, lhs, rhs)
    negate         -a                           Neg(minus, operand)
    builtin_call   tanh(a), sum(a, axis=0)      Builtin(name, args, kwargs)
    func_call      @f(a, b)                     FuncCall(callee, args)

Attribute values and op literals (`{axis = 0}`, `constant [1, 2]`) are plain Python values;
types are parsed `TensorType`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import Location
from ..ir.types import TensorType
from .tokens import Token

Types = tuple[TensorType, ...]


# -- expressions ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Name:
    """A use of a named value, `%x`."""

    token: Token


@dataclass(frozen=True, slots=True)
class Num:
    """A number written in place; it takes its dtype from the operands around it."""

    value: int | float
    token: Token | None
    """None for `inf` and `nan` (Lark keeps no token for a matched keyword)."""


@dataclass(frozen=True, slots=True)
class Binary:
    """`lhs op rhs` for op in + - * / @; a sum of n terms is a left-deep chain n levels deep."""

    op: Token
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Neg:
    minus: Token
    operand: Expr


@dataclass(frozen=True, slots=True)
class Builtin:
    """`tanh(a)`, `sum(a, axis=0)`: an op from the registry called like a function."""

    name: Token
    args: tuple[Expr, ...]
    kwargs: dict[str, Any]
    """Attributes given as `name=value`, in the order written."""


@dataclass(frozen=True, slots=True)
class FuncCall:
    """`@f(a, b)`: a call of a function of this module in surface form."""

    callee: Token
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Kwarg:
    """`name=value` among a builtin's arguments; only `Builtin.kwargs` keeps them."""

    name: Token
    value: Any


Expr = Name | Num | Binary | Neg | Builtin | FuncCall


# -- op forms (the SSA form the printer prints; also valid on a right-hand side) ---------------

@dataclass(frozen=True, slots=True)
class Generic:
    """`name [literal] operands {attrs} : types`, any op of the registry."""

    name: Token
    operands: tuple[Token, ...]
    literal: Any
    """The value written before the operands (`constant 1.0`), or None."""
    attrs: dict[str, Any]
    types: Types | None
    """The written result types, or None when none are written."""


@dataclass(frozen=True, slots=True)
class Call:
    keyword: Token
    callee: Token
    args: tuple[Token, ...]
    types: Types | None


@dataclass(frozen=True, slots=True)
class Grad:
    """`grad @f(args) wrt (items)`: an item is an argument's name (`%w`) or position (`0`)."""

    keyword: Token
    callee: Token
    args: tuple[Expr, ...]
    wrt: tuple[Token, ...]
    types: Types | None


@dataclass(frozen=True, slots=True)
class SeqBind:
    """`%x in %xs`: a loop body's `element` takes each slice of `sequence` along its first axis."""

    element: Token
    sequence: Token


@dataclass(frozen=True, slots=True)
class Binding:
    """`%name = %value`: a scan carry and its initial value, or a fused op's block argument and
    the outer value it stands for."""

    name: Token
    value: Token


@dataclass(frozen=True, slots=True)
class Yield:
    """`yield (carries) stack (stacks)`, the end of a scan, for or fused body."""

    keyword: Token
    carries: tuple[Token, ...]
    stacks: tuple[Token, ...]
    loc: Location | None


@dataclass(frozen=True, slots=True)
class Loop:
    """A `scan` or `for` op written with its region (the op form of a loop)."""

    keyword: Token
    """`scan` or `for`."""
    reverse: bool
    length: int | None
    """The written trip count, for a loop over no sequences."""
    sequences: tuple[SeqBind, ...]
    carries: tuple[Binding, ...]
    body: tuple[Stmt, ...]
    yield_: Yield
    types: Types | None


@dataclass(frozen=True, slots=True)
class Fused:
    keyword: Token
    inputs: tuple[Binding, ...]
    body: tuple[Stmt, ...]
    yield_: Yield
    types: Types | None


OpForm = Generic | Call | Grad | Loop | Fused
Rhs = Expr | OpForm


# -- statements and functions ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Assign:
    targets: tuple[Token, ...]
    value: Rhs
    loc: Location | None
    """A written `loc(...)`: the ops of the right-hand side take it instead of their tokens'."""


@dataclass(frozen=True, slots=True)
class BareOp:
    """An op whose results are not named (`store %v, %x`, a `for` or `fused` op yielding nothing)."""

    op: Generic | Loop | Fused
    loc: Location | None


@dataclass(frozen=True, slots=True)
class Return:
    keyword: Token
    values: tuple[Expr, ...]
    loc: Location | None


@dataclass(frozen=True, slots=True)
class For:
    """The surface loop, `for %x in %xs, %y in %ys { ... collect e into %zs }`."""

    keyword: Token
    sequences: tuple[SeqBind, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Collect:
    """`collect e into %ys`: %ys, after the surface loop, stacks e of every iteration."""

    keyword: Token
    value: Expr
    into: Token


Stmt = Assign | BareOp | Return | For | Collect
"""A `Yield` is no statement: the grammar lets it only end a region body (`Loop.yield_`)."""


@dataclass(frozen=True, slots=True)
class Param:
    name: Token
    type: TensorType
    loc: Location | None


@dataclass(frozen=True, slots=True)
class Func:
    name: Token
    """`@f`."""
    params: tuple[Param, ...]
    result_types: Types | None
    """None when no `-> ...` is written (the function returns nothing)."""
    body: tuple[Stmt, ...]
    """The statements; the last is the `Return`."""
    loc: Location | None
