"""The CLI's reports on analyses, for people: `gir opt --memplan-report` and `--memplan-plot`.

The analyses themselves (analysis/memory/) compute and keep numbers; this module lays them out
as text tables and draws them.

- *Memory plan report*: per function, the plan's summary line, then one row per planned value
  and per view (not the steps of sequences) in program order: the value's printed name, its
  source line (`-` for ops a pass made), its bytes, its live range (to the last point its
  memory is needed, through views too), its offset, and why it is there (`MemoryPlan.reason`).
- *Memory plan plot*: per function, program points across, arena offsets up, one box per
  value coloured by its slot kind, scan bodies shaded, the lower bound dashed. Needs matplotlib
  (the `plot` extra).
"""

from __future__ import annotations

from typing import Any

from ..analysis.liveness import value_names
from ..analysis.memory.aliases import ARGUMENTS_HOME
from ..analysis.memory.plan import CARRY, IN_PLACE, NEW, PINNED, REUSED, MemoryPlan, nbytes_of, value_loc
from ..errors import GirError
from ..ir.core import OpResult, Value


def memplan_reports(plans: list[MemoryPlan]) -> str:
    """The report of every plan, one after another."""
    return "\n".join(memplan_report(p) for p in plans)


def memplan_report(plan: MemoryPlan, names: dict[Value, str] | None = None) -> str:
    """The summary line, then the table of values described in this module's docstring."""
    lines = [plan.summary()]
    if not plan.supported:
        return lines[0] + "\n"
    names = names if names is not None else value_names(plan.function)
    rows = [("value", "line", "bytes", "live", "offset", "reason")]
    live = plan.liveness
    for v in live.values():
        in_loop_buffer = v in plan.external and plan.why_external.get(v) != ARGUMENTS_HOME
        if v not in plan.slots and not (v in plan.views and isinstance(v, OpResult)) and not in_loop_buffer:
            continue
        first, last = live.range(v)
        last = max(last, plan.held_until.get(v, last))
        line = value_loc(v).line
        slot = plan.slots.get(v)
        nbytes = slot.nbytes if slot is not None else nbytes_of(v.tensor_type)
        rows.append((names[v], str(line) if line else "-", str(nbytes), f"[{first}, {last}]",
                     str(slot.offset) if slot is not None else "-", plan.reason(v, names)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3].ljust(widths[3]),
                 r[4].rjust(widths[4]), r[5]]
        lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


_COLORS = {NEW: "#4878d0", REUSED: "#6acc64", IN_PLACE: "#ee854a", CARRY: "#d65f5f", PINNED: "#956cb4"}
"""Slot kind -> box colour in the plot."""


def plot_plans(plans: list[MemoryPlan], path: str, peaks_before: dict[str, int] | None = None) -> None:
    """Draws each plan's buffers as boxes into the PNG file path: program points across, arena
    offsets up; colour by how the buffer's first value got it. `peaks_before`: function name ->
    its planned peak before the `checkpoint` pass rewrote it (a memory budget), drawn as a
    dotted red line above the plan it became."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed: the CLI only writes a file
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise GirError("--memplan-plot needs matplotlib: pip install 'gir[plot]' (or pip install matplotlib)") \
            from None
    plans = [p for p in plans if p.supported and p.buffers]
    if not plans:
        raise GirError("no function has a memory plan to draw (dynamic shapes or no values)")
    fig, axes = plt.subplots(len(plans), 1, figsize=(11, 3.8 * len(plans)), squeeze=False)
    for ax, plan in zip(axes[:, 0], plans):
        _draw_plan(ax, plan, (peaks_before or {}).get(plan.function.name))
    handles = [Patch(color=c, label=k) for k, c in _COLORS.items()]
    axes[0, 0].legend(handles=handles, loc="lower right", fontsize=7, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _draw_plan(ax: Any, plan: MemoryPlan, peak_before: int | None = None) -> None:
    """One plan on one matplotlib Axes; big buffers are labelled with their first value."""
    from matplotlib.patches import Rectangle

    names = value_names(plan.function)
    live = plan.liveness
    scale, unit = (1024 * 1024, "MiB") if plan.arena_bytes >= 1024 * 1024 else (1024, "KiB")
    for op, end in live.end_of.items():
        if op.name == "scan":
            ax.axvspan(live.point(op) - 0.5, end + 0.5, color="gray", alpha=0.08, linewidth=0)
    for v, slot in plan.slots.items():
        if slot.buffer.size == 0:
            continue
        first, held = live.first[v], plan.held_until[v]
        if slot.buffer.pinned:
            first, held = 0, max(live.num_points - 1, 0)
        ax.add_patch(Rectangle((first - 0.5, slot.offset / scale), held - first + 1, slot.buffer.size / scale,
                               facecolor=_COLORS[slot.kind], edgecolor="black", linewidth=0.3, alpha=0.85))
        if slot.buffer.size >= 0.15 * plan.arena_bytes and slot.buffer.values[0] is v:
            ax.text(first - 0.3, (slot.offset + slot.buffer.size / 2) / scale, names[v], fontsize=7, va="center")
    ax.axhline(plan.lower_bound / scale, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlim(-1, live.num_points)
    top = max(plan.arena_bytes, peak_before or 0, 1)
    if peak_before is not None:
        ax.axhline(peak_before / scale, color="#c03030", linestyle=":", linewidth=1.2)
        ax.text(0, peak_before / scale, f" peak before checkpointing: {peak_before / scale:.2f} {unit}",
                color="#c03030", fontsize=7, va="bottom")
    ax.set_ylim(0, top / scale * 1.08)
    ax.set_xlabel("program point (shaded: scan bodies)")
    ax.set_ylabel(f"arena offset ({unit})")
    ax.set_title(f"@{plan.function.name}: arena {plan.arena_bytes / scale:.2f} {unit}, lower bound "
                 f"{plan.lower_bound / scale:.2f} {unit} (dashed), naive {plan.naive_bytes / scale:.2f} {unit}",
                 fontsize=10)


def peaks_before_checkpointing(decisions: list[Any]) -> dict[str, int]:
    """Function name -> the planned peak before its first checkpoint decision."""
    out: dict[str, int] = {}
    for d in decisions:
        if d.segment and d.peak_before is not None:
            out.setdefault(d.function, d.peak_before)
    return out


def checkpoint_report(decisions: list[Any]) -> str:
    """One line per decision of the `checkpoint` pass (transforms/checkpoint.py CheckpointDecision):
    the scan's length, the segment, checkpoints kept, the remainder, the recompute factor and
    the planned peak before and after."""
    return "".join(f"checkpoint {d.describe()}\n" for d in decisions)
