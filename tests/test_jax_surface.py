"""The JAX surface of the Python frontend (issue 30): has_aux, stop_gradient, gir.numpy's
functions, promotion, tree utilities, cond / fori_loop / while_loop / vmap, gir.optim,
`x.at[idx]` updates, `static_argnums`, jax.nn's activations.

Values against NumPy; gradients against central finite differences in float64, on the
interpreter and the CPU backend."""

from __future__ import annotations

from pathlib import Path

import gir
import gir.numpy as gnp
import numpy as np
import pytest

DEVICES = ["interp", "cpu"]
RNG = np.random.default_rng(7)


def fd_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


# -- has_aux, stop_gradient -------------------------------------------------------------------------


def _aux_loss(w, x):
    y = x @ w
    return gir.sum(gir.softmax(y) * gir.stop_gradient(y)), {"y": y, "best": gir.argmax(y, axis=-1)}


@pytest.mark.parametrize("device", DEVICES)
def test_has_aux_returns_jax_structures_and_stop_gradient_blocks(device) -> None:
    w, x = RNG.standard_normal((3, 4)), RNG.standard_normal((2, 3))
    (value, aux), g = gir.jit(gir.value_and_grad(_aux_loss, has_aux=True), device=device)(w, x)
    g2, aux2 = gir.jit(gir.grad(_aux_loss, has_aux=True), device=device)(w, x)
    y = x @ w

    def numpy_loss(w_, y_fixed=y):
        z = x @ w_
        s = np.exp(z - z.max(-1, keepdims=True))
        return float(((s / s.sum(-1, keepdims=True)) * y_fixed).sum())  # y behind stop_gradient: fixed

    np.testing.assert_allclose(value, numpy_loss(w), rtol=1e-12)
    np.testing.assert_allclose(aux["y"], y, rtol=1e-12)
    np.testing.assert_array_equal(aux["best"], y.argmax(-1))
    np.testing.assert_allclose(g, fd_grad(numpy_loss, w), atol=1e-8)
    np.testing.assert_array_equal(g, g2)
    np.testing.assert_array_equal(aux2["best"], aux["best"])


def test_has_aux_needs_a_pair() -> None:
    with pytest.raises(gir.GirError, match="has_aux=True"):
        gir.jit(gir.grad(lambda w: gir.sum(w), has_aux=True), device="interp")(np.ones(3))


# -- gir.numpy: values ------------------------------------------------------------------------------

X = RNG.standard_normal((3, 4))
IDS = np.array([[1, 0, 3, 3], [2, 2, 0, 1], [3, 1, 1, 0]])

