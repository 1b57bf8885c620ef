"""Row programs on the GPU backend (backend/gpu/rows.py, kernels.row_source): reductions over the
trailing axis (LayerNorm's mean and variance, softmax's row sum, their gradients' row sums)
computed inside one generated kernel with a block per row, in Numba's CUDA simulator, against
the interpreter; the LayerNorm-LSTM example (examples/layernorm_lstm.gir) on the CPU and the GPU,
its gradients against finite differences in float64, its per-step counts pinned.

On a machine with a GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs them there.
"""

# ruff: noqa: E741  (I is the input size, as in T, B, I, H)
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gir
import numpy as np
import pytest
from gpu_support import device_or_skip

DEV = device_or_skip()

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent
COUNTS = ("kernel_launches", "gemm_calls", "xp_launches", "copies")


def _new_inputs(args: list[np.ndarray], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(a + 0.1 * rng.standard_normal(a.shape)).astype(a.dtype) for a in args]


def _close(got: list[np.ndarray], want: list[np.ndarray], what: str, tol: float = 1e-4) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=tol * max(1.0, float(np.abs(w).max())), err_msg=what)


def _lnlstm(T: int, B: int, I: int, H: int, dtype: str = "f32", seed: int = 3):
    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    src = rnn.gir_source("lnlstm", T, B, I, H).replace("f32>", f"{dtype}>")
    p = rnn.make_inputs("lnlstm", T, B, I, H, seed)
    np_dtype = np.float32 if dtype == "f32" else np.float64
    return src, [p["xs"].astype(np_dtype)] + [p[n].astype(np_dtype) for n in rnn.param_names("lnlstm")], rnn


# -- the LayerNorm-LSTM training step ---------------------------------------------------------


@pytest.mark.parametrize(("dtype", "arena"), [("f32", True), ("f64", False)], ids=["f32-arena", "f64-buffers"])
def test_layernorm_lstm_step_eager_and_replayed_against_the_interpreter(dtype: str, arena: bool) -> None:
    """@lnlstm_grads (T=3, batch 2, input 3, hidden 4) on the GPU: the eager first call and graph
    replays with new inputs equal the interpreter (float32 to 1e-4, float64 to 1e-10)."""
    src, args, _ = _lnlstm(3, 2, 3, 4, dtype)
    interp = gir.jit(src, "lnlstm_grads", device="interp")
    with gir.config.override(gpu_arena=arena, gpu_graphs=True):
        fn = gir.jit(src, "lnlstm_grads", device="gpu")
    tol = 1e-4 if dtype == "f32" else 1e-10
    for call in range(3):
        new = args if call == 0 else _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"call {call + 1}", tol)
    assert fn.stats.graph == "replayed" and fn.stats.graph_replays == 1, fn.stats.graph
    assert fn.stats.memory.startswith("arena" if arena else "a buffer per value"), fn.stats.memory


def test_layernorm_lstm_per_step_counts_and_programs() -> None:
    """Per time step: forward 2 kernels (the row program: every gate's LayerNorm and the cell's;
    the grid total of the loss) and 1 GEMM, backward 2 kernels (the row program, the bias and
    gain gradient accumulations) and 1 GEMM; no xp launch and no copy in either (each LayerNorm
    was 2 CuPy reductions forward and 2 backward, and the backward broadcast copies, before).
    The decision is printed (RowProgram.describe) and the kernels are row kernels."""
    src, args, _ = _lnlstm(3, 2, 3, 4)
    fn = gir.jit(src, "lnlstm_grads", device="gpu")
    fn(*args)
    forward, backward = (fn.stats.per_step[k] for k in sorted(fn.stats.per_step, key=lambda k: "reverse" in k))
    assert {k: forward[k] for k in COUNTS} == {"kernel_launches": 2, "gemm_calls": 1, "xp_launches": 0, "copies": 0}
    assert {k: backward[k] for k in COUNTS} == {"kernel_launches": 2, "gemm_calls": 1, "xp_launches": 0,
                                                "copies": 0}
    low = fn.compiled.lowering
    programs = low.row_programs
    assert len(programs) == 2, [p.describe() for p in programs]
    forward_program = programs[0]
    assert forward_program.rows == 2 and len(forward_program.reductions) == 10  # 5 LayerNorms x (mean, var)
    assert "row program: 2 rows" in forward_program.describe() and "mean over 4" in forward_program.describe()
    assert len(programs[1].reductions) == 10  # backward: per LayerNorm two row sums of products
    rows = [k.source for k in low.kernels if k.source.row_blocks]
    assert len(rows) == 2 and all("for row in range(cuda.blockIdx.x, n, cuda.gridDim.x):" in k.text for k in rows)
    assert all("cuda.syncthreads()" in k.text and "sm_f32" in k.text for k in rows)
    # Each program's 10 reductions in fewer trees (codegen._stages): forward the four gates'
    # means side by side, then their variances, then the cell's mean and variance; backward likewise.
    assert [k.text.count("while s > 0:") for k in rows] == [4, 4], [k.text for k in rows]


