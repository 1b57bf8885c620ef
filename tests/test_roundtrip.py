"""Round trip: for every example and for every op kind in the registry, the printed IR parses
back to IR that prints identically (`str(parse(str(m))) == str(m)`), with and without
`loc(...)` on every op.

`OP_CASES` holds at least one small program per op kind (generic or surface form; structural
ops in their own syntax). `test_every_op_kind_has_a_case` fails when an op kind is added to
the registry without a case here.
"""

from __future__ import annotations

from pathlib import Path

import gir
import pytest
from gir.ir.ops import REGISTRY
from gir.ir.printer import print_module

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.gir"))


def func(params: str, results: str, body: str, name: str = "f") -> str:
    """`func @name(params) -> results { body }` with the body lines indented."""
    arrow = f" -> {results}" if results else ""
    lines = "\n".join("  " + line.strip() for line in body.strip().splitlines())
    return f"func @{name}({params}){arrow} {{\n{lines}\n}}\n"


def binary(op: str, lhs: str, rhs: str, result: str) -> str:
    """One binary op in generic form on broadcasting operands."""
    return func(f"%a: {lhs}, %b: {rhs}", result, f"%r = {op} %a, %b : {result}\nreturn %r")


def unary(op: str, t: str) -> str:
    return func(f"%x: {t}", t, f"%r = {op} %x : {t}\nreturn %r")


F32_2D = "tensor<4x3xf32>"

OP_CASES: dict[str, list[str]] = {}
for _op in ("add", "sub", "mul", "div", "max", "min"):
    OP_CASES[_op] = [
        binary(_op, "tensor<4x1xf32>", "tensor<3xf32>", F32_2D),
        binary(_op, "tensor<2xi64>", "tensor<i64>", "tensor<2xi64>"),
    ]
OP_CASES["pow"] = [binary("pow", "tensor<2x3xf64>", "tensor<f64>", "tensor<2x3xf64>")]
for _op in ("lt", "le", "gt", "ge", "eq", "ne"):
    OP_CASES[_op] = [binary(_op, "tensor<4x1xf32>", "tensor<3xf32>", "tensor<4x3xi1>"),
                     binary(_op, "tensor<2xi32>", "tensor<2xi32>", "tensor<2xi1>")]
for _op in ("and", "or"):
    OP_CASES[_op] = [binary(_op, "tensor<2x1xi1>", "tensor<3xi1>", "tensor<2x3xi1>")]
for _op in ("neg", "abs", "relu"):
    OP_CASES[_op] = [unary(_op, F32_2D), unary(_op, "tensor<5xi32>")]
for _op in ("exp", "log", "tanh", "sigmoid", "sqrt", "sin", "cos", "stop_gradient"):
    OP_CASES[_op] = [unary(_op, F32_2D), unary(_op, "tensor<f64>")]

# Surface forms of the elementwise ops: infix, calls, literals that take the other operand's dtype.
SURFACE = func(
    "%a: tensor<4x3xf64>, %b: tensor<3xf64>, %i: tensor<3xi32>",
    "(tensor<4x3xf64>, tensor<3xi32>)",
    """
    %c = tanh(%a @ transpose(%a) @ %a + %b) * sigmoid(-%a) / exp(%b) - 2.5
    %d = max(%c, 0.0) + min(%c, %b) + relu(%c) + abs(%c) + sqrt(abs(%c)) + log(1.0 + abs(%c))
    %e = pow(%d, 2.0)
    %j = -%i * 2 + 1
    return %e, %j
    """)
OP_CASES["add"].append(SURFACE)

