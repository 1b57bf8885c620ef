"""The GPU backend (numba.cuda kernels, xp GEMMs, host-driven scans) checked against the
interpreter, the oracle.

Without a GPU everything runs in Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM is set to 1 at the
top of this module, before numba is imported, unless it is already set. On a machine with a
GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs the same tests on it. The simulator
runs every CUDA thread as a Python thread, so the examples are shrunk by substituting their
types (T=3, batch 2, hidden 4).

- Differential: every function of every example (rnn, gru, lstm, mlp), in the memplan arena and
  with a buffer per value; one program per op family (elementwise with broadcasting, casts,
  integer and boolean ops, nan/inf edges, layout, reductions, matmuls, constants, scans).
  float32 results agree to 1e-4 of the largest magnitude of each result, float64 to 1e-10.
- Kernels: generated source (grid-stride loop, broadcasting by index arithmetic, math.tanh),
  compiled once per distinct source.
- Errors: integer division by zero and `index` out of range raise GirError at the op; without
  a GPU and without the simulator, device="gpu" and `gir run --device gpu` say so.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba

import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")

import gir  # noqa: E402
import gir.cli  # noqa: E402
from gir.backend.gpu import kernels  # noqa: E402
from gir.backend.gpu.device import NO_GPU, get_device  # noqa: E402
from gir.ir.interpreter import random_inputs  # noqa: E402
from gir.jit import JitFunction  # noqa: E402

try:
    DEVICE = get_device()
except gir.GirError as e:  # numba.cuda was imported without the simulator, and there is no GPU
    pytest.skip(f"no GPU backend here: {e.message}", allow_module_level=True)

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

REPO = Path(__file__).resolve().parent.parent
RTOL = {"f32": 1e-4, "f64": 1e-10}


# ---------------------------------------------------------------------------------------------
# Helpers


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "") -> None:
    """Equal shapes and dtypes; integers and booleans exactly; floats with the same nan and inf
    positions and |got - want| <= rtol * (largest finite magnitude of want)."""
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}"
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: got {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: nan positions differ")
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{what}: inf positions differ")
    finite = np.isfinite(want)
    assert np.all(np.isfinite(got[finite])), f"{what}: got inf/nan where the interpreter has finite values"
    scale = float(np.max(np.abs(want[finite]), initial=0.0))
    err = float(np.max(np.abs(got[finite].astype(np.float64) - want[finite]), initial=0.0))
    assert err <= rtol * max(scale, float(np.finfo(want.dtype).tiny)), \
        f"{what}: max error {err:.3g} > {rtol:g} * {scale:.3g}\ngot:\n{got}\nwant:\n{want}"


def assert_all_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float | None = None,
                     what: str = "") -> None:
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        r = rtol if rtol is not None else RTOL["f64" if w.dtype == np.float64 else "f32"]
        assert_close(g, w, r, f"{what} result {i}")


def run_both(source: str, entry: str, args: list[np.ndarray] | None = None, seed: int = 0,
             rtol: float | None = None) -> JitFunction:
    """Runs @entry on gpu and on the interpreter (seeded random inputs unless given) and
    compares; returns the gpu JitFunction."""
    if args is None:
        args = random_inputs(gir.parse(source).functions[entry], seed)
    want = gir.jit(source, entry, device="interp")(*args)
    fn = gir.jit(source, entry, device="gpu")
    got = fn(*args)
    assert_all_close(got, want, rtol, f"@{entry}")
    return fn


# The examples at T=3, batch 2, hidden 4 (mlp: batch 2, 6 -> 5 -> 3). Longer patterns first.
SMALL = [("64x256", "2x6"), ("64x10", "2x3"), ("256x512", "6x5"), ("512x10", "5x3"), ("<512x", "<5x"),
         ("<10x", "<3x"), ("50x32x256", "3x2x4"), ("32x256", "2x4"), ("256x256", "4x4"), ("<256x", "<4x")]
MODELS = ["rnn", "gru", "lstm", "mlp"]


def small_example(model: str) -> str:
    text = (REPO / "examples" / f"{model}.gir").read_text()
    for old, new in SMALL:
        text = text.replace(old, new)
    types = re.findall(r"tensor<[^>]*>", text)
    dims = [int(d) for t in types for d in t[len("tensor<"):-1].split("x")[:-1]]
    assert types and max(dims) < 10, types  # every type was shrunk
    module = gir.parse(text)
    assert str(gir.parse(str(module))) == str(module)
    return text


def example_entries() -> list[tuple[str, str]]:
    return [(m, name) for m in MODELS for name in gir.parse(small_example(m)).functions]


# ---------------------------------------------------------------------------------------------
# Differential: the examples


@pytest.mark.parametrize(("model", "entry"), example_entries())
def test_example_matches_interpreter(model: str, entry: str) -> None:
    fn = run_both(small_example(model), entry, seed=1)
    assert fn.stats.kernel_launches > 0 and fn.stats.gemm_calls > 0, fn.stats
    assert fn.stats.memory.startswith("arena"), fn.stats


@pytest.mark.parametrize("entry", ["rnn_grads", "lstm_grads"])
def test_example_with_a_buffer_per_value(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIR_GPU_ARENA=0: no memory plan, every value in a buffer of its own; same results."""
    monkeypatch.setenv("GIR_GPU_ARENA", "0")
    fn = run_both(small_example(entry.split("_")[0]), entry, seed=2)
    assert fn.stats.memory.startswith("a buffer per value"), fn.stats


