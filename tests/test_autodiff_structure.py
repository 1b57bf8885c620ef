"""The shape of the gradient code, counted on the IR rather than inferred from numbers.

The autodiff issue asks for the gradient a careful person writes by hand: the backward loop
reads the forward values it needs from stacks and never recomputes them, the vanilla RNN's
backward step holds two matmuls (propagation through W_h and the W_h-gradient accumulation),
the input projection's gradient is one GEMM outside the loop, and canonicalize leaves no
zero-gradient clutter behind. These tests count those things on examples/{rnn,gru,lstm}.gir
(their real sizes: nothing is run here) after

- BEFORE_PUSH_OUT = "ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize": the IR
  docs/autodiff.md prints, where the weight gradients are still accumulated in the loop;
- DEFAULT_PIPELINE, which runs scan-grad once more and moves those accumulations out.

Terms: the *forward scan* is the non-reverse scan of @NAME_grads, the *backward scan* the
`scan reverse` that autodiff builds from it. A *residual* is a forward value the backward body
reads: a block argument of the backward scan whose sequence is a stack result of the forward
scan (or a sequence of the forward scan itself).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gir
import pytest
from gir.ir.core import Block, Function, Operation, OpResult, Value
from gir.ir.printer import print_function
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE

ROOT = Path(__file__).resolve().parent.parent
BEFORE_PUSH_OUT = "ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize"
RECURRENT = ("rnn", "gru", "lstm")

_cache: dict[tuple[str, str], gir.Module] = {}


def compiled(name: str, pipeline: str) -> gir.Module:
    """examples/NAME.gir after pipeline (cached: the tests only read the IR)."""
    key = (name, pipeline)
    if key not in _cache:
        module = gir.load(str(ROOT / "examples" / f"{name}.gir"))
        PassManager(pipeline, check_numerics=None, verify_each=True).run(module)
        _cache[key] = module
    return _cache[key]


def compile_text(text: str, pipeline: str) -> gir.Module:
    module = gir.parse(text, filename="structure.gir")
    PassManager(pipeline, check_numerics=None, verify_each=True).run(module)
    return module


def top_level_scans(f: Function, reverse: bool) -> list[Operation]:
    return [op for op in f.body if op.name == "scan" and op.attrs["reverse"] == reverse]


def forward_and_backward(module: gir.Module, name: str) -> tuple[Operation, Operation]:
    f = module[f"{name}_grads"]
    (forward,) = top_level_scans(f, reverse=False)
    (backward,) = top_level_scans(f, reverse=True)
    return forward, backward


def body_ops(scan: Operation) -> list[Operation]:
    """The ops of a scan body at its top level, without the yield."""
    return [op for op in scan.body if op.name != "yield"]


def count(ops: Iterator[Operation] | list[Operation], name: str) -> int:
    return sum(op.name == name for op in ops)


def groups(scan: Operation) -> tuple[list[Value], list[Value], list[Value], list[Value]]:
    """(sequence outers, initial carries, yielded carries, yielded stacks)."""
    term = scan.body.terminator
    assert term is not None
    return scan.group("sequences"), scan.group("inits"), term.group("carries"), term.group("stacks")


def residual_origin(backward: Operation, forward: Operation, v: Value) -> Value | None:
    """The forward body value that backward body value v is a per-step copy of, or None.

    v must be a sequence block argument of the backward scan whose outer value is a stack
    result of the forward scan (then the origin is the value the forward body stacks) or a
    sequence of the forward scan (then the origin is the forward block argument)."""
    seqs, _, _, _ = groups(backward)
    if not (v in backward.body.args and v.index < len(seqs)):  # type: ignore[attr-defined]
        return None
    outer = seqs[v.index]  # type: ignore[attr-defined]
    f_seqs, f_inits, _, f_stacks = groups(forward)
    if isinstance(outer, OpResult) and outer.op is forward and outer.index >= len(f_inits):
        return f_stacks[outer.index - len(f_inits)]
    if outer in f_seqs:
        return forward.body.args[f_seqs.index(outer)]
    return None


def through_transpose(v: Value) -> Value:
    op = getattr(v, "op", None)
    while op is not None and op.name == "transpose":
        v = op.operands[0]
        op = getattr(v, "op", None)
    return v


# ---------------------------------------------------------------------------------------------
# The vanilla RNN, before the second scan-grad


def test_rnn_backward_body_has_two_matmuls() -> None:
    """dh_{t-1} = da_t @ W_h^T (propagation) and acc_Wh += h_{t-1}^T @ da_t (accumulation); the
    input projection was hoisted before autodiff, so W_x appears in neither loop."""
    module = compiled("rnn", BEFORE_PUSH_OUT)
    forward, backward = forward_and_backward(module, "rnn")
    assert count(body_ops(forward), "matmul") == 1
    matmuls = [op for op in body_ops(backward) if op.name == "matmul"]
    assert len(matmuls) == 2, str(module["rnn_grads"])
    assert count(backward.walk(), "matmul") == 2  # nothing hidden in nested regions either
    f = module["rnn_grads"]
    wx, wh = f.args[2], f.args[3]
    used_in_loops = {v for scan in (forward, backward) for op in scan.walk() for v in op.operands}
    assert wx not in used_in_loops
    # Propagation: the cotangent times W_h^T, W_h^T built once before the loop.
    propagation = [m for m in matmuls if through_transpose(m.operands[1]) is wh]
    assert len(propagation) == 1 and propagation[0].operands[1].op.parent is f.body  # type: ignore[attr-defined]
    # Accumulation: h_{t-1} (a residual) transposed, times the same cotangent; summed in a carry.
    (accumulation,) = [m for m in matmuls if m is not propagation[0]]
    seqs, inits, _, _ = groups(forward)
    h_prev = forward.body.args[len(seqs) + inits.index(f.args[1])]  # the carry that starts at %h0
    assert residual_origin(backward, forward, through_transpose(accumulation.operands[0])) is h_prev
    assert accumulation.operands[1] is propagation[0].operands[0]
    (user,) = accumulation.result.users
    assert user.name == "add" and any(a in backward.body.args for a in user.operands)


def test_rnn_input_projection_gradient_is_one_gemm_outside_the_loop() -> None:
    """dW_x = xs^T @ da, with da the stack of the backward scan: one GEMM over T * batch rows."""
    module = compiled("rnn", BEFORE_PUSH_OUT)
    f = module["rnn_grads"]
    _, backward = forward_and_backward(module, "rnn")
    ret = f.body.terminator
    assert ret is not None
    dwx = ret.operands[1]
    gemm = dwx.op  # type: ignore[attr-defined]
    assert gemm.name == "matmul" and gemm.parent is f.body

    def source(v: Value) -> Value:
        while getattr(v, "op", None) is not None and v.op.name in ("transpose", "reshape"):  # type: ignore[attr-defined]
            v = v.op.operands[0]  # type: ignore[attr-defined]
        return v

    lhs, rhs = (source(v) for v in gemm.operands)
    assert lhs is f.args[0]  # %xs
    assert isinstance(rhs, OpResult) and rhs.op is backward
    assert gemm.result.tensor_type.shape == (256, 256)
    assert gemm.operands[0].tensor_type.shape == (256, 50 * 32)


# ---------------------------------------------------------------------------------------------
# Every backward body: no product of two residuals, no recomputed forward value


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("name", RECURRENT)
def test_no_matmul_of_two_residuals(name: str, pipeline: str) -> None:
    """A matmul whose operands are both forward values available as stacks (or their
    transposes) recomputes a forward product, e.g. h_{t-1} @ U: it must come from a stack."""
    module = compiled(name, pipeline)
    forward, backward = forward_and_backward(module, name)
    for op in backward.walk():
        if op.name == "matmul":
            origins = [residual_origin(backward, forward, through_transpose(v)) for v in op.operands]
            assert None in origins, f"{op} multiplies two forward values: {origins}"


def _freeze(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    return x


def _constant_key(v: Value) -> tuple | None:
    op = getattr(v, "op", None)
    if op is not None and op.name in ("constant", "zeros", "ones") and not op.operands:
        return ("constant", op.name, _freeze(op.attrs), str(v.type))
    return None


def _op_key(op: Operation, operand_keys: list[Any]) -> tuple:
    keys: Any = tuple(operand_keys)
    if op.spec.commutative:
        keys = frozenset(Counter(operand_keys).items())
    return (op.name, _freeze(op.attrs), keys, tuple(str(r.type) for r in op.results))


def recomputed_forward_values(forward: Operation, backward: Operation) -> list[tuple[Operation, Operation]]:
    """(backward op, forward op) pairs where the backward op recomputes the forward op's value.

    Two ops compute the same value when they have the same name, attributes and result types
    and their operands are the same values. To compare across the two loops, each backward
    value gets a *forward meaning*:
    - a residual (a sequence argument slicing a forward stack, or a forward sequence) means
      the forward value it is a per-step copy of;
    - a value defined outside the backward scan means itself (the forward body reads outer
      values directly too); a constant means its value and type, wherever it is defined;
    - a backward op result means the forward op's result when the op matches a forward op
      under this rule (so a chain of recomputation is followed), otherwise nothing: it is a
      cotangent or some other backward-only value, and no op using it recomputes anything.
    A backward op whose operands all have a forward meaning and that matches a forward body
    op (name, attributes, result types, operands in order, in any order for commutative ops)
    computes a value the forward pass already computed: the issue wants it read from a stack.
    Ops of nested regions are compared within their own body only at top level: the examples
    have none."""
    forward_key: dict[tuple, Operation] = {}
    for op in body_ops(forward):
        keys = [_constant_key(v) or v for v in op.operands]
        forward_key.setdefault(_op_key(op, keys), op)

    inside = {a for a in backward.body.args}
    for op in backward.walk():
        inside.update(op.results)
    meaning: dict[Value, Any] = {}

    def mean(v: Value) -> Any:
        if v in meaning:
            return meaning[v]
        const = _constant_key(v)
        if const is not None:
            return const
        if v not in inside:
            return v
        return residual_origin(backward, forward, v)

    found = []
    for op in body_ops(backward):
        keys = [mean(v) for v in op.operands]
        if not op.results or any(k is None for k in keys) or op.regions:
            continue
        match = forward_key.get(_op_key(op, keys))
        if match is not None:
            found.append((op, match))
            for r, fr in zip(op.results, match.results):
                meaning[r] = fr
    return found


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("name", RECURRENT)
def test_backward_body_recomputes_no_forward_value(name: str, pipeline: str) -> None:
    module = compiled(name, pipeline)
    forward, backward = forward_and_backward(module, name)
    found = recomputed_forward_values(forward, backward)
    assert not found, "\n".join(f"backward {b}  recomputes forward {f}" for b, f in found)


EXPENSIVE = {"matmul", "exp", "log", "tanh", "sigmoid", "sqrt", "pow", "sum", "mean", "reduce_max", "reduce_min",
             "concat", "transpose"}


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("name", RECURRENT)
def test_backward_body_recomputes_no_product_activation_or_reduction(name: str, pipeline: str) -> None:
    """The same check restricted to the ops whose recomputation costs more than reading a
    stack: products, transcendental activations, reductions, data movement. Passes where the
    strict check above catches only cheap elementwise arithmetic."""
    module = compiled(name, pipeline)
    forward, backward = forward_and_backward(module, name)
    found = [(b, f) for b, f in recomputed_forward_values(forward, backward) if b.name in EXPENSIVE]
    assert not found, "\n".join(f"backward {b}  recomputes forward {f}" for b, f in found)


def test_recompute_check_finds_a_recomputation() -> None:
    """The checker itself: a hand-written backward loop that recomputes the forward tanh
    (and an op chained on it) is caught; one that reads it from the stack is not."""
    text = """
    func @f(%xs: tensor<4x3xf32>, %w: tensor<3xf32>) -> tensor<f32> {
      %one = constant 1.0 : tensor<f32>
      %zero = constant 0.0 : tensor<3xf32>
      %hT, %ys, %as = scan (%x in %xs) carry (%h = %zero) {
        %a = mul %x, %w : tensor<3xf32>
        %y = tanh %a : tensor<3xf32>
        %q = mul %y, %y : tensor<3xf32>
        %h.1 = add %h, %q : tensor<3xf32>
        yield (%h.1) stack (%y, %a)
      } : tensor<3xf32>, tensor<4x3xf32>, tensor<4x3xf32>
      %dT, %ds = scan reverse (%x.1 in %xs, %y.1 in %ys, %a.1 in %as) carry (%d = %zero) {
        %again = tanh %a.1 : tensor<3xf32>
        %sq = mul %again, %again : tensor<3xf32>
        %from_stack = mul %y.1, %d : tensor<3xf32>
        %b = sub %one, %sq : tensor<3xf32>
        %d.1 = mul %from_stack, %b : tensor<3xf32>
        yield (%d.1) stack (%d.1)
      } : tensor<3xf32>, tensor<4x3xf32>
      return sum(%dT)
    }
    """
    module = gir.parse(text, filename="check.gir")
    f = module["f"]
    (forward,) = top_level_scans(f, reverse=False)
    (backward,) = top_level_scans(f, reverse=True)
    found = [(b.name, fw.name) for b, fw in recomputed_forward_values(forward, backward)]
    assert found == [("tanh", "tanh"), ("mul", "mul")]


def per_step(scan: Operation, v: Value) -> bool:
    """Whether body value v changes from step to step: it is computed (at any depth) from a
    block argument of the scan, or defined in its body from nothing else (a constant would
    have been hoisted by canonicalize)."""
    args = set(scan.body.args)
    reached = set(args)
    for op in scan.body:
        uses = {w for inner in op.walk() for w in inner.operands}
        if uses & reached:
            reached.update(op.results)
    return v in reached


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("name", RECURRENT)
def test_forward_scan_stacks_only_per_step_values_once(name: str, pipeline: str) -> None:
    """Residuals: loop-invariant values (weights, biases, their transposes) are read from
    outside the loop, never stacked; no value is stacked twice; every stack is read."""
    forward, _ = forward_and_backward(compiled(name, pipeline), name)
    _, inits, _, stacks = groups(forward)
    for v in stacks:
        assert per_step(forward, v), f"{name}: the forward scan stacks a loop-invariant value {v.name_hint}"
    assert len(set(stacks)) == len(stacks), f"{name}: a value is stacked twice"
    for r in forward.results[len(inits):]:
        assert r.uses, f"{name}: unused forward stack"


# ---------------------------------------------------------------------------------------------
# After the full pipeline: one GEMM per step


@pytest.mark.parametrize("name", RECURRENT)
def test_one_matmul_per_step_after_the_default_pipeline(name: str) -> None:
    """Forward: h_{t-1} @ [U_*] (merged). Backward: da_t @ [U_*]^T; the weight-gradient GEMMs
    were pushed out of the loop and the input projections hoisted out of both."""
    module = compiled(name, DEFAULT_PIPELINE)
    f = module[f"{name}_grads"]
    scans = [op for op in f.walk() if op.name == "scan"]
    assert len(scans) == 2
    for scan in scans:
        assert count(scan.walk(), "matmul") == 1, f"{name}: {count(scan.walk(), 'matmul')} matmuls in\n{scan}"


@pytest.mark.parametrize("name", RECURRENT)
def test_loss_function_keeps_one_matmul_per_step(name: str) -> None:
    module = compiled(name, DEFAULT_PIPELINE)
    (scan,) = [op for op in module[f"{name}_loss"].walk() if op.name == "scan"]
    assert count(scan.walk(), "matmul") == 1


# ---------------------------------------------------------------------------------------------
# No zero-gradient clutter after canonicalize


def splat_value(v: Value) -> float | None:
    """The scalar every element of v equals, when v is a constant splat (through broadcasts)."""
    op = getattr(v, "op", None)
    if op is None:
        return None
    if op.name == "constant" and not isinstance(op.attrs["value"], (list, tuple)):
        return float(op.attrs["value"])
    if op.name in ("zeros", "ones"):
        return 0.0 if op.name == "zeros" else 1.0
    if op.name in ("fill", "broadcast", "reshape", "cast"):
        return splat_value(op.operands[0])
    return None


def _body_slice(block: Block, start: Value) -> set[Value]:
    """Values of block (at any depth) computed from start."""
    reached = {start}
    for op in block:
        uses = {v for inner in op.walk() for v in inner.operands} | set(op.operands)
        if uses & reached:
            reached.update(op.results)
    return reached


def clutter(module: gir.Module) -> list[tuple[str, str]]:
    """(kind, op) for what canonicalize should have removed: adds of zero, multiplies by one,
    carries yielded unchanged, unused stacks, sequences and carries. `x + 0` counts only where
    x has the result's type: a zero that broadcasts x to a larger shape is a broadcast."""
    found = []
    for op in module.walk():
        if op.name in ("add", "sub", "mul"):
            splats = [splat_value(v) for v in op.operands]
            others_fit = [any(w.type == op.result.type for j, w in enumerate(op.operands) if j != i)
                          for i in range(len(op.operands))]
        if op.name == "add" and any(s == 0.0 and fit for s, fit in zip(splats, others_fit)):
            found.append(("add of zero", str(op)))
        if op.name == "sub" and splats[1] == 0.0 and others_fit[1]:
            found.append(("add of zero", str(op)))
        if op.name == "mul" and any(s == 1.0 and fit for s, fit in zip(splats, others_fit)):
            found.append(("multiply by one", str(op)))
        if op.name != "scan":
            continue
        seqs, inits, yielded, stacks = groups(op)
        body = op.body
        where = f"scan at {op.loc}"
        for i in range(len(seqs)):
            if not body.args[i].uses:
                found.append(("unused sequence", f"#{i} of {where}"))
        for i in range(len(inits)):
            arg = body.args[len(seqs) + i]
            if yielded[i] is arg:
                found.append(("carry yielded unchanged", f"#{i} (%{arg.name_hint}) of {where}"))
                continue
            reached = _body_slice(body, arg)
            others = [v for j, v in enumerate(yielded) if j != i] + list(stacks)
            if not op.results[i].uses and not any(v in reached for v in others):
                found.append(("unused carry", f"#{i} (%{arg.name_hint}) of {where}"))
        for k in range(len(stacks)):
            if not op.results[len(inits) + k].uses:
                found.append(("unused stack", f"#{k} of {where}"))
    return found


