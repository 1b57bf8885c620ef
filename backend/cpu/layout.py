"""What the runtime needs to know about compiled code besides its bytes: the arena and pinned
sizes, the GEMM paths chosen, the run-time error messages, the schedule and the externals it
calls. Stored with the object code in the caches (to_json), so this module needs no LLVM."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import Location


@dataclass
class GemmSite:
    key: str
    path: str
    dtype: str
    m: int
    n: int
    k: int
    ta: bool
    tb: bool


@dataclass
class LengthLayout:
    """How code that serves every length (analysis/lengths.py) finds its length and sizes its
    memory per call: `buffers` gains two entries after the pinned area, a pointer to the
    length (an i64) and the *length area*, one block per value that follows the length."""

    min_length: int
    arguments: list[list[int]]
    """[argument, axis, per_step, offset] of each argument dim that is `per_step * T + offset`."""
    results: list[list[int]]
    """The same for the results' dims (their arrays are made per call)."""
    blocks: list[list[int]] = field(default_factory=list)
    """[per_step, offset] bytes of each block of the length area, in order (each 64-byte aligned)."""
    describe: str = ""
    """Which dims follow the length (LengthDims.describe), for `fn.stats.compile.lengths`."""

    def area_bytes(self, t: int) -> int:
        """The length area's size at length t (lower/base.py `Lowering.length_slot` adds them alike)."""
        return sum(align(a * t + b) for a, b in self.blocks)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> LengthLayout:
        return cls(int(data["min_length"]), data["arguments"], data["results"], data["blocks"], data["describe"])


def align(nbytes: int) -> int:
    """nbytes rounded up to the arena's 64-byte alignment."""
    return (nbytes + 63) // 64 * 64


@dataclass
class Layout:
    """Where things are, for the runtime: arena size, pinned size, what was chosen."""

    arena_bytes: int = 0
    pinned_bytes: int = 0
    gemms: list[GemmSite] = field(default_factory=list)
    planned_bytes: int = 0
    """The part of the arena memplan placed (0 when every value has its own slot)."""
    errors: list[tuple[str, object]] = field(default_factory=list)
    """Run-time error code k (the value of counters[2]) is errors[k - 1]: (message, location)."""
    provisional: list[list] = field(default_factory=list)
    """GEMM shapes (blas.path_times' arguments) whose path or family came from the model, not a
    measurement (CpuSchedule.provisional; measured in the background: a later compile refines
    them)."""
    schedule: dict[str, object] = field(default_factory=dict)
    """How the work was laid out, for `fn.stats.schedule`: the CpuSchedule's reasons (split
    loops, the two-core schedule, pending thread times; schedule/), then what the lowering
    counted: stacked values written in place (their rows of the stack) or copied per step,
    `packed_gemm`, `quick_tier`."""
    externals: list[str] = field(default_factory=list)
    """The slots of the `fns` table the code calls (externals.SLOTS)."""
    lengths: LengthLayout | None = None
    """Set when the code serves every length (one `?` dim read at run time); None: static."""

    @property
    def measured(self) -> bool:
        """Every GEMM path and the two-core schedule were decided from measured times."""
        return not self.provisional and not self.schedule.get("overlap_pending")

    def append_note(self, key: str, entry: object) -> None:
        """Adds entry to the list `schedule[key]` (started empty), as the lowering counts."""
        notes = self.schedule.setdefault(key, [])
        assert isinstance(notes, list), f"schedule[{key!r}] is a list of notes"
        notes.append(entry)

    def to_json(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "pinned_bytes": self.pinned_bytes, "planned_bytes": self.planned_bytes,
                "gemms": [g.__dict__ for g in self.gemms],
                "errors": [[m, loc.to_json()] for m, loc in self.errors],  # type: ignore[attr-defined]
                "provisional": self.provisional, "schedule": self.schedule, "externals": self.externals,
                "lengths": self.lengths.to_json() if self.lengths is not None else None}

    @classmethod
    def from_json(cls, data: dict) -> Layout:
        return cls(data["arena_bytes"], data["pinned_bytes"], [GemmSite(**g) for g in data["gemms"]],
                   data.get("planned_bytes", 0), [(m, Location.from_json(loc)) for m, loc in data["errors"]],
                   data.get("provisional", []), dict(data.get("schedule", {})), list(data.get("externals", [])),
                   LengthLayout.from_json(data["lengths"]) if data.get("lengths") else None)
