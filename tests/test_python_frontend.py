"""The Python tracing frontend (DESIGN.md §7, docs/python.md): every operator, method and
function against NumPy (interpreter and CPU), scans against Python loops, gradients against
finite differences in float64, pytrees, `?` specs, print -> parse round trips, and errors
located at the user's Python line.
"""

from __future__ import annotations

import inspect

import gir
import numpy as np
import pytest
from gir.frontend.python import trace_entry
from gir.ir.printer import print_module

RNG = np.random.default_rng(0)


def arr(*shape: int, dtype: type = np.float32, positive: bool = False) -> np.ndarray:
    a = RNG.standard_normal(shape)
    return (np.abs(a) + 0.5 if positive else a).astype(dtype)


def line_of(fn: object, text: str) -> int:
    """The file line number of the first line of fn's source containing text."""
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return start + next(i for i, line in enumerate(lines) if text in line)


def run_interp(fn, *args):
    return gir.jit(fn, device="interp")(*args)


def close(got, want, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in _leaves(t)]
    return [tree]


# -- operators, methods and functions against NumPy ---------------------------------------------

A, B, V, P = arr(3, 4), arr(3, 4), arr(4), arr(3, 4, positive=True)
M, N3 = arr(4, 5), arr(2, 3, 4)
I32 = RNG.integers(-5, 5, (3, 4)).astype(np.int32)