def test_layernorm_lstm_persistent_scans_run_the_row_kernels(tmp_path: Path) -> None:
    """With GIR_GPU_PERSISTENT=on the forward and backward loops (no xp launch per step left) are
    each one persistent kernel with the row programs as phases: the interpreter's results; both
    kernels through the real compiler to PTX (skipped without NVVM)."""
    from gir.backend.gpu import persistent
    from test_gpu_persistent import PTX

    src, args, _ = _lnlstm(3, 2, 3, 4)
    with gir.config.override(gpu_persistent="on"):
        fn = gir.jit(src, "lnlstm_grads", device="gpu")
        _close(fn(*args), gir.jit(src, "lnlstm_grads", device="interp")(*args), "persistent")
    assert len(fn.stats.persistent) == 2, fn.stats.persistent
    assert all(path.startswith("persistent") for path in fn.stats.persistent.values()), fn.stats.persistent
    sources = {k.source.text: k.source.signature for k in fn.compiled.lowering.kernels
               if isinstance(k, persistent.PersistentKernel)}
    assert len(sources) == 2 and all("for p1_row in range(" in t or "_row in range(" in t for t in sources)
    listing = tmp_path / "kernels.json"
    listing.write_text(json.dumps(sorted(sources.items())))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", PTX, str(listing)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    if done.stdout.startswith("NO NVVM"):
        pytest.skip(done.stdout.strip())
    assert done.stdout.strip() == f"PTX OK {len(sources)}", done.stdout


# -- row programs on their own ------------------------------------------------------------------

LAYERNORM = """\
func @f(%x: tensor<3x5xDT>, %g: tensor<5xDT>, %b: tensor<5xDT>) -> (tensor<3x5xDT>, tensor<3x1xDT>) {
  %m = mean(%x, axes=[-1], keepdims=true)
  %d = %x - %m
  %v = mean(%d * %d, axes=[-1], keepdims=true)
  return %d / sqrt(%v + 1e-5) * %g + %b, %m
}
"""
"""LayerNorm of an argument (the program starts at its mean); the mean also returned."""

LAYERNORM_GRADS = """\
func @loss(%x: tensor<3x5xDT>, %g: tensor<5xDT>, %w: tensor<3x5xDT>) -> tensor<DT> {
  %y = tanh(%x * 1.5)
  %m = mean(%y, axes=[1], keepdims=true)
  %d = %y - %m
  %v = mean(%d * %d, axes=[1], keepdims=true)
  %n = %d / sqrt(%v + 1e-5) * %g
  return sum(%n * %n * %w)
}

func @grads(%x: tensor<3x5xDT>, %g: tensor<5xDT>, %w: tensor<3x5xDT>)
    -> (tensor<DT>, tensor<3x5xDT>, tensor<5xDT>) {
  %l, %dx, %dg = grad @loss(%x, %g, %w) wrt (%x, %g)
  return %l, %dx, %dg
}
"""
"""LayerNorm's gradient through autodiff: row sums of products, reshapes and broadcasts."""

SOFTMAX_3D = """\
func @f(%x: tensor<2x3x4xDT>, %s: tensor<4xDT>) -> (tensor<2x3x4xDT>, tensor<2x3xDT>) {
  %e = exp(%x * %s - 1.0)
  %z = sum(%e, axes=[2], keepdims=true)
  %n = sum(%e * %e, axes=[-1])
  return %e / %z, sqrt(%n)
}
"""
"""Rows of a 3-D value (2 x 3 rows of 4): a keepdims sum read by a group of the value's shape,
a plain sum read by a group of the rows' shape."""

VIEWS_RETURNED = """\
func @f(%x: tensor<3x4xDT>) -> (tensor<3x4xDT>, tensor<3x4xDT>, tensor<3x1xDT>) {
  %e = exp(%x * 0.5)
  %s = sum(%e, axes=[1])
  %r = reshape %s {shape = [3, 1]} : tensor<3x1xDT>
  %b = broadcast %r {shape = [3, 4]} : tensor<3x4xDT>
  return %e / %b, %b, %r
}
"""
"""A row sum's reshape and broadcast read in place by the program and also returned (their own
steps after it: a view, a broadcast copy)."""

