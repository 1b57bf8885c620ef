"""The `place` pass (transforms/placement.py): the two policies on graphs where they differ, loops
placed whole, min-elements and scalars, transfers only at boundaries and round trips removed,
idempotence (also through the printer), the report, and the interpreter as the oracle on
every example and on generated programs.

Devices are checked against the IR alone (`IRDevices`), not the pass's own bookkeeping.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.errors import GirPassError
from gir.ir.core import Module, Operation, OpResult, Value
from gir.ir.interpreter import random_inputs
from gir.ir.types import TensorType
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE, parse_pipeline
from gir.transforms.placement import PlacementReport
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.gir"))


@dataclass
class Placed:
    reports: list[PlacementReport]
    """The placement of every function, as the pipeline's analyses hand it on."""


def place(text: str | Module, pipeline: str = "place{min-elements=1}") -> tuple[Module, Placed, bool]:
    """Runs the pipeline (verifying after every pass); returns the module, the placement
    reports the pipeline's analyses hold and whether the last `place` changed the IR."""
    module = gir.parse(text) if isinstance(text, str) else text
    report = PassManager(pipeline).run(module)
    records = [r for r in report.records if r.name == "place"]
    return module, Placed(report.analyses.all(PlacementReport)), records[-1].changed


class IRDevices:
    """Where every op runs and every value lives, read from the placed IR alone."""

    def op(self, op: Operation) -> str | None:
        if op.name == "return":
            return "cpu"
        if op.name == "yield":
            return self.op(op.parent_op)  # type: ignore[arg-type]
        if "device" in op.attrs:
            return op.attrs["device"]
        if op.name in ("scan", "fused"):
            for inner in op.walk():
                if inner is not op and "device" in inner.attrs and inner.name != "transfer":
                    return inner.attrs["device"]
            return None  # an empty loop body says nothing
        return "cpu"  # call, grad, for, var, load, store

    def value(self, v: Value) -> str | None:
        if isinstance(v, OpResult):
            return self.op(v.op)
        owner = v.block.parent_op  # type: ignore[attr-defined]
        return "cpu" if owner is None else self.op(owner)


def check_placement(module: Module) -> None:
    """Every operand lives where its reader runs; transfers stand at the top level, between
    devices, never one after another; results go back on the CPU."""
    d = IRDevices()
    for f in module.functions.values():
        for op in f.walk():
            if op.name == "transfer":
                src = op.operands[0]
                assert op.parent is f.body, "a transfer inside a loop body"
                assert not (isinstance(src, OpResult) and src.op.name == "transfer"), "a transfer of a transfer"
                assert d.value(src) != op.attrs["device"], "a transfer to where its operand already is"
                continue
            need = d.op(op)
            for v in op.operands:
                have = d.value(v)
                if need is not None and have is not None and isinstance(v.type, TensorType):
                    assert have == need, f"{op.name} runs on the {need} but reads a value on the {have}"


def devices_by_name(module: Module, fn: str) -> dict[str, str]:
    """op name -> device for the ops of a function that occur once."""
    seen: dict[str, list[str | None]] = {}
    for op in module.functions[fn].walk():
        seen.setdefault(op.name, []).append(IRDevices().op(op))
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and v[0] is not None}


def transfers(module: Module) -> list[tuple[str, str]]:
    """(operand name hint, device) of every transfer, in program order."""
    return [(op.operands[0].name_hint or "?", op.attrs["device"]) for op in module.walk() if op.name == "transfer"]


def reasons(p: Placed, fn: str = "f") -> dict[str, str]:
    report = next(r for r in p.reports or [] if r.function.name == fn)
    return {op.name: why for op, why in report.reason.items()}


# ---------------------------------------------------------------------------------------------
# The policies, where they differ


ISLAND = """\
func @f(%x: tensor<64x64xf32>, %y: tensor<64x64xf32>, %w: tensor<64x64xf32>)
    -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %e = exp %x : tensor<64x64xf32>
  %island = add %e, %y : tensor<64x64xf32>
  %m = matmul %x, %w : tensor<64x64xf32>
  %t = tanh %m : tensor<64x64xf32>
  return %island, %t
}
"""


