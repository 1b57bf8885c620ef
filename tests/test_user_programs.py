"""Programs as outside users write them, from the docs only (README, docs/language.md,
docs/python.md, docs/backend.md), against NumPy references: each test is a failure an
acceptance pass found, kept as a regression test, or a documented promise checked end to end.
"""

from __future__ import annotations

import gir
import numpy as np
import pytest

RNG = np.random.default_rng(7)


def arr(*shape: int, dtype: type = np.float32, scale: float = 0.3) -> np.ndarray:
    return (scale * RNG.standard_normal(shape)).astype(dtype)


# -- arguments as NumPy users pass them ---------------------------------------------------------

MATMUL = """
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return %x @ %w
}
"""


@pytest.mark.parametrize("device", ["cpu", "interp", "auto"])
def test_strided_arguments_are_copied_not_refused(device: str) -> None:
    fn = gir.jit(MATMUL, "f", device=device)
    x = arr(4, 3).T                                  # a transposed view
    w = np.asfortranarray(arr(4, 2))                 # Fortran order
    (out,) = fn(x, w)
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-6)
    x2 = arr(3, 8)[:, ::2]                           # a slice with a step
    np.testing.assert_allclose(fn(x2, w=w)[0], x2 @ w, rtol=1e-5, atol=1e-6)
    big_endian = np.ascontiguousarray(x).astype(">f4")
    np.testing.assert_allclose(fn(big_endian, w)[0], x @ w, rtol=1e-5, atol=1e-6)