def test_repeated_calls_reuse_memory() -> None:
    """The arena is reused: a second call with other inputs gives the interpreter's results."""
    text = small_example("gru")
    fn = gir.jit(text, "gru_grads", device="gpu")
    f = gir.parse(text).functions["gru_grads"]
    for seed in (3, 4):
        args = random_inputs(f, seed)
        assert_all_close(fn(*args), gir.jit(text, "gru_grads", device="interp")(*args), what=f"seed {seed}")


# ---------------------------------------------------------------------------------------------
# Differential: one program per op family

FLOAT_ELEMENTWISE = """\
func @f(%a: tensor<3x4xDT>, %b: tensor<4xDT>, %c: tensor<3x1xDT>, %s: tensor<DT>)
    -> (tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x4xDT>,
        tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x4xi1>, tensor<3x4xDT>, tensor<3x4xDT>) {
  %add = %a + %b
  %sub = %c - %a
  %mul = %a * %s
  %div = %a / (abs(%b) + 0.5)
  %pow = pow(abs(%a) + 0.5, %c)
  %mx = max(%a, %c)
  %mn = min(%b, %c)
  %un = neg(abs(%a)) + exp(%a) + log(abs(%c) + 1.0) + tanh(%b) + sigmoid(%a) + relu(%c) + sqrt(abs(%a))
  %lt = lt(%a, %b)
  %le = le(%a, %c)
  %gt = gt(%a, %s)
  %ge = ge(%c, %b)
  %eq = eq(%a, %a)
  %ne = ne(%a, %b)
  %mask = or(and(%lt, %ge), and(or(%gt, %eq), and(%ne, %le)))
  %sel = select(%lt, %a, %b)
  %sel2 = select(%gt, %s, %c)
  %i = cast(%a * 10.0, dtype="i32")
  %back = cast(%i, dtype="DT") + cast(%lt, dtype="DT") + cast(cast(%a, dtype="i1"), dtype="DT")
  return %add, %sub, %mul, %div, %pow, %mx, %mn, %un, %mask, %sel + %sel2, %back
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_float_elementwise_ops(dtype: str) -> None:
    """Every float elementwise op, comparisons, logic, select and casts, with broadcasting."""
    source = FLOAT_ELEMENTWISE.replace("DT", dtype)
    rng = np.random.default_rng(5)
    nd = np.float32 if dtype == "f32" else np.float64
    args = [rng.uniform(-2, 2, s).astype(nd) for s in [(3, 4), (4,), (3, 1), ()]]
    args[1][1] = args[0][2, 1]  # an equal pair for le/ge/eq/ne
    run_both(source, "f", args, rtol=RTOL[dtype])


def test_cast_between_all_dtypes() -> None:
    dtypes = ["f32", "f64", "i32", "i64", "i1"]
    outs = [f"%{s}_{d}" for s in dtypes for d in dtypes if s != d]
    lines = [f"  %{s}_{d} = cast %{s} : tensor<5x{d}>" for s in dtypes for d in dtypes if s != d]
    sig = ", ".join(f"%{d}: tensor<5x{d}>" for d in dtypes)
    types = ", ".join(f"tensor<5x{d}>" for s in dtypes for d in dtypes if s != d)
    source = f"func @f({sig}) -> ({types}) {{\n" + "\n".join(lines) + f"\n  return {', '.join(outs)}\n}}\n"
    floats = [-2.75, -0.5, 0.0, 0.25, 3.5]
    args = [np.array(floats, np.float32), np.array(floats, np.float64), np.array([-3, -1, 0, 2, 7], np.int32),
            np.array([-3, -1, 0, 2, 2**40], np.int64), np.array([True, False, True, False, True])]
    run_both(source, "f", args, rtol=0.0)


INT_ELEMENTWISE = """\
func @f(%a: tensor<2x5xi32>, %b: tensor<5xi32>, %n: tensor<i32>)
    -> (tensor<2x5xi32>, tensor<2x5xi32>, tensor<2x5xi32>, tensor<2x5xi32>, tensor<2x5xi32>, tensor<2x5xi1>,
        tensor<2x5xi32>, tensor<2x5xi64>) {
  %arith = (%a + %b) * %n - %b
  %floordiv = %a / %b
  %mm = max(%a, %b) - min(%a, %n)
  %un = neg(%a) + abs(%b) + relu(%a)
  %sel = select(lt(%a, %b), %a, %b * 3)
  %cmp = or(and(le(%a, %b), ge(%a, %n)), or(gt(%b, %n), and(eq(%a, %b), ne(%a, %n))))
  %lit = %a / 2 + 1
  %wide = cast(%a, dtype="i64") * cast(%b, dtype="i64")
  return %arith, %floordiv, %mm, %un, %sel, %cmp, %lit, %wide
}
"""


def test_int_elementwise_ops() -> None:
    """i32 arithmetic (wrapping), floor division with negative operands, comparisons."""
    a = np.array([[-7, -6, -1, 0, 5], [7, 6, 1, -9, 2147483647]], np.int32)
    b = np.array([2, -4, 3, -1, 5], np.int32)
    run_both(INT_ELEMENTWISE, "f", [a, b, np.array(3, np.int32)], rtol=0.0)


BOOLS = (np.array([True, True, False, False]), np.array([True, False, True, False]))


@pytest.mark.parametrize("expr", ["and(%a, %b)", "or(%a, %b)", "eq(%a, %b)", "select(%a, %b, ne(%a, %b))",
                                  "%a + %b", "%a * %b", "max(%a, %b)", "min(%a, %b)", "lt(%a, %b)", "ge(%a, %b)"])
def test_bool_ops(expr: str) -> None:
    """Logic, and arithmetic and ordering on i1 with NumPy's meaning (+ is or, False < True)."""
    source = f"func @f(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {{\n  return {expr}\n}}\n"
    run_both(source, "f", list(BOOLS), rtol=0.0)