# (name, traced function, NumPy reference, arguments): the function runs traced; the reference
# on the same NumPy arrays.
CASES = [
    ("add", lambda a, b: a + b, None, (A, B)),
    ("sub", lambda a, b: a - b, None, (A, B)),
    ("mul", lambda a, b: a * b, None, (A, B)),
    ("div", lambda a, b: a / b, None, (A, P)),
    ("matmul", lambda a, m: a @ m, None, (A, M)),
    ("pow", lambda p, b: p ** b, None, (P, B)),
    ("pow-scalar", lambda p: p ** 2 + 2.0 ** p, None, (P,)),
    ("reflected", lambda a: 1.0 + a, None, (A,)),
    ("reflected-ops", lambda a: (2.0 - a) * (3.0 / (a * a + 1.0)) + 1 * a, None, (A,)),
    ("broadcast", lambda a, v: a * v + v, None, (A, V)),
    ("neg", lambda a: -a, None, (A,)),
    ("lt", lambda a, b: a < b, None, (A, B)),
    ("le", lambda a, b: a <= b, None, (A, B)),
    ("gt", lambda a, b: a > 0.0, None, (A, B)),
    ("ge", lambda a, b: a >= b, None, (A, B)),
    ("eq", lambda a, b: a == a, None, (A, B)),
    ("ne", lambda a, b: a != b, None, (A, B)),
    ("T", lambda a: a.T, None, (A,)),
    ("T-vector", lambda v: v.T, None, (V,)),
    ("shape-dtype", lambda a: a.reshape(a.shape[1], a.shape[0]) * a.dtype.type(2), None, (A,)),
    ("index", lambda a: a[1], None, (A,)),
    ("index-negative", lambda a: a[-1], None, (A,)),
    ("index-2d", lambda a: a[1, 2], None, (A,)),
    ("index-inner", lambda n: n[:, 1], None, (N3,)),
    ("slice", lambda a: a[0:2, 1:3], None, (A,)),
    ("slice-step", lambda a: a[::2, 1::2], None, (A,)),
    ("slice-ellipsis", lambda n: n[..., 1:3], None, (N3,)),
    ("slice-mixed", lambda n: n[1, 1:, -2], None, (N3,)),
    ("reshape", lambda a: a.reshape(2, 6), None, (A,)),
    ("reshape-tuple", lambda a: a.reshape((4, -1)), None, (A,)),
    ("sum", lambda a: a.sum(), None, (A,)),
    ("sum-axis", lambda a: a.sum(axis=0), None, (A,)),
    ("sum-keepdims", lambda n: n.sum(axis=(0, 2), keepdims=True), None, (N3,)),
    ("mean", lambda a: a.mean(axis=1), None, (A,)),
    ("max", lambda a: a.max(), None, (A,)),
    ("max-axis", lambda a: a.max(axis=-1), None, (A,)),
    ("min-method", lambda a: a.min(axis=0), None, (A,)),
    ("astype", lambda a: a.astype(np.float64) * 2.0, None, (A,)),
    ("int-ops", lambda i: i * 2 + i - 1, None, (I32,)),
    ("batched-matmul", lambda n, m: n @ m, None, (N3, M)),
    ("vector-matmul", lambda v, m: v @ m, None, (V, M)),
    ("matrix-vector", lambda a, v: a @ v, None, (A, V)),
    ("ufunc-on-tracer", lambda a: np.tanh(a) + np.maximum(a, 0.0), None, (A,)),
    ("tanh", gir.tanh, np.tanh, (A,)),
    ("sigmoid", gir.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (A,)),
    ("exp", gir.exp, np.exp, (A,)),
    ("log", gir.log, np.log, (P,)),
    ("relu", gir.relu, lambda x: np.maximum(x, 0), (A,)),
    ("sqrt", gir.sqrt, np.sqrt, (P,)),
    ("abs", gir.abs, np.abs, (A,)),
    ("maximum", gir.maximum, np.maximum, (A, B)),
    ("minimum", gir.minimum, np.minimum, (A, B)),
    ("maximum-scalar", lambda a: gir.maximum(a, 0.5), lambda a: np.maximum(a, np.float32(0.5)), (A,)),
    ("where", lambda a, b: gir.where(a > b, a, b), lambda a, b: np.where(a > b, a, b), (A, B)),
    ("where-scalar", lambda a: gir.where(a > 0, a, 0.0), lambda a: np.where(a > 0, a, np.float32(0)), (A,)),
    ("sum-fn", lambda a: gir.sum(a, axis=1), lambda a: np.sum(a, axis=1), (A,)),
    ("mean-fn", gir.mean, np.mean, (A,)),
    ("max-fn", lambda a: gir.max(a, axis=0, keepdims=True), lambda a: np.max(a, axis=0, keepdims=True), (A,)),
    ("concatenate", lambda a, b: gir.concatenate([a, b], axis=1), lambda a, b: np.concatenate([a, b], 1), (A, B)),
    ("stack", lambda a, b: gir.stack([a, b, a]), lambda a, b: np.stack([a, b, a]), (A, B)),
    ("stack-axis", lambda a, b: gir.stack((a, b), axis=2), lambda a, b: np.stack((a, b), 2), (A, B)),
    ("zeros", lambda a: gir.zeros((2, 3)) + a.sum(), lambda a: np.zeros((2, 3), np.float32) + a.sum(), (A,)),
    ("ones", lambda a: gir.ones(3, dtype="f64"), lambda a: np.ones(3), (A,)),
    ("zeros_like", lambda a: gir.zeros_like(a) + 1.0, lambda a: np.zeros_like(a) + 1, (A,)),
    ("transpose", lambda n: gir.transpose(n, (1, 0, 2)), lambda n: np.transpose(n, (1, 0, 2)), (N3,)),
    ("transpose-default", gir.transpose, np.transpose, (N3,)),
    ("reshape-fn", lambda a: gir.reshape(a, (12,)), lambda a: np.reshape(a, (12,)), (A,)),
    ("matmul-fn", gir.matmul, np.matmul, (A, M)),
    ("logsumexp", gir.logsumexp, lambda a: np.log(np.sum(np.exp(a))), (A,)),
    ("logsumexp-axis", lambda a: gir.logsumexp(a * 100.0, axis=1),
     lambda a: np.max(a * 100, 1) + np.log(np.sum(np.exp(a * 100 - np.max(a * 100, 1, keepdims=True)), 1)), (A,)),
    ("logsumexp-keepdims", lambda a: gir.logsumexp(a, axis=0, keepdims=True),
     lambda a: np.log(np.sum(np.exp(a), 0, keepdims=True)), (A,)),
]


def _reference(fn, ref, args):
    return (ref or fn)(*args)


@pytest.mark.parametrize("name,fn,ref,args", CASES, ids=[c[0] for c in CASES])
def test_operation_matches_numpy_on_the_interpreter(name, fn, ref, args) -> None:
    want = _reference(fn, ref, args)
    close(run_interp(fn, *args), np.asarray(want), rtol=2e-5, atol=1e-5)