VALUE_CASES = {
    "softmax": (lambda x: gir.nn.softmax(x, axis=-1), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
    "log_softmax": (lambda x: gir.nn.log_softmax(x, axis=0), lambda x: x - np.log(np.exp(x).sum(0, keepdims=True))),
    "one_hot": (lambda x: gir.nn.one_hot(gnp.argmax(x, axis=1), 4, dtype="f64"),
                lambda x: np.eye(4)[x.argmax(1)]),
    "take_along_axis": (lambda x: gnp.take_along_axis(x, IDS[:, :2], axis=1),
                        lambda x: np.take_along_axis(x, IDS[:, :2], axis=1)),
    "take_along_axis0": (lambda x: gnp.take_along_axis(x, IDS[:2] % 3, axis=0),
                         lambda x: np.take_along_axis(x, IDS[:2] % 3, axis=0)),
    "arange": (lambda x: x[0] * gnp.arange(4), lambda x: x[0] * np.arange(4)),
    "argmin": (lambda x: gnp.argmin(x, axis=0), lambda x: x.argmin(0)),
    "argmax_flat": (lambda x: gnp.argmax(x), lambda x: x.argmax()),
    "flip": (lambda x: gnp.flip(x, axis=1), lambda x: np.flip(x, 1)),
    "flip_all": (lambda x: gnp.flip(x), lambda x: np.flip(x)),
    "clip": (lambda x: gnp.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5)),
    "square": (lambda x: gnp.square(x), np.square),
    "log1p": (lambda x: gnp.log1p(x * 1e-9) + gnp.log1p(gnp.abs(x)), lambda x: np.log1p(x * 1e-9) + np.log1p(abs(x))),
    "expm1": (lambda x: gnp.expm1(x * 1e-9), lambda x: np.expm1(x * 1e-9)),
    "expand_dims": (lambda x: gnp.expand_dims(x, (0, 2)), lambda x: np.expand_dims(x, (0, 2))),
    "squeeze": (lambda x: gnp.squeeze(x[None, :, None]), lambda x: x),
    "split": (lambda x: gnp.split(x, [1, 3], axis=1), lambda x: np.split(x, [1, 3], axis=1)),
    "split_sections": (lambda x: gnp.split(x, 2, axis=1), lambda x: np.split(x, 2, axis=1)),
    "cumsum": (lambda x: gnp.cumsum(x, axis=0), lambda x: np.cumsum(x, 0)),
    "cumsum_flat": (lambda x: gnp.cumsum(x), lambda x: np.cumsum(x)),
    "var": (lambda x: gnp.var(x, axis=1), lambda x: np.var(x, 1)),
    "std_ddof": (lambda x: gnp.std(x, axis=0, ddof=1), lambda x: np.std(x, 0, ddof=1)),
    "sign": (lambda x: gnp.sign(x), np.sign),
    "sin_cos": (lambda x: gnp.sin(x) * gnp.cos(2 * x), lambda x: np.sin(x) * np.cos(2 * x)),
    "full": (lambda x: x + gnp.full((3, 4), 2.5), lambda x: x + 2.5),
    "eye": (lambda x: x[:, :3] @ gnp.eye(3, k=1), lambda x: x[:, :3] @ np.eye(3, k=1)),
    "pad": (lambda x: gnp.pad(x, ((1, 0), (2, 1)), constant_values=3.0),
            lambda x: np.pad(x, ((1, 0), (2, 1)), constant_values=3.0)),
    "tile": (lambda x: gnp.tile(x, (2, 1)), lambda x: np.tile(x, (2, 1))),
    "repeat": (lambda x: gnp.repeat(x, 2, axis=1), lambda x: np.repeat(x, 2, axis=1)),
    "prod": (lambda x: gnp.prod(x, axis=1), lambda x: np.prod(x, 1)),
    "prod_keepdims": (lambda x: gnp.prod(x, axis=(0, 1), keepdims=True) + gnp.prod(x, axis=0, keepdims=True),
                      lambda x: np.prod(x, axis=(0, 1), keepdims=True) + np.prod(x, axis=0, keepdims=True)),
    "prod_all": (lambda x: gnp.prod(x[:, :3] + 1.0), lambda x: np.prod(x[:, :3] + 1.0)),
    "isnan": (lambda x: gnp.isnan(gnp.log(x)), lambda x: np.isnan(np.log(x))),
    "einsum_mm": (lambda x: gnp.einsum("ij,kj->ik", x, x), lambda x: np.einsum("ij,kj->ik", x, x)),
    "einsum_batch": (lambda x: gnp.einsum("bi,bj->bij", x, x), lambda x: np.einsum("bi,bj->bij", x, x)),
    "einsum_dot": (lambda x: gnp.einsum("ij,ij->", x, x), lambda x: np.einsum("ij,ij->", x, x)),
    "einsum_sum": (lambda x: gnp.einsum("ij->j", x), lambda x: np.einsum("ij->j", x)),
    "einsum_implicit": (lambda x: gnp.einsum("ij,jk", x, x.T), lambda x: np.einsum("ij,jk", x, x.T)),
    "einsum_bmm": (lambda x: gnp.einsum("bij,bjk->bik", x.reshape(3, 2, 2), x.reshape(3, 2, 2)),
                   lambda x: np.einsum("bij,bjk->bik", x.reshape(3, 2, 2), x.reshape(3, 2, 2))),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_numpy_function_values(name, device) -> None:
    ours, theirs = VALUE_CASES[name]
    with np.errstate(invalid="ignore"):
        got, want = gir.jit(ours, device=device)(X), theirs(X)
    if isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


GRAD_CASES = ["softmax", "log_softmax", "take_along_axis", "take_along_axis0", "flip", "clip", "square", "log1p",
              "expand_dims", "squeeze", "cumsum", "var", "std_ddof", "sin_cos", "pad", "tile", "repeat", "prod",
              "prod_all", "prod_keepdims", "einsum_mm", "einsum_batch", "einsum_dot", "einsum_sum", "einsum_bmm"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", GRAD_CASES)
def test_numpy_function_gradients(name, device) -> None:
    ours, theirs = VALUE_CASES[name]
    weights = RNG.standard_normal(np.shape(np.concatenate([np.ravel(a) for a in np.atleast_1d(theirs(X))])
                                           if isinstance(theirs(X), list) else theirs(X)))

    def flat(v):
        return np.concatenate([np.ravel(a) for a in v]) if isinstance(v, list) else v

    def loss(x):
        out = ours(x)
        out = gnp.concatenate([o.reshape(-1) for o in out]) if isinstance(out, list) else out
        return gir.sum(out * weights.reshape(out.shape))

    g = gir.jit(gir.grad(loss), device=device)(X)
    fd = fd_grad(lambda x: float(np.sum(flat(theirs(x)).reshape(weights.shape) * weights)), X)
    np.testing.assert_allclose(g, fd, atol=1e-7)


def test_eager_functions_and_arrays_outside_a_trace() -> None:
    np.testing.assert_allclose(gnp.cumsum(X, axis=1), np.cumsum(X, 1))
    assert gnp.arange(3).dtype == np.int32 and gnp.eye(2).dtype == np.float32


# -- promotion --------------------------------------------------------------------------------------


def test_python_float_argument_keeps_f64_precision() -> None:
    p = np.array([1.0, 2.0])
    got = gir.jit(lambda p, lr: p - lr * p, device="interp")(p, 0.1)
    assert got.dtype == np.float64 and np.array_equal(got, p - 0.1 * p)
    # with f32 tensors the scalar becomes f32, as in JAX
    got32 = gir.jit(lambda p, lr: p * lr, device="interp")(p.astype(np.float32), 0.1)
    assert got32.dtype == np.float32


@pytest.mark.parametrize("device", DEVICES)
def test_promotion_follows_jax(device) -> None:
    def f(mask, x32, x64, i, n):
        return {"mask": x32 * mask, "mixed": x32 + x64, "count": x64 / n, "intdiv": i / 2, "floor": i // 2,
                "mod": i % 3, "not": ~mask, "big": n + 2**40, "int_float": i * 1.5}

    mask = np.array([True, False, True])
    x32 = np.array([1.5, -2.0, 3.0], np.float32)
    x64 = np.array([0.1, 0.2, 0.3])
    i = np.array([-7, 7, 4], np.int32)
    n = np.array(3, np.int64)
    got = gir.jit(f, device=device)(mask, x32, x64, i, n)
    want = {"mask": (x32 * mask, np.float32), "mixed": (x32.astype(np.float64) + x64, np.float64),
            "count": (x64 / 3, np.float64), "intdiv": (i / 2, np.float32), "floor": (i // 2, np.int32),
            "mod": (i % 3, np.int32), "not": (~mask, np.bool_), "big": (3 + 2**40, np.int64),
            "int_float": (i * 1.5, np.float32)}
    for k, (value, dtype) in want.items():
        assert got[k].dtype == dtype, k
        np.testing.assert_allclose(got[k], value, rtol=1e-7, err_msg=k)


def test_strict_promotion_refuses_mixed_tensors() -> None:
    def f(x32, x64):
        return x32 * 2.0 + x64

    args = (np.ones(3, np.float32), np.ones(3))
    assert gir.jit(f, device="interp")(*args).dtype == np.float64
    with gir.config.override(promotion="strict"):
        with pytest.raises(gir.GirError, match="astype") as info:
            gir.trace(f, *args)
        assert info.value.loc.file == __file__
        assert gir.trace(lambda x: x * 2.0 + 1, args[0])  # weak scalars still take the tensor's dtype


def test_python_scalar_scan_init_takes_the_steps_dtype() -> None:
    """As JAX: `0.0` summing f64 values is an f64 carry (the step is traced again); a carry
    that changes dtype otherwise is an error that says .astype."""
    xs = RNG.standard_normal(4)
    total, _ = gir.jit(lambda xs: gir.scan(lambda c, x: (c + x, None), 0.0, xs), device="interp")(xs)
    assert total.dtype == np.float64 and total == np.add.reduce(xs)
    count, _ = gir.jit(lambda xs: gir.scan(lambda c, x: (c + (x > 0), None), 0, xs), device="interp")(xs)
    assert count == (xs > 0).sum()
    with pytest.raises(gir.GirError, match="astype"):
        gir.trace(lambda xs: gir.scan(lambda c, x: (c + x, None), xs[0].astype("f32"), xs), xs)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_powers_and_float_functions_of_integers(device) -> None:
    """As JAX: int ** n (n a Python int) stays an integer, exp/sin of integers are float32."""
    i = np.array([-2, 3, 0], np.int32)
    got = gir.jit(lambda i: (i ** 0, i ** 1, i ** 5, gir.exp(i), gnp.sin(i), gir.sqrt(i > 0)), device=device)(i)
    want = (i ** 0, i, i ** 5, np.exp(i).astype(np.float32), np.sin(i).astype(np.float32),
            np.sqrt(i > 0).astype(np.float32))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_big_python_int_argument_and_refused_conversion_says_astype() -> None:
    assert gir.jit(lambda n: n * 2, device="interp")(2**40) == 2**41
    with pytest.raises(gir.GirError, match="astype"):
        gir.trace(lambda i: i * 2**40, gir.spec("3", "i32"))


OPERATOR_ERRORS = {"x[::0]": lambda x: x[::0], "round(x)": lambda x: round(x), "x % 2.0": lambda x: x % 2.0,
                   "~x": lambda x: ~x, "x // 2.0": lambda x: x // 2.0, "x[::-1]": lambda x: x[::-1],
                   "tile": lambda x: gnp.tile(x, "a"), "full": lambda x: gnp.full("a", 1.0),
                   "eye": lambda x: gnp.eye("a"), "pad": lambda x: gnp.pad(x, 1, mode="edge"),
                   "einsum": lambda x: gnp.einsum("ii->i", x), "one_hot": lambda x: gir.one_hot(x, 3),
                   "int ** -1": lambda x: x.astype("i32") ** -1, "cond": lambda x: gir.cond(x > 0, abs, abs, x),
                   "while_loop": lambda x: gir.while_loop(lambda v: v > 0, abs, x, max_iterations=2),
                   "vmap": lambda x: gir.vmap(lambda a, b: a + b)(x, x[:1]), "fori_loop": lambda x: gir.fori_loop(
                       0.5, 2, lambda i, v: v, x), "tree_map": lambda x: gir.tree_util.tree_map(abs, [x], [x, x])}


@pytest.mark.parametrize("expr", sorted(OPERATOR_ERRORS))
def test_python_operator_errors_are_located(expr) -> None:
    with pytest.raises(gir.GirError) as info:
        gir.trace(OPERATOR_ERRORS[expr], gir.spec("3"))
    assert info.value.loc.file == __file__


def test_did_you_mean_on_gir_attributes() -> None:
    with pytest.raises(AttributeError, match="did you mean 'tanh'"):
        gir.tahn  # noqa: B018
    with pytest.raises(AttributeError, match="did you mean 'softmax'"):
        gir.nn.sofmax  # noqa: B018


# -- tree utilities, control flow, vmap ---------------------------------------------------------------


def test_tree_utilities() -> None:
    tu = gir.tree_util
    tree = {"b": [1, (2, None)], "a": 3}
    leaves, treedef = tu.tree_flatten(tree)
    assert leaves == [3, 1, 2] and tu.tree_unflatten(treedef, [4, 5, 6]) == {"a": 4, "b": [5, (6, None)]}
    assert tu.tree_map(lambda x, y: x + y, tree, tree) == {"a": 6, "b": [2, (4, None)]}
    assert tu.tree_leaves(tree) == leaves
    with pytest.raises(gir.GirError):
        tu.tree_map(lambda x, y: x, tree, [1])


@pytest.mark.parametrize("device", DEVICES)
def test_cond_fori_loop_while_loop(device) -> None:
    def f(x):
        a = gir.cond(gir.sum(x) > 0, lambda v: v * 2.0, lambda v: -v, x)
        b = gir.fori_loop(0, 4, lambda i, v: v * 0.5 + i, x)
        c = gir.while_loop(lambda v: gir.sum(v) < 10.0, lambda v: v + 1.0, x, max_iterations=50)
        return gir.sum(a * a) + gir.sum(b * b) + gir.sum(c * c), (a, b, c)

    def numpy_f(x):
        a = x * 2.0 if x.sum() > 0 else -x
        b = x.copy()
        for i in range(4):
            b = b * 0.5 + i
        c = x.copy()
        while c.sum() < 10.0:
            c = c + 1.0
        return float((a * a).sum() + (b * b).sum() + (c * c).sum()), (a, b, c)

    for x in (RNG.standard_normal(3), -np.abs(RNG.standard_normal(3))):
        (v, outs), g = gir.jit(gir.value_and_grad(f, has_aux=True), device=device)(x)
        want_v, want = numpy_f(x)
        np.testing.assert_allclose(v, want_v, rtol=1e-12)
        for a, b in zip(outs, want):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        np.testing.assert_allclose(g, fd_grad(lambda y: numpy_f(y)[0], x), atol=1e-6)


def test_while_loop_needs_a_bound() -> None:
    with pytest.raises(gir.GirError, match="max_iterations"):
        gir.trace(lambda x: gir.while_loop(lambda v: gir.sum(v) < 1.0, lambda v: v + 1.0, x), gir.spec("3"))


@pytest.mark.parametrize("device", DEVICES)
def test_vmap(device) -> None:
    w = RNG.standard_normal((4, 2))
    xs = RNG.standard_normal((5, 4))

    def per_example(x, w):
        return gir.tanh(x @ w), gir.sum(x)

    def loss(w, xs):
        h, s = gir.vmap(per_example, in_axes=(0, None))(xs, w)
        return gir.sum(h * h) + gir.sum(s)

    def numpy_loss(w):
        h = np.tanh(xs @ w)
        return float((h * h).sum() + xs.sum())

    v, g = gir.jit(gir.value_and_grad(loss), device=device)(w, xs)
    np.testing.assert_allclose(v, numpy_loss(w), rtol=1e-12)
    np.testing.assert_allclose(g, fd_grad(numpy_loss, w), atol=1e-7)
    out = gir.jit(gir.vmap(lambda x: x * 2.0, in_axes=1, out_axes=1), device=device)(xs)
    np.testing.assert_allclose(out, xs * 2.0)


def _per_example_cases() -> dict:
    w = RNG.standard_normal((4, 3))
    table = RNG.standard_normal((6, 4))
    return {
        # (fun of one example x: 4-vector, in_axes, NumPy over the batch, batched without a scan)
        "mlp": (lambda x: gir.nn.softmax(gir.tanh(x @ w)), lambda xs: np.exp(np.tanh(xs @ w)) /
                np.exp(np.tanh(xs @ w)).sum(1, keepdims=True), True),
        "outer": (lambda x: gnp.einsum("i,j->ij", x, x[:2]), lambda xs: xs[:, :, None] * xs[:, None, :2], True),
        "layout": (lambda x: gnp.concatenate([x.reshape(2, 2).T, gnp.ones((1, 2))]).sum(axis=0) + x[1:3],
                   lambda xs: np.concatenate([xs.reshape(-1, 2, 2).transpose(0, 2, 1), np.ones((len(xs), 1, 2))],
                                             1).sum(1) + xs[:, 1:3], True),
        "gather": (lambda x: table[np.array([2, 0])] @ x, lambda xs: xs @ table[[2, 0]].T, True),
        "gather_both": (lambda x: x[gnp.argmax(x)] + x[np.array([1, 1])].sum(),
                        lambda xs: xs.max(1) + 2 * xs[:, 1], True),
        "stack": (lambda x: gnp.stack([x, 2.0 * x], axis=1), lambda xs: np.stack([xs, 2 * xs], axis=2), True),
        "scan": (lambda x: gnp.cumsum(x) + gir.scan(lambda c, e: (c + e, c * e), 0.0, x)[1],
                 lambda xs: np.cumsum(xs, 1) + np.concatenate([np.zeros((len(xs), 1)), np.cumsum(xs, 1)[:, :-1]],
                                                              1) * xs, True),
        "grad": (lambda x: gir.grad(lambda v: gir.sum(gir.tanh(v) ** 2))(x),
                 lambda xs: 2 * np.tanh(xs) * (1 - np.tanh(xs) ** 2), True),
        "grad_scatter": (lambda x: gir.grad(lambda v: gir.sum(v[np.array([0, 0, 2])] ** 2))(x),
                         lambda xs: np.stack([4 * xs[:, 0], 0 * xs[:, 1], 2 * xs[:, 2], 0 * xs[:, 3]], 1), True),
    }


@pytest.mark.parametrize("case", ["mlp", "outer", "layout", "gather", "gather_both", "stack", "scan", "grad",
                                  "grad_scatter"])
def test_vmap_batches_ops_and_falls_back_to_a_scan(case) -> None:
    """Each case once with a batched result (no scan over the batch, the example's own scan
    batched over time) or through the fallback scan, against NumPy and finite differences."""
    fun, numpy_fun, batched = _per_example_cases()[case]
    xs = RNG.standard_normal((5, 4))
    mapped = gir.vmap(fun)
    np.testing.assert_allclose(gir.jit(mapped, device="interp")(xs), numpy_fun(xs), rtol=1e-12, atol=1e-14)
    module = gir.trace(mapped, xs)
    text = str(module)
    scans = [op for op in module.walk() if op.name == "scan"]
    # batched: no scan over the batch (a scan of the example runs over its time axis, length 4)
    assert all(op.results[-1].tensor_type.shape[0] == 4 for op in scans) == batched, text
    assert len(module.functions) == (2 if case.startswith("grad") else 1)  # no traced example left behind
    if case.startswith("grad"):
        return  # gradients of per-example gradients: not checked here
    weights = RNG.standard_normal(numpy_fun(xs).shape)
    g = gir.jit(gir.grad(lambda xs: gir.sum(mapped(xs) * weights)), device="cpu")(xs)
    np.testing.assert_allclose(g, fd_grad(lambda xs: float((numpy_fun(xs) * weights).sum()), xs), atol=1e-7)


# -- gir.optim ----------------------------------------------------------------------------------------


def numpy_adam(params, grads, m, v, t, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    m = {k: b1 * m[k] + (1 - b1) * grads[k] for k in params}
    v = {k: b2 * v[k] + (1 - b2) * grads[k] ** 2 for k in params}
    new = {k: params[k] - lr * ((m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps) + wd * params[k])
           for k in params}
    return new, m, v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_jitted_adam_step_equals_numpy(device, wd) -> None:
    opt = gir.optim.adamw(1e-2, weight_decay=wd) if wd else gir.optim.adam(1e-2)
    params = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    x = RNG.standard_normal((4, 3))

    def loss(p, x):
        return gir.sum(gir.tanh(x @ p["w"] + p["b"]) ** 2)

    @gir.jit
    def step(p, state, x):
        value, grads = gir.value_and_grad(loss)(p, x)
        updates, state = opt.update(grads, state, p)
        return value, gir.optim.apply_updates(p, updates), state, grads

    step = gir.jit(step.fn, device=device)
    state = opt.init(params)
    ref, m, v = dict(params), {k: np.zeros_like(a) for k, a in params.items()}, \
        {k: np.zeros_like(a) for k, a in params.items()}
    for t in range(1, 4):
        _, params, state, grads = step(params, state, x)
        ref, m, v = numpy_adam(ref, grads, m, v, t, wd=wd)
        for k in ref:
            np.testing.assert_allclose(params[k], ref[k], rtol=1e-13, atol=1e-15)
    assert int(state.count) == 3
    # the same update eagerly, on NumPy arrays
    updates, _ = opt.update(grads, state, params)
    assert set(updates) == {"w", "b"}


def test_sgd_momentum_and_global_norm_clipping() -> None:
    opt = gir.optim.chain(gir.optim.clip_by_global_norm(1.0), gir.optim.sgd(0.1, momentum=0.9))
    params = {"w": np.array([1.0, -2.0])}
    grads = {"w": np.array([3.0, 4.0])}  # global norm 5: clipped to norm 1
    state = opt.init(params)

    @gir.jit
    def step(p, g, state):
        updates, state = opt.update(g, state, p)
        return gir.optim.apply_updates(p, updates), state

    p1, state = step(params, grads, state)
    p2, state = step(p1, grads, state)
    clipped = grads["w"] / 5.0
    np.testing.assert_allclose(p1["w"], params["w"] - 0.1 * clipped, rtol=1e-6)
    np.testing.assert_allclose(p2["w"], p1["w"] - 0.1 * (clipped + 0.9 * clipped), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_gate_slicing_keeps_a_variable_batch_whole(device) -> None:
    """`gx[:, :H]` on tensor<?x3Hxf64> (the fused-gate GRU/LSTM pattern with a variable batch)."""
    def numpy_gates(g):
        return 1 / (1 + np.exp(-g[:, :2])) * np.tanh(g[:, 2:4]) + g[:, 4:][:, ::2]

    def gates(gx):
        h = 2
        return gir.sigmoid(gx[:, :h]) * gir.tanh(gx[:, h:2 * h]) + gx[:, 2 * h:][:, ::2]

    module = gir.trace(gates, gir.spec("?x6", "f64"))
    assert "tensor<?x2xf64>" in str(module)
    gx = RNG.standard_normal((5, 6))
    (value,) = gir.interpret(module, list(module.functions)[-1], gx)
    np.testing.assert_allclose(value, numpy_gates(gx), rtol=1e-12)

    np.testing.assert_allclose(gir.jit(gates, device=device)(gx), numpy_gates(gx), rtol=1e-12)
    w = RNG.standard_normal((5, 1))
    g = gir.jit(gir.grad(lambda g: gir.sum(gates(g) * w)), device=device)(gx)
    np.testing.assert_allclose(g, fd_grad(lambda g: float((numpy_gates(g) * w).sum()), gx), atol=1e-7)


def test_trace_errors_hide_girs_own_frames(monkeypatch) -> None:
    import traceback

    def model(x, w):
        return gir.tanh(x) @ w

    def gir_frames(err: BaseException) -> list[str]:
        package = str(Path(gir.__file__).parent)
        return [f.filename for f in traceback.extract_tb(err.__traceback__)
                if f.filename.startswith(package) and "/tests/" not in f.filename]

    args = (np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(gir.GirError, match="contraction sizes differ") as info:
        gir.jit(model, device="interp")(*args)
    assert len(gir_frames(info.value)) == 1, gir_frames(info.value)  # the entry that re-raised it
    assert any(f.name == "model" for f in traceback.extract_tb(info.value.__traceback__))
    monkeypatch.setenv("GIR_TRACEBACK", "1")
    with pytest.raises(gir.GirError) as info:
        gir.jit(model, device="interp")(*args)
    assert len(gir_frames(info.value)) > 3


def test_load_takes_a_path_object() -> None:
    path = Path(gir.__file__).parent / "examples" / "mlp.gir"
    module = gir.load(path)
    entry = "mlp_loss"
    args = [np.ones([d or 2 for d in t.shape], t.numpy_dtype) * 0.1 for t in module.functions[entry].arg_types]
    np.testing.assert_allclose(gir.jit(module, entry, device="cpu")(*args)[0],
                               gir.jit(module, entry, device="interp")(*args)[0], rtol=1e-5)


def test_unit_axes_added_and_dropped_with_several_variable_dims() -> None:
    """`mask[..., None]` on tensor<?x?xi1> (a T x B mask to T x B x 1): reshape takes one `?`,
    so unit axes are added by `stack` and dropped by `index`."""
    def f(m, x):
        return x * m[..., None], gnp.squeeze(m[:, None, :, None], axis=(1, 3)), m.reshape(m.shape[0], 1, m.shape[1])

    module = gir.trace(f, gir.spec("?x?", "i1"), gir.spec("?x?x3", "f64"))
    m, x = RNG.random((4, 5)) > 0.5, RNG.standard_normal((4, 5, 3))
    a, b, c = gir.interpret(module, "f", m, x)
    np.testing.assert_array_equal(a, x * m[..., None])
    np.testing.assert_array_equal(b, m)
    np.testing.assert_array_equal(c, m[:, None, :])


def test_a_carry_that_changes_type_points_at_the_step() -> None:
    def f(xs):
        def step(c, x):
            new = c + x * xs[0]                      # MARK
            return new, None
        return gir.scan(step, xs[0, 0], xs)[0]

    def g(xs):
        return gir.scan(lambda c, x: c + x, xs[0], xs)  # MARK

    import inspect
    for fn, message in [(f, "changes the carry"), (g, "must return a pair")]:
        with pytest.raises(gir.GirError, match=message) as info:
            gir.trace(fn, gir.spec("3x2"))
        lines, start = inspect.getsourcelines(fn)
        assert info.value.loc.line == start + next(k for k, line in enumerate(lines) if "# MARK" in line)
        if fn is g:
            assert info.value.loc.col > lines[1].index("lambda")  # at `c + x`, not at the gir.scan call


# -- the trial's first program: a 2-layer LSTM character LM with an embedding and Adam -------------


def _lstm_lm_loss(params, ids, targets):
    """Written as a JAX user writes it (jnp -> gnp, jax.nn -> gir.nn, lax.scan -> gir.scan)."""
    xs = params["emb"][ids]                                   # T x B x E
    batch = ids.shape[1]
    for layer in params["layers"]:
        hidden = layer["wh"].shape[0]

        def step(carry, x, layer=layer, hidden=hidden):
            h, c = carry
            g = x @ layer["wx"] + h @ layer["wh"] + layer["b"]
            i, f = gir.sigmoid(g[:, :hidden]), gir.sigmoid(g[:, hidden:2 * hidden])
            o, u = gir.sigmoid(g[:, 2 * hidden:3 * hidden]), gir.tanh(g[:, 3 * hidden:])
            c = f * c + i * u
            h = o * gir.tanh(c)
            return (h, c), h

        zeros = gnp.zeros((batch, hidden), xs.dtype)
        _, xs = gir.scan(step, (zeros, zeros), xs)
    logits = xs @ params["out"]
    labels = gir.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
    loss = -gnp.mean(gnp.sum(labels * gir.nn.log_softmax(logits), axis=-1))
    return loss, gnp.mean(gnp.argmax(logits, axis=-1) == targets)


def _numpy_lstm_lm_loss(params, ids, targets):
    def sig(x):
        return 1 / (1 + np.exp(-x))

    xs = params["emb"][ids]
    for layer in params["layers"]:
        hidden = layer["wh"].shape[0]
        h = c = np.zeros((ids.shape[1], hidden))
        out = []
        for x in xs:
            g = x @ layer["wx"] + h @ layer["wh"] + layer["b"]
            i, f, o = sig(g[:, :hidden]), sig(g[:, hidden:2 * hidden]), sig(g[:, 2 * hidden:3 * hidden])
            c = f * c + i * np.tanh(g[:, 3 * hidden:])
            h = o * np.tanh(c)
            out.append(h)
        xs = np.stack(out)
    logits = xs @ params["out"]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.mean(np.take_along_axis(logp, targets[..., None], -1))


@pytest.mark.parametrize("device", DEVICES)
def test_two_layer_lstm_language_model_with_adam(device) -> None:
    rng = np.random.default_rng(11)
    vocab, embed, hidden = 7, 3, 4
    params = {"emb": rng.standard_normal((vocab, embed)),
              "layers": [{"wx": 0.5 * rng.standard_normal((d, 4 * hidden)),
                          "wh": 0.5 * rng.standard_normal((hidden, 4 * hidden)),
                          "b": 0.1 * rng.standard_normal(4 * hidden)} for d in (embed, hidden)],
              "out": rng.standard_normal((hidden, vocab))}
    text = rng.integers(0, vocab, size=(6, 2))
    ids, targets = text[:-1], text[1:]
    opt = gir.optim.adam(0.05)

    def train_step(params, state, ids, targets):
        (loss, accuracy), grads = gir.value_and_grad(_lstm_lm_loss, has_aux=True)(params, ids, targets)
        updates, state = opt.update(grads, state, params)
        return gir.optim.apply_updates(params, updates), state, loss, grads

    step = gir.jit(train_step, device=device)
    new, state, loss, grads = step(params, opt.init(params), ids, targets)
    np.testing.assert_allclose(loss, _numpy_lstm_lm_loss(params, ids, targets), rtol=1e-12)
    for path in [("emb",), ("layers", 0, "wx"), ("layers", 1, "wh"), ("layers", 1, "b"), ("out",)]:
        leaf, g = params, grads
        for k in path:
            leaf, g = leaf[k], g[k]
        for index in list(np.ndindex(leaf.shape))[::5]:
            saved = leaf[index]
            leaf[index] = saved + 1e-6
            plus = _numpy_lstm_lm_loss(params, ids, targets)
            leaf[index] = saved - 1e-6
            minus = _numpy_lstm_lm_loss(params, ids, targets)
            leaf[index] = saved
            np.testing.assert_allclose(g[index], (plus - minus) / 2e-6, atol=1e-8, err_msg=str(path))
    losses = [float(loss)]
    for _ in range(5):
        new, state, loss, _ = step(new, state, ids, targets)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1, losses


def test_interpreter_out_of_memory_is_a_located_error(monkeypatch) -> None:
    """`device="interp"` with a huge `zeros` raised NumPy's MemoryError (the cpu device checks
    sizes first); the allocation failure is simulated, so nothing large is allocated."""
    import dataclasses

    from gir.ir.ops import REGISTRY

    def no_memory(op):
        raise MemoryError("Unable to allocate 3.64 TiB")

    monkeypatch.setitem(REGISTRY, "zeros", dataclasses.replace(REGISTRY["zeros"], kernel=no_memory))
    with pytest.raises(gir.GirError, match="'zeros' makes tensor<4xf32>: more than the memory") as info:
        gir.jit(lambda x: x + gir.zeros(4), device="interp")(np.float32(1))
    assert info.value.loc.file == __file__


def test_jit_of_gir_text_counts_its_specialisations() -> None:
    fn = gir.jit("func @f(%x: tensor<?xf32>) -> tensor<f32> {\n  return sum(%x)\n}\n", "f", device="interp")
    assert fn.specialisations == 0
    fn(np.ones(3, np.float32))
    fn(np.ones(4, np.float32))
    fn(np.ones(3, np.float32))
    assert fn.specialisations == 2


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_of_a_per_sequence_rnn_runs_one_batched_scan(device) -> None:
    """A per-sequence GRU-like RNN (carry initialised unbatched, made batched by the step)
    mapped over a batch: one scan over time with (B, H) carries, as the hand-batched model."""
    w, u = 0.5 * RNG.standard_normal((3, 4)), 0.5 * RNG.standard_normal((4, 4))
    xs = RNG.standard_normal((5, 6, 3))  # B x T x E

    def per_sequence(seq):
        h, hs = gir.scan(lambda h, x: (gir.tanh(x @ w + h @ u), gir.sum(h)), gnp.zeros(4, "f64"), seq)
        return h, hs

    def numpy_model(xs):
        h = np.zeros((len(xs), 4))
        sums = []
        for t in range(xs.shape[1]):
            sums.append(h.sum(1))
            h = np.tanh(xs[:, t] @ w + h @ u)
        return h, np.stack(sums, 1)

    mapped = gir.vmap(per_sequence)
    module = gir.trace(mapped, xs)
    scans = [op for op in module.walk() if op.name == "scan"]
    assert len(scans) == 1 and scans[0].results[0].tensor_type.shape == (5, 4), str(module)
    h, hs = gir.jit(mapped, device=device)(xs)
    want_h, want_hs = numpy_model(xs)
    np.testing.assert_allclose(h, want_h, rtol=1e-12)
    np.testing.assert_allclose(hs, want_hs, rtol=1e-12, atol=1e-15)
    g = gir.jit(gir.grad(lambda xs: gir.sum(mapped(xs)[0] ** 2)), device=device)(xs)
    np.testing.assert_allclose(g, fd_grad(lambda xs: float((numpy_model(xs)[0] ** 2).sum()), xs), atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_per_example_gradients_with_vmap_of_value_and_grad(device) -> None:
    """The DP-SGD idiom: vmap(value_and_grad(loss), in_axes=(None, 0, 0)) gives each example's
    loss and its gradient with respect to the shared weights, from one batched `grad`."""
    w = {"a": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    xs, ys = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 2))

    def loss(w, x, y):
        return gir.sum((gir.tanh(x @ w["a"] + w["b"]) - y) ** 2)

    per_example = gir.vmap(gir.value_and_grad(loss), in_axes=(None, 0, 0))
    module = gir.trace(per_example, w, xs, ys)
    assert not any(op.name == "scan" for op in module.walk()), str(module)
    losses, grads = gir.jit(per_example, device=device)(w, xs, ys)
    assert losses.shape == (5,) and grads["a"].shape == (5, 3, 2) and grads["b"].shape == (5, 2)
    for k in range(5):
        one_loss, one_grad = gir.jit(gir.value_and_grad(loss), device="interp")(w, xs[k], ys[k])
        np.testing.assert_allclose(losses[k], one_loss, rtol=1e-12)
        for name in w:
            np.testing.assert_allclose(grads[name][k], one_grad[name], rtol=1e-10, atol=1e-14)


# -- x.at[idx]: functional updates ------------------------------------------------------------------


def _gpu_missing() -> str | None:
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "the GPU backend needs numba-cuda (pip install 'gir[gpu]')"
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except gir.GirError as e:
        return f"no GPU backend here: {e.message}"
    return None


GPU_MISSING = _gpu_missing()
GPU = pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu] + ([pytest.mark.skip(reason=GPU_MISSING)]
                                                                if GPU_MISSING else []))


def _np_set(x, idx, v):
    y = x.copy()
    y[idx] = v
    return y


def _np_add(x, idx, v):
    y = x.copy()
    np.add.at(y, idx, v)
    return y


def _np_mul(x, idx, v):
    y = x.copy()
    np.multiply.at(y, idx, v)
    return y


def _np_ufunc_at(ufunc):
    def update(x, idx, v):
        y = x.copy()
        ufunc.at(y, idx, v)
        return y
    return update


MASK = RNG.standard_normal((4, 5)) > 0
R020, R113, R004, R30 = np.array([0, 2, 0]), np.array([1, 1, 3]), np.array([0, 0, 4]), np.array([3, 0])
ROWS = np.array([2, 0])  # the traced index argument (row ids); ROWS[0] a traced scalar
AT_CASES = {  # name: (gir's update of (x, v, i), NumPy's, v's shape); x is 4x5
    "set_strided": (lambda x, v, i: x.at[1:, ::2].set(v),
                    lambda x, v, i: _np_set(x, (slice(1, None), slice(None, None, 2)), v), (3, 3)),
    "set_reversed": (lambda x, v, i: x.at[::-1, 2].set(v),
                     lambda x, v, i: _np_set(x, (slice(None, None, -1), 2), v), (4,)),
    "set_broadcast": (lambda x, v, i: x.at[:, 1:3].set(v),
                      lambda x, v, i: _np_set(x, (slice(None), slice(1, 3)), v), (2,)),
    "set_repeated_last_wins": (lambda x, v, i: x.at[R020, 1].set(v),
                               lambda x, v, i: _np_set(x, ([0, 2, 0], 1), v), (3,)),
    "set_ellipsis": (lambda x, v, i: x.at[..., -1].set(v), lambda x, v, i: _np_set(x, (Ellipsis, -1), v), (4,)),
    "add_repeated": (lambda x, v, i: x.at[R020].add(v), lambda x, v, i: _np_add(x, [0, 2, 0], v), (3, 5)),
    "add_bool_mask": (lambda x, v, i: x.at[MASK].add(v), lambda x, v, i: _np_add(x, MASK, v), ()),
    "multiply_repeated": (lambda x, v, i: x.at[R113, R004].multiply(v),
                          lambda x, v, i: _np_mul(x, ([1, 1, 3], [0, 0, 4]), v), (3,)),
    "divide_repeated": (lambda x, v, i: x.at[R113, 2:4].divide(v + 3),
                        lambda x, v, i: _np_ufunc_at(np.divide)(x, ([1, 1, 3], slice(2, 4)), v + 3), (3, 2)),
    "power_repeated": (lambda x, v, i: (abs(x) + 0.5).at[R020, 1:3].power(v),  # a positive base: no NaN
                       lambda x, v, i: _np_ufunc_at(np.power)(abs(x) + 0.5, ([0, 2, 0], slice(1, 3)), v), (3, 2)),
    "traced_power_row": (lambda x, v, i: (abs(x) + 0.5).at[i[1]].power(v),
                         lambda x, v, i: _np_ufunc_at(np.power)(abs(x) + 0.5, i[1], v), (5,)),
    "min_repeated": (lambda x, v, i: x.at[R020].min(v), lambda x, v, i: _np_ufunc_at(np.minimum)(x, [0, 2, 0], v),
                     (3, 5)),
    "max_broadcast": (lambda x, v, i: x.at[:, ::2].max(v), lambda x, v, i: _np_ufunc_at(np.maximum)(
        x, (slice(None), slice(None, None, 2)), v), (3,)),
    "traced_scalar_and_slice_set": (lambda x, v, i: x.at[i[0], 1:4].set(v),
                                    lambda x, v, i: _np_set(x, (i[0], slice(1, 4)), v), (3,)),
    "traced_scalar_and_list_add": (lambda x, v, i: x.at[[0, 0, 3], i[1]].add(v),
                                   lambda x, v, i: _np_add(x, ([0, 0, 3], i[1]), v), (3,)),
    "traced_scalar_and_slice_get": (lambda x, v, i: x.at[..., ::-2, i[0]].get() * v, lambda x, v, i: x[::-2, i[0]] * v,
                                    (2,)),
    "traced_divide_row": (lambda x, v, i: x.at[i[0]].divide(v + 3), lambda x, v, i: _np_ufunc_at(np.divide)(
        x, i[0], v + 3), (5,)),
    "traced_max_column": (lambda x, v, i: x.at[:, i[1]].max(v), lambda x, v, i: _np_ufunc_at(np.maximum)(
        x, (slice(None), i[1]), v), (4,)),
    "get_fancy": (lambda x, v, i: x.at[R30, ::-2].get() * v, lambda x, v, i: x[[3, 0], ::-2] * v, (2, 3)),
    "get_slice": (lambda x, v, i: x.at[1:3, 2].get() * v, lambda x, v, i: x[1:3, 2] * v, (2,)),
    "traced_set_row": (lambda x, v, i: x.at[i[0]].set(v), lambda x, v, i: _np_set(x, i[0], v), (5,)),
    "traced_add_column": (lambda x, v, i: x.at[:, i[0]].add(v),
                          lambda x, v, i: _np_add(x, (slice(None), i[0]), v), (4,)),
    "traced_multiply_row": (lambda x, v, i: x.at[i[0]].multiply(v), lambda x, v, i: _np_mul(x, i[0], v), ()),
    "traced_add_rows": (lambda x, v, i: x.at[i].add(v), lambda x, v, i: _np_add(x, i, v), (2, 5)),
    "traced_set_rows": (lambda x, v, i: x.at[i].set(v), lambda x, v, i: _np_set(x, i, v), (2, 1)),
    "traced_set_columns": (lambda x, v, i: x.at[..., i].set(v),
                           lambda x, v, i: _np_set(x, (Ellipsis, i), v), (4, 2)),
    "traced_get_columns": (lambda x, v, i: x.at[:, i].get() * v, lambda x, v, i: x[:, i] * v, (4, 2)),
}


def _at_inputs(name):
    return RNG.standard_normal((4, 5)), RNG.standard_normal(AT_CASES[name][2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(AT_CASES))
def test_at_updates_equal_numpy(name, device) -> None:
    ours, theirs, _ = AT_CASES[name]
    x, v = _at_inputs(name)
    before = x.copy()
    got = gir.jit(ours, device=device)(x, v, ROWS)
    np.testing.assert_allclose(got, theirs(x, v, ROWS), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(x, before)  # a functional update: the argument is not written


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(AT_CASES))
def test_at_update_gradients(name, device) -> None:
    ours, theirs, _ = AT_CASES[name]
    x, v = _at_inputs(name)
    w = RNG.standard_normal(np.shape(theirs(x, v, ROWS)))
    gx, gv = gir.jit(gir.grad(lambda x, v, i: gir.sum(ours(x, v, i) * w), argnums=(0, 1)), device=device)(x, v, ROWS)
    np.testing.assert_allclose(gx, fd_grad(lambda x_: float((theirs(x_, v, ROWS) * w).sum()), x), atol=1e-8)
    np.testing.assert_allclose(gv, fd_grad(lambda v_: float((theirs(x, v_, ROWS) * w).sum()), v), atol=1e-8)


@pytest.mark.parametrize("device", ["interp", GPU])
def test_at_updates_on_the_gpu(device) -> None:
    x, v = RNG.standard_normal((4, 5)), RNG.standard_normal(5)

    def f(x, v, i):
        return x.at[[0, 2, 0], 1:].add(v[1:]).at[i[0]].set(v)

    np.testing.assert_allclose(gir.jit(f, device=device)(x, v, ROWS), _np_set(_np_add(x, ([0, 2, 0], slice(1, None)),
                                                                                   v[1:]), ROWS[0], v), rtol=1e-14)
    w = RNG.standard_normal((4, 5))
    gx = gir.jit(gir.grad(lambda x, v, i: gir.sum(f(x, v, i) * w)), device=device)(x, v, ROWS)
    np.testing.assert_allclose(gx, np.where(np.arange(4)[:, None] == ROWS[0], 0.0, w), rtol=1e-14)


def test_at_on_bools_and_a_variable_batch() -> None:
    mask = np.array([[True, False], [True, True]])
    f = gir.jit(lambda m, i: (m.at[0, 1].set(True), m.at[i[0]].set(False)), device="cpu")
    a, b = f(mask, np.array([1]))
    np.testing.assert_array_equal(a, [[True, True], [True, True]])
    np.testing.assert_array_equal(b, [[True, False], [False, False]])
    module = gir.trace(lambda x, t: (x.at[:, t].set(0.0), x.at[:, 1:3].get()), gir.spec("?x5", "f64"),
                       gir.spec((), "i64"))
    x = RNG.standard_normal((3, 5))
    got, part = gir.interpret(module, list(module.functions)[-1], x, np.int64(2))
    np.testing.assert_array_equal(got, _np_set(x, (slice(None), 2), 0.0))
    np.testing.assert_array_equal(part, x[:, 1:3])


@pytest.mark.parametrize("device", DEVICES)
def test_at_updates_keep_a_variable_batch_whole(device) -> None:
    """The fused-gate pattern's update with a `?` batch: a static index on the other axes, the
    `?` axis kept whole; traced with gir.spec, run and differentiated after gir.jit specialises."""
    def f(x, v):
        return x.at[:, 1:4:2].set(v).at[..., 1].add(v[0, 0]).at[:, 0, 1].multiply(v[1, 1])

    def numpy_f(x, v):
        y = x.copy()
        y[:, 1:4:2] = v
        y[..., 1] += v[0, 0]
        y[:, 0, 1] *= v[1, 1]
        return y

    x, v, w = RNG.standard_normal((3, 5, 2)), RNG.standard_normal((2, 2)), RNG.standard_normal((3, 5, 2))
    spec = (gir.spec("?x5x2", "f64"), gir.spec("2x2", "f64"))
    module = gir.trace(f, *spec)
    assert "tensor<?x5x2xf64>" in str(module)
    (got,) = gir.jit(module, device=device)(x, v)
    np.testing.assert_allclose(got, numpy_f(x, v), rtol=1e-15)
    grads = gir.trace(gir.grad(lambda x, v, w: gir.sum(f(x, v) * w), argnums=(0, 1)), *spec,
                      gir.spec("?x5x2", "f64"))
    gx, gv = gir.jit(grads, device=device)(x, v, w)
    np.testing.assert_allclose(gx, fd_grad(lambda x_: float((numpy_f(x_, v) * w).sum()), x), atol=1e-8)
    np.testing.assert_allclose(gv, fd_grad(lambda v_: float((numpy_f(x, v_) * w).sum()), v), atol=1e-8)
    mask = gir.trace(lambda m: m.at[:, -1].set(False), gir.spec("?x3", "bool"))
    (got,) = gir.jit(mask, device=device)(np.ones((4, 3), bool))
    np.testing.assert_array_equal(got, np.array([[True, True, False]] * 4))


AT_ERRORS = {
    "out of range": (lambda x, t: x.at[4].set(1.0), "out of bounds"),
    "traced ids and sliced": (lambda x, t: x.at[gnp.stack([t, t]), 1:3].set(1.0), "alone on one axis"),
    "two traced": (lambda x, t: x.at[t, t].set(1.0), "one traced index"),
    "multiply by ids": (lambda x, t: x.at[gnp.stack([t, t])].multiply(2.0), "repeated index"),
    "shape": (lambda x, t: x.at[0].set(np.ones(4)), "does not broadcast"),
    "mode": (lambda x, t: x.at[0].set(1.0, mode="drop"), "mode"),
    "apply": (lambda x, t: x.at[0].apply(abs), "not supported"),
    "int power": (lambda x, t: x.astype("i32").at[0].power(2), "takes floats"),
    "max by ids": (lambda x, t: x.at[gnp.stack([t, t])].max(2.0), "repeated index"),
    "step 0": (lambda x, t: x.at[::0].add(1.0), "step"),
    "bool add": (lambda x, t: (x > 0).at[0].add(True), "astype"),
    "variable": (lambda x, t: x.at[1:, 1].set(0.0), "one `\\?` axis, kept whole"),
}


@pytest.mark.parametrize("name", sorted(AT_ERRORS))
def test_at_errors_are_located(name) -> None:
    fn, message = AT_ERRORS[name]
    shape = "?x5" if name == "variable" else "4x5"
    with pytest.raises(gir.GirError, match=message) as info:
        gir.trace(fn, gir.spec(shape, "f64"), gir.spec((), "i64"))
    assert info.value.loc.file == __file__


# -- gir.jit(f, static_argnums=..., static_argnames=...) --------------------------------------------


def _layers(x, n, *, act="tanh", scale=2.0):
    """n layers of act (a Python int and a name: static), scale a traced Python float."""
    for _ in range(n):
        x = getattr(gir, act)(x) * scale
    return gir.sum(x * x)


def _numpy_layers(x, n, act="tanh", scale=2.0):
    f = np.tanh if act == "tanh" else (lambda v: 1 / (1 + np.exp(-v)))
    for _ in range(n):
        x = f(x) * scale
    return float((x * x).sum())


@pytest.mark.parametrize("device", [*DEVICES, GPU])
def test_static_arguments_specialise_and_reach_python_as_values(device) -> None:
    x = RNG.standard_normal(4)
    f = gir.jit(_layers, static_argnums=1, static_argnames="act", device=device)
    assert f(x, 2) == pytest.approx(_numpy_layers(x, 2), rel=1e-13)
    assert f(x, n=3, act="sigmoid") == pytest.approx(_numpy_layers(x, 3, "sigmoid"), rel=1e-13)
    assert f(x, 2, scale=0.5) == pytest.approx(_numpy_layers(x, 2, scale=0.5), rel=1e-13)
    assert f.specialisations == 3  # (n=2, tanh), (n=3, sigmoid), (n=2, tanh) with a traced scale
    assert sum(op.name == "tanh" for op in f.module.walk()) == 2  # the loop over n ran while tracing
    assert f(x, 2, scale=0.25) == pytest.approx(_numpy_layers(x, 2, scale=0.25), rel=1e-13)
    f(x * 2, 2)
    assert f.specialisations == 3  # the same static values and shapes: no new compile
    g = gir.jit(gir.grad(_layers), static_argnums=(1,), device=device)(x, 3)
    np.testing.assert_allclose(g, fd_grad(lambda x_: _numpy_layers(x_, 3), x), rtol=1e-7, atol=1e-9)


def test_static_argument_keys_compare_type_and_value() -> None:
    f = gir.jit(lambda x, k: x * (k if isinstance(k, float) else 10), static_argnums=-1, device="interp")
    np.testing.assert_array_equal(f(np.ones(2), 1), [10.0, 10.0])
    np.testing.assert_array_equal(f(np.ones(2), 1.0), [1.0, 1.0])  # 1.0 == 1, but not the same specialisation
    assert f.specialisations == 2


def test_static_argument_errors() -> None:
    f = gir.jit(_layers, static_argnums=1, device="interp")
    with pytest.raises(gir.GirArgumentError, match="static argument 'n' of _layers is a list, which is not "
                                                   "hashable") as info:
        f(np.ones(2), [2])
    assert info.value.loc.file == __file__
    with pytest.raises(gir.GirArgumentError, match="static_argnums 2: _layers has 2 positional"):
        gir.jit(_layers, static_argnums=2)
    with pytest.raises(gir.GirArgumentError, match="static_argnames 'actv'"):
        gir.jit(_layers, static_argnames=["actv"])
    with pytest.raises(gir.GirArgumentError, match="_layers: missing a required argument: 'n'"):
        f(np.ones(2))


# -- jax.nn's activations and erf ---------------------------------------------------------------------

_np_erf = np.vectorize(__import__("math").erf)


def _np_softplus(x):
    return np.logaddexp(x, 0.0)


ACTIVATIONS = {  # name: (gir's, NumPy's): JAX's definitions, written out in NumPy
    "gelu_tanh": (lambda x: gir.nn.gelu(x),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "gelu_exact": (lambda x: gir.nn.gelu(x, approximate=False), lambda x: x * (1 + _np_erf(x / np.sqrt(2))) / 2),
    "erf": (lambda x: gir.lax.erf(3 * x), lambda x: _np_erf(3 * x)),
    "silu": (lambda x: gir.nn.silu(x), lambda x: x / (1 + np.exp(-x))),
    "swish": (lambda x: gir.nn.swish(x), lambda x: x / (1 + np.exp(-x))),
    "softplus": (lambda x: gir.nn.softplus(x * 3), lambda x: _np_softplus(x * 3)),
    "log_sigmoid": (lambda x: gir.nn.log_sigmoid(x * 3), lambda x: -_np_softplus(-x * 3)),
    "relu6": (lambda x: gir.nn.relu6(4 * x), lambda x: np.clip(4 * x, 0, 6)),
    "leaky_relu": (lambda x: gir.nn.leaky_relu(x, 0.2), lambda x: np.where(x >= 0, x, 0.2 * x)),
    "elu": (lambda x: gir.nn.elu(x * 3, alpha=0.5), lambda x: np.where(x > 0, x * 3, 0.5 * np.expm1(
        np.minimum(x * 3, 0)))),
    "celu": (lambda x: gir.nn.celu(x, alpha=0.7), lambda x: np.maximum(x, 0) + 0.7 * np.expm1(np.minimum(x, 0) / 0.7)),
    "selu": (lambda x: gir.nn.selu(x), lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772
                                                                                * np.expm1(np.minimum(x, 0)))),
    "soft_sign": (lambda x: gir.nn.soft_sign(x), lambda x: x / (np.abs(x) + 1)),
    "hard_tanh": (lambda x: gir.nn.hard_tanh(2 * x), lambda x: np.clip(2 * x, -1, 1)),
    "hard_silu": (lambda x: gir.nn.hard_swish(4 * x), lambda x: 4 * x * np.clip(4 * x + 3, 0, 6) / 6),
    "mish": (lambda x: gir.nn.mish(x), lambda x: x * np.tanh(_np_softplus(x))),
    "glu": (lambda x: gir.nn.glu(x, axis=1), lambda x: x[:, :2] / (1 + np.exp(-x[:, 2:]))),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values_and_gradients(name, device) -> None:
    ours, theirs = ACTIVATIONS[name]
    x = RNG.standard_normal((3, 4))
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(gir.jit(ours, device=device)(x), theirs(x), rtol=1e-14, atol=1e-15)
        w = RNG.standard_normal(theirs(x).shape)
        g = gir.jit(gir.grad(lambda x: gir.sum(ours(x) * w)), device=device)(x)
    np.testing.assert_allclose(g, fd_grad(lambda x_: float((theirs(x_) * w).sum()), x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_activations_and_expm1_at_extreme_inputs(device) -> None:
    """No overflow or NaN where exp(x) under- or overflows, in the values and the gradients."""
    x = np.array([-1e300, -2000.0, -746.0, -720.0, -30.0, 0.0, 30.0, 700.0, 708.0, 712.0, 2000.0])

    def fns(x):
        return (gir.nn.softplus(x), gir.nn.log_sigmoid(x), gir.nn.elu(x), gir.nn.selu(x), gnp.expm1(x))

    with np.errstate(over="ignore"):
        got = gir.jit(fns, device=device)(x)
        want = (_np_softplus(x), -_np_softplus(-x), np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
                1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0))), np.expm1(x))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)
    small = x[np.abs(x) < 1000]
    g = gir.jit(gir.grad(lambda x: gir.sum(gir.nn.softplus(x) + gir.nn.elu(x) + gir.nn.log_sigmoid(x))),
                device=device)(small)
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-small))
        want = sig + np.where(small > 0, 1.0, np.exp(small)) + 1 / (1 + np.exp(small))
    np.testing.assert_allclose(g, want, rtol=1e-14, atol=1e-300)
    g1 = gir.jit(gir.grad(lambda x: gir.sum(gnp.expm1(x))), device=device)(small[:-1])
    np.testing.assert_allclose(g1, np.exp(small[:-1]), rtol=1e-13, atol=1e-300)


def test_erf_is_accurate_over_its_whole_range() -> None:
    x = np.concatenate([np.linspace(-7, 7, 4001), [0.0, 1e-300, -1e-9, 2.5, -2.5, np.nextafter(2.5, 0), 30.0,
                                                   -np.inf, np.inf]])
    with np.errstate(over="ignore"):
        got = gir.jit(gir.lax.erf, device="cpu")(x)
        g = gir.jit(gir.grad(lambda x: gir.sum(gir.lax.erf(x))), device="cpu")(x[:-2])
    np.testing.assert_allclose(got, _np_erf(x), rtol=1e-15, atol=0)
    # the derivative of the composition, whose series cancels near |x| = 2.5: 1e-12, not 1e-15
    np.testing.assert_allclose(g, 2 / np.sqrt(np.pi) * np.exp(-x[:-2] ** 2), rtol=2e-12, atol=1e-300)
    assert np.all(np.isfinite(g))
    f32 = gir.jit(gir.lax.erf, device="cpu")(x[:4001].astype(np.float32))
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, _np_erf(x[:4001].astype(np.float32)), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("device", ["interp", GPU])
def test_exact_gelu_on_the_gpu(device) -> None:
    x = RNG.standard_normal(6) * 3
    np.testing.assert_allclose(gir.jit(lambda x: gir.nn.gelu(x, approximate=False), device=device)(x),
                               ACTIVATIONS["gelu_exact"][1](x), rtol=1e-14, atol=1e-15)


# -- against JAX itself, where it is installed --------------------------------------------------------

def _jax_activations(jax) -> dict:
    """ACTIVATIONS' gir functions as JAX's."""
    nn = jax.nn
    return {"gelu_tanh": nn.gelu, "gelu_exact": lambda x: nn.gelu(x, approximate=False),
            "erf": lambda x: jax.lax.erf(3 * x), "silu": nn.silu, "swish": nn.swish,
            "softplus": lambda x: nn.softplus(x * 3), "log_sigmoid": lambda x: nn.log_sigmoid(x * 3),
            "relu6": lambda x: nn.relu6(4 * x), "leaky_relu": lambda x: nn.leaky_relu(x, 0.2),
            "elu": lambda x: nn.elu(x * 3, alpha=0.5), "celu": lambda x: nn.celu(x, alpha=0.7), "selu": nn.selu,
            "soft_sign": nn.soft_sign, "hard_tanh": lambda x: nn.hard_tanh(2 * x),
            "hard_silu": lambda x: nn.hard_swish(4 * x), "mish": nn.mish, "glu": lambda x: nn.glu(x, axis=1)}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_equal_jax(name) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    x = RNG.standard_normal((3, 4)) * 2
    theirs = np.asarray(_jax_activations(jax)[name](jax.numpy.asarray(x)))
    np.testing.assert_allclose(gir.jit(ACTIVATIONS[name][0], device="cpu")(x), theirs, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", sorted(set(AT_CASES) - {"traced_scalar_and_list_add"}))  # JAX takes no list index
def test_at_updates_equal_jax(name) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    ours = AT_CASES[name][0]
    x, v = _at_inputs(name)
    theirs = np.asarray(ours(jax.numpy.asarray(x), jax.numpy.asarray(v), jax.numpy.asarray(ROWS)))
    np.testing.assert_allclose(gir.jit(ours, device="cpu")(x, v, ROWS), theirs, rtol=1e-14, atol=1e-15)