def test_aggressive_moves_every_op_with_a_kernel() -> None:
    module, p, changed = place(ISLAND, "place{policy=aggressive}")
    assert changed
    assert devices_by_name(module, "f") == {"exp": "gpu", "add": "gpu", "matmul": "gpu", "tanh": "gpu",
                                            "return": "cpu"}
    assert transfers(module) == [("x", "gpu"), ("y", "gpu"), ("w", "gpu"), ("island", "cpu"), ("t", "cpu")]
    assert reasons(p)["exp"] == "policy aggressive: it has a GPU kernel"
    check_placement(module)


def test_lift_leaves_the_island_on_the_cpu() -> None:
    module, p, _ = place(ISLAND, "place")
    assert devices_by_name(module, "f") == {"exp": "cpu", "add": "cpu", "matmul": "gpu", "tanh": "gpu",
                                            "return": "cpu"}
    assert transfers(module) == [("x", "gpu"), ("w", "gpu"), ("t", "cpu")]
    why = reasons(p)
    assert why["matmul"] == "policy lift: matmul starts on the GPU"
    assert why["tanh"] == "policy lift: an input is on the GPU"
    assert why["exp"] == why["add"] == "policy lift: no input or consumer on the GPU"
    check_placement(module)


def test_lift_lifts_producers_whose_consumers_are_all_on_the_gpu() -> None:
    text = """\
func @f(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %wt = transpose %w : tensor<64x64xf32>
  %z = zeros : tensor<64x64xf32>
  %m = matmul %x, %wt : tensor<64x64xf32>
  %s = add %m, %z : tensor<64x64xf32>
  %shared = neg %x : tensor<64x64xf32>
  %n = matmul %shared, %w : tensor<64x64xf32>
  return %s, %shared
}
"""
    module, p, _ = place(text, "place")
    devices = devices_by_name(module, "f")
    assert devices["transpose"] == devices["zeros"] == "gpu"
    assert devices["neg"] == "cpu"  # returned as well: one consumer on the CPU
    why = reasons(p)
    assert why["transpose"] == why["zeros"] == "policy lift: every consumer is on the GPU"
    assert ("shared", "gpu") in transfers(module) and ("w", "gpu") in transfers(module)
    check_placement(module)
    module, _, _ = place(text, "place{policy=aggressive}")
    assert devices_by_name(module, "f")["neg"] == "gpu"


def test_lift_is_not_pulled_by_a_scalar_on_the_gpu() -> None:
    text = """\
func @f(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %m = matmul %x, %w : tensor<64x64xf32>
  %s = sum %m : tensor<f32>
  %r = mul %x, %s : tensor<64x64xf32>
  return %r
}
"""
    module, _, _ = place(text, "place")
    assert devices_by_name(module, "f") == {"matmul": "gpu", "sum": "gpu", "mul": "cpu", "return": "cpu"}
    assert transfers(module) == [("x", "gpu"), ("w", "gpu"), ("s", "cpu")]
    module, _, _ = place(text, "place{policy=aggressive}")
    assert devices_by_name(module, "f")["mul"] == "gpu"


# ---------------------------------------------------------------------------------------------
# Size, dtype, kernels


SIZES = """\
func @f(%v: tensor<64xf32>, %a: tensor<f32>, %b: tensor<f32>) -> (tensor<64xf32>, tensor<f32>) {
  %e = exp %v : tensor<64xf32>
  %s = add %a, %b : tensor<f32>
  return %e, %s
}
"""


@pytest.mark.parametrize("policy", ["aggressive", "lift"])
def test_min_elements(policy: str) -> None:
    for n, exp_device in [(65, "cpu"), (64, "gpu"), (0, "gpu")]:
        module, p, _ = place(SIZES, f"place{{policy={policy},min-elements={n}}}")
        devices = devices_by_name(module, "f")
        if policy == "aggressive":
            assert devices["exp"] == exp_device, n
        assert devices["add"] == "cpu", "scalars stay on the CPU at any min-elements"
        assert reasons(p)["add"] == "too small: a scalar"
    module, p, _ = place(SIZES, "place{policy=aggressive,min-elements=65}")
    assert reasons(p)["exp"] == "too small: 64 elements < min-elements 65"
    assert transfers(module) == []


def test_unknown_sizes_are_not_small() -> None:
    text = """\
func @f(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %e = exp %x : tensor<?x4xf32>
  return %e
}
"""
    module, _, _ = place(text, "place{policy=aggressive}")
    assert devices_by_name(module, "f")["exp"] == "gpu"


