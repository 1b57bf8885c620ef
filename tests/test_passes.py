"""The pass manager and its debugging aids, through the Python API and through `gir opt`.

Test-only passes are put into the pass table with monkeypatch (in process) or by a small
driver script (in a subprocess, to see exactly what a user sees: no traceback).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.cli import main
from gir.errors import GirError, GirPassError
from gir.ir.core import Module
from gir.ir.interpreter import interpret, random_inputs
from gir.ir.types import TensorType
from gir.passes.base import Pass
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE, PASSES, parse_pipeline
from gir.passes.rewriter import PassStatistics, Pattern, Rewriter, apply_patterns_greedily
from gir.transforms.canonicalize import Canonicalize, cse
from gir.transforms.ssa import SSA

ROOT = Path(__file__).resolve().parent.parent

SOURCE = """\
func @f(%xs: tensor<3x4xf64>, %h0: tensor<4xf64>, %w: tensor<4xf64>) -> (tensor<4xf64>, tensor<3x4xf64>) {
  %h = %h0
  for %x in %xs {
    %h = tanh(%h * %w - %x) + 0.0
    collect %h / 2.0 into %hs
  }
  %dead = exp(%h)
  return %h * 1.0, %hs
}
"""
"""A loop that ssa turns into a scan, identities for canonicalize, dead code; `tanh` is at 4:10."""

TANH_LINE, TANH_COL = 4, 10


# -- test-only passes -----------------------------------------------------------------------


@dataclass(frozen=True)
class EchoOptions:
    count: int = 1
    scale: float = 1.0
    flag: bool = False
    label: str = "x"
    max_depth: int = 3


class Echo(Pass):
    """Test-only: changes nothing; its options exercise the pipeline-string parser."""

    name = "test-echo"
    Options = EchoOptions

    def run(self, module: Module, stats: PassStatistics) -> bool:
        stats.count("runs")
        return False


class BreakTypes(Pass):
    """Test-only: gives the first `tanh` a wrong result type, which only the verifier notices."""

    name = "test-break-types"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        for op in module.walk():
            if op.name == "tanh":
                op.results[0].type = TensorType((7,), "f64")
                return True
        return False


class SwapSub(Pass):
    """Test-only: a - b -> b - a. The IR stays valid; only the numbers are wrong."""

    name = "test-swap-sub"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        rw = Rewriter(stats)
        rw.current = "SwapSub"
        for op in list(module.walk()):
            if op.name == "sub":
                a, b = op.operands
                rw.replace_op(op, [rw.value("sub", [b, a], before=op)])
        return rw.changed


class CrashOnMul(Pass):
    """Test-only: crashes (ZeroDivisionError) when it meets a `mul`."""

    name = "test-crash-on-mul"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        for op in module.walk():
            if op.name == "mul":
                return bool(1 / 0)
        return False


TEST_PASSES = [Echo, BreakTypes, SwapSub, CrashOnMul]


@pytest.fixture
def test_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in TEST_PASSES:
        monkeypatch.setitem(PASSES, cls.name, cls)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.gir"
    path.write_text(SOURCE, encoding="utf-8")
    return path


def module() -> Module:
    return gir.parse(SOURCE, "src.gir")


DRIVER = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gir_test_passes_driver", {path!r})
tests = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tests
spec.loader.exec_module(tests)
from gir.passes.pipeline import PASSES
for cls in tests.TEST_PASSES:
    PASSES[cls.name] = cls
from gir.cli import main
sys.exit(main(sys.argv[1:]))
"""


