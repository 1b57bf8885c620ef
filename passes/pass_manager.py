"""Runs pipelines of passes, with the debugging people who write passes need (DESIGN.md §4):
verification after every pass, IR printed before/after passes, a dump directory, a timing
report per pass and per rewrite pattern, statistics as JSON, numeric checks against the
interpreter after every pass, and a reproducer file when a pass fails.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from ..analysis.manager import Analyses
from ..errors import GirArgumentError, GirError, GirPassError, GirVerifyError, creating, did_you_mean
from ..ir.core import Module
from ..ir.gcpause import gc_paused
from ..ir.interpreter import interpret, random_inputs
from ..ir.printer import print_module
from ..ir.verifier import verify
from ..support import timing
from .base import Pass
from .pipeline import parse_pipeline
from .rewriter import PassStatistics


@dataclass
class PassRecord:
    name: str
    spec: str
    seconds: float
    changed: bool
    ops_before: int
    ops_after: int
    stats: PassStatistics

    def as_dict(self) -> dict[str, Any]:
        return {
            "pass": self.name, "spec": self.spec, "seconds": round(self.seconds, 6), "changed": self.changed,
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "patterns": {k: v.as_dict() for k, v in sorted(self.stats.patterns.items())},
            "never_applied": sorted(k for k, v in self.stats.patterns.items() if v.tried and not v.applied),
            "counters": dict(sorted(self.stats.counters.items())),
            "notes": list(self.stats.notes),
        }


@dataclass
class Report:
    """What a pipeline run did; printed by --timing, written by --stats-json."""

    records: list[PassRecord] = field(default_factory=list)
    analyses: Analyses = field(default_factory=Analyses)
    """The analyses still valid after the last pass (memory plans, placement, liveness)."""

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def as_dict(self) -> dict[str, Any]:
        return {"passes": [r.as_dict() for r in self.records], "total_seconds": round(self.total_seconds, 6)}

    def timing_table(self) -> str:
        lines = ["===--------------------------------------------------------------===",
                 "                    gir pass timing report",
                 "===--------------------------------------------------------------===",
                 f"  {'seconds':>9}  {'changed':>7}  {'ops before -> after':>20}  pass"]
        for r in self.records:
            lines.append(f"  {r.seconds:9.4f}  {'yes' if r.changed else 'no':>7}  "
                         f"{f'{r.ops_before} -> {r.ops_after}':>20}  {r.spec}")
            applied = {k: v for k, v in r.stats.patterns.items() if v.applied}
            if applied:
                lines.append(f"      {'pattern':<34} {'applied':>8} {'tried':>8} {'created':>8} {'erased':>8} "
                             f"{'seconds':>9}")
                for name, s in sorted(applied.items(), key=lambda kv: -kv[1].seconds):
                    lines.append(f"      {name:<34} {s.applied:8d} {s.tried:8d} {s.created:8d} {s.erased:8d} "
                                 f"{s.seconds:9.4f}")
            never = sorted(k for k, v in r.stats.patterns.items() if v.tried and not v.applied)
            if never:
                lines.append("      tried, never applied: " + ", ".join(never))
            for name, n in sorted(r.stats.counters.items()):
                lines.append(f"      {name}: {n}")
            for note in r.stats.notes:
                lines.append(f"      note: {note}")
        lines.append(f"  {self.total_seconds:9.4f}  total")
        return "\n".join(lines) + "\n"


@dataclass
class DebugOptions:
    verify_each: bool = True
    print_ir_before: frozenset[str] = frozenset()
    print_ir_after: frozenset[str] = frozenset()
    print_ir_after_all: bool = False
    print_ir_after_change: bool = False
    print_ir_after_failure: bool = False
    print_locations: bool = False
    dump_dir: str | None = None
    check_numerics: int | None = None
    """A seed: run the interpreter before and after every pass and compare."""
    reproducer: bool = False
    """On a pass failure, write the IR given to the pass to a file that reproduces it."""
    reproducer_dir: str | None = None
    out: TextIO | None = None
    """Where IR dumps go (stderr by default, as in mlir-opt)."""
    skip_fixpoints: bool = True
    """Skip an idempotent pass (`Pass.idempotent`) when no pass changed the IR since its last
    run reached a fixpoint: it would find nothing to do."""
    input_text: str | None = None
    """The text the module was parsed from, unchanged since (saves printing it for reproducers)."""
    input_verified: bool = False
    """The caller verified the module just now, unchanged since (the parser verifies what it
    builds): `run` does not verify it again before the first pass."""
    reparse: Callable[[str], Module] | None = None
    """Text -> Module (the parser, which passes/ does not import): given, a reproducer is made
    by replaying the passes on the input printed once, instead of printing before every pass."""


class PassManager:
    def __init__(self, pipeline: str | list[Pass], **debug: Any):
        self.passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
        self.debug = DebugOptions(**debug)
        self._check_pass_names()

    def _check_pass_names(self) -> None:
        """A pass named in --print-ir-before/after must be in the pipeline: a misspelled name
        would otherwise print nothing, silently."""
        names = list(dict.fromkeys(p.name for p in self.passes))
        for flag, wanted in (("print-ir-before", self.debug.print_ir_before),
                             ("print-ir-after", self.debug.print_ir_after)):
            for name in sorted(wanted):
                if name not in names:
                    have = ", ".join(names) if names else "none (the pipeline is empty)"
                    raise GirPassError(f"--{flag}={name}: no pass '{name}' in the pipeline; its passes: {have}"
                                       + did_you_mean(name, names))

    @property
    def pipeline(self) -> str:
        return ",".join(p.spec() for p in self.passes)

    def _emit(self, header: str, module: Module) -> None:
        out = self.debug.out or sys.stderr
        out.write(f"// -----// IR Dump {header} //----- //\n")
        out.write(print_module(module, self.debug.print_locations))
        out.write("\n")

    def _dump(self, index: int, name: str, module: Module) -> None:
        if self.debug.dump_dir is None:
            return
        path = os.path.join(self.debug.dump_dir, f"{index:02d}-{name}.gir")
        try:
            os.makedirs(self.debug.dump_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(print_module(module, self.debug.print_locations))
        except OSError as e:
            raise GirArgumentError(f"--dump-dir: cannot write {path}: {e.strerror or e}") from None

    def run(self, module: Module, analyses: Analyses | None = None) -> Report:
        with gc_paused():  # ir/gcpause.py: the collector would rescan the whole IR, for nothing
            return self._run_all(module, analyses)

    def _run_all(self, module: Module, analyses: Analyses | None) -> Report:
        d = self.debug
        report = Report(analyses=analyses if analyses is not None else Analyses())
        if d.verify_each and not d.input_verified:
            verify(module)  # an invalid input is its own error (GirVerifyError), not the first pass's
        self._dump(0, "input", module)
        numerics = _Numerics(module, d.check_numerics) if d.check_numerics is not None else None
        # A reproducer needs the IR given to the failing pass. With a `reparse` function the
        # input is printed once (not before every pass: ~0.17 s a print at 25k ops) and a
        # failure replays the passes before the failing one on it (`_snapshot_before`).
        self._input: str | None = None
        self._snapshots = bool(d.reproducer or d.reproducer_dir) and d.reparse is None
        if (d.reproducer or d.reproducer_dir) and d.reparse is not None:
            self._input = d.input_text
            if self._input is None:
                with timing.phase("print IR (reproducer input)"):
                    self._input = print_module(module)
        self._generation = 0
        self._op_count: int | None = None
        """The module's op count after the last pass: nothing changes the module between passes."""
        """Counts the passes that changed the IR so far."""
        self._fixpoints: dict[str, int] = {}
        """An idempotent pass (by spec) -> the generation its last run converged at."""
        for index, p in enumerate(self.passes, start=1):
            with timing.phase(f"pass {p.spec()}"):
                self._run_one(index, p, module, report, numerics)
        return report

    def _run_one(self, index: int, p: Pass, module: Module, report: Report, numerics: _Numerics | None) -> None:
        d = self.debug
        if p.name in d.print_ir_before:
            self._emit(f"Before {p.name}", module)
        if self._snapshots:
            with timing.phase("print IR (reproducer snapshot)"):
                self._snapshot = print_module(module)
        ops_before = self._op_count if self._op_count is not None else module.num_ops()
        stats = PassStatistics()
        p.analyses = report.analyses
        report.analyses.begin_pass()
        start = time.perf_counter()
        skip = d.skip_fixpoints and p.idempotent and self._fixpoints.get(p.spec()) == self._generation
        try:
            if skip:  # it would find nothing to do: the IR is the one its last run left
                changed = False
                stats.notes.append("skipped: the IR is unchanged since this pass last ran to a fixpoint")
            else:
                with timing.phase("run"), creating(p.name):  # ops made now carry the pass's name (errors.Origin)
                    changed = bool(p.run(module, stats))
        except GirPassError as e:
            raise self._failed(p, module, index, e) from None
        except GirError:
            if d.print_ir_after_failure:  # the pass failed on the program: still show where it stopped
                self._emit(f"After {p.name} Failed", module)
            raise  # a diagnostic about the program itself (e.g. a name used before assignment)
        except BrokenPipeError:
            raise  # a print pass whose reader left (`gir opt ... | head`): the CLI exits quietly
        except Exception as e:  # a crash inside the pass: a bug in gir
            err = GirPassError(f"pass '{p.name}' crashed: {type(e).__name__}: {e}")
            raise self._failed(p, module, index, err) from e
        seconds = time.perf_counter() - start
        ops_after = ops_before if skip else module.num_ops()
        self._op_count = ops_after
        if changed:
            report.analyses.invalidate()
        if changed or ops_after != ops_before:
            self._generation += 1
        if p.idempotent and not skip and getattr(p, "converged", True):
            self._fixpoints[p.spec()] = self._generation
        # An unchanged module is the one verified after the pass before (or by the parser); a
        # pass that says "unchanged" but changed the op count is verified anyway.
        if d.verify_each and (changed or ops_after != ops_before or index == 1):
            try:
                with timing.phase("verify"):
                    verify(module)
            except GirVerifyError as e:
                err = GirPassError(f"pass '{p.name}' produced invalid IR: {e.message}", e.loc,
                                   note=getattr(e, "note", None))
                raise self._failed(p, module, index, err) from None
        report.records.append(PassRecord(p.name, p.spec(), seconds, changed, ops_before, ops_after, stats))
        if d.print_ir_after_all or p.name in d.print_ir_after or (d.print_ir_after_change and changed):
            with timing.phase("print IR"):
                self._emit(f"After {p.name}", module)
        self._dump(index, p.name, module)
        if numerics is not None:
            try:
                numerics.check(module, p.name)
            except GirPassError as e:
                raise self._failed(p, module, index, e) from None

    def _snapshot_before(self, index: int) -> str | None:
        """The IR given to pass number `index`: the printed input with the passes before it
        run again (passes are deterministic); None when the input was not kept, or the replay
        itself fails (then the input and the pipeline prefix stand for it)."""
        if self._snapshots:
            return self._snapshot
        if self._input is None or self.debug.reparse is None:
            return None
        if index == 1:
            return self._input
        try:
            module = self.debug.reparse(self._input)
            analyses = Analyses()
            for p in self.passes[: index - 1]:
                p.analyses = analyses
                analyses.begin_pass()
                if p.run(module, PassStatistics()):
                    analyses.invalidate()
            return print_module(module)
        except Exception:  # noqa: BLE001 - the replay is best effort; the failure being reported matters
            return None

    def _failed(self, p: Pass, module: Module, index: int, err: GirPassError) -> GirPassError:
        d = self.debug
        if d.print_ir_after_failure:
            self._emit(f"After {p.name} Failed", module)
        snapshot = self._snapshot_before(index)
        if snapshot is not None:
            folder = d.reproducer_dir or d.dump_dir or tempfile.gettempdir()
            flags = f" --check-numerics={d.check_numerics}" if d.check_numerics is not None else ""
            try:
                path = _write_reproducer(folder, p, err, snapshot, flags)
            except OSError as e:
                note = f"no reproducer: cannot write into {folder}: {e.strerror or e}"
            else:
                err.reproducer = path
                note = f"reproducer written to {path}; run: gir opt {path} -p '{p.spec()}'{flags}"
            err.note = f"{err.note}\n{note}" if err.note else note
        return err