OP_CASES["select"] = [
    func("%c: tensor<4x1xi1>, %a: tensor<3xf32>, %b: tensor<4x3xf32>", F32_2D,
         f"%r = select %c, %a, %b : {F32_2D}\nreturn %r"),
    func("%a: tensor<3xf32>, %b: tensor<3xf32>", "tensor<3xf32>",
         "%c = lt(%a, %b)\n%r = select(%c, %a, 0.0)\nreturn %r"),
]
OP_CASES["cast"] = [
    func("%x: tensor<4xf32>", "tensor<4xi32>", "%r = cast %x : tensor<4xi32>\nreturn %r"),
    func("%x: tensor<4xi1>", "tensor<4xf64>", '%r = cast(%x, dtype="f64")\nreturn %r'),
]
OP_CASES["constant"] = [
    func("", "(tensor<2x2xf32>, tensor<f32>, tensor<3xf64>, tensor<2x3xi32>, tensor<2xi1>, tensor<0xf32>)", """
        %a = constant [[1.0, -2.5], [3e-05, 1e+20]] : tensor<2x2xf32>
        %b = constant -0.125 : tensor<f32>
        %c = constant [inf, -inf, nan] : tensor<3xf64>
        %d = constant 7 : tensor<2x3xi32>
        %e = constant [true, false] : tensor<2xi1>
        %f = constant [] : tensor<0xf32>
        return %a, %b, %c, %d, %e, %f
        """),
    func("", "tensor<i64>", "%a = constant -3 : tensor<i64>\nreturn %a"),
]
OP_CASES["zeros"] = [
    func("", "tensor<2x3xf64>", "%z = zeros : tensor<2x3xf64>\nreturn %z"),
    func("", "tensor<2x3xi32>", '%z = zeros(shape=[2, 3], dtype="i32")\nreturn %z'),
]
OP_CASES["ones"] = [
    func("", "tensor<4xi1>", "%z = ones : tensor<4xi1>\nreturn %z"),
    func("", "tensor<2xf32>", "%z = ones(shape=[2])\nreturn %z"),
]
OP_CASES["fill"] = [
    func("%v: tensor<i64>", "tensor<2x2xi64>", "%r = fill %v : tensor<2x2xi64>\nreturn %r"),
    func("", "tensor<3xf32>", "%r = fill(1.5, shape=[3])\nreturn %r"),
]
OP_CASES["matmul"] = [
    binary("matmul", "tensor<4x5xf32>", "tensor<5x3xf32>", F32_2D),
    binary("matmul", "tensor<2x1x3x4xf64>", "tensor<5x4x6xf64>", "tensor<2x5x3x6xf64>"),
    func("%a: tensor<4x5xf32>, %b: tensor<5x3xf32>", F32_2D, "%r = %a @ %b\nreturn %r"),
]
OP_CASES["transpose"] = [
    func("%x: tensor<2x3x4xf32>", "tensor<3x2x4xf32>",
         "%r = transpose %x {perm = [1, 0, 2]} : tensor<3x2x4xf32>\nreturn %r"),
    func("%x: tensor<2x3x4xf32>", "tensor<4x3x2xf32>", "%r = transpose %x : tensor<4x3x2xf32>\nreturn %r"),
]
OP_CASES["reshape"] = [
    func("%x: tensor<2x3x4xf32>", "tensor<6x4xf32>",
         "%r = reshape %x {shape = [-1, 4]} : tensor<6x4xf32>\nreturn %r"),
    func("%x: tensor<?x4xf32>", "tensor<?x2xf32>", "%r = reshape(%x, shape=[-1, 2])\nreturn %r"),
]
OP_CASES["broadcast"] = [
    func("%x: tensor<3x1xf32>", "tensor<2x3x4xf32>",
         "%r = broadcast %x {shape = [2, 3, 4]} : tensor<2x3x4xf32>\nreturn %r"),
]
OP_CASES["concat"] = [
    func("%a: tensor<2x3xf32>, %b: tensor<2x1xf32>", "tensor<2x7xf32>",
         "%r = concat %a, %b, %a {axis = 1} : tensor<2x7xf32>\nreturn %r"),
    func("%a: tensor<2x3xi32>", "tensor<4x3xi32>", "%r = concat(%a, %a)\nreturn %r"),
]
OP_CASES["slice"] = [
    func("%x: tensor<5x7xf32>", "tensor<2x3xf32>",
         "%r = slice %x {limits = [4, 7], starts = [1, 0], steps = [2, 3]} : tensor<2x3xf32>\nreturn %r"),
    func("%x: tensor<5x7xf32>", "tensor<2x7xf32>", "%r = slice(%x, starts=[0, 0], limits=[2, 7])\nreturn %r"),
]
OP_CASES["index"] = [
    func("%x: tensor<5x7xf32>, %i: tensor<i64>", "tensor<7xf32>", "%r = index %x, %i : tensor<7xf32>\nreturn %r"),
    func("%x: tensor<5x7xf32>, %i: tensor<2x3xi32>", "tensor<2x3x7xf32>", "%r = index(%x, %i)\nreturn %r"),
]
OP_CASES["scatter_add"] = [
    func("%x: tensor<5x7xf32>, %i: tensor<3xi32>, %u: tensor<3x7xf32>", "tensor<5x7xf32>",
         "%r = scatter_add %x, %i, %u : tensor<5x7xf32>\nreturn %r"),
    func("%x: tensor<5xf64>, %i: tensor<i64>, %u: tensor<f64>", "tensor<5xf64>",
         "%r = scatter_add(%x, %i, %u)\nreturn %r"),
]
OP_CASES["logsumexp"] = [
    func("%x: tensor<2x3x4xf32>", "tensor<2x3x1xf32>",
         "%r = logsumexp %x {axes = [-1], keepdims = true} : tensor<2x3x1xf32>\nreturn %r"),
    func("%x: tensor<2x3xf64>", "tensor<f64>", "%r = logsumexp(%x)\nreturn %r"),
]
OP_CASES["stack"] = [
    func("%a: tensor<2x3xf32>", "tensor<2x2x3xf32>", "%r = stack %a, %a {axis = 1} : tensor<2x2x3xf32>\nreturn %r"),
    func("%a: tensor<3xf32>", "tensor<3x3xf32>", "%r = stack(%a, %a, %a)\nreturn %r"),
]
for _op, _surface in (("sum", "sum"), ("mean", "mean"), ("reduce_max", "max"), ("reduce_min", "min")):
    OP_CASES[_op] = [
        func("%x: tensor<2x3x4xf32>", "tensor<2x3x1xf32>",
             f"%r = {_op} %x {{axes = [-1], keepdims = true}} : tensor<2x3x1xf32>\nreturn %r"),
        func("%x: tensor<2x3x4xf64>", "tensor<f64>", f"%r = {_op} %x : tensor<f64>\nreturn %r"),
        func("%x: tensor<2x3x4xf32>", "tensor<3xf32>", f"%r = {_surface}(%x, axes=[0, 2])\nreturn %r"),
    ]
