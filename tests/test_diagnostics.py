"""Diagnostics: malformed and ill-typed programs give a `gir.GirError` subclass whose text is
`file:line:col: error: message`, then the offending source line, then a caret under the column.

Each case names where the error must point as (line, text): the column is where `text` first
starts on that line, so the expected position is exact and readable at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gir
import pytest

FILE = "diag.gir"


@dataclass
class Case:
    id: str
    text: str
    error: type[gir.GirError]
    message: str
    """A substring of the message."""
    line: int
    at: str
    """The error's column is where this text starts on `line`."""
    nth: int = 0
    """Which occurrence of `at` on the line (0: the first); `at="$END"` is the end of the line."""

    @property
    def col(self) -> int:
        source = self.text.splitlines()[self.line - 1]
        if self.at == "$END":
            return len(source) + 1
        start = -1
        for _ in range(self.nth + 1):
            start = source.index(self.at, start + 1)
        return start + 1


SIG = "func @f(%x: tensor<3xf32>, %y: tensor<4xf32>, %d: tensor<3xf64>, %m: tensor<3x4xf32>, %s: tensor<f32>)"


def body(*lines: str, results: str = "-> tensor<3xf32>", ret: str = "return %x") -> str:
    """A function over %x, %y, %d, %m, %s whose body starts on line 2."""
    return "\n".join([f"{SIG} {results} {{", *("  " + line for line in lines), f"  {ret}", "}", ""])


G = "func @g(%a: tensor<3xf32>) -> (tensor<f32>, tensor<3xf32>) {\n  %t = sum(%a)\n  return %t, %a\n}\n"
"""A helper function of 4 lines, put before the function under test."""

Syn, Typ, Ver = gir.GirSyntaxError, gir.GirTypeError, gir.GirVerifyError

