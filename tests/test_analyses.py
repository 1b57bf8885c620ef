"""Analyses are results the pipeline hands on: cached, invalidated on change, used by backends."""

from __future__ import annotations

import pathlib

import gir
import numpy as np
import pytest
from gir.analysis.liveness import Liveness
from gir.analysis.manager import Analyses
from gir.analysis.memory.plan import MemoryPlan
from gir.ir.interpreter import random_inputs
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE

ROOT = pathlib.Path(gir.__file__).parent
PROGRAM = """
func @f(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> tensor<f32> {
  %a = tanh(%x @ %w)
  %b = exp(%a) * %a
  %c = %b @ %w
  return sum(%c * %a)
}
"""


def test_the_pass_manager_caches_and_prints_analyses() -> None:
    module = gir.parse(PROGRAM)
    report = PassManager("liveness,memplan").run(module)
    f = module["f"]
    live, plan = report.analyses.get(Liveness, f), report.analyses.get(MemoryPlan, f)
    assert isinstance(live, Liveness) and isinstance(plan, MemoryPlan)
    assert plan.function is f
    assert str(report.analyses) == "@f: Liveness, MemoryPlan\n"


def test_a_pass_that_changes_the_ir_invalidates_earlier_analyses() -> None:
    module = gir.parse(PROGRAM)
    report = PassManager("memplan,fuse").run(module)
    assert [r.changed for r in report.records] == [False, True]
    assert report.analyses.get(MemoryPlan, module["f"]) is None
    report = PassManager("fuse,memplan,canonicalize").run(gir.parse(PROGRAM))
    assert not report.records[-1].changed, "canonicalize changed nothing, so the plan stays"
    assert len(report.analyses.all(MemoryPlan)) == 1


def test_a_changing_pass_keeps_what_it_put_itself() -> None:
    analyses = Analyses()
    module = gir.parse(PROGRAM)
    analyses.begin_pass()
    analyses.put(module["f"], "old")
    analyses.begin_pass()
    analyses.put(module["f"], 1)
    analyses.invalidate()
    assert analyses.get(str, module["f"]) is None and analyses.get(int, module["f"]) == 1


@pytest.mark.parametrize("path", [ROOT / "examples" / "rnn.gir", ROOT / "examples" / "mlp.gir"],
                         ids=lambda p: p.stem)
def test_a_memplan_option_changes_the_cpu_arena(path: pathlib.Path) -> None:
    """The backend lays its arena out by the plan the pipeline computed, so `memplan{...}`
    options change the compiled code (before, the backend re-planned with defaults)."""
    module = gir.load(str(path))
    arenas = {}
    for strategy in ("size", "program"):
        fn = gir.jit(module, pipeline=f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE},memplan{{strategy={strategy}}}")
        inputs = random_inputs(fn.signature, 0)
        for got, want in zip(fn(*inputs), gir.jit(module, device="interp")(*inputs)):
            scale = float(np.max(np.abs(want))) or 1.0  # f32 sums reordered (one GEMM for T small ones)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
        arenas[strategy] = fn.compiled.layout.arena_bytes
        # beside the plan: the results of GEMMs the two-core schedule runs during a scan (overlap.py)
        private = int(fn.compiled.layout.schedule.get("worker_private_bytes", 0))
        assert fn.compiled.layout.planned_bytes + private == arenas[strategy]
    assert arenas["size"] < arenas["program"], arenas


def test_the_cli_memplan_report_shows_the_pipelines_plan(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    import gir.cli

    path = ROOT / "examples" / "rnn.gir"
    reports = {}
    for strategy in ("size", "program"):
        assert gir.cli.main(["opt", str(path), "-p", f"{DEFAULT_PIPELINE},memplan{{strategy={strategy}}}",
                             "--memplan-report", "-o", str(tmp_path / "out.gir")]) == 0
        reports[strategy] = capsys.readouterr().err
    assert "(program)" in reports["program"] and "(program)" not in reports["size"]