def test_integer_matmul_stays_on_the_cpu() -> None:
    text = """\
func @f(%x: tensor<64x64xi32>) -> tensor<64x64xi32> {
  %m = matmul %x, %x : tensor<64x64xi32>
  %r = add %m, %m : tensor<64x64xi32>
  return %r
}
"""
    module, p, _ = place(text, "place{policy=aggressive}")
    assert devices_by_name(module, "f") == {"matmul": "cpu", "add": "gpu", "return": "cpu"}
    assert reasons(p)["matmul"] == "dtype: cuBLAS has no i32 matmul"


def test_bad_options() -> None:
    with pytest.raises(GirPassError, match="policy must be aggressive or lift"):
        parse_pipeline("place{policy=eager}")
    with pytest.raises(GirPassError, match="min-elements must be >= 0"):
        parse_pipeline("place{min-elements=-1}")
    (p,) = parse_pipeline("place{policy=aggressive,min-elements=7}")
    assert p.spec() == "place{policy=aggressive,min-elements=7}"


def test_bad_device_attribute_is_a_type_error() -> None:
    with pytest.raises(gir.GirError, match='device must be "cpu" or "gpu"'):
        gir.parse('func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %e = exp %x {device = "tpu"} : tensor<4xf32>\n'
                  '  return %e\n}\n')


# ---------------------------------------------------------------------------------------------
# Loops: one device for the whole scan


def scan_body_ops(module: Module) -> list[Operation]:
    return [inner for op in module.walk() if op.name == "scan" for inner in op.body.walk()
            if not inner.spec.terminator]


def test_rnn_scan_is_placed_whole_with_no_transfer_inside() -> None:
    module = gir.load(str(Path(EXAMPLES[0]).parent / "rnn.gir"))
    module, p, _ = place(module, "ssa,canonicalize,autodiff,canonicalize,scan-grad,place")
    body = scan_body_ops(module)
    assert body and all(op.attrs["device"] == "gpu" for op in body)
    assert not any(op.name == "transfer" for op in body)
    report = next(r for r in p.reports or [] if r.function.name == "rnn_grads")
    grads_body = [op for op in body if op in report.reason]
    assert len(grads_body) > 10 and {report.reason[op] for op in grads_body} == {"follows its scan"}
    # loop-invariant weights are transferred once, before the loop
    assert {"wx", "wh", "b"} <= {name for name, device in transfers(module) if device == "gpu"}
    check_placement(module)


def test_scan_with_an_op_without_gpu_kernel_stays_on_the_cpu() -> None:
    text = """\
func @g(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %t = tanh %a : tensor<8x8xf32>
  return %t
}

func @f(%xs: tensor<3x8x8xf32>, %h0: tensor<8x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %w2 = matmul %w, %w : tensor<8x8xf32>
  %h = scan (%x in %xs) carry (%c = %h0) {
    %m = matmul %c, %w2 : tensor<8x8xf32>
    %g = call @g(%m) : tensor<8x8xf32>
    %n = add %g, %x : tensor<8x8xf32>
    yield (%n)
  } : tensor<8x8xf32>
  return %h
}
"""
    module, p, _ = place(text)
    why = reasons(p)
    assert why["scan"] == "no GPU kernel ('call' in its body)"
    assert why["add"] == why["call"] == "follows its scan"
    assert all(IRDevices().op(op) == "cpu" for op in scan_body_ops(module))
    assert transfers(module) == [("w", "gpu"), ("w2", "cpu")]  # the closure comes back before the loop
    check_placement(module)


def test_small_scan_stays_on_the_cpu_and_nested_scans_follow() -> None:
    text = """\
func @f(%xs: tensor<3x4xf32>, %h0: tensor<4xf32>) -> tensor<4xf32> {
  %h = scan (%x in %xs) carry (%c = %h0) {
    %i = scan length 2 () carry (%d = %c) {
      %e = tanh %d : tensor<4xf32>
      yield (%e)
    } : tensor<4xf32>
    %n = add %i, %x : tensor<4xf32>
    yield (%n)
  } : tensor<4xf32>
  return %h
}
"""
    module, p, _ = place(text, "place{min-elements=5}")
    assert reasons(p)["add"] == "follows its scan"
    assert reasons(p)["tanh"] == "follows its scan"
    assert "too small: 4 elements" in next(why for op, why in p.reports[0].reason.items()  # type: ignore[index]
                                           if op.name == "scan" and op.parent_op is None)
    assert transfers(module) == []
    module, _, _ = place(text, "place{min-elements=4}")
    assert all(IRDevices().op(op) == "gpu" for op in scan_body_ops(module))
    assert transfers(module) == [("xs", "gpu"), ("h0", "gpu"), ("h", "cpu")]
    check_placement(module)


