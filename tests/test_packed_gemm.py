"""gir's own GEMM on a weight packed once per scan (backend/cpu/packed_gemm.py, the `gir-packed`
path).

The kernel alone against NumPy (ragged row blocks and panels, transposed operands, beta 1, k of
1, float32 and float64, the rows split in two calls as OpenBLAS's pool splits them); compiled
programs whose scan GEMMs take the path against the interpreter (a plain loop, a training step,
a left operand that is a transposed view, OpenBLAS limited to one thread while it runs); the
measured path choice offers it only for a loop-invariant weight, and GIR_PACKED_GEMM=0 takes it
away.
"""

from __future__ import annotations

import ctypes
import itertools

import gir
import numpy as np
import pytest
from gir.backend.cpu import blas, llvm_jit, packed_gemm, team
from gir.testing import assert_all_close
from rnn_cases import training_step
from threadpoolctl import threadpool_limits

KERNEL_CASES = [("f32", 32, 1024, 256, False, False, 0.0), ("f32", 7, 37, 5, True, False, 1.0),
                ("f32", 5, 24, 1, False, True, 0.0), ("f32", 1, 3, 9, True, True, 1.0),
                ("f64", 9, 13, 17, False, True, 0.0), ("f64", 4, 12, 3, True, False, 1.0),
                ("f64", 33, 50, 8, False, False, 1.0)]


