"""Elementwise scalar semantics (ir/scalar.py): every elementwise op kind has a description for
exactly the dtypes its type rule accepts; each backend has an emitter for exactly the
primitives; and both backends agree with the interpreter (the oracle) on edge values: nan,
+-inf, -0.0, exp arguments past overflow, log and sqrt of zero and negatives, integer extremes
and zero divisors, i1.

Every op of one dtype runs in one function (one compile per dtype and backend); the GPU runs
in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set otherwise.
"""

from __future__ import annotations

import itertools

import gir
import numpy as np
import pytest
from gir.backend.cpu import lower as cpu_lower
from gir.backend.gpu import kernels as gpu_kernels
from gir.errors import GirError
from gir.ir import scalar
from gir.ir.core import Value
from gir.ir.ops import REGISTRY, make_op
from gir.ir.types import DTYPES, TensorType

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on the edge values

ELEMENTWISE = sorted(name for name, spec in REGISTRY.items() if spec.is_elementwise)

FLOAT_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 20.0, -20.0, 88.8, -104.0,
               710.0, -710.0, 1e-30]
INT_EDGES = {"i32": [0, 1, -1, 7, -7, 2**31 - 1, -(2**31)], "i64": [0, 1, -1, 7, -7, 2**63 - 1, -(2**63)]}
BOOL_EDGES = [False, True]


def _accepts(name: str, dtype: str) -> bool:
    """Whether op kind `name` takes operands of dtype (its type rule, asked through make_op)."""
    spec = REGISTRY[name]
    t = TensorType((2,), dtype)
    cond = [Value(TensorType((2,), "i1"))] if "cond" in spec.operands else []
    operands = cond + [Value(t) for _ in range(len(spec.operands) - len(cond))]
    declared = [TensorType((2,), "f32")] if name == "cast" else None
    try:
        make_op(name, operands, declared=declared)
    except gir.GirError:
        return False
    return True


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_op_is_described_for_the_dtypes_it_takes(name: str) -> None:
    semantics = REGISTRY[name].scalar
    assert semantics is not None, name
    for dtype in DTYPES:
        assert (semantics.expr(dtype) is not None) == _accepts(name, dtype), (name, dtype)


def _primitives(expr: scalar.Expr) -> set[str]:
    if isinstance(expr, scalar.Prim):
        assert len(expr.args) == scalar.PRIMITIVES[expr.name], expr
        return {expr.name}.union(*(_primitives(a) for a in expr.args))
    return set()


def test_descriptions_use_only_primitives_and_both_backends_emit_every_primitive() -> None:
    used: set[str] = set()
    for name in ELEMENTWISE:
        for expr in REGISTRY[name].scalar.by_class.values():  # type: ignore[union-attr]
            used |= _primitives(expr)
    assert used <= set(scalar.PRIMITIVES)
    assert set(cpu_lower.PRIMITIVES) == set(scalar.PRIMITIVES)
    assert set(gpu_kernels.PRIMITIVES) == set(scalar.PRIMITIVES)


# ---------------------------------------------------------------------------------------------
# Edge values on both backends against the interpreter


def _edges(dtype: str) -> list:
    return FLOAT_EDGES if dtype in ("f32", "f64") else BOOL_EDGES if dtype == "i1" else INT_EDGES[dtype]


def _program(dtype: str, n: int) -> tuple[str, list[str]]:
    """One function computing every elementwise op that takes dtype on %x (and %y, %c):
    its source and the name of each result."""
    t = f"tensor<{n}x{dtype}>"
    lines, results, names = [], [], []
    for name in ELEMENTWISE:
        spec = REGISTRY[name]
        if name == "cast" or not _accepts(name, dtype):
            continue
        out = "i1" if name in scalar.COMPARISONS else dtype
        operands = "%c, %x, %y" if "cond" in spec.operands else "%x, %y" if len(spec.operands) == 2 else "%x"
        lines.append(f"  %{name} = {name} {operands} : tensor<{n}x{out}>")
        results.append((f"%{name}", f"tensor<{n}x{out}>"))
        names.append(name)
    for to in DTYPES:
        if to != dtype and not (dtype in ("f32", "f64") and to in INT_EDGES):  # float -> int of nan: undefined
            lines.append(f"  %to_{to} = cast %x : tensor<{n}x{to}>")
            results.append((f"%to_{to}", f"tensor<{n}x{to}>"))
            names.append(f"cast to {to}")
    head = (f"func @f(%x: {t}, %y: {t}, %c: tensor<{n}xi1>) -> "
            f"({', '.join(r for _, r in results)}) {{")
    body = lines + [f"  return {', '.join(v for v, _ in results)}", "}"]
    return "\n".join([head, *body]) + "\n", names


def _inputs(dtype: str) -> list[np.ndarray]:
    """Every pair of edge values (x, y), minus zero integer divisors (tested below)."""
    edges = _edges(dtype)
    pairs = [(a, b) for a, b in itertools.product(edges, edges) if not (dtype in INT_EDGES and b == 0)]
    np_dtype = DTYPES[dtype]
    x = np.array([a for a, _ in pairs], dtype=np_dtype)
    y = np.array([b for _, b in pairs], dtype=np_dtype)
    c = np.arange(len(pairs)) % 3 == 0
    return [x, y, c]


def _agree(got: np.ndarray, want: np.ndarray, what: str, approximate: bool) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: nan positions")
    if not approximate:  # bit for bit, signed zeros included
        same = (got == want) & (np.signbit(got) == np.signbit(want)) | np.isnan(want)
        assert same.all(), f"{what}: differs at {np.flatnonzero(~same)}: got {got[~same]}, want {want[~same]}"
        return
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=f"{what}: inf positions")
    tol = 1e-5 if got.dtype == np.float32 else 1e-12
    err = np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
    assert (err <= tol).all(), f"{what}: error {err.max():.3g} > {tol:g}"


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_backends_agree_with_the_interpreter_on_edge_values(device: str, dtype: str) -> None:
    args = _inputs(dtype)
    source, names = _program(dtype, len(args[0]))
    want = gir.jit(source, "f", device="interp")(*args)
    got = gir.jit(source, "f", device=device)(*args)
    for g, w, name in zip(got, want, names):
        semantics = REGISTRY[name.split()[0]].scalar  # "cast to f64" is a cast
        approximate = semantics is not None and semantics.approximate(dtype)  # uses exp, log...: a few ulp
        _agree(np.asarray(g), np.asarray(w), f"{name} on {dtype} ({device})", approximate)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", list(INT_EDGES))
def test_integer_division_by_zero_raises_at_the_op(device: str, dtype: str) -> None:
    source = (f"func @f(%x: tensor<3x{dtype}>, %y: tensor<3x{dtype}>) -> tensor<3x{dtype}> {{\n"
              f"  %q = div %x, %y : tensor<3x{dtype}>\n  return %q\n}}\n")
    x = np.array([7, -7, 1], DTYPES[dtype])
    y = np.array([2, 0, -1], DTYPES[dtype])
    fn = gir.jit(source, "f", device=device)
    with pytest.raises(GirError, match="integer division by zero"):
        fn(x, y)
    y[1] = -2
    np.testing.assert_array_equal(fn(x, y)[0], np.floor_divide(x, y))
