"""Every op's VJP rule (ir/vjp.py) against central finite differences in float64.

Each case is a tiny gir program

    func @f(%a: ..., %b: ..., %cot: T) -> tensor<f64> { %y = OP(%a, %b)  return sum(%y * %cot) }
    func @g(...) -> (...) { %l, %da, %db = grad @f(%a, %b, %cot) wrt (%a, %b)  return ... }

where `%cot` is random, so the cotangent reaching OP is not all ones. `@g` is compiled twice:
with the default pipeline, and with `ssa,autodiff` alone (no canonicalize first, so every
rule runs on the op as written, even where canonicalize would have folded it away). Both
are compared with central differences of `@f` run by the interpreter on the unchanged
program: relative error < 1e-6. Shapes and attributes come from hypothesis (derandomized);
broadcasting is covered by explicit shape pairs as well as random ones.

`test_every_op_has_a_vjp_test_or_is_listed` keeps this file complete: an op kind that gets a
VJP rule without a case here, or that has no rule without being listed as non-differentiable,
fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gir
import gir.cli
import numpy as np
import pytest
from gir.ir.ops import REGISTRY
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

SETTINGS = settings(derandomize=True, deadline=None, max_examples=15, database=None)
PIPELINES = (DEFAULT_PIPELINE, "ssa,autodiff")
"""The default pipeline, and autodiff on the op exactly as written."""
EPS = 1e-6
TOLERANCE = 1e-6

Shape = tuple[int, ...]
Values = Callable[[np.random.Generator, Shape], np.ndarray]


# ---------------------------------------------------------------------------------------------
# Value domains


def normal(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape))


def positive(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """For log, sqrt and the base of pow."""
    return np.asarray(rng.uniform(0.5, 2.0, shape))


def away_from_zero(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """For abs and relu (kinks at 0) and divisors."""
    return np.asarray(rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 2.0, shape))


def distinct(rng: np.random.Generator, shape: Shape) -> np.ndarray:
    """All elements at least 0.1 apart: reduce_max/min without ties, even after a step of EPS."""
    n = int(np.prod(shape, dtype=int))
    return (0.1 * rng.permutation(n) - 0.05 * n + rng.uniform(0, 0.01, n)).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Building and checking one case


def ty(shape: Sequence[int], dtype: str = "f64") -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


def result_type(params: str, expr: str, op: str) -> tuple[tuple[int, ...], str]:
    """The shape and dtype of EXPR, as the frontend infers them; checks that it emits `op`."""
    module = gir.parse(f"func @probe({params}) {{\n  %y = {expr}\n  return\n}}\n", filename="probe.gir")
    ops = list(module["probe"].walk())
    assert op in {o.name for o in ops}, f"{expr!r} does not emit '{op}' (emits {sorted({o.name for o in ops})})"
    (y,) = [r for o in ops for r in o.results if r.name_hint == "y"]
    return y.tensor_type.shape, y.tensor_type.dtype  # type: ignore[return-value]


def gradient_program(params: list[tuple[str, Shape, str]], expr: str, out_shape: Shape, wrt: list[str]) -> str:
    sig = ", ".join(f"%{n}: {ty(s, d)}" for n, s, d in params) + f", %cot: {ty(out_shape)}"
    names = ", ".join(f"%{n}" for n, _, _ in params) + ", %cot"
    by_name = {n: (s, d) for n, s, d in params}
    results = ", ".join(["tensor<f64>"] + [ty(*by_name[n]) for n in wrt])
    grads = ", ".join(f"%d{n}" for n in wrt)
    return (f"func @f({sig}) -> tensor<f64> {{\n"
            f"  %y = {expr}\n"
            f"  return sum(%y * %cot)\n"
            f"}}\n\n"
            f"func @g({sig}) -> ({results}) {{\n"
            f"  %l, {grads} = grad @f({names}) wrt ({', '.join('%' + n for n in wrt)})\n"
            f"  return %l, {grads}\n"
            f"}}\n")


def numeric_gradient(module: gir.Module, entry: str, args: list[np.ndarray], p: int) -> np.ndarray:
    """Central differences of the scalar @entry with respect to argument p."""
    out = np.zeros_like(args[p])
    for idx in np.ndindex(args[p].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[p][idx] += EPS
        minus[p][idx] -= EPS
        f_plus = float(gir.interpret(module, entry, *plus)[0])
        f_minus = float(gir.interpret(module, entry, *minus)[0])
        out[idx] = (f_plus - f_minus) / (2 * EPS)
    return out


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want| (floored at 1e-3, so an all-zero gradient is compared
    absolutely)."""
    if want.size == 0:
        return 0.0
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-3))


def test_gradient_program_shape() -> None:
    """The case builder: @g returns the loss, then one gradient per wrt name, in that order."""
    text = gradient_program([("a", (2,), "f64"), ("b", (), "f64")], "%a * %b", (2,), ["b", "a"])
    module = gir.parse(text, filename="helper.gir")
    assert list(module.functions) == ["f", "g"]
    assert [str(t) for t in module["g"].result_types] == ["tensor<f64>", "tensor<f64>", "tensor<2xf64>"]
    assert "wrt (%b, %a)" in text


