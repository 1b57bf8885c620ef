"""A hand-written recursive-descent parser for valid gir text: the same AST as the Lark parser,
several times faster.

Why two parsers: Lark's LALR driver and its tree-builder callbacks cost ~7 µs a token (0.33 s
for the ~46k tokens of bench/passes_scale.py's 25,000-op program, 1.0 s for the 158k of
bench/parse_scale.py's); this parser takes a third of that (bench/parse_ab.py). Lark stays
the specification (grammar.lark) and the only source of diagnostics: on anything this parser
does not take -- a syntax error, a literal too large, a parameter with two types, nesting too
deep for Python's stack -- it raises `Fallback`, and `parser.parse_ast()` parses the text again
with Lark, which reports the error exactly as before (or, should this parser have missed a
valid form, builds the AST after all, only slower).

How they are kept equal:
- the tokens come from the same terminal definitions: `GirLexer.skipping_regex` is built from
  the grammar's terminals, tried so that each match is the lexer's, keywords mapped as the
  lexer maps them (terminals.py keeps them on disk: reading valid text imports no Lark);
- AST nodes hold `Token`s (tokens.py; GirLexer makes the same for Lark) with the same type,
  text, offset, line and column;
- tests/test_fast_parser.py compares the two ASTs, tokens' positions included, on every
  example and docs block (as written and printed), every FileCheck case, the bench programs,
  the fuzz generator's programs and mutated programs (which must either give the same AST or
  be rejected by both).

Each method below parses one rule of grammar.lark (named in its docstring) and returns what
the transformer `parser._ToAst` returns for it. `GIR_PARSER=lark` switches this parser off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import Location
from ..ir.types import TensorType, parse_type
from . import ast
from .terminals import Terminals
from .tokens import Token, unescape


class Fallback(Exception):
    """This parser does not take the text; the Lark parser parses it (and reports any error)."""


_EXPR_START = frozenset(("VALUE", "INT", "FLOAT", "inf", "nan", "NAME", "stack", "FUNC_NAME", "(", "-"))
"""Kinds a surface expression may start with (`atom` and `unary` of the grammar)."""
_LITERAL_START = frozenset(("INT", "FLOAT", "inf", "nan", "-", "true", "false", "["))
_LIST_ITEM_START = _LITERAL_START | {"?"}
_VALUE = frozenset(("VALUE",))
_NAME = frozenset(("NAME",))
_TYPE = frozenset(("TYPE",))
_WRT_ITEM = frozenset(("VALUE", "INT"))
_SUM = frozenset(("+", "-"))
_PRODUCT = frozenset(("*", "/", "@"))

_new_str = str.__new__


def _token(type_: str, value: str, pos: int, line: int, column: int) -> Token:
    """`Token(type_, value, pos, line, column)` as GirLexer makes it, without Token.__new__'s
    call overhead (a third of the cost of a token)."""
    tok = _new_str(Token, value)
    tok.type = type_
    tok.start_pos = pos
    tok.value = value
    tok.line = line
    tok.column = column
    tok.end_line = tok.end_column = tok.end_pos = None
    return tok


_TYPES: dict[str, tuple[TensorType, ...]] = {}
"""Parsed type suffixes by their text (TensorTypes are frozen, so one parse serves every use)."""


def _types(text: str) -> tuple[TensorType, ...]:
    """`: tensor<4xf32>, tensor<f32>` (one TYPES token) -> types, as parser.parse_types."""
    types = _TYPES.get(text)
    if types is None:
        if len(_TYPES) > 4096:  # a program of many distinct types: the cache stays small
            _TYPES.clear()
        types = _TYPES[text] = tuple(parse_type(t.strip()) for t in text[1:].split(","))
    return types


class FastParser:
    """Parses one text; `parse()` returns the functions or raises `Fallback`."""

    def __init__(self, text: str, lexer: Terminals):
        self.text = text
        self.lark_types = {**{k: k for k in ("VALUE", "NAME", "FUNC_NAME", "INT", "FLOAT", "TYPES", "TYPE",
                                             "STRING", "LOC")}, **lexer.keywords, **lexer.punct}
        self.kinds: list[str] = []
        """Per token: its terminal's name, or for a keyword or punctuation its text (`in`, `(`)."""
        self.toks: list[tuple[str, int, int, int]] = []
        """Per token: (text, offset, line, column)."""
        self.i = 0
        self.tokenize(lexer)

    def tokenize(self, lexer: Terminals) -> None:
        text, kinds, toks = self.text, self.kinds, self.toks
        keywords = lexer.keywords
        line, line_start, end = 1, 0, 0
        match = lexer.skipping_regex.match
        # `match` at the end of the last token, not `finditer`: after a character no terminal
        # matches, finditer would search on from every later position (quadratic in a run of
        # blanks before it); here that character ends the loop (Lark reports it).
        while (m := match(text, end)) is not None:
            kind = m.lastgroup or ""  # never None: every alternative of the regex is a named group
            start, stop = m.span(kind)
            if start == stop and kind != "END":  # no terminal matches empty; were one to, it would loop
                raise Fallback
            if start != end:  # whitespace or comments skipped (only whitespace holds newlines)
                newlines = text.count("\n", end, start)
                if newlines:
                    line += newlines
                    line_start = text.rfind("\n", end, start) + 1
            end = stop
            value = m.group(kind)
            if kind == "NAME":
                if value in keywords:
                    kind = value
            elif kind == "PUNCT":
                kind = value
            elif kind == "TYPES" and "\n" in value:  # `: tensor<f32>,\n tensor<f32>`
                kinds.append(kind)
                toks.append((value, start, line, start - line_start + 1))
                line += value.count("\n")
                line_start = text.rfind("\n", start, stop) + 1
                continue
            kinds.append(kind)
            toks.append((value, start, line, start - line_start + 1))
            if kind == "END":
                break
        if not kinds or kinds[-1] != "END":
            raise Fallback

    # -- tokens -------------------------------------------------------------------------------
    def tok(self, i: int) -> Token:
        kind = self.kinds[i]
        value, pos, line, column = self.toks[i]
        return _token(self.lark_types[kind], value, pos, line, column)

    def take(self, kind: str) -> Token:
        """The next token, which must be of `kind`."""
        i = self.i
        if self.kinds[i] != kind:
            raise Fallback
        self.i = i + 1
        value, pos, line, column = self.toks[i]
        return _token(self.lark_types[kind], value, pos, line, column)

    def skip(self, kind: str) -> None:
        """Steps over a token of `kind` that the AST does not keep (punctuation, `in`, `wrt`)."""
        if self.kinds[self.i] != kind:
            raise Fallback
        self.i += 1

    def text_of(self, kind: str) -> str:
        i = self.i
        if self.kinds[i] != kind:
            raise Fallback
        self.i = i + 1
        return self.toks[i][0]

    def separated(self, item: Any, first: frozenset[str]) -> list:
        """`(item ("," item)*)?`: items while the next token can start one."""
        kinds = self.kinds
        if kinds[self.i] not in first:
            return []
        items = [item()]
        while kinds[self.i] == ",":
            self.i += 1
            items.append(item())
        return items

    def value_list(self) -> tuple[Token, ...]:
        """value_list / operands / targets: `%a, %b` (`separated`, unrolled: a third of SSA tokens)."""
        kinds, toks, i = self.kinds, self.toks, self.i
        if kinds[i] != "VALUE":
            return ()
        values = [_token("VALUE", *toks[i])]
        i += 1
        while kinds[i] == ",":
            if kinds[i + 1] != "VALUE":
                raise Fallback
            values.append(_token("VALUE", *toks[i + 1]))
            i += 2
        self.i = i
        return tuple(values)

    def opt_loc(self) -> Location | None:
        """`loc?`: `loc("file":line:col)`, read as the transformer reads it."""
        if self.kinds[self.i] != "LOC":
            return None
        text = self.toks[self.i][0][4:-1]
        self.i += 1
        end = text.rindex('"')
        line, col = text[end + 2 :].split(":")
        return Location(unescape(text[1:end]), _int(line), _int(col))

    # -- functions and statements --------------------------------------------------------------
    def parse(self) -> list[ast.Func]:
        """start: func*"""
        funcs = []
        while self.kinds[self.i] == "func":
            funcs.append(self.func())
        if self.kinds[self.i] != "END":
            raise Fallback
        return funcs

    def func(self) -> ast.Func:
        """func: "func" FUNC_NAME "(" params ")" results "{" stmt* return_stmt "}" loc?"""
        self.i += 1
        name = self.take("FUNC_NAME")
        self.skip("(")
        params = tuple(self.separated(self.param, _VALUE))
        self.skip(")")
        results = None
        if self.kinds[self.i] == "->":
            self.i += 1
            results = self.result_types()
        self.skip("{")
        body = self.statements()
        body.append(self.return_stmt())
        self.skip("}")
        return ast.Func(name, params, results, tuple(body), self.opt_loc())

    def param(self) -> ast.Param:
        """param: VALUE TYPES loc?"""
        name = self.take("VALUE")
        types = _types(self.text_of("TYPES"))
        if len(types) != 1:
            raise Fallback
        return ast.Param(name, types[0], self.opt_loc())

    def result_types(self) -> tuple[TensorType, ...]:
        """result_types: TYPE | "(" (TYPE ("," TYPE)*)? ")" """
        if self.kinds[self.i] == "TYPE":
            return (parse_type(self.text_of("TYPE")),)
        self.skip("(")
        types = tuple(parse_type(t) for t in self.separated(lambda: self.text_of("TYPE"), _TYPE))
        self.skip(")")
        return types

    def statements(self) -> list[ast.Stmt]:
        """stmt*, up to what ends the body (`return`, `yield` or `}`, which the caller takes)."""
        kinds = self.kinds
        body: list[ast.Stmt] = []
        while True:
            kind = kinds[self.i]
            if kind == "VALUE":
                body.append(self.assign())
            elif kind in ("NAME", "stack"):
                generic = self.generic()
                body.append(ast.BareOp(generic, self.opt_loc()))
            elif kind == "scan" or (kind == "for" and kinds[self.i + 1] != "VALUE"):
                loop = self.loop_op()
                body.append(ast.BareOp(loop, self.opt_loc()))
            elif kind == "fused":
                fused = self.fused_op()
                body.append(ast.BareOp(fused, self.opt_loc()))
            elif kind == "for":
                body.append(self.for_stmt())
            elif kind == "collect":
                keyword = self.take("collect")
                value = self.expr()
                self.skip("into")
                body.append(ast.Collect(keyword, value, self.take("VALUE")))
            else:
                return body

    def assign(self) -> ast.Assign:
        """assign: targets "=" rhs loc?"""
        targets = self.value_list()
        self.skip("=")
        return ast.Assign(targets, self.rhs(), self.opt_loc())

    def rhs(self) -> ast.Rhs:
        """rhs: expr | generic | call_op | grad_op | loop_op | fused_op"""
        kind = self.kinds[self.i]
        if kind in ("NAME", "stack"):
            return self.expr() if self.kinds[self.i + 1] == "(" else self.generic()
        if kind == "call":
            keyword = self.take("call")
            callee = self.take("FUNC_NAME")
            self.skip("(")
            args = self.value_list()
            self.skip(")")
            return ast.Call(keyword, callee, args, self.type_suffix())
        if kind == "grad":
            return self.grad_op()
        if kind in ("scan", "for"):
            return self.loop_op()
        if kind == "fused":
            return self.fused_op()
        return self.expr()

    def type_suffix(self) -> tuple[TensorType, ...] | None:
        """TYPES?"""
        if self.kinds[self.i] != "TYPES":
            return None
        return _types(self.text_of("TYPES"))

    def return_stmt(self) -> ast.Return:
        """return_stmt: RETURN expr_list loc?"""
        keyword = self.take("return")
        values = tuple(self.separated(self.expr, _EXPR_START))
        return ast.Return(keyword, values, self.opt_loc())

    def for_stmt(self) -> ast.For:
        """for_stmt: FOR VALUE "in" VALUE surface_seq* "{" stmt* "}" """
        keyword = self.take("for")
        sequences = [self.seq_bind()]
        while self.kinds[self.i] == ",":
            self.i += 1
            sequences.append(self.seq_bind())
        self.skip("{")
        body = self.statements()
        self.skip("}")
        return ast.For(keyword, tuple(sequences), tuple(body))

    def seq_bind(self) -> ast.SeqBind:
        """seq_bind: VALUE "in" VALUE"""
        element = self.take("VALUE")
        self.skip("in")
        return ast.SeqBind(element, self.take("VALUE"))

    def binding(self) -> ast.Binding:
        """carry_bind: VALUE "=" VALUE"""
        name = self.take("VALUE")
        self.skip("=")
        return ast.Binding(name, self.take("VALUE"))

    # -- op forms ------------------------------------------------------------------------------
    def generic(self) -> ast.Generic:
        """generic: op_name (operands | literal)? attr_dict? TYPES? (at least one part)"""
        name = self.tok(self.i)
        self.i += 1
        kind = self.kinds[self.i]
        operands: tuple[Token, ...] = ()
        literal = None
        if kind == "VALUE":
            operands = self.value_list()
        elif kind in _LITERAL_START:
            literal = self.literal()
        elif kind not in ("{", "TYPES"):
            raise Fallback
        attrs = self.attr_dict() if self.kinds[self.i] == "{" else {}
        return ast.Generic(name, operands, literal, attrs, self.type_suffix())

    def grad_op(self) -> ast.Grad:
        """grad_op: GRAD FUNC_NAME "(" expr_list ")" "wrt" "(" wrt_item ("," wrt_item)* ")" type_suffix?"""
        keyword = self.take("grad")
        callee = self.take("FUNC_NAME")
        self.skip("(")
        args = tuple(self.separated(self.expr, _EXPR_START))
        self.skip(")")
        self.skip("wrt")
        self.skip("(")
        wrt = self.separated(self.wrt_item, _WRT_ITEM)
        if not wrt:
            raise Fallback
        self.skip(")")
        return ast.Grad(keyword, callee, args, tuple(wrt), self.type_suffix())

    def wrt_item(self) -> Token:
        """wrt_item: VALUE | INT"""
        if self.kinds[self.i] == "INT":
            _int(self.toks[self.i][0])
            return self.take("INT")
        return self.take("VALUE")

    def loop_op(self) -> ast.Loop:
        """loop_op: loop_kw loop_mods "(" seq_binds ")" carries "{" stmt* yield_stmt "}" type_suffix?"""
        keyword = self.tok(self.i)
        self.i += 1
        reverse, length = False, None
        while True:
            kind = self.kinds[self.i]
            if kind == "reverse":
                self.i += 1
                reverse = True
            elif kind == "length":
                self.i += 1
                length = _int(self.text_of("INT"))
            else:
                break
        self.skip("(")
        sequences = tuple(self.separated(self.seq_bind, _VALUE))
        self.skip(")")
        carries: tuple[ast.Binding, ...] = ()
        if self.kinds[self.i] == "carry":
            self.i += 1
            self.skip("(")
            carries = tuple(self.separated(self.binding, _VALUE))
            self.skip(")")
        body, yield_ = self.region()
        return ast.Loop(keyword, reverse, length, sequences, carries, body, yield_, self.type_suffix())

    def fused_op(self) -> ast.Fused:
        """fused_op: FUSED "(" (carry_bind ("," carry_bind)*)? ")" "{" stmt* yield_stmt "}" TYPES?"""
        keyword = self.take("fused")
        self.skip("(")
        inputs = tuple(self.separated(self.binding, _VALUE))
        self.skip(")")
        body, yield_ = self.region()
        return ast.Fused(keyword, inputs, body, yield_, self.type_suffix())

    def region(self) -> tuple[tuple[ast.Stmt, ...], ast.Yield]:
        """"{" stmt* yield_stmt "}" with yield_stmt: YIELD yield_parts loc?"""
        self.skip("{")
        body = self.statements()
        keyword = self.take("yield")
        carries: tuple[Token, ...] = ()
        stacks: tuple[Token, ...] = ()
        if self.kinds[self.i] == "(":
            self.i += 1
            carries = self.value_list()
            self.skip(")")
            if self.kinds[self.i] == "stack":
                self.i += 1
                self.skip("(")
                stacks = self.value_list()
                self.skip(")")
        yield_ = ast.Yield(keyword, carries, stacks, self.opt_loc())
        self.skip("}")
        return tuple(body), yield_

    # -- attributes and literals ---------------------------------------------------------------
    def attr_dict(self) -> dict[str, Any]:
        """attr_dict: "{" (attr ("," attr)*)? "}" with attr: NAME "=" attr_value"""
        self.skip("{")
        attrs = dict(self.separated(self.attr, _NAME))
        self.skip("}")
        return attrs

    def attr(self) -> tuple[str, Any]:
        name = self.text_of("NAME")
        self.skip("=")
        return name, self.attr_value()

    def attr_value(self) -> Any:
        """attr_value: literal | STRING"""
        if self.kinds[self.i] == "STRING":
            return self.text_of("STRING")[1:-1]
        return self.literal()

    def literal(self) -> Any:
        """literal: number | "true" | "false" | "[" (literal ("," literal)*)? "]" """
        kind = self.kinds[self.i]
        if kind == "true" or kind == "false":
            self.i += 1
            return kind == "true"
        if kind == "[":
            self.i += 1
            items = self.separated(self.list_item, _LIST_ITEM_START)
            self.skip("]")
            return items
        if kind == "-":  # number: MINUS unsigned
            self.i += 1
            return -self.unsigned().value
        return self.unsigned().value

    def list_item(self) -> Any:
        """list_item: literal | "?" (kept_dim: None)"""
        if self.kinds[self.i] == "?":
            self.i += 1
            return None
        return self.literal()

    def unsigned(self) -> ast.Num:
        """unsigned: INT | FLOAT | "inf" | "nan" """
        i = self.i
        kind = self.kinds[i]
        self.i = i + 1
        if kind == "INT":
            tok = self.tok(i)
            return ast.Num(_int(tok), tok)
        if kind == "FLOAT":
            tok = self.tok(i)
            value = float(tok)
            if math.isinf(value):  # too large: Lark's transformer reports it
                raise Fallback
            return ast.Num(value, tok)
        if kind == "inf":
            return ast.Num(math.inf, None)
        if kind == "nan":
            return ast.Num(math.nan, None)
        raise Fallback

    # -- surface expressions -------------------------------------------------------------------
    def expr(self) -> ast.Expr:
        """sum: product (("+" | "-") product)*"""
        return self._chain(_SUM, self.product)

    def product(self) -> ast.Expr:
        """product: unary (("*" | "/" | "@") unary)*"""
        return self._chain(_PRODUCT, self.unary)

    def _chain(self, ops: frozenset[str], operand: Callable[[], ast.Expr]) -> ast.Expr:
        """operand (op operand)* for op in ops, left-associative (a left-deep chain)."""
        lhs = operand()
        kinds = self.kinds
        while kinds[self.i] in ops:
            op = self.tok(self.i)
            self.i += 1
            lhs = ast.Binary(op, lhs, operand())
        return lhs

    def unary(self) -> ast.Expr:
        """unary: atom | MINUS unary"""
        i = self.i
        kind = self.kinds[i]
        if kind == "VALUE":  # the common case first
            self.i = i + 1
            return ast.Name(_token("VALUE", *self.toks[i]))
        if kind == "-":
            self.i = i + 1
            return ast.Neg(self.tok(i), self.unary())
        return self.atom()

    def atom(self) -> ast.Expr:
        """atom: VALUE | unsigned | (NAME | STACK) "(" call_args ")" | FUNC_NAME "(" expr_list ")" | "(" expr ")" """
        i = self.i
        kind = self.kinds[i]
        if kind == "VALUE":
            self.i = i + 1
            return ast.Name(self.tok(i))
        if kind == "(":
            self.i = i + 1
            inner = self.expr()
            self.skip(")")
            return inner
        if kind in ("NAME", "stack"):
            name = self.tok(i)
            self.i = i + 1
            self.skip("(")
            items = self.separated(self.call_arg, _EXPR_START)
            self.skip(")")
            args = tuple(a for a in items if not isinstance(a, ast.Kwarg))
            kwargs = {str(a.name): a.value for a in items if isinstance(a, ast.Kwarg)}
            return ast.Builtin(name, args, kwargs)
        if kind == "FUNC_NAME":
            callee = self.tok(i)
            self.i = i + 1
            self.skip("(")
            args = tuple(self.separated(self.expr, _EXPR_START))
            self.skip(")")
            return ast.FuncCall(callee, args)
        return self.unsigned()

    def call_arg(self) -> ast.Expr | ast.Kwarg:
        """call_arg: expr | NAME "=" attr_value"""
        i = self.i
        if self.kinds[i] == "NAME" and self.kinds[i + 1] == "=":
            name = self.tok(i)
            self.i = i + 2
            return ast.Kwarg(name, self.attr_value())
        return self.expr()


def _int(tok: str) -> int:
    try:
        return int(tok)
    except ValueError:  # past Python's digit limit: Lark's transformer reports it
        raise Fallback from None


