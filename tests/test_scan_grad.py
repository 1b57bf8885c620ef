"""The `scan-grad` pass (transforms/scan_grad.py): accumulation push-out, input-projection hoisting
and GEMM merging, tested by counting what it did to the IR and by running the interpreter on
the same inputs before and after.

Terms. A *step body* is the region of a `scan`; the *forward* scan of a `*_grads` function is
the one that runs t = 0 .. T-1, the *backward* scan is the `reverse` one that autodiff builds.
An *accumulation* is a carry updated as `acc + A_t @ B_t`; it is *pushed out* when the pass
replaces it by one GEMM after the loop.

- Structure, counted on the IR after DEFAULT_PIPELINE: the matmuls per step of the forward and
  backward bodies of examples/rnn.gir, gru.gir and lstm.gir, and of a gated cell written here
  whose third product depends on a gate, `(r * h) @ U_n`; that weight gradients are GEMMs
  after the loop (no weight-shaped carry in the backward scan).
- Numerics: every function of every example (float32 as written, and float64 by rewriting the
  dtype, the recurrent ones at a smaller size) agrees with and without scan-grad;
  hypothesis-generated SSA programs with accumulations of many forms (operands from sequences,
  computed per step, other carries, shifted forward stacks; transposed or not; either order;
  several per body) agree before and after the pass, and the forms that must not be
  rewritten (accumulator read in the loop, its per-step value stacked, an operand that depends
  on it) are left in the loop.
- Options and reports: `scan-grad{max-extra-bytes=N}` and the counters and notes of
  `--timing` / `--stats-json`.
- Hoisting and merging on small hand-written scans.

Tests marked xfail(strict=True) document bugs found while writing these tests; their reasons
start with "BUG:".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.ir.core import Function, Module, Operation, Value
from gir.ir.interpreter import random_inputs
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE, split_pipeline
from gir.transforms.loops import scan_parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

WITHOUT_SCAN_GRAD = ",".join(p for p in split_pipeline(DEFAULT_PIPELINE) if not p.startswith("scan-grad"))
"""DEFAULT_PIPELINE with both scan-grad entries removed: the baseline."""

TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
"""Largest |after - before| allowed, relative to the largest magnitude of `before`."""


def test_baseline_pipeline_is_the_default_without_scan_grad():
    passes = split_pipeline(DEFAULT_PIPELINE)
    assert passes.count("scan-grad") == 2
    assert split_pipeline(WITHOUT_SCAN_GRAD) == [p for p in passes if p != "scan-grad"]


# ---------------------------------------------------------------------------------------------
# Helpers


@dataclass
class Optimized:
    module: Module
    counters: dict[str, int]
    """Counters of every scan-grad entry of the pipeline, summed."""
    notes: list[str]


def optimize(text: str, pipeline: str) -> Optimized:
    module = gir.parse(text)
    report = PassManager(pipeline).run(module).as_dict()
    counters: dict[str, int] = {}
    notes: list[str] = []
    for record in report["passes"]:
        if record["pass"] != "scan-grad":
            continue
        for name, n in record["counters"].items():
            counters[name] = counters.get(name, 0) + n
        notes += record["notes"]
    return Optimized(module, counters, notes)


SHRINK = {"50x32x256": "10x8x32", "32x256": "8x32", "256x256": "32x32", "256xf": "32xf"}
"""T=50, batch 32, hidden 256 -> 10, 8, 32: the float64 variants of the recurrent examples."""


@cache
def example(name: str, pipeline: str = DEFAULT_PIPELINE, dtype: str = "f32") -> Optimized:
    """examples/NAME.gir after `pipeline` (cached: tests only read the result). As written in
    float32; in float64 with every dtype rewritten, and the recurrent ones at a smaller size."""
    text = (EXAMPLES / f"{name}.gir").read_text(encoding="utf-8")
    if dtype != "f32":
        text = text.replace("f32>", f"{dtype}>")
        if name != "mlp":
            for big, small in SHRINK.items():
                text = text.replace(big, small)
    return optimize(text, pipeline)


def top_scans(f: Function) -> list[Operation]:
    return [op for op in f.body if op.name == "scan"]


def forward_scan(f: Function) -> Operation:
    scans = [op for op in top_scans(f) if not op.attrs["reverse"]]
    assert len(scans) == 1, f"@{f.name} has {len(scans)} forward scans"
    return scans[0]


def backward_scan(f: Function) -> Operation:
    scans = [op for op in top_scans(f) if op.attrs["reverse"]]
    assert len(scans) == 1, f"@{f.name} has {len(scans)} backward scans"
    return scans[0]


def count(scan: Operation, name: str) -> int:
    """Ops `name` run per step of `scan` (nested regions included)."""
    return sum(1 for op in scan.body.walk() if op.name == name)


def defining(v: Value) -> Operation | None:
    return getattr(v, "op", None)


def producers(v: Value) -> list[Operation]:
    """The ops v is computed from, walking operands back; scans are included, not entered."""
    out: list[Operation] = []
    seen: set[Operation] = set()
    todo = [v]
    while todo:
        op = defining(todo.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        out.append(op)
        if op.name != "scan":
            todo.extend(op.operands)
    return out


def returned(f: Function) -> list[Value]:
    term = f.body.terminator
    assert term is not None and term.name == "return"
    return list(term.operands)


def assert_close(before: list[np.ndarray], after: list[np.ndarray], what: str) -> None:
    assert len(before) == len(after), what
    for i, (want, got) in enumerate(zip(before, after)):
        assert want.shape == got.shape and want.dtype == got.dtype, f"{what} out{i}: {got.shape} {got.dtype}"
        if want.dtype.kind != "f":
            np.testing.assert_array_equal(got, want, err_msg=f"{what} out{i}")
            continue
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
        assert diff <= TOLERANCE[want.dtype] * max(scale, 1e-30), \
            f"{what} out{i}: max |after - before| = {diff:.3g}, largest |before| = {scale:.3g}"


def check_numerics(text: str, pipeline: str, seed: int = 0) -> Optimized:
    """Runs every function of `text` before and after `pipeline` on the same random inputs."""
    module = gir.parse(text)
    inputs = {name: random_inputs(f, seed) for name, f in module.functions.items()}
    before = {name: gir.interpret(module, name, *args) for name, args in inputs.items()}
    out = optimize(text, pipeline)
    for name, args in inputs.items():
        assert_close(before[name], gir.interpret(out.module, name, *args), f"@{name} after {pipeline}")
    return out


def check_against_baseline(text: str, inputs: list[np.ndarray] | None = None) -> Optimized:
    """Runs the last function of `text` after WITHOUT_SCAN_GRAD and after DEFAULT_PIPELINE
    (programs with `grad` run only after autodiff); returns the latter."""
    base = optimize(text, WITHOUT_SCAN_GRAD).module
    out = optimize(text, DEFAULT_PIPELINE)
    for name, f in base.functions.items():
        args = inputs if inputs is not None else random_inputs(f, 0)
        if inputs is None or name == list(base.functions)[-1]:
            assert_close(gir.interpret(base, name, *args), gir.interpret(out.module, name, *args), f"@{name}")
    return out


# ---------------------------------------------------------------------------------------------
# Structure of the examples after DEFAULT_PIPELINE

T, BATCH, HIDDEN = 50, 32, 256
"""The sizes of examples/rnn.gir, gru.gir and lstm.gir."""


def assert_weight_gradients_after_the_loop(f: Function, weights: list[str]) -> None:
    """Each returned gradient of a 2-D weight is computed after the loops, from a GEMM whose
    contraction runs over (almost) all T * batch rows; no weight-shaped carry is left in the
    backward scan."""
    backward = backward_scan(f)
    for c in scan_parts(backward).carries:
        t = c.arg.tensor_type
        assert t.rank != 2 or t.shape[0] == BATCH, \
            f"@{f.name}: the backward scan still accumulates a {t} carry %{c.arg.name_hint}"
    grads = returned(f)[1:]
    for name, g in zip(weights, grads[: len(weights)]):
        assert g.tensor_type.shape == (HIDDEN, HIDDEN), f"@{f.name}: d{name} is {g.tensor_type}"
        ops = producers(g)
        assert ops[0].name != "scan", f"@{f.name}: d{name} is a result of a scan"
        gemms = [op for op in ops if op.name == "matmul" and op.parent is f.body]
        contraction = max((op.operands[0].tensor_type.shape[-1] for op in gemms), default=0)
        assert contraction >= (T - 1) * BATCH, \
            f"@{f.name}: d{name} comes from no GEMM over the whole sequence (largest K {contraction})"


def test_rnn_forward_body_has_one_matmul():
    m = example("rnn").module
    for name in ("rnn_loss", "rnn_grads"):
        scan = forward_scan(m[name])
        assert count(scan, "matmul") == 1, f"@{name}"
        (mm,) = [op for op in scan.body.walk() if op.name == "matmul"]
        h = scan_parts(scan).carries[0].arg
        assert mm.operands[0] is h and mm.operands[1] is m[name].args[3], "the recurrent product h @ wh"
        # x_t @ wx is one GEMM over all steps, before the loop
        hoisted = [op for op in m[name].body if op.name == "matmul"]
        assert any(op.operands[0] is m[name].args[0] for op in hoisted)


def test_rnn_backward_body_has_one_matmul():
    f = example("rnn").module["rnn_grads"]
    scan = backward_scan(f)
    assert count(scan, "matmul") == 1
    (mm,) = [op for op in scan.body.walk() if op.name == "matmul"]
    dh = next(c for c in scan_parts(scan).carries if c.arg.name_hint == "dh")
    assert dh.yielded is mm.result, "the one product per step is the propagation dh_{t-1} = dpre_t @ wh^T"


def test_rnn_weight_gradients_are_gemms_after_the_loop():
    assert_weight_gradients_after_the_loop(example("rnn").module["rnn_grads"], ["wx", "wh"])


def test_rnn_forward_stack_of_h_is_reused_for_h_prev():
    """dwh = sum_t h_{t-1}^T @ dpre_t: h_{t-1} is the forward stack of h_t shifted by one step
    with h0 in front, so the forward scan stacks no copy of h_{t-1}, and no new stack is needed."""
    f = example("rnn").module["rnn_grads"]
    parts = scan_parts(forward_scan(f))
    args = {c.arg for c in parts.carries}
    stacked = [s.yielded for s in parts.stacks]
    assert not args & set(stacked), "the forward scan stacks a copy of h_{t-1}"
    assert parts.carries[0].yielded in stacked, "the forward scan stacks h_t"
    # the reuse costs no new memory: the push-out happens even with max-extra-bytes=0
    strict = DEFAULT_PIPELINE.rsplit("scan-grad", 1)
    out = example("rnn", "scan-grad{max-extra-bytes=0}".join(strict))
    assert out.counters == example("rnn").counters
    assert out.counters.get("scan-grad: accumulations pushed out") == 1
    assert not any("rejected" in k for k in out.counters)


@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_gated_examples_have_one_matmul_per_step(name: str):
    m = example(name).module
    f = m[f"{name}_grads"]
    assert count(forward_scan(m[f"{name}_loss"]), "matmul") == 1
    assert count(forward_scan(f), "matmul") == 1
    assert count(backward_scan(f), "matmul") == 1


@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_gated_examples_merge_the_recurrent_weights_outside_the_loop(name: str):
    f = example(name).module[f"{name}_grads"]
    (mm,) = [op for op in forward_scan(f).body.walk() if op.name == "matmul"]
    weight = defining(mm.operands[1])
    assert weight is not None and weight.name == "concat" and weight.parent is f.body
    assert all(w.name_hint.startswith("u_") for w in weight.operands)  # type: ignore[union-attr]
    (back,) = [op for op in backward_scan(f).body.walk() if op.name == "matmul"]
    assert back.operands[1] not in {v for op in backward_scan(f).body.walk() for v in op.results}, \
        "the backward product's weight is built outside the loop"


@pytest.mark.parametrize("name,weights", [
    ("gru", ["w_z", "w_r", "w_n", "u_z", "u_r", "u_n"]),
    ("lstm", ["w_i", "w_f", "w_g", "w_o", "u_i", "u_f", "u_g", "u_o"]),
])
def test_gated_weight_gradients_are_slices_of_gemms_after_the_loop(name: str, weights: list[str]):
    f = example(name).module[f"{name}_grads"]
    assert_weight_gradients_after_the_loop(f, weights)
    grads = returned(f)[1: 1 + len(weights)]
    recurrent = [g for w, g in zip(weights, grads) if w.startswith("u_")]
    sources = {defining(g).operands[0] for g in recurrent}  # type: ignore[union-attr]
    assert all(defining(g).name == "slice" for g in recurrent)  # type: ignore[union-attr]
    assert len(sources) == 1, "dU_* come back as slices of one GEMM result"


GATED_GRU = """
// A GRU whose candidate reads the reset gate *before* the product: n = tanh(x Wn + (r * h) Un + bn).
// (r * h) @ Un depends on a gate, so it cannot join h @ [Uz Ur]: 2 products per step remain.
func @gated_loss(%xs: tensor<6x4x8xDT>, %h0: tensor<4x8xDT>,
                 %w_z: tensor<8x8xDT>, %w_r: tensor<8x8xDT>, %w_n: tensor<8x8xDT>,
                 %u_z: tensor<8x8xDT>, %u_r: tensor<8x8xDT>, %u_n: tensor<8x8xDT>,
                 %b_z: tensor<8xDT>, %b_r: tensor<8xDT>, %b_n: tensor<8xDT>) -> tensor<DT> {
  %h = %h0
  %loss = constant 0.0 : tensor<DT>
  for %x in %xs {
    %z = sigmoid(%x @ %w_z + %h @ %u_z + %b_z)
    %r = sigmoid(%x @ %w_r + %h @ %u_r + %b_r)
    %n = tanh(%x @ %w_n + (%r * %h) @ %u_n + %b_n)
    %h = (1.0 - %z) * %n + %z * %h
    %loss = %loss + sum(%h * %h)
  }
  return %loss
}

