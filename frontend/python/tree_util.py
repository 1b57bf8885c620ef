"""`gir.tree_util`: jax.tree_util's functions on gir's pytrees (pytree.py: dicts in sorted key
order, lists, tuples, namedtuples, None as an empty subtree; anything else a leaf)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .pytree import TreeDef, flatten, unflatten
from .tracer import GirTraceError, user_location


def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], TreeDef]:
    """(leaves, structure), as jax.tree_util.tree_flatten."""
    leaves, _, treedef = flatten(tree, is_leaf)
    return leaves, treedef


def tree_unflatten(treedef: TreeDef, leaves: Any) -> Any:
    """The tree of structure treedef with these leaves."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise GirTraceError(f"tree_unflatten: {treedef} has {treedef.num_leaves} leaves, got {len(leaves)}",
                            user_location())
    return unflatten(treedef, leaves)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    return flatten(tree, is_leaf)[0]


def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> TreeDef:
    return flatten(tree, is_leaf)[2]


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """f applied leafwise to tree and the trees in rest (which have tree's structure)."""
    leaves, _, treedef = flatten(tree, is_leaf)
    others = []
    for other in rest:
        other_leaves, _, other_def = flatten(other, is_leaf)
        if other_def != treedef:
            raise GirTraceError(f"tree_map: the structure {other_def} differs from {treedef}", user_location())
        others.append(other_leaves)
    return unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])


def tree_reduce(f: Callable[[Any, Any], Any], tree: Any, initializer: Any = None) -> Any:
    import functools

    leaves = tree_leaves(tree)
    return functools.reduce(f, leaves) if initializer is None else functools.reduce(f, leaves, initializer)


__all__ = ["TreeDef", "tree_flatten", "tree_leaves", "tree_map", "tree_reduce", "tree_structure", "tree_unflatten"]