EXAMPLES = ("rnn", "gru", "lstm", "mlp")


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_no_zero_gradient_clutter_in_examples(name: str, pipeline: str) -> None:
    found = clutter(compiled(name, pipeline))
    assert not found, "\n".join(f"{kind}: {what}" for kind, what in found)


CLUTTER_CASES = {
    # Carries and stacks whose cotangent is zero: the final h, the collected hs and the step
    # counter are not used by the loss, so the backward loop must not carry or stack for them.
    "unused-outputs": """
    func @f(%xs: tensor<4x2x3xf32>, %h0: tensor<2x3xf32>, %w: tensor<3x3xf32>, %v: tensor<3xf32>) -> tensor<f32> {
      %h = %h0
      %acc = constant 0.0 : tensor<f32>
      %n = constant 0.0 : tensor<f32>
      for %x in %xs {
        %h = tanh(%x + %h @ %w)
        %acc = %acc + sum(%h * %v)
        %n = %n + 1.0
        collect %h into %hs
      }
      return %acc
    }
    func @g(%xs: tensor<4x2x3xf32>, %h0: tensor<2x3xf32>, %w: tensor<3x3xf32>, %v: tensor<3xf32>)
        -> (tensor<f32>, tensor<3x3xf32>, tensor<3xf32>, tensor<2x3xf32>) {
      %l, %dw, %dv, %dh0 = grad @f(%xs, %h0, %w, %v) wrt (%w, %v, %h0)
      return %l, %dw, %dv, %dh0
    }""",
    # A carry that only the loss after the loop reads, and an argument with no gradient.
    "final-carry-only": """
    func @f(%xs: tensor<5x3xf32>, %s0: tensor<3xf32>, %u: tensor<3xf32>) -> tensor<f32> {
      %s = %s0
      %t = %s0
      for %x in %xs {
        %s = %s * %x
        %t = %t + %x
      }
      return sum(%s)
    }
    func @g(%xs: tensor<5x3xf32>, %s0: tensor<3xf32>, %u: tensor<3xf32>)
        -> (tensor<f32>, tensor<5x3xf32>, tensor<3xf32>, tensor<3xf32>) {
      %l, %dxs, %ds0, %du = grad @f(%xs, %s0, %u) wrt (%xs, %s0, %u)
      return %l, %dxs, %ds0, %du
    }""",
    # Nested loops: the inner loop's backward lives in the outer backward body.
    "nested": """
    func @f(%xss: tensor<3x2x4xf32>, %w: tensor<4xf32>) -> tensor<f32> {
      %h = %w
      for %xs in %xss {
        for %x in %xs {
          %h = sigmoid(%h * %x + %w)
        }
      }
      return sum(%h)
    }
    func @g(%xss: tensor<3x2x4xf32>, %w: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
      %l, %dw = grad @f(%xss, %w) wrt (%w)
      return %l, %dw
    }""",
}


