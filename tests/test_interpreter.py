"""The reference interpreter against direct NumPy: every non-structural op (broadcasting,
dtypes), then `scan` in all its forms, the surface `for` loop, variables and calls.

Each case writes a small gir program, runs it with `gir.interpret` and compares with the
same computation written in NumPy. Shapes and values come from hypothesis where that helps.
"""

from __future__ import annotations

import gir
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

SETTINGS = settings(derandomize=True, deadline=None, max_examples=60)
NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "i1": np.bool_}
FLOATS = ("f32", "f64")
INTS = ("i32", "i64")
NUMERIC = FLOATS + INTS
ALL = NUMERIC + ("i1",)


def ty(shape: tuple[int | None, ...], dtype: str) -> str:
    return "tensor<" + "".join(("?" if d is None else str(d)) + "x" for d in shape) + dtype + ">"


def func(params: str, results: str, body: str, name: str = "f") -> str:
    arrow = f" -> {results}" if results else ""
    lines = "\n".join("  " + line.strip() for line in body.strip().splitlines())
    return f"func @{name}({params}){arrow} {{\n{lines}\n}}\n"


def run(text: str, *args: np.ndarray, entry: str | None = None) -> list[np.ndarray]:
    module = gir.parse(text, filename="test.gir")
    return gir.interpret(module, entry or list(module.functions)[-1], *args)


def run1(text: str, *args: np.ndarray) -> np.ndarray:
    (out,) = run(text, *args)
    return out


def array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, low: float = -3, high: float = 3) -> np.ndarray:
    if dtype in FLOATS:
        return rng.uniform(low, high, shape).astype(NP[dtype])
    if dtype == "i1":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(int(low), int(high) + 1, shape).astype(NP[dtype])


def assert_same(got: np.ndarray, want: np.ndarray, dtype: str | None = None) -> None:
    want = np.asarray(want)
    if dtype is not None:
        want = want.astype(NP[dtype])
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind == "f":
        rtol = 2e-6 if got.dtype == np.float32 else 1e-13
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def quiet(f):
    def g(*xs):
        with np.errstate(all="ignore"):
            return f(*xs)
    return g


# ---------------------------------------------------------------------------------------------
# Elementwise ops

BINARY = {
    "add": (np.add, ALL), "sub": (np.subtract, NUMERIC), "mul": (np.multiply, ALL),
    "div": (None, NUMERIC), "pow": (quiet(np.power), FLOATS),
    "max": (np.maximum, ALL), "min": (np.minimum, ALL),
    "lt": (np.less, ALL), "le": (np.less_equal, ALL), "gt": (np.greater, ALL),
    "ge": (np.greater_equal, ALL), "eq": (np.equal, ALL), "ne": (np.not_equal, ALL),
    "and": (np.logical_and, ("i1",)), "or": (np.logical_or, ("i1",)),
}
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
UNARY = {
    "neg": (np.negative, NUMERIC), "abs": (np.abs, NUMERIC), "relu": (lambda x: np.maximum(x, 0), NUMERIC),
    "exp": (quiet(np.exp), FLOATS), "log": (quiet(np.log), FLOATS), "tanh": (np.tanh, FLOATS),
    "sigmoid": (quiet(lambda x: 1 / (1 + np.exp(-x))), FLOATS), "sqrt": (quiet(np.sqrt), FLOATS),
}


def div_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.floor_divide(a, b)
    with np.errstate(all="ignore"):
        return np.true_divide(a, b)


@st.composite
def binary_cases(draw):
    op = draw(st.sampled_from(sorted(BINARY)))
    dtype = draw(st.sampled_from(BINARY[op][1]))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4))
    return op, dtype, shapes, draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(binary_cases())
def test_binary_elementwise_matches_numpy(case):
    op, dtype, shapes, seed = case
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a, b = array(rng, sa, dtype), array(rng, sb, dtype)
    if op == "div" and dtype in INTS:
        b = np.where(b == 0, 1, b).astype(b.dtype)
    if op == "pow":
        a = np.abs(a)
    out_dtype = "i1" if op in COMPARISONS else dtype
    text = func(f"%a: {ty(sa, dtype)}, %b: {ty(sb, dtype)}", ty(out_shape, out_dtype),
                f"%r = {op} %a, %b : {ty(out_shape, out_dtype)}\nreturn %r")
    fn = BINARY[op][0] or div_reference
    assert_same(run1(text, a, b), fn(a, b), out_dtype)


@SETTINGS
@given(op=st.sampled_from(sorted(UNARY)), dtype=st.sampled_from(NUMERIC),
       shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), seed=st.integers(0, 2**32 - 1))
def test_unary_elementwise_matches_numpy(op, dtype, shape, seed):
    fn, dtypes = UNARY[op]
    if dtype not in dtypes:
        dtype = "f64" if dtype == "i64" else "f32"
    x = array(np.random.default_rng(seed), shape, dtype, low=-20, high=20)
    text = func(f"%x: {ty(shape, dtype)}", ty(shape, dtype), f"%r = {op} %x : {ty(shape, dtype)}\nreturn %r")
    assert_same(run1(text, x), fn(x), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_special_values(dtype):
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 100.0, -100.0], dtype=NP[dtype])
    for op, (fn, _) in UNARY.items():
        text = func(f"%x: {ty(x.shape, dtype)}", ty(x.shape, dtype), f"%r = {op}(%x)\nreturn %r")
        assert_same(run1(text, x), fn(x), dtype)


