"""The specialisation cache of `gir.jit`: what a jitted function compiled, by key, each made once.

`JitFunction` (driver/jit.py) keys it by the argument shapes, `PythonJit` (driver/pyjit.py) by
the argument structure, shapes, dtypes and weak types. Both read `last()`, the specialisation
the calling thread used last (else the last any thread used), for `fn.stats`, `fn.ir`, ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Specialisations(Generic[K, V]):
    """Compiled specialisations by key. Threads that ask for a new key at once compile it once
    (`get` holds a lock while it makes one); a key found takes no lock."""

    def __init__(self) -> None:
        self._found: dict[K, V] = {}
        self._making = threading.Lock()
        self._thread = threading.local()
        """`last`: the specialisation this thread used last."""
        self._last: V | None = None
        """The specialisation any thread used last (what a thread that used none sees)."""

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The specialisation of key, made by make(key) the first time; the calling thread's `last`."""
        found = self._found.get(key)
        if found is None:
            with self._making:
                found = self._found.get(key)
                if found is None:
                    found = self._found[key] = make(key)
        self._last = self._thread.last = found
        return found

    def last(self) -> V | None:
        """The specialisation the calling thread used last; else the last any thread used."""
        found: V | None = getattr(self._thread, "last", None)
        return found if found is not None else self._last

    def __len__(self) -> int:
        return len(self._found)

    def values(self) -> list[V]:
        """Every specialisation made so far, in the order they were made."""
        return list(self._found.values())
