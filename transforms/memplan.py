"""The `memplan` pass: plans the memory of every function and counts what the plans save.

The planner, its data model and its checker live in analysis/memory/ (the terms are defined in
its modules' docstrings); `gir opt --memplan-report` and `--memplan-plot` are the CLI's
(driver/reporting.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.liveness import Liveness
from ..analysis.memory.aliases import OPS, VIEW_RULES, ViewRules
from ..analysis.memory.arena import STRATEGIES
from ..analysis.memory.checker import check_plan
from ..analysis.memory.plan import MemoryPlan
from ..analysis.memory.planner import plan_memory
from ..errors import GirPassError
from ..ir.core import Module
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics


def plan_module(module: Module, strategy: str = "auto", views: ViewRules = OPS) -> list[MemoryPlan]:
    """The memory plan of every function of module."""
    return [plan_memory(f, strategy=strategy, views=views) for f in module.functions.values()]


@dataclass(frozen=True)
class MemplanOptions:
    strategy: str = "auto"
    """auto, size (largest first, best-fitting gap) or program (online best fit in program order)."""
    check: bool = True
    """Run check_plan on every plan (a failure is a planner bug)."""
    views: str = "ops"
    """Which views the backend makes (analysis/memory/aliases.py): ops (the op registry's: the
    CPU backend) or strided (also slices read through strides and joins of arguments that are
    their home: the GPU backend; gir.jit's GPU pipeline runs `memplan{views=strided}`)."""

    def validate(self, pass_name: str) -> None:
        if self.strategy not in STRATEGIES:
            raise GirPassError(f"pass '{pass_name}': strategy must be one of {', '.join(STRATEGIES)}, "
                               f"not {self.strategy!r}")
        if self.views not in VIEW_RULES:
            raise GirPassError(f"pass '{pass_name}': views must be one of {', '.join(VIEW_RULES)}, "
                               f"not {self.views!r}")


class Memplan(Pass):
    """`memplan`: plans the memory of every function and records, per function, the arena's
    peak bytes, the naive total, the lower bound, in-place reuses, block reuses and carry
    shares as counters (shown by --timing and --stats-json). The IR is unchanged. Each plan is
    put into the pipeline's analyses, where the backends take it (so the pass's options decide
    the arena the compiled code uses) and `gir opt --memplan-report` / `--memplan-plot FILE.png`
    find it.

        %1 = exp %x          ->  %1 at offset 0 (new)
        %2 = neg %1          ->  %2 at offset 0 (in place of %1)
        %3 = add %2, %x      ->  %3 at offset 0 (in place of %2)
    """

    name = "memplan"
    Options = MemplanOptions

    def run(self, module: Module, stats: PassStatistics) -> bool:
        o: MemplanOptions = self.options
        for f in module.functions.values():
            plan = plan_memory(f, liveness=self.analyses.get(Liveness, f), strategy=o.strategy,
                               views=VIEW_RULES[o.views])
            self.analyses.put(f, plan)
            name = f.name
            if not plan.supported:
                stats.notes.append(f"@{name}: not planned: {plan.unsupported}")
                continue
            if o.check:
                check_plan(plan)
            for key, n in plan.counters().items():
                stats.count(f"@{name}: {key}", n)
            if plan.lower_bound:
                stats.notes.append(f"@{name}: arena {plan.arena_bytes / plan.lower_bound:.3f}x the lower bound, "
                                   f"{plan.arena_bytes / max(plan.naive_bytes, 1):.3f}x naive")
        return False