def compile_grad(text: str, pipeline: str) -> gir.Module:
    module = gir.parse(text, filename="vjp.gir")
    PassManager(pipeline, check_numerics=None, verify_each=True).run(module)
    assert not any(o.name == "grad" for o in module.walk())
    return module


def check_vjp(op: str, params: list[tuple[str, Shape, str]], expr: str, wrt: list[str],
              values: dict[str, np.ndarray], seed: int) -> None:
    """Builds the case, runs both pipelines, compares every gradient with finite differences."""
    sig = ", ".join(f"%{n}: {ty(s, d)}" for n, s, d in params)
    out_shape, out_dtype = result_type(sig, expr, op)
    assert out_dtype == "f64", out_dtype
    text = gradient_program(params, expr, out_shape, wrt)
    rng = np.random.default_rng(seed + 1)
    args = [np.asarray(values[n]) for n, _, _ in params] + [np.asarray(rng.standard_normal(out_shape))]
    reference = gir.parse(text, filename="vjp.gir")
    positions = [[n for n, _, _ in params].index(w) for w in wrt]
    want = [numeric_gradient(reference, "f", args, p) for p in positions]
    loss = gir.interpret(reference, "f", *args)[0]
    for pipeline in PIPELINES:
        got = gir.interpret(compile_grad(text, pipeline), "g", *args)
        np.testing.assert_allclose(got[0], loss, rtol=1e-12, atol=1e-12)
        for name, g, w in zip(wrt, got[1:], want):
            assert g.shape == w.shape and g.dtype == np.float64, (name, g.shape, g.dtype)
            err = relative_error(g, w)
            assert err < TOLERANCE, (f"d{name} of {expr} after {pipeline!r}: relative error {err:.2e}\n"
                                     f"got\n{g}\nfinite differences\n{w}\nprogram\n{text}")


# ---------------------------------------------------------------------------------------------
# Unary elementwise ops (and the ops that pass a value through)

UNARY: dict[str, tuple[str, Values]] = {
    "neg": ("neg(%a)", normal),
    "abs": ("abs(%a)", away_from_zero),
    "exp": ("exp(%a)", normal),
    "log": ("log(%a)", positive),
    "tanh": ("tanh(%a)", normal),
    "sigmoid": ("sigmoid(%a)", normal),
    "relu": ("relu(%a)", away_from_zero),
    "sqrt": ("sqrt(%a)", positive),
    "sin": ("sin(%a)", normal),
    "cos": ("cos(%a)", normal),
    "cast": ('cast(%a, dtype="f64")', normal),
    "transfer": ('transfer(%a, device="gpu")', normal),
}

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
SEEDS = st.integers(0, 2**31 - 1)


@pytest.mark.parametrize("op", sorted(UNARY))
@SETTINGS
@given(shape=SHAPES, seed=SEEDS)
def test_unary(op: str, shape: Shape, seed: int) -> None:
    expr, domain = UNARY[op]
    a = domain(np.random.default_rng(seed), shape)
    check_vjp(op, [("a", shape, "f64")], expr, ["a"], {"a": a}, seed)


# ---------------------------------------------------------------------------------------------
# Binary elementwise ops, with broadcasting

BINARY: dict[str, tuple[str, Values, Values]] = {
    "add": ("%a + %b", normal, normal),
    "sub": ("%a - %b", normal, normal),
    "mul": ("%a * %b", normal, normal),
    "div": ("%a / %b", normal, away_from_zero),
    "pow": ("pow(%a, %b)", positive, normal),
    "max": ("max(%a, %b)", normal, normal),
    "min": ("min(%a, %b)", normal, normal),
}

BROADCAST_PAIRS: list[tuple[Shape, Shape]] = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 4), (3, 1)),
    ((3, 4), ()),
    ((4,), (3, 4)),
    ((), (3, 4)),
    ((1, 4), (3, 1)),
    ((2, 3, 4), (3, 1)),
    ((2, 1, 4), (1, 3, 1)),
]


def binary_values(op: str, a_shape: Shape, b_shape: Shape, seed: int) -> dict[str, np.ndarray]:
    _, da, db = BINARY[op]
    rng = np.random.default_rng(seed)
    for _ in range(1000):
        a, b = da(rng, a_shape), db(rng, b_shape)
        # max/min have a kink where a == b: stay clear of it by far more than EPS.
        if op not in ("max", "min") or np.min(np.abs(a - b), initial=np.inf) > 0.05:
            return {"a": a, "b": b}
    raise AssertionError("no tie-free values found")


def check_binary(op: str, a_shape: Shape, b_shape: Shape, seed: int) -> None:
    values = binary_values(op, a_shape, b_shape, seed)
    check_vjp(op, [("a", a_shape, "f64"), ("b", b_shape, "f64")], BINARY[op][0], ["a", "b"], values, seed)


@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcasting(op: str, shapes: tuple[Shape, Shape]) -> None:
    check_binary(op, shapes[0], shapes[1], seed=7)


@pytest.mark.parametrize("op", sorted(BINARY))
@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=4),
       seed=SEEDS)
def test_binary_random_shapes(op: str, shapes: hnp.BroadcastableShapes, seed: int) -> None:
    check_binary(op, shapes.input_shapes[0], shapes.input_shapes[1], seed)


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=1, max_side=3),
       seed=SEEDS)