EDGES = """\
func @f(%x: tensor<6xf32>) -> (tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>,
                               tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<f32>, tensor<f32>) {
  %zero = constant 0.0 : tensor<f32>
  return exp(%x), log(%x), sqrt(%x), %x / %zero, max(%x, 0.0), min(%x, 0.0), relu(%x), sigmoid(%x), max(%x), min(%x)
}
"""


def test_nan_and_inf_edges() -> None:
    """As NumPy: exp overflows to inf, log(0) = -inf, log/sqrt of a negative and nan are nan,
    x / 0 is +-inf or nan, nan propagates through max/min/relu and the max/min reductions."""
    x = np.array([np.nan, 100.0, 0.0, -1.5, np.inf, 0.5], np.float32)
    run_both(EDGES, "f", [x])


def test_integer_division_by_zero_is_an_error() -> None:
    source = "func @f(%a: tensor<3xi32>, %b: tensor<3xi32>) -> tensor<3xi32> {\n  return %a / %b\n}\n"
    fn = gir.jit(source, "f", device="gpu")
    a = np.array([7, -7, 1], np.int32)
    np.testing.assert_array_equal(fn(a, np.array([2, 2, -1], np.int32))[0], [3, -4, -1])
    with pytest.raises(gir.GirError, match="integer division by zero at run time") as info:
        fn(a, np.array([2, 0, 1], np.int32))
    assert info.value.loc.line == 2
    np.testing.assert_array_equal(fn(a, np.array([1, 1, 1], np.int32))[0], a)  # the flag is reset per call


