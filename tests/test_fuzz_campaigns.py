"""Derandomised slices of the fuzz campaigns under tests/fuzz/ (docs/reliability.md): the
first inputs of a fixed seed, run in this process with the campaigns' own oracles. The full
campaigns run on demand (`python tests/fuzz/mutate.py --n 100000`), not here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))

import differential
import layout_ops
import mutate
from harness import Finding


def _slice(run_one, seed: int, indices: range) -> dict[str, int]:
    counters: dict[str, int] = {}
    for index in indices:
        try:
            run_one(seed, index, counters)
        except Finding as f:
            pytest.fail(f"input {index} of seed {seed}: {f.kind}: {f.message}\n----\n{f.text}")
    return counters


def test_mutation_campaign_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mutate, "CLI_FRACTION", 0.0)  # test_fuzz.py runs the command in a subprocess
    counters = _slice(mutate.run_one, 0, range(150))
    assert counters["parsed"] >= 10 and counters["parse_errors"] >= 50, counters


def test_differential_campaign_slice() -> None:
    # 0: GPU simulator and threads; 3 and 7: grad against finite differences.
    counters = _slice(differential.run_one, 0, range(8))
    assert counters["programs"] == 8, counters
    assert counters.get("grad_cpu_compared", 0) == 2 and counters.get("gpu_compared", 0) >= 1, counters
    assert counters.get("thread_checks", 0) >= 1, counters


def test_the_campaign_catches_a_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The differential oracle is not vacuous: a CPU backend answering 1 more is caught."""
    import gir

    real = gir.jit

    def off_by_one(*args, **kwargs):
        fn = real(*args, **kwargs)
        return lambda *a: [r + 1 for r in fn(*a)]

    monkeypatch.setattr(gir, "jit", off_by_one)
    with pytest.raises(Finding, match="mismatch"):
        for index in range(4):
            differential.run_one(0, index * 4, {})


def _covering_indices(seed: int, limit: int) -> dict[str, int]:
    """For each op kind the generator writes through layout_ops (the registry's layout kinds,
    `cast`), `logsumexp` and calls: the first program of `seed` using it, the first `grad`
    program using it (where the kind has a VJP), the first one the GPU simulator runs, and the
    first program of each out-of-range form. Derandomised: a function of the generator only."""
    tokens = [k + "(" for k in layout_ops.layout_kinds(grad=False)]
    tokens += [layout_ops.cast_kind() + "(", "logsumexp(", "= @h"]
    grad_tokens = [k + "(" for k in layout_ops.layout_kinds(grad=True)] + ["logsumexp(", "= @h"]
    picks: dict[str, int] = {}
    for index in range(limit):
        p = differential.program_for(seed, index)
        gpu = p.small and index % differential.GPU_EVERY == (3 if p.grad else 0)
        if p.expect_error:
            line = p.text.splitlines()[p.expect_error[0] - 1]
            form = "scatter" if "scatter_add(" in line else "computed" if "index(%bad_ids" in line \
                else "gather" if "%bad_ids" in line else "scalar"
            picks.setdefault(f"out of range: {form}", index)
            continue
        for token in grad_tokens if p.grad else tokens:
            if token in p.text:
                picks.setdefault(("grad " if p.grad else "") + token, index)
                if gpu:
                    picks.setdefault("gpu " + token, index)
    return picks


def test_every_registry_layout_kind_has_a_generator_step() -> None:
    from gir.ir.spec import REGISTRY

    for name, spec in REGISTRY.items():
        if spec.category == "layout" and name not in layout_ops.NOT_GENERATED:
            assert hasattr(layout_ops.LayoutSteps, "_" + name), f"the fuzz generator never writes {name!r}"


def test_differential_slice_of_layout_ops_casts_gathers_scatters_and_calls() -> None:
    picks = _covering_indices(0, 300)
    kinds = layout_ops.layout_kinds(grad=False)
    expected = [k + "(" for k in kinds] + [f"grad {k}(" for k in layout_ops.layout_kinds(grad=True)] + [
        f"gpu {k}(" for k in kinds] + ["logsumexp(", "grad logsumexp(", "= @h", "grad = @h", "cast("] + [
        f"out of range: {form}" for form in ("scalar", "computed", "gather", "scatter")]
    assert not set(expected) - set(picks), sorted(set(expected) - set(picks))
    counters = _slice(differential.run_one, 0, sorted(set(picks.values())))
    assert counters["error_mode_programs"] >= 3 and counters["error_mode_gpu"] >= 1, counters
    assert counters["grad_fd_checked"] >= 5, counters


def test_a_seed_writes_the_same_programs_in_every_process() -> None:
    """A finding is reported as (seed, index): another process must write the same program
    (hash(None), in a random state, differs per process before Python 3.12)."""
    import hashlib
    import subprocess

    code = ("import sys, hashlib; sys.path.insert(0, sys.argv[1]); import differential; "
            "texts = ''.join(differential.program_for(5, i).text for i in range(60)); "
            "print(hashlib.sha256(texts.encode()).hexdigest())")
    here = hashlib.sha256("".join(differential.program_for(5, i).text for i in range(60)).encode()).hexdigest()
    fuzz = str(Path(__file__).resolve().parent / "fuzz")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, fuzz], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONHASHSEED": "random"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == here
    assert sum("length" in differential.program_for(5, i).text for i in range(60)) >= 3  # the fixed-length scans
