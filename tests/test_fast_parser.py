"""The hand-written parser (frontend/fast_parser.py) builds exactly the AST the Lark parser builds
-- every node, every token's type, text, offset, line and column -- or declines (`Fallback`),
and then only where Lark rejects the text too. Errors come from Lark either way, so they are
unchanged; a few are checked through `gir.parse` and the CLI with and without `GIR_PARSER=lark`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gir
import pytest
from gir.frontend import parser as parser_module
from gir.frontend.fast_parser import Fallback, FastParser
from gir.frontend.parser import _parser
from gir.frontend.tokens import Token
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(gir.__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
import mutate  # noqa: E402
import programs  # noqa: E402

_TOKEN_FIELDS = ("type", "start_pos", "line", "column", "end_line", "end_column", "end_pos")


def assert_same(a: Any, b: Any, path: str = "ast") -> None:
    """a and b are equal as trees: same classes, same tokens (with positions), NaN equal to NaN."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Token):
        assert str(a) == str(b), f"{path}: {a!r} != {b!r}"
        for f in _TOKEN_FIELDS:
            assert getattr(a, f) == getattr(b, f), f"{path} {a!r}.{f}: {getattr(a, f)} != {getattr(b, f)}"
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), f"{path}: nan != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def fast(text: str) -> Any:
    """The fast parser's functions, or Fallback."""
    try:
        return FastParser(text, _parser().parser.lexer).parse()
    except Exception:  # noqa: BLE001 - whatever makes parse_ast fall back
        return Fallback


def lark(text: str) -> Any:
    """Lark's functions, or Fallback when Lark rejects the text."""
    try:
        return _parser().parse(text)
    except Exception:  # noqa: BLE001 - a syntax error (or a transformer's _TokenError)
        return Fallback


def check(text: str, must_parse: bool = False) -> bool:
    """Both parsers agree on text; returns whether it parsed."""
    want, got = lark(text), fast(text)
    if want is Fallback:
        assert got is Fallback, "the fast parser accepts what Lark rejects"
        assert not must_parse, "Lark rejects a program that should parse"
        return False
    assert got is not Fallback, "the fast parser declines a program Lark parses"
    assert_same(got, want)
    return True


def _bench(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_gir_bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    spec.loader.exec_module(module)
    return module


# -- programs that parse ------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.gir")), ids=lambda p: p.name)
def test_examples(path: Path) -> None:
    check(path.read_text(encoding="utf-8"), must_parse=True)


def test_corpus_of_the_mutation_campaign() -> None:
    """Examples and docs blocks as written, printed (with and without locations) and printed
    after the ssa pass and the default and backend pipelines: fused ops, scans with carries."""
    parsed = sum(check(text) for text in mutate.corpus())
    assert parsed >= len(mutate.corpus()) - 2  # a docs block may need another block's function


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "filecheck").glob("*.gir")), ids=lambda p: p.name)
def test_filecheck_inputs(path: Path) -> None:
    """Each `// -----` case, the negative ones included (those Lark rejects must fall back)."""
    cases = path.read_text(encoding="utf-8").split("// -----")
    parsed = sum(check(case) for case in cases)
    assert parsed >= 1


def test_bench_programs() -> None:
    parse_scale, passes_scale, rnn = _bench("parse_scale"), _bench("passes_scale"), _bench("rnn")
    check(parse_scale.program(500), must_parse=True)
    check(passes_scale.program(5), must_parse=True)
    for model in ("rnn", "gru", "lstm"):
        check(rnn.gir_source(model, 4, 3, 5, 6), must_parse=True)


def test_generated_programs() -> None:
    """tests/fuzz/programs.py: random well-typed surface programs, loops and grads included."""
    for seed in range(150):
        check(programs.generate(random.Random(seed)).text, must_parse=True)


