"""Ops that can fail at run time (an integer division by zero, a `max` over an empty axis, an
`index` out of range) raise on every device exactly where the interpreter raises: dead-code
elimination keeps them, and loop-invariant hoisting leaves them in a loop that may run no step.

Found by tests/fuzz/differential.py: the CPU backend returned a value where the interpreter
raised (the failing op was unused, and canonicalize erased it), and raised where the
interpreter returned a value (an invariant division hoisted out of a loop of zero steps).
"""

from __future__ import annotations

import gir
import numpy as np
import pytest
from gir.errors import GirError
from gir.testing import assert_all_close

DEVICES = ["interp", "cpu", pytest.param("gpu", marks=pytest.mark.gpu)]

DEAD_DIVISION = """\
func @f(%x: tensor<4x2xi32>, %v: tensor<2xi32>) -> tensor<4x2xi32> {
  %unused = %x / %v
  return %x + 1
}
"""

DEAD_EMPTY_MAX = """\
func @f(%a: tensor<0x3xf32>) -> tensor<f32> {
  %unused = max(%a)
  return sum(%a)
}
"""

DEAD_INDEX = """\
func @f(%a: tensor<3x2xf32>, %i: tensor<i32>) -> tensor<3x2xf32> {
  %unused = index(%a, %i)
  return %a * 2.0
}
"""

DEAD_IN_A_LOOP = """\
func @f(%xs: tensor<3x2xi64>, %v: tensor<2xi64>) -> tensor<3x2xi64> {
  for %x in %xs {
    %unused = %x / %v
    collect %x * 2 into %ys
  }
  return %ys
}
"""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("source", "args", "message"), [
    (DEAD_DIVISION, [np.ones((4, 2), np.int32), np.array([1, 0], np.int32)], "division by zero"),
    (DEAD_EMPTY_MAX, [np.zeros((0, 3), np.float32)], "'reduce_max' of no element has no value"),
    (DEAD_INDEX, [np.ones((3, 2), np.float32), np.array(5, np.int32)], "out of range"),
    (DEAD_IN_A_LOOP, [np.ones((3, 2), np.int64), np.array([0, 1], np.int64)], "division by zero"),
], ids=["division", "empty-max", "index", "in-a-loop"])
def test_an_unused_op_that_fails_still_fails(device: str, source: str, args: list, message: str) -> None:
    with pytest.raises(GirError, match=message):
        gir.interpret(gir.parse(source), "f", *args)
    with pytest.raises(GirError, match=message):
        gir.jit(source, "f", device=device)(*args)


INVARIANT_DIVISION = """\
func @f(%a: tensor<3xi32>, %b: tensor<3xi32>, %xs: tensor<?x3xi32>) -> tensor<?x3xi32> {
  for %x in %xs {
    collect %x + %a / %b into %ys
  }
  return %ys
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_an_invariant_division_in_a_loop_of_no_step_does_not_fail(device: str) -> None:
    a, b = np.ones(3, np.int32), np.array([1, 0, 2], np.int32)
    fn = gir.jit(INVARIANT_DIVISION, "f", device=device)
    for steps in (0, 2):
        xs = np.arange(3 * steps, dtype=np.int32).reshape(steps, 3)
        if steps == 0:
            want = gir.interpret(gir.parse(INVARIANT_DIVISION), "f", a, b, xs)
            assert want[0].shape == (0, 3)
            assert_all_close(fn(a, b, xs), want)
        else:
            with pytest.raises(GirError, match="division by zero"):
                fn(a, b, xs)
    good = np.array([1, 3, 2], np.int32)  # a loop that runs: the division still gives the right answer
    xs = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert_all_close(fn(a, good, xs), gir.interpret(gir.parse(INVARIANT_DIVISION), "f", a, good, xs))


def test_an_invariant_division_is_hoisted_from_a_loop_that_surely_runs() -> None:
    """Hoisting stays on where it cannot change which calls fail: a static trip count > 0."""
    from gir.passes.pass_manager import PassManager

    module = gir.parse(INVARIANT_DIVISION.replace("?x3", "4x3"))
    PassManager("ssa,canonicalize").run(module)
    scan = next(op for op in module.walk() if op.name == "scan")
    assert not any(op.name == "div" for op in scan.body), str(module)
    module = gir.parse(INVARIANT_DIVISION)
    PassManager("ssa,canonicalize").run(module)
    scan = next(op for op in module.walk() if op.name == "scan")
    assert any(op.name == "div" for op in scan.body), str(module)


YIELDED_VARIABLE = """\
func @f(%xs: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %s = var : tensor<3xf32>
  %0 = zeros : tensor<3xf32>
  store %s, %0
  %ys = for (%x in %xs) {
    yield () stack (%s)
  } : tensor<4x3xf32>
  return %ys
}
"""


@pytest.mark.parametrize(("where", "text"), [
    ("yield", YIELDED_VARIABLE),
    ("return", "func @f(%a: tensor<3xf32>) -> tensor<3xf32> {\n  %s = var : tensor<3xf32>\n  store %s, %a\n"
               "  return %s\n}\n"),
    ("call", "func @g(%a: tensor<3xf32>) -> tensor<3xf32> {\n  return %a\n}\n\nfunc @f(%a: tensor<3xf32>) -> "
             "tensor<3xf32> {\n  %s = var : tensor<3xf32>\n  store %s, %a\n  %r = call @g(%s) : tensor<3xf32>\n"
             "  return %r\n}\n"),
], ids=["yield", "return", "call"])
def test_a_variable_where_a_tensor_belongs_is_a_located_type_error(where: str, text: str) -> None:
    """`yield () stack (%s)` of a `var` was an AssertionError in the loop's type rule (found by
    tests/fuzz/mutate.py, input 80009 of seed 0); yield, return and call now ask for tensors."""
    # (A call's arguments are checked against the callee first: a located error naming @g.)
    with pytest.raises(gir.GirTypeError, match="is a variable; read it with load|@g takes") as info:
        gir.parse(text, filename="var.gir")
    assert info.value.loc is not None and info.value.loc.file == "var.gir"


@pytest.mark.parametrize("text", [
    "func @f(%a: tensor<f32>) -> tensor<f32> {\n  return %a loc(\"f.gir\":" + "9" * 5000 + ":1)\n}\n",
    "func @f(%a: tensor<f32>) -> tensor<f32> {\n  return %a loc(\"f.gir\":1:" + "9" * 5000 + ")\n}\n",
    "func @l(%a: tensor<f32>) -> tensor<f32> {\n  return %a\n}\n\nfunc @f(%a: tensor<f32>) -> "
    "(tensor<f32>, tensor<f32>) "
    "{\n  %l, %d = grad @l(%a) wrt (" + "9" * 5000 + ")\n  return %l, %d\n}\n",
], ids=["loc-line", "loc-col", "wrt-position"])
def test_integers_past_the_digit_limit_anywhere_are_located_errors(text: str) -> None:
    """A 5,000-digit `wrt` position (tests/fuzz/mutate.py, seed 0 input 25062) or loc line was a
    raw ValueError from Python's int() digit limit."""
    with pytest.raises(gir.GirSyntaxError, match="too large") as info:
        gir.parse(text, filename="big.gir")
    assert info.value.loc is not None and info.value.loc.file == "big.gir"