SOFTMAX_MAX = """\
func @rows(%x: tensor<3x6xDT>, %w: tensor<3x6xDT>) -> (tensor<3x6xDT>, tensor<3x1xDT>, tensor<3x1xDT>) {
  %m = max(%x, axes=[-1], keepdims=true)
  %e = exp(%x - %m)
  return %e / sum(%e, axes=[-1], keepdims=true), min(%x * %w, axes=[-1], keepdims=true), %m
}

func @loss(%x: tensor<3x6xDT>, %w: tensor<3x6xDT>) -> tensor<DT> {
  %m = max(%x, axes=[-1], keepdims=true)
  %e = exp(%x - %m)
  %p = %e / sum(%e, axes=[-1], keepdims=true)
  %lo = min(%x * %w, axes=[-1], keepdims=true)
  return sum(%p * %w) + sum(%lo * %lo)
}

func @grads(%x: tensor<3x6xDT>, %w: tensor<3x6xDT>) -> (tensor<DT>, tensor<3x6xDT>) {
  %l, %dx = grad @loss(%x, %w) wrt (%x)
  return %l, %dx
}
"""
"""A numerically stable softmax: its row max, its row sum, a row min, and their gradients."""

NOT_ROWS = """\
func @f(%x: tensor<2x3x4xDT>) -> (tensor<2x3x4xDT>, tensor<2xDT>, tensor<3x4xDT>) {
  %y = %x * 2.0
  %a = sum(%y, axes=[1, 2])
  %m = reduce_max %y {axes = [0]} : tensor<3x4xDT>
  return %y + 1.0, %a + 1.0, %m * 3.0
}
"""
"""A sum over two trailing axes of a value made by a group (rows: all axes but the last) and a
max over a leading axis: no row program (xp reductions), still right."""

PROGRAMS = {"layernorm": (LAYERNORM, "f", 0, 1, 0), "layernorm_grads": (LAYERNORM_GRADS, "grads", 2, 1, 0),
            "softmax_3d": (SOFTMAX_3D, "f", 0, 1, 0), "views_returned": (VIEWS_RETURNED, "f", 0, 1, 1),
            "softmax_max": (SOFTMAX_MAX, "grads", None, None, None)}
"""name -> (source, entry, xp launches, kernel launches, copies: the returned broadcast's; None:
not pinned). The
gradient's 2 xp launches are the loss's whole sum and the gain's column sum, read by `return`
(not row reductions, not folded): the whole LayerNorm and its gradient, every row sum, are one
kernel."""


def _args(source: str, entry: str, seed: int) -> list[np.ndarray]:
    from gir.ir.interpreter import random_inputs

    return random_inputs(gir.parse(source).functions[entry], seed)


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "buffers"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_row_programs_against_the_interpreter(name: str, dtype: str, arena: bool) -> None:
    """Each program's row reductions inside its kernels (no xp launch), eager and replayed from a
    CUDA graph with new inputs, equal to the interpreter, arena on and off, f32 and f64."""
    text, entry, xp, kernels, copies = PROGRAMS[name]
    source = text.replace("DT", dtype)
    interp = gir.jit(source, entry, device="interp")
    with gir.config.override(gpu_arena=arena, gpu_graphs=True):
        fn = gir.jit(source, entry, device="gpu")
    tol = 1e-4 if dtype == "f32" else 1e-10
    for call in range(3):
        args = _args(source, entry, call)
        _close(fn(*args), interp(*args), f"{name} call {call + 1}", tol)
        if xp is not None:
            assert (fn.stats.xp_launches, fn.stats.kernel_launches, fn.stats.copies) == (xp, kernels, copies), \
                fn.stats
    assert fn.stats.graph == "replayed"
    assert fn.compiled.lowering.row_programs


def test_layernorm_and_its_gradient_are_one_row_program() -> None:
    """LayerNorm and its gradient (autodiff's row sums of products, reshapes to keepdims,
    broadcasts back over the row): one row kernel, its reshapes and broadcasts read in place (no
    copy), every row sum a phase of it."""
    source = LAYERNORM_GRADS.replace("DT", "f32")
    fn = gir.jit(source, "grads", device="gpu")
    fn(*_args(source, "grads", 0))
    programs = fn.compiled.lowering.row_programs
    names = {op.name for p in programs for op in p.ops}
    assert len(programs) == 1 and {"broadcast", "reshape"} <= names, [p.describe() for p in programs]
    assert len(programs[0].reductions) == 4  # mean, variance; two row sums of the gradient
    assert fn.stats.kernel_launches == 1 and fn.stats.copies == 0, fn.stats


