"""The shared mechanisms the compile-time work on the passes changed (issue 15) give what the
plain versions gave: the memo of result types, the walk without a generator per op, operand
group ranges, the cheap `is_defined_inside`, the verifier's errors, and the GC pause.
"""

from __future__ import annotations

import gc
import pathlib
import sys
from collections.abc import Iterator

import gir
import pytest
from gir.errors import GirTypeError, GirVerifyError
from gir.ir.core import Block, Operation
from gir.ir.gcpause import gc_paused
from gir.ir.ops import InferContext, ShapeError, infer_types, make_op
from gir.ir.spec import REGISTRY, OpSpec
from gir.ir.types import TensorType
from gir.ir.verifier import verify
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE
from gir.transforms.loops import defined_inside, is_defined_inside

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = [*sorted((ROOT / "examples").glob("*.gir")), ROOT / "tests" / "data" / "opt_reference" / "passes_1k.gir"]


def _modules() -> Iterator[gir.Module]:
    """Each example, and bench/passes_scale.py's 1k-op program, as parsed and after the default
    pipeline (pre-SSA loops, scans, grads)."""
    for path in EXAMPLES:
        yield gir.load(str(path))
        module = gir.load(str(path))
        PassManager(DEFAULT_PIPELINE).run(module)
        yield module


def _reference_walk(block: Block) -> list[Operation]:
    out = []
    for op in block.ops:
        out.append(op)
        for region in op.regions:
            out.extend(_reference_walk(region.block))
    return out


def test_memoized_types_are_the_rule_s() -> None:
    """For every op of the examples, before and after the pipeline, twice (a miss, then a hit)."""
    checked = 0
    for module in _modules():
        for op in module.walk():
            spec = op.spec
            types = [v.type for v in op.operands]
            declared = [r.type for r in op.results]
            fresh = spec.infer(InferContext(spec, types, op.attrs, declared, op.regions, op.segments))
            for _ in range(2):
                assert infer_types(spec, types, op.attrs, declared, op.regions, op.segments) == fresh
            checked += 1
    assert checked > 1000


def test_memo_keys_tell_attribute_types_and_signed_zeros_apart() -> None:
    t = TensorType((), "f32")
    for value in [1, 1.0, True, -0.0, 0.0]:
        op = make_op("constant", [], attrs={"value": value}, declared=[t])
        assert op.attrs["value"] is value
        assert op.result.type == t
    i = TensorType((), "i1")
    assert make_op("constant", [], attrs={"value": True}, declared=[i]).result.type == i


def test_memo_does_not_keep_errors() -> None:
    """A literal too large for f32 fails every time, not only when first seen."""
    t = TensorType((), "f32")
    for _ in range(2):
        with pytest.raises(GirTypeError, match="does not fit"):
            make_op("constant", [], attrs={"value": 1e40}, declared=[t])


def test_memo_returns_a_fresh_list() -> None:
    t = TensorType((4,), "f32")
    spec = REGISTRY["tanh"]
    first = infer_types(spec, [t], {}, None, (), ())
    first.append(t)  # a caller editing its list must not edit the memo
    assert infer_types(spec, [t], {}, None, (), ()) == [t]


def test_walk_is_pre_order_and_survives_erasing_the_current_op() -> None:
    for module in _modules():
        for f in module.functions.values():
            assert list(f.walk()) == _reference_walk(f.body)
            assert f.num_ops() == len(_reference_walk(f.body))
    module = gir.load(str(ROOT / "examples" / "rnn.gir"))
    f = next(iter(module.functions.values()))
    expected = _reference_walk(f.body)
    seen = []
    for op in f.body.walk():  # erase a leaf op once visited: the walk goes on to the next op
        seen.append(op)
        if not op.regions and op is not f.body.last and not any(r.uses for r in op.results):
            op.parent.unlink(op)
    assert seen == expected