def test_sigmoid_does_not_overflow():
    x = np.array([-1000.0, -88.0, 0.0, 88.0, 1000.0], np.float32)
    text = func("%x: tensor<5xf32>", "tensor<5xf32>", "%r = sigmoid(%x)\nreturn %r")
    np.testing.assert_allclose(run1(text, x), [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)


def test_integer_div_floors_like_numpy():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    text = func("%a: tensor<5xi32>, %b: tensor<5xi32>", "tensor<5xi32>", "%r = %a / %b\nreturn %r")
    assert_same(run1(text, a, b), np.array([3, -4, -4, 3, 0], np.int32))


def test_integer_div_by_zero_is_a_gir_error():
    text = func("%a: tensor<2xi64>, %b: tensor<2xi64>", "tensor<2xi64>", "%r = %a / %b\nreturn %r")
    with pytest.raises(gir.GirError, match="division by zero") as info:
        run(text, np.array([1, 2]), np.array([1, 0]))
    assert "test.gir:2:" in str(info.value)


def test_float_div_by_zero_gives_inf():
    text = func("%a: tensor<3xf32>, %b: tensor<3xf32>", "tensor<3xf32>", "%r = %a / %b\nreturn %r")
    out = run1(text, np.array([1, -1, 0], np.float32), np.zeros(3, np.float32))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


# Which dtypes each elementwise op refuses at parse time (the complement of what it allows).
REFUSED = [(op, dtype) for op, (_, dtypes) in sorted(BINARY.items()) if op not in ("sub", "div")
           for dtype in ALL if dtype not in dtypes]
REFUSED += [(op, dtype) for op, (_, dtypes) in sorted(UNARY.items()) for dtype in ALL if dtype not in dtypes]


@pytest.mark.parametrize("op,dtype", REFUSED)
def test_type_rule_refuses_dtype(op, dtype):
    arity = 2 if op in BINARY else 1
    params = ", ".join(f"%{n}: {ty((3,), dtype)}" for n in "ab"[:arity])
    operands = ", ".join(f"%{n}" for n in "ab"[:arity])
    text = func(params, "", f"%r = {op} {operands}\nreturn")
    with pytest.raises(gir.GirTypeError, match=op):
        gir.parse(text)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "max", "min"])
def test_mixed_dtypes_are_refused(op):
    text = func("%a: tensor<3xf32>, %b: tensor<3xf64>", "", f"%r = {op} %a, %b\nreturn")
    with pytest.raises(gir.GirTypeError, match="dtype"):
        gir.parse(text)


def test_sub_on_i1_is_refused_or_runs():
    text = func("%a: tensor<2xi1>, %b: tensor<2xi1>", "tensor<2xi1>", "%r = sub %a, %b : tensor<2xi1>\nreturn %r")
    try:
        module = gir.parse(text)
    except gir.GirError:
        return
    try:
        gir.interpret(module, "f", np.array([True, False]), np.array([True, True]))
    except gir.GirError:
        pass


@st.composite
def select_cases(draw):
    dtype = draw(st.sampled_from(ALL))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
    return dtype, shapes, draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(select_cases())
def test_select_matches_numpy_where(case):
    dtype, shapes, seed = case
    (sc, sa, sb), out = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    c, a, b = array(rng, sc, "i1"), array(rng, sa, dtype), array(rng, sb, dtype)
    text = func(f"%c: {ty(sc, 'i1')}, %a: {ty(sa, dtype)}, %b: {ty(sb, dtype)}", ty(out, dtype),
                f"%r = select %c, %a, %b : {ty(out, dtype)}\nreturn %r")
    assert_same(run1(text, c, a, b), np.where(c, a, b), dtype)


def test_select_refuses_a_non_i1_condition():
    text = func("%c: tensor<3xf32>, %a: tensor<3xf32>", "", "%r = select %c, %a, %a\nreturn")
    with pytest.raises(gir.GirTypeError, match="i1"):
        gir.parse(text)


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_cast_matches_numpy_astype(src, dst):
    rng = np.random.default_rng(0)
    x = array(rng, (2, 5), src, low=-100, high=100)
    if src in FLOATS:
        x[0, :3] = [0.5, -0.5, 0.0]
    text = func(f"%x: {ty((2, 5), src)}", ty((2, 5), dst), f'%r = cast(%x, dtype="{dst}")\nreturn %r')
    assert_same(run1(text, x), x.astype(NP[dst]), dst)
    generic = func(f"%x: {ty((2, 5), src)}", ty((2, 5), dst), f"%r = cast %x : {ty((2, 5), dst)}\nreturn %r")
    assert_same(run1(generic, x), x.astype(NP[dst]), dst)


def test_surface_literals_take_the_other_operands_dtype():
    text = func("%x: tensor<3xf64>, %i: tensor<3xi64>", "(tensor<3xf64>, tensor<3xi64>, tensor<f32>, tensor<i32>)", """
        %y = 2 * %x - 0.5
        %j = -%i + 3
        %f = 1.5
        %k = 4
        return %y, %j, %f, %k
        """)
    x, i = np.array([1.0, 2.0, 3.0]), np.array([1, 2, 3])
    y, j, f, k = run(text, x, i)
    assert_same(y, 2 * x - 0.5)
    assert_same(j, -i + 3)
    assert_same(f, np.float32(1.5))
    assert_same(k, np.int32(4))


# ---------------------------------------------------------------------------------------------
# Constants