@pytest.mark.parametrize("device", DEVICES)
def test_a_zero_divisor_of_no_division_is_no_error(device: str) -> None:
    """`%xs / %v` with %xs 3x0x2 divides nothing: the interpreter raised "integer division by
    zero" because %v holds a 0, where the backends' loops run no step (tests/fuzz/differential.py,
    seed 1000 program 6). Where a division happens, a zero divisor still raises."""
    text = "func @f(%xs: tensor<?x?x2xi32>, %v: tensor<2xi32>) -> tensor<?x?x2xi32> {\n  return %xs / %v\n}\n"
    v = np.array([-2**31, 0], np.int32)
    empty = np.zeros((3, 0, 2), np.int32)
    (want,) = gir.interpret(gir.parse(text), "f", empty, v)
    assert want.shape == (3, 0, 2)
    assert_all_close(gir.jit(text, "f", device=device)(empty, v), [want])
    with pytest.raises(GirError, match="division by zero"):
        gir.jit(text, "f", device=device)(np.ones((1, 1, 2), np.int32), v)


GATHER_AND_SCATTER = """\
func @g(%a: tensor<3x2xf32>, %i: tensor<4xi32>) -> tensor<4x2xf32> {
  return index(%a, %i)
}
func @s(%a: tensor<3x2xf32>, %i: tensor<4xi32>, %u: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return scatter_add(%a, %i, %u)
}
func @one(%a: tensor<3x2xf32>, %i: tensor<i32>) -> tensor<2xf32> {
  return index(%a, %i)
}
"""


@pytest.mark.parametrize(("entry", "index", "message"), [
    ("g", [0, 2, 7, -1], "index 7 is out of range for a leading dim of 3"),
    ("s", [1, -4, 0, 9], "scatter_add index -4 is out of range for a leading dim of 3"),
    ("one", -2, "index -2 is out of range for a leading dim of 3"),
], ids=["gather", "scatter", "scalar"])
def test_the_cpu_names_the_index_out_of_range_as_the_interpreter_does(entry: str, index: object,
                                                                        message: str) -> None:
    a = np.ones((3, 2), np.float32)
    args = [a, np.array(index, np.int32)] + ([np.ones((4, 2), np.float32)] if entry == "s" else [])
    errors = []
    for device in ("interp", "cpu"):
        with pytest.raises(GirError, match=message) as info:
            gir.jit(GATHER_AND_SCATTER, entry, device=device)(*args)
        errors.append(str(info.value).splitlines()[0])
    assert errors[0].replace(" at run time", "") == errors[1].replace(" at run time", ""), errors


