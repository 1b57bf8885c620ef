"""Derandomised slices of the fuzz campaigns under tests/fuzz/ (docs/reliability.md): the
first inputs of a fixed seed, run in this process with the campaigns' own oracles. The full
campaigns run on demand (`python tests/fuzz/mutate.py --n 100000`), not here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba
sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))

import differential  # noqa: E402
import mutate  # noqa: E402
from harness import Finding  # noqa: E402


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