def test_constants():
    text = func("", "(tensor<2x2xf32>, tensor<2x3xf64>, tensor<3xi32>, tensor<2xi1>, tensor<0xf32>, tensor<i64>)", """
        %a = constant [[1.0, -2.5], [3e-05, 1e+20]] : tensor<2x2xf32>
        %b = constant 0.25 : tensor<2x3xf64>
        %c = constant [1, -2, 3] : tensor<3xi32>
        %d = constant [true, false] : tensor<2xi1>
        %e = constant [] : tensor<0xf32>
        %f = constant -7 : tensor<i64>
        return %a, %b, %c, %d, %e, %f
        """)
    a, b, c, d, e, f = run(text)
    assert_same(a, np.array([[1.0, -2.5], [3e-05, 1e20]], np.float32))
    assert_same(b, np.full((2, 3), 0.25))
    assert_same(c, np.array([1, -2, 3], np.int32))
    assert_same(d, np.array([True, False]))
    assert_same(e, np.zeros(0, np.float32))
    assert_same(f, np.int64(-7))


def test_special_float_constants():
    text = func("", "tensor<3xf64>", "%c = constant [inf, -inf, nan] : tensor<3xf64>\nreturn %c")
    out = run1(text)
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


@pytest.mark.parametrize("dtype", ALL)
def test_zeros_ones_fill(dtype):
    value = {"f32": "1.5", "f64": "-2.25", "i32": "3", "i64": "-4", "i1": "true"}[dtype]
    t = ty((2, 3), dtype)
    text = func("", f"({t}, {t}, {t})", f"""
        %z = zeros : {t}
        %o = ones : {t}
        %v = constant {value} : {ty((), dtype)}
        %f = fill %v : {t}
        return %z, %o, %f
        """)
    z, o, f = run(text)
    assert_same(z, np.zeros((2, 3), NP[dtype]))
    assert_same(o, np.ones((2, 3), NP[dtype]))
    assert_same(f, np.full((2, 3), {"true": True}.get(value, value), NP[dtype]))


def test_surface_zeros_ones_fill():
    text = func("%v: tensor<f64>", "(tensor<2x3xi64>, tensor<4xf32>, tensor<2xf64>)", """
        %z = zeros(shape=[2, 3], dtype="i64")
        %o = ones(shape=[4])
        %f = fill(%v, shape=[2], dtype="f64")
        return %z, %o, %f
        """)
    z, o, f = run(text, np.float64(2.5))
    assert_same(z, np.zeros((2, 3), np.int64))
    assert_same(o, np.ones(4, np.float32))
    assert_same(f, np.full(2, 2.5))


# ---------------------------------------------------------------------------------------------
# Reductions


@st.composite
def reduction_cases(draw):
    op = draw(st.sampled_from(["sum", "mean", "reduce_max", "reduce_min"]))
    dtype = draw(st.sampled_from(FLOATS if op == "mean" else NUMERIC))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    rank = len(shape)
    axes = draw(st.none() | st.lists(st.integers(0, max(rank - 1, 0)), unique=True, max_size=rank))
    if axes is not None and rank:
        axes = [a - rank if draw(st.booleans()) else a for a in axes]
    if rank == 0 and axes:
        axes = None
    return op, dtype, shape, axes, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(reduction_cases())
def test_reductions_match_numpy(case):
    op, dtype, shape, axes, keepdims, seed = case
    x = array(np.random.default_rng(seed), shape, dtype)
    fn = {"sum": np.sum, "mean": np.mean, "reduce_max": np.max, "reduce_min": np.min}[op]
    want = np.asarray(fn(x, axis=None if axes is None else tuple(axes), keepdims=keepdims)).astype(x.dtype)
    attrs = []
    if axes is not None:
        attrs.append(f"axes = [{', '.join(map(str, axes))}]")
    if keepdims:
        attrs.append("keepdims = true")
    attr_text = " {" + ", ".join(attrs) + "}" if attrs else ""
    text = func(f"%x: {ty(shape, dtype)}", ty(want.shape, dtype), f"%r = {op} %x{attr_text}\nreturn %r")
    assert_same(run1(text, x), want)


def test_surface_reductions():
    text = func("%x: tensor<2x3x4xf64>", "(tensor<f64>, tensor<2x1x4xf64>, tensor<3xf64>, tensor<2x4xf64>)", """
        %a = sum(%x)
        %b = max(%x, axes=[1], keepdims=true)
        %c = min(%x, axes=[0, -1])
        %d = mean(%x, axes=[1])
        return %a, %b, %c, %d
        """)
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    a, b, c, d = run(text, x)
    assert_same(a, x.sum())
    assert_same(b, x.max(axis=1, keepdims=True))
    assert_same(c, x.min(axis=(0, 2)))
    assert_same(d, x.mean(axis=1))


# ---------------------------------------------------------------------------------------------
# Linear algebra and layout


@st.composite
def matmul_cases(draw):
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3))
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    dtype = draw(st.sampled_from(NUMERIC))
    (ba, bb), bo = batch.input_shapes, batch.result_shape
    return dtype, ba + (m, k), bb + (k, n), bo + (m, n), draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(matmul_cases())
def test_matmul_matches_numpy(case):
    dtype, sa, sb, so, seed = case
    rng = np.random.default_rng(seed)
    a, b = array(rng, sa, dtype), array(rng, sb, dtype)
    text = func(f"%a: {ty(sa, dtype)}, %b: {ty(sb, dtype)}", ty(so, dtype), "%r = %a @ %b\nreturn %r")
    assert_same(run1(text, a, b), np.matmul(a, b))


