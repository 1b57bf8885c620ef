"""The `gir` command: `gir run` (random and .npz inputs, outputs, entry selection, errors) and
`gir opt` (printing, -o, --print-locations). Most cases call `gir.cli.main` in-process; a few
run the installed console script to check the packaging.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.ir.printer import print_module

REPO = Path(__file__).resolve().parent.parent

PROGRAM = """\
func @first(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = tanh(%x)
  return %y
}

func @second(%x: tensor<2x3xf64>, %n: tensor<2xi32>, %c: tensor<2xi1>)
    -> (tensor<3xf64>, tensor<2xi32>, tensor<2xi32>) {
  %s = sum(%x, axes=[0])
  %m = %n * 2 + 1
  %k = select(%c, %n, %m)
  return %s, %m, %k
}
"""
SECOND_AT = "6:6"
"""Where @second is defined: argument errors point there."""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "prog.gir"
    path.write_text(PROGRAM)
    return path


def gir_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = gir.cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clean_error(err: str, where: str | None = None) -> None:
    """One diagnostic, no traceback; `where` is `file:line:col` when the error has a place."""
    assert "Traceback" not in err
    assert "internal error" not in err
    if where is not None:
        assert err.startswith(f"{where}: error: "), err
    else:
        assert "error: " in err, err


def sample_inputs(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    arrays = {
        "x": np.arange(6, dtype=np.float64).reshape(2, 3),
        "n": np.array([3, -4], np.int32),
        "c": np.array([True, False]),
    }
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    return path, arrays


# ---------------------------------------------------------------------------------------------
# gir run


def test_run_random_uses_the_last_function_by_default(program, capsys):
    code, out, err = gir_main(capsys, "run", program, "--random", "0")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 4
    assert lines[0] == "@second on cpu:"
    assert lines[1].startswith("s: shape (3,) float64")
    assert lines[2].startswith("m: shape (2,) int32")
    assert lines[3].startswith("k: shape (2,) int32")


def test_run_random_is_seeded(program, capsys, tmp_path):
    outs = []
    for seed in ("0", "0", "1"):
        path = tmp_path / f"out{len(outs)}.npz"
        code, _, err = gir_main(capsys, "run", program, "-e", "first", "--random", seed, "--outputs", path)
        assert code == 0, err
        outs.append(np.load(path)["out0"])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_run_with_no_input_option_is_seed_0(program, capsys):
    assert gir_main(capsys, "run", program, "-e", "first") == gir_main(capsys, "run", program, "-e", "first",
                                                                         "--random", "0")


def test_run_inputs_and_outputs_round_trip(program, capsys, tmp_path):
    inputs, arrays = sample_inputs(tmp_path)
    outputs = tmp_path / "out.npz"
    code, out, err = gir_main(capsys, "run", program, "--inputs", inputs, "--outputs", outputs)
    assert code == 0, err
    with np.load(outputs) as data:
        assert sorted(data.keys()) == ["k", "m", "out0", "out1", "out2", "s"]  # by position and by name
        np.testing.assert_array_equal(data["m"], data["out1"])
        expected_m = arrays["n"] * 2 + 1
        np.testing.assert_array_equal(data["out0"], arrays["x"].sum(axis=0))
        np.testing.assert_array_equal(data["out1"], expected_m)
        np.testing.assert_array_equal(data["out2"], np.where(arrays["c"], arrays["n"], expected_m))
        assert data["out1"].dtype == np.int32
    assert "m: shape (2,) int32 [7, -7]" in out
    expected = gir.interpret(gir.load(str(program)), "second", arrays["x"], arrays["n"], arrays["c"])
    with np.load(outputs) as data:
        for i, want in enumerate(expected):
            np.testing.assert_array_equal(data[f"out{i}"], want)


def test_run_summary_shows_the_first_values(program, capsys, tmp_path):
    inputs = tmp_path / "first.npz"
    np.savez(inputs, x=np.array([0.0, 1.0, -1.0], np.float32))
    code, out, err = gir_main(capsys, "run", program, "-e", "first", "--inputs", inputs)
    assert code == 0, err
    assert out.strip().splitlines()[1:] == ["y: shape (3,) float32 [0, 0.761594, -0.761594]"]


@pytest.mark.parametrize("entry", ["first", "@first"])
def test_run_entry_option_selects_the_function(program, capsys, entry):
    code, out, err = gir_main(capsys, "run", program, "-e", entry, "--random", "3")
    assert code == 0, err
    assert out.strip().splitlines()[0] == "@first on cpu:"
    assert len(out.strip().splitlines()) == 2
    assert out.splitlines()[1].startswith("y: shape (3,) float32")


def test_run_entry_long_option(program, capsys):
    code, out, _ = gir_main(capsys, "run", program, "--entry", "first")
    assert code == 0 and out.splitlines()[1].startswith("y: shape (3,) float32")


def test_run_missing_input_key(program, capsys, tmp_path):
    inputs = tmp_path / "partial.npz"
    np.savez(inputs, x=np.zeros((2, 3)), n=np.zeros(2, np.int32))
    code, out, err = gir_main(capsys, "run", program, "--inputs", inputs)
    assert code == 1
    assert_clean_error(err, f"{program}:{SECOND_AT}")
    assert "'c'" in err
    assert err.splitlines()[1] == PROGRAM.splitlines()[5]  # the line of `func @second`
    assert err.splitlines()[2] == " " * 5 + "^"
    assert out == ""


@pytest.mark.parametrize("bad", [np.zeros((3, 2)), np.zeros((2, 3), np.int32), np.zeros(6)])
def test_run_input_of_the_wrong_shape_or_dtype(program, capsys, tmp_path, bad):
    inputs = tmp_path / "bad.npz"
    np.savez(inputs, x=bad, n=np.zeros(2, np.int32), c=np.zeros(2, bool))
    code, out, err = gir_main(capsys, "run", program, "--inputs", inputs)
    assert code == 1
    assert_clean_error(err, f"{program}:{SECOND_AT}")
    assert "%x" in err and "tensor<2x3xf64>" in err
    assert out == ""


def test_run_inputs_follow_the_calling_convention(program, capsys, tmp_path):
    """float32 for an f64 parameter is widened exactly; float64 for f32 is refused, saying why."""
    inputs = tmp_path / "f32.npz"
    np.savez(inputs, x=np.ones((2, 3), np.float32), n=np.zeros(2, np.int32), c=np.zeros(2, bool))
    code, out, err = gir_main(capsys, "run", program, "--inputs", inputs)
    assert code == 0, err
    assert out.splitlines()[1] == "s: shape (3,) float64 [2, 2, 2]"
    np.savez(inputs, x=np.ones(3))
    code, out, err = gir_main(capsys, "run", program, "-e", "first", "--inputs", inputs)
    assert code == 1 and "gir does not convert float64 to float32 implicitly (loses precision)" in err


def test_run_unknown_entry(program, capsys):
    code, out, err = gir_main(capsys, "run", program, "-e", "third", "--random", "0")
    assert code == 1
    assert_clean_error(err)
    assert "@third" in err and str(program) in err and "@first" in err and "@second" in err


def test_run_unknown_entry_has_a_location(program, capsys):
    code, _, err = gir_main(capsys, "run", program, "-e", "third")
    assert code == 1
    assert re.match(re.escape(str(program)) + r":\d+:\d+: error: ", err), err


def test_run_syntax_error(tmp_path, capsys):
    path = tmp_path / "broken.gir"
    path.write_text(PROGRAM.replace("%s = sum(%x, axes=[0])", "%s = sum(%x, axes=[0]"))
    code, out, err = gir_main(capsys, "run", path, "--random", "0")
    assert code == 1
    assert_clean_error(err, f"{path}:9:3")
    assert err.splitlines()[1] == "  %m = %n * 2 + 1"
    assert err.splitlines()[2] == "  ^"
    assert out == ""


def test_run_type_error(tmp_path, capsys):
    path = tmp_path / "ill_typed.gir"
    path.write_text(PROGRAM.replace("%m = %n * 2 + 1", "%m = %n * 2.5"))
    code, _, err = gir_main(capsys, "run", path)
    assert code == 1
    assert_clean_error(err, f"{path}:9:13")
    assert "2.5" in err


def test_run_runtime_error(tmp_path, capsys):
    path = tmp_path / "divide.gir"
    path.write_text("func @f(%a: tensor<2xi32>) -> tensor<2xi32> {\n  %z = zeros(shape=[2], dtype=\"i32\")\n"
                    "  %q = %a / %z\n  return %q\n}\n")
    code, _, err = gir_main(capsys, "run", path)
    assert code == 1
    assert_clean_error(err, f"{path}:3:11")


def test_run_default_entry_of_an_example(capsys):
    """examples/rnn.gir ends with @rnn_grads: the loss and three gradients."""
    code, out, err = gir_main(capsys, "run", REPO / "examples" / "rnn.gir", "--random", "0")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert [line.split(" [")[0] for line in lines] == [
        "@rnn_grads on cpu:", "loss: shape () float32", "dwx: shape (256, 256) float32",
        "dwh: shape (256, 256) float32", "db: shape (256,) float32"]


def test_run_unknown_dims_need_inputs(tmp_path, capsys):
    path = tmp_path / "dynamic.gir"
    path.write_text("func @f(%a: tensor<?x2xf32>) -> tensor<?x2xf32> {\n  %b = -%a\n  return %b\n}\n")
    code, _, err = gir_main(capsys, "run", path, "--random", "1")
    assert code == 1
    assert_clean_error(err, f"{path}:1:6")
    assert "tensor<?x2xf32>" in err and "%a" in err
    inputs = tmp_path / "in.npz"
    np.savez(inputs, a=np.ones((4, 2), np.float32))
    code, out, err = gir_main(capsys, "run", path, "--inputs", inputs)
    assert code == 0, err
    assert out.splitlines()[1] == "b: shape (4, 2) float32 [-1, -1, -1, -1, ...]"


def test_run_missing_inputs_file(program, capsys, tmp_path):
    code, _, err = gir_main(capsys, "run", program, "--inputs", tmp_path / "nope.npz")
    assert code == 1
    assert_clean_error(err)
    assert "nope.npz" in err


def test_run_missing_program_file(tmp_path, capsys):
    code, _, err = gir_main(capsys, "run", tmp_path / "nope.gir")
    assert code == 1
    assert_clean_error(err)
    assert "nope.gir" in err


def test_run_inputs_and_random_are_exclusive(program, capsys, tmp_path):
    inputs, _ = sample_inputs(tmp_path)
    with pytest.raises(SystemExit) as info:
        gir.cli.main(["run", str(program), "--random", "0", "--inputs", str(inputs)])
    assert info.value.code == 2
    assert "not allowed" in capsys.readouterr().err


def test_run_inputs_from_a_npy_file_is_a_clean_error(program, capsys, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((2, 3)))
    code, _, err = gir_main(capsys, "run", program, "--inputs", path)
    assert code == 1
    assert_clean_error(err)


def test_run_inputs_with_an_object_array_is_a_clean_error(program, capsys, tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([None, 1], dtype=object), n=np.zeros(2, np.int32), c=np.zeros(2, bool))
    code, _, err = gir_main(capsys, "run", program, "--inputs", path)
    assert code == 1
    assert_clean_error(err)


def test_run_outputs_to_a_missing_directory_is_a_clean_error(program, capsys, tmp_path):
    code, _, err = gir_main(capsys, "run", program, "--outputs", tmp_path / "no" / "such" / "out.npz")
    assert code == 1
    assert_clean_error(err)


# ---------------------------------------------------------------------------------------------
# gir opt


def test_opt_without_passes_prints_the_parsed_module(program, capsys):
    code, out, err = gir_main(capsys, "opt", program, "-p", "")
    assert code == 0, err
    assert out == str(gir.load(str(program)))


def test_opt_output_file_reparses(program, capsys, tmp_path):
    out_path = tmp_path / "out.gir"
    code, out, err = gir_main(capsys, "opt", program, "-o", out_path)
    assert code == 0, err
    assert out == ""
    text = out_path.read_text()
    assert str(gir.parse(text)) == text
    # opt of opt's output without passes is the same file
    again = tmp_path / "again.gir"
    assert gir_main(capsys, "opt", out_path, "-p", "", "-o", again)[0] == 0
    assert again.read_text() == text


def test_opt_output_runs_like_the_input(program, capsys, tmp_path):
    out_path = tmp_path / "out.gir"
    assert gir_main(capsys, "opt", program, "-o", out_path)[0] == 0
    _, arrays = sample_inputs(tmp_path)
    args = [arrays["x"], arrays["n"], arrays["c"]]
    before = gir.interpret(gir.load(str(program)), "second", *args)
    after = gir.interpret(gir.load(str(out_path)), "second", *args)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.gir")), ids=lambda p: p.name)
def test_opt_examples_with_locations_reparse(example, capsys, tmp_path):
    out_path = tmp_path / "out.gir"
    code, _, err = gir_main(capsys, "opt", example, "-p", "", "--print-locations", "-o", out_path)
    assert code == 0, err
    text = out_path.read_text()
    assert f'loc("{example}":' in text
    module = gir.parse(text)
    assert print_module(module, print_locations=True) == text
    assert str(module) == str(gir.load(str(example)))


def test_opt_error(tmp_path, capsys):
    path = tmp_path / "bad.gir"
    path.write_text("func @f(%x: tensor<3xf32>) -> tensor<3xf32> {\n  %y = frob(%x)\n  return %y\n}\n")
    out_path = tmp_path / "out.gir"
    code, out, err = gir_main(capsys, "opt", path, "-o", out_path)
    assert code == 1
    assert_clean_error(err, f"{path}:2:8")
    assert not out_path.exists()


def test_opt_output_to_a_missing_directory_is_a_clean_error(program, capsys, tmp_path):
    code, _, err = gir_main(capsys, "opt", program, "-o", tmp_path / "no" / "such" / "out.gir")
    assert code == 1
    assert_clean_error(err)


# ---------------------------------------------------------------------------------------------
# The installed command


def gir_command() -> list[str]:
    exe = shutil.which("gir")
    return [exe] if exe else [sys.executable, "-m", "gir.cli"]


def test_console_script_quick_start():
    """The README's quick start: run the RNN loss of examples/rnn.gir on seeded random inputs."""
    proc = subprocess.run([*gir_command(), "run", "examples/rnn.gir", "-e", "rnn_loss", "--random", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("@rnn_loss on cpu:\nloss: shape () float32 [")


def test_console_script_error_has_no_traceback(tmp_path):
    path = tmp_path / "bad.gir"
    path.write_text("func @f() {\n  return %nope\n}\n")
    proc = subprocess.run([*gir_command(), "opt", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"{path}:2:10: error: use of undefined value %nope")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("folder", ["a{b}", "with {braces} and blanks"])
def test_run_of_a_path_with_braces_reads_the_file(tmp_path: Path, capsys, folder: str) -> None:
    """A path argument is a path: `gir run` passes it to gir.jit as a pathlib.Path (a `{` made the
    str look like program text: "<jit>:1:1: error: unexpected '/'")."""
    path = tmp_path / folder / "prog.gir"
    path.parent.mkdir()
    path.write_text(PROGRAM)
    code, out, err = gir_main(capsys, "run", path, "-e", "first", "--random", "1")
    assert code == 0, err
    assert out.startswith("@first on cpu:"), out
    ones = np.ones(3, np.float32)
    np.testing.assert_array_equal(gir.jit(str(path), "first")(ones)[0], np.tanh(ones))
    np.testing.assert_array_equal(gir.jit(path, "first")(ones)[0], np.tanh(ones))


def test_jit_of_a_missing_gir_path_with_braces_says_it_cannot_read_it(tmp_path: Path) -> None:
    with pytest.raises(gir.GirError, match="cannot read .*no\\{such\\}"):
        gir.jit(str(tmp_path / "no{such}" / "prog.gir"))


@pytest.mark.parametrize("flag", ["--check-numerics", "--check"])
def test_check_numerics_without_a_seed_leaves_the_file_argument_alone(program: Path, capsys, flag: str) -> None:
    """`gir opt --check-numerics FILE`: FILE is the file, the seed 0 (argparse's optional value
    took FILE as the seed: "invalid int value")."""
    code, out, err = gir_main(capsys, "opt", flag, program, "-p", "ssa,canonicalize")
    assert code == 0, err
    assert "func @second" in out
    assert gir.cli.build_parser().parse_args(gir.cli.seed_only_after_equals(["opt", flag, "f.gir"])).check_numerics == 0
    assert gir.cli.build_parser().parse_args(gir.cli.seed_only_after_equals(["opt", "--check-numerics=7", "f.gir"])
                                             ).check_numerics == 7
    assert gir.cli.seed_only_after_equals(["opt", "--", "--check"]) == ["opt", "--", "--check"]