def test_mutated_programs_parse_alike_or_both_fail() -> None:
    """1,500 derandomised mutants of the campaign's corpus: the same AST, or both decline."""
    texts = mutate.corpus()
    parsed = 0
    for index in range(1500):
        rng = random.Random(index)
        mutant = mutate.mutate(rng, rng.choice(texts))
        if isinstance(mutant, bytes):
            try:
                mutant = mutant.decode("utf-8")
            except UnicodeDecodeError:
                continue
        parsed += check(mutant)
    assert 100 < parsed < 1500  # both kinds of input are exercised


EDGES = [
    "",
    "// only a comment",
    "func @f() {\n  return\n}",
    "func @f() -> () {\n  return\n} // a comment at the end, no newline",
    "func @f() {\n  return\n}\n//",
    "func @f(%x: tensor<f32>) -> tensor<f32> {\r\n\treturn %x\r\n}\r\n",
    "func @f(%x: tensor<f32>) -> tensor<f32> { return %x } loc(\"a \\\"b\\\".gir\":3:4)",
    "func @f(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>) {\n  %a, %b = foo %x :\n  tensor<f32>,\n"
    "   tensor<f32>\n  return %a, %b\n}",
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = -%x * -2 - -1.5e3 + (inf - nan) / 1.\n"
    "  %z = sum(%y, axes = [0, -1], keepdims = true, name = \"s\") @ stack(%y, %y)\n  return %z // é\n}",
    "func @f(%x: tensor<4xf32>) {\n  %c = constant [[1, -2.5], [inf, -nan], [true, false]] {device = \"cpu\"} : "
    "tensor<f32>\n  %d = stack %x, %x\n  %e = op {}\n  %g = op -1\n  store %x, %x loc(\"f\":1:2)\n  return\n}",
    "func @f(%xs: tensor<3x4xf32>) -> tensor<4xf32> {\n  %h = scan reverse length 3 reverse (%x in %xs) "
    "carry(%c = %x0, %d = %x1) {\n    %n = tanh(%c)\n    yield (%n, %d) stack (%n) loc(\"y\":1:1)\n  } : "
    "tensor<4xf32>\n  for length 2 () {\n    yield\n  }\n  fused () {\n    yield ()\n  } loc(\"q\":2:3)\n"
    "  %r = fused (%a = %h) {\n    yield (%a)\n  } : tensor<4xf32>\n  return %r\n}",
    "func @f(%xs: tensor<3x4xf32>, %ys: tensor<3x4xf32>) {\n  for %x in %xs, %y in %ys {\n    collect %x + %y "
    "into %zs\n  }\n  %g, %gx = grad @l(%xs, 2 * %ys) wrt (%xs, 1) : tensor<f32>, tensor<3x4xf32>\n"
    "  %k = call @l(%xs, %ys)\n  %m = call @l() : tensor<f32>\n  %n = @l(%xs, -%ys)\n  return\n}",
    # Declined by both: keywords where a name goes, junk, a literal too large, an open body.
    "func @f() {\n  %x = in %y\n  return\n}",
    "func @f() {\n  %x = add %a {length = 1}\n  return\n}",
    "func @f(%x: tensor<f32>, tensor<f32>) {\n  return\n}",
    "func @f(%x: tensor<f32>) {\n  %y = %x # 1\n  return\n}",
    "func @f() {\n  %x = 1" + "0" * 5000 + "\n  return\n}",
    "func @f() {\n  %x = 1e400\n  return\n}",
    "func @f() {\n  %x = add %a,\n  return\n}",
    "func @f() {\n  %y = grad @g(%x) wrt ()\n  return\n}",
    "func @f() {\n  return\n",
    "func @f() {\n  %x = tensor<3,f32>\n  return\n}",
]


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_edge_cases(text: str) -> None:
    check(text)