def test_matmul_batched_broadcast_batch_dims():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((5, 4, 6))
    text = func("%a: tensor<2x1x3x4xf64>, %b: tensor<5x4x6xf64>", "tensor<2x5x3x6xf64>",
                "%r = matmul %a, %b : tensor<2x5x3x6xf64>\nreturn %r")
    assert_same(run1(text, a, b), a @ b)


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), data=st.data())
def test_transpose_with_perm(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = np.transpose(x, perm)
    text = func(f"%x: {ty(shape, 'f32')}", ty(want.shape, "f32"),
                f"%r = transpose %x {{perm = [{', '.join(map(str, perm))}]}}\nreturn %r")
    assert_same(run1(text, x), want)


def test_transpose_default_reverses_axes():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    text = func("%x: tensor<2x3x4xi64>", "tensor<4x3x2xi64>", "%r = transpose(%x)\nreturn %r")
    assert_same(run1(text, x), x.T)


@pytest.mark.parametrize("shape", [[-1], [6, -1], [-1, 4], [2, -1, 2], [4, 6], [1, 24, 1], [2, 3, 2, 2]])
def test_reshape(shape):
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    want = x.reshape(shape)
    text = func("%x: tensor<2x3x4xf64>", ty(want.shape, "f64"),
                f"%r = reshape %x {{shape = [{', '.join(map(str, shape))}]}}\nreturn %r")
    assert_same(run1(text, x), want)


def test_reshape_of_an_unknown_dim():
    text = func("%x: tensor<?x4xf32>", "tensor<?x2xf32>", "%r = reshape(%x, shape=[-1, 2])\nreturn %r")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_same(run1(text, x), x.reshape(-1, 2))


@pytest.mark.parametrize("src,dst", [((), (2, 3)), ((3,), (2, 3)), ((3, 1), (2, 3, 4)), ((1, 1), (1, 5)),
                                     ((2, 3), (2, 3)), ((1,), (0,))])
def test_broadcast(src, dst):
    x = np.arange(int(np.prod(src)), dtype=np.int32).reshape(src) + 1
    text = func(f"%x: {ty(src, 'i32')}", ty(dst, "i32"),
                f"%r = broadcast %x {{shape = [{', '.join(map(str, dst))}]}}\nreturn %r")
    assert_same(run1(text, x), np.broadcast_to(x, dst))


@st.composite
def concat_cases(draw):
    base = list(draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)))
    axis = draw(st.integers(-len(base), len(base) - 1))
    shapes = []
    for _ in range(draw(st.integers(1, 4))):
        s = list(base)
        s[axis] = draw(st.integers(0, 3))
        shapes.append(tuple(s))
    return shapes, axis, draw(st.sampled_from(ALL)), draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(concat_cases())
def test_concat_matches_numpy(case):
    shapes, axis, dtype, seed = case
    rng = np.random.default_rng(seed)
    xs = [array(rng, s, dtype) for s in shapes]
    want = np.concatenate(xs, axis=axis)
    params = ", ".join(f"%x{i}: {ty(s, dtype)}" for i, s in enumerate(shapes))
    operands = ", ".join(f"%x{i}" for i in range(len(shapes)))
    text = func(params, ty(want.shape, dtype), f"%r = concat {operands} {{axis = {axis}}}\nreturn %r")
    assert_same(run1(text, *xs), want)


@st.composite
def slice_cases(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6))
    starts, limits, steps = [], [], []
    for d in shape:
        start = draw(st.integers(0, d))
        starts.append(start)
        limits.append(draw(st.integers(start, d)))
        steps.append(draw(st.integers(1, 3)))
    return shape, starts, limits, steps, draw(st.booleans())


@SETTINGS
@given(slice_cases())
def test_slice_with_steps(case):
    shape, starts, limits, steps, give_steps = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    if not give_steps:
        steps = [1] * len(shape)
    want = x[tuple(slice(s, lim, st_) for s, lim, st_ in zip(starts, limits, steps))]
    attrs = f"starts = [{', '.join(map(str, starts))}], limits = [{', '.join(map(str, limits))}]"
    if give_steps:
        attrs += f", steps = [{', '.join(map(str, steps))}]"
    text = func(f"%x: {ty(shape, 'f32')}", ty(want.shape, "f32"), f"%r = slice %x {{{attrs}}}\nreturn %r")
    assert_same(run1(text, x), want)


@pytest.mark.parametrize("idx_dtype", INTS)
@pytest.mark.parametrize("i", [0, 2, 4])
def test_index(idx_dtype, i):
    x = np.arange(15, dtype=np.float64).reshape(5, 3)
    text = func(f"%x: tensor<5x3xf64>, %i: {ty((), idx_dtype)}", "tensor<3xf64>", "%r = index %x, %i\nreturn %r")
    assert_same(run1(text, x, np.asarray(i, NP[idx_dtype])), x[i])


@pytest.mark.parametrize("i", [-1, 5, 100])
def test_index_out_of_range_is_a_gir_error(i):
    text = func("%x: tensor<5x3xf64>, %i: tensor<i32>", "tensor<3xf64>", "%r = index %x, %i\nreturn %r")
    with pytest.raises(gir.GirError, match="out of range"):
        run(text, np.zeros((5, 3)), np.int32(i))


def test_index_of_a_scalar_into_a_vector():
    text = func("%x: tensor<4xi32>", "tensor<i32>", "%i = constant 3 : tensor<i32>\n%r = index %x, %i\nreturn %r")
    assert_same(run1(text, np.array([5, 6, 7, 8], np.int32)), np.int32(8))