@pytest.mark.parametrize("pipeline", [BEFORE_PUSH_OUT, DEFAULT_PIPELINE], ids=["before-push-out", "default"])
@pytest.mark.parametrize("case", sorted(CLUTTER_CASES))
def test_no_zero_gradient_clutter(case: str, pipeline: str) -> None:
    module = compile_text(CLUTTER_CASES[case], pipeline)
    found = clutter(module)
    assert not found, "\n".join(f"{kind}: {what}" for kind, what in found) + "\n" + str(module)


def test_unused_outputs_get_no_backward_carry_or_stack() -> None:
    """In "unused-outputs", the backward scan carries dh and the accumulators of dw and dv
    (and dh0 leaves as the final dh); nothing for the step counter or the collected hs."""
    module = compile_text(CLUTTER_CASES["unused-outputs"], BEFORE_PUSH_OUT)
    (forward,) = top_level_scans(module["g"], reverse=False)
    (backward,) = top_level_scans(module["g"], reverse=True)
    _, f_inits, _, _ = groups(forward)
    _, b_inits, _, _ = groups(backward)
    assert len(f_inits) == 2  # h and the loss accumulator: the counter is gone
    assert sorted(str(v.type) for v in b_inits) == ["tensor<2x3xf32>", "tensor<3x3xf32>", "tensor<3xf32>"]