func @gated_grads(%xs: tensor<6x4x8xDT>, %h0: tensor<4x8xDT>,
                  %w_z: tensor<8x8xDT>, %w_r: tensor<8x8xDT>, %w_n: tensor<8x8xDT>,
                  %u_z: tensor<8x8xDT>, %u_r: tensor<8x8xDT>, %u_n: tensor<8x8xDT>,
                  %b_z: tensor<8xDT>, %b_r: tensor<8xDT>, %b_n: tensor<8xDT>)
    -> (tensor<DT>, tensor<8x8xDT>, tensor<8x8xDT>, tensor<8x8xDT>,
        tensor<8x8xDT>, tensor<8x8xDT>, tensor<8x8xDT>) {
  %l, %dw_z, %dw_r, %dw_n, %du_z, %du_r, %du_n =
      grad @gated_loss(%xs, %h0, %w_z, %w_r, %w_n, %u_z, %u_r, %u_n, %b_z, %b_r, %b_n)
      wrt (%w_z, %w_r, %w_n, %u_z, %u_r, %u_n)
  return %l, %dw_z, %dw_r, %dw_n, %du_z, %du_r, %du_n
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_gate_dependent_product_keeps_two_matmuls_per_step(dtype: str):
    out = check_against_baseline(GATED_GRU.replace("DT", dtype))
    f = out.module["gated_grads"]
    assert count(forward_scan(out.module["gated_loss"]), "matmul") == 2
    assert count(forward_scan(f), "matmul") == 2
    assert count(backward_scan(f), "matmul") == 2
    for c in scan_parts(backward_scan(f)).carries:  # dU_n too is pushed out (a new stack of r * h)
        assert c.arg.tensor_type.shape != (8, 8), f"the backward scan still accumulates %{c.arg.name_hint}"
    assert out.counters.get("scan-grad: accumulations pushed out") == 2


def test_every_push_out_of_the_examples_is_counted():
    """The counter equals the number of weight-shaped carries the second scan-grad removed."""
    before_push_out = ",".join(split_pipeline(DEFAULT_PIPELINE)[:-2] + ["canonicalize"])
    for name in ("rnn", "gru", "lstm"):
        grads = f"{name}_grads"
        n_before = sum(1 for c in scan_parts(backward_scan(example(name, before_push_out).module[grads])).carries
                       if c.arg.tensor_type.rank == 2 and c.arg.tensor_type.shape[0] == HIDDEN)
        out = example(name)
        assert n_before >= 1
        assert out.counters.get("scan-grad: accumulations pushed out") == n_before, name
        assert not any("rejected" in k for k in out.counters), (name, out.counters)


# ---------------------------------------------------------------------------------------------
# Numerics of the examples: with and without scan-grad


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", ["rnn", "gru", "lstm", "mlp"])
def test_examples_agree_with_and_without_scan_grad(name: str, dtype: str):
    base, opt = example(name, WITHOUT_SCAN_GRAD, dtype).module, example(name, DEFAULT_PIPELINE, dtype).module
    for fname, f in base.functions.items():
        args = random_inputs(f, seed=1)
        assert_close(gir.interpret(base, fname, *args), gir.interpret(opt, fname, *args), f"{name}.gir @{fname}")


# ---------------------------------------------------------------------------------------------
# Generated programs with accumulations

SOURCES = ["seq", "computed", "carry", "carry-next", "shifted"]
"""Where an operand of an accumulated product comes from:
seq: a sequence element; computed: tanh of a sequence element; carry: another carry's value at
the start of the step (h_{t-1}); carry-next: its value at the end of the step (h_t);
shifted: the element of a forward scan's stack of its carry *input* (h_{t-1} in a later loop,
which the pass rebuilds from the stack of h_t)."""

KINDS = ["ok", "read-elsewhere", "stacked", "operand-depends"]
"""ok: must be pushed out; the others must stay in the loop: the accumulator read elsewhere in
the body, its per-step value stacked (and the stack returned), an operand computed from it."""


@dataclass
class Accumulation:
    kind: str
    m: int
    k: int
    n: int
    a: str
    a_transposed: bool
    b: str
    b_transposed: bool
    acc_first: bool
    """`add %acc, %p` or `add %p, %acc`."""


@dataclass
class Program:
    """Text of `@f`: one scan (`reverse` or not) with the accumulations in its body, plus the
    forward scans that `shifted` operands come from."""

    dtype: str
    steps: int
    reverse: bool
    accumulations: list[Accumulation]
    params: list[str] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)
    sequences: list[str] = field(default_factory=list)
    carries: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(block argument, initial value, yielded value, type)"""
    body: list[str] = field(default_factory=list)
    stacks: list[tuple[str, str]] = field(default_factory=list)

    def ty(self, shape: tuple[int, ...]) -> str:
        return "tensor<" + "".join(f"{d}x" for d in shape) + f"{self.dtype}>"

    def param(self, name: str, shape: tuple[int, ...]) -> str:
        self.params.append(f"%{name}: {self.ty(shape)}")
        return f"%{name}"

    def operand(self, name: str, source: str, shape: tuple[int, int]) -> str:
        """Defines a per-step value of `shape` from `source`; returns its name."""
        t, seq_t = self.ty(shape), self.ty((self.steps,) + shape)
        if source == "seq":
            self.param(f"{name}s", (self.steps,) + shape)
            self.sequences.append(f"%{name} in %{name}s")
            return f"%{name}"
        if source == "computed":
            self.param(f"{name}xs", (self.steps,) + shape)
            self.sequences.append(f"%{name}x in %{name}xs")
            self.body.append(f"%{name} = tanh %{name}x : {t}")
            return f"%{name}"
        if source in ("carry", "carry-next"):
            init = self.param(f"{name}0", shape)
            self.param(f"{name}us", (self.steps,) + shape)
            self.sequences.append(f"%{name}u in %{name}us")
            self.body += [f"%{name}.s = add %{name}, %{name}u : {t}", f"%{name}.n = tanh %{name}.s : {t}"]
            self.carries.append((f"%{name}", init, f"%{name}.n", t))
            return f"%{name}" if source == "carry" else f"%{name}.n"
        assert source == "shifted"
        init = self.param(f"{name}0", shape)
        us = self.param(f"{name}us", (self.steps,) + shape)
        self.pre += [
            f"%{name}T, %{name}prev, %{name}next = scan (%{name}u in {us}) carry (%{name}g = {init}) {{",
            f"  %{name}gs = add %{name}g, %{name}u : {t}",
            f"  %{name}gn = tanh %{name}gs : {t}",
            f"  yield (%{name}gn) stack (%{name}g, %{name}gn)",
            f"}} : {t}, {seq_t}, {seq_t}",
        ]
        self.sequences.append(f"%{name} in %{name}prev")
        return f"%{name}"

    def transposed(self, v: str, shape: tuple[int, int]) -> str:
        out = f"{v}.t"
        self.body.append(f"{out} = transpose {v} : {self.ty((shape[1], shape[0]))}")
        return out

    def text(self) -> str:
        loss_t = self.ty(())
        self.param("l0", ())
        self.param("ls", (self.steps, 2))
        self.sequences.append("%lx in %ls")
        self.body += [f"%lsum = sum %lx : {loss_t}", f"%l.0 = add %l, %lsum : {loss_t}"]
        loss = "%l.0"
        products = []
        for i, acc in enumerate(self.accumulations):
            a_shape = (acc.k, acc.m) if acc.a_transposed else (acc.m, acc.k)
            b_shape = (acc.n, acc.k) if acc.b_transposed else (acc.k, acc.n)
            acc_t = self.ty((acc.m, acc.n))
            if acc.kind == "operand-depends":
                a = f"%a{i}"
                self.body.append(f"{a} = tanh %acc{i} : {acc_t}")  # k == n
            else:
                a = self.operand(f"a{i}", acc.a, a_shape)
                if acc.a_transposed:
                    a = self.transposed(a, a_shape)
            b = self.operand(f"b{i}", acc.b, b_shape)
            if acc.b_transposed:
                b = self.transposed(b, b_shape)
            init = self.param(f"acc{i}0", (acc.m, acc.n))
            self.carries.append((f"%acc{i}", init, f"%acc{i}.1", acc_t))
            operands = f"%acc{i}, %p{i}" if acc.acc_first else f"%p{i}, %acc{i}"
            products += [f"%p{i} = matmul {a}, {b} : {acc_t}", f"%acc{i}.1 = add {operands} : {acc_t}"]
            if acc.kind == "read-elsewhere":
                products += [f"%r{i} = sum %acc{i} : {loss_t}", f"%l.{i + 1} = add {loss}, %r{i} : {loss_t}"]
                loss = f"%l.{i + 1}"
            if acc.kind == "stacked":
                self.stacks.append((f"%acc{i}.1", self.ty((self.steps, acc.m, acc.n))))
        self.body += products
        self.carries.append(("%l", "%l0", loss, loss_t))
        results = [f"%res{i}" for i in range(len(self.carries))] + [f"%st{i}" for i in range(len(self.stacks))]
        types = [c[3] for c in self.carries] + [s[1] for s in self.stacks]
        header = (f"{', '.join(results)} = scan {'reverse ' if self.reverse else ''}"
                  f"({', '.join(self.sequences)}) carry ({', '.join(f'{c[0]} = {c[1]}' for c in self.carries)}) {{")
        stack = f" stack ({', '.join(s[0] for s in self.stacks)})" if self.stacks else ""
        lines = [f"func @f({', '.join(self.params)}) -> ({', '.join(types)}) {{", *("  " + s for s in self.pre),
                 "  " + header, *("    " + s for s in self.body),
                 f"    yield ({', '.join(c[2] for c in self.carries)}){stack}",
                 f"  }} : {', '.join(types)}", f"  return {', '.join(results)}", "}"]
        return "\n".join(lines) + "\n"


@st.composite
def accumulations(draw: st.DrawFn, kinds: list[str]) -> Accumulation:
    kind = draw(st.sampled_from(kinds))
    m, k, n = (draw(st.integers(1, 3)) for _ in range(3))
    a, b = draw(st.sampled_from(SOURCES)), draw(st.sampled_from(SOURCES))
    if a == b == "shifted":
        b = "seq"  # both operands h_{t-1}-like: see test_push_out_rejections_are_counted
    if kind == "operand-depends":
        k = n
    return Accumulation(kind, m, k, n, a, draw(st.booleans()), b, draw(st.booleans()), draw(st.booleans()))


@st.composite
def programs(draw: st.DrawFn, kinds: list[str]) -> Program:
    return Program(draw(st.sampled_from(["f32", "f64"])), draw(st.integers(1, 4)), draw(st.booleans()),
                   draw(st.lists(accumulations(kinds), min_size=1, max_size=3)))


def main_scan(f: Function) -> Operation:
    return top_scans(f)[-1]


def accumulations_left(scan: Operation) -> int:
    """Carries still updated in the body as `acc + matmul` (either order)."""
    n = 0
    for c in scan_parts(scan).carries:
        update = defining(c.yielded)
        if update is None or update.name != "add" or c.arg not in update.operands:
            continue
        other = update.operands[1] if update.operands[0] is c.arg else update.operands[0]
        n += getattr(defining(other), "name", None) == "matmul"
    return n


def check_program(program: Program, seed: int) -> None:
    text = program.text()
    out = check_numerics(text, "scan-grad,canonicalize", seed)
    ok = sum(acc.kind == "ok" for acc in program.accumulations)
    left = len(program.accumulations) - ok
    scan = main_scan(out.module["f"])
    where = f"\n{text}\nafter:\n{out.module}\ncounters: {out.counters}"
    assert out.counters.get("scan-grad: accumulations pushed out", 0) == ok, where
    assert accumulations_left(scan) == left, where
    assert count(scan, "matmul") == left, where
    stacked = sum(acc.kind == "stacked" for acc in program.accumulations)
    assert out.counters.get("scan-grad: rejected (accumulator value also stacked or used in the loop)", 0) == stacked


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(programs(["ok"]), st.integers(0, 3))
def test_generated_accumulations_are_pushed_out(program: Program, seed: int):
    check_program(program, seed)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(programs(KINDS), st.integers(0, 3))
def test_generated_accumulations_mixed_with_forms_that_must_stay(program: Program, seed: int):
    check_program(program, seed)


def _one(kind: str, a: str = "seq", b: str = "seq", a_t: bool = True, b_t: bool = False, steps: int = 5,
         dtype: str = "f64") -> Program:
    return Program(dtype, steps, False, [Accumulation(kind, 3, 3, 3, a, a_t, b, b_t, True)])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("a,b", [("seq", "seq"), ("computed", "carry"), ("shifted", "seq"), ("seq", "shifted"),
                                 ("carry-next", "shifted")])
def test_push_out_forms(a: str, b: str, a_t: bool, b_t: bool, dtype: str):
    """acc + A_t @ B_t with A or B transposed, reused from a sequence, a forward stack shifted
    by one step, or a new stack."""
    program = Program(dtype, 5, False, [Accumulation("ok", 2, 3, 4, a, a_t, b, b_t, False)])
    check_program(program, seed=0)


def test_several_accumulations_in_one_body():
    program = Program("f64", 4, True, [Accumulation("ok", 2, 3, 4, "seq", True, "computed", False, True),
                                       Accumulation("ok", 3, 2, 2, "carry", False, "seq", True, False),
                                       Accumulation("ok", 4, 4, 1, "shifted", True, "seq", False, True)])
    check_program(program, seed=2)


@pytest.mark.parametrize("kind", ["read-elsewhere", "stacked", "operand-depends"])
def test_forms_that_must_stay_in_the_loop(kind: str):
    """The scan is left as it is: the accumulation add and its matmul are still in the body."""
    program = _one(kind)
    text = program.text()
    out = check_numerics(text, "scan-grad,canonicalize")
    scan = main_scan(out.module["f"])
    assert accumulations_left(scan) == 1
    assert count(scan, "matmul") == 1
    assert "scan-grad: accumulations pushed out" not in out.counters
    assert str(out.module) == str(optimize(text, "canonicalize").module), "scan-grad changed the program"


TWO_SHIFTED = """
func @f(%us: tensor<4x3x3xf64>, %g0: tensor<3x3xf64>, %w0: tensor<3x3xf64>) -> tensor<3x3xf64> {
  %gT, %gprev, %gnext = scan (%u in %us) carry (%g = %g0) {
    %gs = add %g, %u : tensor<3x3xf64>
    %gn = tanh %gs : tensor<3x3xf64>
    yield (%gn) stack (%g, %gn)
  } : tensor<3x3xf64>, tensor<4x3x3xf64>, tensor<4x3x3xf64>
  %w.1 = scan reverse (%a in %gprev) carry (%w = %w0) {
    %at = transpose %a : tensor<3x3xf64>
    %p = matmul %at, %a : tensor<3x3xf64>
    %w.2 = add %w, %p : tensor<3x3xf64>
    yield (%w.2)
  } : tensor<3x3xf64>
  return %w.1
}
"""

SHARED_PRODUCT = """
func @f(%as: tensor<4x3x3xf64>, %bs: tensor<4x3x3xf64>, %w0: tensor<3x3xf64>, %v0: tensor<3x3xf64>)
    -> (tensor<3x3xf64>, tensor<3x3xf64>) {
  %w.1, %v.1 = scan (%a in %as, %b in %bs) carry (%w = %w0, %v = %v0) {
    %p = matmul %a, %b : tensor<3x3xf64>
    %w.2 = add %w, %p : tensor<3x3xf64>
    %v.2 = add %p, %v : tensor<3x3xf64>
    yield (%w.2, %v.2)
  } : tensor<3x3xf64>, tensor<3x3xf64>
  return %w.1, %v.1
}
"""

INVARIANT_OPERAND = """
func @f(%xs: tensor<4x3x3xf64>, %h0: tensor<3x3xf64>, %w: tensor<3x3xf64>, %acc0: tensor<3x3xf64>)
    -> (tensor<3x3xf64>, tensor<3x3xf64>) {
  %h.1, %acc.1 = scan (%x in %xs) carry (%h = %h0, %acc = %acc0) {
    %s = add %h, %x : tensor<3x3xf64>
    %h.2 = tanh %s : tensor<3x3xf64>
    %p = matmul %h.2, %w : tensor<3x3xf64>
    %acc.2 = add %acc, %p : tensor<3x3xf64>
    yield (%h.2, %acc.2)
  } : tensor<3x3xf64>, tensor<3x3xf64>
  return %h.1, %acc.1
}
"""

@pytest.mark.parametrize("text", [
    pytest.param(_one("stacked").text(), id="stacked"),
    pytest.param(INVARIANT_OPERAND, id="invariant-operand"),
    pytest.param(_one("read-elsewhere").text(), id="read-elsewhere"),
    pytest.param(_one("operand-depends").text(), id="operand-depends"),
    pytest.param(SHARED_PRODUCT, id="product-shared-by-two-accumulators"),
    pytest.param(TWO_SHIFTED, id="both-operands-shifted"),
])
def test_push_out_rejections_are_counted(text: str):
    """Every carry updated as `acc + A @ B` is either pushed out or counted as rejected, with a
    counter whose name says why (issue 5, deliverable 4)."""
    out = check_numerics(text, "scan-grad,canonicalize")
    pushed = out.counters.get("scan-grad: accumulations pushed out", 0)
    rejected = sum(n for name, n in out.counters.items() if "rejected" in name)
    candidates = sum(accumulations_left(s) for s in top_scans(gir.parse(text)["f"]))
    assert pushed + rejected == candidates, out.counters


# ---------------------------------------------------------------------------------------------
# max-extra-bytes, --timing and --stats-json

NEEDS_NEW_STACKS = _one("ok", a="computed", b="computed", a_t=False, steps=5).text()
"""acc + tanh(a_t) @ tanh(b_t): pushing it out needs two new (5, 3, 3) f64 stacks, 720 bytes."""


@pytest.mark.parametrize("limit,pushed", [(0, False), (719, False), (720, True)])
def test_max_extra_bytes_limits_new_stacks(limit: int, pushed: bool):
    out = check_numerics(NEEDS_NEW_STACKS, f"scan-grad{{max-extra-bytes={limit}}},canonicalize")
    scan = main_scan(out.module["f"])
    if pushed:
        assert out.counters == {"scan-grad: accumulations pushed out": 1}
        assert out.notes == []
        assert count(scan, "matmul") == 0
        return
    assert out.counters == {"scan-grad: rejected (max-extra-bytes)": 1}
    (note,) = out.notes
    assert "720 new bytes" in note and f"max-extra-bytes={limit}" in note
    assert accumulations_left(scan) == 1 and count(scan, "matmul") == 1
    assert len(scan_parts(scan).stacks) == 0, "a rejected candidate adds no stack"


def test_max_extra_bytes_in_timing_and_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """GRU: dU = sum_t h_{t-1}^T @ [dz dr dn]_t needs a new stack of the merged gradient
    (50 x 32 x 768 float32 = 4915200 bytes): with max-extra-bytes=0 it stays in the loop, and
    the reports say so."""
    passes = split_pipeline(DEFAULT_PIPELINE)
    passes[passes.index("scan-grad", passes.index("autodiff"))] = "scan-grad{max-extra-bytes=0}"
    stats, ir = tmp_path / "stats.json", tmp_path / "out.gir"
    code = gir.cli.main(["opt", str(EXAMPLES / "gru.gir"), "-p", ",".join(passes), "--timing",
                         "--stats-json", str(stats), "-o", str(ir)])
    assert code == 0
    timing = capsys.readouterr().err
    assert "scan-grad{max-extra-bytes=0}" in timing
    assert "scan-grad: rejected (max-extra-bytes): 1" in timing
    assert "note: push-out of" in timing and "4915200 new bytes" in timing
    (record,) = [r for r in json.loads(stats.read_text())["passes"] if r["spec"] == "scan-grad{max-extra-bytes=0}"]
    assert record["counters"] == {"scan-grad: rejected (max-extra-bytes)": 1}
    (note,) = record["notes"]
    assert "4915200 new bytes" in note and "max-extra-bytes=0" in note and "gru.gir" in note
    f = gir.load(str(ir))["gru_grads"]
    assert count(backward_scan(f), "matmul") == 2, "propagation + the accumulation left in the loop"
    assert count(forward_scan(f), "matmul") == 1


# ---------------------------------------------------------------------------------------------
# Input-projection hoisting

HOIST = """
func @f(%xs: tensor<5x3x4xDT>, %w: tensor<4x6xDT>, %v: tensor<2x3xDT>, %h0: tensor<3x6xDT>)
    -> (tensor<3x6xDT>, tensor<5x2x4xDT>) {
  %h.1, %ys = scan REVERSE (%x in %xs) carry (%h = %h0) {
    %p = matmul %x, %w : tensor<3x6xDT>
    %q = add %h, %p : tensor<3x6xDT>
    %h.2 = tanh %q : tensor<3x6xDT>
    %y = matmul %v, %x : tensor<2x4xDT>
    %y.1 = tanh %y : tensor<2x4xDT>
    yield (%h.2) stack (%y.1)
  } : tensor<3x6xDT>, tensor<5x2x4xDT>
  return %h.1, %ys
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_input_projections_are_hoisted(reverse: bool, dtype: str):
    """x_t @ W and V @ x_t (W, V invariant) become one GEMM each over xs, before the loop,
    fed to the scan as new sequences."""
    text = HOIST.replace("DT", dtype).replace("REVERSE", "reverse" if reverse else "")
    out = check_numerics(text, "scan-grad")
    f = out.module["f"]
    (scan,) = top_scans(f)
    assert count(scan, "matmul") == 0
    assert out.counters == {"scan-grad: input projections hoisted": 2}
    xs, w, v = f.args[0], f.args[1], f.args[2]
    gemms = [op for op in f.body if op.name == "matmul"]
    assert {tuple(op.operands) for op in gemms} == {(xs, w), (v, xs)}
    sequences = scan.group("sequences")
    assert all(op.result in sequences for op in gemms), "the projections are fed to the scan as sequences"
    assert [op.result.tensor_type.shape for op in gemms] == [(5, 3, 6), (5, 2, 4)]


def test_products_with_the_carry_are_not_hoisted():
    text = HOIST.replace("DT", "f64").replace("REVERSE", "").replace("%p = matmul %x, %w", "%p = matmul %h, %w2")
    text = text.replace("%h0: tensor<3x6xf64>)", "%h0: tensor<3x6xf64>, %w2: tensor<6x6xf64>)")
    out = check_numerics(text, "scan-grad")
    (scan,) = top_scans(out.module["f"])
    assert count(scan, "matmul") == 1
    assert out.counters == {"scan-grad: input projections hoisted": 1}


@pytest.mark.xfail(strict=True, reason="BUG: issue 5 deliverable 2 (products of per-step values that do not "
                                       "depend on the carry, in backward scans) is not implemented")
def test_per_step_products_independent_of_the_carry_are_hoisted():
    """tanh(x_t) @ W in a reverse scan does not depend on the carry: one GEMM before the loop."""
    text = HOIST.replace("DT", "f64").replace("REVERSE", "reverse")
    text = text.replace("%p = matmul %x, %w", "%xx = tanh %x : tensor<3x4xf64>\n    %p = matmul %xx, %w")
    out = check_numerics(text, "scan-grad")
    (scan,) = top_scans(out.module["f"])
    assert count(scan, "matmul") == 0


YIELDED_PROJECTION = """
func @f(%xs: tensor<5x3x4xf64>, %w: tensor<4x6xf64>, %c0: tensor<3x6xf64>) -> (tensor<3x6xf64>, tensor<5x3x6xf64>) {
  %c.1, %ys = scan (%x in %xs) carry (%c = %c0) {
    %p = matmul %x, %w : tensor<3x6xf64>
    %y = matmul %x, %w : tensor<3x6xf64>
    yield (%p) stack (%y)
  } : tensor<3x6xf64>, tensor<5x3x6xf64>
  return %c.1, %ys
}
"""


def test_hoisting_a_yielded_product():
    out = check_numerics(YIELDED_PROJECTION, "scan-grad")
    (scan,) = top_scans(out.module["f"])
    assert count(scan, "matmul") == 0


# ---------------------------------------------------------------------------------------------
# GEMM merging

SHARED_LEFT = """
func @f(%xs: tensor<5x3x4xf64>, %u: tensor<4x4xf64>, %v: tensor<4x4xf64>, %k: tensor<4x2xf64>,
        %h0: tensor<3x4xf64>) -> (tensor<3x4xf64>, tensor<5x3x2xf64>) {
  %h.1, %ks = scan (%x in %xs) carry (%h = %h0) {
    %p = matmul %h, %u : tensor<3x4xf64>
    %q = matmul %h, %v : tensor<3x4xf64>
    %r = matmul %h, %k : tensor<3x2xf64>
    %s = tanh %p : tensor<3x4xf64>
    %g = sigmoid %q : tensor<3x4xf64>
    %t = mul %s, %g : tensor<3x4xf64>
    %h.2 = add %t, %x : tensor<3x4xf64>
    yield (%h.2) stack (%r)
  } : tensor<3x4xf64>, tensor<5x3x2xf64>
  return %h.1, %ks
}
"""


def test_products_sharing_the_left_operand_are_merged():
    """h @ U, h @ V, h @ K -> slices of h @ concat(U, V, K), the concat built before the loop."""
    out = check_numerics(SHARED_LEFT, "scan-grad")
    f = out.module["f"]
    (scan,) = top_scans(f)
    assert count(scan, "matmul") == 1
    assert out.counters == {"scan-grad: products merged (shared operand)": 3}
    (mm,) = [op for op in scan.body.walk() if op.name == "matmul"]
    weight = defining(mm.operands[1])
    assert weight is not None and weight.name == "concat" and weight.parent is f.body
    assert list(weight.operands) == f.args[1:4] and weight.attrs["axis"] == 1
    assert mm.result.tensor_type.shape == (3, 10)
    assert sorted(op.name for op in mm.result.users) == ["slice"] * 3


def test_products_with_a_per_step_weight_are_not_merged():
    text = SHARED_LEFT.replace("%q = matmul %h, %v", "%xr = sum %x {axes = [0], keepdims = true} : tensor<1x4xf64>\n"
                                                        "    %vx = add %v, %xr : tensor<4x4xf64>\n"
                                                        "    %q = matmul %h, %vx")
    out = check_numerics(text, "scan-grad")
    (scan,) = top_scans(out.module["f"])
    assert count(scan, "matmul") == 3
    assert out.counters == {}


SUM_OF_PRODUCTS = """
func @f(%xs: tensor<5x3x4xf64>, %u: tensor<4x5xf64>, %v: tensor<2x5xf64>, %h0: tensor<3x4xf64>,
        %g0: tensor<3x2xf64>) -> (tensor<3x4xf64>, tensor<5x3x5xf64>) {
  %h.1, %g.1, %ys = scan reverse (%x in %xs) carry (%h = %h0, %g = %g0) {
    %a = tanh %h : tensor<3x4xf64>
    %b = sigmoid %g : tensor<3x2xf64>
    %p = matmul %a, %u : tensor<3x5xf64>
    %q = matmul %b, %v : tensor<3x5xf64>
    %y = add %p, %q : tensor<3x5xf64>
    %h.2 = add %a, %x : tensor<3x4xf64>
    %g.2 = mul %b, %b : tensor<3x2xf64>
    yield (%h.2, %g.2) stack (%y)
  } : tensor<3x4xf64>, tensor<3x2xf64>, tensor<5x3x5xf64>
  return %h.1, %ys
}
"""


def test_sum_of_products_becomes_one_gemm_over_concats():
    """a @ U + b @ V -> concat(a, b) @ concat(U, V): K axis, the weight concat before the loop."""
    out = check_numerics(SUM_OF_PRODUCTS, "scan-grad")
    f = out.module["f"]
    (scan,) = top_scans(f)
    assert count(scan, "matmul") == 1
    assert out.counters == {"scan-grad: sums of products merged": 1}
    (mm,) = [op for op in scan.body.walk() if op.name == "matmul"]
    lhs, rhs = defining(mm.operands[0]), defining(mm.operands[1])
    assert lhs is not None and lhs.name == "concat" and lhs.parent is scan.body and lhs.attrs["axis"] == 1
    assert rhs is not None and rhs.name == "concat" and rhs.parent is f.body and rhs.attrs["axis"] == 0
    assert list(rhs.operands) == [f.args[1], f.args[2]]
    assert rhs.result.tensor_type.shape == (6, 5)


# ---------------------------------------------------------------------------------------------
# Shapes the pass must handle without crashing (bugs found while writing these tests)

SMALL_RNN = """
func @rnn_loss(%xs: tensor<STEPSx4x8xf64>, %h0: tensor<4x8xf64>, %wx: tensor<8x8xf64>, %wh: tensor<8x8xf64>,
               %b: tensor<8xf64>) -> tensor<f64> {
  %h = %h0
  %loss = constant 0.0 : tensor<f64>
  for %x in %xs {
    %h = tanh(%x @ %wx + %h @ %wh + %b)
    %loss = %loss + sum(%h * %h)
  }
  return %loss
}

func @rnn_grads(%xs: tensor<STEPSx4x8xf64>, %h0: tensor<4x8xf64>, %wx: tensor<8x8xf64>, %wh: tensor<8x8xf64>,
                %b: tensor<8xf64>) -> (tensor<f64>, tensor<8x8xf64>, tensor<8x8xf64>, tensor<8xf64>) {
  %loss, %dwx, %dwh, %db = grad @rnn_loss(%xs, %h0, %wx, %wh, %b) wrt (%wx, %wh, %b)
  return %loss, %dwx, %dwh, %db
}
"""


def _rnn_inputs(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [0.3 * rng.standard_normal(s) for s in [(steps, 4, 8), (4, 8), (8, 8), (8, 8), (8,)]]


def test_small_rnn_agrees():
    check_against_baseline(SMALL_RNN.replace("STEPS", "5"), _rnn_inputs(5))


def test_dynamic_step_count_leaves_push_out_alone():
    """A `?` step count: no stack size is known, so push-out leaves the loop alone, and says so."""
    out = check_against_baseline(SMALL_RNN.replace("STEPS", "?"), _rnn_inputs(5))
    assert out.counters.get("scan-grad: rejected (loop length unknown until run time)", 0) >= 1
    assert "scan-grad: accumulations pushed out" not in out.counters
    assert count(backward_scan(out.module["rnn_grads"]), "matmul") == 2


def test_zero_steps():
    check_against_baseline(SMALL_RNN.replace("STEPS", "0"), _rnn_inputs(0))


def test_dynamic_step_count_gru():
    text = (EXAMPLES / "gru.gir").read_text(encoding="utf-8").replace("50x32x256", "?x32x256")
    PassManager(DEFAULT_PIPELINE).run(gir.parse(text))


DYNAMIC_ACCUMULATION = """
func @f(%as: tensor<SHAPE_Axf64>, %bs: tensor<SHAPE_Bxf64>, %w0: tensor<4x5xf64>) -> tensor<4x5xf64> {
  %w.1 = scan (%a in %as, %b in %bs) carry (%w = %w0) {
    %at = transpose %a : tensor<4xROWSxf64>
    %p = matmul %at, %b : tensor<4x5xf64>
    %w.2 = add %w, %p : tensor<4x5xf64>
    yield (%w.2)
  } : tensor<4x5xf64>
  return %w.1
}
"""


@pytest.mark.parametrize("a,b,rows", [
    pytest.param("?x3x4", "?x3x5", "3", id="steps"),
    pytest.param("6x?x4", "6x?x5", "?", id="batch"),
])
def test_dynamic_dims_in_accumulated_sequences(a: str, b: str, rows: str):
    text = DYNAMIC_ACCUMULATION.replace("SHAPE_A", a).replace("SHAPE_B", b).replace("ROWS", rows)
    module = gir.parse(text)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((6, 3, 4)), rng.standard_normal((6, 3, 5)), rng.standard_normal((4, 5))]
    want = gir.interpret(module, "f", *args)
    PassManager("scan-grad,canonicalize").run(module)
    assert_close(want, gir.interpret(module, "f", *args), "f")


PINNED = """\
func @f(%x: tensor<4x3xf32>, %u: tensor<3x2xf32>, %v: tensor<3x2xf32>, %w: tensor<3x2xf32>)
    -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>) {
  %a = matmul %x, %u {device = "cpu"} : tensor<4x2xf32>
  %b = matmul %x, %v {device = "gpu"} : tensor<4x2xf32>
  %c = matmul %x, %w {device = "cpu"} : tensor<4x2xf32>
  return %a, %b, %c
}
"""


def test_products_pinned_to_different_devices_are_not_merged_and_pins_are_kept() -> None:
    """A `device` written in the input is a pin: scan-grad merges only products pinned alike
    (here the two CPU ones), and what it makes from them stays on their device (the rewriter's
    `made_from` carries the pin); it used to merge all three and drop the pins."""
    from gir.ir.printer import print_module
    from gir.passes.pass_manager import PassManager

    module = gir.parse(PINNED)
    PassManager("scan-grad").run(module)
    ops = list(module.functions["f"].body)
    matmuls = [op for op in ops if op.name == "matmul"]
    assert sorted(op.attrs.get("device") for op in matmuls) == ["cpu", "gpu"], print_module(module)
    merged = next(op for op in matmuls if op.attrs["device"] == "cpu")
    assert merged.result.tensor_type.shape == (4, 4)
    assert all(op.attrs.get("device") == "cpu" for op in ops if op.name in ("concat", "slice"))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3, 2), (3, 2), (3, 2)]]
    want = gir.interpret(gir.parse(PINNED), "f", *args)
    got = gir.interpret(module, "f", *args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5)
