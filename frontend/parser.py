"""Text -> IR. A Lark LALR parser whose inline transformer builds small statement tuples as
rules reduce (no parse tree is walked twice); `emitter.py` turns each module's tuples into IR.

The tuples (the frontend's AST, private to frontend/):
    ("assign", targets, rhs, loc)        ("op", rhs, loc)             ("return", tok, exprs, loc)
    ("for", tok, [(elem, seq)], stmts)   ("collect", tok, expr, into)  ("yield", tok, carries, stacks, loc)
  rhs / expr:
    ("val", tok) ("num", value, tok) ("bin", op_tok, lhs, rhs) ("neg", tok, e)
    ("builtin", name_tok, args, kwargs) ("fcall", name_tok, args)
    ("generic", name_tok, operands, literal, attrs, types) ("call", tok, fname, values, types)
    ("grad", tok, fname, exprs, wrt, types) ("loop", kw_tok, mods, seqs, carries, stmts, yield, types)
"""

from __future__ import annotations

import gc
import math
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import GirSyntaxError, Location, remember_source
from ..ir.core import Module
from ..ir.types import parse_type
from .lexer import GirLexer

_TAGGED = ("operands", "literal", "attrs", "types")
_FILE = ["<string>"]
"""The file being parsed, for the few errors raised while parsing (Lark callbacks take no context)."""


def parse_types(token: str) -> list:
    """`: tensor<4xf32>, tensor<f32>` (one TYPES token) -> types."""
    return [parse_type(t.strip()) for t in token[1:].split(",")]


class _ToTuples(Transformer):
    """One method per grammar rule; each returns a tuple or a plain Python value."""

    def start(self, c: list) -> list:
        return c

    def func(self, c: list) -> tuple:
        name, params, results, *body = c
        loc = body.pop() if body and isinstance(body[-1], Location) else None
        return ("func", name, params, results, body, loc)

    def params(self, c: list) -> list:
        return c

    def param(self, c: list) -> tuple:
        types = parse_types(c[1])
        if len(types) != 1:
            raise GirSyntaxError(f"parameter {c[0]} has {len(types)} types", Location(_FILE[0], c[1].line, c[1].column))
        return (c[0], types[0], c[2] if len(c) > 2 else None)

    def results(self, c: list) -> list | None:
        return c[0] if c else None

    def result_types(self, c: list) -> list:
        return [parse_type(t) for t in c]

    def assign(self, c: list) -> tuple:
        return ("assign", c[0], c[1], c[2] if len(c) > 2 else None)

    def targets(self, c: list) -> list:
        return c

    def bare_op(self, c: list) -> tuple:
        return ("op", c[0], c[1] if len(c) > 1 else None)

    def generic(self, c: list) -> tuple:
        parts: dict[str, Any] = {"operands": [], "literal": None, "attrs": {}, "types": None}
        for item in c[1:]:
            if isinstance(item, tuple) and item[0] in _TAGGED:
                parts[item[0]] = item[1]
            elif isinstance(item, Token) and item.type == "TYPES":
                parts["types"] = parse_types(item)
            else:  # the literal, a plain Python value
                parts["literal"] = item
        return ("generic", c[0], parts["operands"], parts["literal"], parts["attrs"], parts["types"])

    def operands(self, c: list) -> tuple:
        return ("operands", c)

    def type_suffix(self, c: list) -> tuple:
        return ("types", parse_types(c[0]))

    def call_op(self, c: list) -> tuple:
        return ("call", c[0], c[1], c[2], c[3][1] if len(c) > 3 else None)

    def grad_op(self, c: list) -> tuple:
        tok, fname, exprs, *rest = c
        types = rest.pop()[1] if rest and isinstance(rest[-1], tuple) else None
        return ("grad", tok, fname, exprs, rest, types)

    def loop_op(self, c: list) -> tuple:
        kw, mods, seqs, carries, *rest = c
        types = rest.pop()[1] if isinstance(rest[-1], tuple) and rest[-1][0] == "types" else None
        yield_stmt = rest.pop()
        return ("loop", kw, mods, seqs, carries, rest, yield_stmt, types)

    def fused_op(self, c: list) -> tuple:
        kw, *rest = c
        types = parse_types(rest.pop()) if isinstance(rest[-1], Token) and rest[-1].type == "TYPES" else None
        yield_stmt = rest.pop()
        binds = [r for r in rest if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], Token)]
        stmts = [r for r in rest if not (isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], Token))]
        return ("fused", kw, binds, stmts, yield_stmt, types)

    def loop_kw(self, c: list) -> Token:
        return c[0]

    def loop_mods(self, c: list) -> dict:
        return dict(c)

    def mod_reverse(self, c: list) -> tuple:
        return ("reverse", True)

    def mod_length(self, c: list) -> tuple:
        return ("length", int(c[0]))

    def seq_binds(self, c: list) -> list:
        return c

    def seq_bind(self, c: list) -> tuple:
        return (c[0], c[1])

    def carries(self, c: list) -> list:
        return c

    def carry_bind(self, c: list) -> tuple:
        return (c[0], c[1])

    def yield_stmt(self, c: list) -> tuple:
        tok, (carries, stacks) = c[0], c[1]
        return ("yield", tok, carries, stacks, c[2] if len(c) > 2 else None)

    def yield_parts(self, c: list) -> tuple:
        if not c:
            return ([], [])
        return (c[0], c[2] if len(c) > 2 else [])

    def value_list(self, c: list) -> list:
        return c

    def return_stmt(self, c: list) -> tuple:
        return ("return", c[0], c[1], c[2] if len(c) > 2 else None)

    def for_stmt(self, c: list) -> tuple:
        tok, elem, seq, *rest = c
        binds = [(elem, seq)]
        while rest and isinstance(rest[0], tuple) and rest[0][0] == "seq":
            binds.append(rest.pop(0)[1:])
        return ("for", tok, binds, rest)

    def surface_seq(self, c: list) -> tuple:
        return ("seq", c[0], c[1])

    def collect_stmt(self, c: list) -> tuple:
        return ("collect", c[0], c[1], c[2])

    # -- expressions ------------------------------------------------------------------------
    def expr_list(self, c: list) -> list:
        return c

    def binary(self, c: list) -> tuple:
        return ("bin", c[1], c[0], c[2])

    def negate(self, c: list) -> tuple:
        return ("neg", c[0], c[1])

    def name_ref(self, c: list) -> tuple:
        return ("val", c[0])

    def number_ref(self, c: list) -> tuple:
        value, tok = c[0]
        return ("num", value, tok)

    def builtin_call(self, c: list) -> tuple:
        args, kwargs = [], {}
        for a in c[1]:
            if a[0] == "kwarg":
                kwargs[str(a[1])] = a[2]
            else:
                args.append(a)
        return ("builtin", c[0], args, kwargs)

    def func_call(self, c: list) -> tuple:
        return ("fcall", c[0], c[1])

    def call_args(self, c: list) -> list:
        return c

    def kwarg(self, c: list) -> tuple:
        return ("kwarg", c[0], c[1])

    # -- attributes and literals (plain Python values) ---------------------------------------
    def attr_dict(self, c: list) -> tuple:
        return ("attrs", dict(c))

    def attr(self, c: list) -> tuple:
        return (str(c[0]), c[1])

    def string(self, c: list) -> str:
        return str(c[0])[1:-1]

    def literal(self, c: list) -> Any:
        return c[0]

    def true(self, c: list) -> bool:
        return True

    def false(self, c: list) -> bool:
        return False

    def list(self, c: list) -> list:
        return c

    def number(self, c: list) -> Any:
        return c[0][0]

    def negative(self, c: list) -> Any:
        return -c[1][0]

    def int_number(self, c: list) -> tuple:
        return (int(c[0]), c[0])

    def float_number(self, c: list) -> tuple:
        return (float(c[0]), c[0])

    def inf(self, c: list) -> tuple:
        return (math.inf, None)

    def nan(self, c: list) -> tuple:
        return (math.nan, None)

    def loc(self, c: list) -> Location:
        text = str(c[0])[4:-1]  # "file":line:col
        end = text.rindex('"')
        line, col = text[end + 2 :].split(":")
        return Location(text[1:end], int(line), int(col))