def test_surface_index_with_a_literal():
    text = func("%x: tensor<5x3xf32>", "tensor<3xf32>", "%r = index(%x, 1)\nreturn %r")
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert_same(run1(text, x), x[1])


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=3), n=st.integers(1, 4), data=st.data())
def test_stack_matches_numpy(shape, n, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    dtype = data.draw(st.sampled_from(ALL))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    xs = [array(rng, shape, dtype) for _ in range(n)]
    want = np.stack(xs, axis=axis)
    params = ", ".join(f"%x{i}: {ty(shape, dtype)}" for i in range(n))
    operands = ", ".join(f"%x{i}" for i in range(n))
    text = func(params, ty(want.shape, dtype), f"%r = stack {operands} {{axis = {axis}}}\nreturn %r")
    assert_same(run1(text, *xs), want)


def test_surface_stack_and_concat():
    text = func("%a: tensor<2xf32>, %b: tensor<2xf32>", "(tensor<3x2xf32>, tensor<2x2xf32>, tensor<6xf32>)", """
        %s = stack(%a, %b, %a)
        %t = stack(%a, %b, axis=1)
        %c = concat(%a, %b, %a, axis=0)
        return %s, %t, %c
        """)
    a, b = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    s, t, c = run(text, a, b)
    assert_same(s, np.stack([a, b, a]))
    assert_same(t, np.stack([a, b], axis=1))
    assert_same(c, np.concatenate([a, b, a]))


def test_transfer_is_the_identity():
    text = func("%x: tensor<3xf32>", "tensor<3xf32>", '%r = transfer %x {device = "gpu"} : tensor<3xf32>\nreturn %r')
    x = np.array([1, 2, 3], np.float32)
    assert_same(run1(text, x), x)


def test_mlp_example_matches_numpy():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "mlp.gir"
    if not path.exists():
        pytest.skip("examples/mlp.gir is not written yet")
    module = gir.load(str(path))
    f = module.functions["mlp_loss"]
    rng = np.random.default_rng(3)
    args = [(0.1 * rng.standard_normal(t.shape)).astype(np.float32) for t in f.arg_types]
    x, y, w1, b1, w2, b2 = args
    (loss,) = gir.interpret(module, "mlp_loss", *args)
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss, -(y * logp).sum(axis=1).mean(), rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# scan and for


def test_scan_sequences_only():
    text = func("%xs: tensor<5x3xf32>, %ys: tensor<5xf32>", "(tensor<5x3xf32>, tensor<5xf32>)", """
        %a, %b = scan (%x in %xs, %y in %ys) {
          %z = %x * %y
          %w = sum(%z)
          yield () stack (%z, %w)
        } : tensor<5x3xf32>, tensor<5xf32>
        return %a, %b
        """)
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    a, b = run(text, xs, ys)
    assert_same(a, xs * ys[:, None])
    assert_same(b, (xs * ys[:, None]).sum(axis=1))


def test_scan_carries_only_with_length():
    text = func("%c0: tensor<2xi64>", "tensor<2xi64>", """
        %two = constant 2 : tensor<2xi64>
        %c = scan length 6 () carry (%c1 = %c0) {
          %c2 = mul %c1, %two : tensor<2xi64>
          yield (%c2)
        } : tensor<2xi64>
        return %c
        """)
    assert_same(run1(text, np.array([1, -3])), np.array([64, -192]))


def test_scan_with_length_and_no_carries_stacks_a_loop_invariant():
    text = func("%v: tensor<2xf32>", "tensor<3x2xf32>", """
        %vs = scan length 3 () {
          %w = exp(%v)
          yield () stack (%w)
        } : tensor<3x2xf32>
        return %vs
        """)
    v = np.array([0.0, 1.0], np.float32)
    assert_same(run1(text, v), np.stack([np.exp(v)] * 3))


def test_scan_of_zero_steps_returns_inits_and_empty_stacks():
    text = func("%c0: tensor<3xf32>", "(tensor<3xf32>, tensor<0x3xf32>)", """
        %c, %cs = scan length 0 () carry (%c1 = %c0) {
          %c2 = %c1 + 1.0
          yield (%c2) stack (%c2)
        } : tensor<3xf32>, tensor<0x3xf32>
        return %c, %cs
        """)
    c0 = np.array([1, 2, 3], np.float32)
    c, cs = run(text, c0)
    assert_same(c, c0)
    assert_same(cs, np.zeros((0, 3), np.float32))


def rnn_reference(xs, ys, h0, k0, w, reverse=False):
    """Two sequences, two carries, three stacks, the loop as plain NumPy."""
    h, k = h0, k0
    T = xs.shape[0]
    hs, ks, zs = [None] * T, [None] * T, [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        h = np.tanh(xs[t] @ w + h * ys[t])
        k = k + h.sum()
        hs[t], ks[t], zs[t] = h, k, xs[t] * 2
    return h, k, np.stack(hs), np.stack(ks), np.stack(zs)


def rnn_program(T, B, D, dtype, reverse):
    t = lambda *s: ty(s, dtype)  # noqa: E731
    return func(f"%xs: {t(T, B, D)}, %ys: {t(T, B, 1)}, %h0: {t(B, D)}, %k0: {t()}, %w: {t(D, D)}",
                f"({t(B, D)}, {t()}, {t(T, B, D)}, {t(T)}, {t(T, B, D)})", f"""
        %h, %k, %hs, %ks, %zs = scan{" reverse" if reverse else ""} (%x in %xs, %y in %ys)
                                    carry (%hc = %h0, %kc = %k0) {{
          %hn = tanh(%x @ %w + %hc * %y)
          %kn = %kc + sum(%hn)
          %z = %x * 2.0
          yield (%hn, %kn) stack (%hn, %kn, %z)
        }} : {t(B, D)}, {t()}, {t(T, B, D)}, {t(T)}, {t(T, B, D)}
        return %h, %k, %hs, %ks, %zs
        """)


@SETTINGS
@given(T=st.integers(1, 6), B=st.integers(1, 3), D=st.integers(1, 4), dtype=st.sampled_from(FLOATS),
       reverse=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_scan_several_sequences_carries_and_stacks(T, B, D, dtype, reverse, seed):
    rng = np.random.default_rng(seed)
    xs, ys = array(rng, (T, B, D), dtype, -1, 1), array(rng, (T, B, 1), dtype, -1, 1)
    h0, k0, w = array(rng, (B, D), dtype, -1, 1), array(rng, (), dtype), array(rng, (D, D), dtype, -1, 1)
    got = run(rnn_program(T, B, D, dtype, reverse), xs, ys, h0, k0, w)
    want = rnn_reference(xs, ys, h0, k0, w, reverse)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5 if dtype == "f32" else 1e-12, atol=1e-5)
        assert g.dtype == NP[dtype] and g.shape == np.shape(r)


def test_reverse_scan_stores_step_t_at_index_t():
    text = func("%xs: tensor<4xi32>", "(tensor<i32>, tensor<4xi32>, tensor<4xi32>)", """
        %zero = constant 0 : tensor<i32>
        %one = constant 1 : tensor<i32>
        %n, %order, %suffix = scan reverse (%x in %xs) carry (%k = %zero) {
          %k1 = add %k, %one : tensor<i32>
          %s = add %k, %x : tensor<i32>
          yield (%k1) stack (%k, %x)
        } : tensor<i32>, tensor<4xi32>, tensor<4xi32>
        return %n, %order, %suffix
        """)
    xs = np.array([10, 20, 30, 40], np.int32)
    n, order, elems = run(text, xs)
    assert_same(n, np.int32(4))
    assert_same(order, np.array([3, 2, 1, 0], np.int32))  # step t = 3 runs first, with k = 0
    assert_same(elems, xs)  # index t holds step t's element, not the t-th step executed


def test_reverse_scan_suffix_sums():
    text = func("%xs: tensor<5x2xf64>", "(tensor<2xf64>, tensor<5x2xf64>)", """
        %z = zeros : tensor<2xf64>
        %s, %ss = scan reverse (%x in %xs) carry (%acc = %z) {
          %acc1 = %acc + %x
          yield (%acc1) stack (%acc1)
        } : tensor<2xf64>, tensor<5x2xf64>
        return %s, %ss
        """)
    xs = np.random.default_rng(4).standard_normal((5, 2))
    s, ss = run(text, xs)
    assert_same(s, xs.sum(axis=0))
    assert_same(ss, np.cumsum(xs[::-1], axis=0)[::-1])


def test_reverse_with_length_only():
    text = func("", "tensor<3xi32>", """
        %zero = constant 0 : tensor<i32>
        %k, %ks = scan reverse length 3 () carry (%c = %zero) {
          %c1 = %c + 1
          yield (%c1) stack (%c)
        } : tensor<i32>, tensor<3xi32>
        return %ks
        """)
    assert_same(run1(text), np.array([2, 1, 0], np.int32))


def test_scan_with_length_and_sequences_that_agree():
    text = func("%xs: tensor<3xf32>", "tensor<3xf32>", """
        %ys = scan length 3 (%x in %xs) {
          %y = %x * %x
          yield () stack (%y)
        } : tensor<3xf32>
        return %ys
        """)
    xs = np.array([1, 2, 3], np.float32)
    assert_same(run1(text, xs), xs * xs)


def test_scan_closes_over_outer_values():
    text = func("%xs: tensor<4x3xf32>, %w: tensor<3x3xf32>, %b: tensor<3xf32>", "(tensor<3xf32>, tensor<4x3xf32>)", """
        %scale = constant 0.5 : tensor<f32>
        %wb = %w * %scale
        %h0 = zeros : tensor<3xf32>
        %h, %hs = scan (%x in %xs) carry (%hc = %h0) {
          %row = reshape(%hc, shape=[1, 3])
          %p = reshape(%row @ %wb, shape=[3])
          %hn = tanh(%p + %x + %b)
          yield (%hn) stack (%hn)
        } : tensor<3xf32>, tensor<4x3xf32>
        return %h, %hs
        """)
    rng = np.random.default_rng(5)
    xs, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3, 3), (3,)])
    h, hs = np.zeros(3, np.float32), []
    for x in xs:
        h = np.tanh(h @ (w * np.float32(0.5)) + x + b)
        hs.append(h)
    got_h, got_hs = run(text, xs, w, b)
    np.testing.assert_allclose(got_h, h, rtol=1e-5)
    np.testing.assert_allclose(got_hs, np.stack(hs), rtol=1e-5)


