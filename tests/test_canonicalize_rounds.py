"""What canonicalize's loop of rounds relies on (transforms/canonicalize.py): CSE finds nothing in
its own output, so a round whose patterns changed nothing may end the loop without running
CSE again; and a canonicalize run leaves nothing for another run to do. Likewise scan-grad
(`ScanGrad.idempotent`: the pass manager skips a run on IR that is unchanged since its last).
Checked on the programs of tests/test_opt_reference.py, after every pass of the default pipeline."""

from __future__ import annotations

from pathlib import Path

import gir
import pytest
from gir.ir.printer import print_module
from gir.passes.base import PassStatistics
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE, split_pipeline
from gir.passes.rewriter import Rewriter, apply_patterns_greedily
from gir.transforms.canonicalize import Canonicalize, canonicalization_patterns, cse

REPO = Path(__file__).resolve().parent.parent
INPUTS = ["tests/data/opt_reference/passes_1k.gir", "examples/gru.gir", "examples/lstm.gir", "examples/rnn.gir",
          "examples/mlp.gir"]


@pytest.mark.parametrize("path", INPUTS, ids=[Path(p).stem for p in INPUTS])
def test_cse_finds_nothing_in_its_own_output(path: str) -> None:
    module = gir.load(str(REPO / path))
    merged = 0
    for spec in split_pipeline(DEFAULT_PIPELINE):
        PassManager(spec).run(module)
        copy = gir.parse(print_module(module))  # the pipeline's own module is left as it is
        for f in copy.functions.values():
            rw = Rewriter(PassStatistics())
            apply_patterns_greedily(f, canonicalization_patterns(), rw)
            merged += cse(f, rw)
            assert not cse(f, rw), f"{path} after {spec}: a second CSE walk merged more"
    if "passes_1k" in path:
        assert merged  # its units hold duplicates: the check saw CSE at work


@pytest.mark.parametrize("path", INPUTS, ids=[Path(p).stem for p in INPUTS])
def test_a_second_canonicalize_changes_nothing(path: str) -> None:
    module = gir.load(str(REPO / path))
    PassManager("ssa,canonicalize,scan-grad,canonicalize").run(module)
    before = print_module(module)
    assert not Canonicalize().run(module, PassStatistics())
    assert print_module(module) == before


@pytest.mark.parametrize("path", INPUTS, ids=[Path(p).stem for p in INPUTS])
def test_a_second_scan_grad_changes_nothing(path: str) -> None:
    """ScanGrad.idempotent: the pass manager skips a second run on unchanged IR. Checked at each
    point of the default pipeline where scan-grad could run, with its options' other settings."""
    module = gir.load(str(REPO / path))
    for spec in split_pipeline(DEFAULT_PIPELINE):
        PassManager(spec).run(module)
        for options in ("", "{merge=false}", "{hoist=false}", "{push-out=false}", "{max-extra-bytes=0}"):
            copy = gir.parse(print_module(module))
            PassManager(f"scan-grad{options}").run(copy)
            printed = print_module(copy)
            report = PassManager(f"scan-grad{options}").run(copy)
            assert not report.records[0].changed, f"{path} after {spec}: scan-grad{options} ran again"
            assert print_module(copy) == printed