def test_select(shapes: hnp.BroadcastableShapes, seed: int) -> None:
    c_shape, a_shape, b_shape = shapes.input_shapes
    rng = np.random.default_rng(seed)
    values = {"c": rng.integers(0, 2, c_shape).astype(bool), "a": normal(rng, a_shape), "b": normal(rng, b_shape)}
    params = [("c", c_shape, "i1"), ("a", a_shape, "f64"), ("b", b_shape, "f64")]
    check_vjp("select", params, "select(%c, %a, %b)", ["a", "b"], values, seed)


# ---------------------------------------------------------------------------------------------
# matmul

MATMUL_SHAPES: list[tuple[Shape, Shape]] = [
    ((3, 4), (4, 2)),            # 2-D
    ((1, 1), (1, 1)),
    ((2, 3, 4), (2, 4, 5)),      # batched
    ((2, 3, 4), (4, 5)),         # 2-D weight applied to a 3-D batch (one GEMM for the weight)
    ((3, 4), (2, 4, 5)),         # 2-D left operand, batched right
    ((1, 3, 4), (2, 4, 2)),      # broadcast batch
    ((2, 1, 3, 2), (3, 2, 2)),   # 4-D with batch broadcasting
    ((2, 2, 3, 4), (4, 2)),      # 2-D weight applied to a 4-D batch
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul(shapes: tuple[Shape, Shape]) -> None:
    rng = np.random.default_rng(3)
    a_shape, b_shape = shapes
    values = {"a": normal(rng, a_shape), "b": normal(rng, b_shape)}
    check_vjp("matmul", [("a", a_shape, "f64"), ("b", b_shape, "f64")], "%a @ %b", ["a", "b"], values, 3)


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[Shape, Shape]:
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    form = draw(st.sampled_from(["both", "lhs", "rhs", "broadcast"]))
    a_batch = batch if form in ("both", "lhs", "broadcast") else ()
    b_batch = batch if form in ("both", "rhs") else tuple(1 for _ in batch) if form == "broadcast" else ()
    return a_batch + (m, k), b_batch + (k, n)


@SETTINGS
@given(shapes=matmul_shapes(), seed=SEEDS)
def test_matmul_random_shapes(shapes: tuple[Shape, Shape], seed: int) -> None:
    rng = np.random.default_rng(seed)
    a_shape, b_shape = shapes
    values = {"a": normal(rng, a_shape), "b": normal(rng, b_shape)}
    check_vjp("matmul", [("a", a_shape, "f64"), ("b", b_shape, "f64")], "%a @ %b", ["a", "b"], values, seed)


# ---------------------------------------------------------------------------------------------
# Reductions

REDUCTIONS: dict[str, tuple[str, Values]] = {
    "sum": ("sum", normal),
    "mean": ("mean", normal),
    "reduce_max": ("reduce_max", distinct),
    "reduce_min": ("reduce_min", distinct),
}


@st.composite
def reduction_case(draw: st.DrawFn) -> tuple[Shape, list[int] | None, bool]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    rank = len(shape)
    axes = draw(st.none() | st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    if axes is not None:
        axes = [a - rank if draw(st.booleans()) else a for a in axes]  # negative axes too
    return shape, axes, draw(st.booleans())


def reduction_expr(op: str, axes: list[int] | None, keepdims: bool) -> str:
    kw = ([f"axes={axes}"] if axes is not None else []) + (["keepdims=true"] if keepdims else [])
    return f"{REDUCTIONS[op][0]}({', '.join(['%a'] + kw)})"


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@SETTINGS
@given(case=reduction_case(), seed=SEEDS)
def test_reduction(op: str, case: tuple[Shape, list[int] | None, bool], seed: int) -> None:
    shape, axes, keepdims = case
    a = REDUCTIONS[op][1](np.random.default_rng(seed), shape)
    check_vjp(op, [("a", shape, "f64")], reduction_expr(op, axes, keepdims), ["a"], {"a": a}, seed)


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("axes,keepdims", [(None, False), (None, True), ([1], False), ([0, 2], True),
                                           ([-1], True), ([-3, 1], False)])
def test_reduction_axes(op: str, axes: list[int] | None, keepdims: bool) -> None:
    a = REDUCTIONS[op][1](np.random.default_rng(5), (2, 3, 4))
    check_vjp(op, [("a", (2, 3, 4), "f64")], reduction_expr(op, axes, keepdims), ["a"], {"a": a}, 5)


def test_reduce_max_splits_ties_evenly() -> None:
    """Documented behaviour at a tie (as in JAX): the elements attaining the maximum share the
    cotangent equally. Finite differences have no answer here, so this pins the rule."""
    text = """
    func @f(%a: tensor<2x3xf64>) -> tensor<f64> {
      return sum(max(%a, axes=[1]) * constant(value=[2.0, 3.0], shape=[2], dtype="f64"))
    }
    func @g(%a: tensor<2x3xf64>) -> (tensor<f64>, tensor<2x3xf64>) {
      %l, %da = grad @f(%a) wrt (%a)
      return %l, %da
    }
    """
    a = np.array([[1.0, 5.0, 5.0], [7.0, 7.0, 7.0]])
    _, da = gir.interpret(compile_grad(text, DEFAULT_PIPELINE), "g", a)
    np.testing.assert_allclose(da, [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# Layout ops


@st.composite
def transpose_case(draw: st.DrawFn) -> tuple[Shape, list[int] | None]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    perm = draw(st.none() | st.permutations(list(range(len(shape)))))
    return shape, perm


@SETTINGS
@given(case=transpose_case(), seed=SEEDS)
def test_transpose(case: tuple[Shape, list[int] | None], seed: int) -> None:
    shape, perm = case
    expr = "transpose(%a)" if perm is None else f"transpose(%a, perm={list(perm)})"
    check_vjp("transpose", [("a", shape, "f64")], expr, ["a"], {"a": normal(np.random.default_rng(seed), shape)}, seed)


@st.composite
def reshape_case(draw: st.DrawFn) -> tuple[Shape, list[int]]:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    dims = list(draw(st.permutations(list(shape))))
    if len(dims) >= 2 and draw(st.booleans()):
        dims = [dims[0] * dims[1]] + dims[2:]  # merge two dims
    if draw(st.booleans()):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    if dims and draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return shape, dims


@SETTINGS
@given(case=reshape_case(), seed=SEEDS)
def test_reshape(case: tuple[Shape, list[int]], seed: int) -> None:
    shape, target = case
    check_vjp("reshape", [("a", shape, "f64")], f"reshape(%a, shape={target})", ["a"],
              {"a": normal(np.random.default_rng(seed), shape)}, seed)


@st.composite
def broadcast_case(draw: st.DrawFn) -> tuple[Shape, Shape]:
    target = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    source = target[draw(st.integers(0, len(target))):]
    source = tuple(1 if draw(st.booleans()) else d for d in source)
    return source, target


@SETTINGS
@given(case=broadcast_case(), seed=SEEDS)
def test_broadcast(case: tuple[Shape, Shape], seed: int) -> None:
    source, target = case
    check_vjp("broadcast", [("a", source, "f64")], f"broadcast(%a, shape={list(target)})", ["a"],
              {"a": normal(np.random.default_rng(seed), source)}, seed)


@st.composite
def concat_case(draw: st.DrawFn) -> tuple[list[Shape], int]:
    base = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    rank = len(base)
    axis = draw(st.integers(-rank, rank - 1))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    shapes = [tuple(s if i == axis % rank else d for i, d in enumerate(base)) for s in sizes]
    return shapes, axis


@SETTINGS
@given(case=concat_case(), seed=SEEDS)
def test_concat(case: tuple[list[Shape], int], seed: int) -> None:
    shapes, axis = case
    rng = np.random.default_rng(seed)
    names = [f"a{i}" for i in range(len(shapes))]
    expr = f"concat({', '.join('%' + n for n in names)}, axis={axis})"
    check_vjp("concat", [(n, s, "f64") for n, s in zip(names, shapes)], expr, names,
              {n: normal(rng, s) for n, s in zip(names, shapes)}, seed)


@st.composite
def slice_case(draw: st.DrawFn) -> tuple[Shape, list[int], list[int], list[int] | None]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=7))
    starts = [draw(st.integers(0, d - 1)) for d in shape]
    limits = [draw(st.integers(s + 1, d)) for s, d in zip(starts, shape)]
    steps = draw(st.none() | st.just([1] * len(shape)) | st.lists(st.integers(1, 4), min_size=len(shape),
                                                                      max_size=len(shape)))
    return shape, starts, limits, steps


@SETTINGS
@given(case=slice_case(), seed=SEEDS)
def test_slice(case: tuple[Shape, list[int], list[int], list[int] | None], seed: int) -> None:
    """Unit and strided steps: a strided slice's cotangent is spread out with zeros between."""
    shape, starts, limits, steps = case
    written = f", steps={steps}" if steps is not None else ""
    check_vjp("slice", [("a", shape, "f64")], f"slice(%a, starts={starts}, limits={limits}{written})", ["a"],
              {"a": normal(np.random.default_rng(seed), shape)}, seed)


@pytest.mark.parametrize("size,start,limit,step", [(6, 0, 6, 2), (7, 1, 7, 3), (5, 2, 3, 4), (9, 0, 9, 9),
                                                   (8, 3, 8, 1)])
def test_strided_slice_1d(size: int, start: int, limit: int, step: int) -> None:
    """Steps that divide the length and steps that do not, a step longer than the box."""
    a = normal(np.random.default_rng(size + step), (size,))
    check_vjp("slice", [("a", (size,), "f64")], f"slice(%a, starts=[{start}], limits=[{limit}], steps=[{step}])",
              ["a"], {"a": a}, size)


# ---------------------------------------------------------------------------------------------
# index (a row or a gather of rows) and its transpose, scatter_add


@st.composite
def gather_case(draw: st.DrawFn) -> tuple[Shape, Shape, np.ndarray]:
    """A table and an integer index of rank 0-2 whose entries repeat (rows drawn from few)."""
    table = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    index_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=5))
    rows = draw(hnp.arrays(np.int64, index_shape, elements=st.integers(0, table[0] - 1)))
    return table, index_shape, rows


