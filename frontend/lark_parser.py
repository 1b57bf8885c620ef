"""The Lark LALR parser of grammar.lark: the specification of gir's text syntax, and the parser of
everything the hand-written one (fast_parser.py) declines -- so the source of every syntax
error message. Its inline transformer builds the typed AST of `ast.py` as rules reduce (no parse
tree is built, then walked again).

This module is imported only when Lark is needed (parser.py imports it lazily): importing Lark,
with interegular and regex, is a sizeable part of a `gir opt` start-up that reads valid text.

The parser is built once per process (`_parser()`; its tables are not cached on disk) and
holds no state of one parse, so threads may parse at once: the transformer sees no file name
(nodes keep tokens, and the emitter makes `Location`s with the file it emits), and the one
error it raises, a parameter with several types, carries a token that `lark_parse()` turns
into a location in its own file.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, cast

from lark import Lark, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import GirSyntaxError, Location
from ..ir.types import parse_type
from . import ast
from .hints import numpy_hint
from .lexer import GirLexer
from .tokens import Token, unescape


def parse_types(token: str) -> ast.Types:
    """`: tensor<4xf32>, tensor<f32>` (one TYPES token) -> types."""
    return tuple(parse_type(t.strip()) for t in token[1:].split(","))


def _int(tok: Token, digits: str | None = None) -> int:
    """An integer literal (or the `digits` of one inside tok: a loc's line); past Python's digit
    limit no dtype, position or line number could be that large anyway."""
    try:
        return int(tok if digits is None else digits)
    except ValueError:
        shown = _short(tok) if digits is None else f"{digits[:10]}... ({len(digits)} digits)"
        raise _TokenError(f"the integer literal {shown} is too large for any integer dtype", tok) from None


def _short(tok: Token) -> str:
    text = str(tok)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-6:]} ({len(text)} characters)"


class _TokenError(Exception):
    """A syntax error found by the transformer, at `token` of the file being parsed. The
    transformer is shared by all parses, so `parse_ast()` adds the file name."""

    def __init__(self, message: str, token: Token):
        super().__init__(message)
        self.message = message
        self.token = token


class _ToAst(Transformer):
    """One method per grammar rule; each returns an `ast` node, or for a rule that only
    groups (`targets`, `expr_list`, ...) a tuple, or a plain Python value for attributes."""

    def start(self, c: list) -> list[ast.Func]:
        return c

    def func(self, c: list) -> ast.Func:
        name, params, results, *body = c
        loc = body.pop() if isinstance(body[-1], Location) else None
        return ast.Func(name, params, results, tuple(body), loc)

    def params(self, c: list) -> tuple[ast.Param, ...]:
        return tuple(c)

    def param(self, c: list) -> ast.Param:
        types = parse_types(c[1])
        if len(types) != 1:
            raise _TokenError(f"parameter {c[0]} has {len(types)} types", c[1])
        return ast.Param(c[0], types[0], c[2] if len(c) > 2 else None)

    def results(self, c: list) -> ast.Types | None:
        return c[0] if c else None

    def result_types(self, c: list) -> ast.Types:
        return tuple(parse_type(t) for t in c)

    def assign(self, c: list) -> ast.Assign:
        return ast.Assign(c[0], c[1], c[2] if len(c) > 2 else None)

    def targets(self, c: list) -> tuple[Token, ...]:
        return tuple(c)

    def bare_op(self, c: list) -> ast.BareOp:
        return ast.BareOp(c[0], c[1] if len(c) > 1 else None)

    def generic(self, c: list) -> ast.Generic:
        operands: tuple[Token, ...] = ()
        literal, attrs, types = None, {}, None
        # The parts after the name tell themselves apart by type: a literal is never a tuple,
        # a dict or a token (it is a number, a bool or a list).
        for part in c[1:]:
            if isinstance(part, tuple):
                operands = part
            elif isinstance(part, dict):
                attrs = part
            elif isinstance(part, Token) and part.type == "TYPES":
                types = parse_types(part)
            else:
                literal = part
        return ast.Generic(c[0], operands, literal, attrs, types)

    def operands(self, c: list) -> tuple[Token, ...]:
        return tuple(c)

    def type_suffix(self, c: list) -> ast.Types:
        return parse_types(c[0])

    def call_op(self, c: list) -> ast.Call:
        return ast.Call(c[0], c[1], c[2], c[3] if len(c) > 3 else None)

    def grad_op(self, c: list) -> ast.Grad:
        keyword, callee, args, *rest = c
        types = rest.pop() if rest and isinstance(rest[-1], tuple) else None  # wrt items are tokens
        for item in rest:
            if item.type == "INT":
                _int(item)  # a position of 5,000 digits: a located error here, not a ValueError in the emitter
        return ast.Grad(keyword, callee, args, tuple(rest), types)

    def loop_op(self, c: list) -> ast.Loop:
        keyword, mods, sequences, carries, *rest = c
        types = rest.pop() if isinstance(rest[-1], tuple) else None  # the rest are nodes
        yield_ = rest.pop()
        return ast.Loop(keyword, mods.get("reverse", False), mods.get("length"), sequences, carries, tuple(rest),
                        yield_, types)

    def fused_op(self, c: list) -> ast.Fused:
        keyword, *rest = c
        types = parse_types(rest.pop()) if isinstance(rest[-1], Token) else None
        yield_ = rest.pop()
        inputs = tuple(r for r in rest if isinstance(r, ast.Binding))
        body = tuple(r for r in rest if not isinstance(r, ast.Binding))
        return ast.Fused(keyword, inputs, body, yield_, types)

    def loop_kw(self, c: list) -> Token:
        return c[0]

    def loop_mods(self, c: list) -> dict[str, Any]:
        return dict(c)

    def mod_reverse(self, c: list) -> tuple[str, bool]:
        return ("reverse", True)

    def mod_length(self, c: list) -> tuple[str, int]:
        return ("length", _int(c[0]))

    def seq_binds(self, c: list) -> tuple[ast.SeqBind, ...]:
        return tuple(c)

    def seq_bind(self, c: list) -> ast.SeqBind:
        return ast.SeqBind(c[0], c[1])

    def carries(self, c: list) -> tuple[ast.Binding, ...]:
        return tuple(c)

    def carry_bind(self, c: list) -> ast.Binding:
        return ast.Binding(c[0], c[1])

    def yield_stmt(self, c: list) -> ast.Yield:
        carries, stacks = c[1]
        return ast.Yield(c[0], carries, stacks, c[2] if len(c) > 2 else None)

    def yield_parts(self, c: list) -> tuple[tuple[Token, ...], tuple[Token, ...]]:
        """(carries, stacks); c is [] or [carries] or [carries, STACK, stacks]."""
        if not c:
            return ((), ())
        return (c[0], c[2] if len(c) > 2 else ())

    def value_list(self, c: list) -> tuple[Token, ...]:
        return tuple(c)

    def return_stmt(self, c: list) -> ast.Return:
        return ast.Return(c[0], c[1], c[2] if len(c) > 2 else None)

    def for_stmt(self, c: list) -> ast.For:
        keyword, element, sequence, *rest = c
        sequences = [ast.SeqBind(element, sequence)]
        while rest and isinstance(rest[0], ast.SeqBind):
            sequences.append(rest.pop(0))
        return ast.For(keyword, tuple(sequences), tuple(rest))

    def surface_seq(self, c: list) -> ast.SeqBind:
        return ast.SeqBind(c[0], c[1])

    def collect_stmt(self, c: list) -> ast.Collect:
        return ast.Collect(c[0], c[1], c[2])

    # -- expressions ------------------------------------------------------------------------
    def expr_list(self, c: list) -> tuple[ast.Expr, ...]:
        return tuple(c)

    def binary(self, c: list) -> ast.Binary:
        return ast.Binary(c[1], c[0], c[2])

    def negate(self, c: list) -> ast.Neg:
        return ast.Neg(c[0], c[1])

    def name_ref(self, c: list) -> ast.Name:
        return ast.Name(c[0])

    def number_ref(self, c: list) -> ast.Num:
        return c[0]

    def builtin_call(self, c: list) -> ast.Builtin:
        args = tuple(a for a in c[1] if not isinstance(a, ast.Kwarg))
        kwargs = {str(a.name): a.value for a in c[1] if isinstance(a, ast.Kwarg)}
        return ast.Builtin(c[0], args, kwargs)

    def func_call(self, c: list) -> ast.FuncCall:
        return ast.FuncCall(c[0], c[1])

    def call_args(self, c: list) -> list[ast.Expr | ast.Kwarg]:
        return c

    def kwarg(self, c: list) -> ast.Kwarg:
        return ast.Kwarg(c[0], c[1])

    # -- attributes and literals (plain Python values) ---------------------------------------
    def attr_dict(self, c: list) -> dict[str, Any]:
        return dict(c)

    def attr(self, c: list) -> tuple[str, Any]:
        return (str(c[0]), c[1])

    def string(self, c: list) -> str:
        return str(c[0])[1:-1]

    def literal(self, c: list) -> Any:
        return c[0]

    def true(self, c: list) -> bool:
        return True

    def false(self, c: list) -> bool:
        return False

    def list_literal(self, c: list) -> list:  # not `list`: a method of that name shadows the builtin in annotations
        return c

    def number(self, c: list) -> int | float:
        return c[0].value

    def kept_dim(self, c: list) -> None:
        return None

    def negative(self, c: list) -> int | float:
        return -c[1].value

    def int_number(self, c: list) -> ast.Num:
        return ast.Num(_int(c[0]), c[0])

    def float_number(self, c: list) -> ast.Num:
        value = float(c[0])
        if math.isinf(value):  # digits that overflow even f64; an infinity is written `inf`
            raise _TokenError(f"the literal {_short(c[0])} is too large for any float dtype (write inf for an "
                              "infinity)", c[0])
        return ast.Num(value, c[0])

    def inf(self, c: list) -> ast.Num:
        return ast.Num(math.inf, None)

    def nan(self, c: list) -> ast.Num:
        return ast.Num(math.nan, None)

    def loc(self, c: list) -> Location:
        text = str(c[0])[4:-1]  # "file":line:col, the file name escaped as the printer writes it
        end = text.rindex('"')
        line, col = text[end + 2 :].split(":")
        return Location(unescape(text[1:end]), _int(c[0], line), _int(c[0], col))


@functools.cache
def _parser() -> Lark:
    """The parser, shared: it keeps no state between parses. Its LALR tables are built once per
    process and never kept on disk: Lark's cache format is a pickle, and unpickling a file of
    the cache folder runs whatever code it names (docs/backend.md, "The cache's trust model").
    Building them cost 0.16 s in one timing (2-core machine under load, interegular
    installed), paid only by a process that reports a syntax error or runs with
    GIR_PARSER=lark. Two threads parsing first at once may each build one; both are the same."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grammar.lark")
    with open(path, encoding="utf-8") as f:
        grammar = f.read()
    return Lark(grammar, parser="lalr", lexer=GirLexer, strict=True, maybe_placeholders=False,
                source_path=path, transformer=_ToAst(), propagate_positions=True)