def gir_with_test_passes(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`gir ARGV` in a fresh Python whose pass table also holds the test-only passes."""
    driver = tmp_path / "gir_driver.py"
    driver.write_text(DRIVER.format(path=str(Path(__file__).resolve())), encoding="utf-8")
    return subprocess.run([sys.executable, str(driver), *argv], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "GIR_TRACEBACK"})


HEADER = re.compile(r"^// -----// IR Dump (.+) //----- //$", re.MULTILINE)


def dumps(text: str) -> list[tuple[str, str]]:
    """(header, IR) for each `// -----// IR Dump ... //----- //` section of text."""
    marks = list(HEADER.finditer(text))
    out = []
    for m, nxt in zip(marks, marks[1:] + [None]):
        out.append((m.group(1), text[m.end() : nxt.start() if nxt else len(text)].strip()))
    return out


def assert_reparses(ir: str) -> Module:
    assert "//" not in ir, "printed IR must not contain // comments"
    reparsed = gir.parse(ir)
    assert str(reparsed).strip() == ir.strip()
    return reparsed


# -- pipeline strings -----------------------------------------------------------------------


def test_pipeline_names() -> None:
    passes = parse_pipeline(" ssa , canonicalize ")
    assert [type(p) for p in passes] == [SSA, Canonicalize]
    assert PassManager("ssa,canonicalize").pipeline == "ssa,canonicalize"
    assert parse_pipeline("") == []


def test_pipeline_options_are_typed(test_passes: None) -> None:
    (p,) = parse_pipeline("test-echo{count=3,scale=0.5,flag=true,label=abc,max-depth=7}")
    assert p.options == EchoOptions(count=3, scale=0.5, flag=True, label="abc", max_depth=7)
    assert p.spec() == "test-echo{count=3,scale=0.5,flag=true,label=abc,max-depth=7}"
    (again,) = parse_pipeline(p.spec())
    assert again.options == p.options


def test_pipeline_options_defaults_and_spec(test_passes: None) -> None:
    a, b = parse_pipeline("test-echo,test-echo{flag=1}")
    assert a.options == EchoOptions() and a.spec() == "test-echo"
    assert b.options.flag is True and b.spec() == "test-echo{flag=true}"
    assert dataclasses.is_dataclass(b.options)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.options.count = 2  # type: ignore[misc]


@pytest.mark.parametrize("pipeline, message", [
    ("ssa,nope", "unknown pass 'nope'"),
    ("test-echo{bogus=1}", "pass 'test-echo' has no option 'bogus'"),
    ("ssa{x=1}", "pass 'ssa' has no option 'x' (options: none)"),
    ("test-echo{count=abc}", "option 'count' of pass 'test-echo' cannot be 'abc' (expected int)"),
    ("test-echo{flag=maybe}", "cannot be 'maybe' (expected bool)"),
    ("test-echo{count}", "needs a value"),
    ("test-echo{count=1", "unbalanced '{'"),
    ("test-echo}", "unbalanced '}'"),
])
def test_pipeline_errors_are_gir_errors(test_passes: None, pipeline: str, message: str) -> None:
    with pytest.raises(GirError) as info:
        parse_pipeline(pipeline)
    assert isinstance(info.value, GirPassError)
    assert message in info.value.message


def test_unknown_pass_lists_the_passes() -> None:
    with pytest.raises(GirPassError) as info:
        PassManager("frobnicate")
    for name in PASSES:
        assert name in info.value.message


def test_cli_pipeline_error(src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["opt", str(src), "-p", "ssa,nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown pass 'nope'")


def test_every_pass_follows_the_pass_interface() -> None:
    for name, cls in PASSES.items():
        assert cls.name == name
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name), name
        assert dataclasses.is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for cls in (SSA, Canonicalize):
        doc = sys.modules[cls.__module__].__doc__ or ""
        assert "Before" in doc and "After" in doc, f"{cls.name} needs a before/after example"


PASSES_MD = ROOT / "docs" / "passes.md"


def test_default_pipeline_is_documented() -> None:
    doc = PASSES_MD.read_text(encoding="utf-8")
    assert f"`{DEFAULT_PIPELINE}`" in doc
    parse_pipeline(DEFAULT_PIPELINE)


def test_docs_show_real_pass_output() -> None:
    """The gir blocks of docs/passes.md: the worked example's input, and exactly what
    `-p ''`, `-p ssa` and `-p ssa,canonicalize` print for it."""
    blocks = [b.strip() for b in re.findall(r"^```gir\n(.*?)^```", PASSES_MD.read_text(encoding="utf-8"),
                                            re.S | re.M)]
    (model,) = [b for b in blocks if "for %x in %xs" in b]
    printed = set()
    for pipeline in ("", "ssa", "ssa,canonicalize"):
        m = gir.parse(model, "model.gir")
        PassManager(pipeline).run(m)
        printed.add(str(m).strip())
    assert printed == set(blocks) - {model}


# -- IR dumps -------------------------------------------------------------------------------


def run_dumping(pipeline: str, **debug: object) -> list[tuple[str, str]]:
    out = io.StringIO()
    PassManager(pipeline, out=out, **debug).run(module())
    return dumps(out.getvalue())


def test_print_ir_before() -> None:
    (header, ir), = run_dumping("ssa,canonicalize", print_ir_before=frozenset({"canonicalize"}))
    assert header == "Before canonicalize"
    m = assert_reparses(ir)
    assert {op.name for op in m.walk()} >= {"scan", "constant"} and "var" not in ir


def test_print_ir_after() -> None:
    (header, ir), = run_dumping("ssa,canonicalize", print_ir_after=frozenset({"ssa"}))
    assert header == "After ssa"
    assert "scan" in {op.name for op in assert_reparses(ir).walk()}


def test_print_ir_after_all() -> None:
    found = run_dumping("ssa,canonicalize", print_ir_after_all=True)
    assert [h for h, _ in found] == ["After ssa", "After canonicalize"]
    for _, ir in found:
        assert_reparses(ir)
    assert "add" in found[0][1] and "add" not in found[1][1]  # the `+ 0.0` is gone


def test_print_ir_after_change() -> None:
    found = run_dumping("ssa,canonicalize,canonicalize,ssa", print_ir_after_change=True)
    assert [h for h, _ in found] == ["After ssa", "After canonicalize"]
    for _, ir in found:
        assert_reparses(ir)


def test_print_ir_after_failure(test_passes: None) -> None:
    out = io.StringIO()
    with pytest.raises(GirPassError):
        PassManager("ssa,test-swap-sub,canonicalize", out=out, print_ir_after_failure=True,
                    check_numerics=0).run(module())
    (header, ir), = dumps(out.getvalue())
    assert header == "After test-swap-sub Failed"
    assert re.search(r"sub %x, %\d+", ir), ir  # the IR as the failing pass left it
    assert_reparses(ir)


def test_print_ir_after_failure_shows_the_broken_op(test_passes: None) -> None:
    out = io.StringIO()
    with pytest.raises(GirPassError):
        PassManager("ssa,test-break-types", out=out, print_ir_after_failure=True).run(module())
    (header, ir), = dumps(out.getvalue())
    assert header == "After test-break-types Failed"
    assert re.search(r"= tanh %\d+ : tensor<7xf64>", ir), ir


def test_dumps_with_locations_reparse_to_the_same_locations() -> None:
    (_, ir), = run_dumping("ssa", print_ir_after_all=True, print_locations=True)
    assert 'loc("src.gir":4:10)' in ir
    m = gir.parse(ir, "dump.gir")
    tanh = next(op for op in m.walk() if op.name == "tanh")
    assert (tanh.loc.file, tanh.loc.line, tanh.loc.col) == ("src.gir", TANH_LINE, TANH_COL)


@pytest.mark.parametrize("flags, headers", [
    (["--print-ir-before=canonicalize"], ["Before canonicalize", "Before canonicalize"]),
    (["--print-ir-after=ssa"], ["After ssa"]),
    (["--print-ir-after", "ssa", "--print-ir-after", "canonicalize"],
     ["After ssa", "After canonicalize", "After canonicalize"]),
    (["--print-ir-after-all"], ["After ssa", "After canonicalize", "After canonicalize"]),
    (["--print-ir-after-change"], ["After ssa", "After canonicalize"]),
])
def test_cli_print_flags(src: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                         headers: list[str]) -> None:
    assert main(["opt", str(src), "-p", "ssa,canonicalize,canonicalize", *flags]) == 0
    captured = capsys.readouterr()
    found = dumps(captured.err)
    assert [h for h, _ in found] == headers
    for _, ir in found:
        assert_reparses(ir)
    assert_reparses(captured.out)  # the final IR, on stdout


# -- dump directory -------------------------------------------------------------------------


def test_dump_dir(src: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    assert main(["opt", str(src), "-p", "ssa,canonicalize", "--dump-dir", str(folder), "-o",
                 str(tmp_path / "out.gir")]) == 0
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["00-input.gir", "01-ssa.gir", "02-canonicalize.gir"]
    texts = {name: (folder / name).read_text(encoding="utf-8") for name in files}
    ops = {name: {op.name for op in assert_reparses(text).walk()} for name, text in texts.items()}
    assert {"var", "load", "store", "for"} <= ops["00-input.gir"]
    assert "scan" in ops["01-ssa.gir"] and not {"var", "load", "store", "for"} & ops["01-ssa.gir"]
    assert "add" in ops["01-ssa.gir"] and "add" not in ops["02-canonicalize.gir"]
    assert texts["02-canonicalize.gir"] == (tmp_path / "out.gir").read_text(encoding="utf-8")


def test_dump_dir_api_numbers_repeated_passes(tmp_path: Path) -> None:
    PassManager("ssa,canonicalize,canonicalize", dump_dir=str(tmp_path)).run(module())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00-input.gir", "01-ssa.gir", "02-canonicalize.gir", "03-canonicalize.gir"]


# -- timing and statistics ------------------------------------------------------------------

ROW = re.compile(r"^\s+([A-Za-z]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+\.\d+)$", re.MULTILINE)


def test_cli_timing(src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["opt", str(src), "-p", "ssa,canonicalize", "--timing"]) == 0
    err = capsys.readouterr().err
    assert "gir pass timing report" in err
    assert re.search(r"^\s+\d+\.\d+\s+yes\s+20 -> 13\s+ssa$", err, re.MULTILINE), err
    assert re.search(r"^\s+\d+\.\d+\s+yes\s+13 -> 8\s+canonicalize$", err, re.MULTILINE), err
    assert re.search(r"pattern\s+applied\s+tried\s+created\s+erased\s+seconds", err)
    rows = {m.group(1): tuple(int(m.group(i)) for i in range(2, 6)) for m in ROW.finditer(err)}
    assert rows["AddZero"] == (1, 1, 0, 1)  # applied, tried, created, erased
    assert rows["MulOne"][0] == 1 and rows["DeadCode"][0] >= 1
    never = re.search(r"tried, never applied: (.+)", err)
    assert never and "DivOne" in never.group(1).split(", ")  # `/ 2.0` was tried, never rewritten
    assert re.search(r"^\s+\d+\.\d+\s+total$", err, re.MULTILINE)


def test_cli_stats_json(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    assert main(["opt", str(src), "-p", "ssa,canonicalize", "--stats-json", str(out), "-o", str(tmp_path / "o")]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    ssa, canon = data["passes"]
    assert (ssa["pass"], ssa["ops_before"], ssa["ops_after"], ssa["changed"]) == ("ssa", 20, 13, True)
    assert (canon["pass"], canon["ops_before"], canon["ops_after"]) == ("canonicalize", 13, 8)
    assert canon["patterns"]["AddZero"] == {**canon["patterns"]["AddZero"], "tried": 1, "applied": 1, "created": 0,
                                            "erased": 1}
    assert set(canon["patterns"]["AddZero"]) == {"tried", "applied", "created", "erased", "seconds"}
    assert "DivOne" in canon["never_applied"] and "AddZero" not in canon["never_applied"]
    assert canon["never_applied"] == sorted(canon["never_applied"])
    assert data["total_seconds"] >= 0 and abs(data["total_seconds"] - ssa["seconds"] - canon["seconds"]) < 1e-5


def test_report_api(test_passes: None) -> None:
    report = PassManager("ssa,test-echo{count=2},canonicalize").run(module())
    assert [r.spec for r in report.records] == ["ssa", "test-echo{count=2}", "canonicalize"]
    assert [r.changed for r in report.records] == [True, False, True]
    assert report.records[1].stats.counters == {"runs": 1}
    for before, after in zip(report.records, report.records[1:]):
        assert before.ops_after == after.ops_before
    table = report.timing_table()
    assert "test-echo{count=2}" in table and "runs: 1" in table
    assert json.loads(json.dumps(report.as_dict()))["passes"][1]["counters"] == {"runs": 1}


# -- catching broken passes -----------------------------------------------------------------


def test_verify_each_names_the_pass_and_the_op(test_passes: None) -> None:
    with pytest.raises(GirPassError) as info:
        PassManager("ssa,test-break-types").run(module())
    e = info.value
    assert e.message.startswith("pass 'test-break-types' produced invalid IR: 'tanh' results are tensor<7xf64>")
    assert (e.loc.file, e.loc.line, e.loc.col) == ("src.gir", TANH_LINE, TANH_COL)
    text = str(e)
    assert text.startswith(f"src.gir:{TANH_LINE}:{TANH_COL}: error: pass 'test-break-types' produced invalid IR")
    assert "    %h = tanh(%h * %w - %x) + 0.0\n         ^" in text  # the source line and a caret


def test_an_invalid_input_is_its_own_error_not_the_first_pass_s() -> None:
    """PassManager.run verifies its input: a module edited through the API into invalid IR is a
    GirVerifyError at the op, not 'pass canonicalize produced invalid IR'."""
    m = module()
    PassManager("ssa").run(m)
    tanh = next(op for op in m.walk() if op.name == "tanh")
    tanh.results[0].type = TensorType((7,), "f64")
    with pytest.raises(GirError) as info:
        PassManager("canonicalize").run(m)
    assert type(info.value) is gir.GirVerifyError, info.value
    assert info.value.message.startswith("'tanh' results are tensor<7xf64>")
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.col) == ("src.gir", TANH_LINE, TANH_COL)


def test_no_verify_each_lets_broken_ir_through(test_passes: None) -> None:
    m = module()
    PassManager("ssa,test-break-types", verify_each=False).run(m)
    with pytest.raises(GirError):
        gir.verify(m)


def test_check_numerics_names_the_pass(test_passes: None) -> None:
    PassManager("ssa,canonicalize", check_numerics=0).run(module())  # correct passes pass
    with pytest.raises(GirPassError) as info:
        PassManager("ssa,canonicalize,test-swap-sub,canonicalize", check_numerics=5).run(module())
    msg = info.value.message
    assert msg.startswith("--check-numerics: pass 'test-swap-sub' changed result out0 of @f")
    assert "seed 5" in msg


def test_check_numerics_uses_the_seed_it_is_given() -> None:
    m = module()
    f = m.functions["f"]
    assert [a.tolist() for a in random_inputs(f, 1)] != [a.tolist() for a in random_inputs(f, 2)]
    before = interpret(m, "f", *random_inputs(f, 1))
    PassManager("ssa,canonicalize", check_numerics=1).run(m)
    after = interpret(m, "f", *random_inputs(f, 1))
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_crash_leaves_a_reproducer_that_reproduces(test_passes: None, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(GirPassError) as info:
        PassManager("ssa,test-crash-on-mul", reproducer=True, reproducer_dir=str(tmp_path)).run(module())
    e = info.value
    assert e.message == "pass 'test-crash-on-mul' crashed: ZeroDivisionError: division by zero"
    repro = Path(e.reproducer)  # type: ignore[arg-type]
    assert repro == tmp_path / "gir-reproducer-test-crash-on-mul.gir"
    assert f"reproducer written to {repro}" in (e.note or "")
    text = repro.read_text(encoding="utf-8")
    assert text.startswith("// gir reproducer: pass 'test-crash-on-mul' failed: pass 'test-crash-on-mul' crashed")
    assert f"// reproduce with: gir opt {repro} -p 'test-crash-on-mul'" in text
    ops = {op.name for op in gir.parse(text).walk()}
    assert "scan" in ops and "var" not in ops  # the IR given to the failing pass: after ssa
    again = tmp_path / "again"
    assert main(["opt", str(repro), "-p", "test-crash-on-mul", "--reproducer-dir", str(again)]) == 1
    assert "pass 'test-crash-on-mul' crashed: ZeroDivisionError" in capsys.readouterr().err


def test_failed_verification_also_leaves_a_reproducer(test_passes: None, tmp_path: Path) -> None:
    with pytest.raises(GirPassError) as info:
        PassManager("ssa,test-break-types", reproducer_dir=str(tmp_path)).run(module())
    repro = info.value.reproducer
    assert repro is not None
    with pytest.raises(GirPassError, match="pass 'test-break-types' produced invalid IR"):
        PassManager("test-break-types").run(gir.load(repro))


def test_reproducer_goes_to_the_dump_dir(test_passes: None, tmp_path: Path) -> None:
    with pytest.raises(GirPassError):
        PassManager("ssa,test-crash-on-mul", reproducer=True, dump_dir=str(tmp_path)).run(module())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00-input.gir", "01-ssa.gir",
                                                          "gir-reproducer-test-crash-on-mul.gir"]


def test_program_errors_are_not_pass_failures(tmp_path: Path) -> None:
    """A diagnostic about the program (ssa: read before assigned) is not a crash of the pass."""
    m = gir.parse("func @f(%xs: tensor<2x4xf64>) -> tensor<4xf64> {\n  for %x in %xs {\n    %t = %x\n"
                  "    %t = %t * %x\n  }\n  return %t\n}\n", "p.gir")
    with pytest.raises(GirError) as info:
        PassManager("ssa", reproducer_dir=str(tmp_path)).run(m)
    assert not isinstance(info.value, GirPassError)
    assert str(info.value).startswith("p.gir:6:10: error: %t is read before it is assigned on some path")
    assert list(tmp_path.iterdir()) == []


# -- the same through the command line, in a subprocess: no traceback ------------------------


def test_cli_verify_failure_without_traceback(tmp_path: Path, src: Path) -> None:
    proc = gir_with_test_passes(tmp_path, "opt", str(src), "-p", "ssa,test-break-types", "--reproducer-dir",
                                str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"{src}:{TANH_LINE}:{TANH_COL}: error: pass 'test-break-types' produced invalid IR")
    assert "note: reproducer written to" in proc.stderr
    assert proc.stdout == ""


def test_cli_check_numerics_without_traceback(tmp_path: Path, src: Path) -> None:
    proc = gir_with_test_passes(tmp_path, "opt", str(src), "-p", "ssa,test-swap-sub", "--check-numerics=3",
                                "--print-ir-after-failure", "--reproducer-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "error: --check-numerics: pass 'test-swap-sub' changed result out0 of @f" in proc.stderr
    assert "seed 3" in proc.stderr
    (header, ir), = dumps(proc.stderr.split("\n" + str(src))[0])
    assert header == "After test-swap-sub Failed"
    assert_reparses(ir)


def test_cli_check_numerics_default_seed(tmp_path: Path, src: Path) -> None:
    proc = gir_with_test_passes(tmp_path, "opt", str(src), "-p", "ssa,test-swap-sub", "--check-numerics",
                                "--reproducer-dir", str(tmp_path / "r"))
    assert proc.returncode == 1 and "seed 0" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_crash_reproducer_reproduces(tmp_path: Path, src: Path) -> None:
    folder = tmp_path / "r"
    proc = gir_with_test_passes(tmp_path, "opt", str(src), "-p", "ssa,test-crash-on-mul", "--reproducer-dir",
                                str(folder))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "error: pass 'test-crash-on-mul' crashed: ZeroDivisionError: division by zero" in proc.stderr
    repro = folder / "gir-reproducer-test-crash-on-mul.gir"
    assert f"note: reproducer written to {repro}; run: gir opt {repro} -p 'test-crash-on-mul'" in proc.stderr
    again = gir_with_test_passes(tmp_path, "opt", str(repro), "-p", "test-crash-on-mul", "--reproducer-dir",
                                 str(tmp_path / "again"))
    assert again.returncode == 1
    assert "Traceback" not in again.stderr
    assert "error: pass 'test-crash-on-mul' crashed: ZeroDivisionError: division by zero" in again.stderr


def test_cli_check_numerics_reproducer_reproduces(tmp_path: Path, src: Path) -> None:
    proc = gir_with_test_passes(tmp_path, "opt", str(src), "-p", "ssa,test-swap-sub", "--check-numerics=3",
                                "--reproducer-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    command = re.search(r"; run: gir opt (.+)$", proc.stderr, re.MULTILINE)
    assert command, proc.stderr
    again = gir_with_test_passes(tmp_path, "opt", *shlex.split(command.group(1)), "--reproducer-dir",
                                 str(tmp_path / "again"))
    assert again.returncode == 1, "the printed command does not reproduce the failure"
    assert "pass 'test-swap-sub' changed result" in again.stderr


# -- what rewrites did, counted -------------------------------------------------------------


def test_canonicalize_counts_per_pattern() -> None:
    m = gir.parse("""\
func @g(%x: tensor<4xf64>, %y: tensor<4xf64>) -> tensor<4xf64> {
  %z = constant 0.0 : tensor<f64>
  %a = add %x, %z : tensor<4xf64>
  %b = mul %a, %y : tensor<4xf64>
  %c = mul %y, %x : tensor<4xf64>
  %d = add %b, %c : tensor<4xf64>
  %e = exp %d : tensor<4xf64>
  return %d
}
""")
    stats = PassStatistics()
    assert Canonicalize().run(m, stats)
    p = stats.patterns
    assert (p["AddZero"].applied, p["AddZero"].erased) == (1, 1)
    assert p["CSE"].applied == 1  # mul %x, %y and mul %y, %x
    assert p["DeadCode"].applied == 2  # exp, then the orphaned constant
    assert [op.name for op in m.functions["g"].body] == ["mul", "add", "return"]
    assert not Canonicalize().run(m, PassStatistics())  # a fixed point


SIBLINGS = """\
func @s(%xs: tensor<5x4xf64>, %a: tensor<4xf64>, %b: tensor<4xf64>)
    -> (tensor<4xf64>, tensor<5x4xf64>, tensor<5x4xf64>) {
  %0 = mul %a, %b : tensor<4xf64>
  %ys = scan (%x in %xs) {
    %1 = mul %a, %b : tensor<4xf64>
    %2 = sub %a, %b : tensor<4xf64>
    %3 = add %1, %2 : tensor<4xf64>
    yield () stack (%3)
  } : tensor<5x4xf64>
  %zs = scan (%x2 in %xs) {
    %4 = sub %a, %b : tensor<4xf64>
    yield () stack (%4)
  } : tensor<5x4xf64>
  return %0, %ys, %zs
}
"""


def test_cse_is_scoped_by_regions() -> None:
    """CSE alone (no hoisting): a body reuses an op from before its scan, never one from a
    sibling scan's body."""
    m = gir.parse(SIBLINGS)
    rw = Rewriter(PassStatistics())
    assert cse(m.functions["s"], rw)
    assert rw.stats.patterns["CSE"].applied == 1
    ys, zs = (op for op in m.functions["s"].body if op.name == "scan")
    assert [op.name for op in ys.body] == ["sub", "add", "yield"]
    assert ys.body.ops[1].operands[0] is m.functions["s"].body.first.result
    assert [op.name for op in zs.body] == ["sub", "yield"]  # not merged with the sub of %ys


def test_greedy_driver_counts_and_revisits() -> None:
    class FoldNegOfNeg(Pattern):
        """neg(neg(x)) -> x"""

        op_name = "neg"

        def match_and_rewrite(self, op, rw):  # type: ignore[no-untyped-def]
            inner = getattr(op.operands[0], "op", None)
            if inner is None or inner.name != "neg":
                return False
            rw.replace_op(op, [inner.operands[0]])
            return True

    m = gir.parse("""\
func @n(%x: tensor<4xf64>) -> tensor<4xf64> {
  %a = neg %x : tensor<4xf64>
  %b = neg %a : tensor<4xf64>
  %c = neg %b : tensor<4xf64>
  %d = neg %c : tensor<4xf64>
  return %d
}
""")
    stats = PassStatistics()
    assert apply_patterns_greedily(m.functions["n"], [FoldNegOfNeg()], Rewriter(stats))
    s = stats.patterns["FoldNegOfNeg"]
    assert (s.applied, s.created, s.erased) == (2, 0, 2)
    assert s.tried >= 4
    body = m.functions["n"].body
    assert [op.name for op in body] == ["neg", "neg", "return"]  # the unused neg is DCE's job
    assert body.last.operands[0] is m.functions["n"].args[0]