@SETTINGS
@given(case=gather_case(), seed=SEEDS, dtype=st.sampled_from(["i32", "i64"]))
def test_index(case: tuple[Shape, Shape, np.ndarray], seed: int, dtype: str) -> None:
    """d table: the cotangent rows scattered back, a row picked k times getting the sum of k."""
    table, index_shape, rows = case
    values = {"a": normal(np.random.default_rng(seed), table), "i": rows.astype(np.dtype(f"int{dtype[1:]}"))}
    check_vjp("index", [("a", table, "f64"), ("i", index_shape, dtype)], "index(%a, %i)", ["a"], values, seed)


def test_index_repeated_rows_accumulate() -> None:
    """Pinned: row 1 picked three times gets three cotangent rows, row 2 none (zeros)."""
    text = """
    func @f(%e: tensor<3x2xf64>, %i: tensor<4xi32>) -> tensor<f64> {
      return sum(index(%e, %i) * constant(value=[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], shape=[4, 2],
                                          dtype="f64"))
    }
    func @g(%e: tensor<3x2xf64>, %i: tensor<4xi32>) -> (tensor<f64>, tensor<3x2xf64>) {
      %l, %de = grad @f(%e, %i) wrt (%e)
      return %l, %de
    }
    """
    i = np.array([1, 0, 1, 1], np.int32)
    for pipeline in PIPELINES:
        _, de = gir.interpret(compile_grad(text, pipeline), "g", np.ones((3, 2)), i)
        np.testing.assert_array_equal(de, [[3.0, 4.0], [1.0 + 5.0 + 7.0, 2.0 + 6.0 + 8.0], [0.0, 0.0]])