def test_every_operation_matches_numpy_on_the_cpu_and_round_trips() -> None:
    """All cases in one traced function (one compilation); the printed module re-parses and
    the interpreter gives the same results on it."""
    def everything(*args):
        return tuple(case[1](*a) for case, a in zip(CASES, _split(args)))

    flat = [x for _, _, _, a in CASES for x in a]
    want = [np.asarray(_reference(fn, ref, a)) for _, fn, ref, a in CASES]
    close(gir.jit(everything)(*flat), tuple(want), rtol=2e-5, atol=1e-5)
    traced = trace_entry(everything, flat)
    gir.verify(traced.module)
    reparsed = gir.parse(str(traced.module))
    assert str(reparsed) == str(traced.module)
    close(tuple(gir.jit(reparsed, traced.entry, device="interp")(*flat)), tuple(want), rtol=2e-5, atol=1e-5)


def _split(args):
    out, i = [], 0
    for _, _, _, a in CASES:
        out.append(args[i:i + len(a)])
        i += len(a)
    return out


def test_python_control_flow_over_python_values_unrolls() -> None:
    def f(x, n_layers=3):
        for i in range(n_layers):
            x = gir.tanh(x * (i + 1.0)) if i % 2 == 0 else x + 1.0
        return x

    x = arr(2, 3)
    want = np.tanh(3 * (np.tanh(x) + 1))  # i = 0: tanh(x * 1); i = 1: + 1; i = 2: tanh(x * 3)
    close(run_interp(f, x), want.astype(np.float32))
    assert str(gir.trace(f, x)).count("tanh") == 2


# -- scan -----------------------------------------------------------------------------------------


def test_scan_matches_a_python_loop() -> None:
    xs, h0, w = arr(5, 2, 3), arr(2, 3), arr(3, 3)

    def f(xs, h0, w):
        def step(h, x):
            h = gir.tanh(x + h @ w)
            return h, h.sum()
        return gir.scan(step, h0, xs)

    h, ys = h0, []
    for x in xs:
        h = np.tanh(x + h @ w)
        ys.append(h.sum())
    close(run_interp(f, xs, h0, w), (h, np.array(ys, np.float32)))


def test_scan_reverse_length_and_pytrees() -> None:
    xs = {"a": arr(4, 3), "b": arr(4)}
    init = (arr(3), {"n": np.float32(0.0)})

    def f(xs, init):
        def step(carry, x):
            v, acc = carry
            v = v * 0.5 + x["a"] * x["b"]
            return (v, {"n": acc["n"] + v.sum()}), {"v": v, "twice": [v * 2.0]}
        return gir.scan(step, init, xs, reverse=True)

    v, n, vs = init[0], np.float32(0.0), [None] * 4
    for t in reversed(range(4)):
        v = v * np.float32(0.5) + xs["a"][t] * xs["b"][t]
        n = n + v.sum()
        vs[t] = v
    got = run_interp(f, xs, init)
    close(got, ((v, {"n": np.asarray(n)}), {"v": np.stack(vs), "twice": [2 * np.stack(vs)]}), rtol=1e-5)
    assert isinstance(got[0][1], dict) and isinstance(got[1]["twice"], list)

    def counter(x0):
        return gir.scan(lambda c, _: (c + 1.0, c * c), x0, length=3)

    close(run_interp(counter, np.float32(2.0)), (np.float32(5.0), np.array([4, 9, 16], np.float32)))


def test_nested_scans_and_outer_values() -> None:
    xss, w = arr(3, 4, 2), arr(2)

    def f(xss, w):
        def outer(total, xs):
            def inner(acc, x):
                return acc + gir.sum(x * w), None       # reads w from the function, no stack
            acc, _ = gir.scan(inner, total * 0.0, xs)
            return total + acc, acc
        return gir.scan(outer, 0.0, xss)

    per_row = np.array([(xs * w).sum() for xs in xss], np.float32)
    close(run_interp(f, xss, w), (np.float32(per_row.sum()), per_row), rtol=1e-5)


# -- gradients ------------------------------------------------------------------------------------


def rnn_loss(params, xs, h0):
    def step(h, x):
        h = gir.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        return h, gir.sum(h * h)
    h, per_step = gir.scan(step, h0, xs)
    return gir.sum(per_step)


def _params64() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"wx": 0.3 * rng.standard_normal((3, 4)), "wh": 0.3 * rng.standard_normal((4, 4)),
            "b": 0.1 * rng.standard_normal(4)}


def _numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def _np_rnn_loss(params, xs, h0) -> float:
    h, loss = h0, 0.0
    for x in xs:
        h = np.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
        loss += float((h * h).sum())
    return loss


