"""The token the AST holds: a `str` with its terminal's name and position, read by the emitter
and the diagnostics.

Why gir's own class and not `lark.Token`: the hand-written parser (fast_parser.py) reads valid
text without importing Lark at all (Lark, with interegular and regex, costs ~15-50 ms of every
`gir opt` start-up), and both parsers must put the same class in the AST (tests/test_fast_parser.py
compares them). GirLexer (lexer.py) makes these tokens for Lark's LALR parser too, which only
reads `.type` and the positions. The attributes, constructor, equality and pickling are those of
`lark.Token` (Lark 1.x), so code written against that class keeps working.
"""

from __future__ import annotations

import re
from typing import Any


class Token(str):
    """A terminal's text with `type` (its terminal's name), `value` (the text again) and its
    position: `start_pos` (offset), `line`, `column` (from 1); the `end_*` fields stay None, as
    neither parser fills them."""

    __slots__ = ("type", "start_pos", "value", "line", "column", "end_line", "end_column", "end_pos")
    __match_args__ = ("type", "value")

    type: str
    start_pos: int | None
    value: Any
    line: int | None
    column: int | None
    end_line: int | None
    end_column: int | None
    end_pos: int | None

    def __new__(cls, type: str, value: Any, start_pos: int | None = None, line: int | None = None,  # noqa: A002
                column: int | None = None, end_line: int | None = None, end_column: int | None = None,
                end_pos: int | None = None) -> Token:
        inst = str.__new__(cls, value)
        inst.type = type
        inst.start_pos = start_pos
        inst.value = value
        inst.line = line
        inst.column = column
        inst.end_line = end_line
        inst.end_column = end_column
        inst.end_pos = end_pos
        return inst

    def update(self, type: str | None = None, value: Any = None) -> Token:  # noqa: A002
        return Token.new_borrow_pos(type if type is not None else self.type,
                                    value if value is not None else self.value, self)

    @classmethod
    def new_borrow_pos(cls, type_: str, value: Any, borrow_t: Any) -> Token:
        return cls(type_, value, borrow_t.start_pos, borrow_t.line, borrow_t.column, borrow_t.end_line,
                   borrow_t.end_column, borrow_t.end_pos)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.type, self.value, self.start_pos, self.line, self.column))

    def __repr__(self) -> str:
        return f"Token({self.type!r}, {self.value!r})"

    def __deepcopy__(self, memo: Any) -> Token:
        return Token(self.type, self.value, self.start_pos, self.line, self.column)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token) and self.type != other.type:
            return False
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def unescape(text: str) -> str:
    """Inverse of the printer's escaping of file names in `loc(...)`: \\n, \\" and \\\\ (both parsers
    use it: fast_parser.py and lark_parser.py's transformer)."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)