CASES = [
    # ---- syntax
    Case("missing-equals", body("%a tanh(%x)"), Syn, "unexpected", 2, "tanh"),
    Case("unterminated-function", f"{SIG} -> tensor<3xf32> {{\n  %a = tanh(%x)", Syn, "end of input", 2, "$END"),
    Case("unterminated-scan", body("%a = scan (%e in %m) {", "%b = tanh(%e)"), Syn, "'yield'", 4, "return"),
    Case("stray-character", body("%a = tanh(%x) # comment"), Syn, "'#'", 2, "#"),
    Case("missing-return", f"{SIG} -> tensor<3xf32> {{\n  %a = tanh(%x)\n}}\n", Syn, "unexpected", 3, "}"),
    Case("yield-outside-a-loop", body("yield (%x)"), Syn, "yield", 2, "yield"),
    Case("unbalanced-parens", body("%a = tanh((%x)"), Syn, "')'", 3, "return"),
    Case("bad-attribute-syntax", body("%a = sum %x {axes: [0]}"), Syn, "unexpected", 2, ":"),
    Case("unterminated-string", body('%a = transfer %x {device = "gpu}'), Syn, "unexpected", 2, '"'),
    Case("param-without-type", "func @f(%x) -> tensor<f32> {\n  return %x\n}\n", Syn, "unexpected", 1, ")"),
    Case("malformed-type-dtype", "func @f(%x: tensor<3xf16>) {\n  return\n}\n", Syn, "malformed tensor type", 1,
         "tensor"),
    Case("malformed-type-in-op", body("%a = cast %x : tensor<3xbf16>"), Syn, "malformed tensor type", 2, "tensor"),
    Case("malformed-type-unclosed", body("%a = tanh %x : tensor<3xf32"), Syn, "malformed tensor type", 2, "tensor"),
    Case("malformed-type-result", "func @f() -> tensor<3,f32> {\n  return\n}\n", Syn, "malformed tensor type", 1,
         "tensor"),
    # ---- names
    Case("unknown-op", body("%a = frob %x : tensor<3xf32>"), Typ, "unknown op 'frob'", 2, "frob"),
    Case("unknown-function", body("%a = frobnicate(%x)"), Typ, "frobnicate", 2, "frobnicate"),
    Case("undefined-value", body("%a = tanh(%nope)"), Typ, "%nope", 2, "%nope"),
    Case("used-outside-its-for", body("for %e in %m {", "  %a = tanh(%e)", "}", "%b = %a + 1.0"),
         Typ, "%a", 5, "%a"),
    Case("used-outside-its-scan", body("%r = scan (%e in %m) {", "  %a = tanh(%e)", "  yield () stack (%a)",
                                       "} : tensor<3x4xf32>", ret="return %a"), Typ, "%a", 6, "%a"),
    Case("used-before-assigned", body("%b = %h + %y", "%h = %y", "%h = %y + %y", results="", ret="return"),
         Typ, "%h", 2, "%h"),
    Case("duplicate-function", G + G, Typ, "@g is defined twice", 5, "@g"),
    Case("duplicate-parameter", "func @f(%a: tensor<f32>, %a: tensor<f32>) {\n  return\n}\n", Typ,
         "%a is declared twice", 1, "%a", 1),
    # ---- arity and attributes
    Case("wrong-operand-count", body("%a = tanh %x, %x : tensor<3xf32>"), Typ, "takes 1 operand", 2, "tanh"),
    Case("wrong-operand-count-surface", body("%a = add(%x)"), Typ, "takes 2 operand", 2, "add"),
    Case("literal-to-non-literal-op", body("%a = tanh 1.0 : tensor<f32>"), Typ, "no literal", 2, "tanh"),
    Case("unknown-attribute", body("%a = sum %x {axis = 0} : tensor<f32>"), Typ, "no attribute 'axis'", 2, "sum"),
    Case("unknown-attribute-surface", body("%a = tanh(%x, scale=2.0)"), Typ, "no attribute 'scale'", 2, "tanh"),
    Case("missing-required-attribute", body("%a = reshape %x : tensor<3x1xf32>"), Typ, "'shape'", 2, "reshape"),
    Case("constant-without-value", body("%a = constant : tensor<f32>"), Typ, "'value'", 2, "constant"),
    Case("results-not-assigned", body("tanh %x : tensor<3xf32>"), Typ, "not assigned", 2, "tanh"),
    Case("too-many-names", body("%a, %b = tanh(%x)"), Typ, "2 name(s)", 2, "%a"),
    # ---- types and shapes
    Case("dtype-mismatch", body("%a = %x + %d"), Typ, "tensor<3xf64>", 2, "+"),
    Case("shape-mismatch-add", body("%a = add %x, %y : tensor<3xf32>"), Typ, "do not broadcast", 2, "add"),
    Case("shape-mismatch-matmul", body("%a = %m @ %m"), Typ, "contraction", 2, "@"),
    Case("matmul-of-a-vector", body("%a = matmul %x, %m : tensor<4xf32>"), Typ, "rank >= 2", 2, "matmul"),
    Case("shape-mismatch-concat", body("%a = concat %m, %x {axis = 0} : tensor<4x4xf32>"), Typ, "rank", 2, "concat"),
    Case("concat-off-axis", body("%a = concat(%m, %m, %m, axis=1)", "%b = concat(%m, transpose(%m))"), Typ,
         "off the concat axis", 3, "concat"),
    Case("concat-axis-out-of-range", body("%a = concat(%m, %m, axis=2)"), Typ, "out of range", 2, "concat"),
    Case("bad-reshape", body("%a = reshape %m {shape = [5, 2]} : tensor<5x2xf32>"), Typ, "cannot reshape", 2,
         "reshape"),
    Case("reshape-two-unknowns", body("%a = reshape(%m, shape=[-1, -1])"), Typ, "bad shape", 2, "reshape"),
    Case("bad-slice-limit", body("%a = slice %m {starts = [0, 0], limits = [3, 5]}"), Typ, "out of range", 2,
         "slice"),
    Case("bad-slice-rank", body("%a = slice(%m, starts=[0], limits=[2])"), Typ, "one entry per axis", 2, "slice"),
    Case("bad-transpose-perm", body("%a = transpose %m {perm = [0, 0]}"), Typ, "not a permutation", 2,
         "transpose"),
    Case("bad-broadcast", body("%a = broadcast %m {shape = [4, 3]}"), Typ, "do not broadcast", 2, "broadcast"),
    Case("index-with-a-float", body("%a = index %m, %s : tensor<4xf32>"), Typ, "integer scalar", 2, "index"),
    Case("written-type-differs", body("%a = tanh %x : tensor<3xf64>"), Typ, "written type", 2, "tanh"),
    Case("constant-shape-mismatch", body("%a = constant [1.0, 2.0] : tensor<3xf32>"), Typ, "shape", 2, "constant"),
    Case("constant-ragged", body("%a = constant [[1.0, 2.0], [3.0]] : tensor<2x2xf32>"), Typ, "ragged", 2,
         "constant"),
    Case("zeros-unknown-shape", body("%a = zeros : tensor<?xf32>"), Typ, "static", 2, "zeros"),
    Case("fill-wrong-dtype", body("%a = fill %s : tensor<3xf64>"), Typ, "fills", 2, "fill"),
    Case("cast-changes-shape", body("%a = cast %x : tensor<4xi32>"), Typ, "shape", 2, "cast"),
    Case("bad-dtype-in-cast", body('%a = cast(%x, dtype="f16")'), Typ, "unknown dtype 'f16'", 2, "cast"),
    Case("cast-without-dtype", body("%a = cast(%x)"), Typ, "dtype", 2, "cast"),
    Case("float-literal-for-an-int", body("%i = cast(%x, dtype=\"i32\")", "%j = %i + 1.5"), Typ,
         "float literal 1.5", 3, "1.5"),
    Case("select-condition-not-i1", body("%a = select(%x, %x, %x)"), Typ, "condition must be i1", 2, "select"),
    Case("float-only-op-on-ints", body("%i = cast(%x, dtype=\"i64\")", "%e = exp(%i)"), Typ, "float", 3, "exp"),
    Case("reassigned-with-another-type", body("%a = %x", "%a = %y"), Typ, "keeps its type", 3, "%a"),
    Case("param-reassigned-with-another-type", body("%x = %y"), Typ, "keeps its type", 2, "%x"),
    Case("bad-return-type", body(ret="return %y"), Typ, "returns tensor<3xf32> but this returns tensor<4xf32>", 2,
         "return"),
    Case("bad-return-count", body(ret="return %x, %x"), Typ, "returns", 2, "return"),
    # ---- loops
    Case("collect-outside-a-loop", body("collect %x into %xs"), Typ, "outside", 2, "collect"),
    Case("collect-twice", body("for %e in %m {", "  collect %e into %es", "  collect %e into %es", "}"), Typ,
         "collected twice", 4, "collect"),
    Case("collect-in-a-scan-body", body("%r = scan (%e in %m) {", "  collect %e into %es", "  yield ()",
                                        "}"), Typ, "outside", 3, "collect"),
    Case("for-over-a-scalar", body("for %e in %s {", "  %a = %e", "}"), Typ, "cannot loop over %s", 2, "%s"),
    Case("scan-over-a-scalar", body("%r = scan (%e in %s) {", "  yield () stack (%e)", "} : tensor<f32>"), Typ,
         "cannot loop over %s", 2, "%s"),
    Case("scan-carry-type-differs", body("%r = scan (%e in %m) carry (%c = %x) {", "  yield (%e)",
                                         "} : tensor<3xf32>"), Typ, "yielded carries", 2, "scan"),
    Case("scan-lengths-disagree", body("%r = scan length 5 (%e in %m) {", "  yield () stack (%e)",
                                       "} : tensor<5x4xf32>"), Typ, "disagree", 2, "scan"),
    Case("scan-without-length", body("%r = scan () carry (%c = %x) {", "  yield (%c)", "} : tensor<3xf32>"),
         Typ, "length", 2, "scan"),
    Case("scan-result-type-differs", body("%r = scan (%e in %m) {", "  yield () stack (%e)",
                                          "} : tensor<4x4xf32>"), Typ, "written type", 2, "scan"),
    Case("for-op-with-carries", body("%r = for (%e in %m) carry (%c = %x) {", "  yield (%c)",
                                     "} : tensor<3xf32>"), Typ, "no carries", 2, "for"),
    Case("collect-of-an-inner-scan-value", body("for %e in %m {", "  scan (%z in %e) {",
                                                "    collect %z into %zs", "    yield ()", "  }", "}"),
         Ver, "does not dominate", 2, "for"),
    # ---- calls and grad
    Case("call-of-undefined-function", body("%a = call @nope(%x) : tensor<f32>"), Typ, "undefined function @nope",
         2, "@nope"),
    Case("surface-call-of-undefined-function", body("%a = @nope(%x)"), Typ, "@nope", 2, "@nope"),
    Case("call-with-wrong-types", G + body("%t, %b = call @g(%y) : tensor<f32>, tensor<3xf32>"), Typ,
         "@g takes (tensor<3xf32>)", 6, "@g"),
    Case("call-with-wrong-result-types", G + body("%t, %b = call @g(%x) : tensor<f32>, tensor<3xf64>"), Typ,
         "written type", 6, "@g"),
    Case("call-of-two-results-in-an-expression", G + body("%a = @g(%x) + 1.0"), Typ, "returns 2 values", 6, "@g"),
    Case("grad-of-a-non-scalar-function",
         "func @v(%a: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {\n  %t = sum(%a)\n  return %a, %t\n}\n"
         + body("%t, %b, %db = grad @v(%x) wrt (%x)"), Typ, "a float scalar first", 6, "@v"),
    Case("grad-wrt-a-name-not-passed", "func @h(%a: tensor<3xf32>) -> tensor<f32> {\n  %t = sum(%a)\n  return %t\n}\n"
         + body("%t, %dt = grad @h(%x) wrt (%y)"), Typ, "%y is not one of the arguments", 6, "%y"),
    Case("grad-wrt-bad-position", "func @h(%a: tensor<3xf32>) -> tensor<f32> {\n  %t = sum(%a)\n  return %t\n}\n"
         + body("%t, %dt = grad @h(%x) wrt (3)"), Typ, "out of range", 6, "3)"),
    Case("grad-of-undefined-function", body("%t, %dt = grad @nope(%x) wrt (%x)"), Typ, "@nope", 2, "@nope"),
]


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def params():
    return [pytest.param(c, id=c.id) for c in CASES]


