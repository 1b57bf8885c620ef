"""One timing tree for a whole compile (`--timing`, `gir.jit(..., timing=True)` via `collect`):
parse, verify, each pass, printing, the backend's lowering and LLVM, and the compile cache.

    with timing.collect() as root:          # records while the block runs (this thread/context)
        ...                                  # code below calls `with timing.phase("parse"):`
    print(root.tree())

Outside `collect` a phase costs one context-variable read. This module imports only the
standard library: every stage may use it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    """Wall-clock seconds."""
    cpu: float = 0.0
    """CPU seconds of the thread that ran the phase (on a shared machine, what others' work
    disturbs least)."""
    count: int = 0
    children: list[Phase] = field(default_factory=list)

    def child(self, name: str) -> Phase:
        for c in self.children:
            if c.name == name:
                return c
        c = Phase(name)
        self.children.append(c)
        return c

    def find(self, name: str) -> Phase | None:
        """The first phase called name, depth first (for tests and benchmarks)."""
        for c in self.children:
            if c.name == name:
                return c
            found = c.find(name)
            if found is not None:
                return found
        return None

    def tree(self) -> str:
        total = self.seconds or sum(c.seconds for c in self.children)
        lines = ["===--------------------------------------------------------------===",
                 "                    gir compile timing report",
                 "===--------------------------------------------------------------===",
                 f"  {'seconds':>9}  {'cpu s':>9}  {'share':>6}  phase"]
        self._lines(lines, total, 0)
        rest = total - sum(c.seconds for c in self.children)
        if self.children and rest > 0.0005:
            cpu = self.cpu - sum(c.cpu for c in self.children)
            lines.append(f"  {rest:9.4f}  {cpu:9.4f}  {100 * rest / total:5.1f}%  (other: imports, reading files, "
                         "running)")
        lines.append(f"  {total:9.4f}  {self.cpu:9.4f}  100.0%  {self.name}")
        return "\n".join(lines) + "\n"

    def _lines(self, lines: list[str], total: float, depth: int) -> None:
        for c in self.children:
            times = f" (x{c.count})" if c.count > 1 else ""
            share = f"{100 * c.seconds / total:5.1f}%" if total else "     -"
            lines.append(f"  {c.seconds:9.4f}  {c.cpu:9.4f}  {share}  {'  ' * depth}{c.name}{times}")
            c._lines(lines, total, depth + 1)
            if c.children:
                rest = c.seconds - sum(g.seconds for g in c.children)
                if rest > 0.0005:
                    share = f"{100 * rest / total:5.1f}%" if total else "     -"
                    cpu = c.cpu - sum(g.cpu for g in c.children)
                    lines.append(f"  {rest:9.4f}  {cpu:9.4f}  {share}  {'  ' * (depth + 1)}(other)")


_current: contextvars.ContextVar[Phase | None] = contextvars.ContextVar("gir_timing", default=None)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Times the block as `name` under the enclosing phase (same names add up)."""
    parent = _current.get()
    if parent is None:
        yield
        return
    node = parent.child(name)
    token = _current.set(node)
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        node.seconds += time.perf_counter() - start
        node.cpu += time.thread_time() - cpu
        node.count += 1
        _current.reset(token)


def active() -> bool:
    return _current.get() is not None


@contextmanager
def collect(name: str = "total") -> Iterator[Phase]:
    """Records the phases of the block into a new tree (nested inside an enclosing one, if any)."""
    parent = _current.get()
    root = parent.child(name) if parent is not None else Phase(name)
    token = _current.set(root)
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        yield root
    finally:
        root.seconds += time.perf_counter() - start
        root.cpu += time.thread_time() - cpu
        root.count += 1
        _current.reset(token)