def _write_reproducer(folder: str, p: Pass, err: GirPassError, snapshot: str, flags: str) -> str:
    """Writes the IR given to the failing pass to a new file in folder and returns its path:
    gir-reproducer-PASS.gir when that name is free, else a unique gir-reproducer-PASS-XXXX.gir,
    so a later failure (or another gir process) never overwrites an earlier reproducer."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"gir-reproducer-{p.name}.gir")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fd, path = tempfile.mkstemp(prefix=f"gir-reproducer-{p.name}-", suffix=".gir", dir=folder)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(f"// gir reproducer: pass '{p.name}' failed: {err.message.splitlines()[0]}\n")
        f.write(f"// reproduce with: gir opt {path} -p '{p.spec()}'{flags}\n")
        f.write(snapshot)
    return path


class _Numerics:
    """--check-numerics: seeded random inputs, results before and after every pass.

    A function is checked from the first point at which the interpreter can run it (a
    function containing `grad` can run only after autodiff; that result is its baseline)."""

    def __init__(self, module: Module, seed: int):
        self.seed = seed
        self.inputs: dict[str, list[np.ndarray]] = {}
        self.baseline: dict[str, list[np.ndarray]] = {}
        self.check(module, None)

    def _run(self, module: Module, name: str) -> list[np.ndarray] | None:
        f = module.functions[name]
        if name not in self.inputs:
            if not all(t.is_static for t in f.arg_types):
                return None
            self.inputs[name] = random_inputs(f, self.seed)
        try:
            return interpret(module, name, *self.inputs[name])
        except GirError:
            return None

    def check(self, module: Module, pass_name: str | None) -> None:
        for name, f in module.functions.items():
            results = self._run(module, name)
            if results is None:
                if name in self.baseline and pass_name is not None:
                    raise GirPassError(f"--check-numerics: after pass '{pass_name}' @{name} no longer runs", f.loc)
                continue
            if name not in self.baseline:
                self.baseline[name] = results
                continue
            for i, (want, got) in enumerate(zip(self.baseline[name], results)):
                if not _close(want, got):
                    diff = np.max(np.abs(want.astype(np.float64) - got.astype(np.float64))) if want.shape == got.shape \
                        else float("nan")
                    raise GirPassError(f"--check-numerics: pass '{pass_name}' changed result out{i} of @{name} "
                                       f"(max abs difference {diff:.3g}, seed {self.seed})", f.loc)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    # Passes may reorder sums (one GEMM for T small ones), so the absolute tolerance scales
    # with the largest magnitude of the result: float32 rounding, not a wrong answer.
    rtol = 1e-4 if a.dtype == np.float32 else 1e-9
    finite = np.abs(a[np.isfinite(a)])
    scale = float(finite.max()) if finite.size else 0.0
    return bool(np.allclose(b, a, rtol=rtol, atol=rtol * 0.1 * scale + 1e-12, equal_nan=True))