@pytest.mark.parametrize("case", params())
def test_diagnostic(case: Case):
    with pytest.raises(gir.GirError) as info:
        gir.parse(case.text, filename=FILE)
    err = info.value
    text = str(err)
    lines = text.splitlines()
    assert isinstance(err, case.error), f"{type(err).__name__}: {text}"
    assert case.message in err.message, text
    assert lines[0].startswith(f"{FILE}:{case.line}:{case.col}: error: "), text
    assert lines[1] == case.text.splitlines()[case.line - 1], text
    assert lines[2] == " " * (case.col - 1) + "^", text
    assert (err.loc.file, err.loc.line, err.loc.col) == (FILE, case.line, case.col)


def test_syntax_errors_say_what_was_expected():
    with pytest.raises(gir.GirSyntaxError) as info:
        gir.parse(body("%a = tanh(%x"), filename=FILE)
    assert "expected" in info.value.message and "')'" in info.value.message


def test_unknown_character_lists_what_was_expected():
    with pytest.raises(gir.GirSyntaxError) as info:
        gir.parse(body("%a = tanh(%x) $"), filename=FILE)
    message = info.value.message
    assert "'$'" in message
    assert not message.rstrip().endswith("expected"), message


def test_end_of_input_error_quotes_a_line():
    text = f"{SIG} -> tensor<3xf32> {{\n  %a = tanh(%x)\n"
    with pytest.raises(gir.GirSyntaxError) as info:
        gir.parse(text, filename=FILE)
    lines = str(info.value).splitlines()
    assert len(lines) >= 3 and lines[2].endswith("^"), str(info.value)


def test_error_in_a_later_function_counts_lines_from_the_file_start():
    text = G + "\n\n// a comment line\n" + body("", "%a = tanh %y : tensor<3xf32>")
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(text, filename=FILE)
    assert str(info.value).startswith(f"{FILE}:10:8: error:")


def test_tabs_count_as_one_column():
    text = body("\t%a = frob %x")
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(text, filename=FILE)
    assert str(info.value).startswith(f"{FILE}:2:9: error:")
    assert str(info.value).splitlines()[1] == "  \t%a = frob %x"


def test_written_loc_is_where_the_error_points():
    text = body('%a = tanh %x : tensor<3xf64> loc("model.py":40:7)')
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(text, filename=FILE)
    assert str(info.value).startswith("model.py:40:7: error:")


@pytest.mark.parametrize("separator", ["\u2028", "\x0c", "\x85"], ids=["line-separator", "form-feed", "nel"])
def test_quoted_line_is_right_after_unusual_line_breaks(separator):
    text = f"// a comment with a {separator} in it\n" + body("%a = frob %x")
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(text, filename=FILE)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{FILE}:3:8: error:")
    assert "%a = frob %x" in str(info.value)