@SETTINGS
@given(case=gather_case(), seed=SEEDS)
def test_scatter_add(case: tuple[Shape, Shape, np.ndarray], seed: int) -> None:
    table, index_shape, rows = case
    rng = np.random.default_rng(seed)
    updates = index_shape + table[1:]
    values = {"a": normal(rng, table), "i": rows, "u": normal(rng, updates)}
    check_vjp("scatter_add", [("a", table, "f64"), ("i", index_shape, "i64"), ("u", updates, "f64")],
              "scatter_add(%a, %i, %u)", ["a", "u"], values, seed)


# ---------------------------------------------------------------------------------------------
# logsumexp: its cotangent is g times the softmax


@pytest.mark.parametrize("axes,keepdims", [(None, False), ([1], False), ([-1], True), ([0, 2], False),
                                           ([0, 1, 2], True)])
def test_logsumexp(axes: list[int] | None, keepdims: bool) -> None:
    a = normal(np.random.default_rng(23), (2, 3, 4)) * 3.0
    kw = ([f"axes={axes}"] if axes is not None else []) + (["keepdims=true"] if keepdims else [])
    check_vjp("logsumexp", [("a", (2, 3, 4), "f64")], f"logsumexp({', '.join(['%a'] + kw)})", ["a"], {"a": a}, 23)


@SETTINGS
@given(case=reduction_case(), seed=SEEDS)
def test_logsumexp_random_axes(case: tuple[Shape, list[int] | None, bool], seed: int) -> None:
    shape, axes, keepdims = case
    kw = ([f"axes={axes}"] if axes is not None else []) + (["keepdims=true"] if keepdims else [])
    check_vjp("logsumexp", [("a", shape, "f64")], f"logsumexp({', '.join(['%a'] + kw)})", ["a"],
              {"a": normal(np.random.default_rng(seed), shape)}, seed)


def test_logsumexp_gradient_of_huge_logits_is_the_softmax() -> None:
    """Logits of 1e4 would overflow exp: the gradient is still the softmax, not nan."""
    text = """
    func @f(%a: tensor<2x3xf64>) -> tensor<f64> {
      return sum(logsumexp(%a, axes=[1]))
    }
    func @g(%a: tensor<2x3xf64>) -> (tensor<f64>, tensor<2x3xf64>) {
      %l, %da = grad @f(%a) wrt (%a)
      return %l, %da
    }
    """
    a = np.array([[1e4, 1e4 - 1.0, -1e4], [-1e4, -1e4 - 2.0, -1e4]])
    shifted = np.exp(a - a.max(axis=1, keepdims=True))
    want = shifted / shifted.sum(axis=1, keepdims=True)
    for pipeline in PIPELINES:
        loss, da = gir.interpret(compile_grad(text, pipeline), "g", a)
        np.testing.assert_allclose(loss, np.log(shifted.sum(axis=1)).sum() + a.max(axis=1).sum(), atol=1e-9)
        np.testing.assert_allclose(da, want, rtol=1e-12)


@st.composite
def stack_case(draw: st.DrawFn) -> tuple[Shape, int, int]:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    rank = len(shape) + 1
    return shape, draw(st.integers(1, 3)), draw(st.integers(-rank, rank - 1))


@SETTINGS
@given(case=stack_case(), seed=SEEDS)
def test_stack(case: tuple[Shape, int, int], seed: int) -> None:
    shape, n, axis = case
    rng = np.random.default_rng(seed)
    names = [f"a{i}" for i in range(n)]
    expr = f"stack({', '.join('%' + x for x in names)}, axis={axis})"
    check_vjp("stack", [(x, shape, "f64") for x in names], expr, names, {x: normal(rng, shape) for x in names}, seed)


