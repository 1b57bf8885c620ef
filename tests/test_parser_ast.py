"""The frontend's typed AST (frontend/ast.py) and a parser that is safe to call from threads."""

from __future__ import annotations

import threading

import gir
import pytest
from gir.errors import GirError, GirSyntaxError, GirTypeError, Location
from gir.frontend import ast
from gir.frontend.parser import parse_ast

T = "tensor<4xf32>"


def test_surface_program_becomes_typed_nodes() -> None:
    (func,) = parse_ast(f"""
func @f(%x: {T}, %n: tensor<i32>) -> tensor<f32> {{
  %y = tanh(%x) * 2.0 + -%x
  %s = sum(%y, axis=0)
  return %s
}}
""")
    assert isinstance(func, ast.Func)
    assert str(func.name) == "@f" and [str(p.name) for p in func.params] == ["%x", "%n"]
    assert [str(p.type) for p in func.params] == [T, "tensor<i32>"]
    assign, builtin_assign, ret = func.body
    match assign:
        case ast.Assign(targets=(y,), value=ast.Binary(op=plus, lhs=ast.Binary(lhs=ast.Builtin(), rhs=ast.Num(2.0)),
                                                       rhs=ast.Neg(operand=ast.Name()))):
            assert str(y) == "%y" and str(plus) == "+"
        case _:
            pytest.fail(f"unexpected shape {assign}")
    assert isinstance(builtin_assign.value, ast.Builtin) and builtin_assign.value.kwargs == {"axis": 0}
    assert isinstance(ret, ast.Return) and [str(v.token) for v in ret.values] == ["%s"]


def test_ssa_ops_become_typed_nodes() -> None:
    (_, g) = parse_ast(f"""
func @h(%a: {T}) -> tensor<f32> {{
  %s = sum %a {{axis = 0}} : tensor<f32>
  return %s
}}
func @g(%xs: tensor<3x4xf32>, %h0: {T}) -> {T} {{
  %c = constant 1.0 : {T}
  %hT = scan reverse length 3 (%x in %xs) carry(%h = %h0) {{
    %h1 = add %h, %x : {T}
    yield (%h1)
  }} : {T}
  %r = call @h(%hT) : tensor<f32>
  %l, %d = grad @h(%hT) wrt (0) : tensor<f32>, {T}
  return %hT
}}
""")
    constant, scan, call, grad, _ = g.body
    assert isinstance(constant.value, ast.Generic) and constant.value.literal == 1.0
    loop = scan.value
    assert isinstance(loop, ast.Loop) and str(loop.keyword) == "scan"
    assert loop.reverse and loop.length == 3
    assert [(str(b.element), str(b.sequence)) for b in loop.sequences] == [("%x", "%xs")]
    assert [(str(b.name), str(b.value)) for b in loop.carries] == [("%h", "%h0")]
    assert isinstance(loop.body[0].value, ast.Generic) and [str(v) for v in loop.yield_.carries] == ["%h1"]
    assert isinstance(call.value, ast.Call) and str(call.value.callee) == "@h"
    assert isinstance(grad.value, ast.Grad) and [str(w) for w in grad.value.wrt] == ["0"]


def test_nodes_are_frozen() -> None:
    (func,) = parse_ast(f"func @f(%x: {T}) -> {T} {{\n  return %x\n}}\n")
    with pytest.raises(AttributeError):
        func.name = "@g"  # type: ignore[misc]


def test_parse_ast_errors_name_the_file() -> None:
    with pytest.raises(GirSyntaxError) as info:
        parse_ast(f"func @f(%x: {T}, {T}) -> {T} {{\n  return %x\n}}\n", "p.gir")
    assert str(info.value.loc) == "p.gir:1:11" and info.value.message == "parameter %x has 2 types"
    with pytest.raises(GirSyntaxError) as info:
        parse_ast("func @f(\n", "q.gir")
    assert info.value.loc.file == "q.gir" and info.value.message.startswith("unexpected end of input")


# -- reentrancy: errors name the file being parsed, whatever other threads parse meanwhile -----

FILLER = "".join(f"  %v{i} = add %x, %x : {T}\n" for i in range(80))
"""Enough work that a thread switch lands inside a parse."""


def _program(blank_lines: int) -> str:
    """A file whose second function, after `blank_lines` blank lines, gives %y two types."""
    first = f"func @g(%x: {T}) -> {T} {{\n{FILLER}  return %x\n}}\n"
    return first + "\n" * blank_lines + f"func @f(%x: {T}, %y: {T}, {T}) -> {T} {{\n  return %x\n}}\n"


CASES = {
    "a.gir": (_program(0), GirSyntaxError, "parameter %y has 2 types", 84),
    "b.gir": (_program(4), GirSyntaxError, "parameter %y has 2 types", 88),
    "c.gir": (f"func @f(%x: {T}) -> {T} {{\n{FILLER}  %z = tanh(%nope)\n  return %x\n}}\n",
              GirTypeError, "use of undefined value %nope", 82),
    "d.gir": (f"func @f(%x: {T}) -> {T} {{\n{FILLER}  %z = = \n  return %x\n}}\n",
              GirSyntaxError, "unexpected '='", 82),
}


def _expect(filename: str) -> GirError:
    text, kind, _message, _line = CASES[filename]
    with pytest.raises(kind) as info:
        gir.parse(text, filename)
    return info.value


@pytest.mark.parametrize("filename", sorted(CASES))
def test_each_error_alone(filename: str) -> None:
    _, _, message, line = CASES[filename]
    error = _expect(filename)
    assert error.message.startswith(message)
    assert (error.loc.file, error.loc.line) == (filename, line)


def test_concurrent_parses_report_their_own_file() -> None:
    names = sorted(CASES)
    wrong: list[str] = []
    start = threading.Barrier(8)

    def worker(k: int) -> None:
        start.wait()
        for i in range(50):
            filename = names[(k + i) % len(names)]
            _, kind, message, line = CASES[filename]
            try:
                gir.parse(CASES[filename][0], filename)
            except kind as e:
                got: Location = e.loc
                if (got.file, got.line) != (filename, line) or not e.message.startswith(message):
                    wrong.append(f"{filename}: got {got}: {e.message}")
            else:
                wrong.append(f"{filename}: no error")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 400 parses misreported, e.g. {wrong[:3]}"


@pytest.mark.parametrize("name", ['q"uote.gir', "back\\slash.gir", "new\nline.gir", 'both\\"x.gir'],
                         ids=["quote", "backslash", "newline", "backslash-quote"])
def test_locations_round_trip_file_names_with_quotes_and_backslashes(name: str) -> None:
    """`loc("...")` escapes the file name (a quote used to end it early: the dump did not parse)."""
    from gir.ir.printer import print_module

    module = gir.parse("func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = neg %x : tensor<2xf32>\n"
                       "  return %y\n}\n", filename=name)
    text = print_module(module, print_locations=True)
    again = gir.parse(text, filename="dump.gir")
    assert print_module(again, print_locations=True) == text
    assert next(again.walk()).loc.file == name