LAYOUT = """\
func @f(%x: tensor<2x3x4xDT>, %v: tensor<3xDT>, %i: tensor<i32>)
    -> (tensor<4x2x3xDT>, tensor<3x8xDT>, tensor<6x4xDT>, tensor<2x3x4xDT>, tensor<2x3x7xDT>, tensor<4x3x4xDT>,
        tensor<2x2x3x4xDT>, tensor<2x3x2x4xDT>, tensor<1x2x2xDT>, tensor<2x4xDT>, tensor<3x4xDT>, tensor<3x4xDT>,
        tensor<2x3xDT>, tensor<4x3x2xDT>) {
  %t = transpose %x {perm = [2, 0, 1]} : tensor<4x2x3xDT>
  %r = reshape %x {shape = [3, -1]} : tensor<3x8xDT>
  %r2 = reshape(%t, shape=[6, 4])
  %b = broadcast(reshape(%v, shape=[3, 1]), shape=[2, 3, 4])
  %c = concat(%x, slice(%x, starts=[0, 0, 1], limits=[2, 3, 4]), axis=-1)
  %c0 = concat(%x, %b, axis=0)
  %s = stack(%x, %b)
  %s2 = stack(%x, %b, axis=2)
  %box = slice %x {starts = [1, 0, 1], limits = [2, 3, 4], steps = [1, 2, 2]} : tensor<1x2x2xDT>
  %row = slice %x {starts = [1, 1, 0], limits = [2, 3, 4]} : tensor<1x2x4xDT>
  %rowr = reshape(%row, shape=[2, 4])
  %ix = index(%x, %i)
  %ic = index(%x, 0) + %ix
  %k = constant [[1.5, -2.0, 3.0], [0.0, 0.25, -7.0]] : tensor<2x3xDT>
  %tr = transpose(%x)
  return %t, %r, %r2, %b, %c, %c0, %s, %s2, %box, %rowr, %ix, %ic, %k * 2.0, %tr
}
"""


@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_layout_ops(dtype: str) -> None:
    """transpose, reshape, broadcast, concat, stack, slice (strided: a copy; contiguous: a
    view), index (by an argument: read back; by a constant) and a dense constant."""
    source = LAYOUT.replace("DT", dtype)
    if dtype == "i32":
        source = source.replace("[[1.5, -2.0, 3.0], [0.0, 0.25, -7.0]]", "[[1, -2, 3], [0, 4, -7]]")
        source = source.replace("%k * 2.0", "%k * 2")
    x = (np.arange(24).reshape(2, 3, 4) * 1.5 - 7).astype(dtype.replace("f", "float").replace("i", "int"))
    v = np.array([1, -2, 5], x.dtype)
    run_both(source, "f", [x, v, np.array(1, np.int32)], rtol=0.0)


def test_index_out_of_range_is_an_error() -> None:
    source = "func @f(%x: tensor<3x2xf32>, %i: tensor<i32>) -> tensor<2xf32> {\n  return index(%x, %i)\n}\n"
    fn = gir.jit(source, "f", device="gpu")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for bad in (3, -1):
        with pytest.raises(gir.GirError, match="out of range"):
            fn(x, np.array(bad, np.int32))
    np.testing.assert_array_equal(fn(x, np.array(2, np.int32))[0], x[2])


