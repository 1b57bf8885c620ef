"""The `liveness` and `print-liveness` passes: compute analysis/liveness.py's `Liveness` for
every function (and print it); the IR is unchanged."""

from __future__ import annotations

import sys
from typing import TextIO

from ..analysis.liveness import Liveness
from ..ir.core import Module
from ..passes.base import Pass
from ..passes.rewriter import PassStatistics


class LivenessPass(Pass):
    """`liveness`: computes liveness for every function and counts what it found; the IR is
    unchanged. Counters: values, worklist facts processed, the most values live at once.

    Before and after: the same IR. `print-liveness` prints the sets."""

    name = "liveness"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        for f in module.functions.values():
            live = Liveness(f)
            self.analyses.put(f, live)
            stats.count("values", len(live.first))
            stats.count("worklist facts", live.visits)
            stats.counters["max live values"] = max(stats.counters.get("max live values", 0), live.max_live())
        return False


class PrintLiveness(Pass):
    """`print-liveness`: prints, per function and for each op in program order, the op's
    point and its live-in and live-out sets (sorted printer names) to stdout. The IR is
    unchanged.

        liveness of @f
          0: %0 = mul %x, %y
              live-in: %x, %y
              live-out: %0, %y
          1: %1 = add %0, %y
              live-in: %0, %y
              live-out: %1
          2: return %1
              live-in: %1
              live-out:
    """

    name = "print-liveness"
    stream: TextIO | None = None
    """Where to print (stdout when None); tests set it."""

    def run(self, module: Module, stats: PassStatistics) -> bool:
        out = self.stream or sys.stdout
        for f in module.functions.values():
            live = self.analyses.get(Liveness, f) or Liveness(f)
            self.analyses.put(f, live)
            out.write(live.format())
        out.flush()
        return False