def test_nested_scans():
    text = func("%xss: tensor<3x4x2xf64>", "(tensor<3x2xf64>, tensor<3x4x2xf64>, tensor<2xf64>)", """
        %z = zeros : tensor<2xf64>
        %total, %rows, %cums = scan (%xs in %xss) carry (%t = %z) {
          %r, %cs = scan (%x in %xs) carry (%acc = %z) {
            %acc1 = %acc + %x + %t
            yield (%acc1) stack (%acc1)
          } : tensor<2xf64>, tensor<4x2xf64>
          %t1 = %t + %r
          yield (%t1) stack (%r, %cs)
        } : tensor<2xf64>, tensor<3x2xf64>, tensor<3x4x2xf64>
        return %rows, %cums, %total
        """)
    xss = np.random.default_rng(6).standard_normal((3, 4, 2))
    t, rows, cums = np.zeros(2), [], []
    for xs in xss:
        acc, cs = np.zeros(2), []
        for x in xs:
            acc = acc + x + t
            cs.append(acc)
        t = t + acc
        rows.append(acc)
        cums.append(np.stack(cs))
    got_rows, got_cums, got_total = run(text, xss)
    assert_same(got_rows, np.stack(rows))
    assert_same(got_cums, np.stack(cums))
    assert_same(got_total, t)


def test_ssa_for_op():
    text = func("%xs: tensor<5x3xf32>", "tensor<5x3xf32>", """
        %ws = for (%x in %xs) {
          %y = neg %x : tensor<3xf32>
          yield () stack (%y)
        } : tensor<5x3xf32>
        return %ws
        """)
    xs = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert_same(run1(text, xs), -xs)


