"""The fast parser's terminal table, kept on disk so that reading valid text needs no Lark.

The hand-written parser (fast_parser.py) lexes with `GirLexer.skipping_regex` and its keyword
and punctuation maps, which lexer.py builds from the terminals of grammar.lark as Lark compiles
them. Building them needs the Lark parser (importing Lark, interegular and regex, then loading
its tables: ~20-60 ms of every process); the result is three small values, so the first process
writes them next to Lark's tables (`parser-<hash>.terminals.json` in the gir cache) and later
ones read them back. The key covers what they are made from: the grammar, lexer.py (which builds
the regex), Lark's version (which turns the grammar's terminals into regexes) and Python's.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass

from ..cache import atomic_write, cache_root, digest

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Terminals:
    """What FastParser reads of a GirLexer (a GirLexer itself serves as well)."""

    keywords: dict[str, str]
    """A keyword's text -> its terminal's name (`scan` -> `SCAN`)."""
    punct: dict[str, str]
    """Punctuation's text -> its terminal's name (`(` -> `LPAR`)."""
    skipping_regex: re.Pattern[str]
    """Whitespace and comments, then one token (a named group per terminal) or `END`."""


def _lark_version() -> str:
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


def _table_path() -> str:
    parts = []
    for source in ("grammar.lark", "lexer.py"):
        with open(os.path.join(_HERE, source), encoding="utf-8") as f:
            parts.append(f.read())
    return os.path.join(cache_root(), f"parser-{digest(*parts, _lark_version(), sys.version_info[:2])}.terminals.json")


@functools.cache
def terminals() -> Terminals:
    """The table, from the cache; built from the Lark parser (and written there) when absent or
    unreadable. Shared by all threads: it holds no state of one parse."""
    path = _table_path()
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        return Terminals(dict(saved["keywords"]), dict(saved["punct"]), re.compile(saved["skipping_regex"]))
    except (OSError, ValueError, KeyError, TypeError, re.error):
        pass  # absent, damaged or from another build: made again below
    from .lark_parser import _parser

    lexer = _parser().parser.lexer
    table = Terminals(dict(lexer.keywords), dict(lexer.punct), lexer.skipping_regex)
    atomic_write(path, json.dumps({"keywords": table.keywords, "punct": table.punct,
                                   "skipping_regex": table.skipping_regex.pattern}).encode())
    return table