def test_error_without_source_has_no_quoted_line():
    err = gir.GirError("something failed")
    assert str(err) == "error: something failed"


def test_load_of_a_missing_file_is_a_gir_error(tmp_path):
    with pytest.raises(gir.GirError, match="cannot read"):
        gir.load(str(tmp_path / "missing.gir"))


def test_load_of_a_binary_file_is_a_gir_error(tmp_path):
    path = tmp_path / "binary.gir"
    path.write_bytes(b"\xff\xfe\x00func")
    with pytest.raises(gir.GirError):
        gir.load(str(path))


# ---- programs that pass the grammar but break an op's rule in ways the rule does not expect: still GirErrors


BAD_ATTRIBUTE_VALUES = [
    ("concat-axis-string", '%a = concat %x, %x {axis = "one"}'),
    ("concat-axis-float", "%a = concat %x, %x {axis = 0.5}"),
    ("stack-axis-string", '%a = stack %x, %x {axis = "one"}'),
    ("constant-int-overflow", "%a = constant [99999999999999999999] : tensor<1xi32>"),
    ("constant-inf-int", "%a = constant [inf] : tensor<1xi64>"),
    ("var-assigned-twice", "%h = var : tensor<f32>\n  %h = var : tensor<f32>"),
    ("constant-string", '%a = constant {value = "abc"} : tensor<f32>'),
    ("zeros-negative-dim", "%a = zeros(shape=[2, -1])"),
    ("zeros-float-dim", "%a = zeros(shape=[2.0])"),
    ("zeros-nested-shape", "%a = zeros(shape=[[2]])\n  %b = %a + %a"),
    ("broadcast-negative-dim", "%a = broadcast %s {shape = [-1]}"),
    ("sum-axes-string", '%a = sum %x {axes = "0"}'),
    ("reshape-shape-floats", "%a = reshape %x {shape = [3.0]}"),
    ("slice-steps-zero", "%a = slice %x {starts = [0], limits = [3], steps = [0]}"),
]


def bad_attr_params():
    return [pytest.param(line, id=name) for name, line in BAD_ATTRIBUTE_VALUES]


@pytest.mark.parametrize("line", bad_attr_params())
def test_ill_typed_attribute_values_are_gir_errors(line):
    """Either refused with a GirError, or accepted as a module that round-trips."""
    text = "func @f(%x: tensor<3xf32>, %s: tensor<1xf32>) {\n  " + line + "\n  return\n}\n"
    try:
        module = gir.parse(text, filename=FILE)
    except gir.GirError as e:
        assert str(e).startswith(f"{FILE}:2:"), str(e)
        return
    printed = str(module)
    assert str(gir.parse(printed)) == printed


@pytest.mark.parametrize("example", ["rnn", "gru", "lstm", "mlp"])
def test_every_op_a_pass_creates_carries_a_user_location(example: str) -> None:
    """Ops made by autodiff, scan-grad, canonicalize and fuse carry the location of the user op
    they come from, so an error about one points at the source (before, the rnn, gru and lstm
    training steps had 6, 20 and 17 ops with no location: sums of cotangents in backward bodies,
    and the fused ops and yields built around them)."""
    from gir.errors import UNKNOWN
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE

    module = gir.load(str(Path(gir.__file__).parent / "examples" / f"{example}.gir"))
    PassManager(f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}").run(module)
    unknown = [op.name for op in module.walk() if op.loc == UNKNOWN]
    assert not unknown, unknown


# ---- errors on ops a pass created: located at the user op they come from, with a note on the pass

GRAD_OF_PRODUCT = """func @loss(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) -> tensor<f32> {
  %y = %a * %b
  return sum(%y)
}

func @g(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) -> (tensor<f32>, tensor<4x3xf32>) {
  %l, %da = grad @loss(%a, %b) wrt (%a)
  return %l, %da
}
"""


@pytest.fixture
def broken_mul_gradient(monkeypatch):
    """A gradient rule for `mul` with a bug: it reshapes the cotangent to a wrong shape. Correct
    rules never make an ill-typed op, so this stands for a pass bug (or an unsupported case)."""
    import dataclasses

    from gir.ir.ops import REGISTRY

    def bad_rule(c, g):
        return [c.reshape(g, (5, 2)), None]

    monkeypatch.setitem(REGISTRY, "mul", dataclasses.replace(REGISTRY["mul"], vjp=bad_rule))


def test_error_on_an_op_autodiff_made_points_at_the_user_op_and_names_the_pass(broken_mul_gradient):
    from gir.passes.pass_manager import PassManager

    module = gir.parse(GRAD_OF_PRODUCT, filename=FILE)
    with pytest.raises(gir.GirTypeError) as info:
        PassManager("ssa,autodiff").run(module)
    assert str(info.value).splitlines() == [
        f"{FILE}:2:11: error: 'reshape': cannot reshape tensor<4x3xf32> (12 elements) to [5, 2] (10 elements)",
        "  %y = %a * %b",
        "          ^",
        "note: autodiff created this op in the gradient of `%y = %a * %b` (line 2); it is not in the source",
    ]


