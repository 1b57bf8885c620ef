"""Where buffers go in the arena: the placement strategies and the lower bound.

Every buffer comes with its live range [first, last] (program points, liveness.py) and a size;
placing gives it an offset so that buffers live at a common point do not overlap.

Strategies:
- "size": largest buffer first (ties: the earlier first), each into the best-fitting free gap
  at least as large among the buffers already placed that are live at the same time,
  splitting the gap; when none fits, above them. A static planner knows every lifetime up
  front, so it can keep the big blocks contiguous (greedy by size, as in Pisarchyk and Lee,
  "Efficient memory management for deep neural net inference", 2020). When that misses the
  lower bound, it places again in their "greedy by breadth" order (the buffers live at the
  busiest point first, largest first among equals) and keeps the smaller arena; the plan's
  strategy then reads "breadth". Its cost is the number of (buffer, buffer live at the same
  time) pairs: quadratic when thousands of values are live at once, as in a long training step.
- "program": an online allocator in program order: a dead buffer's block goes back to a free
  list (merged with free neighbours); a new buffer takes the best-fitting free block at least
  as large, splitting the remainder, else grows the arena. What a runtime allocator can do,
  O(n log n); it may split a big free block that a later big buffer needed.
- "auto" (the default): "size" when there are at most SIZE_BUDGET pairs of buffers live at a
  common point per buffer on average (counted in O(n)), else "program".

The *lower bound* is the most bytes of buffers live at one point: no placement of these
buffers does better. A buffer's *previous* is the dead buffer whose block it reuses (the
report's "reused block of %y").
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable

from .plan import Buffer

STRATEGIES = ("auto", "size", "program")

SIZE_BUDGET = 64
"""auto places by size while there are at most this many pairs of buffers live at a common
point per buffer (on average), else in program order."""

_CHUNK = 16
"""Points per bucket of the time index that finds the placed buffers live during a range."""


def place_buffers(buffers: list[Buffer], num_points: int, strategy: str) -> str:
    """Sets the offset and `previous` of every buffer (all of nonzero size, their live ranges
    set) by strategy: auto, size or program. Returns the placement that made the offsets:
    size, breadth or program."""
    by_size = strategy == "size" or (
        strategy == "auto" and _overlapping_pairs(buffers, num_points) <= SIZE_BUDGET * len(buffers))
    if by_size:
        placed_by = _place_by_size_or_breadth(buffers, num_points)
    else:
        _place_in_program_order(buffers)
        placed_by = "program"
    _find_previous(buffers)
    return placed_by


def lower_bound(buffers: list[Buffer], num_points: int) -> int:
    """The most bytes of buffers live at one point."""
    delta = [0] * (num_points + 2)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    best = running = 0
    for d in delta:
        running += d
        if running > best:
            best = running
    return best


def _place_by_size_or_breadth(buffers: list[Buffer], num_points: int) -> str:
    """Largest first; when that misses the lower bound, the buffers of the busiest points
    first, keeping whichever arena is smaller. Returns which one it kept."""
    place_by_size(buffers, num_points, lambda b: (-b.size, b.first, -b.last))
    arena = max((b.end for b in buffers), default=0)
    if arena <= lower_bound(buffers, num_points):
        return "size"
    by_size_offsets = [b.offset for b in buffers]
    peak = busiest(buffers, num_points)
    place_by_size(buffers, num_points, lambda b: (-peak[b], -b.size, b.first))
    if max((b.end for b in buffers), default=0) < arena:
        return "breadth"
    for b, offset in zip(buffers, by_size_offsets):
        b.offset = offset
    return "size"


def _overlapping_pairs(buffers: list[Buffer], num_points: int) -> int:
    """How many pairs of buffers are live at a common point (each counted where the later one
    starts): what placing by size costs."""
    starting = [0] * (num_points + 1)
    ending = [0] * (num_points + 2)
    for b in buffers:
        starting[b.first] += 1
        ending[b.last + 1] += 1
    pairs = live = 0
    for point in range(num_points):
        live -= ending[point]
        n = starting[point]
        pairs += n * live + n * (n - 1) // 2
        live += n
    return pairs


def busiest(buffers: list[Buffer], num_points: int) -> dict[Buffer, int]:
    """Each buffer -> the most bytes live at one point of its range (a sparse table of the
    bytes live at each point answers each range in O(1))."""
    delta = [0] * (num_points + 1)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    row, running = [], 0
    for d in delta[:num_points]:
        running += d
        row.append(running)
    table = [row]
    width = 1
    while 2 * width <= num_points:
        prev = table[-1]
        table.append(list(map(max, prev[: len(prev) - width], prev[width:])))
        width *= 2
    out: dict[Buffer, int] = {}
    for b in buffers:
        k = (b.last - b.first + 1).bit_length() - 1
        level = table[k]
        out[b] = max(level[b.first], level[b.last - (1 << k) + 1])
    return out


def place_by_size(buffers: list[Buffer], num_points: int, order: Callable[[Buffer], tuple]) -> None:
    """In the given order, each buffer into the best-fitting gap among the placed buffers live
    at the same time; above them when none fits."""
    chunks: list[list[Buffer]] = [[] for _ in range(num_points // _CHUNK + 1)]
    for b in buffers:
        b._stamp = 0
    stamp = 0
    for b in sorted(buffers, key=order):
        stamp += 1
        first, last, size = b.first, b.last, b.size
        lo, hi = first // _CHUNK, last // _CHUNK
        occupied: list[tuple[int, int]] = []
        for c in range(lo, hi + 1):
            for o in chunks[c]:
                if o._stamp != stamp:  # a long-lived buffer sits in many chunks: look once
                    o._stamp = stamp
                    if o.first <= last and o.last >= first:
                        occupied.append((o.offset, o.offset + o.size))
        occupied.sort()
        best, best_gap, top = -1, 0, 0
        for start, end in occupied:
            gap = start - top
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = top, gap
            if end > top:
                top = end
        b.offset = best if best >= 0 else top
        for c in range(lo, hi + 1):
            chunks[c].append(b)


class _FreeList:
    """Free blocks of an arena that grows at its top: best fit by size, merged on release."""

    def __init__(self) -> None:
        self.by_size: list[tuple[int, int]] = []
        """(size, offset), sorted."""
        self.size_at: dict[int, int] = {}
        """offset -> size of the free block starting there."""
        self.start_of_end: dict[int, int] = {}
        """end -> offset of the free block ending there."""
        self.top = 0

    def _remove(self, offset: int) -> int:
        size = self.size_at.pop(offset)
        del self.start_of_end[offset + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, offset)))
        return size

    def _add(self, offset: int, size: int) -> None:
        if offset + size == self.top:  # the block under the top: give it back to the top
            self.top = offset
            return
        self.size_at[offset] = size
        self.start_of_end[offset + size] = offset
        bisect.insort(self.by_size, (size, offset))

    def allocate(self, size: int) -> int:
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i < len(self.by_size):
            block_size, offset = self.by_size[i]
            self._remove(offset)
            if block_size > size:
                self._add(offset + size, block_size - size)
            return offset
        offset = self.top
        self.top += size
        return offset

    def release(self, offset: int, size: int) -> None:
        end = offset + size
        before = self.start_of_end.get(offset)
        if before is not None:
            size += self._remove(before)
            offset = before
        if end in self.size_at:
            size += self._remove(end)
        self._add(offset, size)


def _place_in_program_order(buffers: list[Buffer]) -> None:
    free = _FreeList()
    ending: list[tuple[int, int, Buffer]] = []
    for i, b in enumerate(sorted(buffers, key=lambda b: (b.first, -b.size, b.last))):
        while ending and ending[0][0] < b.first:
            _, _, dead = heapq.heappop(ending)
            free.release(dead.offset, dead.size)
        b.offset = free.allocate(b.size)
        heapq.heappush(ending, (b.last, i, b))


def _find_previous(buffers: list[Buffer]) -> None:
    """Sets each buffer's `previous`: of the buffers placed before it in time over any of its
    bytes, the one that died last. A sweep in time order over a map of the arena's bytes ->
    the buffer that used them last (non-overlapping segments sorted by offset)."""
    starts: list[int] = []
    ends: list[int] = []
    owners: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (b.first, b.offset)):
        lo, hi = b.offset, b.end
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or ends[i] <= lo:
            i += 1
        j = i
        previous: Buffer | None = None
        while j < len(starts) and starts[j] < hi:
            o = owners[j]
            if previous is None or o.last > previous.last:
                previous = o
            j += 1
        b.previous = previous
        # b now owns [lo, hi); the segments it covers only partly keep their outer parts.
        new_starts, new_ends, new_owners = [lo], [hi], [b]
        if i < j and starts[i] < lo:
            new_starts.insert(0, starts[i])
            new_ends.insert(0, lo)
            new_owners.insert(0, owners[i])
        if i < j and ends[j - 1] > hi:
            new_starts.append(hi)
            new_ends.append(ends[j - 1])
            new_owners.append(owners[j - 1])
        starts[i:j], ends[i:j], owners[i:j] = new_starts, new_ends, new_owners