DEAD_CARRY_READ_BY_A_FAILING_LOOP = """\
func @f(%s: tensor<f64>, %xs: tensor<3x?x?xf64>) -> tensor<f64> {
  %c = %s
  for %x in %xs {
    for %row in %x {
      %unused = min(%x, axes=[0, 1], keepdims=false)
      collect %c into %cs
    }
    %c = %c * 2.0
  }
  return %s
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_dead_carry_read_inside_a_kept_failing_loop_is_kept(device: str) -> None:
    """The carry %c is dead (its result is unused) but the inner loop stays, since its `min`
    may fail, and it reads %c: canonicalize's carry liveness crashed ("a dropped scan block
    argument still has uses"; found by the differential campaign, program 5 of seed 1000)."""
    s = np.array(1.5)
    fn = gir.jit(DEAD_CARRY_READ_BY_A_FAILING_LOOP, "f", device=device)
    module = gir.parse(DEAD_CARRY_READ_BY_A_FAILING_LOOP)
    runs = np.zeros((3, 0, 7))  # the inner loop runs no step
    assert_all_close(fn(s, runs), gir.interpret(module, "f", s, runs))
    fails = np.zeros((3, 2, 0))  # it runs, and its `min` is over no element
    for run in (fn, lambda *a: gir.interpret(module, "f", *a)):
        with pytest.raises(GirError, match="no element|empty"):
            run(s, fails)


TWO_FAILURES = """\
func @f(%v: tensor<4xi64>, %xs: tensor<2x4xi64>, %ids: tensor<3xi64>) -> tensor<3x4xi64> {
  %unused = %v / relu(%v)
  %rows = index(%xs, %ids)
  return %rows
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_of_two_failing_ops_the_first_one_s_error_is_raised(device: str) -> None:
    """A division by zero before an `index` out of range: every device reports the division,
    as the interpreter does. The GPU backend checked the index on the host at once and read
    the kernels' division flag only at the end, so it reported the index (found by the
    differential campaign's out-of-range mode, program 376 of seed 0)."""
    args = [np.array([1, -2, 3, 0]), np.zeros((2, 4), np.int64), np.array([0, 9, 1])]
    with pytest.raises(GirError, match="division by zero") as want:
        gir.interpret(gir.parse(TWO_FAILURES), "f", *args)
    assert ":2:" in str(want.value)
    with pytest.raises(GirError, match="division by zero") as got:
        gir.jit(TWO_FAILURES, "f", device=device)(*args)
    assert ":2:" in str(got.value)


GATHER_AFTER_DIVISION = """\
func @f(%v: tensor<4xi64>, %xs: tensor<2x4xf32>, %ids: tensor<3xi64>) -> (tensor<4xi64>, tensor<3x4xf32>) {
  %q = %v / %v
  %rows = index(%xs, %ids)
  return %q, %rows
}
"""


@pytest.mark.gpu
def test_an_index_argument_out_of_range_raises_in_program_order_on_the_graph_path() -> None:
    """The GPU checks an index argument's range when the call takes it (so that the call's work,
    without a read-back, is a CUDA graph), but reports it where the interpreter does: after a
    replayed call, a call with the index out of range and a division by zero before the gather
    reports the division; one without the division reports the index; the next good call
    replays the graph again with right results."""
    fn = gir.jit(GATHER_AFTER_DIVISION, "f", device="gpu")
    xs = np.arange(8, dtype=np.float32).reshape(2, 4)
    good = [np.array([1, 2, 3, 4]), xs, np.array([1, 0, 1])]
    for _ in range(3):
        assert_all_close(fn(*good), gir.interpret(gir.parse(GATHER_AFTER_DIVISION), "f", *good))
    assert fn.stats.graph == "replayed", fn.stats.graph
    for v, message in ((np.array([1, 0, 3, 4]), "division by zero"), (np.array([1, 2, 3, 4]), "index 5")):
        with pytest.raises(GirError, match=message):
            gir.interpret(gir.parse(GATHER_AFTER_DIVISION), "f", v, xs, np.array([0, 5, 1]))
        with pytest.raises(GirError, match=message):
            fn(v, xs, np.array([0, 5, 1]))
    assert_all_close(fn(*good), gir.interpret(gir.parse(GATHER_AFTER_DIVISION), "f", *good))
    assert fn.stats.graph == "replayed" and fn.stats.graph_replays == 1, fn.stats


DEAD_CALL = """\
func @g(%a: tensor<0x3xi32>) -> tensor<i32> {
  %m = min(%a)
  return %m
}

func @f(%x: tensor<0x3xi32>) -> tensor<0x3xi32> {
  %unused = @g(%x)
  return %x
}
"""


@pytest.mark.parametrize("device", DEVICES)
def test_an_unused_call_of_a_function_that_fails_still_fails(device: str) -> None:
    """canonicalize erased an unused `call` before `inline` (the callee's body is no region of
    the call, so `fails_at_run_time` saw nothing): the interpreter raised, the backends ran
    (found by the differential campaign, program 1864 of seed 1000)."""
    x = np.zeros((0, 3), np.int32)
    with pytest.raises(GirError, match="no element"):
        gir.interpret(gir.parse(DEAD_CALL), "f", x)
    with pytest.raises(GirError, match="no element"):
        gir.jit(DEAD_CALL, "f", device=device)(x)