# ---------------------------------------------------------------------------------------------
# Ops that make tensors, and cast to another precision


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_fill(shape: Shape) -> None:
    rng = np.random.default_rng(11)
    check_vjp("fill", [("s", (), "f64")], f'fill(%s, shape={list(shape)}, dtype="f64")', ["s"],
              {"s": normal(rng, ())}, 11)


@pytest.mark.parametrize("op,expr", [
    ("constant", '%a * constant(value=[[1.5, -2.0, 0.5], [3.0, 0.25, -1.0]], shape=[2, 3], dtype="f64")'),
    ("constant", '%a + constant(value=2.5, shape=[2, 3], dtype="f64")'),
    ("zeros", '(%a + zeros(shape=[3], dtype="f64")) * exp(%a)'),
    ("ones", '%a * ones(shape=[2, 3], dtype="f64") * %a'),
])
def test_constants(op: str, expr: str) -> None:
    """Constants take no operands: their rule returns nothing, and the gradient of the other
    operand is unaffected."""
    rng = np.random.default_rng(13)
    check_vjp(op, [("a", (2, 3), "f64")], expr, ["a"], {"a": normal(rng, (2, 3))}, 13)


def test_stop_gradient_passes_the_value_and_no_cotangent() -> None:
    """d/da sum(stop_gradient(a) * a) = stop_gradient(a) = a (only the second factor counts),
    where finite differences would give 2a."""
    text = """
    func @f(%a: tensor<3xf64>) -> tensor<f64> {
      return sum(stop_gradient(%a) * %a)
    }
    func @g(%a: tensor<3xf64>) -> (tensor<f64>, tensor<3xf64>) {
      %l, %d = grad @f(%a) wrt (%a)
      return %l, %d
    }
    """
    a = np.random.default_rng(23).standard_normal(3)
    for pipeline in PIPELINES:
        loss, da = gir.interpret(compile_grad(text, pipeline), "g", a)
        np.testing.assert_allclose(loss, np.sum(a * a), rtol=1e-14)
        np.testing.assert_array_equal(da, a)


def test_cast_to_f32_and_back() -> None:
    """f64 -> f32 -> f64: finite differences in f32 would measure rounding, not the gradient.
    The exact gradient of sum(f64(f32(a)) * cot) is cot rounded to f32 (the rule casts the
    cotangent back through f32), i.e. within f32 precision of cot, in f64."""
    text = """
    func @f(%a: tensor<2x3xf64>, %cot: tensor<2x3xf64>) -> tensor<f64> {
      return sum(cast(cast(%a, dtype="f32"), dtype="f64") * %cot)
    }
    func @g(%a: tensor<2x3xf64>, %cot: tensor<2x3xf64>) -> (tensor<f64>, tensor<2x3xf64>) {
      %l, %da = grad @f(%a, %cot) wrt (%a)
      return %l, %da
    }
    """
    rng = np.random.default_rng(17)
    a, cot = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    for pipeline in PIPELINES:
        _, da = gir.interpret(compile_grad(text, pipeline), "g", a, cot)
        assert da.dtype == np.float64
        np.testing.assert_array_equal(da, cot.astype(np.float32).astype(np.float64))
        assert relative_error(da, cot) < TOLERANCE


