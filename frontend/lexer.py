"""A one-regex lexer for the grammar's terminals, plugged into Lark's LALR parser.

Why: Lark's contextual lexer tries terminals one by one and took 1.3 s of the 2 s budget on
a 25,000-op file (bench/parse_scale.py). This lexer builds a single alternation from the
grammar's own terminal definitions (nothing is restated here) and maps names that spell a
keyword to that keyword, which is what Lark's lexers do too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from lark.exceptions import UnexpectedCharacters
from lark.lexer import Lexer, LexerState, PatternStr

from .tokens import Token

# Regex terminals in the order they must be tried: longer or more specific forms first.
_REGEX_ORDER = ("WS", "COMMENT", "LOC", "TYPES", "TYPE", "STRING", "FLOAT", "INT", "VALUE", "FUNC_NAME", "NAME")
_IGNORED = ("WS", "COMMENT")
_MULTILINE = ("WS", "TYPES")
"""Terminals that may span lines (a comment ends at one)."""


class GirLexer(Lexer):
    __future_interface__ = 2

    def __init__(self, lexer_conf: Any):
        strings: dict[str, str] = {}
        regexes: dict[str, str] = {}
        for t in lexer_conf.terminals:
            if isinstance(t.pattern, PatternStr):
                strings[t.pattern.value] = t.name
            else:
                regexes[t.name] = t.pattern.to_regexp()
        missing = set(regexes) - set(_REGEX_ORDER)
        assert not missing, f"lexer.py does not know where to try {missing}"
        self.keywords = {s: name for s, name in strings.items() if s[0].isalpha()}
        self.punct = {s: name for s, name in strings.items() if not s[0].isalpha()}
        punct = "|".join(re.escape(s) for s in sorted(self.punct, key=len, reverse=True))
        names = [n for n in _REGEX_ORDER if n in regexes]
        parts = [f"(?P<{n}>{regexes[n]})" for n in names]
        self.regex = re.compile("|".join(parts) + f"|(?P<PUNCT>{punct})")
        # frontend/fast_parser.py reads the same terminals with whitespace and comments skipped
        # in front of each token (possessively: a comment is never given back and read as '/').
        # `END` matches the empty end of the text, so the last match tells that all was read.
        # The most frequent terminals are tried first; this changes no match, as each of them
        # starts with a character no other terminal starts with (`%`, `@` then a letter, and
        # punctuation; FUNC_NAME stays before `@`).
        skip = "|".join(regexes[n] for n in _IGNORED)
        first = ("VALUE", "FUNC_NAME")
        tokens = "|".join([p for p, n in zip(parts, names) if n in first] + [f"(?P<PUNCT>{punct})"]
                          + [p for p, n in zip(parts, names) if n not in first and n not in _IGNORED])
        self.skipping_regex = re.compile(f"(?:{skip})*+(?:{tokens}|(?P<END>\\Z))")

    # gir's Token has lark.Token's fields, not its class: an override mypy cannot see is one
    def lex(self, lexer_state: LexerState, parser_state: Any) -> Iterator[Token]:  # type: ignore[override]
        text = lexer_state.text.text
        match = self.regex.match
        keywords, punct = self.keywords, self.punct
        pos, end, line, line_start = 0, len(text), 1, 0
        while pos < end:
            m = match(text, pos)
            if m is None:
                raise UnexpectedCharacters(text, pos, line, pos - line_start + 1, allowed=_allowed(parser_state))
            kind = m.lastgroup or ""  # never None: every alternative of the regex is a named group
            value = m.group()
            new_pos = m.end()
            if kind not in _IGNORED:
                if kind == "NAME":
                    kind = keywords.get(value, "NAME")
                elif kind == "PUNCT":
                    kind = punct[value]
                yield Token(kind, value, pos, line, pos - line_start + 1)
            if kind in _MULTILINE:
                newlines = value.count("\n")
                if newlines:
                    line += newlines
                    line_start = text.rfind("\n", pos, new_pos) + 1
            pos = new_pos


def _allowed(parser_state: Any) -> set[str]:
    """The terminals the parser could take next, for the error message (as Lark's own lexers report)."""
    try:
        return {t for t in parser_state.parse_conf.states[parser_state.position] if t.isupper()}
    except (AttributeError, KeyError, IndexError):
        return set()