def test_value_and_grad_of_a_pytree_matches_finite_differences() -> None:
    params = _params64()
    xs, h0 = np.random.default_rng(2).standard_normal((4, 2, 3)), np.zeros((2, 4))
    loss, grads = gir.jit(gir.value_and_grad(rnn_loss), device="interp")(params, xs, h0)
    assert set(grads) == set(params)
    np.testing.assert_allclose(loss, _np_rnn_loss(params, xs, h0), rtol=1e-12)
    for k in params:
        num = _numeric_grad(lambda p, k=k: _np_rnn_loss({**params, k: p}, xs, h0), params[k])
        assert grads[k].shape == params[k].shape and grads[k].dtype == np.float64
        np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-8)


def test_grad_argnums_tuple_wrt_alias_and_cpu() -> None:
    params = _params64()
    xs, h0 = np.random.default_rng(3).standard_normal((3, 2, 3)), 0.1 * np.ones((2, 4))
    g_params, g_h0 = gir.jit(gir.grad(rnn_loss, argnums=(0, 2)))(params, xs, h0)
    num_h0 = _numeric_grad(lambda h: _np_rnn_loss(params, xs, h), h0)
    np.testing.assert_allclose(g_h0, num_h0, rtol=1e-6, atol=1e-8)
    g_xs = gir.jit(gir.grad(rnn_loss, wrt=1), device="interp")(params, xs, h0)
    np.testing.assert_allclose(g_xs, _numeric_grad(lambda x: _np_rnn_loss(params, x, h0), xs), rtol=1e-6, atol=1e-8)
    num_wh = _numeric_grad(lambda w: _np_rnn_loss({**params, "wh": w}, xs, h0), params["wh"])
    np.testing.assert_allclose(g_params["wh"], num_wh, rtol=1e-6, atol=1e-8)


def test_grad_of_a_closure_over_traced_values_and_eager_grad() -> None:
    """f closes over w (a value of the caller): w becomes an extra argument of @f."""
    x, w = np.random.default_rng(4).standard_normal(3), np.random.default_rng(5).standard_normal(3)

    def outer(x, w):
        def f(x):
            return gir.sum(gir.tanh(x * w) ** 2.0)
        return gir.grad(f)(x)

    want = _numeric_grad(lambda x: float((np.tanh(x * w) ** 2).sum()), x)
    np.testing.assert_allclose(gir.jit(outer, device="interp")(x, w), want, rtol=1e-6)
    module = gir.trace(outer, x, w)
    gir.verify(module)
    assert "grad @f(%x, %w) wrt (%x)" in str(module)
    assert str(gir.parse(str(module))) == str(module)
    # Outside a trace, gir.grad and gir's functions run eagerly (the interpreter).
    np.testing.assert_allclose(gir.grad(lambda x: gir.sum(x * x * x))(x), 3 * x * x, rtol=1e-12)
    np.testing.assert_allclose(gir.tanh(x), np.tanh(x))


def test_grad_passes_keyword_arguments_undifferentiated() -> None:
    def loss(w, x, *, scale):
        return gir.sum(gir.tanh(x @ w) * scale)

    w, x, scale = np.random.default_rng(6).standard_normal((3, 2)), np.ones((4, 3)), np.full(2, 3.0)

    def step(w, x, scale):
        return gir.grad(loss)(w, x, scale=scale)

    want = _numeric_grad(lambda w: float((np.tanh(x @ w) * scale).sum()), w)
    np.testing.assert_allclose(gir.jit(step, device="interp")(w, x, scale), want, rtol=1e-6)
    assert "grad @loss(%w, %x, %scale) wrt (%w)" in str(gir.trace(step, w, x, scale))


def test_training_step_in_one_jit_updates_a_pytree() -> None:
    params = {k: v.astype(np.float32) for k, v in _params64().items()}
    xs, h0 = arr(3, 2, 3), np.zeros((2, 4), np.float32)

    def sgd(params, xs, h0, lr):
        loss, grads = gir.value_and_grad(rnn_loss)(params, xs, h0)
        return loss, {k: params[k] - lr * grads[k] for k in params}

    step = gir.jit(sgd, device="interp")
    loss0, new = step(params, xs, h0, np.float32(0.05))
    loss1, _ = step(new, xs, h0, np.float32(0.05))
    assert step.specialisations == 1 and float(loss1) < float(loss0)
    _, grads = gir.jit(gir.value_and_grad(rnn_loss), device="interp")(params, xs, h0)
    close(new, {k: params[k] - np.float32(0.05) * grads[k] for k in params}, rtol=1e-6)