_PRETTY = {
    "VALUE": "a value name like %x", "TYPE": "a type like tensor<4xf32>", "FUNC_NAME": "a function name like @f",
    "NAME": "an op or attribute name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LOC": "a location loc(\"file\":line:col)", "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'",
    "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "AT": "'@'", "__ANON_0": "'->'",
    "TYPES": "a type suffix like ': tensor<4xf32>'", "$END": "the end of the file",
}
"""How a terminal is named in a list of what was expected."""

_UNEXPECTED = {
    "VALUE": "value", "TYPE": "type", "TYPES": "type suffix", "FUNC_NAME": "function name", "NAME": "name",
    "INT": "integer", "FLOAT": "number", "STRING": "string", "LOC": "location",
}
"""How a token that is not a keyword or punctuation is named when it is the unexpected one."""


def _pretty(name: str) -> str:
    if name in _PRETTY:
        return _PRETTY[name]
    return f"'{name.lower()}'" if name.isupper() else name


def _expected(message: str, names: set[str]) -> str:
    """`message; expected A, B, ...`, or just `message` when nothing could come next."""
    shown = sorted({_pretty(n) for n in names})
    if not shown:
        return message
    if len(shown) > 8:
        shown = shown[:8] + ["..."]
    return f"{message}; expected " + ", ".join(shown)