REDUCTIONS = """\
func @f(%x: tensor<3x4x5xDT>)
    -> (tensor<DT>, tensor<4xDT>, tensor<3x1x5xDT>, tensor<5xDT>, tensor<3x1x1xDT>, tensor<3x4xDT>,
        tensor<DT>, tensor<1x1x1xDT>) {
  %all = sum %x : tensor<DT>
  %mean = mean(%x, axes=[0, 2])
  %mx = max(%x, axes=[1], keepdims=true)
  %mn = min(%x, axes=[-3, 1])
  %s = sum(%x, axes=[-1, -2], keepdims=true)
  %m2 = max(%x, axes=[2]) - min(%x, axes=[2])
  %mnall = min(%x)
  %mxall = reduce_max %x {keepdims = true} : tensor<1x1x1xDT>
  return %all, %mean, %mx, %mn, %s, %m2, %mnall, %mxall
}
"""


@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_reductions(dtype: str) -> None:
    source = REDUCTIONS.replace("DT", dtype)
    if dtype == "i32":  # mean is for floats only
        source = source.replace("%mean = mean(%x, axes=[0, 2])", "%mean = sum(%x, axes=[0, 2])")
    x = np.random.default_rng(3).uniform(-5, 5, (3, 4, 5))
    x = x.astype(np.int32) if dtype == "i32" else x.astype(np.float32)
    run_both(source, "f", [x], rtol=RTOL.get(dtype, 0.0))


MATMULS = """\
func @f(%a: tensor<5x3xDT>, %b: tensor<3x4xDT>, %at: tensor<3x5xDT>, %bt: tensor<4x3xDT>,
        %x: tensor<2x5x3xDT>, %y: tensor<2x3x4xDT>, %m: tensor<6x1x3x4xDT>)
    -> (tensor<5x4xDT>, tensor<5x4xDT>, tensor<5x4xDT>, tensor<5x4xDT>, tensor<2x5x4xDT>, tensor<2x5x4xDT>,
        tensor<2x5x4xDT>, tensor<6x2x5x4xDT>, tensor<2x5x4xDT>) {
  %ab = %a @ %b
  %atb = transpose(%at) @ %b
  %abt = %a @ transpose(%bt)
  %both = transpose(%at) @ transpose(%bt)
  %xb = %x @ %b
  %xy = %x @ %y
  %ay = %a @ %y
  %xm = %x @ %m
  %xbt = %x @ transpose(%bt)
  return %ab, %atb, %abt, %both, %xb, %xy, %ay, %xm, %xbt
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_matmuls(dtype: str) -> None:
    """2-D, transposed operands (strided views), batched and broadcast batch dims; integers too."""
    source = MATMULS.replace("DT", dtype)
    fn = run_both(source, "f", seed=2, rtol=RTOL.get(dtype, 0.0))
    assert fn.stats.gemm_calls > 0 and fn.stats.kernel_launches == 0, fn.stats


CONSTANTS = """\
func @f(%v: tensor<f64>, %x: tensor<2x3xf32>)
    -> (tensor<2x2xi32>, tensor<3xf32>, tensor<2x3xf64>, tensor<f32>, tensor<2x3xf32>, tensor<2xi1>, tensor<2x3xf32>) {
  %table = constant [[1, 2], [3, 4]] : tensor<2x2xi32>
  %halves = constant 0.5 : tensor<3xf32>
  %filled = fill %v : tensor<2x3xf64>
  %big = constant -inf : tensor<f32>
  %z = zeros : tensor<3xf32>
  %o = ones(shape=[2, 3])
  %bools = constant [true, false] : tensor<2xi1>
  %dense = constant [[1.0e-3, -2.5, inf], [0.0, 1.0, 3.25]] : tensor<2x3xf32>
  return %table, %halves + %z, %filled, max(%big, 1.0), %o + %x, %bools, %dense + %x
}
"""


def test_constants() -> None:
    run_both(CONSTANTS, "f", seed=4)


SCANS = """\
func @cumsum_both_ways(%xs: tensor<4xf32>, %zero: tensor<f32>) -> (tensor<f32>, tensor<4xf32>, tensor<f32>,
                                                                   tensor<4xf32>) {
  %total, %prefix = scan (%x in %xs) carry (%acc = %zero) {
    %acc.1 = add %acc, %x : tensor<f32>
    yield (%acc.1) stack (%acc.1)
  } : tensor<f32>, tensor<4xf32>
  %total.1, %suffix = scan reverse (%x.1 in %xs) carry (%acc.2 = %zero) {
    %acc.3 = add %acc.2, %x.1 : tensor<f32>
    yield (%acc.3) stack (%acc.3)
  } : tensor<f32>, tensor<4xf32>
  return %total, %prefix, %total.1, %suffix
}