def test_empty_loop_stays_with_its_inputs() -> None:
    """Its body records no device, so the decision must not depend on the options."""
    text = """\
func @f(%xs: tensor<3x8x8xf32>, %w: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<3x8x8xf32>) {
  %m = matmul %w, %w : tensor<8x8xf32>
  %c, %ys = scan (%x in %xs) carry (%k = %m) {
    yield (%k) stack (%x)
  } : tensor<8x8xf32>, tensor<3x8x8xf32>
  return %c, %ys
}
"""
    module, p, _ = place(text)
    assert reasons(p)["scan"] == "an empty loop: stays with its inputs"
    assert transfers(module) == [("w", "gpu"), ("xs", "gpu"), ("c", "cpu"), ("ys", "cpu")]
    check_placement(module)
    printed = str(module)
    for again in ["place{min-elements=100000}", "place{policy=aggressive}"]:
        reparsed = gir.parse(printed)
        _, _, changed = place(reparsed, again)
        assert not changed and str(reparsed) == printed


def test_transfer_written_inside_a_loop_is_hoisted() -> None:
    text = """\
func @f(%xs: tensor<3x8x8xf32>, %w: tensor<8x8xf32>) -> tensor<3x8x8xf32> {
  %ys = scan (%x in %xs) {
    %wg = transfer %w {device = "gpu"} : tensor<8x8xf32>
    %m = matmul %x, %wg : tensor<8x8xf32>
    yield () stack (%m)
  } : tensor<3x8x8xf32>
  return %ys
}
"""
    module, _, changed = place(text)
    assert changed
    check_placement(module)
    assert transfers(module) == [("xs", "gpu"), ("w", "gpu"), ("ys", "cpu")]


def test_body_pinned_to_both_devices_is_an_error() -> None:
    text = """\
func @f(%xs: tensor<3x8xf32>) -> tensor<3x8xf32> {
  %ys = scan (%x in %xs) {
    %a = tanh %x {device = "gpu"} : tensor<8xf32>
    %b = exp %a {device = "cpu"} : tensor<8xf32>
    yield () stack (%b)
  } : tensor<3x8xf32>
  return %ys
}
"""
    with pytest.raises(GirPassError, match="placed on both devices"):
        place(text)


def test_pinned_gpu_without_a_kernel_is_an_error() -> None:
    text = """\
func @f(%x: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %m = matmul %x, %x {device = "gpu"} : tensor<8x8xi32>
  return %m
}
"""
    with pytest.raises(GirPassError, match=r"'matmul' is placed on the gpu but cannot run there \(dtype"):
        place(text)


def test_fuse_before_or_after_place() -> None:
    text = """\
func @f(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>) {
  %c = constant 0.5 : tensor<f32>
  %m = matmul %x, %w : tensor<64x64xf32>
  %e = exp %x : tensor<64x64xf32>
  %f = mul %e, %c : tensor<64x64xf32>
  %a = add %m, %f : tensor<64x64xf32>
  %b = mul %a, %c : tensor<64x64xf32>
  return %b, %e
}
"""
    for pipeline in ["fuse,place", "place,fuse"]:
        module, p, _ = place(text, pipeline)
        assert any(op.name == "fused" for op in module.walk())
        check_placement(module)
        if pipeline == "fuse,place":
            assert reasons(p)["fused"] == "policy lift: an input is on the GPU"
            assert reasons(p)["exp"] == "follows its fused op"
        _, _, changed = place(module, "place")
        assert not changed, pipeline


# ---------------------------------------------------------------------------------------------
# Transfers: round trips, duplicates, results


def test_round_trips_are_removed() -> None:
    text = """\
func @f(%x: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>) {
  %g = transfer %x {device = "gpu"} : tensor<8x8xf32>
  %c = transfer %g {device = "cpu"} : tensor<8x8xf32>
  %c2 = transfer %c {device = "cpu"} : tensor<8x8xf32>
  %e = exp %c2 : tensor<8x8xf32>
  return %e, %c
}
"""
    module, p, changed = place(text, "place{min-elements=1000}")  # exp stays on the CPU
    assert changed
    assert transfers(module) == []
    ret = module.functions["f"].body.last
    assert ret is not None and ret.operands[1] is module.functions["f"].args[0]
    assert p.reports is not None and p.reports[0].removed == 3
    check_placement(module)


