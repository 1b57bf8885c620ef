"""Backend conformance: one suite, run on every backend (`cpu` and `gpu`), every case checked
against the interpreter, the oracle (`device="interp"`: the same pipeline, then NumPy).

Each test takes the `device` fixture, so it runs once per backend; the `gpu` runs are marked
`gpu`. Without a GPU they run in Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM is set to 1 by
tests/conftest.py, before numba is imported, unless it is already set; on a machine with
a GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu tests/test_backend_conformance.py` runs
them there. What only one backend has (BLAS paths and packing, LLVM output, the disk cache;
kernel source, PTX) is tested in tests/test_cpu_backend.py and tests/test_gpu_backend.py.

- Examples: every function of every example (rnn, gru, lstm, mlp) shrunk to T=3, batch 2,
  hidden 4 on every backend, and at full size where the backend can afford it (not in the
  simulator, which runs every CUDA thread as a Python thread); rnn/gru/lstm in float64; in
  the memplan arena and with a buffer per value (GIR_CPU_ARENA=0 / GIR_GPU_ARENA=0).
- One program per op family: elementwise ops with broadcasting, casts between all dtypes,
  integer and boolean ops, nan/inf edges, layout ops, reductions, matmuls, constants, scans
  (both memory modes), elementwise values captured by a scan (fuse).
- Hypothesis-generated programs (derandomised): ops of every family, scans nested two deep.
- Run-time errors (integer division by zero, `index` out of range) raise GirError at the op;
  bad arguments raise GirError naming the argument before any native code runs; arguments are
  never written; `?` dims are specialised per shape; `gir run --device D`.

float32 results agree to 1e-4 of the largest magnitude of each result, float64 to 1e-10.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.backend.cpu import blas
from gir.driver.jit import JitFunction
from gir.ir.interpreter import random_inputs
from gir.testing import RTOL, assert_all_close, assert_close
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
HAS_MKL = blas.providers().has_mkl

# The interpreter's NumPy warns where the cases want inf and nan (log(0), x / 0).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


# ---------------------------------------------------------------------------------------------
# The backends


def _gpu_backend() -> tuple[str | None, bool]:
    """(why the gpu backend cannot run here, or None; whether it is the simulator)."""
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "the GPU backend needs numba-cuda (pip install 'gir[gpu]')", False
    from gir.backend.gpu.device import get_device

    try:
        return None, get_device().simulated
    except gir.GirError as e:  # numba.cuda was imported without the simulator, and there is no GPU
        return f"no GPU backend here: {e.message}", False


GPU_MISSING, SIMULATED = _gpu_backend()
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("gpu", id="gpu", marks=[pytest.mark.gpu]
                 + ([pytest.mark.skip(reason=GPU_MISSING)] if GPU_MISSING else [])),
]
ARENA_OFF = {"cpu": "GIR_CPU_ARENA", "gpu": "GIR_GPU_ARENA"}
"""Set to 0: no memory plan, every value in a buffer of its own."""


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """The backend under test: every test taking it runs once per backend."""
    return request.param


@pytest.fixture(autouse=True, scope="module")
def fresh_code_cache(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The CPU backend caches compiled code on disk by content (GIR_CACHE_DIR); a cache of its
    own makes this module compile everything with the backend as it is now."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIR_CACHE_DIR", str(tmp_path_factory.mktemp("gir-cache")))
        yield


# ---------------------------------------------------------------------------------------------
# Helpers




def run_both(device: str, source: str, entry: str, args: list[np.ndarray] | None = None, seed: int = 0,
             rtol: float | None = None) -> JitFunction:
    """Runs @entry on device and on the interpreter (seeded random inputs unless given) and
    compares; returns the device's JitFunction."""
    if args is None:
        args = random_inputs(gir.parse(source).functions[entry], seed)
    want = gir.jit(source, entry, device="interp")(*args)
    fn = gir.jit(source, entry, device=device)
    got = fn(*args)
    assert_all_close(got, want, rtol, f"{device} @{entry}")
    return fn


# ---------------------------------------------------------------------------------------------
# The examples

MODELS = ["rnn", "gru", "lstm", "mlp", "layernorm_lstm"]
SMALL = [("64x256", "2x6"), ("64x10", "2x3"), ("256x512", "6x5"), ("512x10", "5x3"), ("<512x", "<5x"),
         ("<10x", "<3x"), ("50x32x256", "3x2x4"), ("32x256", "2x4"), ("256x256", "4x4"), ("<256x", "<4x"),
         ("20x8x16", "3x2x3"), ("16x32", "3x4"), ("32x32", "4x4"), ("8x32", "2x4"), ("<32x", "<4x")]
"""The examples at T=3, batch 2, hidden 4 (mlp: batch 2, 6 -> 5 -> 3; layernorm_lstm: input 3, its
sizes last, after the others' are gone). Longer patterns first."""
SMALL_F64 = [("50x32x256", "4x3x5"), ("32x256", "3x5"), ("256x256", "5x5"), ("<256x", "<5x"), ("f32", "f64"),
             ("20x8x16", "4x3x3"), ("16x32", "3x5"), ("32x32", "5x5"), ("8x32", "3x5"), ("<32x", "<5x")]
"""rnn/gru/lstm/layernorm_lstm in float64 at T=4, batch 3, hidden 5."""


def example(model: str, size: str = "full") -> str:
    text = (REPO / "examples" / f"{model}.gir").read_text()
    if size == "full":
        return text
    for old, new in SMALL if size == "small" else SMALL_F64:
        text = text.replace(old, new)
    types = re.findall(r"tensor<[^>]*>", text)
    dims = [int(d) for t in types for d in t[len("tensor<"):-1].split("x")[:-1]]
    assert types and max(dims) < 10, types  # every type was shrunk
    assert size == "small" or not any("f32" in t for t in types), types
    module = gir.parse(text)
    assert str(gir.parse(str(module))) == str(module)
    return text


def example_entries() -> list[tuple[str, str]]:
    return [(m, name) for m in MODELS for name in gir.parse(example(m)).functions]


def check_example_stats(device: str, fn: JitFunction) -> None:
    assert fn.stats.gemm_calls > 0, fn.stats
    if device == "gpu":
        assert fn.stats.kernel_launches > 0 and fn.stats.memory.startswith("arena"), fn.stats