func @powers(%x: tensor<3xf32>, %one: tensor<3xf32>) -> (tensor<3xf32>, tensor<4x3xf32>) {
  %last, %all = scan length 4 () carry (%p = %one) {
    %p.1 = mul %p, %x : tensor<3xf32>
    yield (%p.1) stack (%p)
  } : tensor<3xf32>, tensor<4x3xf32>
  return %last, %all
}

func @nested(%xss: tensor<3x4x2xf32>, %zero: tensor<2xf32>) -> (tensor<2xf32>, tensor<3x2xf32>, tensor<3x4x2xf32>) {
  %total, %rows, %inner = scan (%xs in %xss) carry (%acc = %zero) {
    %rowsum, %run = scan reverse (%x in %xs) carry (%r = %acc) {
      %r.1 = add %r, %x : tensor<2xf32>
      %r.2 = tanh %r.1 : tensor<2xf32>
      yield (%r.2) stack (%r.1)
    } : tensor<2xf32>, tensor<4x2xf32>
    %acc.1 = mul %acc, %rowsum : tensor<2xf32>
    yield (%rowsum) stack (%acc.1, %run)
  } : tensor<2xf32>, tensor<3x2xf32>, tensor<3x4x2xf32>
  return %total, %rows, %inner
}

func @swap_and_count(%a: tensor<3xf32>, %b: tensor<3xf32>, %k: tensor<i32>)
    -> (tensor<3xf32>, tensor<3xf32>, tensor<i32>, tensor<5x3xf32>) {
  %one = constant 1 : tensor<i32>
  %ra, %rb, %n, %hist = scan length 5 () carry (%x = %a, %y = %b, %c = %k) {
    %c.1 = add %c, %one : tensor<i32>
    yield (%y, %x, %c.1) stack (%x)
  } : tensor<3xf32>, tensor<3xf32>, tensor<i32>, tensor<5x3xf32>
  return %ra, %rb, %n, %hist
}

func @swap_through_views(%a: tensor<2x2xf32>, %b: tensor<4xf32>) -> (tensor<2x2xf32>, tensor<4xf32>) {
  %ra, %rb = scan length 3 () carry (%x = %a, %y = %b) {
    %x1 = reshape %y {shape = [2, 2]} : tensor<2x2xf32>
    %y1 = reshape %x {shape = [4]} : tensor<4xf32>
    yield (%x1, %y1)
  } : tensor<2x2xf32>, tensor<4xf32>
  return %ra, %rb
}

func @invariant_and_sequence_stacks(%xs: tensor<3x2x2xf64>, %w: tensor<2x2xf64>, %h0: tensor<2x2xf64>)
    -> (tensor<2x2xf64>, tensor<3x2x2xf64>, tensor<3x2x2xf64>) {
  %h, %seen, %prods = scan (%x in %xs) carry (%c = %h0) {
    %p = matmul %c, %w : tensor<2x2xf64>
    %q = add %p, %x : tensor<2x2xf64>
    yield (%w) stack (%x, %q)
  } : tensor<2x2xf64>, tensor<3x2x2xf64>, tensor<3x2x2xf64>
  return %h, %seen, %prods
}