_PARSER: Lark | None = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        _PARSER = Lark.open("grammar.lark", rel_to=__file__, parser="lalr", lexer=GirLexer, strict=True,
                            propagate_positions=True, maybe_placeholders=False, transformer=_ToTuples())
    return _PARSER


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
        pos = e.pos_in_stream
        rest = text[pos : pos + 40].lstrip(": \t\n")
        if rest.startswith("tensor<"):
            return _malformed_type(Location(filename, e.line, e.column + text[pos:].index("tensor<")))
        if text.startswith("<", pos) and text.endswith("tensor", 0, pos):  # `tensor` was taken as an op name
            return _malformed_type(Location(filename, e.line, e.column - len("tensor")))
        char = text[pos] if pos < len(text) else "end of input"
        return GirSyntaxError(_expected(f"unexpected character {char!r}", set(e.allowed or ())), loc)
    if isinstance(e, UnexpectedEOF):
        return GirSyntaxError(_expected("unexpected end of input", set(e.expected)), _end_location(filename, text))
    return GirSyntaxError(str(e).splitlines()[0], loc)


def parse(text: str, filename: str = "<string>") -> Module:
    """Parses gir text (surface or SSA form) into a verified Module."""
    from ..ir.verifier import verify
    from .emitter import emit_module

    remember_source(filename, text)
    _FILE[0] = filename
    # The cyclic GC would scan the growing IR (ops and results point at each other) again and
    # again while it is built: a third of the parse time at 25k ops. Nothing built here is garbage.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        funcs = _parser().parse(text)
        module = emit_module(funcs, filename)
    except UnexpectedInput as e:
        raise _syntax_error(e, filename, text) from None
    finally:
        if gc_was_enabled:
            gc.enable()
    verify(module)
    return module


def load(path: str) -> Module:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise GirSyntaxError(f"cannot read {path}: {e}") from None
    return parse(text, filename=path)