OP_CASES["fused"] = [
    func("%x: tensor<4xf32>, %y: tensor<4xf32>", "tensor<4xf32>",
         "%r, %s = fused (%a = %x, %b = %y) {\n  %c = constant 2.0 : tensor<f32>\n  %0 = add %a, %b : tensor<4xf32>\n"
         "  %1 = mul %0, %c : tensor<4xf32>\n  yield (%1, %0)\n} : tensor<4xf32>, tensor<4xf32>\nreturn %r"),
]
OP_CASES["transfer"] = [
    func("%x: tensor<4xf32>", "tensor<4xf32>", '%r = transfer %x {device = "gpu"} : tensor<4xf32>\nreturn %r'),
]

# Structural ops, in their own syntax.
OP_CASES["return"] = [
    func("", "", "return", name="nothing"),
    func("%a: tensor<f32>, %b: tensor<2xi32>", "(tensor<2xi32>, tensor<f32>, tensor<f32>)", "return %b, %a, %a"),
]
SCAN_FULL = func(
    "%xs: tensor<5x3xf32>, %zs: tensor<5xf64>, %h0: tensor<3xf32>, %k0: tensor<i32>",
    "(tensor<3xf32>, tensor<i32>, tensor<5x3xf32>, tensor<5xf64>)",
    """
    %one = constant 1 : tensor<i32>
    %h, %k, %ys, %ws = scan reverse (%x in %xs, %z in %zs) carry (%hc = %h0, %kc = %k0) {
      %s = add %x, %hc : tensor<3xf32>
      %t = tanh %s : tensor<3xf32>
      %k2 = add %kc, %one : tensor<i32>
      yield (%t, %k2) stack (%t, %z)
    } : tensor<3xf32>, tensor<i32>, tensor<5x3xf32>, tensor<5xf64>
    return %h, %k, %ys, %ws
    """)
SCAN_LENGTH = func("%k0: tensor<i32>", "(tensor<i32>, tensor<4xi32>)", """
    %one = constant 1 : tensor<i32>
    scan length 3 () {
      yield
    }
    %c, %cs = scan length 4 () carry (%a = %k0) {
      %b = add %a, %one : tensor<i32>
      yield (%b) stack (%a)
    } : tensor<i32>, tensor<4xi32>
    return %c, %cs
    """)
SCAN_NESTED = func("%xss: tensor<3x4x2xf32>", "tensor<3x4x2xf32>", """
    %yss = scan (%xs in %xss) {
      %ys = scan length 4 (%x in %xs) {
        %y = tanh(%x + %x)
        yield () stack (%y)
      } : tensor<4x2xf32>
      yield () stack (%ys)
    } : tensor<3x4x2xf32>
    return %yss
    """)
