"""CUDA graphs on the GPU backend (backend/gpu/graphs.py): a compiled function captured once and
replayed per call, in Numba's CUDA simulator through simcupy's capture contracts (the same code
path as CuPy's stream capture on a GPU), against the interpreter.

On a machine with a GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs them there.
"""

# ruff: noqa: E741  (I is the input size, as in T, B, I, H)
from __future__ import annotations

import os

import gir
import numpy as np
import pytest
from gir.backend.gpu import graphs
from gpu_support import device_or_skip

DEV = device_or_skip()

pytestmark = pytest.mark.gpu

COUNTS = ("kernel_launches", "gemm_calls", "xp_launches", "copies")


def _new_inputs(args: list[np.ndarray], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(a + 0.1 * rng.standard_normal(a.shape)).astype(a.dtype) for a in args]


def _close(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())), err_msg=what)


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_training_step_replays_one_graph_per_call(model: str) -> None:
    """Call 1 eager (the warm-up), then one graph launch per call, with new inputs each call,
    every result as the interpreter's; the graph does the eager call's device work, no more."""
    from rnn_cases import training_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    interp = gir.jit(src, f"{model}_grads", device="interp")
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(src, f"{model}_grads", device="gpu")
    _close(fn(*args), interp(*args), f"{model} call 1")
    first = fn.stats
    assert first.graph_replays == 0 and first.graph.startswith("eager: the first call"), first.graph
    eager = {k: getattr(first, k) for k in COUNTS}
    assert eager["kernel_launches"] and eager["gemm_calls"]
    for call in range(2, 5):
        new = _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"{model} call {call}")
        s = fn.stats
        assert (s.graph, s.graph_replays, s.host_launches) == ("replayed", 1, 1), (s.graph, s.graph_replays)
        assert {k: getattr(s, k) for k in COUNTS} == eager  # the graph's work, not Python calls
        assert s.per_step == first.per_step
        # One download per result, but one per source for the slices of one GEMM or kernel
        # result that are returned (their source read once, cut on the host: aliasing.py).
        views = fn.compiled.lowering.returned_views
        sources = {x for x, _ in views.values()}
        packs = fn.compiled.lowering.packs  # the arguments of a concat are uploaded as one
        assert s.h2d == len(args) - sum(len(p.args) - 1 for p in packs)
        assert s.d2h == len(interp(*new)) - len(views) + len(sources)


@pytest.mark.parametrize("model", ["rnn", "lstm"])
def test_capture_off_keeps_the_eager_path(model: str) -> None:
    """GIR_GPU_GRAPHS=0: every call eager, the counts per call as pinned in test_gpu_backend."""
    from rnn_cases import training_step
    from test_gpu_backend import STEP_COUNTS, _per_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    interp = gir.jit(src, f"{model}_grads", device="interp")
    with gir.config.override(gpu_graphs=False):
        fn = gir.jit(src, f"{model}_grads", device="gpu")
    for call in range(3):
        new = _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"{model} call {call}")
        s = fn.stats
        assert (s.graph, s.graph_replays) == ("off", 0)
        assert s.host_launches == s.launches == s.kernel_launches + s.gemm_calls + s.xp_launches + s.copies
        got = {d: tuple(c[k] for k in COUNTS) for d, c in _per_step(fn).items()}
        assert got == {d: tuple(float(x) for x in v) for d, v in STEP_COUNTS[model].items()}


COMPUTED_INDEX = """\
func @f(%x: tensor<4x3xf32>, %i: tensor<i32>) -> (tensor<3xf32>) {
  %r = index(%x, %i)
  %y = tanh(%r)
  return %y
}
"""


def test_a_host_read_back_keeps_the_function_eager() -> None:
    """`index` by a computed index reads the index back to the host, which a capture refuses:
    the capture is dropped, the function stays eager (the reason in stats), results right."""
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(COMPUTED_INDEX, "f", device="gpu")
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    for call, i in enumerate([1, 3, 0, 2]):
        (got,) = fn(x, np.array(i, np.int32))
        np.testing.assert_allclose(got, np.tanh(x[i]), rtol=1e-6)
        if call:
            assert fn.stats.graph_replays == 0 and fn.stats.graph.startswith("eager: capture refused"), fn.stats.graph
            assert "capturing" in fn.stats.graph or "capture" in fn.stats.graph


