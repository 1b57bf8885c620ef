"""`gir opt`'s default pipeline prints what it printed before the compile-time work on the
passes (issue 15): the references under tests/data/opt_reference/ were written by `gir opt`
before any of that work, so a speed-up that changes a pass's output (op order, names, a
rewrite that fires or not, locations) fails here.

- `passes_1k.gir`: bench/passes_scale.py's generated program of about 1,000 ops (ssa's and
  canonicalize's work at scale), its output with and without locations;
- the GRU, LSTM, RNN and MLP examples (autodiff through scans), with and without locations;
- the GRU and LSTM after every pass of the pipeline (`--dump-dir`).

To regenerate after an intended change of output: from the repository root,
`gir opt INPUT [--print-locations] -o tests/data/opt_reference/NAME.default[.loc].gir` and
`gir opt INPUT --dump-dir tests/data/opt_reference/NAME.dump -o /dev/null`; review the diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gir.cli
import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "opt_reference"
INPUTS = {
    "passes_1k": "tests/data/opt_reference/passes_1k.gir",
    "gru": "examples/gru.gir",
    "lstm": "examples/lstm.gir",
    "rnn": "examples/rnn.gir",
    "mlp": "examples/mlp.gir",
}


def _opt(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`gir opt ARGV` in-process from the repository root (locations name files relative to it)."""
    monkeypatch.chdir(REPO)
    assert gir.cli.main(["opt", *argv]) == 0


@pytest.mark.parametrize("locations", [False, True], ids=["plain", "loc"])
@pytest.mark.parametrize("name", sorted(INPUTS))
def test_default_pipeline_output_unchanged(name: str, locations: bool, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.gir"
    _opt([INPUTS[name], "-o", str(out), *(["--print-locations"] if locations else [])], monkeypatch)
    reference = DATA / f"{name}.default{'.loc' if locations else ''}.gir"
    assert out.read_text() == reference.read_text()


@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_every_pass_output_unchanged(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = tmp_path / "dump"
    _opt([INPUTS[name], "--dump-dir", str(dump), "-o", str(tmp_path / "out.gir")], monkeypatch)
    expected = sorted(p.name for p in (DATA / f"{name}.dump").iterdir())
    assert sorted(p.name for p in dump.iterdir()) == expected
    for file in expected:
        assert (dump / file).read_text() == (DATA / f"{name}.dump" / file).read_text(), file


def test_generated_program_is_the_benchmark_s() -> None:
    """passes_1k.gir is bench/passes_scale.py's program of about 1k ops, so the reference
    follows the benchmark the timings in docs/performance.md are taken on."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import passes_scale
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert (DATA / "passes_1k.gir").read_text() == passes_scale.program_of_about(1000)