def test_one_transfer_per_value_and_device() -> None:
    text = """\
func @f(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %a = transfer %x {device = "gpu"} : tensor<8x8xf32>
  %m = matmul %a, %x : tensor<8x8xf32>
  %b = transfer %x {device = "gpu"} : tensor<8x8xf32>
  %n = matmul %m, %b : tensor<8x8xf32>
  return %n
}
"""
    module, p, _ = place(text)
    assert transfers(module) == [("x", "gpu"), ("n", "cpu")]
    assert p.reports is not None and (p.reports[0].created, p.reports[0].removed) == (1, 1)
    check_placement(module)


# ---------------------------------------------------------------------------------------------
# Idempotence


def shrunk(text: str) -> str:
    """An example with its dims made small, so the interpreter runs it in milliseconds."""
    small = {"50": "4", "32": "3", "256": "8", "512": "6", "64": "5", "10": "4"}
    return re.sub(r"tensor<[^>]*>", lambda m: re.sub(r"\d+(?=x)", lambda d: small.get(d.group(), d.group()), m.group()),
                  text)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_idempotent_on_examples(path: Path) -> None:
    module = gir.load(str(path))
    PassManager(DEFAULT_PIPELINE).run(module)
    for options in ["policy=aggressive,min-elements=1", "policy=lift,min-elements=1", "policy=lift"]:
        placed = gir.parse(str(module))
        place(placed, f"place{{{options}}}")
        check_placement(placed)
        text = str(placed)
        for again in ["place", "place{policy=aggressive,min-elements=0}", "place{policy=lift,min-elements=99999}"]:
            reparsed = gir.parse(text)  # the placement round-trips through the printer
            _, _, changed = place(reparsed, again)
            assert not changed, (options, again)
            assert str(reparsed) == text


def test_second_run_keeps_the_reasons() -> None:
    module, first, _ = place(ISLAND, "place")
    _, second, changed = place(str(module), "place")
    assert not changed
    assert reasons(first) == reasons(second)
    _, third, _ = place(str(module), "place{policy=aggressive}")
    assert reasons(third)["exp"] == "kept from the input (the policy says gpu: policy aggressive: it has a GPU kernel)"


# ---------------------------------------------------------------------------------------------
# The interpreter is the oracle


def assert_same(before: list[np.ndarray], after: list[np.ndarray]) -> None:
    assert len(before) == len(after)
    for b, a in zip(before, after):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)  # transfers are the identity: bit for bit


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_interpreter_unchanged_on_examples(path: Path) -> None:
    module = gir.parse(shrunk(path.read_text()), filename=path.name)
    PassManager(DEFAULT_PIPELINE).run(module)
    inputs = {name: random_inputs(f, 3) for name, f in module.functions.items()}
    before = {name: gir.interpret(module, name, *args) for name, args in inputs.items()}
    for options in ["policy=aggressive,min-elements=1", "policy=lift,min-elements=1", "policy=lift,min-elements=20"]:
        placed = gir.parse(str(module))
        place(placed, f"place{{{options}}}")
        assert any(op.name == "transfer" for op in placed.walk())
        for name, args in inputs.items():
            assert_same(before[name], gir.interpret(placed, name, *args))


def test_interpreter_unchanged_on_full_size_rnn() -> None:
    module = gir.load(str(EXAMPLES[0].parent / "rnn.gir"))
    PassManager(DEFAULT_PIPELINE).run(module)
    args = random_inputs(module.functions["rnn_grads"], 0)
    before = gir.interpret(module, "rnn_grads", *args)
    place(module, "place")
    assert_same(before, gir.interpret(module, "rnn_grads", *args))