def test_a_run_time_error_is_raised_from_the_graph() -> None:
    """The error flag is reset inside the graph and read after each launch."""
    src = """\
func @f(%a: tensor<4xi32>, %b: tensor<4xi32>) -> (tensor<4xi32>) {
  %q = div(%a, %b)
  return %q
}
"""
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(src, "f", device="gpu")
    a = np.array([4, 6, 8, 9], np.int32)
    fn(a, np.array([1, 2, 4, 3], np.int32))
    (q,) = fn(a, np.array([2, 3, 2, 3], np.int32))
    assert fn.stats.graph == "replayed"
    np.testing.assert_array_equal(q, [2, 2, 4, 3])
    with pytest.raises(gir.GirError, match="division by zero"):
        fn(a, np.array([2, 0, 2, 3], np.int32))
    (q,) = fn(a, np.array([1, 1, 1, 1], np.int32))  # the flag reset by the next replay
    np.testing.assert_array_equal(q, a)


# -- the stand-in's capture contracts (CuPy's) ----------------------------------------------


@pytest.mark.skipif(not DEV.simulated, reason="the stand-in's own contracts")
def test_simcupy_capture_records_and_replays() -> None:
    from gir.backend.gpu import simcupy as xp

    a = xp.asarray(np.ones(3, np.float32))
    out = xp.zeros(3, np.float32)
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        xp.add(a, a, out=out)
        a[...] = out  # recorded, not run: a stays ones until the graph runs
        with pytest.raises(NotImplementedError, match="cuBLAS API during stream capture"):
            xp.matmul(a.reshape(1, 3), a.reshape(3, 1))
        with pytest.raises(xp.CaptureError, match="StreamCaptureUnsupported"):
            a.get()
        with pytest.raises(xp.CaptureError):
            out.set(np.zeros(3, np.float32))
        with pytest.raises(xp.CaptureError, match="Implicit"), xp.NULL_STREAM:
            xp.add(a, a, out=out)
        graph = stream.end_capture()
    np.testing.assert_array_equal(a.get(), 1)
    graph.launch(stream)
    np.testing.assert_array_equal(a.get(), 2)
    graph.launch(stream)
    np.testing.assert_array_equal(a.get(), 4)