TWO_NORMS = """\
func @f(%x: tensor<3x8xDT>, %y: tensor<3x8xDT>) -> (tensor<3x8xDT>, tensor<3x8xDT>) {
  %a = %x * 2.0
  %b = tanh(%y)
  %ma = mean(%a, axes=[-1], keepdims=true)
  %mb = mean(%b, axes=[-1], keepdims=true)
  %da = %a - %ma
  %db = %b - %mb
  %va = mean(%da * %da, axes=[-1], keepdims=true)
  %vb = mean(%db * %db, axes=[-1], keepdims=true)
  return %da / sqrt(%va + 1e-5), %db / sqrt(%vb + 1e-5)
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_independent_layernorms_share_stages_and_trees(dtype: str) -> None:
    """Two LayerNorms side by side (a gate's and another's): one row kernel in three stages
    (codegen._stages: the operands and their means; `x - mean`, the variances and, after their
    tree, on thread 0, each row's `sqrt(var + eps)`; the normalised values), the two means one
    tree and the two variances one tree, each accumulated in the loop computing its operand (a
    thread reads back what it wrote); the interpreter's results. Before, eight phases with a
    barrier each."""
    source = TWO_NORMS.replace("DT", dtype)
    interp = gir.jit(source, "f", device="interp")
    fn = gir.jit(source, "f", device="gpu")
    for call in range(2):
        args = _args(source, "f", call)
        _close(fn(*args), interp(*args), f"call {call + 1}", 1e-4 if dtype == "f32" else 1e-10)
    (row,) = [k.source.text for k in fn.compiled.lowering.kernels if k.source.row_blocks]
    assert fn.stats.kernel_launches == 1 and fn.stats.xp_launches == 0, fn.stats
    assert row.count("while s > 0:") == 2 and row.count("for i in range(") == 4, row
    assert row.count("cuda.syncthreads()") == 2 * 2 + 3, row  # per tree: before it, each level; per stage: after


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_reductions_that_are_not_row_reductions_stay_xp_calls(dtype: str) -> None:
    """Sums over two trailing axes and maxima are no row program (xp reductions), and right."""
    source = NOT_ROWS.replace("DT", dtype)
    args = _args(source, "f", 0)
    fn = gir.jit(source, "f", device="gpu")
    _close(fn(*args), gir.jit(source, "f", device="interp")(*args), "not rows", 1e-4 if dtype == "f32" else 1e-10)
    assert fn.stats.xp_launches == 2 and not fn.compiled.lowering.row_programs, fn.stats


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_row_max_and_min_propagate_nan(dtype: str) -> None:
    """A row max and min inside the kernel: a NaN anywhere in a row gives that row NaN (as the
    interpreter's NumPy), the other rows their values; the softmax and its gradient are right."""
    source = SOFTMAX_MAX.replace("DT", dtype)
    args = _args(source, "rows", 0)
    args[0][1, 3] = np.nan
    fn = gir.jit(source, "rows", device="gpu")
    got, want = fn(*args), gir.jit(source, "rows", device="interp")(*args)
    for k in (1, 2):
        assert np.isnan(got[k][1, 0]) and np.isnan(want[k][1, 0]) and not np.isnan(got[k][[0, 2]]).any()
    _close(got, want, "nan", 1e-4 if dtype == "f32" else 1e-10)
    assert [len(p.reductions) for p in fn.compiled.lowering.row_programs] == [3], fn.stats
    assert (fn.stats.xp_launches, fn.stats.kernel_launches) == (0, 1), fn.stats


def test_every_row_kernel_compiles_to_ptx(tmp_path: Path) -> None:
    """Every row kernel (the LayerNorm-LSTM step's, f32 and f64, forward and backward; the small
    programs') through numba.cuda's real compiler, in a process without the simulator, each
    compiled once; a row kernel's loads must be coherent. Skipped where
    NVVM/NVRTC is missing."""
    from test_gpu_backend import assert_compiles_to_ptx

    sources: dict[str, str] = {}
    for dtype in ("f32", "f64"):
        src, args, _ = _lnlstm(3, 2, 3, 4, dtype)
        fns = [gir.jit(src, "lnlstm_grads", device="gpu")]
        for text, entry, *_ in PROGRAMS.values():
            fns.append(gir.jit(text.replace("DT", dtype), entry, device="gpu"))
        for fn in fns:
            for k in fn.compiled.lowering.kernels:
                sources[k.source.text] = k.source.signature
    assert sum("for row in range(cuda.blockIdx.x" in text for text in sources) >= 6
    # A row kernel reads back, after a barrier, what its earlier phases wrote through another
    # parameter (the same memory): numba-cuda marks no parameter noalias, so the compiler does
    # not use the read-only cache's `ld.global.nc` for it; this checks it stays so.
    assert_compiles_to_ptx(sources, tmp_path, coherent="for row in range(cuda.blockIdx.x")


# -- examples/layernorm_lstm.gir --------------------------------------------------------------


def test_layernorm_lstm_example_on_the_cpu_and_the_gpu_against_the_interpreter() -> None:
    """examples/layernorm_lstm.gir on the CPU backend at its size, and shrunk on the GPU (graph
    path, new inputs per call), equal the interpreter's loss and gradients."""
    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    text = (REPO / "examples" / "layernorm_lstm.gir").read_text()
    assert text.split("\n", 14)[-1] == rnn.gir_source("lnlstm", 20, 8, 16, 32).split("\n", 1)[1]
    p = rnn.make_inputs("lnlstm", 20, 8, 16, 32, 1)
    args = [p["xs"]] + [p[n] for n in rnn.param_names("lnlstm")]
    want = gir.jit(text, "lnlstm_grads", device="interp")(*args)
    assert len(want) == 1 + len(rnn.param_names("lnlstm"))
    _close(gir.jit(text, "lnlstm_grads", device="cpu")(*args), want, "lnlstm on the cpu")
    src, small, _ = _lnlstm(3, 2, 3, 4)
    interp = gir.jit(src, "lnlstm_grads", device="interp")
    fn = gir.jit(src, "lnlstm_grads", device="gpu")
    for call in range(3):
        new = _new_inputs(small, call)
        _close(fn(*new), interp(*new), f"lnlstm on the gpu, call {call + 1}")
    assert fn.stats.graph == "replayed" and fn.stats.graph_replays == 1


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_layernorm_lstm_gradients_against_finite_differences(device: str) -> None:
    """float64: gir's LayerNorm-LSTM gradients (every gain, the cell's shift, a recurrent
    weight, the initial states) against central differences of the interpreter's loss."""
    src, args, rnn = _lnlstm(4, 2, 3, 5, "f64")
    names = rnn.param_names("lnlstm")
    loss_fn = gir.jit(src, "lnlstm_loss", device="interp")
    grads = gir.jit(src, "lnlstm_grads", device=device)(*args)
    rng = np.random.default_rng(0)
    for name in ("a_i", "a_f", "a_g", "a_o", "a_c", "b_c", "b_o", "u_f", "w_g", "h0", "c0"):
        k = names.index(name)
        flat = int(rng.integers(args[1 + k].size))
        eps = 1e-6

        def at(delta: float, k: int = k, flat: int = flat) -> float:
            moved = [a.copy() for a in args]
            moved[1 + k].reshape(-1)[flat] += delta
            return float(loss_fn(*moved)[0])

        fd = (at(eps) - at(-eps)) / (2 * eps)
        assert abs(np.asarray(grads[1 + k]).reshape(-1)[flat] - fd) < 1e-6 * max(1.0, abs(fd)), (name, fd)


def test_the_benchmarks_layernorm_cell_gives_girs_loss() -> None:
    """bench/rnn.py's peer form of the cell (`cell` with m.norm, which JAX runs; PyTorch's is
    the same with F.layer_norm) in NumPy, float64, gives gir's loss."""
    src, args, rnn = _lnlstm(4, 2, 3, 5, "f64")
    names = rnn.param_names("lnlstm")
    loss = float(gir.jit(src, "lnlstm_loss", device="cpu")(*args)[0])
    f = rnn.fuse("lnlstm", dict(zip(["xs", *names], args)))
    T, B, I = f["xs"].shape
    H = f["h0"].shape[1]
    m = SimpleNamespace(tanh=np.tanh, sigmoid=lambda v: 1 / (1 + np.exp(-v)), dot=np.dot, norm=rnn.layer_norm)
    A = (f["xs"].reshape(T * B, I) @ f["Wx"]).reshape(T, B, -1)  # no bias: it comes after the norm
    h, c, want = f["h0"], f["c0"], 0.0
    for t in range(T):
        h, c = rnn.cell(m, "lnlstm", H, A[t], h, c, f["U"], None, rnn.extras("lnlstm", f))
        want += float((h * h).sum())
    assert abs(loss - want) < 1e-10 * max(1.0, abs(want))
