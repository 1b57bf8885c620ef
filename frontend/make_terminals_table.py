"""Regenerates frontend/terminals_table.json, the fast parser's shipped terminal table
(terminals.py), from grammar.lark, lexer.py and the installed Lark:

    python -m gir.frontend.make_terminals_table

Run it after editing grammar.lark or lexer.py, or to ship a table for another Lark version;
tests/test_terminals_table.py fails while the shipped table is stale.
"""

from __future__ import annotations

from .terminals import write_shipped

if __name__ == "__main__":
    print(write_shipped())
