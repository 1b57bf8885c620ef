"""Diagnostics: source locations and the `GirError` family.

Every error a user can cause (syntax, types, shapes, bad arguments, a failing pass) is a
`GirError`. Its text is `file:line:col: error: message`, then the source line and a caret
under the column, like a C compiler. Source texts are remembered by file name when they are
parsed, so an error raised long after parsing (in a pass) can still show the line.

An op a pass creates has no text of its own: its location is that of the user op it came from,
marked with an `Origin` (which pass made it, and how it relates to that op). An error on such
an op points at the user's source and adds a note, `autodiff created this op in the gradient of
`%y = %a * %b` (line 4)`. The pass manager says which pass is running (`creating`); `make_op`
marks the location of every op made meanwhile (`created_at`), so no pass has to remember to.

Names a user misspelled (functions, values, passes, options) get a "did you mean" from
`did_you_mean`, with candidates from the registry or scope that knows them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

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
class Origin:
    """Why an op that is not in the source exists: the pass that made it and how it relates to
    the user op at the location that carries this origin."""

    pass_name: str
    action: str = "from"
    """How the op relates to the user op: `from`, `in the gradient of`, ..."""
    via: Origin | None = None
    """The first origin, when this pass made the op from an op another pass made."""

    def describe(self, what: str) -> str:
        if self.via is None:
            return f"{self.pass_name} created this op {self.action} {what}"
        return (f"{self.pass_name} created this op {self.action} an op that {self.via.pass_name} created "
                f"{self.via.action} {what}")


@dataclass(frozen=True)
class Location:
    """A position in a source file; line and column count from 1."""

    file: str
    line: int
    col: int
    origin: Origin | None = field(default=None, compare=False)
    """Set when a pass made the op at this location from the user op written here; not part
    of equality, so an op made from `%y = ...` is at the same place as `%y = ...`."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def source_line(self) -> str | None:
        lines = _SOURCES.get(self.file)
        if lines is None or not 1 <= self.line <= len(lines):
            return None
        return lines[self.line - 1]

    def origin_note(self) -> str | None:
        """`autodiff created this op in the gradient of `%y = %a * %b` (line 4)`, or None for
        an op the user wrote."""
        if self.origin is None:
            return None
        line = self.source_line()
        if line is None or not line.strip():
            what = f"the op at {self}"
        else:
            text = " ".join(line.split())
            if len(text) > 60:
                text = text[:57] + "..."
            what = f"`{text}` (line {self.line})"
        return self.origin.describe(what) + "; it is not in the source"


    def to_json(self) -> list:
        """[file, line, col] and, for an op a pass made, its origin: what a compile cache keeps."""
        out: list = [self.file, self.line, self.col]
        origin = self.origin
        while origin is not None:
            out.append([origin.pass_name, origin.action])
            origin = origin.via
        return out

    @classmethod
    def from_json(cls, data: list) -> Location:
        file, line, col, *origins = data
        origin = None
        for pass_name, action in reversed(origins):
            origin = Origin(pass_name, action, origin)
        return cls(file, line, col, origin)


UNKNOWN = Location("<unknown>", 0, 0)

_CREATING: ContextVar[Origin | None] = ContextVar("gir_creating", default=None)
"""The origin of ops made now: set while a pass runs (per thread, so parallel compiles do not mix)."""


@contextmanager
def creating(pass_name: str | None = None, action: str = "from") -> Iterator[None]:
    """Ops made inside come from `pass_name` (by default the pass already running), `action`
    the user op at their location. Without a running pass and a name, nothing is marked."""
    outer = _CREATING.get()
    name = pass_name or (outer.pass_name if outer is not None else None)
    token = _CREATING.set(Origin(name, action) if name is not None else None)
    try:
        yield
    finally:
        _CREATING.reset(token)


@contextmanager
def rebuilding() -> Iterator[None]:
    """Ops made inside stand for one op each, rebuilt (a `for` made a `scan`, a scan with one
    more stack): they keep the location they are given as it is, with no origin added."""
    token = _CREATING.set(None)
    try:
        yield
    finally:
        _CREATING.reset(token)


def created_at(loc: Location) -> Location:
    """`loc` marked with the origin of ops made now, if a pass is making them. An op made from
    an op that another pass made names both passes (the first one, that made it from the user
    op, and the last); one made by the same pass keeps its origin."""
    origin = _CREATING.get()
    if origin is None or loc == UNKNOWN:
        return loc
    if loc.origin is not None:
        first = loc.origin.via or loc.origin
        if loc.origin.pass_name == origin.pass_name or first.pass_name == origin.pass_name:
            return loc
        origin = replace(origin, via=first)
    return replace(loc, origin=origin)


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    """`; did you mean 'sigmoid'?` when a candidate is close to `word` (difflib's ratio), else
    ''. `prefix` is put before each name shown (`%`, `@`)."""
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.7)
    if not close:
        return ""
    shown = " or ".join(f"'{prefix}{c}'" for c in close)
    return f"; did you mean {shown}?"


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
        origin = self.loc.origin_note()
        if origin:
            parts.append(f"note: {origin}")
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
