"""Bad input to the CLI and to pipeline strings: a clear GirError (exit 1), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gir.cli
import pytest
from gir.errors import GirPassError
from gir.ir.core import Module
from gir.passes.base import Pass
from gir.passes.pipeline import PASSES, parse_pipeline
from gir.passes.rewriter import PassStatistics

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
], ids=["bogus-strategy", "negative-bytes", "negative-elements", "duplicate-key"])  # ids a shell can pass to -k
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


# ---------------------------------------------------------------------------------------------
# reading a .gir file: UTF-8, a byte-order mark skipped


def test_invalid_utf8_points_at_the_first_bad_byte(tmp_path, capsys):
    path = tmp_path / "bad.gir"
    path.write_bytes(PROGRAM.replace("%y = tanh", "// caf\u00e9 \xff\n  %y = tanh").encode("utf-8")
                     .replace(b"\xc3\xbf", b"\xff"))
    code, out, err = gir_main(capsys, "opt", path)
    assert code == 1 and out == ""
    assert_clean_error(err)
    assert err.startswith(f"{path}:2:11: error: invalid UTF-8 (byte 0xff)"), err
    assert err.splitlines()[2] == " " * 10 + "^"  # the caret under the bad byte (é is one column)


def test_a_byte_order_mark_is_skipped(tmp_path, capsys):
    path = tmp_path / "bom.gir"
    path.write_bytes(b"\xef\xbb\xbf" + PROGRAM.encode("utf-8"))
    code, out, err = gir_main(capsys, "opt", path, "-p", "")
    assert code == 0 and err == ""
    assert out.startswith("func @f(")


# ---------------------------------------------------------------------------------------------
# files gir cannot write or read


def test_unwritable_stats_json(program, capsys, tmp_path):
    target = tmp_path / "missing" / "s.json"
    code, out, err = gir_main(capsys, "opt", program, "--stats-json", target)
    assert code == 1
    assert_clean_error(err)
    assert f"cannot write {target}" in err


def test_unwritable_dump_dir(program, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "dumps"  # under a file: no directory can be made there
    code, out, err = gir_main(capsys, "opt", program, "--dump-dir", target)
    assert code == 1
    assert_clean_error(err)
    assert f"--dump-dir: cannot write {target}" in err


def test_unwritable_memplan_plot(program, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "missing" / "p.png"
    code, out, err = gir_main(capsys, "opt", program, "--memplan-plot", target, "-o", tmp_path / "o.gir")
    assert code == 1
    assert_clean_error(err)
    assert f"cannot write {target}" in err


class AlwaysFails(Pass):
    """Test-only: fails on every module."""

    name = "test-always-fails"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        raise GirPassError("test-always-fails: failed on purpose")


@pytest.fixture
def failing_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, AlwaysFails.name, AlwaysFails)


def test_unwritable_reproducer_dir(failing_pass, program, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "repro"
    code, out, err = gir_main(capsys, "opt", program, "-p", "test-always-fails", "--reproducer-dir", target)
    assert code == 1
    assert_clean_error(err)
    assert "error: test-always-fails: failed on purpose" in err
    assert f"note: no reproducer: cannot write into {target}" in err


def test_reproducers_never_overwrite_each_other(failing_pass, program, capsys, tmp_path):
    notes = []
    for _ in range(2):
        code, out, err = gir_main(capsys, "opt", program, "-p", "test-always-fails", "--reproducer-dir", tmp_path)
        assert code == 1
        (note,) = [line for line in err.splitlines() if line.startswith("note: reproducer written to ")]
        notes.append(note)
    paths = [Path(n.removeprefix("note: reproducer written to ").split(";")[0]) for n in notes]
    assert paths[0] == tmp_path / "gir-reproducer-test-always-fails.gir"
    assert paths[1] != paths[0] and paths[1].name.startswith("gir-reproducer-test-always-fails-")
    assert all(p.read_text().startswith("// gir reproducer: pass 'test-always-fails' failed") for p in paths)
    assert f"run: gir opt {paths[1]} -p 'test-always-fails'" in notes[1]


@pytest.mark.parametrize("content", [b"hello\n", b"", b"\x80\x04garbage"], ids=["text", "empty", "pickle"])
def test_inputs_that_are_not_an_npz(program, capsys, tmp_path, content):
    path = tmp_path / "in.npz"
    path.write_bytes(content)
    code, out, err = gir_main(capsys, "run", program, "--device", "interp", "--inputs", path)
    assert code == 1
    assert_clean_error(err)
    assert f"cannot read inputs from {path}: it is not an .npz archive" in err


def test_inputs_npz_member_that_is_not_an_array(program, capsys, tmp_path):
    import zipfile

    path = tmp_path / "in.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", b"not an array")
    code, out, err = gir_main(capsys, "run", program, "--device", "interp", "--inputs", path)
    assert code == 1
    assert_clean_error(err)
    assert f"cannot read array 'x' from {path}" in err


@pytest.mark.parametrize("argv", [["run", "--device", "interp", "--random", "-1"], ["opt", "--check-numerics=-3"]],
                         ids=["run-random", "opt-check-numerics"])
def test_negative_seeds_are_a_clear_error(program, capsys, argv):
    code, out, err = gir_main(capsys, argv[0], program, *argv[1:])
    assert code == 1
    assert_clean_error(err)
    assert "a seed must be >= 0" in err


def test_print_liveness_into_a_closed_pipe_exits_quietly(tmp_path):
    path = tmp_path / "big.gir"
    path.write_text("\n".join(PROGRAM.replace("@f", f"@f{i}") for i in range(3000)))
    proc = subprocess.Popen([sys.executable, "-m", "gir.cli", "opt", str(path), "-p", "print-liveness"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"liveness of @f0")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait() == 0
    assert err == ""


class Crashes(Pass):
    """Test-only: a bug inside a pass (a Python exception, not a GirError)."""

    name = "test-crashes"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        return {}["no such key"]


@pytest.mark.parametrize("traceback_env", ["", "1"], ids=["no-traceback", "traceback"])
def test_gir_traceback_shows_a_crash_inside_a_pass(traceback_env, monkeypatch, program, capsys, tmp_path):
    """A pass that crashes is reported as a located pass error with a reproducer; GIR_TRACEBACK=1
    adds the crash's traceback (it was ignored for crashes inside passes)."""
    monkeypatch.setitem(PASSES, Crashes.name, Crashes)
    monkeypatch.setenv("GIR_TRACEBACK", traceback_env)
    code, out, err = gir_main(capsys, "opt", program, "-p", "test-crashes", "--reproducer-dir", tmp_path)
    assert code == 1
    assert "error: pass 'test-crashes' crashed: KeyError: 'no such key'" in err
    assert ("Traceback (most recent call last)" in err) == bool(traceback_env)