def _reference_segment_range(spec: OpSpec, n: int, segments: tuple[int, ...], name: str) -> tuple[int, int]:
    variadic = [o.endswith("*") for o in spec.operands]
    n_fixed, n_variadic = len(variadic) - sum(variadic), sum(variadic)
    i = [o.rstrip("*") for o in spec.operands].index(name)
    if n_variadic == 0:
        return i, 1
    if n_variadic == 1:
        rest = n - n_fixed
        return sum(rest if v else 1 for v in variadic[:i]), rest if variadic[i] else 1
    it = iter(segments)
    sizes = [next(it) if v else 1 for v in variadic]
    return sum(sizes[:i]), sizes[i]


@pytest.mark.parametrize("name", sorted(n for n, s in REGISTRY.items() if s.arity[1] > 1))
def test_segment_ranges_of_multi_group_ops(name: str) -> None:
    spec = REGISTRY[name]
    n_fixed, n_variadic = spec.arity
    for segments in [(0,) * n_variadic, tuple(range(1, n_variadic + 1)), tuple(range(n_variadic, 0, -1))]:
        n = n_fixed + sum(segments)
        for group in (o.rstrip("*") for o in spec.operands):
            assert spec.segment_range(n, segments, group) == _reference_segment_range(spec, n, segments, group)


def test_is_defined_inside_agrees_with_defined_inside() -> None:
    checked = 0
    for module in _modules():
        loops = [op for op in module.walk() if op.regions]
        values = [v for op in module.walk() for v in [*op.operands, *op.results]]
        for loop in loops:
            inside = defined_inside(loop)
            for v in values:
                assert is_defined_inside(v, loop) == (v in inside)
                checked += 1
    assert checked > 1000


def test_verifier_errors_are_unchanged() -> None:
    """The verifier's reordered checks still name each problem (an unknown op kind, a use
    before the definition, a terminator in the middle, wrong result types)."""
    module = gir.parse("func @f(%x: tensor<3xf32>) -> tensor<3xf32> {\n  %y = tanh(%x)\n  %z = exp(%y)\n"
                       "  return %z\n}\n")
    body = module["f"].body
    tanh, exp = body.ops[0], body.ops[1]
    tanh.name = "frob"
    with pytest.raises(GirVerifyError, match="unknown op 'frob'"):
        verify(module)
    tanh.name = "tanh"
    body.unlink(exp)
    body.insert_before(tanh, exp)
    with pytest.raises(GirVerifyError, match="does not dominate"):
        verify(module)
    body.unlink(exp)
    body.insert_after(tanh, exp)
    tanh.result.type = TensorType((4,), "f32")
    with pytest.raises(GirVerifyError, match="results are tensor<4xf32> but its operands give tensor<3xf32>"):
        verify(module)
    tanh.result.type = TensorType((3,), "f32")
    verify(module)


def test_shape_errors_are_reported_by_the_verifier_too() -> None:
    module = gir.parse("func @f(%x: tensor<3xf32>, %y: tensor<4xf32>) -> tensor<3xf32> {\n  %z = tanh(%x)\n"
                       "  return %z\n}\n")
    f = module["f"]
    tanh = f.body.ops[0]
    tanh.set_operand(0, f.args[1])  # now tanh(tensor<4xf32>) claims tensor<3xf32>
    with pytest.raises(GirVerifyError, match="results are"):
        verify(module)
    with pytest.raises(ShapeError):
        REGISTRY["add"].infer(InferContext(REGISTRY["add"], [TensorType((3,), "f32"), TensorType((4,), "f32")],
                                           {}, None, (), ()))


def test_gc_pause_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # only the outer pause turns it back on
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a pass failed")
    assert gc.isenabled()


def test_gc_pause_leaves_nothing_frozen_and_cycles_collectable() -> None:
    """The pause moves what it allocated to the oldest generation (freeze, unfreeze): nothing
    stays frozen, and a cycle made garbage during the pause is freed by a full collection."""
    import weakref

    class Node:
        pass

    if gc.get_freeze_count():
        pytest.skip("something in this process froze objects: the pause leaves them (and its own) alone")
    gc.collect()
    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: reference counting alone never frees it
        alive = weakref.ref(a)
        del a, b
    assert gc.get_freeze_count() == 0
    assert alive() is not None  # not collected yet: it sits in the oldest generation
    gc.collect()
    assert alive() is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
