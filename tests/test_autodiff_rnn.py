"""Gradients through loops: the RNN, GRU and LSTM of examples/ against a hand-written NumPy
backpropagation through time, and the other shapes of program the autodiff issue names (nested
scans, calls, arguments used inside and outside a loop, stacked outputs in the loss, reverse
scans, several scans in sequence, unused and repeated arguments) against finite differences.

The examples are float32 at T = 50, batch 32, hidden 256. `small_example` turns them into
float64 at T = 6, batch 4, input 5, hidden 8 by substituting the types in the text (the
input size differs from the hidden size, so a weight used with the wrong orientation fails
to type-check or gives wrong numbers rather than passing by symmetry). Everything runs in the
reference interpreter; every gradient is float64 and must match to a relative error of 1e-10
(BPTT) or 1e-6 (central differences, which carry their own truncation error).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.ir.core import Function
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE

ROOT = Path(__file__).resolve().parent.parent
T, BATCH, INPUT, HIDDEN = 6, 4, 5, 8

PIPELINES = {
    "default": DEFAULT_PIPELINE,
    "before-push-out": "ssa,canonicalize,scan-grad,canonicalize,autodiff,canonicalize",
    "autodiff-only": "ssa,autodiff",
}
"""The default pipeline; the one whose IR docs/autodiff.md shows (scan-grad only before
autodiff); and autodiff on the program as written."""

EPS = 1e-6


def small_example(name: str) -> str:
    """examples/NAME.gir in float64 at small sizes, by text substitution of the types:
    sequence 50x32x256 -> 6x4x5, input weights (%wx, %w_*) 256x256 -> 5x8, and in the
    results of the *_grads function their gradients (the first of its 256x256 results), then
    batch x hidden 32x256 -> 4x8, hidden weights 256x256 -> 8x8, biases 256 -> 8."""
    text = (ROOT / "examples" / f"{name}.gir").read_text(encoding="utf-8")
    text = text.replace("f32", "f64").replace("50x32x256", f"{T}x{BATCH}x{INPUT}")
    input_weight = r"(%w(?:x|_[a-z])\s*:\s*tensor<)256x256"
    n_input_weights = len(set(re.findall(input_weight, text)))
    text = re.sub(input_weight, rf"\g<1>{INPUT}x{HIDDEN}", text)
    head, arrow, results = text.rpartition("-> (")  # the result list of the *_grads function
    text = head + arrow + results.replace("256x256", f"{INPUT}x{HIDDEN}", n_input_weights)
    text = text.replace("32x256", f"{BATCH}x{HIDDEN}").replace("256x256", f"{HIDDEN}x{HIDDEN}")
    return text.replace("256xf64", f"{HIDDEN}xf64")


def with_all_grads(text: str, name: str) -> str:
    """Adds @all_grads: the gradient of NAME_loss with respect to every argument (the example's
    own *_grads differentiates the weights only)."""
    loss = gir.parse(text, filename=f"{name}.gir")[f"{name}_loss"]
    sig = ", ".join(f"%{a.name_hint}: {a.type}" for a in loss.args)
    names = ", ".join(f"%{a.name_hint}" for a in loss.args)
    grads = ", ".join(f"%d_{a.name_hint}" for a in loss.args)
    results = ", ".join(["tensor<f64>"] + [str(a.type) for a in loss.args])
    return text + (f"\nfunc @all_grads({sig}) -> ({results}) {{\n"
                   f"  %l, {grads} = grad @{name}_loss({names}) wrt ({names})\n"
                   f"  return %l, {grads}\n}}\n")


def compile_module(text: str, pipeline: str, filename: str = "test.gir") -> gir.Module:
    module = gir.parse(text, filename=filename)
    PassManager(pipeline, check_numerics=None, verify_each=True).run(module)
    assert not any(op.name == "grad" for op in module.walk()), "autodiff left a grad op"
    return module


def wrt_names(text: str, entry: str) -> list[str]:
    """The argument names of the callee that the grad op in @entry differentiates, in order."""
    module = gir.parse(text, filename="names.gir")
    (grad,) = [op for op in module[entry].walk() if op.name == "grad"]
    callee = module[grad.attrs["callee"]]
    return [callee.args[p].name_hint for p in grad.attrs["wrt"]]  # type: ignore[misc]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-12))


# ---------------------------------------------------------------------------------------------
# NumPy backpropagation through time, float64, written out by hand


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def rnn_bptt(xs: np.ndarray, h0: np.ndarray, wx: np.ndarray, wh: np.ndarray,
             b: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    hs = [h0]
    loss = 0.0
    for x in xs:
        hs.append(np.tanh(x @ wx + hs[-1] @ wh + b))
        loss += np.sum(hs[-1] ** 2)
    d = {k: np.zeros_like(v) for k, v in dict(xs=xs, wx=wx, wh=wh, b=b).items()}
    dh = np.zeros_like(h0)
    for t in reversed(range(len(xs))):
        h, h_prev = hs[t + 1], hs[t]
        dh = dh + 2 * h
        da = dh * (1 - h * h)
        d["xs"][t] = da @ wx.T
        d["wx"] += xs[t].T @ da
        d["wh"] += h_prev.T @ da
        d["b"] += da.sum(axis=0)
        dh = da @ wh.T
    d["h0"] = dh
    return loss, d


def gru_bptt(xs: np.ndarray, h0: np.ndarray, w_z: np.ndarray, w_r: np.ndarray, w_n: np.ndarray,
             u_z: np.ndarray, u_r: np.ndarray, u_n: np.ndarray, b_z: np.ndarray, b_r: np.ndarray,
             b_n: np.ndarray, b_hn: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    h, loss, steps = h0, 0.0, []
    for x in xs:
        z = sigmoid(x @ w_z + h @ u_z + b_z)
        r = sigmoid(x @ w_r + h @ u_r + b_r)
        hn = h @ u_n + b_hn
        n = np.tanh(x @ w_n + b_n + r * hn)
        h_new = (1 - z) * n + z * h
        steps.append((x, h, z, r, hn, n, h_new))
        h = h_new
        loss += np.sum(h * h)
    params = dict(xs=xs, w_z=w_z, w_r=w_r, w_n=w_n, u_z=u_z, u_r=u_r, u_n=u_n, b_z=b_z, b_r=b_r, b_n=b_n,
                  b_hn=b_hn)
    d = {k: np.zeros_like(v) for k, v in params.items()}
    dh_next = np.zeros_like(h0)
    for t in reversed(range(len(xs))):
        x, h, z, r, hn, n, h_new = steps[t]
        dh_new = dh_next + 2 * h_new
        dn = dh_new * (1 - z)
        dz = dh_new * (h - n)
        dh = dh_new * z
        dan = dn * (1 - n * n)
        dhn = dan * r
        dr = dan * hn
        dar = dr * r * (1 - r)
        daz = dz * z * (1 - z)
        for gate, da, dhn_or_da in (("z", daz, daz), ("r", dar, dar), ("n", dan, dhn)):
            d[f"w_{gate}"] += x.T @ da
            d[f"u_{gate}"] += h.T @ dhn_or_da
            d[f"b_{gate}"] += da.sum(axis=0)
        d["b_hn"] += dhn.sum(axis=0)
        dh = dh + daz @ u_z.T + dar @ u_r.T + dhn @ u_n.T
        d["xs"][t] = daz @ w_z.T + dar @ w_r.T + dan @ w_n.T
        dh_next = dh
    d["h0"] = dh_next
    return loss, d


def lstm_bptt(xs: np.ndarray, h0: np.ndarray, c0: np.ndarray, w_i: np.ndarray, w_f: np.ndarray,
              w_g: np.ndarray, w_o: np.ndarray, u_i: np.ndarray, u_f: np.ndarray, u_g: np.ndarray,
              u_o: np.ndarray, b_i: np.ndarray, b_f: np.ndarray, b_g: np.ndarray,
              b_o: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    h, c, loss, steps = h0, c0, 0.0, []
    for x in xs:
        i = sigmoid(x @ w_i + h @ u_i + b_i)
        f = sigmoid(x @ w_f + h @ u_f + b_f)
        g = np.tanh(x @ w_g + h @ u_g + b_g)
        o = sigmoid(x @ w_o + h @ u_o + b_o)
        c_new = f * c + i * g
        tc = np.tanh(c_new)
        h_new = o * tc
        steps.append((x, h, c, i, f, g, o, tc, h_new))
        h, c = h_new, c_new
        loss += np.sum(h * h)
    params = dict(xs=xs, w_i=w_i, w_f=w_f, w_g=w_g, w_o=w_o, u_i=u_i, u_f=u_f, u_g=u_g, u_o=u_o,
                  b_i=b_i, b_f=b_f, b_g=b_g, b_o=b_o)
    d = {k: np.zeros_like(v) for k, v in params.items()}
    dh_next, dc_next = np.zeros_like(h0), np.zeros_like(c0)
    weights = dict(i=(w_i, u_i), f=(w_f, u_f), g=(w_g, u_g), o=(w_o, u_o))
    for t in reversed(range(len(xs))):
        x, h, c, i, f, g, o, tc, h_new = steps[t]
        dh_new = dh_next + 2 * h_new
        do = dh_new * tc
        dc_new = dc_next + dh_new * o * (1 - tc * tc)
        pre = dict(i=dc_new * g * i * (1 - i), f=dc_new * c * f * (1 - f), g=dc_new * i * (1 - g * g),
                   o=do * o * (1 - o))
        dh = np.zeros_like(h)
        d["xs"][t] = 0.0
        for gate, da in pre.items():
            w, u = weights[gate]
            d[f"w_{gate}"] += x.T @ da
            d[f"u_{gate}"] += h.T @ da
            d[f"b_{gate}"] += da.sum(axis=0)
            dh += da @ u.T
            d["xs"][t] += da @ w.T
        dh_next, dc_next = dh, dc_new * f
    d["h0"], d["c0"] = dh_next, dc_next
    return loss, d


BPTT: dict[str, Callable[..., tuple[float, dict[str, np.ndarray]]]] = {
    "rnn": rnn_bptt, "gru": gru_bptt, "lstm": lstm_bptt}


def example_inputs(module: gir.Module, name: str, seed: int = 0) -> list[np.ndarray]:
    """Inputs with O(1) pre-activations: sequences and states ~ N(0, 1), weights ~ N(0, 1/fan_in)."""
    rng = np.random.default_rng(seed)
    out = []
    for a in module[f"{name}_loss"].args:
        shape = a.tensor_type.shape
        scale = 1 / np.sqrt(shape[0]) if a.name_hint.startswith(("w", "u")) else 1.0  # type: ignore[union-attr]
        out.append(scale * rng.standard_normal(shape))
    return out


@pytest.fixture(scope="module", params=sorted(BPTT))
def example(request: pytest.FixtureRequest) -> tuple[str, str, list[np.ndarray]]:
    name = request.param
    text = with_all_grads(small_example(name), name)
    module = gir.parse(text, filename=f"{name}.gir")
    return name, text, example_inputs(module, name)


@pytest.mark.parametrize("name", sorted(BPTT))
def test_small_example_substitution(name: str) -> None:
    """The substituted text is a valid program of the intended sizes, nothing left at 256/f32."""
    text = small_example(name)
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    assert "256" not in code and "f32" not in code and "50x" not in code
    module = gir.parse(text, filename=f"{name}.gir")
    gir.verify(module)
    loss = module[f"{name}_loss"]
    types = {a.name_hint: a.tensor_type.shape for a in loss.args}
    assert types["xs"] == (T, BATCH, INPUT) and types["h0"] == (BATCH, HIDDEN)
    for arg, shape in types.items():
        if arg == "wx" or arg.startswith("w_"):
            assert shape == (INPUT, HIDDEN), arg
        elif arg == "wh" or arg.startswith("u_"):
            assert shape == (HIDDEN, HIDDEN), arg
        elif arg.startswith("b"):
            assert shape == (HIDDEN,), arg
    grads = module[f"{name}_grads"]
    assert [r.shape for r in grads.result_types[1:]] == [types[n] for n in wrt_names(text, f"{name}_grads")]


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_example_gradients_match_numpy_bptt(example: tuple[str, str, list[np.ndarray]], pipeline: str) -> None:
    """The example's own *_grads and @all_grads against BPTT in NumPy: relative error < 1e-10."""
    name, text, args = example
    module = compile_module(text, PIPELINES[pipeline], f"{name}.gir")
    arg_names = [a.name_hint for a in module[f"{name}_loss"].args]
    want_loss, want = BPTT[name](*args)
    assert set(want) == set(arg_names)

    loss, *grads = gir.interpret(module, f"{name}_grads", *args)
    assert abs(float(loss) - want_loss) <= 1e-12 * abs(want_loss)
    weights = wrt_names(text, f"{name}_grads")
    assert len(grads) == len(weights) and set(weights) == set(arg_names) - {"xs", "h0", "c0"}
    for n, g in zip(weights, grads):
        assert g.dtype == np.float64 and g.shape == want[n].shape, n
        assert relative_error(g, want[n]) < 1e-10, (n, relative_error(g, want[n]))

    loss, *grads = gir.interpret(module, "all_grads", *args)
    for n, g in zip(arg_names, grads):
        assert relative_error(g, want[n]) < 1e-10, (n, relative_error(g, want[n]))