def test_strided_arguments_python_frontend_and_interpret() -> None:
    x, w = arr(4, 3).T, np.asfortranarray(arr(4, 2))
    out = gir.jit(lambda x, w: gir.tanh(x @ w))(x, w)
    np.testing.assert_allclose(out, np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    (ref,) = gir.interpret(gir.parse(MATMUL), "f", x, w)
    np.testing.assert_allclose(ref, x @ w, rtol=1e-5, atol=1e-6)


# -- SGD training with a Python float learning rate ---------------------------------------------


def _rnn_loss(params, xs, h0):
    def step(h, x):
        h = gir.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        return h, gir.mean(h * h)
    _, per_step = gir.scan(step, h0, xs)
    return gir.sum(per_step)


def _np_rnn_loss(params, xs, h0):
    h, total = h0, 0.0
    for x in xs:
        h = np.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        total += np.mean(h * h)
    return total


def _sgd(params, xs, h0, lr):
    loss, grads = gir.value_and_grad(_rnn_loss)(params, xs, h0)
    return loss, {k: params[k] - lr * grads[k] for k in params}


def test_python_float_learning_rate_meets_f64_params_as_f64() -> None:
    """JAX's weak types: a Python float argument of a jitted function takes the dtype of the
    f64 parameters it multiplies (it was traced as f32 and `f32 * f64` was refused)."""
    params = {"wx": arr(3, 4, dtype=np.float64), "wh": arr(4, 4, dtype=np.float64), "b": np.zeros(4)}
    xs, h0 = arr(5, 2, 3, dtype=np.float64), np.zeros((2, 4))
    step = gir.jit(_sgd)
    loss, new = step(params, xs, h0, 0.5)
    assert loss.dtype == np.float64 and all(v.dtype == np.float64 for v in new.values())
    np.testing.assert_allclose(loss, _np_rnn_loss(params, xs, h0), rtol=1e-12)
    eps, k, idx = 1e-6, "wh", (1, 2)
    plus, minus = {**params, k: params[k].copy()}, {**params, k: params[k].copy()}
    plus[k][idx] += eps
    minus[k][idx] -= eps
    numeric = (_np_rnn_loss(plus, xs, h0) - _np_rnn_loss(minus, xs, h0)) / (2 * eps)
    np.testing.assert_allclose(new[k][idx], params[k][idx] - 0.5 * numeric, rtol=1e-8)
    # the same float with f32 params stays f32; a 0-d array keeps its own dtype (no weak typing):
    # f32 with f64 promotes to f64, as in JAX and NumPy
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    loss32, new32 = step(p32, xs.astype(np.float32), h0.astype(np.float32), 0.5)
    assert loss32.dtype == np.float32 and new32["wx"].dtype == np.float32
    _, new_mixed = step(p32, xs.astype(np.float32), h0.astype(np.float32), np.float64(0.5))
    assert new_mixed["wx"].dtype == np.float64


# -- NumPy spellings on traced values -----------------------------------------------------------


def test_numpy_functions_on_traced_values() -> None:
    """np.sum/np.mean/np.dot/np.where/np.clip/... on a traced value run gir's function (they
    were raw TypeErrors: NumPy passes out=/dtype= to .sum, copy= to __array__)."""
    x, w = arr(5, 3), arr(3, 2)

    def f(x, w):
        return (np.sum(x, axis=0), np.mean(x), np.max(x, axis=1, keepdims=True), np.dot(x, w),
                np.where(x > 0, x, 0.0), np.clip(x, -0.1, 0.1), np.square(x), np.concatenate([x, x], axis=1),
                np.transpose(x), np.reshape(x, (15,)), x.sum(axis=1, dtype=np.float64))

    want = (x.sum(0), x.mean(), x.max(1, keepdims=True), x @ w, np.where(x > 0, x, 0), np.clip(x, -0.1, 0.1),
            x * x, np.concatenate([x, x], 1), x.T, x.reshape(15), x.astype(np.float64).sum(1))
    for device in ("cpu", "interp"):
        got = gir.jit(f, device=device)(x, w)
        for g, r in zip(got, want):
            assert g.shape == r.shape and g.dtype == r.dtype
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call", ["np.log1p(x)", "np.sort(x)", "np.asarray(x)", "x.sum(out=x)"])
def test_numpy_functions_gir_lacks_are_gir_errors(call: str) -> None:
    fn = eval(f"lambda x: {call}")  # noqa: S307 - a fixed list of test expressions
    with pytest.raises(gir.GirError, match="traced"):
        gir.jit(fn)(arr(2, 3))


def test_newaxis_index() -> None:
    x = arr(4, 3)
    got = gir.jit(lambda x: (x[None], x[:, None], x[..., None], x[1, None], x[None, 1:3, ::2]))(x)
    for g, r in zip(got, (x[None], x[:, None], x[..., None], x[1, None], x[None, 1:3, ::2])):
        np.testing.assert_array_equal(g, r)
    # broadcasting with it, and its gradient
    g = gir.jit(gir.grad(lambda x: gir.sum(x[:, None, :] * x[None, :, :])))(x.astype(np.float64))
    np.testing.assert_allclose(g, 2 * x.sum(0, keepdims=True).repeat(4, 0), rtol=1e-6)


# -- the CLI ------------------------------------------------------------------------------------


def _cli(capsys, monkeypatch, argv: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    import io

    import gir.cli

    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = gir.cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_reads_standard_input(capsys, monkeypatch) -> None:
    """`gir opt -` / `gir run -` read the program from stdin, as mlir-opt does (it was 'cannot read -')."""
    code, out, _ = _cli(capsys, monkeypatch, ["opt", "-", "-p", "ssa"], MATMUL)
    assert code == 0 and "func @f" in out and "matmul" in out
    code, out, _ = _cli(capsys, monkeypatch, ["run", "-", "--random", "0"], MATMUL)
    assert code == 0 and "@f on cpu:" in out
    code, _, err = _cli(capsys, monkeypatch, ["opt", "-"], MATMUL.replace("%x @ %w", "%x @ %v"))
    assert code == 1 and err.startswith("<stdin>:3:15: error: use of undefined value %v") and "Traceback" not in err


@pytest.mark.parametrize("n", ["0", "-1"])
def test_cli_repeat_must_run_once(capsys, monkeypatch, tmp_path, n: str) -> None:
    path = tmp_path / "f.gir"
    path.write_text(MATMUL)
    code, out, err = _cli(capsys, monkeypatch, ["run", str(path), "--random", "0", f"--repeat={n}"])
    assert code == 1 and "--repeat: run at least once" in err and out == ""


def test_zeros_of_unknown_batch_says_what_to_do() -> None:
    """gir.zeros((B, 4)) with B = xs.shape[1] a `?` dim (the usual initial state) is a GirTraceError
    that names the way out (it said only 'must be non-negative integers, got (None, 4)')."""
    def loss(w, xs):
        h0 = gir.zeros((xs.shape[1], 4))
        h, _ = gir.scan(lambda h, x: (gir.tanh(x @ w + h), None), h0, xs)
        return gir.sum(h)
    with pytest.raises(gir.GirTraceError, match=r"`\?` dim .*zeros_like") as e:
        gir.trace(loss, arr(3, 4), gir.spec("?x?x3"))
    assert e.value.loc.line > 0 and "h0 = gir.zeros" in str(e.value)
    # with concrete sizes (what gir.jit traces with) the same function runs
    w, xs = arr(3, 4), arr(5, 2, 3)
    h = np.zeros((2, 4), np.float32)
    for x in xs:
        h = np.tanh(x @ w + h)
    np.testing.assert_allclose(gir.jit(loss)(w, xs), h.sum(), rtol=1e-5)


def test_parse_takes_bytes_and_refuses_other_types() -> None:
    """gir.parse(b"...") parses (it raised a TypeError); gir.parse(123) is a GirArgumentError (it
    raised an AttributeError)."""
    assert str(gir.parse(MATMUL.encode())) == str(gir.parse(MATMUL))
    with pytest.raises(gir.GirSyntaxError, match="UTF-8"):
        gir.parse(b"\xff" + MATMUL.encode())
    for bad in (123, None, ["func"]):
        with pytest.raises(gir.GirArgumentError, match="gir.parse takes the text"):
            gir.parse(bad)  # type: ignore[arg-type]


def test_api_arguments_of_the_wrong_kind(tmp_path) -> None:
    """gir.jit takes a pathlib.Path as gir.load does; a non-path to gir.load (open(0) would read
    stdin), a non-str entry, gir.spec(3) were raw Python exceptions or wrong."""
    import pathlib

    path = tmp_path / "m.gir"
    path.write_text(MATMUL)
    x, w = arr(3, 4), arr(4, 2)
    np.testing.assert_allclose(gir.jit(pathlib.Path(path), "f")(x, w)[0], x @ w, rtol=1e-5, atol=1e-6)
    for bad in (0, None, 1.5):
        with pytest.raises(gir.GirArgumentError, match="gir.load takes a path"):
            gir.load(bad)  # type: ignore[arg-type]
    with pytest.raises(gir.GirArgumentError, match="function's name"):
        gir.jit(MATMUL, 0)  # type: ignore[arg-type]
    assert gir.spec(3).type == gir.spec("3").type and gir.spec(None).type == gir.spec("?").type
    with pytest.raises(gir.GirTraceError, match="gir.spec: the shape"):
        gir.spec(2.5)  # type: ignore[arg-type]


def test_gather_with_a_constant_index_array() -> None:
    """emb[ids] with ids a NumPy array or list closed over (not an argument) gathers, and its
    gradient scatter-adds (it was 'unsupported index array(...)')."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([[1], [3]], np.int32)
    got = gir.jit(lambda x: (x[[0, 2, 2]], x[ids], x[np.array([3, 0], np.uint8)]))(x)
    for g, r in zip(got, (x[[0, 2, 2]], x[ids], x[[3, 0]])):
        np.testing.assert_array_equal(g, r)
    picked = np.array([2, 0, 2])
    g = gir.jit(gir.grad(lambda x: gir.sum(x[picked] ** 2)))(x.astype(np.float64))
    want = np.zeros((4, 3))
    np.add.at(want, picked, 2 * x[picked])
    np.testing.assert_allclose(g, want)
    with pytest.raises(gir.GirTraceError, match="leading axis"):
        gir.jit(lambda x: x[:, np.array([0, 2])])(x)


def test_python_scalar_stays_weak_through_grad() -> None:
    """A Python float passed to gir.grad(f) (eagerly or under gir.jit) meets f64 values as f64
    inside f, as the weak scalar arguments of gir.jit do."""
    x = np.arange(3.0)
    f = lambda x, a: gir.sum(a * x * x)  # noqa: E731
    np.testing.assert_allclose(gir.grad(f)(x, 2.0), 4 * x)
    np.testing.assert_allclose(gir.jit(gir.grad(f))(x, 2.0), 4 * x)
    np.testing.assert_allclose(gir.jit(lambda x, a: gir.grad(f)(x, a))(x, 2.0), 4 * x)
    value, (dx, da) = gir.jit(gir.value_and_grad(f, argnums=(0, 1)))(x, 2.0)
    np.testing.assert_allclose([value, da], [10.0, 5.0])
    assert dx.dtype == np.float64 and da.dtype == np.float32  # a scalar standing alone is f32


def test_scan_carry_that_changes_shape_is_named_once() -> None:
    xs = np.ones((3, 2), np.float32)
    with pytest.raises(gir.GirTraceError, match=r"changes the carry from tensor<f32> to tensor<2xf32>"):
        gir.jit(lambda xs: gir.scan(lambda c, x: (c + x, None), 0.0, xs)[0])(xs)
    with pytest.raises(gir.GirTraceError, match=r"changes the carry carry_1 from tensor<f32> to tensor<2xf32>"):
        gir.jit(lambda xs: gir.scan(lambda c, x: ((c[0], c[1] + x), None), (0.0, 0.0), xs)[0])(xs)


def test_arithmetic_on_weak_scalars_stays_weak() -> None:
    """`lr * 2.0`, `lr / n`, `-lr`, `gir.exp(lr)` on weak scalar arguments are weak (JAX), so
    `p - (lr * 2.0) * g` with f64 p is f64 (it was 'operand dtypes differ')."""
    p, g = np.ones(3), np.arange(3.0)
    cases = [(lambda p, g, lr: p - (lr * 2.0) * g, 1 - 1.0 * g),
             (lambda p, g, lr: p - lr / 2 * g, 1 - 0.25 * g),
             (lambda p, g, lr: p - (-lr) * g, 1 + 0.5 * g),
             (lambda p, g, lr: p - gir.exp(lr) * abs(lr) * gir.maximum(lr, 0.1) * g, 1 - np.exp(0.5) * 0.25 * g)]
    for fn, want in cases:
        got = gir.jit(fn)(p, g, 0.5)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert gir.jit(lambda lr: lr * 2.0)(0.5).dtype == np.float32  # standing alone: f32


# -- whole programs, end to end, against NumPy ---------------------------------------------------

PEEPHOLE_LSTM = """
func @lstm_loss(%xs: tensor<?x2x3xf64>, %h0: tensor<2x4xf64>, %c0: tensor<2x4xf64>,
                %w: tensor<3x16xf64>, %u: tensor<4x16xf64>, %b: tensor<16xf64>, %p: tensor<4xf64>) -> tensor<f64> {
  %h = %h0
  %c = %c0
  %loss = constant 0.0 : tensor<f64>
  for %x in %xs {
    %g = %x @ %w + %h @ %u + %b
    %i = sigmoid(slice(%g, starts=[0, 0], limits=[2, 4]) + %p * %c)
    %f = sigmoid(slice(%g, starts=[0, 4], limits=[2, 8]))
    %o = sigmoid(slice(%g, starts=[0, 8], limits=[2, 12]))
    %z = tanh(slice(%g, starts=[0, 12], limits=[2, 16]))
    %c = %f * %c + %i * %z
    %h = %o * tanh(%c)
    %loss = %loss + mean(%h * %h)
  }
  return %loss
}

func @grads(%xs: tensor<?x2x3xf64>, %h0: tensor<2x4xf64>, %c0: tensor<2x4xf64>,
            %w: tensor<3x16xf64>, %u: tensor<4x16xf64>, %b: tensor<16xf64>, %p: tensor<4xf64>)
    -> (tensor<f64>, tensor<3x16xf64>, tensor<4xf64>, tensor<2x4xf64>) {
  %loss, %dw, %dp, %dh0 = grad @lstm_loss(%xs, %h0, %c0, %w, %u, %b, %p) wrt (%w, %p, %h0)
  return %loss, %dw, %dp, %dh0
}
"""


def _np_peephole(xs, h0, c0, w, u, b, p):
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h, c, loss = h0, c0, 0.0
    for x in xs:
        g = x @ w + h @ u + b
        c = sig(g[:, 4:8]) * c + sig(g[:, :4] + p * c) * np.tanh(g[:, 12:])
        h = sig(g[:, 8:12]) * np.tanh(c)
        loss += np.mean(h * h)
    return loss


def _numeric_grad(f, args, i, eps=1e-6):
    g = np.zeros_like(args[i])
    for idx in np.ndindex(g.shape):
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[i][idx] += eps
        minus[i][idx] -= eps
        g[idx] = (f(*plus) - f(*minus)) / (2 * eps)
    return g


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_peephole_lstm_gir_with_unknown_length_against_finite_differences(device: str) -> None:
    fn = gir.jit(PEEPHOLE_LSTM, "grads", device=device)
    for steps in (1, 4):
        args = [arr(steps, 2, 3, dtype=np.float64)] + [arr(*s, dtype=np.float64) for s in
                                                       ((2, 4), (2, 4), (3, 16), (4, 16), (16,), (4,))]
        out = fn(*args)
        np.testing.assert_allclose(out.loss, _np_peephole(*args), rtol=1e-12)
        for got, i in ((out.dw, 3), (out.dp, 6), (out.dh0, 1)):
            np.testing.assert_allclose(got, _numeric_grad(_np_peephole, args, i), atol=1e-8)


def test_two_layer_gru_sgd_in_python_against_numpy() -> None:
    """A JAX-style training loop: gir.jit(train_step) with value_and_grad over a list of dicts,
    a Python float learning rate, a `?`-free batch, five steps, against NumPy."""
    def cell(p, h, x):
        z = gir.sigmoid(x @ p["wz"] + h @ p["uz"])
        hh = gir.tanh(x @ p["wh"] + (z * h) @ p["uh"])
        return (1 - z) * h + z * hh

    def loss(layers, xs, ys):
        def step(hs, x):
            h1 = cell(layers[0], hs[0], x)
            h2 = cell(layers[1], hs[1], h1)
            return (h1, h2), h2
        batch = xs.shape[1]
        _, top = gir.scan(step, (gir.zeros((batch, 4)), gir.zeros((batch, 4))), xs)
        return gir.mean((top - ys) ** 2)

    def train_step(layers, xs, ys, lr):
        value, grads = gir.value_and_grad(loss)(layers, xs, ys)
        return value, [{k: p[k] - lr * g[k] for k in p} for p, g in zip(layers, grads)]

    def np_loss(layers, xs, ys):
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731

        def np_cell(p, h, x):
            z = sig(x @ p["wz"] + h @ p["uz"])
            return (1 - z) * h + z * np.tanh(x @ p["wh"] + (z * h) @ p["uh"])
        h1 = h2 = np.zeros((xs.shape[1], 4))
        total = 0.0
        for x, y in zip(xs, ys):
            h1 = np_cell(layers[0], h1, x)
            h2 = np_cell(layers[1], h2, h1)
            total += np.mean((h2 - y) ** 2)
        return total / len(xs)

    layers = [{k: arr(3 if k[0] == "w" else 4, 4) for k in ("wz", "uz", "wh", "uh")},
              {k: arr(4, 4) for k in ("wz", "uz", "wh", "uh")}]
    xs, ys = arr(6, 2, 3, scale=1.0), arr(6, 2, 4, scale=1.0)
    step = gir.jit(train_step)
    losses = []
    for _ in range(5):
        value, layers = step(layers, xs, ys, 0.5)
        losses.append(float(value))
    assert losses == sorted(losses, reverse=True) and step.specialisations == 1
    final = {k: v.astype(np.float64) for k, v in layers[0].items()}
    np.testing.assert_allclose(float(step(layers, xs, ys, 0.5)[0]),
                               np_loss([final, {k: v.astype(np.float64) for k, v in layers[1].items()}], xs, ys),
                               rtol=1e-5)


def test_jax_only_jit_options_are_gir_errors() -> None:
    """gir.jit(fn, keep_unused=True) was a bare TypeError; it says what gir.jit takes
    (static_argnums is supported for Python functions: tests/test_jax_surface.py; donate_argnums
    too: tests/test_gpu_training.py)."""
    with pytest.raises(gir.GirArgumentError, match="no option keep_unused.*static_argnums"):
        gir.jit(lambda x, n: x * n, keep_unused=True)
    with pytest.raises(gir.GirArgumentError, match="no option keep_unused"):
        gir.jit(MATMUL, "f", keep_unused=True)
    with pytest.raises(gir.GirArgumentError, match="donate_argnums is for a Python function"):
        gir.jit(MATMUL, "f", donate_argnums=0)
    with pytest.raises(gir.GirArgumentError, match="static_argnums and static_argnames are for a Python function"):
        gir.jit(MATMUL, "f", static_argnums=0)


def test_arithmetic_with_an_unknown_dim_is_a_gir_error() -> None:
    """x.sum() / x.shape[0] traced with a `?` leading dim was a bare TypeError (None)."""
    with pytest.raises(gir.GirTraceError, match=r"`\?` dim of .shape is None"):
        gir.trace(lambda x: x.sum() / x.shape[0], gir.spec("?x3"))
    x = arr(4, 3)
    np.testing.assert_allclose(gir.jit(lambda x: x.sum() / x.shape[0])(x), x.sum() / 4, rtol=1e-6)


DYNAMIC_GRAD = """
func @loss(%xs: tensor<?x?x8xf32>, %h0: tensor<?x8xf32>, %w: tensor<8x8xf32>) -> tensor<f32> {
  %h = %h0
  for %x in %xs {
    %h = tanh(%x @ %w + %h)
  }
  return mean(%h)
}

func @grads(%xs: tensor<?x?x8xf32>, %h0: tensor<?x8xf32>, %w: tensor<8x8xf32>) -> (tensor<f32>, tensor<8x8xf32>) {
  %l, %dw = grad @loss(%xs, %h0, %w) wrt (%w)
  return %l, %dw
}
"""


def test_print_ir_after_failure_when_a_pass_rejects_the_program(capsys, monkeypatch, tmp_path) -> None:
    """`gir opt --print-ir-after-failure` printed nothing when the failing pass raised a plain
    GirError about the program (autodiff over a `?` carry) rather than a GirPassError."""
    path = tmp_path / "dyn.gir"
    path.write_text(DYNAMIC_GRAD)
    code, out, err = _cli(capsys, monkeypatch, ["opt", str(path), "--print-ir-after-failure"])
    assert code == 1 and "error: autodiff" in err
    dump = err.split("// -----// IR Dump After autodiff Failed //----- //\n", 1)[1]
    assert "func @grads" in dump and "Traceback" not in err


def test_weak_int_and_weak_float_arguments_give_a_float() -> None:
    out = gir.jit(lambda n, lr, x: x * (n / lr) + lr / n)(4, 0.5, np.ones(2))
    np.testing.assert_allclose(out, np.full(2, 8.125))
    assert out.dtype == np.float64