@pytest.mark.parametrize("size", ["small", "full"])
@pytest.mark.parametrize(("model", "entry"), example_entries())
def test_example_matches_interpreter(device: str, model: str, entry: str, size: str) -> None:
    if size == "full" and device == "gpu" and SIMULATED:
        pytest.skip("full size in the CUDA simulator takes hours (every CUDA thread is a Python thread)")
    text = example(model, size)
    args = random_inputs(gir.parse(text).functions[entry], 1)
    check_example_stats(device, run_both(device, text, entry, args))


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm", "layernorm_lstm"])
def test_recurrent_examples_in_float64(device: str, model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loss and gradients to 1e-10; on cpu with the packed GEMM path forced where MKL exists
    (so that dgemm_pack/compute run too)."""
    packed = device == "cpu" and HAS_MKL
    if packed:
        monkeypatch.setenv("GIR_GEMM_PATH", "mkl-packed")
    text = example(model, "f64")
    for entry in gir.parse(text).functions:
        fn = run_both(device, text, entry, seed=1, rtol=1e-10)
        if packed and entry.endswith("_loss"):
            assert fn.stats.gemm_paths.get("mkl-packed", 0) >= 1, fn.stats


@pytest.mark.parametrize("entry", ["rnn_grads", "lstm_grads"])
def test_example_with_a_buffer_per_value(device: str, entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No memory plan, every value in a buffer of its own: the same results."""
    monkeypatch.setenv(ARENA_OFF[device], "0")
    fn = run_both(device, example(entry.split("_")[0], "small"), entry, seed=2)
    if device == "gpu":
        assert fn.stats.memory.startswith("a buffer per value"), fn.stats


def test_repeated_calls_reuse_memory(device: str) -> None:
    """Memory is reused across calls: a second call with other inputs gives the interpreter's
    results."""
    text = example("gru", "small")
    fn = gir.jit(text, "gru_grads", device=device)
    oracle = gir.jit(text, "gru_grads", device="interp")
    f = gir.parse(text).functions["gru_grads"]
    for seed in (3, 4):
        args = random_inputs(f, seed)
        assert_all_close(fn(*args), oracle(*args), what=f"seed {seed}")


def test_arguments_are_not_modified_and_outputs_are_fresh(device: str) -> None:
    """Carries and in-place candidates never write into arguments (read-only arrays are
    accepted); every call returns new arrays and the same values."""
    text = example("rnn", "small")
    args = random_inputs(gir.parse(text).functions["rnn_grads"], 3)
    for a in args:
        a.setflags(write=False)
    copies = [a.copy() for a in args]
    fn = gir.jit(text, "rnn_grads", device=device)
    first = fn(*args)
    kept = [r.copy() for r in first]
    second = fn(*args)
    for a, c in zip(args, copies):
        np.testing.assert_array_equal(a, c)
    for f, k, s in zip(first, kept, second):
        np.testing.assert_array_equal(f, k)
        np.testing.assert_array_equal(s, k)
        assert not np.shares_memory(f, s)


# ---------------------------------------------------------------------------------------------
# One program per op family

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
  %un2 = %un + sin(%a) + cos(%c) + stop_gradient(%b)
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
  return %add, %sub, %mul, %div, %pow, %mx, %mn, %un2, %mask, %sel + %sel2, %back
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_float_elementwise_ops(device: str, dtype: str) -> None:
    """Every float elementwise op, comparisons, logic, select and casts, with broadcasting."""
    source = FLOAT_ELEMENTWISE.replace("DT", dtype)
    rng = np.random.default_rng(5)
    nd = np.float32 if dtype == "f32" else np.float64
    args = [rng.uniform(-2, 2, s).astype(nd) for s in [(3, 4), (4,), (3, 1), ()]]
    args[1][1] = args[0][2, 1]  # an equal pair for le/ge/eq/ne
    run_both(device, source, "f", args, rtol=RTOL[dtype])


def test_cast_between_all_dtypes(device: str) -> None:
    dtypes = ["f32", "f64", "i32", "i64", "i1"]
    outs = [f"%{s}_{d}" for s in dtypes for d in dtypes if s != d]
    lines = [f"  %{s}_{d} = cast %{s} : tensor<5x{d}>" for s in dtypes for d in dtypes if s != d]
    sig = ", ".join(f"%{d}: tensor<5x{d}>" for d in dtypes)
    types = ", ".join(f"tensor<5x{d}>" for s in dtypes for d in dtypes if s != d)
    source = f"func @f({sig}) -> ({types}) {{\n" + "\n".join(lines) + f"\n  return {', '.join(outs)}\n}}\n"
    floats = [-2.75, -0.5, 0.0, 0.25, 3.5]
    args = [np.array(floats, np.float32), np.array(floats, np.float64), np.array([-3, -1, 0, 2, 7], np.int32),
            np.array([-3, -1, 0, 2, 2**40], np.int64), np.array([True, False, True, False, True])]
    run_both(device, source, "f", args, rtol=0.0)


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


def test_int_elementwise_ops(device: str) -> None:
    """i32 arithmetic (wrapping), floor division with negative operands, comparisons."""
    a = np.array([[-7, -6, -1, 0, 5], [7, 6, 1, -9, 2147483647]], np.int32)
    b = np.array([2, -4, 3, -1, 5], np.int32)
    run_both(device, INT_ELEMENTWISE, "f", [a, b, np.array(3, np.int32)], rtol=0.0)


def test_integer_division_by_zero_is_an_error(device: str) -> None:
    """A GirError at the op's location; the error flag is reset for the next call."""
    source = "func @f(%a: tensor<3xi32>, %b: tensor<3xi32>) -> tensor<3xi32> {\n  return %a / %b\n}\n"
    fn = gir.jit(source, "f", device=device)
    a = np.array([7, -7, 1], np.int32)
    np.testing.assert_array_equal(fn(a, np.array([2, 2, -1], np.int32))[0], [3, -4, -1])
    with pytest.raises(gir.GirError, match="integer division by zero at run time") as info:
        fn(a, np.array([2, 0, 1], np.int32))
    assert info.value.loc.line == 2
    np.testing.assert_array_equal(fn(a, np.array([1, 1, 1], np.int32))[0], a)


BOOL_EXPRS = ["and(%a, %b)", "or(%a, %b)", "eq(%a, %b)", "select(%a, %b, ne(%a, %b))", "%a + %b", "%a * %b",
              "max(%a, %b)", "min(%a, %b)", "lt(%a, %b)", "ge(%a, %b)"]
BOOLS = (np.array([True, True, False, False]), np.array([True, False, True, False]))


def bool_program(expr: str) -> str:
    return f"func @f(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {{\n  return {expr}\n}}\n"


@pytest.mark.parametrize("expr", BOOL_EXPRS)
def test_bool_ops(device: str, expr: str) -> None:
    """Logic, and arithmetic and ordering on i1 with NumPy's meaning (+ is or, False < True)."""
    run_both(device, bool_program(expr), "f", list(BOOLS), rtol=0.0)


def test_every_elementwise_op_is_covered() -> None:
    """The op-family programs above use every elementwise op of the registry (a new op needs a
    line there). Not per backend: it checks the programs."""
    from gir.ir.ops import REGISTRY

    sources = [FLOAT_ELEMENTWISE.replace("DT", "f32"), INT_ELEMENTWISE, *map(bool_program, BOOL_EXPRS)]
    used = {op.name for source in sources for op in gir.parse(source).functions["f"].body}
    elementwise = {name for name, spec in REGISTRY.items() if spec.category == "elementwise"}
    assert elementwise <= used, sorted(elementwise - used)


EDGES = """\
func @f(%x: tensor<6xf32>) -> (tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>,
                               tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<f32>, tensor<f32>) {
  %zero = constant 0.0 : tensor<f32>
  return exp(%x), log(%x), sqrt(%x), %x / %zero, max(%x, 0.0), min(%x, 0.0), relu(%x), sigmoid(%x), max(%x), min(%x)
}
"""


def test_nan_and_inf_edges(device: str) -> None:
    """As NumPy: exp overflows to inf, log(0) = -inf, log/sqrt of a negative and nan are nan,
    x / 0 is +-inf or nan, nan propagates through max/min/relu and the max/min reductions."""
    x = np.array([np.nan, 100.0, 0.0, -1.5, np.inf, 0.5], np.float32)
    run_both(device, EDGES, "f", [x])


@pytest.mark.parametrize("expr", ["max(%a, 0.0)", "min(%a, 0.0)", "relu(%a)", "max(%a)", "min(%a)"])
def test_nan_propagates_alone(device: str, expr: str) -> None:
    """The same nan rules for an op on its own (not fused with others)."""
    result = "f32" if expr in ("max(%a)", "min(%a)") else "4xf32"
    source = f"func @f(%a: tensor<4xf32>) -> tensor<{result}> {{\n  return {expr}\n}}\n"
    run_both(device, source, "f", [np.array([np.nan, 1.0, -2.0, 0.5], np.float32)])


def test_float32_exp_overflow(device: str) -> None:
    source = "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return exp(%x)\n}\n"
    run_both(device, source, "f", [np.array([88.5, 88.7, 89.0, 100.0], np.float32)])


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


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_layout_ops(device: str, dtype: str) -> None:
    """transpose (permutation and default), reshape (-1), broadcast, concat (negative axis),
    stack (axis 0 and inner), slice (strided: a copy; a contiguous box: a view), index (by an
    argument: read back; by a constant) and a dense constant."""
    source = LAYOUT.replace("DT", dtype)
    if dtype == "i32":
        source = source.replace("[[1.5, -2.0, 3.0], [0.0, 0.25, -7.0]]", "[[1, -2, 3], [0, 4, -7]]")
        source = source.replace("%k * 2.0", "%k * 2")
    x = (np.arange(24).reshape(2, 3, 4) * 1.5 - 7).astype(dtype.replace("f", "float").replace("i", "int"))
    v = np.array([1, -2, 5], x.dtype)
    run_both(device, source, "f", [x, v, np.array(1, np.int32)], rtol=0.0)


def test_index_out_of_range_is_an_error(device: str) -> None:
    source = "func @f(%x: tensor<3x2xf32>, %i: tensor<i32>) -> tensor<2xf32> {\n  return index(%x, %i)\n}\n"
    fn = gir.jit(source, "f", device=device)
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


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_reductions(device: str, dtype: str) -> None:
    source = REDUCTIONS.replace("DT", dtype)
    if dtype == "i32":  # mean is for floats only
        source = source.replace("%mean = mean(%x, axes=[0, 2])", "%mean = sum(%x, axes=[0, 2])")
    x = np.random.default_rng(3).uniform(-5, 5, (3, 4, 5))
    x = x.astype(np.int32) if dtype == "i32" else x.astype(dtype.replace("f", "float"))
    run_both(device, source, "f", [x], rtol=RTOL.get(dtype, 0.0))


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
def test_matmuls(device: str, dtype: str) -> None:
    """2-D, transposed left/right/both operands (strided views), batched (3-D @ 2-D, 3-D @ 3-D,
    2-D @ 3-D, broadcast batch dims); integers too. Every float product is a GEMM call."""
    # i32 products on the CPU are loops, not GEMMs, so a transpose they read is a copy, not a
    # view (it was a view the integer loop read untransposed: wrong values, fixed in the
    # transpose's view rule).
    source = MATMULS.replace("DT", dtype)
    fn = run_both(device, source, "f", seed=2, rtol={"f32": 1e-5, "f64": 1e-10}.get(dtype, 0.0))
    if device == "gpu" or dtype != "i32":
        assert fn.stats.gemm_calls > 0, fn.stats
    if device == "gpu":
        assert fn.stats.kernel_launches == 0, fn.stats


@pytest.mark.parametrize(("a", "b"), [((3, 4), (4, 2)), ((2, 3, 4), (4, 2))], ids=["2d", "batched"])
def test_integer_matmul(device: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    source = (f"func @f(%a: tensor<{'x'.join(map(str, a))}xi32>, %b: tensor<{'x'.join(map(str, b))}xi32>) -> "
              f"tensor<{'x'.join(map(str, a[:-1] + b[-1:]))}xi32> {{\n  return %a @ %b\n}}\n")
    args = [np.arange(math.prod(a), dtype=np.int32).reshape(a) - 5, np.arange(math.prod(b), dtype=np.int32).reshape(b)]
    run_both(device, source, "f", args, rtol=0.0)


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


def test_constants(device: str) -> None:
    run_both(device, CONSTANTS, "f", seed=4)


# ---------------------------------------------------------------------------------------------
# Scans

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


@pytest.mark.parametrize("memory", ["arena", "per-value"])
@pytest.mark.parametrize("entry", list(gir.parse(SCANS).functions))
def test_scans(device: str, entry: str, memory: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequences, carries, stacks, reverse, length, nested, swapped carries (also through
    views), an i32 counter, a loop-invariant yielded carry, stacked sequence elements, zero
    steps; in the memplan arena and with a buffer per value."""
    if memory == "per-value":
        monkeypatch.setenv(ARENA_OFF[device], "0")
    run_both(device, SCANS, entry, seed=6)


FUSE_CAPTURED = """\
func @f(%x: tensor<4xf32>, %h: tensor<2xf32>) -> tensor<4xf32> {
  %a = tanh(%x)
  %s = scan length 2 () carry (%c = %x) {
    %c1 = add %c, %a : tensor<4xf32>
    yield (%c1)
  } : tensor<4xf32>
  %b = add %a, %s : tensor<4xf32>
  return %b
}
"""
FUSE_HOISTED = """\
func @f(%x: tensor<4xf32>, %h: tensor<2xf32>) -> (tensor<3x4xf32>, tensor<4xf32>) {
  %r, %s = scan length 3 () carry (%c = %h) {
    %a = abs %x : tensor<4xf32>
    %c1 = tanh %c : tensor<2xf32>
    yield (%c1) stack (%a)
  } : tensor<2xf32>, tensor<3x4xf32>
  %b = abs %x : tensor<4xf32>
  %d = add %b, %x : tensor<4xf32>
  return %s, %d
}
"""


@pytest.mark.parametrize("source", [FUSE_CAPTURED, FUSE_HOISTED], ids=["captured", "hoisted-and-merged"])
def test_fuse_with_value_captured_by_a_scan(device: str, source: str) -> None:
    """An elementwise value read inside a scan body and after the scan (fuse must not move it
    into a group after the loop), and one computed in the body and again after it."""
    run_both(device, source, "f", [np.arange(4, dtype=np.float32) - 1.5, np.ones(2, np.float32)])


# ---------------------------------------------------------------------------------------------
# Hypothesis-generated programs


@dataclass
class Val:
    name: str
    shape: tuple[int, ...]
    dtype: str
    bound: float = 1.0
    """A generous bound on |value|: operands above a limit go through tanh first."""
    elementwise: bool = False
    """Defined by an elementwise op: never read inside a scan body (see test_fuse_with_value_captured_by_a_scan)."""

    @property
    def type(self) -> str:
        return ttype(self.shape, self.dtype)


def ttype(shape: tuple[int, ...], dtype: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def factorizations(n: int, rank: int) -> list[tuple[int, ...]]:
    if rank == 0:
        return [()] if n == 1 else []
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, rank - 1)]


@dataclass
class Scope:
    pool: list[Val]
    lines: list[str] = field(default_factory=list)
    depth: int = 0
    local: list[Val] = field(default_factory=list)
    """Values defined in this scope (a scan body's own values)."""


class ProgramGen:
    """A random SSA program from a seed: ops of every family on values drawn from a pool
    (arguments are added as needed), scans whose bodies are generated the same way (nested up
    to two deep), and the leaves returned. Result types are written out, so the parser checks
    every shape computed here. Values stay finite: operands of exp, log, sqrt, pow and div are
    guarded, and large ones go through tanh before mul, pow, matmul and casts to i32."""

    UNARY = ["neg", "abs", "exp", "log", "tanh", "sigmoid", "relu", "sqrt"]
    BINARY = ["add", "sub", "mul", "div", "pow", "max", "min"]
    COMPARE = ["lt", "le", "gt", "ge", "eq", "ne"]
    INT_BINARY = ["add", "sub", "mul", "div", "max", "min"]
    KINDS = ["unary", "binary", "binary", "compare", "select", "cast", "int", "int", "constant", "matmul", "matmul",
             "transpose", "reshape", "slice", "concat", "stack", "broadcast", "index", "reduce", "reduce",
             "scan", "scan"]

    def __init__(self, seed: int, fdtype: str):
        self.rng = random.Random(seed)
        self.fdtype = fdtype
        self.args: list[Val] = []
        self.counter = 0
        self.dtypes_seen = {fdtype}
        self.products: set[str] = set()
        """Names of matmul results: never stacked directly (see the note in gen_scan)."""

    # -- helpers ------------------------------------------------------------------------------
    def coin(self) -> bool:
        return self.rng.random() < 0.5

    def fresh(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def shape(self, min_rank: int = 0, max_rank: int = 3) -> tuple[int, ...]:
        rank = self.rng.randint(min_rank, max_rank)
        return tuple(self.rng.randint(1, 4) for _ in range(rank))

    def new_arg(self, scope: Scope, shape: tuple[int, ...], dtype: str) -> Val:
        v = Val(f"%a{len(self.args)}", shape, dtype, bound=1.0 if dtype != "i32" else 3.0)
        self.args.append(v)
        scope.pool.append(v)
        return v

    def emit(self, scope: Scope, rhs: str, shape: tuple[int, ...], dtype: str, bound: float,
             elementwise: bool = False) -> Val:
        v = Val(self.fresh(), tuple(shape), dtype, min(bound, 1e30), elementwise)
        scope.lines.append(f"{'  ' * (scope.depth + 1)}{v.name} = {rhs} : {v.type}")
        scope.pool.append(v)
        scope.local.append(v)
        self.dtypes_seen.add(dtype)
        return v

    def pick(self, scope: Scope, pred) -> Val | None:  # noqa: ANN001
        options = [v for v in scope.pool if pred(v)]
        return self.rng.choice(options) if options else None

    def float_value(self, scope: Scope, min_rank: int = 0) -> Val:
        v = self.pick(scope, lambda v: v.dtype == self.fdtype and len(v.shape) >= min_rank)
        return v if v is not None else self.new_arg(scope, self.shape(min_rank), self.fdtype)

    def constant(self, scope: Scope, value: float, dtype: str) -> Val:
        text = repr(float(value)) if dtype in ("f32", "f64") else str(int(value))
        return self.emit(scope, f"constant {text}", (), dtype, abs(value))

    def bounded(self, scope: Scope, v: Val, limit: float) -> Val:
        if v.bound <= limit:
            return v
        return self.emit(scope, f"tanh {v.name}", v.shape, v.dtype, 1.0, True)

    def partner(self, scope: Scope, a: Val, dtype: str | None = None) -> Val:
        """A value broadcastable with a: from the pool, a new argument or a scalar constant."""
        dtype = dtype or a.dtype

        def fits(v: Val) -> bool:
            try:
                broadcast(v.shape, a.shape)
            except ValueError:
                return False
            return v.dtype == dtype

        choice = self.rng.randint(0, 3)
        if choice <= 1:
            v = self.pick(scope, fits)
            if v is not None:
                return v
        if choice == 2:
            return self.constant(scope, self.rng.choice([0.5, -1.5, 2.0, 3.0]), dtype)
        # a suffix of a's shape, some dims set to 1, maybe a leading dim more
        shape = list(a.shape[self.rng.randint(0, len(a.shape)):])
        shape = [1 if self.coin() else d for d in shape]
        if len(a.shape) < 3 and self.coin():
            shape = [self.rng.randint(1, 3)] + list(a.shape)
        return self.new_arg(scope, tuple(shape), dtype)

    def i32_value(self, scope: Scope) -> Val:
        v = self.pick(scope, lambda v: v.dtype == "i32")
        return v if v is not None else self.new_arg(scope, self.shape(), "i32")

    def bool_value(self, scope: Scope) -> Val:
        v = self.pick(scope, lambda v: v.dtype == "i1")
        if v is not None:
            return v
        return self.gen_compare(scope)

    # -- op families ----------------------------------------------------------------------
    def gen_unary(self, scope: Scope) -> Val:
        op = self.rng.choice(self.UNARY)
        a = self.float_value(scope)
        if op == "exp":
            a = self.bounded(scope, a, 5.0)
            return self.emit(scope, f"exp {a.name}", a.shape, a.dtype, math.exp(a.bound), True)
        if op in ("log", "sqrt"):
            a = self.emit(scope, f"abs {a.name}", a.shape, a.dtype, a.bound, True)
            if op == "log":
                one = self.constant(scope, 1.0, a.dtype)
                a = self.emit(scope, f"add {a.name}, {one.name}", a.shape, a.dtype, a.bound + 1, True)
            return self.emit(scope, f"{op} {a.name}", a.shape, a.dtype, max(1.0, a.bound), True)
        bound = 1.0 if op in ("tanh", "sigmoid") else a.bound
        return self.emit(scope, f"{op} {a.name}", a.shape, a.dtype, bound, True)

    def gen_binary(self, scope: Scope) -> Val:
        op = self.rng.choice(self.BINARY)
        a = self.float_value(scope)
        b = self.partner(scope, a)
        if op in ("mul", "pow", "div"):
            a, b = self.bounded(scope, a, 100.0), self.bounded(scope, b, 100.0)
        shape = broadcast(a.shape, b.shape)
        if op == "div":
            d = self.emit(scope, f"abs {b.name}", b.shape, b.dtype, b.bound, True)
            half = self.constant(scope, 0.5, a.dtype)
            b = self.emit(scope, f"add {d.name}, {half.name}", b.shape, b.dtype, b.bound + 0.5, True)
            return self.emit(scope, f"div {a.name}, {b.name}", shape, a.dtype, a.bound * 2, True)
        if op == "pow":
            d = self.emit(scope, f"abs {a.name}", a.shape, a.dtype, a.bound, True)
            half = self.constant(scope, 0.5, a.dtype)
            base = self.emit(scope, f"add {d.name}, {half.name}", a.shape, a.dtype, a.bound + 0.5, True)
            e = self.bounded(scope, b, 2.0)
            return self.emit(scope, f"pow {base.name}, {e.name}", shape, a.dtype, max(2.0, base.bound) ** 2, True)
        bound = {"add": a.bound + b.bound, "sub": a.bound + b.bound, "mul": a.bound * b.bound}.get(
            op, max(a.bound, b.bound))
        return self.emit(scope, f"{op} {a.name}, {b.name}", shape, a.dtype, bound, True)

    def gen_compare(self, scope: Scope) -> Val:
        op = self.rng.choice(self.COMPARE)
        a = self.float_value(scope) if self.coin() else self.i32_value(scope)
        b = self.partner(scope, a)
        return self.emit(scope, f"{op} {a.name}, {b.name}", broadcast(a.shape, b.shape), "i1", 1.0, True)

    def gen_select(self, scope: Scope) -> Val:
        if self.coin():
            c1, c2 = self.bool_value(scope), self.bool_value(scope)
            try:
                shape = broadcast(c1.shape, c2.shape)
            except ValueError:
                c2 = c1
                shape = c1.shape
            logic = self.rng.choice(["and", "or"])
            return self.emit(scope, f"{logic} {c1.name}, {c2.name}", shape, "i1", 1.0, True)
        c = self.bool_value(scope)
        a = self.partner(scope, c, self.fdtype if self.rng.randint(0, 3) else "i32")
        b = self.partner(scope, a)
        try:
            shape = broadcast(c.shape, a.shape, b.shape)
        except ValueError:
            b = a
            shape = broadcast(c.shape, a.shape)
        return self.emit(scope, f"select {c.name}, {a.name}, {b.name}", shape, a.dtype, max(a.bound, b.bound), True)

    def gen_cast(self, scope: Scope) -> Val:
        src = self.pick(scope, lambda v: True) or self.float_value(scope)
        targets = {"f32": ["i32", "i1"], "f64": ["i32", "i1"], "i32": [self.fdtype, "i1"], "i1": [self.fdtype, "i32"]}
        options = list(targets[src.dtype])
        if self.fdtype == "f32" and src.dtype in ("f32", "f64"):
            options.append("f64" if src.dtype == "f32" else "f32")
        dst = self.rng.choice(options)
        if src.dtype in ("f32", "f64") and dst == "i32":
            src = self.bounded(scope, src, 1e3)
            ten = self.constant(scope, 10.0, src.dtype)
            src = self.emit(scope, f"mul {src.name}, {ten.name}", src.shape, src.dtype, src.bound * 10, True)
        return self.emit(scope, f"cast {src.name}", src.shape, dst, src.bound, True)

    def gen_int(self, scope: Scope) -> Val:
        op = self.rng.choice(self.INT_BINARY + ["neg", "abs", "relu"])
        a = self.i32_value(scope)
        if op in ("neg", "abs", "relu"):
            return self.emit(scope, f"{op} {a.name}", a.shape, "i32", a.bound, True)
        b = self.partner(scope, a)
        shape = broadcast(a.shape, b.shape)
        if op == "div":  # floor division by |b| + 1 >= 1
            d = self.emit(scope, f"abs {b.name}", b.shape, "i32", b.bound, True)
            one = self.constant(scope, 1, "i32")
            b = self.emit(scope, f"add {d.name}, {one.name}", b.shape, "i32", b.bound + 1, True)
            # a - b is often negative: floor division differs from truncation there
            a = self.emit(scope, f"sub {a.name}, {b.name}", shape, "i32", a.bound + b.bound, True)
        bound = a.bound * b.bound if op == "mul" else a.bound + b.bound
        return self.emit(scope, f"{op} {a.name}, {b.name}", shape, "i32", bound, True)

    def gen_constant(self, scope: Scope) -> Val:
        dtype = self.rng.choice([self.fdtype, self.fdtype, "i32"])
        shape = self.shape(0, 2)
        if self.coin():
            value = self.rng.choice([0.0, 1.0, -2.5, 0.125])
            text = repr(value) if dtype != "i32" else str(int(value))
            return self.emit(scope, f"constant {text}", shape, dtype, abs(value))
        n = math.prod(shape)
        values = [self.rng.randint(-40, 40) for _ in range(n)]
        flat = [f"{x / 8}" if dtype != "i32" else str(x) for x in values]

        def nest(items: list[str], dims: tuple[int, ...]) -> str:
            if not dims:
                return items[0]
            step = len(items) // dims[0]
            return "[" + ", ".join(nest(items[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])) + "]"

        return self.emit(scope, f"constant {nest(flat, shape)}", shape, dtype, 5.0)

    def gen_matmul(self, scope: Scope) -> Val:
        a = self.pick(scope, lambda v: v.dtype == self.fdtype and len(v.shape) in (2, 3))
        if a is None or self.rng.randint(0, 3) == 0:
            m, k = self.rng.randint(1, 5), self.rng.randint(1, 5)
            if self.coin():  # transposed left operand
                at = self.new_arg(scope, (k, m), self.fdtype)
                a = self.emit(scope, f"transpose {at.name} {{perm = [1, 0]}}", (m, k), self.fdtype, at.bound)
            else:
                a = self.new_arg(scope, (m, k), self.fdtype)
        a = self.bounded(scope, a, 100.0)
        k = a.shape[-1]
        n = self.rng.randint(1, 5)
        form = self.rng.choice(["plain", "transposed", "batched", "pool"])
        b = None
        if form == "pool":
            b = self.pick(scope, lambda v: v.dtype == self.fdtype and len(v.shape) == 2 and v.shape[0] == k)
        if b is None and form == "transposed":
            bt = self.new_arg(scope, (n, k), self.fdtype)
            b = self.emit(scope, f"transpose {bt.name}", (k, n), self.fdtype, bt.bound)
        if b is None and form == "batched":
            batch = a.shape[0] if len(a.shape) == 3 and self.coin() else self.rng.randint(1, 3)
            if len(a.shape) == 3 and batch != a.shape[0]:
                batch = 1
            b = self.new_arg(scope, (batch, k, n), self.fdtype)
        if b is None:
            b = self.new_arg(scope, (k, n), self.fdtype)
        b = self.bounded(scope, b, 100.0)
        shape = broadcast(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        product = self.emit(scope, f"matmul {a.name}, {b.name}", shape, self.fdtype, a.bound * b.bound * k)
        self.products.add(product.name)
        return product

    def any_value(self, scope: Scope, min_rank: int = 0) -> Val:
        v = self.pick(scope, lambda v: len(v.shape) >= min_rank)
        return v if v is not None else self.float_value(scope, min_rank)

    def gen_transpose(self, scope: Scope) -> Val:
        a = self.any_value(scope, 2)
        perm = self.rng.sample(range(len(a.shape)), len(a.shape))
        shape = tuple(a.shape[p] for p in perm)
        if self.rng.randint(0, 3) == 0:
            return self.emit(scope, f"transpose {a.name}", a.shape[::-1], a.dtype, a.bound)
        return self.emit(scope, f"transpose {a.name} {{perm = {list(perm)}}}", shape, a.dtype, a.bound)

    def gen_reshape(self, scope: Scope) -> Val:
        a = self.any_value(scope, 1)
        size = math.prod(a.shape)
        options = [s for r in range(0, 4) for s in factorizations(size, r)]
        shape = self.rng.choice(options)
        written = list(shape)
        if written and self.coin():
            written[self.rng.randint(0, len(written) - 1)] = -1
        return self.emit(scope, f"reshape {a.name} {{shape = {written}}}", shape, a.dtype, a.bound)

    def gen_slice(self, scope: Scope) -> Val:
        a = self.any_value(scope, 1)
        starts, limits, steps, shape = [], [], [], []
        for d in a.shape:
            s = self.rng.randint(0, d - 1)
            lim = self.rng.randint(s + 1, d)
            step = self.rng.randint(1, 3)
            starts.append(s)
            limits.append(lim)
            steps.append(step)
            shape.append(-(-(lim - s) // step))
        attrs = f"limits = {limits}, starts = {starts}"
        if any(x != 1 for x in steps) or self.coin():
            attrs += f", steps = {steps}"
        else:
            shape = [lim - s for s, lim in zip(starts, limits)]
        return self.emit(scope, f"slice {a.name} {{{attrs}}}", tuple(shape), a.dtype, a.bound)

    def gen_concat(self, scope: Scope) -> Val:
        a = self.any_value(scope, 1)
        rank = len(a.shape)
        axis = self.rng.randint(-rank, rank - 1)
        ax = axis % rank

        def fits(v: Val) -> bool:
            return v.dtype == a.dtype and len(v.shape) == rank and all(
                x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != ax)

        parts = [a] + [self.pick(scope, fits) or a for _ in range(self.rng.randint(1, 2))]
        shape = list(a.shape)
        shape[ax] = sum(p.shape[ax] for p in parts)
        names = ", ".join(p.name for p in parts)
        return self.emit(scope, f"concat {names} {{axis = {axis}}}", tuple(shape), a.dtype,
                         max(p.bound for p in parts))

    def gen_stack(self, scope: Scope) -> Val:
        a = self.any_value(scope, 0)
        b = self.pick(scope, lambda v: v.type == a.type) or a
        rank = len(a.shape) + 1
        axis = self.rng.randint(-rank, rank - 1)
        shape = list(a.shape)
        shape.insert(axis % rank, 2)
        return self.emit(scope, f"stack {a.name}, {b.name} {{axis = {axis}}}", tuple(shape), a.dtype,
                         max(a.bound, b.bound))

    def gen_broadcast(self, scope: Scope) -> Val:
        a = self.any_value(scope, 0)
        shape = [self.rng.randint(2, 3) if d == 1 and self.coin() else d for d in a.shape]
        while len(shape) < 3 and self.coin():
            shape.insert(0, self.rng.randint(1, 3))
        return self.emit(scope, f"broadcast {a.name} {{shape = {shape}}}", tuple(shape), a.dtype, a.bound)

    def gen_index(self, scope: Scope) -> Val:
        a = self.any_value(scope, 1)
        k = self.rng.randint(0, a.shape[0] - 1)
        i = self.constant(scope, k, self.rng.choice(["i32", "i64"]))
        scope.pool.remove(i)  # only index reads i64 values
        return self.emit(scope, f"index {a.name}, {i.name}", a.shape[1:], a.dtype, a.bound)

    def gen_reduce(self, scope: Scope) -> Val:
        a = self.pick(scope, lambda v: v.dtype != "i1" and len(v.shape) >= 1) or self.float_value(scope, 1)
        ops = ["sum", "reduce_max", "reduce_min"] + (["mean"] if a.dtype != "i32" else [])
        op = self.rng.choice(ops)
        rank = len(a.shape)
        attrs = []
        if self.rng.randint(0, 3) == 0:
            axes = list(range(rank))
        else:
            axes = sorted(self.rng.sample(range(rank), self.rng.randint(1, rank)))
            written = [x - rank if self.coin() else x for x in axes]
            attrs.append(f"axes = {written}")
        keepdims = self.coin()
        if keepdims:
            attrs.append("keepdims = true")
            shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape))
        else:
            shape = tuple(d for i, d in enumerate(a.shape) if i not in axes)
        n = math.prod(a.shape[i] for i in axes)
        bound = a.bound * n if op == "sum" else a.bound
        text = f"{op} {a.name}" + (" {" + ", ".join(attrs) + "}" if attrs else "")
        return self.emit(scope, text, shape, a.dtype, bound)

    def gen_scan(self, scope: Scope) -> Val:
        if scope.depth >= 2:
            return self.gen_unary(scope)
        steps = self.rng.randint(1, 4)
        outer = [v for v in scope.pool if not v.elementwise]
        body = Scope(pool=list(outer), depth=scope.depth + 1)
        seqs: list[tuple[Val, Val]] = []
        for _ in range(self.rng.randint(0, 2)):
            xs = self.pick(scope, lambda v: len(v.shape) >= 1 and v.shape[0] == steps and not v.elementwise
                           and v.dtype != "i1")
            if xs is None or self.coin():
                xs = self.new_arg(scope, (steps,) + self.shape(0, 2), self.rng.choice([self.fdtype, "i32"]))
                body.pool.append(xs)
            x = Val(self.fresh(), xs.shape[1:], xs.dtype, xs.bound)
            body.pool.append(x)
            seqs.append((x, xs))
        carries: list[tuple[Val, Val]] = []
        for _ in range(self.rng.randint(0 if seqs else 1, 2)):
            init = self.pick(scope, lambda v: v.dtype in (self.fdtype, "i32"))
            if init is None or self.rng.randint(0, 2) == 0:
                init = self.new_arg(scope, self.shape(0, 2), self.fdtype)
                body.pool.append(init)
            bound = max(init.bound, 1.0) if init.dtype != "i32" else init.bound + steps * 100
            c = Val(self.fresh(), init.shape, init.dtype, bound)
            body.pool.append(c)
            carries.append((c, init))
        for _ in range(self.rng.randint(1, 4)):
            self.gen_op(body)
        nexts = []
        for c, _ in carries:
            local = [v for v in body.local if v.dtype == c.dtype and _broadcasts_to(v.shape, c.shape)]
            if local:
                v = self.rng.choice(local)
                v = self.bounded(body, v, 100.0) if c.dtype != "i32" else v
                s = self.emit(body, f"add {c.name}, {v.name}", c.shape, c.dtype, c.bound + v.bound, True)
            else:
                one = self.constant(body, 1.0, c.dtype)
                s = self.emit(body, f"sub {c.name}, {one.name}", c.shape, c.dtype, c.bound + 1, True)
            if c.dtype != "i32":
                s = self.emit(body, f"tanh {s.name}", c.shape, c.dtype, 1.0, True)
            elif local:  # never a carry that canonicalize can prove invariant (c + 0): see the note below
                one = self.constant(body, 1, "i32")
                s = self.emit(body, f"add {s.name}, {one.name}", c.shape, c.dtype, s.bound + 1, True)
            nexts.append(s)
        # Known pass bugs the generator keeps clear of (each has its own test elsewhere): a carry
        # passed through unchanged and stacked (canonicalize, tests/filecheck/canonicalize.gir), a
        # product x[t] @ w yielded directly (scan-grad, test_scan_grad.py), an elementwise value
        # read inside a scan and after it (fuse, test_fuse_with_value_captured_by_a_scan).
        candidates = [v for v in body.pool if v not in outer and v.name not in self.products]
        stacked = [self.rng.choice(candidates) for _ in range(self.rng.randint(0, 2))] if candidates else []
        if not carries and not stacked:
            stacked = [candidates[-1]]
        reverse = "reverse " if self.coin() else ""
        length = f"length {steps} " if not seqs or self.rng.randint(0, 3) == 0 else ""
        seq_text = ", ".join(f"{x.name} in {xs.name}" for x, xs in seqs)
        carry_text = ", ".join(f"{c.name} = {init.name}" for c, init in carries)
        results = [Val(self.fresh(), c.shape, c.dtype, c.bound) for c, _ in carries]
        results += [Val(self.fresh(), (steps,) + v.shape, v.dtype, v.bound) for v in stacked]
        pad = "  " * (scope.depth + 1)
        head = f"{pad}{', '.join(r.name for r in results)} = scan {reverse}{length}({seq_text})"
        if carries:
            head += f" carry ({carry_text})"
        scope.lines.append(head + " {")
        scope.lines.extend(body.lines)
        stack_text = f" stack ({', '.join(v.name for v in stacked)})" if stacked else ""
        scope.lines.append(f"{pad}  yield ({', '.join(v.name for v in nexts)}){stack_text}")
        scope.lines.append(f"{pad}}} : {', '.join(r.type for r in results)}")
        scope.pool.extend(results)
        scope.local.extend(results)
        return results[-1]

    def gen_op(self, scope: Scope, kind: str | None = None) -> Val:
        kind = kind or self.rng.choice(self.KINDS)
        return getattr(self, f"gen_{kind}")(scope)

    def program(self) -> str:
        top = Scope(pool=[])
        for _ in range(self.rng.randint(1, 2)):
            self.new_arg(top, self.shape(), self.fdtype)
        # distinct op families per program, so that a few programs cover them all
        for kind in self.rng.sample(self.KINDS, len(self.KINDS))[:self.rng.randint(5, 9)]:
            self.gen_op(top, kind)
        # return the leaves (values no later line reads), so nothing computed is dead
        lines = top.lines
        leaves = []
        for v in top.local:
            word = re.compile(re.escape(v.name) + r"\b")
            first = next(i for i, line in enumerate(lines) if word.search(line))
            if not any(word.search(line) for line in lines[first + 1:]):
                leaves.append(v)
        outs = leaves[-8:]
        sig = ", ".join(f"{a.name}: {a.type}" for a in self.args)
        return "\n".join([f"func @f({sig}) -> ({', '.join(v.type for v in outs)}) {{", *lines,
                          f"  return {', '.join(v.name for v in outs)}", "}", ""])


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return broadcast(shape, target) == tuple(target)
    except ValueError:
        return False


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, bool]:
    """A program from a hypothesis-drawn seed: the generator makes many dependent choices, and
    seeds spread the few examples we can afford evenly over the program space."""
    fdtype = draw(st.sampled_from(["f32", "f64"]))
    gen = ProgramGen(draw(st.integers(0, 2**32 - 1)), fdtype)
    text = gen.program()
    return text, "f32" not in gen.dtypes_seen and all(a.dtype != "f32" for a in gen.args)



def check_generated(device: str, text: str, pure_f64: bool) -> None:
    note(text)
    module = gir.parse(text)
    args = random_inputs(module.functions["f"], 0)
    raw = gir.interpret(module, "f", *args)
    want = gir.jit(text, "f", device="interp")(*args)
    got = gir.jit(text, "f", device=device)(*args)
    for g, w, r in zip(got, want, raw):
        rtol = 1e-10 if pure_f64 and w.dtype == np.float64 else 1e-4
        assert_close(w, r, rtol, "interpreter after the pipeline vs before")
        assert_close(g, w, rtol, f"{device} vs interpreter")


def test_generated_programs(device: str) -> None:
    """Derandomised: the same programs on every run and every backend."""

    @settings(max_examples=60, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def check(program: tuple[str, bool]) -> None:
        check_generated(device, *program)

    check()


# ---------------------------------------------------------------------------------------------
# Arguments, `?` dims, gir.jit on a path


ARGS_PROGRAM = """\
func @f(%x: tensor<3x4xf32>, %n: tensor<4xi32>) -> tensor<3x4xf32> {
  return %x * cast(%n, dtype="f32")
}
"""


def bad_arguments() -> list[tuple[str, tuple, str]]:
    """What every backend rejects (a non-contiguous view is accepted by all: gir.jit copies it
    to C order, tests/test_user_programs.py)."""
    x = np.ones((3, 4), np.float32)
    n = np.arange(4, dtype=np.int32)
    return [
        ("too few", (x,), "missing argument(s) %n"),
        ("too many", (x, n, n), "takes 2 argument"),
        ("dtype", (x.astype(np.float64), n), "%x"),
        ("int dtype", (x, n.astype(np.int64)), "%n"),
        ("shape", (np.ones((4, 3), np.float32), n), "%x"),
        ("rank", (x, n.reshape(2, 2)), "%n"),
        ("ragged list", ([[1.0], [2.0, 3.0]], n), "%x"),  # a rectangular list is converted (driver/calling.py)
        ("object array", (x.astype(object), n), "%x"),
        ("None", (x, None), "%n"),
        ("python scalar", (x, 3), "%n"),
    ]


@pytest.mark.parametrize(("case", "args", "names"), bad_arguments(), ids=[c[0] for c in bad_arguments()])
def test_bad_arguments_raise_gir_error(device: str, case: str, args: tuple, names: str) -> None:
    fn = gir.jit(ARGS_PROGRAM, "f", device=device)
    with pytest.raises(gir.GirArgumentError) as info:
        fn(*args)
    assert names in str(info.value), str(info.value)
    # nothing was broken: the function still runs
    x, n = np.ones((3, 4), np.float32), np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(fn(x, n)[0], x * n)


DYNAMIC = """\
func @f(%x: tensor<?x4xf32>, %w: tensor<4x3xf32>, %b: tensor<3xf32>)
    -> (tensor<3xf32>, tensor<f32>, tensor<?x3xf32>) {
  %h = tanh(%x @ %w + %b)
  return sum(%h, axes=[0]), max(%h), %h
}
"""


def test_dynamic_dims_specialise_per_shape(device: str) -> None:
    """A `?` dim is fixed by the arguments; one compilation per distinct shape; a `?` result
    dim follows the argument's; a dim that is not `?` is still checked."""
    fn = gir.jit(DYNAMIC, "f", device=device)
    oracle = gir.jit(DYNAMIC, "f", device="interp")
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    for rows in (2, 7, 2):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        assert_all_close(fn(x, w, b), oracle(x, w, b), what=f"{rows} rows")
        assert f"tensor<{rows}x4xf32>" in fn.ir
    assert len(fn._compiled) == 2
    with pytest.raises(gir.GirError, match="%x"):
        fn(np.ones((2, 5), np.float32), w, b)


def test_jit_from_a_path(device: str, tmp_path: Path) -> None:
    path = tmp_path / "prog.gir"
    path.write_text(ARGS_PROGRAM)
    x, n = np.ones((3, 4), np.float32), np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(gir.jit(str(path), "f", device=device)(x, n)[0], x * n)


# ---------------------------------------------------------------------------------------------
# The command line

SUMMARY = re.compile(r"^(\w+): shape (\([\d, ]*\)) (\w+) \[(.*)\]$")
"""A result line of `gir run`: its name (driver/results.py), shape, dtype and first values."""


def test_cli_run_device(device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gir run --device D --outputs OUT.npz` equals `--device interp`; a summary line per
    result, named (`loss`, `dwx`, ...)."""
    path = tmp_path / "rnn.gir"
    path.write_text(example("rnn", "small"))
    outs, shapes = {}, {}
    for d in (device, "interp"):
        out = tmp_path / f"{d}.npz"
        assert gir.cli.main(["run", str(path), "--device", d, "--outputs", str(out)]) == 0
        lines = [SUMMARY.match(line) for line in capsys.readouterr().out.splitlines()]
        shapes[d] = [m.group(1, 2, 3) for m in lines if m]
        with np.load(out) as data:
            outs[d] = [data[k] for k in sorted(data.files)]
    assert len(shapes[device]) == 4 and shapes[device] == shapes["interp"], shapes
    assert [s[0] for s in shapes[device]] == ["loss", "dwx", "dwh", "db"]
    assert_all_close(outs[device], outs["interp"], what="gir run outputs")


# ---------------------------------------------------------------------------------------------
# The gpu's kernels for these programs, through numba.cuda's real compiler

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


@pytest.mark.gpu
def test_kernels_compile_to_ptx(tmp_path: Path) -> None:
    """The GPU kernels of this suite's programs: the simulator runs the kernels' source as
    Python; numba.cuda's real compiler (no GPU needed, only NVVM) must also type and compile
    it: every op rule, every dtype and cast, broadcasting, the error flag. Skipped where NVVM
    is missing (pip install 'numba-cuda[cu12]')."""
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")
    dtypes = ["f32", "f64", "i32", "i64", "i1"]
    casts = "".join(f"  %{s}_{d} = cast %{s} : tensor<2x{d}>\n" for s in dtypes for d in dtypes if s != d)
    cast_source = (f"func @f({', '.join(f'%{d}: tensor<2x{d}>' for d in dtypes)}) -> tensor<2x{dtypes[0]}> {{\n"
                   f"{casts}  return %f64_f32\n}}\n")
    bools = [f"func @b{k}(%a: tensor<4xi1>, %b: tensor<4xi1>) -> tensor<4xi1> {{\n  return {e}\n}}\n"
             for k, e in enumerate(["and(or(%a, %b), eq(%a, %b))", "select(%a, %b, ne(%a, %b))",
                                    "max(%a + %b, min(%a * %b, %b))", "lt(%a, %b)"])]
    programs = [(example("rnn", "small"), None), (FLOAT_ELEMENTWISE.replace("DT", "f32"), None),
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