def test_example_gradients_match_finite_differences(example: tuple[str, str, list[np.ndarray]]) -> None:
    """A few elements of every gradient against central differences of the loss."""
    name, text, args = example
    module = compile_module(text, DEFAULT_PIPELINE, f"{name}.gir")
    reference = gir.parse(small_example(name), filename=f"{name}.gir")
    _, *grads = gir.interpret(module, "all_grads", *args)
    rng = np.random.default_rng(1)
    for p, g in enumerate(grads):
        for _ in range(2):
            idx = tuple(int(rng.integers(0, d)) for d in g.shape)
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[p][idx] += EPS
            minus[p][idx] -= EPS
            fd = (float(gir.interpret(reference, f"{name}_loss", *plus)[0])
                  - float(gir.interpret(reference, f"{name}_loss", *minus)[0])) / (2 * EPS)
            assert abs(g[idx] - fd) < 1e-6 * max(float(np.max(np.abs(g))), 1.0), (p, idx, g[idx], fd)


# ---------------------------------------------------------------------------------------------
# The other shapes of program, against finite differences


def numeric_gradient(module: gir.Module, entry: str, args: list[np.ndarray], p: int) -> np.ndarray:
    out = np.zeros_like(args[p])
    for idx in np.ndindex(args[p].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[p][idx] += EPS
        minus[p][idx] -= EPS
        out[idx] = (float(gir.interpret(module, entry, *plus)[0])
                    - float(gir.interpret(module, entry, *minus)[0])) / (2 * EPS)
    return out


def random_arguments(function: Function, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in function.arg_types:
        if t.is_float:
            out.append(np.asarray(rng.standard_normal(t.shape)))
        else:
            out.append(np.asarray(rng.integers(0, 3, t.shape)).astype(t.numpy_dtype))
    return out


def check_against_fd(text: str, f_args: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None,
                     seed: int = 0) -> list[np.ndarray]:
    """@g's gradients against central differences of @f, for every pipeline.

    @g returns @f's loss, then the gradients of `grad @f(...) wrt (...)`; f_args maps @g's
    arguments to @f's (the identity unless @g passes something else)."""
    reference = gir.parse(text, filename="case.gir")
    g_args = random_arguments(reference["g"], seed)
    args = f_args(g_args) if f_args else [a.copy() for a in g_args]
    (grad,) = [op for op in reference["g"].walk() if op.name == "grad"]
    positions = list(grad.attrs["wrt"])
    want_loss = gir.interpret(reference, "f", *args)[0]
    want = [numeric_gradient(reference, "f", args, p) for p in positions]
    results = []
    for pipeline in PIPELINES.values():
        module = compile_module(text, pipeline, "case.gir")
        loss, *grads = gir.interpret(module, "g", *g_args)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
        assert len(grads) == len(want)
        for p, g, w in zip(positions, grads, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            err = float(np.max(np.abs(g - w), initial=0.0)) / max(float(np.max(np.abs(w), initial=0.0)), 1e-3)
            assert err < 1e-6, f"argument #{p} after {pipeline!r}: relative error {err:.2e}\n{g}\n{w}"
        results = grads
    return results


def test_nested_scans() -> None:
    check_against_fd("""
    func @f(%xss: tensor<3x2x4xf64>, %w: tensor<4x4xf64>, %h0: tensor<4xf64>) -> tensor<f64> {
      %h = %h0
      %loss = constant 0.0 : tensor<f64>
      for %xs in %xss {
        for %x in %xs {
          %h = tanh(reshape(reshape(%x + %h, shape=[1, 4]) @ %w, shape=[4]))
          %loss = %loss + sum(%h * %x)
        }
      }
      return %loss
    }
    func @g(%xss: tensor<3x2x4xf64>, %w: tensor<4x4xf64>, %h0: tensor<4xf64>)
        -> (tensor<f64>, tensor<3x2x4xf64>, tensor<4x4xf64>, tensor<4xf64>) {
      %l, %a, %b, %c = grad @f(%xss, %w, %h0) wrt (%xss, %w, %h0)
      return %l, %a, %b, %c
    }""")


def test_nested_scans_closing_over_outer_body_values_with_a_reverse_inner_scan() -> None:
    """The inner scan reads %h (a carry of the outer body) and %w (outside both), and its
    initial carry and stacked output feed the outer body."""
    check_against_fd("""
    func @f(%xss: tensor<3x2x4xf64>, %w: tensor<4xf64>, %h0: tensor<4xf64>) -> tensor<f64> {
      %v = exp(%w)
      %hT, %hs = scan (%xs in %xss) carry (%h = %h0) {
        %u = mul %h, %v : tensor<4xf64>
        %gT, %gs = scan reverse (%x in %xs) carry (%g = %u) {
          %a = mul %g, %x : tensor<4xf64>
          %b = add %a, %h : tensor<4xf64>
          %c = tanh %b : tensor<4xf64>
          %d = mul %c, %w : tensor<4xf64>
          yield (%d) stack (%a)
        } : tensor<4xf64>, tensor<2x4xf64>
        %s = sum %gs {axes = [0]} : tensor<4xf64>
        %h.1 = sigmoid %s : tensor<4xf64>
        %h.2 = add %h.1, %gT : tensor<4xf64>
        yield (%h.2) stack (%h)
      } : tensor<4xf64>, tensor<3x4xf64>
      %p = mul %hs, %hs : tensor<3x4xf64>
      %q = sum %p : tensor<f64>
      %r = sum %hT : tensor<f64>
      %l = add %q, %r : tensor<f64>
      return %l
    }
    func @g(%xss: tensor<3x2x4xf64>, %w: tensor<4xf64>, %h0: tensor<4xf64>)
        -> (tensor<f64>, tensor<3x2x4xf64>, tensor<4xf64>, tensor<4xf64>) {
      %l, %a, %b, %c = grad @f(%xss, %w, %h0) wrt (%xss, %w, %h0)
      return %l, %a, %b, %c
    }""")


def test_grad_of_a_function_that_calls_another() -> None:
    """@f calls @cell inside its loop and after it; @cell calls @affine (inlined recursively)."""
    check_against_fd("""
    func @affine(%x: tensor<2x3xf64>, %w: tensor<3x3xf64>) -> tensor<2x3xf64> {
      return %x @ %w
    }
    func @cell(%x: tensor<2x3xf64>, %h: tensor<2x3xf64>, %w: tensor<3x3xf64>) -> tensor<2x3xf64> {
      return tanh(%x + @affine(%h, %w))
    }
    func @f(%xs: tensor<4x2x3xf64>, %h0: tensor<2x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
      %h = %h0
      for %x in %xs {
        %h = @cell(%x, %h, %w)
      }
      return sum(@cell(%h, %h, %w) * %h0)
    }
    func @g(%xs: tensor<4x2x3xf64>, %h0: tensor<2x3xf64>, %w: tensor<3x3xf64>)
        -> (tensor<f64>, tensor<4x2x3xf64>, tensor<2x3xf64>, tensor<3x3xf64>) {
      %l, %a, %b, %c = grad @f(%xs, %h0, %w) wrt (%xs, %h0, %w)
      return %l, %a, %b, %c
    }""")


def test_argument_used_inside_and_outside_a_scan() -> None:
    """%w: the initial carry's source, closed over by the body, and used after the loop."""
    check_against_fd("""
    func @f(%xs: tensor<4x3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
      %s = %w * %w
      for %x in %xs {
        %s = sigmoid(%s * %x + %w)
      }
      return sum(%s * %w) + sum(exp(%w))
    }
    func @g(%xs: tensor<4x3xf64>, %w: tensor<3xf64>) -> (tensor<f64>, tensor<4x3xf64>, tensor<3xf64>) {
      %l, %a, %b = grad @f(%xs, %w) wrt (%xs, %w)
      return %l, %a, %b
    }""")


def test_gradient_through_stacked_outputs() -> None:
    """The loss reads only `collect`ed values; one of them is a sequence element, one the
    carry's value before the step."""
    check_against_fd("""
    func @f(%xs: tensor<5x3xf64>, %w: tensor<3xf64>, %v: tensor<5x3xf64>) -> tensor<f64> {
      %h = %w
      for %x in %xs {
        collect %x into %cx
        collect %h into %before
        %h = tanh(%h * %x + %w)
        collect %h * %h into %hs
      }
      return sum(%hs * %v) + sum(%cx * %before)
    }
    func @g(%xs: tensor<5x3xf64>, %w: tensor<3xf64>, %v: tensor<5x3xf64>)
        -> (tensor<f64>, tensor<5x3xf64>, tensor<3xf64>, tensor<5x3xf64>) {
      %l, %a, %b, %c = grad @f(%xs, %w, %v) wrt (%xs, %w, %v)
      return %l, %a, %b, %c
    }""")


def test_reverse_scan() -> None:
    """A `scan reverse` in SSA form; its stack at index t is step t's value, its final carry
    the one after t = 0."""
    check_against_fd("""
    func @f(%xs: tensor<4x3xf64>, %h0: tensor<3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
      %hT, %as = scan reverse (%x in %xs) carry (%h = %h0) {
        %a = mul %h, %w : tensor<3xf64>
        %b = add %a, %x : tensor<3xf64>
        %h.1 = tanh %b : tensor<3xf64>
        yield (%h.1) stack (%a)
      } : tensor<3xf64>, tensor<4x3xf64>
      %c = mul %as, %xs : tensor<4x3xf64>
      %s = sum %c : tensor<f64>
      %t = sum %hT : tensor<f64>
      %l = add %s, %t : tensor<f64>
      return %l
    }
    func @g(%xs: tensor<4x3xf64>, %h0: tensor<3xf64>, %w: tensor<3xf64>)
        -> (tensor<f64>, tensor<4x3xf64>, tensor<3xf64>, tensor<3xf64>) {
      %l, %a, %b, %c = grad @f(%xs, %h0, %w) wrt (%xs, %h0, %w)
      return %l, %a, %b, %c
    }""")


def test_loss_through_several_scans_in_sequence() -> None:
    """Three loops: the second walks the first one's stack, the third reads the second's
    final carry in every step."""
    check_against_fd("""
    func @f(%xs: tensor<4x3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
      %h = %w
      for %x in %xs {
        %h = tanh(%h * %x)
        collect %h into %hs
      }
      %g = %w
      for %y in %hs {
        %g = sigmoid(%g + %y * %w)
      }
      %k = sum(%g)
      for %z in %xs {
        %k = %k * sum(%z * %g)
      }
      return %k
    }
    func @g(%xs: tensor<4x3xf64>, %w: tensor<3xf64>) -> (tensor<f64>, tensor<4x3xf64>, tensor<3xf64>) {
      %l, %a, %b = grad @f(%xs, %w) wrt (%xs, %w)
      return %l, %a, %b
    }""")


def test_scan_with_length_and_an_integer_carry() -> None:
    """No sequence (`length 4`), an i32 counter carried beside a float carry, and a stack."""
    check_against_fd("""
    func @f(%w: tensor<3xf64>, %n0: tensor<i32>) -> tensor<f64> {
      %s0 = zeros(shape=[3], dtype="f64")
      %sT, %nT, %ts = scan length 4 () carry (%s = %s0, %n = %n0) {
        %one = constant 1 : tensor<i32>
        %n.1 = add %n, %one : tensor<i32>
        %nf = cast %n.1 : tensor<f64>
        %t = mul %w, %nf : tensor<3xf64>
        %u = tanh %t : tensor<3xf64>
        %s.1 = add %s, %u : tensor<3xf64>
        yield (%s.1, %n.1) stack (%t)
      } : tensor<3xf64>, tensor<i32>, tensor<4x3xf64>
      %r = mul %sT, %sT : tensor<3xf64>
      %l = sum %r : tensor<f64>
      %q = sum %ts : tensor<f64>
      %o = add %l, %q : tensor<f64>
      return %o
    }
    func @g(%w: tensor<3xf64>, %n0: tensor<i32>) -> (tensor<f64>, tensor<3xf64>) {
      %l, %a = grad @f(%w, %n0) wrt (%w)
      return %l, %a
    }""")


def test_unused_argument_has_a_zero_gradient() -> None:
    (du, dx) = check_against_fd("""
    func @f(%x: tensor<3xf64>, %u: tensor<2x2xf64>) -> tensor<f64> {
      return sum(%x * %x)
    }
    func @g(%x: tensor<3xf64>, %u: tensor<2x2xf64>) -> (tensor<f64>, tensor<2x2xf64>, tensor<3xf64>) {
      %l, %du, %dx = grad @f(%x, %u) wrt (%u, %x)
      return %l, %du, %dx
    }""")
    np.testing.assert_array_equal(du, np.zeros((2, 2)))


def test_argument_unused_by_a_scan_has_a_zero_gradient() -> None:
    """%v reaches the loop but no value the loss depends on."""
    (dv,) = check_against_fd("""
    func @f(%xs: tensor<4x3xf64>, %v: tensor<3xf64>) -> tensor<f64> {
      %s = sum(%xs, axes=[0])
      for %x in %xs {
        %s = %s * %x
        collect %s * %v into %unused
      }
      return sum(%s)
    }
    func @g(%xs: tensor<4x3xf64>, %v: tensor<3xf64>) -> (tensor<f64>, tensor<3xf64>) {
      %l, %dv = grad @f(%xs, %v) wrt (%v)
      return %l, %dv
    }""")
    np.testing.assert_array_equal(dv, np.zeros(3))


def test_same_value_passed_twice() -> None:
    """grad @f(%x, %x) wrt (0, 1): each gradient is the partial derivative for its own
    position, not their sum."""
    da, db = check_against_fd("""
    func @f(%a: tensor<3xf64>, %b: tensor<3xf64>) -> tensor<f64> {
      return sum(%a * exp(%b))
    }
    func @g(%x: tensor<3xf64>) -> (tensor<f64>, tensor<3xf64>, tensor<3xf64>) {
      %l, %da, %db = grad @f(%x, %x) wrt (0, 1)
      return %l, %da, %db
    }""", f_args=lambda a: [a[0].copy(), a[0].copy()])
    assert not np.allclose(da, db)


def test_same_value_passed_twice_into_a_scan() -> None:
    """The repeated value is a sequence of one argument position and closed over through the
    other."""
    check_against_fd("""
    func @f(%xs: tensor<3x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
      %h = sum(%w, axes=[0])
      for %x in %xs {
        %h = tanh(%h * %x + sum(%w, axes=[1]))
      }
      return sum(%h * %h)
    }
    func @g(%m: tensor<3x3xf64>) -> (tensor<f64>, tensor<3x3xf64>, tensor<3x3xf64>) {
      %l, %dxs, %dw = grad @f(%m, %m) wrt (0, 1)
      return %l, %dxs, %dw
    }""", f_args=lambda a: [a[0].copy(), a[0].copy()])


def test_mlp_example_gradients_match_finite_differences() -> None:
    """examples/mlp.gir (no loop: matmul, relu, reduce_max, log-softmax, mean) at small sizes."""
    text = (ROOT / "examples" / "mlp.gir").read_text(encoding="utf-8").replace("f32", "f64")
    text = text.replace("64x256", "3x5").replace("256x512", "5x4").replace("512x10", "4x3")
    text = text.replace("64x10", "3x3").replace("512xf64", "4xf64").replace("10xf64", "3xf64")
    text = text.replace("@mlp_loss", "@f").replace("@mlp_grads", "@g")
    check_against_fd(text)


# ---------------------------------------------------------------------------------------------
# `?` dimensions: the language allows them in signatures, so gradients must work with them


def check_dynamic(text: str, pipeline: str, args: list[np.ndarray]) -> None:
    reference = gir.parse(text, filename="dynamic.gir")
    module = compile_module(text, pipeline, "dynamic.gir")
    _, *grads = gir.interpret(module, "g", *args)
    for p, g in enumerate(grads):
        want = numeric_gradient(reference, "f", args, p)
        assert g.shape == want.shape
        assert np.max(np.abs(g - want)) < 1e-6 * max(float(np.max(np.abs(want))), 1.0)


DYNAMIC_PRODUCT = """
func @f(%x: tensor<?x3xf64>, %b: tensor<3xf64>) -> tensor<f64> {
  %y = tanh(%x + %b)
  return sum(transpose(%y) @ %y)
}
func @g(%x: tensor<?x3xf64>, %b: tensor<3xf64>) -> (tensor<f64>, tensor<?x3xf64>, tensor<3xf64>) {
  %l, %dx, %db = grad @f(%x, %b) wrt (%x, %b)
  return %l, %dx, %db
}
"""


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_dynamic_batch_through_matmul_and_broadcasting(pipeline: str) -> None:
    """x: ?x3; the loss reduces a static 3x3 product, so no reduction runs over the `?` dim."""
    rng = np.random.default_rng(2)
    check_dynamic(DYNAMIC_PRODUCT, PIPELINES[pipeline], [rng.standard_normal((5, 3)), rng.standard_normal(3)])


DYNAMIC_SUM = """
func @f(%x: tensor<?x3xf64>) -> tensor<f64> {
  return sum(%x * %x) + mean(tanh(%x))
}
func @g(%x: tensor<?x3xf64>) -> (tensor<f64>, tensor<?x3xf64>) {
  %l, %dx = grad @f(%x) wrt (%x)
  return %l, %dx
}
"""


@pytest.mark.xfail(strict=True, raises=gir.GirError, reason=(
    "GAP: the VJP of sum/mean over a `?` dim cannot broadcast the cotangent back (no shape-of op yet); autodiff "
    "says so with the reduction's location"))
def test_dynamic_batch_through_a_reduction() -> None:
    check_dynamic(DYNAMIC_SUM, DEFAULT_PIPELINE, [np.random.default_rng(3).standard_normal((5, 3))])


DYNAMIC_SCAN = """
func @f(%xs: tensor<?x2x3xf64>, %w: tensor<3x3xf64>) -> tensor<f64> {
  %h = zeros(shape=[2, 3], dtype="f64")
  for %x in %xs {
    %h = tanh(%x + %h @ %w)
  }
  return sum(%h * %h)
}
func @g(%xs: tensor<?x2x3xf64>, %w: tensor<3x3xf64>) -> (tensor<f64>, tensor<?x2x3xf64>, tensor<3x3xf64>) {
  %l, %dxs, %dw = grad @f(%xs, %w) wrt (%xs, %w)
  return %l, %dxs, %dw
}
"""


@pytest.mark.parametrize("pipeline", [
    "autodiff-only", "before-push-out",
    "default",
])
def test_dynamic_length_scan(pipeline: str) -> None:
    rng = np.random.default_rng(4)
    args = [rng.standard_normal((4, 2, 3)), 0.5 * rng.standard_normal((3, 3))]
    check_dynamic(DYNAMIC_SCAN, PIPELINES[pipeline], args)