def test_reverse_for_op_runs_steps_backwards():
    text = func("%xs: tensor<4xf32>", "(tensor<4xf32>, tensor<4xf32>)", """
        %acc = var : tensor<f32>
        %z = constant 0.0 : tensor<f32>
        store %acc, %z
        %ys = for reverse (%x in %xs) {
          %old = load %acc : tensor<f32>
          %new = add %old, %x : tensor<f32>
          store %acc, %new
          yield () stack (%new)
        } : tensor<4xf32>
        %same = for reverse (%x in %xs) {
          yield () stack (%x)
        } : tensor<4xf32>
        return %ys, %same
        """)
    xs = np.array([1, 2, 3, 4], np.float32)
    ys, same = run(text, xs)
    assert_same(ys, np.array([10, 9, 7, 4], np.float32))
    assert_same(same, xs)


def test_generic_var_load_store():
    text = func("%a: tensor<3xf32>", "(tensor<3xf32>, tensor<3xf32>)", """
        %h = var : tensor<3xf32>
        store %h, %a
        %v = load %h : tensor<3xf32>
        %w = tanh %v : tensor<3xf32>
        store %h, %w
        %r = load %h : tensor<3xf32>
        return %v, %r
        """)
    a = np.array([0.5, -1, 2], np.float32)
    v, r = run(text, a)
    assert_same(v, a)
    assert_same(r, np.tanh(a))


def test_var_stored_in_a_scan_body_persists_across_steps():
    text = func("%xs: tensor<4xf32>", "(tensor<f32>, tensor<4xf32>)", """
        %acc = var : tensor<f32>
        %z = constant 0.0 : tensor<f32>
        store %acc, %z
        %ys = scan (%x in %xs) {
          %old = load %acc : tensor<f32>
          %new = add %old, %x : tensor<f32>
          store %acc, %new
          yield () stack (%old)
        } : tensor<4xf32>
        %final = load %acc : tensor<f32>
        return %final, %ys
        """)
    xs = np.array([1, 2, 3, 4], np.float32)
    final, ys = run(text, xs)
    assert_same(final, np.float32(10))
    assert_same(ys, np.array([0, 1, 3, 6], np.float32))


def test_surface_for_loop_with_reassignment_and_collect():
    text = func("%xs: tensor<6x2x3xf32>, %h0: tensor<2x3xf32>, %w: tensor<3x3xf32>",
                "(tensor<2x3xf32>, tensor<f32>, tensor<6x2x3xf32>, tensor<6xf32>)", """
        %h = %h0
        %loss = constant 0.0 : tensor<f32>
        for %x in %xs {
          %h = tanh(%x + %h @ %w)
          %step = sum(%h * %h)
          %loss = %loss + %step
          collect %h into %hs
          collect %step into %steps
        }
        return %h, %loss, %hs, %steps
        """)
    rng = np.random.default_rng(7)
    xs, h0, w = (rng.standard_normal(s).astype(np.float32) for s in [(6, 2, 3), (2, 3), (3, 3)])
    h, loss, hs, steps = h0, np.float32(0), [], []
    for x in xs:
        h = np.tanh(x + h @ w)
        steps.append((h * h).sum())
        loss = loss + steps[-1]
        hs.append(h)
    got = run(text, xs, h0, w)
    for g, want in zip(got, [h, loss, np.stack(hs), np.stack(steps)]):
        np.testing.assert_allclose(g, want, rtol=1e-5)


def test_surface_for_over_several_sequences():
    text = func("%xs: tensor<4x2xi32>, %ys: tensor<4xi32>", "(tensor<4x2xi32>, tensor<2xi32>)", """
        %s = zeros(shape=[2], dtype="i32")
        for %x in %xs, %y in %ys {
          %s = %s + %x * %y
          collect %x * %y into %ps
        }
        return %ps, %s
        """)
    xs, ys = np.arange(8, dtype=np.int32).reshape(4, 2), np.array([1, -1, 2, 0], np.int32)
    ps, s = run(text, xs, ys)
    assert_same(ps, xs * ys[:, None])
    assert_same(s, (xs * ys[:, None]).sum(axis=0).astype(np.int32))


def test_nested_surface_for_loops():
    text = func("%xss: tensor<3x4xf32>", "(tensor<f32>, tensor<3x4xf32>)", """
        %total = constant 0.0 : tensor<f32>
        for %xs in %xss {
          for %x in %xs {
            %total = %total + %x
            collect %total into %running
          }
          collect %running into %table
        }
        return %total, %table
        """)
    xss = np.arange(12, dtype=np.float32).reshape(3, 4)
    total, table = run(text, xss)
    assert_same(total, np.float32(xss.sum()))
    assert_same(table, np.cumsum(xss.reshape(-1)).reshape(3, 4).astype(np.float32))


def test_rnn_example_loss_matches_numpy():
    from pathlib import Path

    module = gir.load(str(Path(__file__).resolve().parent.parent / "examples" / "rnn.gir"))
    f = module.functions["rnn_loss"]
    rng = np.random.default_rng(8)
    args = [(0.1 * rng.standard_normal(t.shape)).astype(np.float32) for t in f.arg_types]
    xs, h0, wx, wh, b = args
    h, ref = h0, 0.0
    for x in xs:
        h = np.tanh(x @ wx + h @ wh + b)
        ref += float((h * h).sum())
    np.testing.assert_allclose(gir.interpret(module, "rnn_loss", *args)[0], ref, rtol=1e-4)