def test_clutter_detector_finds_clutter() -> None:
    """The detector itself, on hand-written clutter that no pass has seen."""
    module = gir.parse("""
    func @f(%xs: tensor<4x3xf32>, %a: tensor<3xf32>) -> tensor<3xf32> {
      %z = constant 0.0 : tensor<3xf32>
      %o = constant 1.0 : tensor<f32>
      %b = add %a, %z : tensor<3xf32>
      %c = mul %o, %b : tensor<3xf32>
      %r, %k, %dead, %s = scan (%x in %xs) carry (%p = %c, %q = %a, %u = %a) {
        %p.1 = add %p, %x : tensor<3xf32>
        %u.1 = mul %u, %x : tensor<3xf32>
        yield (%p.1, %q, %u.1) stack (%x)
      } : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<4x3xf32>
      %t = add %r, %k : tensor<3xf32>
      return %t
    }
    """, filename="clutter.gir")
    kinds = sorted(kind for kind, _ in clutter(module))
    assert kinds == ["add of zero", "carry yielded unchanged", "multiply by one", "unused carry", "unused stack"]


# ---------------------------------------------------------------------------------------------
# docs/autodiff.md shows what gir prints today

_IR_BLOCK = re.compile(r"<!-- ir: (?P<pipeline>[a-z,-]+) -->\n```gir\n(?P<text>.*?)^```", re.S | re.M)


def test_docs_show_the_printed_rnn_gradient() -> None:
    """Every `<!-- ir: PIPELINE -->` block of docs/autodiff.md is examples/rnn.gir's @rnn_grads
    as `gir opt -p PIPELINE` prints it."""
    doc = (ROOT / "docs" / "autodiff.md").read_text(encoding="utf-8")
    blocks = list(_IR_BLOCK.finditer(doc))
    assert [m["pipeline"] for m in blocks] == [BEFORE_PUSH_OUT, BEFORE_PUSH_OUT + ",scan-grad,canonicalize"]
    for m in blocks:
        printed = print_function(compiled("rnn", m["pipeline"])["rnn_grads"])
        assert m["text"].strip() == printed.strip(), (
            f"docs/autodiff.md is stale for -p {m['pipeline']}; gir prints:\n{printed}")