func @zero_steps(%xs: tensor<0x3xf32>, %h0: tensor<3xf32>) -> (tensor<3xf32>, tensor<0x3xf32>) {
  %h, %ys = scan (%x in %xs) carry (%c = %h0) {
    %c.1 = add %c, %x : tensor<3xf32>
    yield (%c.1) stack (%c.1)
  } : tensor<3xf32>, tensor<0x3xf32>
  return %h, %ys
}
"""


@pytest.mark.parametrize("arena", ["arena", "per-value"])
@pytest.mark.parametrize("entry", list(gir.parse(SCANS).functions))
def test_scans(entry: str, arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequences, carries, stacks, reverse, length, nested, swapped carries (also through
    views), an i32 counter, a loop-invariant yielded carry, stacked sequence elements, zero
    steps; in the memplan arena and with a buffer per value."""
    if arena == "per-value":
        monkeypatch.setenv("GIR_GPU_ARENA", "0")
    run_both(SCANS, entry, seed=6)


def test_dynamic_dims_are_specialised() -> None:
    source = "func @f(%x: tensor<?x3xf32>, %b: tensor<3xf32>) -> tensor<?x3xf32> {\n  return tanh(%x + %b)\n}\n"
    fn = gir.jit(source, "f", device="gpu")
    b = np.array([0.5, -1.0, 2.0], np.float32)
    for rows in (2, 5):
        x = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        assert_close(fn(x, b)[0], np.tanh(x + b), 1e-6, f"{rows} rows")


def test_arguments_are_checked_first() -> None:
    fn = gir.jit("func @f(%x: tensor<3xf32>) -> tensor<3xf32> {\n  return exp(%x)\n}\n", "f", device="gpu")
    with pytest.raises(gir.GirArgumentError, match="must be tensor<3xf32>"):
        fn(np.zeros(3, np.float64))
    with pytest.raises(gir.GirArgumentError, match="takes 1 argument"):
        fn()


# ---------------------------------------------------------------------------------------------
# Kernels


def test_rnn_kernel_source_and_cache() -> None:
    """rnn_loss's step is one fused kernel: a grid-stride loop, the bias broadcast by index
    arithmetic, math.tanh; compiling the function again compiles no new kernel."""
    text = small_example("rnn")
    fn = gir.jit(text, "rnn_loss", device="gpu")
    sources = ["@cuda.jit" + s for s in fn.llvm_ir.split("@cuda.jit")[1:]]  # the kernels' source
    step = next(s for s in sources if "math.tanh" in s)
    assert "for i in range(cuda.grid(1), n, cuda.gridsize(1)):" in step
    assert "c1 = i % 4" in step, step  # %b: tensor<4xf32> read at the column index
    assert "f32(" in step and "f64(" not in step
    before = kernels.cached_kernels()
    again = gir.jit(text, "rnn_loss", device="gpu")
    again(*random_inputs(gir.parse(text).functions["rnn_loss"], 0))
    assert kernels.cached_kernels() == before


def test_standalone_elementwise_ops_get_kernels() -> None:
    """Without the fuse pass every elementwise op is a kernel of its own (and memplan may put
    a result in place of its operand)."""
    source = "func @f(%x: tensor<2x3xf32>, %b: tensor<3xf32>) -> tensor<2x3xf32> {\n" \
             "  return sigmoid(neg(tanh(%x * %b)) + 1.0)\n}\n"
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.0, -0.5, 2.0], np.float32)
    want = gir.jit(source, "f", device="interp")(x, b)
    fn = gir.jit(source, "f", device="gpu", pipeline="ssa,canonicalize")
    assert_all_close(fn(x, b), want)
    assert fn.stats.kernel_launches == 5, fn.stats


PTX_CHECK = """\
import json, sys
import gir
from gir.backend.gpu import kernels
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE

probe = kernels.generate([], [], [], ())
try:
    kernels.ptx(probe)
except Exception as e:  # no NVVM / NVRTC: numba-cuda without its [cu12] extra
    if not any(w in f"{type(e).__name__} {e}".lower() for w in ("nvvm", "nvrtc", "notfound", "cudasupport")):
        raise
    print("NO NVVM:", type(e).__name__, e)
    sys.exit(0)
done = set()
for text, pipeline in json.load(open(sys.argv[1])):
    module = gir.parse(text)
    PassManager(pipeline or f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}").run(module)
    for op in module.walk():
        if op.name == "fused" or op.spec.category == "elementwise":
            ks = kernels.fused_source(op) if op.name == "fused" else kernels.op_source(op)
            if (ks.text, ks.signature) not in done:
                assert ".entry" in kernels.ptx(ks), ks.text
                done.add((ks.text, ks.signature))
print("PTX OK", len(done))
"""


