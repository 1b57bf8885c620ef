"""The training examples run from the command line for a few steps and learn: the printed
`loss` goes down, and they exit cleanly (examples/train_charlm.py, examples/train_digits.py).

Small sizes keep each run to seconds after its compile; the full-size figures are in
docs/performance.md with the commands that made them.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LOSS = re.compile(r"\bloss (\d+\.\d+)")


def run(script: str, *args: str) -> tuple[str, list[float]]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    losses = [float(m) for m in LOSS.findall(proc.stdout)]
    assert len(losses) >= 4, proc.stdout
    return proc.stdout, losses


def test_charlm_learns(tmp_path: Path) -> None:
    plot = tmp_path / "loss.png"
    out, losses = run("train_charlm.py", "--steps", "16", "--hidden", "32", "--seq", "16", "--batch", "8",
                      "--eval-every", "8", "--eval-batches", "2", "--sample", "40", "--quiet", "--plot", str(plot))
    assert sum(losses[-2:]) < sum(losses[:2]) - 0.2, losses  # from ln(96) = 4.56 nats towards the unigram
    assert re.search(r"held-out \d+\.\d+ bits/char", out), out
    assert "sampled:" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 1000


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (gir[examples])")
def test_digits_classifier_learns() -> None:
    out, losses = run("train_digits.py", "--steps", "24", "--hidden", "16")
    assert losses[-1] < losses[0] - 0.3, losses
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.3, out  # well above chance (0.1) after 24 steps
