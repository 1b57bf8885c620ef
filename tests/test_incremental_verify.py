"""The verifier skips re-inferring the result types of an op whose type check already passed
and whose kind, operand and result types, segments and attributes are unchanged since
(`Operation.checked`, ops.type_stamp). These tests edit already verified IR the ways a broken
pass could and check that every edit is still reported, at the op's location, as a full check
of a fresh parse reports it."""

from __future__ import annotations

from collections.abc import Callable

import gir
import pytest
from gir.errors import GirPassError, GirVerifyError
from gir.ir.core import Module, Operation
from gir.ir.ops import make_op
from gir.ir.types import TensorType
from gir.ir.verifier import verify
from gir.passes.base import Pass
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import parse_pipeline
from gir.passes.rewriter import PassStatistics

SRC = """\
func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4xf32> {
  %c = add %a, %b : tensor<4x8xf32>
  %d = mul %c, %a : tensor<4x8xf32>
  %e = sum %d {axes = [1]} : tensor<4xf32>
  %t = tanh %e : tensor<4xf32>
  return %t
}
"""


def verified() -> Module:
    m = gir.parse(SRC, "v.gir")
    verify(m)  # every op is stamped now (by make_op or by this check)
    return m


def op_named(m: Module, name: str) -> Operation:
    return next(op for op in m.walk() if op.name == name)


def fails_at(m: Module, line: int, col: int, text: str) -> None:
    with pytest.raises(GirVerifyError) as info:
        verify(m)
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.col) == ("v.gir", line, col)
    assert text in info.value.message, info.value.message


def test_ops_made_by_the_parser_are_stamped_and_a_valid_module_still_verifies() -> None:
    m = verified()
    assert op_named(m, "add").checked is not None and op_named(m, "sum").checked is not None
    verify(m)
    verify(m.clone())


def test_a_result_type_changed_in_place_is_reported() -> None:
    m = verified()
    op_named(m, "mul").results[0].type = TensorType((7,), "f64")
    fails_at(m, 3, 8, "'mul' results are tensor<7xf64> but its operands give tensor<4x8xf32>")


def test_an_operand_value_whose_type_changed_is_reported() -> None:
    m = verified()
    op_named(m, "add").results[0].type = TensorType((4, 8), "f64")
    fails_at(m, 2, 8, "'add' results are tensor<4x8xf64>")  # the add itself, then its user
    op_named(m, "add").checked = None
    m2 = verified()
    m2.functions["f"].args[1].type = TensorType((4, 8), "f64")
    fails_at(m2, 2, 8, "'add'")


def test_an_attribute_edited_in_place_is_reported() -> None:
    m = verified()
    op_named(m, "sum").attrs["axes"][0] = 0  # the list the op holds, edited in place
    fails_at(m, 4, 8, "'sum' results are tensor<4xf32> but its operands give tensor<8xf32>")


def test_an_attribute_of_an_equal_value_but_another_type_is_checked_again() -> None:
    m = verified()
    op_named(m, "sum").attrs["axes"] = [True]  # == [1] in Python; the type rule tells them apart
    with pytest.raises(GirVerifyError) as info:
        verify(m)
    fresh = gir.parse(SRC, "v.gir")
    op_named(fresh, "sum").attrs["axes"] = [True]
    op_named(fresh, "sum").checked = None
    with pytest.raises(GirVerifyError) as want:
        verify(fresh)
    assert info.value.message == want.value.message and info.value.loc == want.value.loc


def test_an_operand_swapped_for_one_of_another_type_is_reported() -> None:
    m = verified()
    mul, total = op_named(m, "mul"), op_named(m, "sum")
    mul.set_operand(1, total.result)  # tensor<4xf32>, defined after the mul: dominance first
    fails_at(m, 3, 8, "operand #1 of 'mul' (%e) does not dominate this use")
    m = verified()
    block = m.functions["f"].body
    k = make_op("constant", [], {"value": 1.0}, declared=[TensorType((8,), "f32")])
    block.prepend(k)
    op_named(m, "mul").set_operand(1, k.result)  # broadcasts (4x8 * 8): the same result type
    verify(m)
    op_named(m, "add").set_operand(1, k.result)
    verify(m)
    k2 = make_op("constant", [], {"value": 1.0}, declared=[TensorType((3,), "f32")])
    block.prepend(k2)
    op_named(m, "add").set_operand(1, k2.result)
    fails_at(m, 2, 8, "'add': shapes")


class _Broken(Pass):
    """Test-only: applies `edit` to the first op named `target` and says it changed the IR."""

    name = "test-break-after-verify"

    def __init__(self, target: str, edit: Callable[[Operation], None]):
        super().__init__()
        self.target, self.edit = target, edit

    def run(self, module: Module, stats: PassStatistics) -> bool:
        self.edit(op_named(module, self.target))
        return True


@pytest.mark.parametrize(("target", "edit", "where", "text"), [
    ("mul", lambda op: setattr(op.results[0], "type", TensorType((7,), "f64")), (3, 8), "'mul' results are"),
    ("sum", lambda op: op.attrs["axes"].__setitem__(0, 0), (4, 8), "'sum' results are"),
    ("sum", lambda op: op.attrs.update(keepdims=True), (4, 8), "'sum' results are"),
    ("add", lambda op: setattr(op, "name", "matmul"), (2, 8), "'matmul'"),  # the kind: another rule
])
def test_a_broken_pass_after_verified_passes_is_still_named_with_the_location(target: str, edit: Callable[
        [Operation], None], where: tuple[int, int], text: str) -> None:
    """The module is verified by the parser and after `canonicalize`; the broken pass then
    edits an op whose type check passed twice, and the check after it must see the edit."""
    m = gir.parse(SRC, "v.gir")
    with pytest.raises(GirPassError) as info:
        PassManager([*parse_pipeline("canonicalize"), _Broken(target, edit)]).run(m)
    e = info.value
    assert e.message.startswith("pass 'test-break-after-verify' produced invalid IR: "), e.message
    assert text in e.message, e.message
    assert (e.loc.file, e.loc.line, e.loc.col) == ("v.gir", *where)


def test_the_emitter_s_quick_location_is_a_location() -> None:
    """frontend/emitter.py makes a Location per op without the dataclass's __init__: it must
    have every field (a field added to Location must be added there too)."""
    from gir.errors import Location
    from gir.frontend.emitter import _location

    quick, slow = _location("v.gir", 3, 8), Location("v.gir", 3, 8)
    assert type(quick) is Location and vars(quick) == vars(slow)
    assert quick == slow and hash(quick) == hash(slow) and repr(quick) == repr(slow)
    assert op_named(gir.parse(SRC, "v.gir"), "mul").loc == slow