def test_cast_f64_to_f32_loss() -> None:
    """A loss computed in f32 from an f64 argument: d sum(f32(a) * cot) / da = f64(cot), exactly."""
    text = """
    func @f(%a: tensor<4xf64>, %cot: tensor<4xf32>) -> tensor<f32> {
      return sum(cast(%a, dtype="f32") * %cot)
    }
    func @g(%a: tensor<4xf64>, %cot: tensor<4xf32>) -> (tensor<f32>, tensor<4xf64>) {
      %l, %da = grad @f(%a, %cot) wrt (%a)
      return %l, %da
    }
    """
    rng = np.random.default_rng(19)
    a, cot = rng.standard_normal(4), rng.standard_normal(4).astype(np.float32)
    for pipeline in PIPELINES:
        loss, da = gir.interpret(compile_grad(text, pipeline), "g", a, cot)
        assert loss.dtype == np.float32 and da.dtype == np.float64
        np.testing.assert_array_equal(da, cot.astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Completeness: every op kind has a VJP test or is listed as having no rule

NON_DIFFERENTIABLE: dict[str, str] = {
    **{op: "comparison: its i1 result carries no cotangent" for op in ("lt", "le", "gt", "ge", "eq", "ne")},
    "and": "logical op on i1",
    "or": "logical op on i1",
    "scan": "structural: differentiated by autodiff's scan_vjp (tests/test_autodiff_rnn.py)",
    "call": "structural: inlined before differentiation (tests/test_autodiff_rnn.py)",
    "grad": "structural: expanded by autodiff",
    "fused": "made by the fuse pass for the backends, after autodiff: never differentiated",
    "return": "structural: terminator",
    "yield": "structural: terminator",
    "for": "pre-SSA: the ssa pass turns it into scan before autodiff",
    "var": "pre-SSA variable",
    "load": "pre-SSA variable",
    "store": "pre-SSA variable",
}
"""Op kinds without a VJP rule, each with the reason."""

TESTED: set[str] = (set(UNARY) | set(BINARY) | set(REDUCTIONS)
                    | {"select", "matmul", "transpose", "reshape", "broadcast", "concat", "slice", "stack",
                       "index", "scatter_add", "logsumexp", "fill", "constant", "zeros", "ones", "stop_gradient"})
"""Op kinds with a VJP test in this file (the keys of the case tables and the single-op tests)."""


def test_every_op_has_a_vjp_test_or_is_listed() -> None:
    with_rule = {name for name, spec in REGISTRY.items() if spec.vjp is not None}
    without_rule = set(REGISTRY) - with_rule
    assert not with_rule - TESTED, f"ops with a VJP rule but no test here: {sorted(with_rule - TESTED)}"
    unlisted = sorted(without_rule - set(NON_DIFFERENTIABLE))
    assert not unlisted, f"ops without a VJP rule and not listed as non-differentiable: {unlisted}"
    assert not TESTED - with_rule, f"tests for ops that have no VJP rule: {sorted(TESTED - with_rule)}"
    assert not set(NON_DIFFERENTIABLE) & with_rule, (
        f"listed as non-differentiable but have a rule (test them): {sorted(set(NON_DIFFERENTIABLE) & with_rule)}")
    assert not (TESTED | set(NON_DIFFERENTIABLE)) - set(REGISTRY), "stale names"


def test_comparisons_stop_gradients() -> None:
    """A gradient never flows into an i1 value: a mask built by a comparison is a constant."""
    text = """
    func @f(%a: tensor<5xf64>, %b: tensor<5xf64>) -> tensor<f64> {
      %m = cast(and(gt(%a, 0.0), or(lt(%b, 0.5), ne(%a, %b))), dtype="f64")
      return sum(%m * %a * %b)
    }
    func @g(%a: tensor<5xf64>, %b: tensor<5xf64>) -> (tensor<f64>, tensor<5xf64>, tensor<5xf64>) {
      %l, %da, %db = grad @f(%a, %b) wrt (%a, %b)
      return %l, %da, %db
    }
    """
    a = np.array([1.0, -1.0, 2.0, 0.5, -0.3])
    b = np.array([0.2, 0.1, 3.0, 0.25, 0.7])
    mask = ((a > 0) & ((b < 0.5) | (a != b))).astype(np.float64)
    for pipeline in PIPELINES:
        _, da, db = gir.interpret(compile_grad(text, pipeline), "g", a, b)
        np.testing.assert_allclose(da, mask * b, rtol=1e-15)
        np.testing.assert_allclose(db, mask * a, rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# Errors name the op and its location


def location_of(text: str, needle: str) -> tuple[int, int]:
    """1-based (line, column) of the first occurrence of needle in text."""
    offset = text.index(needle)
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def expect_error(text: str, pipeline: str = DEFAULT_PIPELINE) -> gir.GirError:
    module = gir.parse(text, filename="err.gir")
    with pytest.raises(gir.GirError) as info:
        PassManager(pipeline, check_numerics=None, verify_each=True).run(module)
    return info.value


INT_ARG = """func @f(%x: tensor<3xf64>, %n: tensor<i32>) -> tensor<f64> {
  return sum(%x * cast(%n, dtype="f64"))
}

func @g(%x: tensor<3xf64>, %n: tensor<i32>) -> (tensor<f64>, tensor<i32>) {
  %l, %dn = grad @f(%x, %n) wrt (%n)
  return %l, %dn
}
"""


def test_grad_wrt_integer_argument_is_an_error() -> None:
    err = expect_error(INT_ARG)
    assert "grad" in err.message and "i32" in err.message and "%n" in err.message, err.message
    line, col = location_of(INT_ARG, "grad @f")
    assert (err.loc.line, err.loc.col) == (line, col), str(err)
    assert str(err).startswith(f"err.gir:{line}:{col}: error:"), str(err)


INDEX = """func @f(%xs: tensor<4x3xf64>, %i: tensor<i32>) -> tensor<f64> {
  %row = index(%xs, %i)
  return sum(%row * %row)
}

func @g(%xs: tensor<4x3xf64>, %i: tensor<i32>) -> (tensor<f64>, tensor<4x3xf64>) {
  %l, %d = grad @f(%xs, %i) wrt (%xs)
  return %l, %d
}
"""


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_gradient_through_index_by_a_scalar(pipeline: str) -> None:
    """One row picked: its cotangent is 2 * row there, zeros elsewhere."""
    xs = np.arange(12.0).reshape(4, 3)
    _, d = gir.interpret(compile_grad(INDEX, pipeline), "g", xs, np.array(2, np.int32))
    want = np.zeros_like(xs)
    want[2] = 2 * xs[2]
    np.testing.assert_array_equal(d, want)


def test_index_whose_row_is_unused_adds_nothing() -> None:
    """An `index` whose result reaches no loss gives no cotangent (and no scatter)."""
    text = INDEX.replace("sum(%row * %row)", "sum(%xs * %xs) + cast(sum(%i * %i), dtype=\"f64\") * 0.0")
    text = text.replace("  %row = index(%xs, %i)\n", "  %row = index(%xs, %i)\n  %unused = sum(%row)\n")
    module = gir.parse(text, filename="ok.gir")
    assert any(o.name == "index" for o in module["f"].walk())
    PassManager("ssa,autodiff", check_numerics=None, verify_each=True).run(module)
    assert not any(o.name == "scatter_add" for o in module["g"].walk())
    xs = np.arange(12.0).reshape(4, 3)
    _, d = gir.interpret(module, "g", xs, np.array(1, np.int32))
    np.testing.assert_allclose(d, 2 * xs)


INDEX_IN_LOOP = """func @pick(%m: tensor<2x3xf64>, %i: tensor<i32>) -> tensor<3xf64> {
  return index(%m, %i) * 2.0
}

func @f(%ms: tensor<4x2x3xf64>, %i: tensor<i32>) -> tensor<f64> {
  %s = zeros(shape=[3], dtype="f64")
  for %m in %ms {
    %s = %s + @pick(%m, %i)
  }
  return sum(%s * %s)
}

func @g(%ms: tensor<4x2x3xf64>, %i: tensor<i32>) -> (tensor<f64>, tensor<4x2x3xf64>) {
  %l, %d = grad @f(%ms, %i) wrt (%ms)
  return %l, %d
}
"""


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_gradient_through_index_in_a_called_function_in_a_loop(pipeline: str) -> None:
    """`index` in a callee inside a scan body: checked against finite differences."""
    rng = np.random.default_rng(29)
    ms, i = rng.standard_normal((4, 2, 3)), np.array(1, np.int32)
    reference = gir.parse(INDEX_IN_LOOP, filename="loop.gir")
    want = numeric_gradient(reference, "f", [ms, i], 0)
    _, d = gir.interpret(compile_grad(INDEX_IN_LOOP, pipeline), "g", ms, i)
    assert relative_error(d, want) < TOLERANCE


def test_vjp_reshape_keeps_a_minus_one_dim_when_the_size_is_unknown() -> None:
    """VJPContext.reshape resolves -1 from the element count when it is known; with a `?` dim
    it leaves -1 to reshape's type rule (it used to compute the dim from 0 elements: 0)."""
    from gir.ir.core import Value
    from gir.ir.types import TensorType
    from gir.transforms.autodiff import VJPContext

    made: list[dict] = []

    class Emitter:
        def op(self, name: str, operands: list, loc: object = None, attrs: dict | None = None) -> object:
            made.append({"name": name, **(attrs or {})})
            return type("Op", (), {"result": operands[0]})()

    c = object.__new__(VJPContext)
    c.emit, c.loc = Emitter(), None
    c.reshape(Value(TensorType((None, 4, 3), "f32")), (-1, 3))
    c.reshape(Value(TensorType((5, 4, 3), "f32")), (-1, 3))
    assert made == [{"name": "reshape", "shape": [-1, 3]}, {"name": "reshape", "shape": [20, 3]}]


LOSS_IS_A_CALL = """
func @sq(%a: tensor<3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
  return sum(%a * %a * %w)
}

func @mid(%x: tensor<3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
  %r = @sq(tanh(%x), %w)
  return %r
}

func @loss(%x: tensor<3xf64>, %w: tensor<3xf64>) -> tensor<f64> {
  %l = @mid(%x * %w, %w)
  return %l
}

func @g(%x: tensor<3xf64>, %w: tensor<3xf64>) -> (tensor<f64>, tensor<3xf64>, tensor<3xf64>) {
  %l, %dx, %dw = grad @loss(%x, %w) wrt (%x, %w)
  return %l, %dx, %dw
}
"""
"""The loss is a call's result, whose callee returns a call's result in turn: inlining those
calls erased the value autodiff held as the loss ("operand #0 of 'return' (%l) does not
dominate this use")."""


def test_gradient_of_a_function_returning_a_call_s_result(tmp_path, capsys) -> None:
    rng = np.random.default_rng(31)
    x, w = rng.standard_normal(3), rng.standard_normal(3)
    reference = gir.parse(LOSS_IS_A_CALL, filename="call.gir")
    want = [numeric_gradient(reference, "loss", [x, w], p) for p in (0, 1)]
    loss = float(gir.interpret(reference, "loss", x, w)[0])
    path = tmp_path / "call.gir"
    path.write_text(LOSS_IS_A_CALL)
    assert gir.cli.main(["opt", str(path)]) == 0, capsys.readouterr().err
    optimized = gir.parse(capsys.readouterr().out, filename="opt.gir")
    for name, run in [("gir opt", lambda: gir.interpret(optimized, "g", x, w)),
                      ("interpret", lambda: gir.interpret(gir.parse(LOSS_IS_A_CALL, filename="call.gir"), "g", x, w)),
                      ("jit", lambda: gir.jit(LOSS_IS_A_CALL, "g")(x, w))]:
        got, dx, dw = run()
        assert abs(float(got) - loss) < 1e-12, name
        assert relative_error(dx, want[0]) < TOLERANCE, name
        assert relative_error(dw, want[1]) < TOLERANCE, name