def _end_location(filename: str, text: str) -> Location:
    """Where 'unexpected end of input' points: just after the last non-blank line (the line after
    a final newline has nothing to quote)."""
    lines = text.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip():
            return Location(filename, i + 1, len(lines[i].rstrip()) + 1)
    return Location(filename, 1, 1)


def _malformed_type(loc: Location) -> GirSyntaxError:
    return GirSyntaxError("malformed tensor type; write tensor<4x8xf32> (dims then one of f32, f64, i32, i64, i1)",
                          loc)


def _syntax_error(e: UnexpectedInput, filename: str, text: str) -> GirSyntaxError:
    hint = numpy_hint(e, filename, text)  # `x[a:b]`, `**`, `>`, `np.`: what to write instead
    if hint is not None:
        return hint
    loc = Location(filename, getattr(e, "line", 0) or 0, getattr(e, "column", 0) or 0)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            return GirSyntaxError(_expected("unexpected end of input", e.expected), _end_location(filename, text))
        if tok.type == "NAME" and text.startswith("tensor<", tok.start_pos or 0):
            return _malformed_type(loc)  # `tensor<3,f32>`: the TYPE terminal did not match
        if tok.type == "YIELD":
            return GirSyntaxError("'yield' may only end the body of a scan or for op", loc)
        if tok.type == "RETURN" and "YIELD" in e.expected:
            return GirSyntaxError("unexpected 'return': this scan or for body must end with 'yield'", loc)
        what = _pretty(tok.type)
        shown = f"{_UNEXPECTED[tok.type]} '{tok}'" if tok.type in _UNEXPECTED else (
            what if what == f"'{tok}'" else f"{what} '{tok}'")
        return GirSyntaxError(_expected(f"unexpected {shown}", e.expected), loc)
    if isinstance(e, UnexpectedCharacters):
        pos, column = e.pos_in_stream or 0, e.column or 1  # Lark always sets both for this error
        rest = text[pos : pos + 40].lstrip(": \t\n")
        if rest.startswith("tensor<"):
            return _malformed_type(Location(filename, e.line, column + text[pos:].index("tensor<")))
        if text.startswith("<", pos) and text.endswith("tensor", 0, pos):  # `tensor` was taken as an op name
            return _malformed_type(Location(filename, e.line, column - len("tensor")))
        char = text[pos] if pos < len(text) else "end of input"
        return GirSyntaxError(_expected(f"unexpected character {char!r}", set(e.allowed or ())), loc)
    if isinstance(e, UnexpectedEOF):
        return GirSyntaxError(_expected("unexpected end of input", set(e.expected)), _end_location(filename, text))
    return GirSyntaxError(str(e).splitlines()[0], loc)


def lark_parse(text: str, filename: str) -> list[ast.Func]:
    """The functions of gir text, parsed by Lark; a syntax error is a GirSyntaxError in `filename`."""
    try:
        return cast("list[ast.Func]", _parser().parse(text))  # the tree, transformed (_ToAst)
    except UnexpectedInput as e:
        raise _syntax_error(e, filename, text) from None
    except _TokenError as e:
        raise GirSyntaxError(e.message, Location(filename, e.token.line or 0, e.token.column or 0)) from None
