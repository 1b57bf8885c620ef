"""Bad input to the CLI and to pipeline strings: a clear GirError (exit 1), never a traceback."""

from __future__ import annotations

from pathlib import Path

import gir.cli
import pytest
from gir.errors import GirPassError
from gir.passes.pipeline import parse_pipeline

PROGRAM = """\
func @f(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = tanh(%x)
  return %y
}
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.gir"
    path.write_text(PROGRAM)
    return path


def gir_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = gir.cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clean_error(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err
    assert "error: " in err, err


# ---------------------------------------------------------------------------------------------
# pass options: checked when the pipeline is parsed


@pytest.mark.parametrize("pipeline, message", [
    ("memplan{strategy=bogus}", "strategy must be one of auto, size, program"),
    ("scan-grad{max-extra-bytes=-1}", "max-extra-bytes must be >= 0"),
    ("place{min-elements=-5}", "min-elements must be >= 0"),
    ("memplan{strategy=size,strategy=program}", "option 'strategy' of pass 'memplan' is given twice"),
])
def test_bad_pass_options_fail_when_the_pipeline_is_parsed(pipeline, message):
    with pytest.raises(GirPassError, match=message):
        parse_pipeline(pipeline)


def test_bad_pass_option_fails_before_any_pass_runs(program, capsys):
    # canonicalize would run first if memplan's options were only checked when it runs
    code, out, err = gir_main(capsys, "opt", program, "-p", "canonicalize,memplan{strategy=bogus}",
                              "--print-ir-after", "canonicalize")
    assert code == 1 and out == ""
    assert_clean_error(err)
    assert "IR Dump" not in err and "strategy must be one of" in err


# ---------------------------------------------------------------------------------------------
# --print-ir-before / --print-ir-after name passes of the pipeline


@pytest.mark.parametrize("flag", ["--print-ir-after", "--print-ir-before"])
def test_misspelled_pass_in_print_ir_flag_is_an_error(program, capsys, flag):
    code, out, err = gir_main(capsys, "opt", program, "-p", "ssa,canonicalize", f"{flag}=canonicalise")
    assert code == 1 and out == ""
    assert_clean_error(err)
    assert f"{flag}=canonicalise: no pass 'canonicalise' in the pipeline; its passes: ssa, canonicalize" in err


def test_print_ir_flag_with_a_pass_of_the_pipeline_prints(program, capsys):
    code, _, err = gir_main(capsys, "opt", program, "-p", "ssa,canonicalize", "--print-ir-after=canonicalize")
    assert code == 0 and "IR Dump After canonicalize" in err