def test_cli_prints_the_note_on_a_pass_made_op_without_a_traceback(broken_mul_gradient, tmp_path, capsys):
    from gir.cli import main

    path = tmp_path / "grad.gir"
    path.write_text(GRAD_OF_PRODUCT)
    assert main(["opt", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"{path}:2:11: error: 'reshape': cannot reshape"), err
    assert err.rstrip().endswith("note: autodiff created this op in the gradient of `%y = %a * %b` (line 2); it "
                                 "is not in the source"), err


RNN = """func @loss(%xs: tensor<5x2x3xf64>, %h0: tensor<2x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
  %h = %h0
  %l = constant 0.0 : tensor<f64>
  for %x in %xs {
    %h = tanh(%x + %h @ %w)
    %l = %l + sum(%h * %h)
  }
  return %l
}

func @grads(%xs: tensor<5x2x3xf64>, %h0: tensor<2x3xf64>, %w: tensor<3x3xf64>) -> (tensor<f64>, tensor<3x3xf64>) {
  %l, %dw = grad @loss(%xs, %h0, %w) wrt (%w)
  return %l, %dw
}
"""


def test_ops_scan_grad_moves_out_of_the_loop_come_from_the_accumulation_they_replace():
    """scan-grad's GEMM after the loop (sum over t of h_{t-1}^T @ dz_t) is made from the
    accumulation autodiff put in the backward loop, which comes from the user's loop (line 4):
    an error on it says both, not the op that happens to follow the loop."""
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    module = gir.parse(RNN, filename=FILE)
    PassManager(DEFAULT_PIPELINE).run(module)
    grads = module.functions["grads"]
    outside = [op for op in grads.body if op.name == "matmul"]
    assert outside, "scan-grad pushed no accumulation out of the loop"
    for op in outside:
        assert (op.loc.line, op.loc.col) == (4, 3), op.loc
        assert op.loc.origin is not None and op.loc.origin.pass_name == "scan-grad"
    text = str(gir.GirError("the CPU backend cannot compile 'matmul'", outside[0].loc)).splitlines()
    assert text == [
        f"{FILE}:4:3: error: the CPU backend cannot compile 'matmul'",
        "  for %x in %xs {",
        "  ^",
        "note: scan-grad created this op from an op that autodiff created in the gradient of `for %x in %xs {` "
        "(line 4); it is not in the source",
    ]


def test_user_ops_and_rebuilt_loops_have_no_pass_note():
    """The user's own ops keep their location without a note, and so does a loop a pass only
    rebuilt (ssa's for -> scan, a scan with one more stack): an error there is about the user's op."""
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    module = gir.parse(RNN, filename=FILE)
    PassManager(DEFAULT_PIPELINE).run(module)
    loss = module.functions["loss"]
    assert all(op.loc.origin is None for op in loss.walk() if op.name in ("scan", "tanh", "matmul"))
    assert "note:" not in str(gir.GirError("x", next(op for op in loss.walk() if op.name == "scan").loc))


def test_locations_with_and_without_an_origin_are_equal():
    from gir.errors import Location, Origin

    assert Location("f.gir", 1, 2, Origin("autodiff")) == Location("f.gir", 1, 2)
    assert hash(Location("f.gir", 1, 2, Origin("autodiff"))) == hash(Location("f.gir", 1, 2))


# ---- hints: NumPy and Python spellings, and "did you mean", each with its exact position and text

STEP = "func @rnn_step(%h: tensor<3xf32>) -> tensor<3xf32> {\n  return tanh(%h)\n}\n"
"""A helper function of 3 lines, for misspelled callees."""

HIDDEN = ("func @f(%x: tensor<3xf32>, %m: tensor<3x4xf32>) -> tensor<3xf32> {\n  %hidden = tanh(%x)\n  {line}\n"
          "  return %x\n}\n")
"""A function whose scope has %x, %m and %hidden; `{line}` is line 3."""

HINTS = [
    # (id, text, error, exact message, line, at, nth)
    ("numpy-slice", body("%a = %m[:, 0:2]"), Syn,
     "gir has no subscripts; write slice(%m, starts=[0, 0], limits=[N0, 2]) for %m[:, 0:2] (N0: the size of that "
     "axis)", 2, "[", 0),
    ("numpy-slice-both-bounds", body("%a = %m[0:2, 1:3]"), Syn,
     "gir has no subscripts; write slice(%m, starts=[0, 1], limits=[2, 3]) for %m[0:2, 1:3]", 2, "[", 0),
    ("numpy-index", body("%a = %m[1]"), Syn,
     "gir has no subscripts; write index(%m, 1) for %m[1] (the leading axis)", 2, "[", 0),
    ("numpy-subscript-of-a-call", body("%a = tanh(%m)[1]"), Syn,
     "gir has no subscripts; write index(tanh(%m), 1) for tanh(%m)[1] (the leading axis)", 2, "[", 0),
    ("numpy-power", body("%a = %x ** 2.0"), Syn, "gir has no '**' operator; write pow(%x, 2.0) for %x ** 2.0", 2,
     "**", 0),
    ("numpy-greater", body("%a = %x > %x"), Syn,
     "gir has no infix comparisons; write gt(%x, %x) for %x > %x (an i1 tensor, for select)", 2, ">", 0),
    ("numpy-less-equal", body("%a = %x <= 0.5"), Syn,
     "gir has no infix comparisons; write le(%x, 0.5) for %x <= 0.5 (an i1 tensor, for select)", 2, "<=", 0),
    ("numpy-equal", body("%a = %x == %x"), Syn,
     "gir has no infix comparisons; write eq(%x, %x) for %x == %x (an i1 tensor, for select)", 2, "==", 0),
    ("numpy-not-equal", body("%a = %x != %x"), Syn,
     "gir has no infix comparisons; write ne(%x, %x) for %x != %x (an i1 tensor, for select)", 2, "!=", 0),
    ("numpy-transpose-attribute", body("%a = %x @ %m.T"), Syn,
     "gir has no '.T'; write transpose(%m) (it reverses the axes, as .T does)", 2, ".T", 0),
    ("numpy-shape-attribute", body("%a = %m.shape"), Syn,
     "gir values have no attributes ('.shape'); a value's shape is in its type", 2, ".shape", 0),
    ("numpy-prefix", body("%a = np.tanh(%x)"), Syn,
     "gir's functions have no module prefix; write tanh(...) instead of np.tanh(...)", 2, "np", 0),
    ("numpy-prefix-unknown-function", body('%a = numpy.einsum("ij->i", %m)'), Syn,
     "gir's functions have no module prefix, and gir has no function 'einsum'", 2, "numpy", 0),
    ("numpy-prefix-numpy-name", body("%a = numpy.dot(%m, %m)"), Syn,
     "gir's functions have no module prefix; write matmul(...) instead of numpy.dot(...)", 2, "numpy", 0),
    ("numpy-method", body("%a = %m.sum(axis=0)"), Syn,
     "gir values have no methods; write sum(%m, ...) instead of %m.sum(...)", 2, ".sum", 0),
    ("python-true", body("%a = sum(%m, axes=[1], keepdims=True)"), Syn, "booleans are written true, not True", 2,
     "True", 0),
    ("python-name-assigned", body("a = tanh(%x)"), Syn,
     "'a' is not a value name: value names start with '%' (write %a)", 2, "a", 0),
    ("python-name-used", body("%a = tanh(x)"), Syn,
     "'x' is not a value name: value names start with '%' (write %x)", 2, "x)", 0),
    ("python-comment", body("%a = tanh(%x)  # the hidden state"), Syn,
     "unexpected character '#': comments start with // in gir", 2, "#", 0),
    ("python-semicolon", body("%a = tanh(%x);"), Syn,
     "unexpected character ';': gir statements end at the next statement, without ';'", 2, ";", 0),
    ("did-you-mean-function", body("%a = sigmiod(%x)"), Typ, "unknown function 'sigmiod'; did you mean 'sigmoid'?",
     2, "sigmiod", 0),
    ("did-you-mean-close-function", body("%a = sqr(%x)"), Typ, "unknown function 'sqr'; did you mean 'sqrt'?",
     2, "sqr", 0),
    ("numpy-power-function", body("%a = power(%x, 2.0)"), Typ,
     "unknown function 'power'; NumPy's power is pow(...) in gir", 2, "power", 0),
    ("module-function-called-without-at", STEP + body("%a = rnn_step(%x)"), Typ,
     "unknown function 'rnn_step'; the function @rnn_step of this module is called as @rnn_step(...)", 5,
     "rnn_step", 0),
    ("did-you-mean-op", body("%a = tahn %x : tensor<3xf32>"), Typ, "unknown op 'tahn'; did you mean 'tanh'?", 2,
     "tahn", 0),
    ("did-you-mean-value", HIDDEN.replace("{line}", "%a = %hiden * %x"), Typ,
     "use of undefined value %hiden; did you mean '%hidden'?", 3, "%hiden", 0),
    ("did-you-mean-callee", STEP + body("%a = @rnn_stp(%x)"), Typ,
     "call of undefined function @rnn_stp; did you mean '@rnn_step'?", 5, "@rnn_stp", 0),
    ("did-you-mean-callee-generic-call", STEP + body("%a = call @rnn_stpe(%x) : tensor<3xf32>"), Typ,
     "call of undefined function @rnn_stpe; did you mean '@rnn_step'?", 5, "@rnn_stpe", 0),
    ("did-you-mean-grad-callee", "func @loss(%a: tensor<3xf32>) -> tensor<f32> {\n  return sum(%a)\n}\n"
     + body("%l, %d = grad @los(%x) wrt (%x)"), Typ, "grad of undefined function @los; did you mean '@loss'?", 5,
     "@los", 0),
    ("builtin-called-with-at", body("%a = @tanh(%x)"), Typ,
     "call of undefined function @tanh; 'tanh' is a builtin: write tanh(...) without '@'", 2, "@tanh", 0),
    ("did-you-mean-attribute", body("%a = sum(%m, axis=[0])"), Typ,
     "'sum' has no attribute 'axis' (known: axes, keepdims); did you mean 'axes'?", 2, "sum", 0),
    ("numpy-dtype-name", body('%a = cast(%x, dtype="float64")'), Typ,
     "unknown dtype 'float64'; gir spells it 'f64'; use one of f32, f64, i32, i64, i1", 2, "cast", 0),
    ("numpy-tuple-shape", body("%a = reshape(%m, (2, 6))"), Syn,
     "gir has no tuples; write shape=[2, 6] (a list, as a keyword argument)", 2, "(2", 0),
    ("numpy-tuple-zeros", body("%a = zeros((2, 3))"), Syn,
     "gir has no tuples; write shape=[2, 3] (a list, as a keyword argument)", 2, "(2", 0),
    ("numpy-tuple-attribute", body("%a = sum(%m, axes=(0, 1))"), Syn,
     "attribute values are lists, not tuples; write axes=[0, 1]", 2, "(0", 0),
    ("numpy-function-name", body("%a = where(%x, %x, %x)"), Typ,
     "unknown function 'where'; NumPy's where is select(...) in gir", 2, "where", 0),
    ("numpy-prefixed-function-name", body("%a = np.maximum(%x, 0.0)"), Syn,
     "gir's functions have no module prefix; write max(...) instead of np.maximum(...)", 2, "np", 0),
    ("numpy-method-name", body('%a = %x.astype("f64")'), Syn,
     "gir values have no methods; write cast(%x, ...) instead of %x.astype(...)", 2, ".astype", 0),
]


def test_numpy_names_name_functions_of_the_registry():
    from gir.frontend.hints import function_names
    from gir.ir.numpy_names import NUMPY_NAMES

    assert set(NUMPY_NAMES.values()) <= set(function_names())
    assert not set(NUMPY_NAMES) & set(function_names()), "a name gir already has needs no hint"


@pytest.mark.parametrize("case", [pytest.param(h, id=h[0]) for h in HINTS])
def test_hint(case):
    _, text, error, message, line, at, nth = case
    expect = Case("", text, error, message, line, at, nth)
    with pytest.raises(gir.GirError) as info:
        gir.parse(text, filename=FILE)
    err = info.value
    lines = str(err).splitlines()
    assert isinstance(err, error), f"{type(err).__name__}: {err}"
    assert err.message == message, str(err)
    assert lines[0] == f"{FILE}:{line}:{expect.col}: error: {message}", str(err)
    assert lines[1] == text.splitlines()[line - 1]
    assert lines[2] == " " * (expect.col - 1) + "^", str(err)


def test_unknown_function_lists_the_functions_of_the_registry():
    from gir.ir.ops import REGISTRY

    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(body("%a = sigmiod(%x)"), filename=FILE)
    note = info.value.note
    assert note is not None and note.startswith("gir's functions: abs, add, ")
    listed = note.removeprefix("gir's functions: ").split(", ")
    assert listed == sorted(listed)
    assert set(listed) >= {n for n, s in REGISTRY.items() if s.category != "structural"}
    assert "scan" not in listed and "grad" not in listed
    assert str(info.value).splitlines()[-1] == f"note: {note}"


def test_value_used_after_its_loop_says_where_it_was_defined():
    text = body("for %e in %m {", "  %a = tanh(%e)", "}", "%b = %a + 1.0")
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(text, filename=FILE)
    assert info.value.note == ("%a is defined in a loop body at line 3, and a name assigned once in a loop body is "
                               "local to it: collect it, or assign it before the loop as well")


def test_hints_leave_valid_lookalikes_alone():
    """Names with dots, lists in attributes, `->` and types are not NumPy habits."""
    text = ("func @f(%h: tensor<2x3xf32>) -> tensor<3x2xf32> {\n  %h.1 = tanh(%h)\n"
            "  %h.T = transpose %h.1 {perm = [1, 0]} : tensor<3x2xf32>\n  return %h.T\n}\n")
    assert "transpose" in str(gir.parse(text, filename=FILE))


LONG_TOKENS = [
    # (id, the text before the bad character, its length): each took seconds before the hints and the
    # tokenizer were linear (the 8,000-character name: 1.2 s; quadratic in its length), milliseconds after
    ("a-long-name-before-an-error", "%a" + "1" * 24_000 + " = ?", 24_000),
    ("a-long-word-before-an-error", "%x = " + "a" * 40_000 + " + ?", 40_000),
    ("a-long-name-and-number-mix", "%x = " + "a1" * 12_000 + " ?", 24_000),
    ("a-long-blank-run-before-an-unknown-character", "%a" + " " * 120_000 + "?", 120_000),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in LONG_TOKENS])
