"""The placement report: where the `place` pass (transforms/placement.py) put each op of a
function and why, and the transfers; `gir opt --placement-report` renders it. `PlaceOptions`
lives here too, since the report prints the options it was made with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import GirPassError
from ..ir.core import Block, Function, Operation, Value
from ..ir.printer import Printer
from .manager import Analyses

CPU, GPU = "cpu", "gpu"
POLICIES = ("aggressive", "lift")


@dataclass(frozen=True)
class PlaceOptions:
    policy: str = "lift"
    """aggressive | lift (see the module docstring)."""
    min_elements: int = 1024
    """Ops whose values all have fewer elements stay on the CPU; scalars always do."""

    def validate(self, pass_name: str) -> None:
        if self.policy not in POLICIES:
            raise GirPassError(f"pass '{pass_name}': policy must be aggressive or lift, got {self.policy!r}")
        if self.min_elements < 0:
            raise GirPassError(f"pass '{pass_name}': min-elements must be >= 0, got {self.min_elements}")


@dataclass
class PlacementReport:
    """Where each op of one function went and why, and the transfers; `--placement-report`.

    It names values as the printer does when it is rendered, so render it right after the
    pipeline (ops a later pass created are listed as not placed by this pass)."""

    function: Function
    options: PlaceOptions
    device: dict[Operation, str]
    reason: dict[Operation, str]
    boundaries: dict[Operation, tuple[Value, Operation]]
    created: int
    removed: int

    def transfer_counts(self) -> dict[str, int]:
        """{"h2d": transfers to the gpu, "d2h": to the cpu} in the function: what a split call
        (device="auto", backend/split.py) executes, each once per call."""
        to = {CPU: 0, GPU: 0}
        for op in self.function.walk():
            if op.spec.moves_device:
                to[op.attrs["device"]] += 1
        return {"h2d": to[GPU], "d2h": to[CPU]}

    def render(self) -> str:
        printer = Printer()
        printer.function(self.function)
        names = printer.names
        rows: list[tuple[str, str, str]] = []
        counts = {CPU: 0, GPU: 0}
        to = {CPU: 0, GPU: 0}
        for op, depth in _walk_with_depth(self.function.body, 0):
            if op.spec.terminator:
                continue
            results = ", ".join(names[r] for r in op.results)
            text = "  " * depth + (f"{results} = " if results else "") + op.name
            if op.name == "transfer":
                device = op.attrs["device"]
                to[device] += 1
                text += " " + names[op.operands[0]]
                boundary = self.boundaries.get(op)
                if boundary is None:
                    why = "not placed by this pass"
                else:
                    src, reader = boundary
                    other = CPU if device == GPU else GPU
                    why = f"boundary: {names[src]} lives on the {other}, '{reader.name}' reads it on the {device}"
            elif op in self.device:
                device, why = self.device[op], self.reason[op]
                counts[device] += 1
            else:
                device, why = op.attrs.get("device", "?"), "not placed by this pass (created later)"
            rows.append((device, text, why))
        width = max((len(t) for _, t, _ in rows), default=0)
        o = self.options
        lines = [f"placement of @{self.function.name} (policy={o.policy}, min-elements={o.min_elements})"]
        lines += [f"  {d:<3}  {t:<{width}}  {w}" for d, t, w in rows]
        n = to[CPU] + to[GPU]
        lines.append(f"  {_plural(counts[GPU], 'op')} on the gpu, {counts[CPU]} on the cpu; {_plural(n, 'transfer')} "
                     f"({to[GPU]} to the gpu, {to[CPU]} to the cpu); inserted {self.created}, "
                     f"removed {self.removed}")
        return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _walk_with_depth(block: Block, depth: int) -> Iterator[tuple[Operation, int]]:
    for op in block:
        yield op, depth
        for region in op.regions:
            yield from _walk_with_depth(region.block, depth + 1)


def placement_reports(analyses: Analyses) -> str:
    """The placement of every function the pipeline's last `place` pass left (still valid: no
    pass changed the IR after it), for `gir opt --placement-report`."""
    reports = analyses.all(PlacementReport)
    if not reports:
        return "placement report: the pipeline has no 'place' pass (or a later pass changed the IR)\n"
    return "".join(r.render() for r in reports)
