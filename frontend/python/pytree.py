"""Pytrees: nested dicts, lists, tuples (and None) of arrays, flattened to leaves and rebuilt.

As in JAX: a dict's children are taken in sorted key order, None is an empty subtree, and
anything else is a leaf. Each leaf also gets a path (`("params", "wx")`) from which the
tracer names function arguments (`%params_wx`), so a printed module reads like the Python.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import GirTypeError, Location


@dataclass(frozen=True)
class TreeDef:
    """The structure of a pytree without its leaves; hashable (a compile-cache key)."""

    kind: str
    """leaf | none | tuple | list | dict | namedtuple"""
    meta: Hashable = None
    """dict keys (sorted) or the namedtuple class."""
    children: tuple[TreeDef, ...] = ()

    @property
    def keys(self) -> tuple[Any, ...]:
        return self.meta if isinstance(self.meta, tuple) else ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __str__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = [str(c) for c in self.children]
        if self.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(self.keys, inner)) + "}"
        if self.kind == "list":
            return "[" + ", ".join(inner) + "]"
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"


LEAF = TreeDef("leaf")


def _sorted_keys(d: dict[Any, Any]) -> list[Any]:
    try:
        return sorted(d)
    except TypeError:  # keys of mixed types: keep insertion order (still deterministic)
        return list(d)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None,
            path: tuple[str, ...] = ()) -> tuple[list[Any], list[tuple[str, ...]], TreeDef]:
    """(leaves, their paths, structure)."""
    leaves: list[Any] = []
    paths: list[tuple[str, ...]] = []
    treedef = _flatten(tree, path, leaves, paths, is_leaf)
    return leaves, paths, treedef


def _flatten(tree: Any, path: tuple[str, ...], leaves: list[Any], paths: list[tuple[str, ...]],
             is_leaf: Callable[[Any], bool] | None) -> TreeDef:
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        paths.append(path)
        return LEAF
    if tree is None:
        return TreeDef("none")
    if isinstance(tree, dict):
        keys = _sorted_keys(tree)
        children = tuple(_flatten(tree[k], path + (str(k),), leaves, paths, is_leaf) for k in keys)
        return TreeDef("dict", tuple(keys), children)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        children = tuple(_flatten(v, path + (f,), leaves, paths, is_leaf) for f, v in zip(tree._fields, tree))
        return TreeDef("namedtuple", type(tree), children)
    if isinstance(tree, (list, tuple)):
        children = tuple(_flatten(v, path + (str(i),), leaves, paths, is_leaf) for i, v in enumerate(tree))
        return TreeDef("list" if isinstance(tree, list) else "tuple", None, children)
    leaves.append(tree)
    paths.append(path)
    return LEAF


def unflatten(treedef: TreeDef, leaves: Sequence[Any]) -> Any:
    it = iter(leaves)
    out = _build(treedef, it)
    return out


def _build(treedef: TreeDef, it: Any) -> Any:
    kind = treedef.kind
    if kind == "leaf":
        return next(it)
    if kind == "none":
        return None
    children = [_build(c, it) for c in treedef.children]
    if kind == "dict":
        return dict(zip(treedef.keys, children))
    if kind == "namedtuple":
        assert callable(treedef.meta)
        return treedef.meta(*children)
    return children if kind == "list" else tuple(children)


_NOT_NAME = re.compile(r"[^A-Za-z0-9_]+")


def value_name(path: Sequence[str]) -> str:
    """A path as a `.gir` value name: ("params", "w.x") -> "params_w_x"."""
    name = "_".join(_NOT_NAME.sub("_", p).strip("_") or "_" for p in path if p != "") or "arg"
    return name


def func_name(name: str) -> str:
    """A Python name as a `.gir` function name (`<lambda>` -> `lambda`)."""
    name = _NOT_NAME.sub("_", name).strip("_") or "f"
    return name if not name[0].isdigit() else "f" + name


def check_same(expected: TreeDef, got: TreeDef, what: str, loc: Location) -> None:
    if expected != got:
        raise GirTypeError(f"{what}: the structure {got} differs from {expected}", loc)