def test_a_syntax_error_after_a_long_token_is_reported_in_linear_time(case):
    """Every hint that looks at the text ending at the error matches from token boundaries only (a
    lookbehind), and the tokenizer stops at the first character no terminal matches: before, a regex
    search tried every position inside a long name, number or blank run (quadratic, 53 s for 32 KB)."""
    import time

    _, line, size = case
    text = "func @f() -> tensor<f32> {\n  " + line + "\n}\n"
    start = time.process_time()
    with pytest.raises(gir.GirSyntaxError) as info:
        gir.parse(text, filename=FILE)
    spent = time.process_time() - start
    assert str(info.value).startswith(f"{FILE}:2:"), str(info.value)[:200]
    assert spent < 1.0, f"{spent:.2f} s of CPU for a {size}-character token (linear: about 10 ms)"


def test_misspelled_pass_option_and_print_flag_say_did_you_mean():
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import parse_pipeline

    with pytest.raises(gir.GirPassError) as info:
        parse_pipeline("ssa,canonicalise")
    assert info.value.message == ("unknown pass 'canonicalise'; passes: ssa, canonicalize, autodiff, scan-grad, "
                                  "checkpoint, inline, fuse, place, liveness, print-liveness, memplan; did you mean "
                                  "'canonicalize'?")
    with pytest.raises(gir.GirPassError) as info:
        parse_pipeline("scan-grad{max-extra-byte=10}")
    assert info.value.message == ("pass 'scan-grad' has no option 'max-extra-byte' (options: max-extra-bytes, hoist, "
                                  "merge, merge-sums, push-out); did you mean 'max-extra-bytes'?")
    with pytest.raises(gir.GirPassError) as info:
        PassManager("ssa,autodiff", print_ir_after=frozenset({"autodif"}))
    assert info.value.message == ("--print-ir-after=autodif: no pass 'autodif' in the pipeline; its passes: ssa, "
                                  "autodiff; did you mean 'autodiff'?")


