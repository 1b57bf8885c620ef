"""The IR core: Module.clone, specialize, the typed loop view, spec facts, no import cycle in ir/."""

from __future__ import annotations

import ast
import pathlib

import gir
import numpy as np
import pytest
from gir.ir.core import Module, OpResult
from gir.ir.loops import LoopView, as_loop
from gir.ir.printer import print_module
from gir.ir.spec import REGISTRY, view_source
from gir.ir.specialize import specialize
from gir.ir.types import TensorType
from gir.ir.verifier import verify
from gir.passes.pass_manager import PassManager

ROOT = pathlib.Path(gir.__file__).parent
EXAMPLES = sorted((ROOT / "examples").glob("*.gir"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_clone_prints_identically_and_shares_nothing(path: pathlib.Path) -> None:
    module = gir.load(str(path))
    PassManager("ssa").run(module)
    copy = module.clone()
    assert print_module(copy, print_locations=True) == print_module(module, print_locations=True)
    originals = {id(v) for op in module.walk() for v in op.results} | {id(op) for op in module.walk()}
    assert not originals & ({id(v) for op in copy.walk() for v in op.results} | {id(op) for op in copy.walk()})
    before = print_module(module)
    PassManager("canonicalize,autodiff,scan-grad,canonicalize,inline,fuse").run(copy)
    verify(copy)
    assert print_module(module) == before, "running passes on the clone changed the original"


def test_clone_copies_list_attributes() -> None:
    module = gir.parse("func @f(%x: tensor<2x3xf32>) -> tensor<3x2xf32> {\n"
                       "  %y = transpose %x {perm = [1, 0]} : tensor<3x2xf32>\n  return %y\n}\n")
    copy = module.clone()
    op = next(o for o in copy.walk() if o.name == "transpose")
    op.attrs["perm"].append(7)
    assert next(o for o in module.walk() if o.name == "transpose").attrs["perm"] == [1, 0]


SPEC_SRC = """
func @f(%a: tensor<?x2x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
  %h = zeros : tensor<2x3xf64>
  %c = %a
  for %x in %a {
    %h = tanh(%x @ %w + %h)
  }
  return sum(%h * %h)
}
func @g(%a: tensor<?x2x3xf64>, %w: tensor<3x3xf64>) -> (tensor<f64>, tensor<3x3xf64>) {
  %l, %dw = grad @f(%a, %w) wrt (%w)
  return %l, %dw
}
func @unused(%a: tensor<?xf64>) -> tensor<?xf64> {
  return %a
}
"""


def test_specialize_retypes_through_grad_and_variables() -> None:
    module = gir.parse(SPEC_SRC)
    types = [TensorType((5, 2, 3), "f64"), TensorType((3, 3), "f64")]
    spec = specialize(module, "g", types)
    verify(spec)
    assert list(spec.functions) == ["g", "f"], "only the entry and what it reaches"
    assert spec["f"].arg_types == types
    assert all(r.tensor_type.is_static for op in spec.walk() for r in op.results
               if isinstance(r.type, TensorType))
    assert "?" not in print_module(spec)
    assert "?" in print_module(module), "the input module is not changed"


def test_specialize_gives_one_copy_per_signature() -> None:
    module = gir.parse("""
func @id(%a: tensor<?xf64>) -> tensor<?xf64> {
  return %a
}
func @main(%a: tensor<?xf64>, %b: tensor<?xf64>) -> (tensor<?xf64>, tensor<?xf64>) {
  %x = call @id(%a) : tensor<?xf64>
  %y = call @id(%b) : tensor<?xf64>
  return %x, %y
}
""")
    spec = specialize(module, "main", [TensorType((3,), "f64"), TensorType((4,), "f64")])
    verify(spec)
    assert sorted(spec.functions) == ["id", "id.1", "main"]
    a, b = np.arange(3.0), np.arange(4.0)
    got = gir.interpret(spec, "main", a, b)
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], b)


def test_jit_specialises_grad_over_question_dims_per_shape() -> None:
    module = gir.parse(SPEC_SRC)
    fn = gir.jit(module, "g")
    ref = gir.jit(module, "g", device="interp")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 3))
    for steps in (4, 7, 4):
        a = rng.standard_normal((steps, 2, 3))
        for got, want in zip(fn(a, w), ref(a, w)):
            np.testing.assert_allclose(got, want, rtol=1e-10)


