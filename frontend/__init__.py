"""The frontends: .gir text (parser.py: fast_parser.py, else Lark) and Python functions traced
(python/)."""

from __future__ import annotations

from collections.abc import Callable

EAGER_LOADERS: list[Callable[[], object]] = []
"""What installs the runner of gir's NumPy-like functions called outside a trace
(python/numpy_api.py `EAGER`, first used there): gir/__init__.py puts here a function that
imports driver/pyjit.py, which fills EAGER. So the frontend imports no driver (DESIGN.md §1):
the top level, which may import every floor, wires the two."""