LAYOUTS = ["plain", "a_transposed", "b_transposed", "both_transposed", "column_slices", "row_of_one"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_c_api_gemm_translation(layout: str, dtype: type) -> None:
    """graphs.gemm_call's row-major -> column-major translation, run through cuBLAS's C API
    call (the simulator's stand-in for it on host memory; cuBLAS itself on a GPU), against
    NumPy, for the strided views the backend hands a GEMM."""
    rng = np.random.default_rng(7)
    m, k, n = (1, 4, 3) if layout == "row_of_one" else (5, 4, 3)
    host_a = rng.standard_normal((k, m) if layout in ("a_transposed", "both_transposed") else (m, k)).astype(dtype)
    host_b = rng.standard_normal((n, k) if layout in ("b_transposed", "both_transposed") else (k, 2 * n)).astype(dtype)
    xp = DEV.xp
    a, b = xp.asarray(host_a), xp.asarray(host_b)
    if layout in ("a_transposed", "both_transposed"):
        a, host_a = a.T, host_a.T
    if layout in ("b_transposed", "both_transposed"):
        b, host_b = b.T, host_b.T
    else:
        b, host_b = b[:, n:], host_b[:, n:]  # column slices: rows strided, columns contiguous
    out = xp.zeros((m, n), dtype)
    stream = xp.cuda.Stream(non_blocking=True)
    blas = graphs.c_api_blas(DEV, int(stream.ptr))
    with stream:
        blas.gemm(np.dtype(dtype), graphs.gemm_call(a, b, out, DEV.address))
    np.testing.assert_allclose(out.get(), host_a @ host_b, rtol=1e-5)


def test_gemm_call_refuses_what_cublas_cannot_take() -> None:
    xp = DEV.xp
    a = xp.zeros((2, 3, 4), np.float32)
    with pytest.raises(graphs.CaptureRefused, match="batched"):
        graphs.gemm_call(a, xp.zeros((2, 4, 5), np.float32), xp.zeros((2, 3, 5), np.float32), DEV.address)
    strided = xp.zeros((6, 8), np.float32)[::2, ::2]
    with pytest.raises(graphs.CaptureRefused, match="strides"):
        graphs.gemm_call(strided, xp.zeros((4, 2), np.float32), xp.zeros((3, 2), np.float32), DEV.address)


# -- bench/rnn.py --device gpu: argument handling (the run itself needs a GPU) -----------------


def test_bench_rnn_gpu_arguments_and_a_clear_failure_without_a_gpu() -> None:
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench" / "rnn.py"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    shown = subprocess.run([sys.executable, str(bench), "--device", "gpu", "--help"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "{cpu,gpu,auto}" in shown.stdout and "L (T=100 B=256 1024)" in shown.stdout
    if not DEV.simulated:
        pytest.skip("a GPU is here: bench/gpu_check.sh runs the benchmark itself")
    run = subprocess.run([sys.executable, str(bench), "--device", "gpu", "--quick"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 2 and "--device gpu: no GPU for gir's GPU backend here" in run.stderr, run.stderr
    auto = subprocess.run([sys.executable, str(bench), "--device", "auto", "--sizes", "L"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert auto.returncode == 2 and "device: cpu" in auto.stdout and "--sizes: unknown L" in auto.stderr


# -- a cell cuDNN does not offer: the peephole LSTM (examples/peephole_lstm.gir) --------------


def _peephole(T: int, B: int, I: int, H: int, dtype: str = "f32") -> tuple[str, list[np.ndarray], object]:
    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    src = rnn.gir_source("peephole", T, B, I, H).replace("f32>", f"{dtype}>")
    p = rnn.make_inputs("peephole", T, B, I, H, 3)
    np_dtype = np.float32 if dtype == "f32" else np.float64
    return src, [p["xs"].astype(np_dtype)] + [p[n].astype(np_dtype) for n in rnn.param_names("peephole")], rnn


def test_peephole_example_on_the_cpu_and_the_gpu_against_the_interpreter() -> None:
    """examples/peephole_lstm.gir on the CPU backend, and shrunk on the GPU (graph path, new
    inputs per call), equal the interpreter's loss and gradients."""
    from pathlib import Path

    from rnn_cases import bench_module

    rnn = bench_module("rnn")
    text = (Path(__file__).resolve().parent.parent / "examples" / "peephole_lstm.gir").read_text()
    p = rnn.make_inputs("peephole", 20, 8, 16, 32, 1)
    args = [p["xs"]] + [p[n] for n in rnn.param_names("peephole")]
    want = gir.jit(text, "peephole_grads", device="interp")(*args)
    assert len(want) == 1 + len(rnn.param_names("peephole"))
    _close(gir.jit(text, "peephole_grads", device="cpu")(*args), want, "peephole on the cpu")
    src, small, _ = _peephole(3, 2, 3, 4)
    interp = gir.jit(src, "peephole_grads", device="interp")
    fn = gir.jit(src, "peephole_grads", device="gpu")
    for call in range(3):
        new = _new_inputs(small, call)
        _close(fn(*new), interp(*new), f"peephole on the gpu, call {call + 1}")
    assert fn.stats.graph == "replayed" and fn.stats.graph_replays == 1


def test_peephole_gradients_against_finite_differences_and_the_benchmarks_cell() -> None:
    """float64: gir's peephole gradients against central differences of its loss; and the
    benchmark's peer form of the cell (bench/rnn.py `cell`, which JAX and PyTorch run) gives
    gir's loss."""
    from types import SimpleNamespace

    src, args, rnn = _peephole(4, 2, 3, 5, "f64")
    names = rnn.param_names("peephole")
    loss_fn = gir.jit(src, "peephole_loss", device="interp")
    grads = gir.jit(src, "peephole_grads", device="cpu")(*args)
    rng = np.random.default_rng(0)
    for name in ("p_i", "p_f", "p_o", "c0", "u_f"):
        k = names.index(name)
        flat = rng.integers(args[1 + k].size)
        eps = 1e-6

        def at(delta: float, k: int = k, flat: int = flat) -> float:
            moved = [a.copy() for a in args]
            moved[1 + k].reshape(-1)[flat] += delta
            return float(loss_fn(*moved)[0])

        fd = (at(eps) - at(-eps)) / (2 * eps)
        assert abs(grads[1 + k].reshape(-1)[flat] - fd) < 1e-6 * max(1.0, abs(fd)), (name, fd)
    f = rnn.fuse("peephole", dict(zip(["xs", *names], args)))
    T, B, I = f["xs"].shape
    H = f["h0"].shape[1]
    m = SimpleNamespace(tanh=np.tanh, sigmoid=lambda v: 1 / (1 + np.exp(-v)), dot=np.dot)
    A = (f["xs"].reshape(T * B, I) @ f["Wx"] + f["b"]).reshape(T, B, -1)
    h, c, loss = f["h0"], f["c0"], 0.0
    for t in range(T):
        h, c = rnn.cell(m, "peephole", H, A[t], h, c, f["U"], None, tuple(f[n] for n in rnn.PEEPHOLES))
        loss += float((h * h).sum())
    assert abs(loss - float(grads[0])) < 1e-10 * max(1.0, abs(loss))


SOFTMAX_LOSS = """\
func @f(%logits: tensor<4x5xf32>, %onehot: tensor<4x5xf32>, %w: tensor<5x5xf32>) -> (tensor<f32>, tensor<4xf32>) {
  %z = %logits @ transpose(%w)
  %l = sum(logsumexp(%z, axes=[1]) - sum(%z * %onehot, axes=[1]))
  %m = reduce_max %z {axes = [1]} : tensor<4xf32>
  return %l, %m
}
"""


def test_cupy_reductions_and_transposed_gemms_replay() -> None:
    """CuPy-level work inside the graph (logsumexp's parts, a max reduction: new arrays made
    while capturing and kept alive with the graph) and a GEMM on a transposed view through the
    C-API path: replays equal the interpreter with new inputs each call."""
    interp = gir.jit(SOFTMAX_LOSS, "f", device="interp")
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(SOFTMAX_LOSS, "f", device="gpu")
    rng = np.random.default_rng(5)
    onehot = np.eye(5, dtype=np.float32)[[0, 3, 1, 4]]
    for call in range(4):
        args = [rng.standard_normal((4, 5)).astype(np.float32), onehot, rng.standard_normal((5, 5)).astype(np.float32)]
        _close(fn(*args), interp(*args), f"call {call + 1}")
        if call:
            assert fn.stats.graph == "replayed" and fn.stats.xp_launches > 0 and fn.stats.gemm_calls == 1


def test_libcublas_lookup_says_what_is_missing() -> None:
    """Without a libcublas, the C-API path refuses with the install hint (and the function
    stays eager); with one, it exports the entry points the capture path calls."""
    try:
        lib = graphs._find_libcublas()
    except graphs.CaptureRefused as e:
        assert "no libcublas" in str(e) and "pip install" in str(e)
        return
    for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSgemm_v2", "cublasDgemm_v2"):
        assert hasattr(lib, name), name


def test_host_launches_count_the_results_copied_out_for_device_arguments() -> None:
    """Device-array arguments get device arrays back: on the graph path Python issues the
    argument copies, the graph launch and one copy out per result (`Stats.host_launches`)."""
    from gir.backend.gpu import simcupy

    text = """func @f(%x: tensor<4x3xf32>) -> (tensor<4x3xf32>, tensor<f32>) {
  %y = tanh(%x)
  return %y, sum(%y)
}
"""
    with gir.config.override(gpu_graphs=True):
        fn = gir.jit(text, "f", device="gpu")
    x = simcupy.asarray(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    for _ in range(3):
        y, total = fn(x)
    s = fn.stats
    assert s.graph == "replayed", s.graph
    assert (s.device_arg_copies, s.result_copies, s.host_launches) == (1, 2, 4), s
    np.testing.assert_allclose(y.get(), np.tanh(np.arange(12, dtype=np.float32).reshape(4, 3) / 10), rtol=1e-6)