OP_CASES["scan"] = [SCAN_FULL, SCAN_LENGTH, SCAN_NESTED]
OP_CASES["yield"] = [SCAN_FULL, SCAN_LENGTH]
OP_CASES["for"] = [
    func("%xs: tensor<5x3xf32>", "tensor<5x3xf32>", """
        %ws = for (%x in %xs) {
          %y = neg %x : tensor<3xf32>
          yield () stack (%y)
        } : tensor<5x3xf32>
        return %ws
        """),
    func("%xs: tensor<5x3xf32>, %ys: tensor<5xf32>", "tensor<5x3xf32>", """
        for %x in %xs, %y in %ys {
          collect %x * %y into %zs
        }
        return %zs
        """),
]
OP_CASES["var"] = [
    func("%a: tensor<3xf32>", "tensor<3xf32>", """
        %h = var : tensor<3xf32>
        store %h, %a
        %v = load %h : tensor<3xf32>
        %w = tanh %v : tensor<3xf32>
        store %h, %w
        %r = load %h : tensor<3xf32>
        return %r
        """),
    # The surface form: a name assigned more than once becomes var/load/store.
    func("%xs: tensor<5x3xf32>, %h0: tensor<3xf32>", "(tensor<3xf32>, tensor<5x3xf32>)", """
        %h = %h0
        for %x in %xs {
          %h = tanh(%h + %x)
          collect %h into %hs
        }
        return %h, %hs
        """),
]
OP_CASES["load"] = OP_CASES["var"]
OP_CASES["store"] = OP_CASES["var"]
CALLEE = func("%a: tensor<3xf32>, %b: tensor<f32>", "(tensor<f32>, tensor<3xf32>)",
              "%s = sum(%a * %b)\nreturn %s, %a", name="g")
OP_CASES["call"] = [
    CALLEE + func("%x: tensor<3xf32>", "tensor<f32>", """
        %b = constant 2.0 : tensor<f32>
        %s, %y = call @g(%x, %b) : tensor<f32>, tensor<3xf32>
        %t, %z = @g(%y, %s)
        return %t
        """),
    func("%x: tensor<f32>", "tensor<f32>", "%y = @h(%x) + 1.0\nreturn %y") + func("%x: tensor<f32>", "tensor<f32>",
                                                                                 "return %x", name="h"),
]
OP_CASES["grad"] = [
    CALLEE.replace("(tensor<f32>, tensor<3xf32>)", "tensor<f32>").replace("return %s, %a", "return %s")
    + func("%x: tensor<3xf32>, %w: tensor<f32>", "(tensor<f32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>)",
           """
           %l, %dx = grad @g(%x, %w) wrt (%x) : tensor<f32>, tensor<3xf32>
           %m, %dw = grad @g(%x, %w) wrt (1)
           %n, %dw2 = grad @g(%x, %w * 2.0) wrt (1)
           return %l, %dx, %dw, %dw2, %n
           """),
    func("%a: tensor<f32>, %b: tensor<f32>", "tensor<f32>", "%p = %a * %b\nreturn %p", name="prod")
    + func("%a: tensor<f32>", "(tensor<f32>, tensor<f32>, tensor<f32>)",
           "%p, %da, %db = grad @prod(%a, %a) wrt (0, 1)\nreturn %p, %da, %db"),
]

# Explicit locations after ops, functions and the return; names that need renaming on print.
WITH_LOCATIONS = """
func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = tanh %x : tensor<4xf32> loc("model.py":10:5)
  %y.1 = exp(%y) loc("model.py":11:7)
  %ys = scan length 2 () carry (%c = %y.1) {
    %d = neg %c : tensor<4xf32> loc("model.py":13:9)
    yield (%d) loc("model.py":14:9)
  } : tensor<4xf32> loc("model.py":12:5)
  return %ys loc("model.py":15:5)
} loc("model.py":9:1)
"""


def all_cases() -> list[tuple[str, str]]:
    out = []
    for op, texts in sorted(OP_CASES.items()):
        out += [(f"{op}-{i}", text) for i, text in enumerate(texts)]
    return out


def assert_round_trips(text: str, filename: str = "case.gir") -> gir.Module:
    module = gir.parse(text, filename=filename)
    printed = str(module)
    assert str(gir.parse(printed, filename="printed.gir")) == printed
    with_locs = print_module(module, print_locations=True)
    reparsed = gir.parse(with_locs, filename="printed_locs.gir")
    assert print_module(reparsed, print_locations=True) == with_locs
    assert str(reparsed) == printed
    return module


def test_every_op_kind_has_a_case():
    missing = sorted(set(REGISTRY) - set(OP_CASES))
    assert not missing, f"op kinds without a round-trip case in tests/test_roundtrip.py: {missing}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_round_trips(path: Path):
    module = gir.load(str(path))
    assert module.functions
    text = path.read_text()
    assert str(gir.parse(text, filename=str(path))) == str(module)
    assert_round_trips(str(module))
    assert_round_trips(text, filename=str(path))


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"rnn.gir", "gru.gir", "lstm.gir", "mlp.gir"}


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c[0])
def test_op_round_trips(case: tuple[str, str]):
    name, text = case
    op_kind = name.rsplit("-", 1)[0]
    module = assert_round_trips(text)
    assert any(op.name == op_kind for op in module.walk()), f"the case for '{op_kind}' does not contain it"