@pytest.mark.parametrize("argv,first_line", [
    (["-p", "ssa,canonicalise"], "error: unknown pass 'canonicalise'; passes: "),
    (["-p", "ssa", "--print-ir-after=sa"], "error: --print-ir-after=sa: no pass 'sa' in the pipeline; its passes: ssa; "
     "did you mean 'ssa'?"),
])
def test_cli_prints_did_you_mean_for_passes_without_a_traceback(tmp_path, capsys, argv, first_line):
    from gir.cli import main

    path = tmp_path / "f.gir"
    path.write_text(body())
    assert main(["opt", str(path), *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(first_line), err


def test_cli_prints_a_numpy_hint_with_its_caret_without_a_traceback(tmp_path, capsys):
    from gir.cli import main

    path = tmp_path / "f.gir"
    path.write_text(body("%a = %x ** 2.0"))
    assert main(["opt", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:2:11: error: gir has no '**' operator; write pow(%x, 2.0) for %x ** 2.0",
        "  %a = %x ** 2.0",
        "          ^",
    ]


@pytest.mark.parametrize("example", ["rnn", "lstm"])
def test_ops_only_a_pass_makes_name_that_pass(example: str) -> None:
    """Kinds of op no user wrote in these programs (fused groups, transfers, the backward scans'
    ops) all carry an origin naming a pass of the pipeline, with a location in the source file."""
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE

    path = str(Path(gir.__file__).parent / "examples" / f"{example}.gir")
    module = gir.load(path)
    pipeline = f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE},place{{policy=aggressive}}"
    PassManager(pipeline).run(module)
    made = [op for op in module.walk() if op.name in ("fused", "transfer")]
    assert {op.name for op in made} == {"fused", "transfer"}
    for op in made:
        assert op.loc.file == path and op.loc.origin is not None, (op.name, op.loc)
        assert op.loc.origin.pass_name == {"fused": "fuse", "transfer": "place"}[op.name]
    passes = {"ssa", "canonicalize", "scan-grad", "autodiff", "inline", "fuse", "memplan", "place"}
    for op in module.walk():
        origin = op.loc.origin
        while origin is not None:
            assert origin.pass_name in passes, origin
            origin = origin.via


def test_the_cpu_compile_cache_keeps_the_origin_of_run_time_error_locations():
    """A run-time error of a cached compile (a reduction of no element in a gradient op, say)
    still has its note: the layout's JSON keeps the origin chain."""
    from gir.backend.cpu.layout import Layout
    from gir.errors import Location, Origin

    loc = Location("rnn.gir", 4, 3, Origin("scan-grad", "from", Origin("autodiff", "in the gradient of")))
    layout = Layout(errors=[("'reduce_max' of no element has no value", loc), ("x", Location("f.gir", 1, 2))])
    back = Layout.from_json(layout.to_json())
    assert [(m, str(loc), loc.origin) for m, loc in back.errors] == [(m, str(loc), loc.origin)
                                                                      for m, loc in layout.errors]
    assert Layout.from_json({**layout.to_json(), "errors": [["x", ["f.gir", 1, 2]]]}).errors[0][1].origin is None


def test_misspelled_entry_function_says_did_you_mean(tmp_path, capsys):
    from gir.cli import main

    text = STEP + "func @rnn_loss(%h: tensor<3xf32>) -> tensor<f32> {\n  return sum(@rnn_step(%h))\n}\n"
    module = gir.parse(text, filename=FILE)
    hint = "did you mean '@rnn_step'?"
    with pytest.raises(gir.GirArgumentError, match=hint):
        gir.jit(module, entry="rnn_stp")
    with pytest.raises(gir.GirArgumentError, match=hint):
        gir.interpret(module, "rnn_stp", [1.0, 2.0, 3.0])
    path = tmp_path / "f.gir"
    path.write_text(text)
    assert main(["run", str(path), "-e", "rnn_stp", "--random", "0"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"{path}:1:1: error: no function @rnn_stp in {path}; it has @rnn_step, @rnn_loss; {hint}\n")
@pytest.mark.parametrize("source, message, column", [
    ("func @f(%x: f32) -> tensor<f32> {\n  return %x\n}", "every gir value is a tensor: a scalar f32 is written "
     "tensor<f32>", 11),
    ("func @f(%x: tensor<f32>) -> f32 {\n  return %x\n}", "a scalar f32 is written tensor<f32>", 29),
    ("func @f(%x: vector<3xf32>) -> tensor<3xf32> {\n  return %x\n}", "gir has tensor types only: write "
     "tensor<3xf32> instead of vector<3xf32>", 11),
    ("func @f(%x: f16) -> tensor<f32> {\n  return %x\n}", "gir has no type f16", 11),
    ("func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  return %x\n}", "write func instead of func.func", 1),
    ("func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = math.tanh %x : tensor<2xf32>\n  return %y\n}",
     "write tanh instead of math.tanh", 8),
    ("func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = arith.addf %x, %x : tensor<2xf32>\n  return %y\n}",
     "no op 'addf'; did you mean 'add'?", 8),
    ("module {\n}", "without a `module { ... }` around them", 1),
    ("func @f() -> tensor<2xf32> {\n  %c = constant dense<[1.0, 2.0]> : tensor<2xf32>\n  return %c\n}",
     "without dense<...>", 17),
], ids=["scalar-arg", "scalar-result", "vector", "f16", "func.func", "math.tanh", "arith.addf", "module", "dense"])
def test_mlir_spellings_get_hints(source: str, message: str, column: int) -> None:
    """MLIR habits (a user of mlir-opt's syntax writes them first) say what gir writes instead."""
    with pytest.raises(gir.GirSyntaxError) as info:
        gir.parse(source)
    assert message in info.value.message and info.value.loc.col == column, str(info.value)


VAR_ARGUMENT = """\
func @g(%a: tensor<3xf32>) -> tensor<3xf32> {
  return %a
}
func @f(%x: tensor<3xf32>) -> tensor<3xf32> {
  %v = var : tensor<3xf32>
  store %v, %x
  %y = USE
  return %y
}
"""


@pytest.mark.parametrize("use", ["call @g(%v)", "grad @g(%v) wrt (%v)"], ids=["call", "grad"])
def test_a_variable_passed_to_a_call_is_named_as_a_variable(use: str) -> None:
    """A pre-SSA variable prints as the type it holds: the error used to read `@g takes
    (tensor<3xf32>) but is called with (tensor<3xf32>)`."""
    with pytest.raises(gir.GirTypeError) as info:
        gir.parse(VAR_ARGUMENT.replace("USE", use))
    message = info.value.message
    assert "argument 1 of @g is a variable; read it with load" in message, message
    assert "`load %v : tensor<3xf32>`" in message, message
    assert "but is called with" not in message and info.value.loc.line == 7
