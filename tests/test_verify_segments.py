"""`Operation.segments` (the sizes of an op's variadic operand groups) is checked against the
op's spec: present exactly on ops with more than one variadic group (`scan`, `yield`), one
non-negative size per group, adding up to the operand count (ops.check_arity). Elsewhere the
sizes are never read, so before this check a pass that left sizes on an `add` or a `return`, or
sizes that do not add up, went unseen. Text cannot carry segments (the printer does not print
them; the parser's emitter computes them), so these tests build or edit ops the way a pass does.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import gir
import pytest
from gir.errors import GirPassError, GirTypeError, GirVerifyError
from gir.ir.core import Module, Operation
from gir.ir.ops import REGISTRY, make_op
from gir.ir.verifier import verify
from gir.passes.base import Pass
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE, parse_pipeline
from gir.passes.rewriter import PassStatistics

ROOT = Path(__file__).parent.parent

SRC = """\
func @f(%xs: tensor<5x4xf32>, %h0: tensor<4xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
  %a = add %h0, %h0 : tensor<4xf32>
  %h, %s = scan (%x in %xs) carry (%c = %a) {
    %n = tanh %x : tensor<4xf32>
    %m = mul %n, %c : tensor<4xf32>
    %t = sum %m : tensor<f32>
    yield (%m) stack (%t)
  } : tensor<4xf32>, tensor<5xf32>
  return %h, %s
}
"""


def parsed() -> Module:
    return gir.parse(SRC, "seg.gir")


def op_named(m: Module, name: str) -> Operation:
    return next(op for op in m.walk() if op.name == name)


def fails_at(m: Module, line: int, col: int, text: str) -> GirVerifyError:
    with pytest.raises(GirVerifyError) as info:
        verify(m)
    e = info.value
    assert (e.loc.file, e.loc.line, e.loc.col) == ("seg.gir", line, col), str(e)
    assert text in e.message, e.message
    shown = str(e).splitlines()
    assert shown[0].startswith(f"seg.gir:{line}:{col}: error: ") and shown[2] == " " * (col - 1) + "^", str(e)
    return e


def test_the_parsed_program_has_segments_only_on_scan_and_yield() -> None:
    m = parsed()
    verify(m)
    assert {op.name: op.segments for op in m.walk() if op.segments} == {"scan": (1, 1), "yield": (1, 1)}


@pytest.mark.parametrize(("name", "line", "col", "sizes", "text"), [
    ("add", 2, 8, (1, 1), "'add' has no variadic operand group but carries operand group sizes [1, 1]"),
    ("add", 2, 8, (2,), "'add' has no variadic operand group but carries operand group sizes [2]"),
    ("return", 9, 3, (2,), "'return' has one variadic operand group but carries operand group sizes [2]"),
    ("scan", 3, 12, (-1, 3), "'scan' operand groups do not add up: 2 operand(s), group sizes [-1, 3] "
                            "(sequences=-1, inits=3)"),  # they add up, but a size < 0
    ("scan", 3, 12, (2,), "'scan' operand groups do not add up: 2 operand(s), group sizes [2] for 2"),
    ("scan", 3, 12, (2, 0), "'scan': sequence lengths"),  # sizes that add up: the type rule sees the rest
    ("yield", 7, 5, (), "'yield' operand groups do not add up"),  # read by the scan's rule first
    ("yield", 7, 5, (2, 1), "'yield' operand groups do not add up: 2 operand(s), group sizes [2, 1]"),
])
def test_wrong_segments_set_in_place_are_reported_at_the_op(name: str, line: int, col: int,
                                                             sizes: tuple[int, ...], text: str) -> None:
    """Edited after a passing check (the op is stamped): the stamp covers segments."""
    m = parsed()
    verify(m)
    op_named(m, name).segments = sizes
    fails_at(m, line, col, text)


def test_a_hand_built_fixed_arity_op_with_segments_is_rejected() -> None:
    """An Operation made directly (no make_op check), placed in a verified function."""
    m = parsed()
    add = op_named(m, "add")
    bad = Operation("neg", [add.result], [add.result.type], loc=add.loc, segments=(1,))
    add.parent.insert_after(add, bad)
    fails_at(m, 2, 8, "'neg' has no variadic operand group but carries operand group sizes [1]")
    bad.segments = ()
    verify(m)


def test_make_op_rejects_segments_on_an_op_without_groups() -> None:
    m = parsed()
    h0 = m.functions["f"].args[1]
    loc = op_named(m, "add").loc
    with pytest.raises(GirTypeError, match=r"'tanh' has no variadic operand group but carries"):
        make_op("tanh", [h0], loc=loc, segments=(1,))
    with pytest.raises(GirTypeError, match=r"'concat' has one variadic operand group but carries"):
        make_op("concat", [h0, h0], {"axis": 0}, loc=loc, segments=(1, 1))
    assert make_op("concat", [h0, h0], {"axis": 0}, loc=loc).segments == ()


class _SetSegments(Pass):
    """Test-only: gives the first `add` operand group sizes, as a broken pass could."""

    name = "test-set-segments"

    def run(self, module: Module, stats: PassStatistics) -> bool:
        op_named(module, "add").segments = (1, 1)
        return True


def test_a_pass_leaving_segments_on_an_add_is_named_with_the_location() -> None:
    """The verifier's error is a GirVerifyError, so the pass manager names the pass (an arity
    error used to escape as a GirTypeError, unattributed)."""
    with pytest.raises(GirPassError) as info:
        PassManager([*parse_pipeline("canonicalize"), _SetSegments()]).run(parsed())
    e = info.value
    assert e.message.startswith("pass 'test-set-segments' produced invalid IR: 'add' has no variadic"), e.message
    assert (e.loc.line, e.loc.col) == (2, 8)


def _segments_hold(module: Module) -> list[str]:
    """Ops whose segments break the rule, checked here without ops.check_arity."""
    bad = []
    for op in module.walk():
        n_fixed, n_variadic = REGISTRY[op.name].arity
        want = n_variadic if n_variadic > 1 else 0
        if len(op.segments) != want or (want and (min(op.segments) < 0
                                                  or sum(op.segments) + n_fixed != len(op.operands))):
            bad.append(f"{op.loc}: {op.name} {op.segments}")
    return bad


def _filecheck_chunks() -> list:  # noqa: ANN202
    path = ROOT / "tests" / "test_filecheck.py"
    spec = importlib.util.spec_from_file_location("gir_test_filecheck_for_segments", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return [c for c in module.CHUNKS if not c.expects_error and not c.xfail_reason]


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.gir")), ids=lambda p: p.name)
def test_every_example_keeps_the_rule_through_the_default_pipeline(path: Path) -> None:
    module = gir.parse(path.read_text(), str(path))
    assert not _segments_hold(module)
    PassManager(DEFAULT_PIPELINE).run(module)  # verified after every pass
    assert not _segments_hold(module)


def test_every_filecheck_input_keeps_the_rule_through_its_pipeline() -> None:
    chunks = _filecheck_chunks()
    assert len(chunks) > 20
    for chunk in chunks:
        pipeline = re.search(r"-p\s+(\S+)", " ".join(chunk.run))
        assert pipeline, chunk.run
        module = gir.parse("\n" * (chunk.first_line - 1) + chunk.text, chunk.path.name)
        assert not _segments_hold(module), chunk.id
        PassManager(pipeline.group(1)).run(module)
        assert not _segments_hold(module), chunk.id