# -- specs, caching, printing ---------------------------------------------------------------------


def test_specs_with_unknown_dims_print_and_run_per_shape() -> None:
    params = {"wx": gir.spec("3x4"), "wh": gir.spec((4, 4)), "b": gir.spec("4", "float32")}
    module = gir.trace(rnn_loss, params, gir.spec("?x?x3"), gir.spec("?x4", np.float32))
    text = str(module)
    assert "%params_wx: tensor<3x4xf32>" in text and "%xs: tensor<?x?x3xf32>" in text
    assert gir.parse(text) is not None
    fn = gir.jit(rnn_loss, device="interp")
    params32 = {k: v.astype(np.float32) for k, v in _params64().items()}
    for t, batch in [(2, 1), (5, 3), (2, 1)]:
        xs, h0 = arr(t, batch, 3), np.zeros((batch, 4), np.float32)
        np.testing.assert_allclose(fn(params32, xs, h0), _np_rnn_loss(params32, xs, h0), rtol=1e-5)
    assert fn.specialisations == 2


def test_printed_module_is_accepted_by_gir_run_and_opt(tmp_path, capsys) -> None:
    import gir.cli

    module = gir.trace(gir.value_and_grad(rnn_loss), {"wx": gir.spec("3x4"), "wh": gir.spec("4x4"),
                                                      "b": gir.spec("4")}, gir.spec("2x2x3"), gir.spec("2x4"))
    path = tmp_path / "traced.gir"
    path.write_text(str(module))
    assert gir.cli.main(["run", str(path), "--random", "0"]) == 0
    # Printed with its locations, the text keeps pointing at this file after `gir opt`.
    path.write_text(print_module(module, print_locations=True))
    assert gir.cli.main(["opt", str(path), "--print-locations"]) == 0
    out = capsys.readouterr().out
    assert "= scan" in out and "= grad @" not in out
    assert f'loc("{__file__}":{line_of(rnn_loss, "gir.tanh(")}:' in out


def test_locations_point_at_the_python_lines() -> None:
    module = gir.trace(rnn_loss, _params64(), np.zeros((2, 1, 3)), np.zeros((1, 4)))
    text = print_module(module, print_locations=True)
    assert f'loc("{__file__}":{line_of(rnn_loss, "gir.tanh(")}:' in text
    assert f'loc("{__file__}":{line_of(rnn_loss, "gir.scan(")}:' in text
    matmuls = [op for op in module.walk() if op.spec.category == "matmul"]
    assert {op.loc.line for op in matmuls} == {line_of(rnn_loss, "gir.tanh(")}
    assert [op.loc.col for op in matmuls] == [22, 41]  # `x @ params[...]`, `h @ params[...]`


# -- errors at the user's line --------------------------------------------------------------------


def _error(fn, *args) -> gir.GirError:
    with pytest.raises(gir.GirError) as info:
        gir.trace(fn, *args)
    err = info.value
    assert err.loc.file == __file__, str(err)
    return err


def test_shape_mismatch_points_at_the_python_line() -> None:
    def f(x, w):
        y = gir.tanh(x)
        return y @ w

    err = _error(f, gir.spec("2x3"), gir.spec("4x5"))
    assert err.loc.line == line_of(f, "y @ w") and "contraction sizes differ" in err.message
    assert "return y @ w" in str(err) and "^" in str(err)


def test_traced_bool_and_iteration_name_scan_and_where() -> None:
    def branch(x):
        if x.sum() > 0:
            return x
        return -x

    err = _error(branch, gir.spec("3"))
    assert err.loc.line == line_of(branch, "if x.sum()") and "gir.where" in err.message and "gir.scan" in err.message

    def loop(xs):
        total = 0.0
        for x in xs:
            total = total + x
        return total

    err = _error(loop, gir.spec("4x3"))
    assert err.loc.line == line_of(loop, "for x in xs") and "gir.scan" in err.message


@pytest.mark.parametrize("case", ["dtype", "float-int", "leak", "carry", "grad-vector", "index", "asarray",
                                  "attribute", "spec", "slice-unknown"])
