"""Text -> IR: `parse`, `load` and `parse_ast`. The hand-written parser (fast_parser.py) reads
valid text into the typed AST of `ast.py`; anything it declines, the Lark LALR parser of
grammar.lark (lark_parser.py, imported only then) parses again and reports; `emitter.py` turns
each function's AST into IR.

Both parsers hold no state of one parse, so threads may parse at once.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from ..config import current
from ..errors import GirArgumentError, GirSyntaxError, Location, remember_source
from ..ir.core import Module
from ..support import timing
from . import ast
from .fast_parser import FastParser
from .terminals import terminals


def parse_ast(text: str, filename: str = "<string>") -> list[ast.Func]:
    """The functions of gir text as AST nodes; a syntax error names `filename`. The hand-written
    parser of fast_parser.py reads valid text; anything it does not take, Lark parses again (and
    reports). `GIR_PARSER=lark` makes Lark parse everything."""
    if current().parser != "lark":
        try:
            return FastParser(text, terminals()).parse()
        except Exception:  # noqa: BLE001 - Fallback, or nesting too deep for recursion: Lark decides
            pass
    from .lark_parser import lark_parse  # imports Lark: only for text the fast parser declines

    return lark_parse(text, filename)


def _parser() -> Any:
    """The Lark parser (lark_parser.py), shared by all parses."""
    from .lark_parser import _parser as lark_parser

    return lark_parser()


def parse(text: str | bytes, filename: str | os.PathLike[str] = "<string>") -> Module:
    """Parses gir text (surface or SSA form) into a verified Module."""
    filename = os.fspath(filename)
    from ..ir.verifier import verify
    from .emitter import emit_module

    if isinstance(text, (bytes, bytearray)):
        text = decode_source(bytes(text), filename)  # the bytes of a file, as gir.load reads them
    elif not isinstance(text, str):
        raise GirArgumentError(f"gir.parse takes the text of a module (a str), not {type(text).__name__}; "
                               "gir.load takes a path")
    remember_source(filename, text)
    # The cyclic GC would scan the growing IR (ops and results point at each other) again and
    # again while it is built: a third of the parse time at 25k ops. Nothing built here is garbage.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with timing.phase("parse: load parser tables"):
            terminals() if current().parser != "lark" else _parser()
        with timing.phase("parse: text to AST"):
            functions = parse_ast(text, filename)
        with timing.phase("parse: emit IR"):
            module = emit_module(functions, filename)
    finally:
        if gc_was_enabled:
            gc.enable()
    with timing.phase("verify"):
        verify(module)
    return module


def load(path: str | os.PathLike[str]) -> Module:
    if not isinstance(path, (str, os.PathLike)):  # open(0) would read standard input
        raise GirArgumentError(f"gir.load takes a path (a str or os.PathLike), not {type(path).__name__}")
    with timing.phase("parse"):
        # locations hold the file name as a str (the printer quotes it, diagnostics compare it)
        return parse(read_source(path), filename=os.fspath(path))


def read_source(path: str | os.PathLike[str]) -> str:
    """The text of a .gir file (a located GirSyntaxError when it cannot be read or decoded)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GirSyntaxError(f"cannot read {path}: {e.strerror or e}") from None
    return decode_source(data, os.fspath(path))


def decode_source(data: bytes, path: str) -> str:
    """The text of a source file: UTF-8, a byte-order mark at the start skipped (editors on
    Windows write one). Invalid UTF-8 is a GirSyntaxError at the first bad byte."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        col = len(data[line_start:e.start].decode("utf-8")) + 1  # in characters, as the lexer counts
        remember_source(path, data.decode("utf-8", errors="replace"))  # to quote the line
        raise GirSyntaxError(f"invalid UTF-8 (byte 0x{data[e.start]:02x}); a .gir file must be UTF-8",
                             Location(path, line, col)) from None