def test_loop_view_names_every_group() -> None:
    module = gir.load(str(ROOT / "examples" / "rnn.gir"))
    PassManager("ssa").run(module)
    scan = next(op for op in module["rnn_loss"].walk() if op.name == "scan")
    view = as_loop(scan)
    assert isinstance(view, LoopView) and view.is_scan and not view.reverse
    assert len(view.sequences) == len(view.element_args) == 1
    assert len(view.inits) == len(view.carry_args) == len(view.final_carries) == len(view.yielded_carries)
    assert len(view.yielded_stacks) == len(view.stacked_results)
    assert view.body.args == view.element_args + view.carry_args
    assert scan.results == view.final_carries + view.stacked_results
    for c in view.carries:
        assert c.arg.type == c.init.type == c.result.type
    assert view.trip_count == 50
    # The view takes the op apart by the layout the spec declares: the same as its generic groups.
    assert view.element_args == scan.arg_group("elements") and view.carry_args == scan.arg_group("carries")
    assert view.final_carries == scan.result_group("finals") and view.stacked_results == scan.result_group("stacks")
    assert view.sequences == scan.group("sequences") and view.inits == scan.group("inits")
    assert as_loop(next(op for op in module.walk() if op.name == "add")) is None
    pre_ssa = gir.load(str(ROOT / "examples" / "rnn.gir"))
    loop = next(op for op in pre_ssa.walk() if op.name == "for")
    view = LoopView(loop)
    assert not view.is_scan and view.inits == view.carry_args == view.final_carries == view.carries == []
    assert view.element_args == loop.arg_group("elements") and view.stacked_results == loop.result_group("stacks")


def test_spec_facts_replace_name_lists() -> None:
    assert {n for n, s in REGISTRY.items() if s.loop} == {"scan", "for"}
    assert {n for n, s in REGISTRY.items() if s.pre_ssa} == {"var", "load", "store", "for"}
    assert {n for n, s in REGISTRY.items() if s.interprocedural} == {"call", "grad"}
    assert {n for n, s in REGISTRY.items() if s.reduction} == {"sum", "mean", "reduce_max", "reduce_min"}
    assert REGISTRY["mean"].reduction.divide_by_count and REGISTRY["reduce_max"].reduction.identity == -np.inf
    module = gir.parse("""
func @f(%x: tensor<4x6xf32>, %w: tensor<4x4xf32>) -> (tensor<2x6xf32>, tensor<4x2xf32>, tensor<6x4xf32>) {
  %a = slice %x {starts = [1, 0], limits = [3, 6]} : tensor<2x6xf32>
  %b = slice %x {starts = [0, 1], limits = [4, 3]} : tensor<4x2xf32>
  %t = transpose %x : tensor<6x4xf32>
  %p = matmul %t, %w : tensor<6x4xf32>
  return %a, %b, %p
}
""")
    ops = {op.results[0].name_hint: op for op in module.walk() if op.results}
    assert view_source(ops["a"]) is ops["a"].operands[0], "rows 1..3, whole rows: contiguous"
    assert view_source(ops["b"]) is None, "a column band is not contiguous"
    assert view_source(ops["t"]) is ops["t"].operands[0], "a transpose read only by a GEMM"


def test_value_knows_its_defining_op() -> None:
    module = gir.parse("func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %y = neg %x : tensor<2xf32>\n"
                       "  return %y\n}\n")
    f = module["f"]
    (neg, ret) = f.body.ops
    assert f.args[0].defining_op is None and f.args[0].defining_block is f.body
    assert isinstance(neg.result, OpResult) and neg.result.defining_op is neg
    assert ret.operands[0].defining_op is neg


def test_ir_has_no_import_cycle() -> None:
    """Top-level imports between ir/ modules form a DAG (imports under TYPE_CHECKING excluded)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "ir").glob("*.py"):
        tree = ast.parse(path.read_text())
        deps = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                deps.add(node.module.split(".")[0])
        graph[path.stem] = deps
    state: dict[str, int] = {}

    def visit(name: str, stack: list[str]) -> None:
        if state.get(name) == 2:
            return
        assert state.get(name) != 1, "import cycle: " + " -> ".join(stack + [name])
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            visit(dep, stack + [name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])


def test_module_is_a_module() -> None:
    assert isinstance(gir.parse("func @f(%x: tensor<f32>) -> tensor<f32> {\n  return %x\n}\n"), Module)