def _run_kernel(shape: packed_gemm.Shape, a: np.ndarray, b: np.ndarray, c: np.ndarray, split: int) -> None:
    """Packs b and runs blocks [0, split) and [split, blocks) as two calls of the task."""
    engine, pack, task = llvm_jit.packed_functions(shape, 8)
    packed = np.full(shape.packed_bytes // c.itemsize, np.nan, c.dtype)  # padding must be written
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(pack)(
        b.ctypes.data, packed.ctypes.data, shape.n, shape.k)
    assert not np.isnan(packed).any()
    args = (ctypes.c_int64 * 3)(c.ctypes.data, a.ctypes.data, packed.ctypes.data)
    long = ctypes.c_int64
    call = ctypes.CFUNCTYPE(None, long, long, long, ctypes.c_void_p, long, ctypes.c_void_p)(task)
    call(split, 0, 0, ctypes.addressof(args), 0, None)
    call(shape.blocks - split, 0, 0, ctypes.addressof(args), 0, split * 8)
    del engine


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_matches_numpy(case: tuple) -> None:
    dtype, m, n, k, ta, tb, beta = case
    shape = packed_gemm.Shape(dtype, m, n, k, ta, tb, beta)
    np_type = np.float32 if dtype == "f32" else np.float64
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np_type)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np_type)
    c0 = rng.standard_normal((m, n)).astype(np_type)
    want = (a.T if ta else a) @ (b.T if tb else b) + beta * c0
    for split in sorted({0, shape.blocks // 2, shape.blocks}):
        c = c0.copy()
        _run_kernel(shape, a, b, c, split)
        tol = 1e-4 if dtype == "f32" else 1e-12
        np.testing.assert_allclose(c, want, rtol=tol, atol=tol)


def test_measured_caller_matches_numpy_on_both_thread_settings() -> None:
    """blas.gemm_caller's `gir-packed`, as the path is measured: through blas_level1_thread when
    OpenBLAS has two threads, on the calling thread when it is limited to one."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((33, 40)).astype(np.float32), rng.standard_normal((50, 40)).astype(np.float32)
    for limit in (None, 1):
        c = np.zeros((33, 50), np.float32)
        with threadpool_limits(limit):
            call = blas.gemm_caller("gir-packed", "f32", 33, 50, 40, False, True, a, b, c)
            for _ in range(3):
                call()
        np.testing.assert_allclose(c, a @ b.T, rtol=1e-4, atol=1e-4)


LOOP = """
func @f(%xs: tensor<6x{B}x{H}x{T}>, %h0: tensor<{B}x{H}x{T}>, %w: tensor<{H}x{H}x{T}>, %v: tensor<{H}x{H}x{T}>)
    -> (tensor<{B}x{H}x{T}>, tensor<6x{B}x{H}x{T}>) {{
  %h = %h0
  %g = transpose(%h0)
  for %x in %xs {{
    %p = %h @ %w
    %q = transpose(%g) @ transpose(%v)
    %h = tanh(%p + %q + %x)
    %g = transpose(%h) * 0.5
    collect %q into %qs
  }}
  return %h, %qs
}}
"""


@pytest.mark.parametrize("dtype,batch,hidden", [("f32", 5, 37), ("f32", 32, 64), ("f64", 3, 13)])
def test_scan_gemms_on_the_packed_path_match_interpreter(dtype: str, batch: int, hidden: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """h @ w and g^T @ v^T (a transposed left operand, a transposed weight), the weights
    loop-invariant, forced onto the path; odd sizes leave short row blocks and ragged panels;
    OpenBLAS limited to one thread at run time runs the kernel on the calling thread alone."""
    src = LOOP.format(B=batch, H=hidden, T=dtype)
    rng = np.random.default_rng(batch + hidden)
    np_type = np.float32 if dtype == "f32" else np.float64
    shapes = ((6, batch, hidden), (batch, hidden), (hidden, hidden), (hidden, hidden))
    args = [(rng.standard_normal(s) * 0.3).astype(np_type) for s in shapes]
    want = gir.jit(src, "f", device="interp")(*args)
    monkeypatch.setenv("GIR_GEMM_PATH", "gir-packed")
    fn = gir.jit(src, "f")
    for _ in range(2):
        assert_all_close(fn(*args), want, what=f"{dtype} {batch}x{hidden}")
    assert fn.stats.gemm_paths == {"gir-packed": 2}, fn.stats
    assert fn.stats.pack_calls == 2, fn.stats
    with threadpool_limits(1):
        assert_all_close(fn(*args), want, what=f"{dtype} {batch}x{hidden}, one thread")


@pytest.mark.parametrize("model", ["gru", "lstm"])
def test_training_step_on_the_packed_path_matches_interpreter(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    src, args, want = training_step(model, 5, 6, 4, 11)
    monkeypatch.setenv("GIR_GEMM_PATH", "gir-packed")
    fn = gir.jit(src, f"{model}_grads")
    assert_all_close(fn(*args), want, what=model)
    assert fn.stats.gemm_paths.get("gir-packed", 0) == 2, fn.stats  # forward h @ U, backward dG @ U^T
    notes = fn.stats.schedule["packed_gemm"]  # how each one's work is split, for the user
    assert len(notes) == 2 and all(n["row_blocks"] == 2 for n in notes), notes  # batch 6: blocks of 4 rows
    usable = team.level1_entry() is not None
    assert all(n["threads"].startswith("both") == usable for n in notes), notes


def test_offered_only_for_a_loop_invariant_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "gir-packed" in blas._candidates(True)
    assert "gir-packed" not in blas._candidates(False)
    assert "gir-packed" in blas.FAMILIES["openblas"]
    monkeypatch.setenv("GIR_PACKED_GEMM", "0")
    assert "gir-packed" not in blas._candidates(True)
    assert all(p != "gir-packed" for p in blas.model_times("f32", 32, 256, 256, False, False, True))


def test_every_shape_is_a_whole_number_of_panels_and_blocks() -> None:
    for dtype, m, n, k in itertools.product(["f32", "f64"], [1, 4, 5], [1, 24, 25], [1, 7]):
        s = packed_gemm.Shape(dtype, m, n, k, False, False)
        assert s.panels * s.width >= n > (s.panels - 1) * s.width
        assert s.blocks * packed_gemm.MR >= m > (s.blocks - 1) * packed_gemm.MR
        assert s.packed_bytes == s.panels * s.width * k * (4 if dtype == "f32" else 8)


VIEWS_AND_NESTING = {
    # the weight invariant in the inner loop only, written by the outer one: packed per outer step
    "nested": ("""
func @f(%xss: tensor<3x4x5x6xf32>, %w0: tensor<6x6xf32>) -> tensor<3x5x6xf32> {
  %w = %w0
  for %xs in %xss {
    %h = zeros(shape=[5, 6], dtype="f32")
    for %x in %xs {
      %h = tanh(%h @ %w + %x)
    }
    %w = %w * 0.9 + 0.01
    collect %h into %hs
  }
  return %hs
}""", [(3, 4, 5, 6), (6, 6)], 3),
    # views as weights (a strided slice, a transposed slice) and a transposed left operand, m != k
    "views": ("""
func @f(%xs: tensor<3x5x30xf32>, %big: tensor<14x30xf32>, %ut: tensor<8x30xf32>, %h0: tensor<7x5xf32>)
    -> tensor<3x5x30xf32> {
  %w = slice(%big, starts=[0, 0], limits=[14, 30], steps=[2, 1])
  %u = transpose(slice(%ut, starts=[1, 0], limits=[8, 30]))
  %h = %h0
  for %x in %xs {
    %y = tanh(transpose(%h) @ %w + %x)
    %h = transpose(%y @ %u)
    collect %y into %ys
  }
  return %ys
}""", [(3, 5, 30), (14, 30), (8, 30), (7, 5)], 2),
}


@pytest.mark.parametrize("case", sorted(VIEWS_AND_NESTING))
def test_nested_scans_and_view_weights_match_interpreter(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    src, shapes, packs = VIEWS_AND_NESTING[case]
    rng = np.random.default_rng(5)
    args = [(rng.standard_normal(s) * 0.4).astype(np.float32) for s in shapes]
    want = gir.jit(src, "f", device="interp")(*args)
    monkeypatch.setenv("GIR_GEMM_PATH", "gir-packed")
    fn = gir.jit(src, "f")
    assert_all_close(fn(*args), want, what=case)
    assert fn.stats.gemm_paths.get("gir-packed", 0) >= 1 and fn.stats.pack_calls == packs, fn.stats


UNKNOWN_ROWS = """
func @f(%xs: tensor<4x?x9xf32>, %h0: tensor<?x9xf32>, %w: tensor<9x9xf32>) -> tensor<?x9xf32> {
  %h = %h0
  for %x in %xs {
    %h = tanh(%h @ %w + %x)
  }
  return %h
}
"""


def test_unknown_rows_take_the_path_per_specialisation(monkeypatch: pytest.MonkeyPatch) -> None:
    """gir.jit specialises `?` on the arguments: each batch size gets a kernel of its own
    (docs/backend.md, the path's limits)."""
    monkeypatch.setenv("GIR_GEMM_PATH", "gir-packed")
    fn = gir.jit(UNKNOWN_ROWS, "f")
    rng = np.random.default_rng(6)
    for batch in (3, 10):
        args = [rng.standard_normal(s).astype(np.float32) * 0.4 for s in ((4, batch, 9), (batch, 9), (9, 9))]
        assert_all_close(fn(*args), gir.jit(UNKNOWN_ROWS, "f", device="interp")(*args), what=f"batch {batch}")
        assert fn.stats.gemm_paths == {"gir-packed": 1}, fn.stats


def test_quick_tier_leaves_the_kernel_to_the_o3_code(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """Tiered compile with the model's paths (gir-packed for the loop-invariant weights): the
    quick code takes BLAS paths (its compile skips the kernels) and says so; the -O3 code,
    lowered again in the background, takes gir-packed; both give the interpreter's results."""
    from gir.backend.cpu import tiers

    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    monkeypatch.setenv("GIR_LLVM_TIER", "1")
    monkeypatch.delenv("GIR_LLVM_OPT", raising=False)
    # The model's family depends on the machine (with MKL installed it may pick mkl-packed, which
    # has no quick-tier rule); the rule tested here is the OpenBLAS family's.
    from gir.backend.cpu.schedule import gemms
    monkeypatch.setattr(gemms, "choose_family", lambda sites, measured, options: ("openblas", "this test"))
    src, args, want = training_step("gru", 5, 6, 4, 12)
    fn = gir.jit(src, "gru_grads")
    assert_all_close(fn(*args), want, what="quick code")
    if fn.stats.compile.cache != "miss":
        pytest.skip("compiled code came from a cache")
    assert "gir-packed" not in fn.stats.gemm_paths, fn.stats
    assert "quick_tier" in fn.stats.schedule, fn.stats.schedule
    assert tiers.wait_all(60)
    assert_all_close(fn(*args), want, what="-O3 code")  # the call that swaps it in
    assert_all_close(fn(*args), want, what="-O3 code")
    assert fn.stats.gemm_paths.get("gir-packed", 0) == 2, fn.stats
    assert "quick_tier" not in fn.stats.schedule, fn.stats.schedule