def test_errors_are_gir_errors_at_the_user_line(case) -> None:
    kept = []

    def f(x, y, i):
        if case == "dtype":
            return gir.where(x, x, y)                            # MARK dtype
        if case == "float-int":
            return i * 2**40                                     # MARK float-int
        if case == "leak":
            gir.scan(lambda c, x: (kept.append(x) or c, None), x.sum(), x)
            return kept[0] * 2.0                                 # MARK leak
        if case == "carry":
            return gir.scan(lambda c, x: (c.astype(np.float64), None), x.sum(), x)  # MARK carry
        if case == "grad-vector":
            return gir.grad(lambda v: v * 2.0)(x)                # MARK grad-vector
        if case == "index":
            return x[1.5]                                        # MARK index
        if case == "asarray":
            return np.asarray(x)                                 # MARK asarray
        if case == "attribute":
            return x.no_such_method()                            # MARK attribute
        if case == "spec":
            return gir.spec("3xq")                               # MARK spec
        return x.reshape(-1)[1:] + gir.zeros_like(x)             # MARK slice-unknown

    x = gir.spec("?" if case == "slice-unknown" else "4")
    err = _error(f, x, gir.spec("4"), gir.spec("", "i32"))
    lines, start = inspect.getsourcelines(f)
    marked = [start + k for k, line in enumerate(lines) if line.rstrip().endswith(f"# MARK {case}")]
    assert [err.loc.line] == marked, str(err)
    assert isinstance(err, gir.GirError)


def test_a_bad_argument_dtype_names_the_argument() -> None:
    def f(params):
        return params["w"] * 2.0

    with pytest.raises(gir.GirError, match="argument %params_w: unsupported dtype float16") as info:
        gir.trace(f, {"w": np.zeros(3, np.float16)})
    assert info.value.loc.line == line_of(f, "def f")
    with pytest.raises(gir.GirError, match="unsupported dtype 'f16'") as info:
        gir.trace(lambda x: x.astype("f16"), A)
    assert info.value.loc.file == __file__
    with pytest.raises(gir.GirError, match="cannot take 2 argument") as info:
        gir.trace(lambda xs: gir.scan(lambda c: (c, c), 0.0, xs), A)
    assert info.value.loc.file == __file__


def test_a_wrong_number_of_arguments_is_a_gir_error() -> None:
    with pytest.raises(gir.GirError, match="rnn_loss_value_and_grad cannot take 2 argument.*h0"):
        gir.jit(gir.value_and_grad(rnn_loss))(_params64(), np.zeros((2, 1, 3)))
    with pytest.raises(gir.GirError, match="cannot take 4 argument"):
        gir.trace(rnn_loss, 1, 2, 3, 4)
    with pytest.raises(gir.GirError, match="rnn_loss cannot take 1 argument") as info:
        gir.trace(lambda p: gir.grad(rnn_loss)(p), _params64())
    assert info.value.loc.file == __file__


def test_attribute_errors_are_also_attribute_errors() -> None:
    seen = []
    gir.trace(lambda x: seen.append(hasattr(x, "no_such_thing")) or x, gir.spec("2"))
    assert seen == [False]


# -- the examples ---------------------------------------------------------------------------------

SMALL = {"T": 3, "BATCH": 2, "HIDDEN": 4}