PIECES = ["func", "@f", "@g", "(", ")", "{", "}", "[", "]", ",", "=", "->", "+", "-", "*", "/", "@", "%x", "%y",
          "%1", "tensor<4xf32>", "tensor<?x2xi1>", ": tensor<f32>", ":tensor<f32>,\ntensor<i32>", "return",
          "yield", "stack", "scan", "for", "in", "carry", "reverse", "length", "fused", "call", "grad", "wrt",
          "collect", "into", "true", "false", "inf", "nan", "tanh", "sum", "axis", "0", "12", "1.5", "2e3", "1.",
          '"s"', 'loc("a.gir":1:2)', "// c\n", "//", "\n", " ", "\t", "\r\n", "#", "é", "loc", "tensor"]
PROGRAM = ("func @f(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {\n  %a = tanh(%x) + %y * 2.0\n"
           "  %b = add %a, %x : tensor<4xf32>\n  return %b\n}\n")


@settings(derandomize=True, deadline=None, max_examples=400, database=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40), st.integers(0, len(PROGRAM)), st.booleans())
def test_token_soup_spliced_into_a_program(pieces: list[str], at: int, spaced: bool) -> None:
    """Random runs of the grammar's words, glued or spaced, inserted into a valid program:
    the parsers agree on each (almost all are errors; the empty run and a few others parse)."""
    soup = (" " if spaced else "").join(pieces)
    check(PROGRAM[:at] + soup + PROGRAM[at:])


def test_nesting_too_deep_for_recursion_falls_back() -> None:
    """The fast parser recurses per level of nesting; past Python's stack Lark (which does not) parses."""
    text = "func @f(%x: tensor<f32>) -> tensor<f32> {\n  %y = " + "(" * 3000 + "%x" + ")" * 3000 + "\n  return %y\n}"
    assert fast(text) is Fallback
    assert lark(text) is not Fallback
    assert_same(parser_module.parse_ast(text), lark(text))


# -- errors are Lark's, as before ---------------------------------------------------------------

BAD = [
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = %x ** 2\n  return %y\n}\n",
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = np.tanh(%x)\n  return %y\n}\n",
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = tanh(%x\n  return %y\n}\n",
    "func @f(%x: tensor<3,f32>) {\n  return\n}\n",
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = %x[0:2]\n  return %y\n}\n",
    "func @f(%x: tensor<4xf32>, tensor<4xf32>) {\n  return\n}\n",
    "func @f() {\n  %x = 1" + "0" * 5000 + "\n  return\n}\n",
    "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = tanh(%z)\n  return %y\n}\n",
    "func @f(%x: tensor<4xf32>) {\n  yield\n}\n",
    "func @f(%x: tensor<4xf32>) {\n  %y = %x\n",
]


def _error(text: str) -> str:
    with pytest.raises(gir.GirError) as info:
        gir.parse(text, filename="bad.gir")
    return str(info.value)


@pytest.mark.parametrize("text", BAD, ids=range(len(BAD)))
def test_errors_are_unchanged(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _error(text)
    assert message.startswith("bad.gir:") and "^" in message
    monkeypatch.setenv("GIR_PARSER", "lark")
    assert _error(text) == message


def test_cli_error_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "bad.gir"
    path.write_text(BAD[0])
    runs = [subprocess.run([sys.executable, "-m", "gir.cli", "opt", str(path)], capture_output=True, text=True,
                           env=env) for env in (None, {**__import__("os").environ, "GIR_PARSER": "lark"})]
    assert runs[0].returncode == runs[1].returncode == 1
    assert runs[0].stderr == runs[1].stderr and "Traceback" not in runs[0].stderr
    assert re.search(r"bad\.gir:2:\d+", runs[0].stderr)


def test_gir_parser_lark_switches_the_fast_parser_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def spy(*args: Any) -> None:
        calls.append(args)
        raise Fallback

    monkeypatch.setattr(parser_module, "FastParser", spy)
    text = (ROOT / "examples" / "gru.gir").read_text(encoding="utf-8")
    monkeypatch.setenv("GIR_PARSER", "lark")
    assert_same(parser_module.parse_ast(text), lark(text))
    assert not calls
    monkeypatch.delenv("GIR_PARSER")
    assert_same(parser_module.parse_ast(text), lark(text))  # tried first, declined, Lark parses
    assert len(calls) == 1
