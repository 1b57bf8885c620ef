"""The fast parser's terminal table, shipped with the package so that reading valid text needs no Lark.

The hand-written parser (fast_parser.py) lexes with `GirLexer.skipping_regex` and its keyword
and punctuation maps, which lexer.py builds from the terminals of grammar.lark as Lark compiles
them. Building them needs the Lark parser (importing Lark, interegular and regex, then building
or loading its LALR tables: ~0.3 s in a process whose cache is empty); the result is three small
values, so they are generated once and checked in as `terminals_table.json`:

    python -m gir.frontend.make_terminals_table   # regenerate after editing grammar.lark or lexer.py

tests/test_terminals_table.py fails when the shipped table is stale. The table is keyed by what
it is made from: the text of grammar.lark and lexer.py, and Lark's version, which is part of it
too (`%import common.WS` is Lark's own definition, Lark names the anonymous punctuation
terminals -- `(` is `LPAR` -- and it spells each terminal as a regex). When the key does not
match (another Lark version installed, or a grammar edited without regenerating), the table is
built from the Lark parser as before and kept in the gir cache (`parser-<hash>.terminals.json`),
so that costs a machine once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..support.cache import atomic_write, cache_root, digest, read_file

_HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(_HERE, "terminals_table.json")
"""The checked-in table (a module attribute so that tests can point it elsewhere)."""


@dataclass(frozen=True)
class Terminals:
    """What FastParser reads of a GirLexer (a GirLexer itself serves as well)."""

    keywords: dict[str, str]
    """A keyword's text -> its terminal's name (`scan` -> `SCAN`)."""
    punct: dict[str, str]
    """Punctuation's text -> its terminal's name (`(` -> `LPAR`)."""
    skipping_regex: re.Pattern[str]
    """Whitespace and comments, then one token (a named group per terminal) or `END`."""


def lark_version() -> str:
    """Lark's version, read from its __init__.py without importing it (importing costs ~15 ms)."""
    spec = importlib.util.find_spec("lark")
    if spec is None or spec.origin is None:
        return "none"
    try:
        with open(spec.origin, encoding="utf-8") as f:
            found = re.search(r"^__version__[^=]*=\s*['\"]([^'\"]+)", f.read(), re.MULTILINE)
    except OSError:
        return "unknown"
    return found.group(1) if found else "unknown"


def sources_digest() -> str:
    """SHA-256 of grammar.lark and lexer.py: what the table is made from in this repository."""
    h = hashlib.sha256()
    for source in ("grammar.lark", "lexer.py"):
        with open(os.path.join(_HERE, source), "rb") as f:
            data = f.read()
        h.update(f"{source}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _cache_path(sources: str, lark: str) -> str:
    return os.path.join(cache_root(), f"parser-{digest(sources, lark, sys.version_info[:2])}.terminals.json")


def _read(path: str, sources: str, lark: str) -> Terminals | None:
    """The table saved at path when it was made from these sources and this Lark, else None."""
    try:
        if path == SHIPPED:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        else:  # the cache's copy: only a private regular file (cache.read_file), never a FIFO
            data = read_file(path, limit=1 << 20)
            if data is None:
                return None
            saved = json.loads(data)
        if saved["sources"] != sources or saved["lark"] != lark:
            return None
        return Terminals(dict(saved["keywords"]), dict(saved["punct"]), re.compile(saved["skipping_regex"]))
    except (OSError, ValueError, KeyError, TypeError, re.error):
        return None  # absent, damaged or from another build: made again


def build() -> Terminals:
    """The table as the Lark parser's lexer (lexer.py's GirLexer) makes it: imports Lark."""
    from .lark_parser import _parser

    lexer = _parser().parser.lexer
    return Terminals(dict(lexer.keywords), dict(lexer.punct), lexer.skipping_regex)


def to_json(table: Terminals, sources: str, lark: str) -> dict[str, Any]:
    return {"sources": sources, "lark": lark, "keywords": table.keywords, "punct": table.punct,
            "skipping_regex": table.skipping_regex.pattern}


@functools.cache
def terminals() -> Terminals:
    """The table: the shipped one when its key matches, else the gir cache's, else built from the
    Lark parser (and written to the cache). Shared by all threads: it holds no state of one parse."""
    sources, lark = sources_digest(), lark_version()
    for path in (SHIPPED, _cache_path(sources, lark)):
        table = _read(path, sources, lark)
        if table is not None:
            return table
    table = build()
    atomic_write(_cache_path(sources, lark), json.dumps(to_json(table, sources, lark)).encode())
    return table


def write_shipped(path: str = SHIPPED) -> str:
    """Writes the shipped table from the installed Lark (make_terminals_table.py's command);
    returns what it wrote, for the message."""
    sources, lark = sources_digest(), lark_version()
    text = json.dumps(to_json(build(), sources, lark), indent=1, sort_keys=True) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return f"wrote {path} (Lark {lark}, grammar.lark + lexer.py {sources[:12]})"