def test_call():
    callee = func("%a: tensor<3xf32>, %b: tensor<f32>", "(tensor<f32>, tensor<3xf32>)",
                  "%s = sum(%a * %b)\nreturn %s, %a", name="g")
    text = callee + func("%x: tensor<3xf32>", "(tensor<f32>, tensor<f32>)", """
        %two = constant 2.0 : tensor<f32>
        %s, %y = call @g(%x, %two) : tensor<f32>, tensor<3xf32>
        %t, %z = @g(%y, %s)
        return %s, %t
        """)
    x = np.array([1, 2, 3], np.float32)
    s, t = run(text, x, entry="f")
    assert_same(s, np.float32(12))
    assert_same(t, np.float32(72))


def test_surface_call_in_an_expression_and_in_a_loop():
    text = func("%x: tensor<2xf64>", "tensor<2xf64>", "%y = %x * %x\nreturn %y", name="sq") + func(
        "%xs: tensor<3x2xf64>", "(tensor<2xf64>, tensor<3x2xf64>)", """
        %acc = zeros(shape=[2], dtype="f64")
        for %x in %xs {
          %acc = %acc + @sq(%x) + 1.0
          collect @sq(%acc) into %sqs
        }
        return %acc, %sqs
        """, name="main")
    xs = np.arange(6, dtype=np.float64).reshape(3, 2)
    acc, sqs = np.zeros(2), []
    for x in xs:
        acc = acc + x * x + 1
        sqs.append(acc * acc)
    got_acc, got_sqs = run(text, xs)
    assert_same(got_acc, acc)
    assert_same(got_sqs, np.stack(sqs))


def test_call_inside_a_scan_body_and_a_function_defined_later():
    text = func("%xs: tensor<4xf32>", "tensor<4xf32>", """
        %ys = scan (%x in %xs) {
          %y = call @twice(%x) : tensor<f32>
          yield () stack (%y)
        } : tensor<4xf32>
        return %ys
        """) + func("%v: tensor<f32>", "tensor<f32>", "%w = %v + %v\nreturn %w", name="twice")
    xs = np.array([1, 2, 3, 4], np.float32)
    assert_same(run(text, xs, entry="f")[0], 2 * xs)


def test_grad_is_a_clear_error_until_autodiff():
    """The interpreter itself does not run `grad`; gir.interpret runs autodiff first (on a copy)."""
    from gir.ir.interpreter import interpret as run_interpreter

    text = func("%x: tensor<3xf32>", "tensor<f32>", "%s = sum(%x * %x)\nreturn %s", name="g") + func(
        "%x: tensor<3xf32>", "(tensor<f32>, tensor<3xf32>)", "%l, %d = grad @g(%x) wrt (%x)\nreturn %l, %d")
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with pytest.raises(gir.GirError, match="autodiff") as info:
        run_interpreter(gir.parse(text, filename="test.gir"), "f", x)
    assert "test.gir:6:12: error:" in str(info.value)
    loss, d = run(text, x, entry="f")
    assert_same(loss, np.float32(14.0))
    assert_same(d, 2 * x)


# ---------------------------------------------------------------------------------------------
# Arguments


def test_unknown_dims_accept_any_size():
    text = func("%x: tensor<?x3xf32>", "tensor<?x3xf32>", "%y = tanh(%x)\nreturn %y")
    for n in (0, 1, 7):
        x = np.ones((n, 3), np.float32)
        assert_same(run1(text, x), np.tanh(x))


@pytest.mark.parametrize("args,match", [
    ((np.ones((2, 3), np.float32),), r"missing argument\(s\) %b"),
    ((np.ones((2, 3), np.float32), np.ones(3, np.float32), np.ones(1)), "takes 2 argument"),
    ((np.ones((2, 3), np.float64), np.ones(3, np.float32)), "%x"),
    ((np.ones((3, 2), np.float32), np.ones(3, np.float32)), "%x"),
    ((np.ones((2, 3), np.float32), np.ones((1, 3), np.float32)), "%b"),
    ((np.ones((2, 3), np.float32), [1.0, 2.0]), "%b"),  # a list is converted (driver/calling.py), its shape checked
], ids=["missing", "too-many", "dtype", "shape", "shape-b", "list-shape"])
def test_bad_arguments_are_gir_argument_errors(args, match):
    text = func("%x: tensor<2x3xf32>, %b: tensor<3xf32>", "tensor<2x3xf32>", "%y = %x + %b\nreturn %y")
    with pytest.raises(gir.GirArgumentError, match=match):
        run(text, *args)


def test_unknown_entry_is_a_gir_argument_error():
    module = gir.parse(func("", "", "return"))
    with pytest.raises(gir.GirArgumentError, match="@nope"):
        gir.interpret(module, "nope")


def test_sequences_of_different_runtime_lengths_are_a_gir_error():
    text = func("%xs: tensor<?x2xf32>, %ys: tensor<?xf32>", "tensor<?x2xf32>", """
        %zs = scan (%x in %xs, %y in %ys) {
          %z = %x * %y
          yield () stack (%z)
        } : tensor<?x2xf32>
        return %zs
        """)
    # The interpreter specialises `?` on the arguments, as gir.jit does: a type error at the scan.
    with pytest.raises(gir.GirError, match=r"sequence lengths and 'length' disagree: \[3, 4\]"):
        run(text, np.ones((3, 2), np.float32), np.ones(4, np.float32))


def test_length_disagreeing_with_a_runtime_sequence_is_a_gir_error():
    text = func("%xs: tensor<?x2xf32>", "tensor<5x2xf32>", """
        %ys = scan length 5 (%x in %xs) {
          yield () stack (%x)
        } : tensor<5x2xf32>
        return %ys
        """)
    with pytest.raises(gir.GirError):
        run(text, np.ones((3, 2), np.float32))