def test_round_trip_is_a_fixed_point_from_the_first_print():
    """Printing does not depend on how the module was written: surface and generic forms of
    the same program print identically once parsed."""
    surface = func("%a: tensor<3xf32>, %b: tensor<3xf32>", "tensor<3xf32>", "%c = tanh(%a + %b)\nreturn %c")
    generic = func("%a: tensor<3xf32>, %b: tensor<3xf32>", "tensor<3xf32>",
                   "%0 = add %a, %b : tensor<3xf32>\n%c = tanh %0 : tensor<3xf32>\nreturn %c")
    assert str(gir.parse(surface)) == str(gir.parse(generic))


def test_written_locations_are_kept_and_printed():
    module = assert_round_trips(WITH_LOCATIONS)
    text = print_module(module, print_locations=True)
    for loc in ('loc("model.py":10:5)', 'loc("model.py":11:7)', 'loc("model.py":12:5)', 'loc("model.py":13:9)',
                'loc("model.py":14:9)', 'loc("model.py":15:5)', 'loc("model.py":9:1)'):
        assert loc in text
    assert "loc(" not in str(module)


def test_locations_without_written_loc_point_at_the_source():
    module = gir.parse(func("%x: tensor<4xf32>", "tensor<4xf32>", "%y = tanh(%x)\nreturn %y"), filename="src.gir")
    text = print_module(module, print_locations=True)
    assert 'tanh %x : tensor<4xf32> loc("src.gir":2:8)' in text
    assert 'return %y loc("src.gir":3:3)' in text


def test_printed_names_are_unique_per_function():
    text = func("%xs: tensor<2x3xf32>", "tensor<3xf32>", """
        %y.1 = constant 1.0 : tensor<3xf32>
        %a = scan (%x in %xs) carry (%y = %y.1) {
          %y.2 = add %x, %y : tensor<3xf32>
          yield (%y.2)
        } : tensor<3xf32>
        %b = scan (%x in %xs) carry (%y = %a) {
          %y.2 = add %x, %y : tensor<3xf32>
          yield (%y.2)
        } : tensor<3xf32>
        return %b
        """)
    printed = str(assert_round_trips(text))
    defined = [line.split("=")[0].strip() for line in printed.splitlines() if " = " in line and "scan" not in line]
    assert len(defined) == len(set(defined)), printed


def test_odd_names_round_trip():
    text = func("%1: tensor<3xf32>, %x.1: tensor<3xf32>", "tensor<3xf32>", """
        %0 = tanh(%1)
        %x = %0 + %x.1
        %2 = scan length 2 () carry (%x.2 = %x) {
          %3 = %x.2 * %0
          yield (%3)
        } : tensor<3xf32>
        %a$b = %2 - %1
        return %a$b
        """)
    printed = str(assert_round_trips(text))
    assert "%x.1" in printed and "%a$b" in printed


DEAD_OP = """\
func @f(%h: tensor<4xf64>) -> tensor<4xf64> {
  %dead = exp(%h)
  return %h * 2.0
}
"""


def test_a_fused_group_of_dead_ops_yields_its_last_value_and_round_trips():
    """`-p ssa,fuse` (no canonicalize) fused a dead op into a group yielding nothing, printed
    `fused (%h.1 = %h) { ... yield }`, which the parser refused, and whose loop nest the
    backends ran over the wrong shape (found by tests/fuzz/mutate.py). The group now yields its
    last value; a fused op yielding nothing is a located type error."""
    from gir.passes.pass_manager import PassManager

    module = gir.parse(DEAD_OP)
    PassManager("ssa,fuse").run(module)
    printed = str(module)
    fused = [op for op in module.walk() if op.name == "fused"]
    assert len(fused) == 2 and all(op.results for op in fused), printed
    assert str(gir.parse(printed)) == printed
    bare = "func @g(%x: tensor<2xf32>) {\n  fused (%a = %x) {\n    %b = neg %a : tensor<2xf32>\n    yield\n  }\n" \
           "  return\n}\n"
    with pytest.raises(gir.GirTypeError, match="yields nothing") as info:
        gir.parse(bare, filename="bare.gir")
    assert (info.value.loc.line, info.value.loc.col) == (2, 3)