def test_kernels_compile_to_ptx(tmp_path: Path) -> None:
    """The simulator runs the kernels' source as Python; numba.cuda's real compiler (no GPU
    needed, only NVVM) must also type and compile it: every op rule, every dtype and cast,
    broadcasting, the error flag. Skipped where NVVM is missing (pip install 'numba-cuda[cu12]')."""
    dtypes = ["f32", "f64", "i32", "i64", "i1"]
    casts = "".join(f"  %{s}_{d} = cast %{s} : tensor<2x{d}>\n" for s in dtypes for d in dtypes if s != d)
    cast_source = (f"func @f({', '.join(f'%{d}: tensor<2x{d}>' for d in dtypes)}) -> tensor<2x{dtypes[0]}> {{\n"
                   f"{casts}  return %f64_f32\n}}\n")
    bools = [f"func @b{k}(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {{\n  return {e}\n}}\n"
             for k, e in enumerate(["and(or(%a, %b), eq(%a, %b))", "select(%a, %b, ne(%a, %b))",
                                    "max(%a + %b, min(%a * %b, %b))", "lt(%a, %b)"])]
    programs = [(small_example("rnn"), None), (FLOAT_ELEMENTWISE.replace("DT", "f32"), None),
                (FLOAT_ELEMENTWISE.replace("DT", "f64"), None), (INT_ELEMENTWISE, None), (EDGES, None),
                (cast_source, "ssa,canonicalize"), ("".join(bools), None),
                ("func @f(%x: tensor<2x3xf32>, %b: tensor<3xf32>) -> tensor<2x3xf32> {\n"
                 "  return sigmoid(neg(tanh(%x * %b)) + 1.0)\n}\n", "ssa,canonicalize")]
    listing = tmp_path / "programs.json"
    listing.write_text(json.dumps(programs))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", PTX_CHECK, str(listing)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    if done.stdout.startswith("NO NVVM"):
        pytest.skip(done.stdout.strip())
    assert done.stdout.startswith("PTX OK"), done.stdout


# ---------------------------------------------------------------------------------------------
# The command line, and no GPU at all


def test_cli_run_device_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rnn.gir"
    path.write_text(small_example("rnn"))
    outs = {}
    for device in ("gpu", "interp"):
        out = tmp_path / f"{device}.npz"
        assert gir.cli.main(["run", str(path), "--device", device, "--outputs", str(out)]) == 0
        with np.load(out) as data:
            outs[device] = [data[k] for k in sorted(data.files)]
    assert "out0: shape ()" in capsys.readouterr().out
    assert_all_close(outs["gpu"], outs["interp"])


def test_without_a_gpu_or_the_simulator(tmp_path: Path) -> None:
    """A fresh process without NUMBA_ENABLE_CUDASIM: gir.jit(device="gpu") and `gir run
    --device gpu` say there is no GPU and how to use the simulator (skipped on a GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    probe = ("import gir\n"
             "try:\n"
             "    gir.jit('func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\\n  return tanh(%x)\\n}\\n', 'f', "
             "device='gpu')\n"
             "    print('RAN ON A GPU')\n"
             "except gir.GirError as e:\n"
             "    print(e.message)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    if "RAN ON A GPU" in done.stdout:
        pytest.skip("this machine has a GPU")
    assert done.stdout.strip() == NO_GPU, done.stdout + done.stderr
    path = tmp_path / "f.gir"
    path.write_text("func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  return tanh(%x)\n}\n")
    cli = subprocess.run([sys.executable, "-m", "gir.cli", "run", str(path), "--device", "gpu"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and NO_GPU in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
