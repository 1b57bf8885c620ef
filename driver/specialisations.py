"""The specialisation cache of `gir.jit`: what a jitted function compiled, by key, each made once,
at most `GIR_MAX_SPECIALISATIONS` of them kept (config.py `max_specialisations`, default 64).

`JitFunction` (driver/jit.py) keys it by the argument shapes, `PythonJit` (driver/pyjit.py) by
the argument structure, shapes, dtypes and weak types. Both read `last()`, the specialisation
the calling thread used last (else the last any thread used), for `fn.stats`, `fn.ir`, ...

Eviction: a process that calls one function with ever new shapes would otherwise keep every
specialisation it compiled (about 0.15 MB each for a small function, its loaded code, IR texts
and workspace; docs/reliability.md). When a new one is made past the bound, the least recently
used one is dropped: its code is freed once nothing else holds it (a call in flight holds its
entry; `fn.compiled` or `fn.stats` of a thread that used it last hold it until that thread calls
again). A later call with its key compiles it again (or loads it from the compile cache).
"""

from __future__ import annotations

import inspect
import itertools
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ..config import current

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Specialisations(Generic[K, V]):
    """Compiled specialisations by key. Threads that ask for a new key at once compile it once
    (`get` holds a lock while it makes one, and evicts then); a key found takes no lock."""

    def __init__(self, on_evict: Callable[[K, V], object] | None = None) -> None:
        """on_evict(key, value): called (under the lock) for each specialisation evicted, so that
        the owner drops what else refers to it. A bound method is held weakly: its owner holds
        this cache, and a cycle would leave the owner, and the code it loaded, to the cyclic
        collector instead of freeing them when the last reference goes."""
        self._found: dict[K, V] = {}
        self._used: dict[K, int] = {}
        """When each key was last asked for (a tick of `_clock`): a dict store on the lock-free
        path, where moving the key in an ordered dict could race with an eviction."""
        self._clock = itertools.count()
        self._making = threading.Lock()
        self._thread = threading.local()
        """`last`: the specialisation this thread used last."""
        self._last: V | None = None
        """The specialisation any thread used last (what a thread that used none sees)."""
        self._on_evict: Callable[[], Callable[[K, V], object] | None] | None = None
        if on_evict is not None:
            self._on_evict = weakref.WeakMethod(on_evict) if inspect.ismethod(on_evict) else lambda: on_evict
        self.evicted = 0
        """Specialisations dropped to keep within the bound, so far."""

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The specialisation of key, made by make(key) the first time (evicting the least
        recently used one past the bound); the calling thread's `last`."""
        found = self._found.get(key)
        if found is None:
            with self._making:
                found = self._found.get(key)
                if found is None:
                    found = self._found[key] = make(key)
                    self._used[key] = next(self._clock)
                    self._evict(current().max_specialisations)
        self._used[key] = next(self._clock)
        self._last = self._thread.last = found
        return found

    def _evict(self, bound: int | None) -> None:
        """Drops the least recently used specialisations past bound (None: no bound); the one
        just made is the most recently used, so it stays."""
        if bound is None or len(self._found) <= bound:
            return
        order = sorted(self._found, key=lambda k: self._used.get(k, -1))
        for key in order[: len(self._found) - bound]:
            value = self._found.pop(key)
            self.evicted += 1
            told = self._on_evict() if self._on_evict is not None else None
            if told is not None:
                told(key, value)
        self._used = {k: self._used.get(k, -1) for k in self._found}  # stale ticks of evicted keys go

    def last(self) -> V | None:
        """The specialisation the calling thread used last; else the last any thread used."""
        found: V | None = getattr(self._thread, "last", None)
        return found if found is not None else self._last

    def __len__(self) -> int:
        return len(self._found)

    def holds(self, value: V) -> bool:
        """Whether value is kept under some key (one value may be kept under two: code for every
        length under the shapes of its first call and under its generic key)."""
        return any(v is value for v in list(self._found.values()))

    def distinct(self) -> int:
        """How many distinct values are kept."""
        return len({id(v) for v in list(self._found.values())})

    def values(self) -> list[V]:
        """Every specialisation kept, in the order they were made."""
        return list(self._found.values())
