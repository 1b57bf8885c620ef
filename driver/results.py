"""Named results: what `gir.jit` functions and `gir.interpret` return, and what `gir run` prints.

A function's results are named from its `return` operands, as written:

    return %loss, %dwx, %x @ %w      ->  ("loss", "dwx", "out2")

A result falls back to `out<i>` (its position) when its operand has no name (a temporary such
as `%0` or an expression), when the name is not a Python identifier usable as a field (a
keyword, a leading `_`, a tuple method such as `count`), or when an earlier result already
took the name (`return %h, %h` -> `h, out1`). An SSA suffix is dropped (`%loss.1` -> `loss`),
so names survive the `ssa` pass and dumps that re-parse.

The result is a tuple subclass made with `collections.namedtuple`: it unpacks and indexes as
a tuple, has `len`, `._fields`, `._asdict()` and `.loss`, and compares equal to a tuple *or a
list* of the same elements (results used to be lists). Pickling gives a plain tuple (the class
is made per function at run time and cannot be found by name).
"""

from __future__ import annotations

import collections
import keyword
import re
from functools import lru_cache
from typing import Any

from ..ir.core import Function

_SSA_SUFFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\.\d+$")
_RESERVED = frozenset(dir(tuple)) | {"count", "index"}
"""Names that would shadow a tuple method or attribute: those results are called out<i>."""


def usable_name(name: str | None) -> str | None:
    """name as a field name, or None when it cannot be one (see the module docstring)."""
    if not name:
        return None
    suffixed = _SSA_SUFFIX.match(name)
    if suffixed:
        name = suffixed.group(1)
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in _RESERVED:
        return None
    if re.fullmatch(r"out\d+", name):
        return None  # `out3` at position 0 would clash with the fallback name of result 3
    return name


def result_names(f: Function) -> tuple[str, ...]:
    """One name per result of f, from its `return` operands (out<i> where there is none)."""
    term = f.body.terminator
    operands = list(term.operands) if term is not None else []
    names: list[str] = []
    for i in range(len(f.result_types)):
        name = usable_name(operands[i].name_hint) if i < len(operands) else None
        names.append(name if name is not None and name not in names else f"out{i}")
    return tuple(names)


def _eq(self: tuple, other: object) -> Any:
    if isinstance(other, (tuple, list)):
        return tuple(self) == tuple(other)
    return NotImplemented


def _ne(self: tuple, other: object) -> Any:
    if isinstance(other, (tuple, list)):
        return tuple(self) != tuple(other)
    return NotImplemented


def _reduce(self: tuple) -> tuple:
    return (tuple, (tuple(self),))


@lru_cache(maxsize=256)
def results_class(entry: str, names: tuple[str, ...]) -> type:
    """The named-tuple class of @entry's results (one per entry name and field names)."""
    class_name = re.sub(r"\W", "_", entry) or "results"
    if not class_name.isidentifier() or keyword.iskeyword(class_name):
        class_name = "results_" + class_name
    base = collections.namedtuple(class_name, names)  # type: ignore[misc]
    return type(class_name, (base,), {
        "__slots__": (), "__eq__": _eq, "__ne__": _ne, "__hash__": tuple.__hash__, "__reduce__": _reduce,
        "__module__": __name__,
        "__doc__": f"The results of @{entry}: " + ", ".join(names) + " (a tuple; also equal to a list of them)."})


def name_results(f: Function, values: Any, names: tuple[str, ...] | None = None) -> tuple:
    """values (a list of arrays, f's results) as @f's named-tuple of results."""
    names = names if names is not None else result_names(f)
    return results_class(f.name, names)(*values)
