"""Diagnostics: source locations and the `GirError` family.

Every error a user can cause (syntax, types, shapes, bad arguments, a failing pass) is a
`GirError`. Its text is `file:line:col: error: message`, then the source line and a caret
under the column, like a C compiler. Source texts are remembered by file name when they are
parsed, so an error raised long after parsing (in a pass) can still show the line.
"""

from __future__ import annotations

from dataclasses import dataclass

_SOURCES: dict[str, list[str]] = {}
"""File name -> source lines, filled by the parser so diagnostics can quote the line."""


def remember_source(filename: str, text: str) -> None:
    # Split at '\n' only, as the lexer counts lines: str.splitlines() also breaks at \x0c, \x85,
    # \u2028 (which may sit in a comment) and would quote the wrong line after one.
    _SOURCES[filename] = [line.removesuffix("\r") for line in text.split("\n")]


def source_text(filename: str) -> str | None:
    """The text last parsed under filename (lines joined by '\n'), or None."""
    lines = _SOURCES.get(filename)
    return None if lines is None else "\n".join(lines)


@dataclass(frozen=True)
class Location:
    """A position in a source file; line and column count from 1."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def source_line(self) -> str | None:
        lines = _SOURCES.get(self.file)
        if lines is None or not 1 <= self.line <= len(lines):
            return None
        return lines[self.line - 1]


UNKNOWN = Location("<unknown>", 0, 0)


class GirError(Exception):
    """An error in a gir program or in how gir was called; printed without a traceback."""

    kind = "error"

    def __init__(self, message: str, loc: Location | None = None, note: str | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc or UNKNOWN
        self.note = note

    def __str__(self) -> str:
        head = f"{self.loc}: error: {self.message}" if self.loc is not UNKNOWN else f"error: {self.message}"
        parts = [head]
        line = self.loc.source_line()
        if line is not None:
            parts.append(line)
            parts.append(" " * (max(self.loc.col, 1) - 1) + "^")
        if self.note:
            parts.append(f"note: {self.note}")
        return "\n".join(parts)


class GirSyntaxError(GirError):
    """The text is not in the gir grammar."""


class GirTypeError(GirError):
    """An op's operands or attributes do not fit its type or shape rule."""


class GirVerifyError(GirError):
    """The IR breaks an invariant (dominance, terminators, types)."""


class GirArgumentError(GirError):
    """Arguments given to a function do not match its signature."""


class GirPassError(GirError):
    """A pass failed or produced broken IR."""

    reproducer: str | None = None
    """The file with the IR given to the failing pass, when one was written."""