def _example(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}_train.py"
    spec = importlib.util.spec_from_file_location(f"{name}_train", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _gemms_in_scans(module: gir.Module, entry: str) -> tuple[int, int]:
    """(matmuls inside loops, outside) in @entry after the default pipeline."""
    from gir.passes.pass_manager import PassManager
    from gir.passes.pipeline import DEFAULT_PIPELINE

    m = module.clone()
    PassManager(DEFAULT_PIPELINE).run(m)
    counts = [0, 0]

    def walk(block, in_loop: bool) -> None:
        for op in block:
            if op.spec.category == "matmul":
                counts[0 if in_loop else 1] += 1
            for region in op.regions:
                walk(region.block, in_loop or op.spec.loop)

    walk(m.functions[entry].body, False)
    return counts[0], counts[1]


SMALL = [("50x32x256", "3x2x5"), ("32x256", "2x5"), ("256x256", "5x5"), ("<256x", "<5x")]
"""examples/*.gir at T=3, batch 2, hidden 5 (the interpreter's GEMMs at full size take seconds)."""


@pytest.mark.parametrize("name,n_states", [("rnn", 1), ("gru", 1), ("lstm", 2)])
def test_examples_match_the_gir_examples(name, n_states) -> None:
    """The Python training steps: the same GEMMs per step as the .gir examples after the
    default pipeline (at full size: scan-grad applies to both), and the same loss and
    gradients (interpreter, small sizes)."""
    example = _example(name)
    loss_fn = getattr(example, f"{name}_loss")
    gir_path = str(example.__file__).replace("_train.py", ".gir")
    rng = np.random.default_rng(0)
    states = (np.zeros((32, 256), np.float32),) * n_states
    full = (example.init_params(rng), np.zeros((50, 32, 256), np.float32), *states)
    traced = trace_entry(gir.value_and_grad(loss_fn), full)
    gemms = _gemms_in_scans(traced.module, traced.entry)
    assert gemms == _gemms_in_scans(gir.load(gir_path), f"{name}_grads")
    assert gemms[0] <= 2 + 2 * (name == "lstm")  # the forward's h @ [U...] and its backward

    text = open(gir_path).read()
    for old, new in SMALL:
        text = text.replace(old, new)
    small = gir.parse(text)
    params = example.init_params(rng, 5, 5)
    xs = rng.standard_normal((3, 2, 5)).astype(np.float32)
    states = [(0.5 * rng.standard_normal((2, 5))).astype(np.float32) for _ in range(n_states)]
    loss, grads = gir.jit(gir.value_and_grad(loss_fn), device="interp")(params, xs, *states)
    f = small.functions[f"{name}_grads"]
    names = [a.name_hint for a in f.args][1 + n_states:]
    flat_params, flat_grads = _flat_params(params), _flat_params(grads)
    want = gir.jit(small, f"{name}_grads", device="interp")(xs, *states, *[flat_params[n] for n in names])
    np.testing.assert_allclose(loss, want[0], rtol=1e-6)
    assert len(want) == 1 + len(flat_grads)
    for n, w in zip(names, want[1:]):
        np.testing.assert_allclose(flat_grads[n], w, rtol=1e-5, atol=1e-6)


def _flat_params(params) -> dict[str, np.ndarray]:
    """{"w": {"i": a}} -> {"w_i": a}; {"wx": a} -> {"wx": a} (the .gir examples' names)."""
    out = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out.update({f"{k}_{g}": a for g, a in v.items()})
        else:
            out[k] = v
    return out


# -- docs/python.md -------------------------------------------------------------------------------


def test_the_python_blocks_of_docs_python_md_run(capsys) -> None:
    """Every ```python block of docs/python.md runs (```py blocks are JAX, not run here); the
    printed trace shown in the page is what gir.trace prints."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "python.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), {})
    shown = re.search(r"^```\n(func @rnn_loss\(%params_b.*?)^```", text, re.S | re.M)
    assert shown is not None
    example = _example("rnn")
    rng = np.random.default_rng(0)
    traced = gir.trace(gir.value_and_grad(example.rnn_loss), example.init_params(rng, 8, 16),
                       np.zeros((5, 4, 8), np.float32), np.zeros((4, 16), np.float32))
    assert str(traced).strip() == shown.group(1).strip()


# -- pytrees --------------------------------------------------------------------------------------


def test_pytrees_round_trip_with_named_arguments_and_keywords() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", ["left", "right"])
    tree = {"layers": [{"w": arr(2, 2), "b": arr(2)}, {"w": arr(2, 2), "b": arr(2)}],
            "pair": Pair(arr(3), (arr(1), None)), "scale": np.float32(2.0)}

    def double(t, bias):
        return {"out": [d["w"] * t["scale"] + bias for d in t["layers"]], "pair": t["pair"], "none": None}

    fn = gir.jit(double, device="interp")
    got = fn(tree, bias=np.float32(1.0))
    assert isinstance(got["pair"], Pair) and got["none"] is None and got["pair"].right[1] is None
    close(got["out"], [d["w"] * 2 + 1 for d in tree["layers"]])
    close([got["pair"].left, got["pair"].right[0]], [tree["pair"].left, tree["pair"].right[0]])
    text = str(gir.trace(double, tree, 1.0))
    for name in ["%t_layers_0_b", "%t_layers_1_w", "%t_pair_left", "%t_pair_right_0", "%t_scale: tensor<f32>",
                 "%bias: tensor<f64>"]:
        assert name in text, name
    with pytest.raises(gir.GirError, match="structure"):
        gir.trace(lambda c, xs: gir.scan(lambda c, x: ((c, c), x), c, xs), np.float32(0), arr(3))


def test_a_jitted_function_called_inside_a_trace_is_inlined() -> None:
    inner = gir.jit(lambda x: x * 2)
    outer = gir.jit(lambda x: inner(x) + 1.0, device="interp")
    close(outer(A), A * 2 + 1)
    assert inner.specialisations == 0 and "constant 2.0 : tensor<f32>" in str(gir.trace(outer.fn, A))


@pytest.mark.parametrize("name,n_states", [("rnn", 1), ("gru", 1), ("lstm", 2)])
def test_example_sgd_steps_update_every_parameter(name, n_states) -> None:
    """examples/*_train.py's sgd_step (what their main() jits): params - lr * grads, same structure."""
    example = _example(name)
    rng = np.random.default_rng(1)
    params = example.init_params(rng, 3, 4)
    xs = rng.standard_normal((2, 2, 3)).astype(np.float32)
    states = [(0.5 * rng.standard_normal((2, 4))).astype(np.float32) for _ in range(n_states)]
    loss_fn = getattr(example, f"{name}_loss")
    want_loss, grads = gir.jit(gir.value_and_grad(loss_fn), device="interp")(params, xs, *states)
    loss, new = gir.jit(example.sgd_step, device="interp")(params, xs, *states, np.float32(0.1))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    flat_new, flat_old, flat_grads = _flat_params(new), _flat_params(params), _flat_params(grads)
    assert set(flat_new) == set(flat_old)
    for k in flat_old:
        np.testing.assert_allclose(flat_new[k], flat_old[k] - np.float32(0.1) * flat_grads[k], rtol=1e-5, atol=1e-7)
        assert np.abs(flat_grads[k]).max() > 0, k


# -- random programs ------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SHAPES = [(), (4,), (3, 1), (3, 4), (1, 4)]
_UNARY = [(gir.tanh, np.tanh), (gir.sigmoid, lambda x: 1 / (1 + np.exp(-x))), (lambda x: -x, lambda x: -x),
          (gir.relu, lambda x: np.maximum(x, 0)), (gir.abs, np.abs), (lambda x: x * 0.5, lambda x: x * 0.5),
          (lambda x: x.sum(axis=-1, keepdims=True) if x.ndim else x,
           lambda x: x.sum(axis=-1, keepdims=True) if x.ndim else x)]
_BINARY = [(lambda a, b: a + b, None), (lambda a, b: a - b, None), (lambda a, b: a * b, None),
           (gir.maximum, np.maximum), (gir.minimum, np.minimum),
           (lambda a, b: gir.where(a > b, a, b * 2.0), lambda a, b: np.where(a > b, a, b * 2.0))]


@st.composite
def _programs(draw):
    """A random expression over three inputs of broadcast-compatible shapes: a list of steps,
    each (unary index, operand) or (binary index, operand, operand); operands index earlier values."""
    shapes = [draw(st.sampled_from(_SHAPES)) for _ in range(3)]
    steps = []
    for i in range(draw(st.integers(1, 8))):
        n = 3 + i
        if draw(st.booleans()):
            steps.append((0, draw(st.integers(0, len(_UNARY) - 1)), draw(st.integers(0, n - 1))))
        else:
            steps.append((1, draw(st.integers(0, len(_BINARY) - 1)), draw(st.integers(0, n - 1)),
                          draw(st.integers(0, n - 1))))
    return shapes, steps


def _evaluate(steps, args, numpy: bool):
    values = list(args)
    for step in steps:
        if step[0] == 0:
            fn, ref = _UNARY[step[1]]
            values.append((ref if numpy else fn)(values[step[2]]))
        else:
            fn, ref = _BINARY[step[1]]
            values.append(((ref or fn) if numpy else fn)(values[step[2]], values[step[3]]))
    return values[-1]


@settings(derandomize=True, deadline=None, max_examples=25, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_programs())
def test_random_programs_match_numpy(program) -> None:
    shapes, steps = program
    rng = np.random.default_rng(len(steps))
    args = [np.asarray(rng.standard_normal(s), np.float32) for s in shapes]
    want = np.asarray(_evaluate(steps, args, numpy=True), np.float32)
    got = gir.jit(lambda *a: _evaluate(steps, a, numpy=False), device="interp")(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