class ProgramGen:
    """A random SSA program for placement: big (8x8) and small values, scalars, GEMMs (some on
    integers), reductions, transposes, scans (nested, reading outer values, some calling a
    function, so they cannot go to the GPU), transfers written in the input (round trips,
    chains) and ops pinned to a device."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.args: list[tuple[str, tuple[int, ...], str]] = []
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    @staticmethod
    def ty(shape: tuple[int, ...], dtype: str = "f64") -> str:
        return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"

    def arg(self, pool: list, shape: tuple[int, ...], dtype: str = "f64") -> tuple[str, tuple[int, ...], str]:
        v = (f"%a{len(self.args)}", shape, dtype)
        self.args.append(v)
        pool.append(v)
        return v

    def pick(self, pool: list, shape: tuple[int, ...] | None = None, dtype: str = "f64"):  # noqa: ANN201
        options = [v for v in pool if v[2] == dtype and (shape is None or v[1] == shape)]
        if options and self.rng.random() < 0.85:
            return self.rng.choice(options)
        return self.arg(pool, shape if shape is not None else self.rng.choice([(), (8,), (8, 8)]), dtype)

    def emit(self, pool: list, lines: list, pad: str, rhs: str, shape: tuple[int, ...], dtype: str = "f64",
             attrs: str = "") -> tuple[str, tuple[int, ...], str]:
        v = (self.fresh(), shape, dtype)
        lines.append(f"{pad}{v[0]} = {rhs}{attrs} : {self.ty(shape, dtype)}")
        pool.append(v)
        return v

    def op(self, pool: list, lines: list, depth: int) -> None:
        pad = "  " * (depth + 1)
        kind = self.rng.choice(["unary", "binary", "binary", "matmul", "matmul", "reduce", "transpose", "int",
                                "constant", "scan", "scan", "transfer", "pin", "call"])
        if kind in ("scan",) and depth >= 2:
            kind = "unary"
        if kind in ("transfer", "pin") and depth > 0:
            kind = "binary"
        if kind == "unary":
            a = self.pick(pool)
            self.emit(pool, lines, pad, f"{self.rng.choice(['tanh', 'neg', 'abs', 'sigmoid'])} {a[0]}", a[1])
        elif kind == "binary":
            a = self.pick(pool)
            b = self.pick(pool, self.rng.choice([a[1], ()]))
            self.emit(pool, lines, pad, f"{self.rng.choice(['add', 'mul', 'sub', 'max'])} {a[0]}, {b[0]}", a[1])
        elif kind == "matmul":
            a, b = self.pick(pool, (8, 8)), self.pick(pool, (8, 8))
            self.emit(pool, lines, pad, f"matmul {a[0]}, {b[0]}", (8, 8))
        elif kind == "reduce":
            a = self.pick(pool, self.rng.choice([(8,), (8, 8)]))
            self.emit(pool, lines, pad, f"{self.rng.choice(['sum', 'reduce_max'])} {a[0]}", ())
        elif kind == "transpose":
            a = self.pick(pool, (8, 8))
            self.emit(pool, lines, pad, f"transpose {a[0]}", (8, 8))
        elif kind == "int":
            a = self.pick(pool, (8, 8), "i32")
            self.emit(pool, lines, pad, f"{self.rng.choice(['matmul', 'add'])} {a[0]}, {a[0]}", (8, 8), "i32")
        elif kind == "constant":
            shape = self.rng.choice([(), (8, 8)])
            self.emit(pool, lines, pad, f"constant {self.rng.choice(['0.5', '-1.0'])}", shape)
        elif kind == "call":
            a = self.pick(pool, (8, 8))
            self.emit(pool, lines, pad, f"call @g({a[0]})", (8, 8))
        elif kind == "transfer":
            a = self.pick(pool)
            v = self.emit(pool, lines, pad, f"transfer {a[0]}", a[1], attrs=f' {{device = "{self.device()}"}}')
            if self.rng.random() < 0.5:
                self.emit(pool, lines, pad, f"transfer {v[0]}", a[1], attrs=f' {{device = "{self.device()}"}}')
        elif kind == "pin":
            a = self.pick(pool)
            self.emit(pool, lines, pad, f"tanh {a[0]}", a[1], attrs=f' {{device = "{self.device()}"}}')
        else:
            self.scan(pool, lines, depth)

    def device(self) -> str:
        return self.rng.choice(["cpu", "gpu"])

    def scan(self, pool: list, lines: list, depth: int) -> None:
        pad = "  " * (depth + 1)
        seq = self.pick(pool, (3, 8, 8) if self.rng.random() < 0.5 else (3, 8))
        init = self.pick(pool, self.rng.choice([(8, 8), ()]))
        x, c = self.fresh(), self.fresh()
        body_pool = list(pool) + [(x, seq[1][1:], "f64"), (c, init[1], "f64")]
        body: list[str] = []
        for _ in range(self.rng.randint(1, 4)):
            self.op(body_pool, body, depth + 1)
        last = body_pool[-1]
        fits = last[1] in (init[1], ()) and last[2] == "f64"
        nxt = self.emit(body_pool, body, pad + "  ", f"add {c}, {last[0] if fits else c}", init[1])
        nxt = self.emit(body_pool, body, pad + "  ", f"tanh {nxt[0]}", init[1])
        h, ys = self.fresh(), self.fresh()
        lines.append(f"{pad}{h}, {ys} = scan ({x} in {seq[0]}) carry ({c} = {init[0]}) {{")
        lines += body
        lines.append(f"{pad}  yield ({nxt[0]}) stack ({last[0]})")
        lines.append(f"{pad}}} : {self.ty(init[1])}, {self.ty((3,) + last[1], last[2])}")
        pool += [(h, init[1], "f64"), (ys, (3,) + last[1], last[2])]

    def program(self) -> str:
        pool: list = []
        self.arg(pool, (8, 8))
        lines: list[str] = []
        for _ in range(self.rng.randint(3, 10)):
            self.op(pool, lines, 0)
        outs = [v for v in pool if not v[0].startswith("%a")][-3:] or pool[-1:]
        sig = ", ".join(f"{name}: {self.ty(shape, dtype)}" for name, shape, dtype in self.args)
        results = ", ".join(self.ty(s, d) for _, s, d in outs)
        return ("func @g(%p: tensor<8x8xf64>) -> tensor<8x8xf64> {\n  %q = tanh %p : tensor<8x8xf64>\n"
                "  return %q\n}\n\n"
                f"func @f({sig}) -> ({results}) {{\n" + "\n".join(lines)
                + f"\n  return {', '.join(v[0] for v in outs)}\n}}\n")


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, str]:
    text = ProgramGen(draw(st.integers(0, 2**32 - 1))).program()
    policy = draw(st.sampled_from(["aggressive", "lift"]))
    return text, f"place{{policy={policy},min-elements={draw(st.sampled_from([0, 1, 8, 9, 64, 65]))}}}"


@settings(max_examples=120, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_generated_programs(program: tuple[str, str]) -> None:
    text, pipeline = program
    note(text)
    note(pipeline)
    module = gir.parse(text)
    args = random_inputs(module.functions["f"], 0)
    before = gir.interpret(module, "f", *args)
    place(module, pipeline)  # verifies the IR after the pass
    check_placement(module)
    assert_same(before, gir.interpret(module, "f", *args))
    printed = str(module)
    again = gir.parse(printed)
    _, _, changed = place(again, "place{policy=lift,min-elements=1}")
    assert not changed and str(again) == printed


# ---------------------------------------------------------------------------------------------
# The report


def test_placement_report_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "island.gir"
    source.write_text(ISLAND)
    assert gir.cli.main(["opt", str(source), "-p", "place", "--placement-report"]) == 0
    out, err = capsys.readouterr()
    assert 'matmul %x_gpu, %w_gpu {device = "gpu"}' in out
    lines = err.splitlines()
    assert lines[0] == "placement of @f (policy=lift, min-elements=1024)"
    assert re.fullmatch(r"  cpu  %e = exp +policy lift: no input or consumer on the GPU", lines[3])
    assert re.fullmatch(r"  gpu  %x_gpu = transfer %x +boundary: %x lives on the cpu, 'matmul' reads it on the gpu",
                        lines[1])
    assert lines[-1] == ("  2 ops on the gpu, 2 on the cpu; 3 transfers (2 to the gpu, 1 to the cpu); "
                         "inserted 3, removed 0")
    assert gir.cli.main(["opt", str(source), "-p", "canonicalize", "--placement-report"]) == 0
    assert "the pipeline has no 'place' pass" in capsys.readouterr().err


def test_statistics_count_ops_and_transfers() -> None:
    module = gir.parse(ISLAND)
    report = PassManager("place{policy=aggressive}").run(module)
    counters = report.records[0].stats.counters
    assert counters == {"ops on the cpu": 0, "ops on the gpu": 4, "transfers": 5, "transfers inserted": 5,
                        "transfers removed": 0}
