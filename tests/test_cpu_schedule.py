"""The CPU backend's schedule as data (backend/cpu/schedule/, docs/backend.md "The schedule").

- The same GEMM paths, split loops and two-core windows as before the schedule was data: the
  training steps of RNN, GRU and LSTM compiled under forced switches and under the model
  (GIR_GEMM_MEASURE=off, a fresh cache) choose what main chose at 11b0182 on the machine the
  expectations were recorded on (`tests/data/cpu_schedule_main_paths.json`, recorded by
  compiling the same cases on main; skipped where this machine's BLAS facts differ), and give
  the interpreter's results.
- The step is pure: a hand-made `Measurements` decides (the family, a path, the quick tier's
  path, what is provisional), the same inputs give the same schedule, and the lowering reads
  no switch: the same schedule under other GIR_* switches lowers to the same LLVM IR.
- The import direction: the schedule imports nothing of the lowering or the runtime.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import gir
import pytest
from gir.backend.cpu import blas, blas_threads, snapshot, team
from gir.backend.cpu.lower import lower_function
from gir.backend.cpu.schedule import Measurements, needed_shapes, plan
from gir.config import current, override
from gir.passes.pass_manager import PassManager
from gir.testing import assert_all_close
from rnn_cases import bench_module, training_step

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = json.loads((ROOT / "tests" / "data" / "cpu_schedule_main_paths.json").read_text())
CPU_PIPELINE = ("ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize,scan-grad,canonicalize,"
                "inline,canonicalize,fuse,memplan")

SETTINGS = {
    "model": {"gemm_measure": "off"},
    "model-split1": {"gemm_measure": "off", "cpu_split": "1"},
    "openblas-overlap1": {"gemm_path": "openblas", "cpu_overlap": "1"},
    "openblas-split1": {"gemm_path": "openblas", "cpu_split": "1"},
    "openblas-whole": {"gemm_path": "openblas", "cpu_overlap": "whole"},
    "openblas-copy": {"gemm_path": "openblas-copy", "cpu_split": "0", "cpu_overlap": "0"},
    "gir-packed": {"gemm_path": "gir-packed", "cpu_split": "0", "cpu_overlap": "0"},
    "mkl-packed": {"gemm_path": "mkl-packed", "cpu_split": "0", "cpu_overlap": "0"},
}
"""The cases recorded on main (GIR_* switches as config.Options fields)."""


def _facts() -> dict[str, bool]:
    return {"mkl": blas.providers().has_mkl, "intel": "intel" in blas._vendor(),
            "transpose_copy": blas.has_transpose_copy(), "blas_threads_2": blas.threads() >= 2,
            "openblas_two_core": blas_threads.unavailable("openblas") is None,
            "level1": team.level1_entry() is not None}


def _summary(layout) -> dict:  # noqa: ANN001
    gemms: dict[str, int] = {}
    for g in layout.gemms:
        key = f"{g.path} {g.dtype} {g.m}x{g.n}x{g.k} ta={int(g.ta)} tb={int(g.tb)}"
        gemms[key] = gemms.get(key, 0) + 1
    s = layout.schedule
    return {"gemms": gemms,
            "split": [n["split_loops"] for n in s["split"]] if isinstance(s.get("split"), list) else s.get("split"),
            "overlap": [n["used"] for n in s["overlap"]] if isinstance(s.get("overlap"), list) else s.get("overlap")}


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_the_same_paths_as_before(setting: str, model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if _facts() != EXPECTED["facts"]:
        pytest.skip(f"recorded on a machine with {EXPECTED['facts']}, this one has {_facts()}")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))  # nothing measured: the model, or the forced path
    monkeypatch.setattr(blas, "_choices", None)
    monkeypatch.setenv("GIR_LLVM_OPT", "3")  # one tier: the final code's layout
    src, args, want = training_step(model, 5, 6, 4, 11)
    with override(**SETTINGS[setting]):
        fn = gir.jit(src, f"{model}_grads")
        assert_all_close(fn(*args), want, what=f"{model} {setting}")
        (compiled,) = fn._compiled.values()
    assert _summary(compiled.layout) == EXPECTED["paths"][f"{setting}/{model}"]


def _function(model: str = "rnn") -> gir.ir.core.Function:  # type: ignore[name-defined]
    module = gir.parse(bench_module("rnn").gir_source(model, 5, 6, 4, 11))
    PassManager(CPU_PIPELINE).run(module)
    return module.functions[f"{model}_grads"]


def _measurements(function, times) -> Measurements:  # noqa: ANN001
    """A snapshot made by hand: every path available, `times(path, params)` seconds per call."""
    cands = {False: ("openblas", "mkl"), True: ("openblas", "openblas-copy", "gir-packed", "mkl", "mkl-packed")}
    shapes = needed_shapes(function)
    return Measurements(True, cands, 2, {p: {c: times(c, p) for c in cands[p[-1]]} for p in shapes}, {},
                        {}, {"mkl": None, "openblas": None}, (2, 8), 64,
                        {(p[0], p[1], p[2], p[3]): 4096 for p in shapes if p[-1]})


def test_the_measurements_decide_family_and_paths() -> None:
    f = _function()
    options = dataclasses.replace(current(), gemm_path="", gemm_measure="background", cpu_split="0", cpu_overlap="0")
    mkl_wins = plan(f, None, _measurements(f, lambda c, p: 1.0 if c.startswith("mkl") else 2.0), options)
    assert mkl_wins.family == "mkl" and {g.path for g in mkl_wins.gemms} <= {"mkl", "mkl-packed"}
    assert all(g.pack_bytes == 4096 for g in mkl_wins.gemms if g.path == "mkl-packed")
    cheap = {"gir-packed": 0.5, "openblas-copy": 0.8}
    packed = plan(f, None, _measurements(f, lambda c, p: cheap.get(c, 1.0)), options)
    assert packed.family == "openblas"
    loop = [g for g in packed.gemms if g.loop_weight]
    assert loop and all(g.path == "gir-packed" and g.quick_path == "openblas-copy" for g in loop), packed.format()
    assert packed.quick_differs and not packed.provisional
    assert all(g.path == "openblas" for g in packed.gemms if not g.loop_weight)


def test_shapes_missing_from_the_snapshot_are_provisional_and_take_the_model() -> None:
    f = _function()
    measured = _measurements(f, lambda c, p: 1.0)
    shapes = needed_shapes(f)
    model = {p: {c: (0.5 if c == "openblas" else 1.0) for c in measured.candidates[p[-1]]} for p in shapes}
    unmeasured = Measurements(True, measured.candidates, 2, {}, model)
    options = dataclasses.replace(current(), gemm_path="", gemm_measure="background", cpu_split="0",
                                  cpu_overlap="0")
    s = plan(f, None, unmeasured, options)
    assert {g.params for g in s.gemms} <= set(s.provisional) <= set(shapes)  # not the unused windows' chunks
    assert all(g.provisional and g.reason == "model" for g in s.gemms)
    assert {g.path for g in s.gemms} == {"openblas"}
    off = plan(f, None, unmeasured, dataclasses.replace(options, gemm_measure="off"))  # never measured
    assert not off.provisional and not any(g.provisional for g in off.gemms)


def test_the_step_is_pure_and_its_printed_form_stable() -> None:
    f = _function("gru")
    options = dataclasses.replace(current(), gemm_path="", cpu_split="auto", cpu_overlap="auto")
    measured = _measurements(f, lambda c, p: 1.0 + p[1] / 100 if c == "openblas" else 2.0)
    a, b = plan(f, None, measured, options), plan(f, None, measured, options)
    assert a == b and a.format() == b.format()
    ids = [g.op_id for g in a.gemms]
    assert ids == sorted(ids, key=lambda i: int(i[2:].split("#")[0]))
    # the two-core schedule lacked its thread times: decided without it, and says so
    assert a.overlap_pending and not a.window_ids and a.notes["overlap_pending"]


def test_the_lowering_reads_no_switch() -> None:
    """The same (Function, MemoryPlan, CpuSchedule) lowers to the same code whatever GIR_*
    switches say meanwhile: every decision is in the schedule."""
    f = _function("lstm")
    with override(gemm_path="gir-packed", cpu_split="0", cpu_overlap="0", gemm_measure="off"):
        s = snapshot.schedule(f, None, current())
        first = str(lower_function(f, None, s)[0])
    with override(gemm_path="mkl", cpu_split="1", cpu_overlap="1", packed_gemm=False):
        assert str(lower_function(f, None, s)[0]) == first
    assert "gir_ptask" in first  # the schedule's gir-packed path, not the switch of now


def test_the_schedule_imports_nothing_above_it() -> None:
    """backend/cpu: runtime -> llvm_jit -> codegen -> schedule -> blas: the schedule step imports
    no lowering, no runtime, no snapshot, and reads no configuration of its own (options come in)."""
    above = {"codegen", "llvm_jit", "runtime", "code", "snapshot", "gather", "tiers"}
    for path in sorted((ROOT / "backend" / "cpu" / "schedule").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[-1], *(a.name for a in node.names)}
                assert not names & above, f"{path.name} imports {names & above}"
                assert "current" not in {a.name for a in node.names}, f"{path.name} reads config.current()"
