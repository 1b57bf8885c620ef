"""What only the GPU backend has (numba.cuda kernels, xp GEMMs, host-driven scans): its
kernels and its device. Everything both backends do is in tests/test_backend_conformance.py,
run on `cpu` and `gpu` against the interpreter, the oracle.

Without a GPU everything runs in Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM is set to 1 by
tests/conftest.py, before numba is imported, unless it is already set. On a machine with a
GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs the same tests on it.

- Kernels: generated source (grid-stride loop, broadcasting by index arithmetic, math.tanh),
  compiled once per distinct source; without the fuse pass, a kernel per elementwise op.
- Arguments: a non-contiguous view is copied to the device.
- Without a GPU and without the simulator, device="gpu" and `gir run --device gpu` say so.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.gpu import kernels
from gir.backend.gpu.device import NO_GPU
from gir.driver.jit import JitFunction
from gir.ir.interpreter import random_inputs
from gpu_support import device_or_skip

DEVICE = device_or_skip()

pytestmark = [pytest.mark.gpu]

REPO = Path(__file__).resolve().parent.parent
SMALL_RNN = [("50x32x256", "3x2x4"), ("32x256", "2x4"), ("256x256", "4x4"), ("<256x", "<4x")]
"""examples/rnn.gir at T=3, batch 2, hidden 4 (the simulator runs a CUDA thread as a Python thread)."""


def small_rnn() -> str:
    text = (REPO / "examples" / "rnn.gir").read_text()
    for old, new in SMALL_RNN:
        text = text.replace(old, new)
    assert "256" not in text
    return text


def assert_matches_interpreter(source: str, entry: str, args: list[np.ndarray], **jit: str) -> JitFunction:
    """@entry on the gpu (gir.jit options **jit) equals the interpreter to 1e-5 (float32)."""
    want = gir.jit(source, entry, device="interp")(*args)
    fn = gir.jit(source, entry, device="gpu", **jit)
    for g, w in zip(fn(*args), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    return fn


# ---------------------------------------------------------------------------------------------
# Kernels


def test_rnn_kernel_source_and_cache() -> None:
    """rnn_loss's step is one fused kernel: a grid-stride loop, the bias broadcast by index
    arithmetic, math.tanh; compiling the function again compiles no new kernel."""
    text = small_rnn()
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
    fn = assert_matches_interpreter(source, "f", [x, b], pipeline="ssa,canonicalize")
    assert fn.stats.kernel_launches == 5, fn.stats


# ---------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize("view", ["transposed", "strided"])
def test_non_contiguous_view_is_copied(view: str) -> None:
    """Arguments are copied to the device, so a view is as good as an array (the CPU backend,
    whose gir.jit copies it to C order first: tests/test_cpu_backend.py)."""
    source = "func @f(%x: tensor<3x4xf32>, %n: tensor<4xi32>) -> tensor<3x4xf32> {\n" \
             "  return %x * cast(%n, dtype=\"f32\")\n}\n"
    x = np.arange(12, dtype=np.float32).reshape(4, 3).T if view == "transposed" else \
        np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]
    assert not x.flags.c_contiguous
    assert_matches_interpreter(source, "f", [x, np.arange(4, dtype=np.int32)])


# ---------------------------------------------------------------------------------------------
# No GPU at all


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


# ---------------------------------------------------------------------------------------------
# The simulator goes through CuPy's contracts (backend/gpu/simcupy.py), as a GPU does


def test_the_simulator_uses_the_cupy_stand_in() -> None:
    """In the simulator, xp is simcupy and device arrays are its arrays, not NumPy's: the array
    calls a GPU makes (set, get, asarray) are the ones the simulator runs."""
    if not DEVICE.simulated:
        import cupy

        assert DEVICE.xp is cupy
        return
    from gir.backend.gpu import simcupy

    assert DEVICE.xp is simcupy
    a = DEVICE.empty((2, 3), np.dtype(np.float32))
    assert isinstance(a, simcupy.ndarray) and not isinstance(a, np.ndarray)


def test_device_arrays_keep_cupys_contracts() -> None:
    """What CuPy refuses, the stand-in refuses (and on a GPU, CuPy itself): `set` of another
    shape or dtype, NumPy taking a device array (np.asarray, a ufunc mixing a device array
    and a NumPy array), a NumPy array assigned into a device array; `.get()` is the way back."""
    xp = DEVICE.xp
    d = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="Shape mismatch"):
        d.set(np.zeros((6,), np.float32))
    with pytest.raises(TypeError):
        d.set(np.zeros((2, 3), np.float64))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    with pytest.raises(TypeError):
        np.equal(d, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError):
        d + np.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        d[...] = np.ones((2, 3), np.float32)
    got = (d * 2 + 1).get()  # device arrays and scalars: on the device
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1)
    zero_d = d[1, 2]  # an element is a 0-d device array, not a NumPy scalar
    assert zero_d.shape == () and not isinstance(zero_d, (np.ndarray, np.generic))
    if DEVICE.simulated:  # stricter than CuPy: no hidden read-back
        with pytest.raises(TypeError, match="implicit copy"):
            int(zero_d)


@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_upload_and_to_device_keep_the_shape(shape: tuple[int, ...]) -> None:
    """A 0-d value stays 0-d on the way to the device (np.ascontiguousarray made it (1,), which
    CuPy's `set` refuses); a float64 or non-contiguous host array is cast and packed first."""
    host = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    dst = DEVICE.empty(shape, np.dtype(np.float32))
    DEVICE.upload(dst, host)
    np.testing.assert_array_equal(DEVICE.download(dst), host.astype(np.float32))
    new = DEVICE.to_device(host)
    assert new.shape == shape
    if len(shape) == 2:
        DEVICE.upload(DEVICE.empty((3, 2), np.dtype(np.float32)), host.T)  # a transposed view


ZERO_D = """\
func @f(%s: tensor<f32>, %x: tensor<2x3xf32>) -> (tensor<f32>, tensor<f32>, tensor<1x1xf32>, tensor<3xf32>) {
  %k = constant 2.5 : tensor<f32>
  %m = reduce_max %x : tensor<f32>
  %n = reduce_min %x {axes = [0, 1], keepdims = true} : tensor<1x1xf32>
  %c = reduce_max %x {axes = [0]} : tensor<3xf32>
  %y = %s * %k + %m
  return %y, reduce_min(%x), %n, %c - reduce_min(%x, axes = [0])
}
"""


def test_zero_d_arguments_constants_and_reductions() -> None:
    """0-d arguments and constants, and reduce_max / reduce_min to 0-d, keepdims and one axis:
    on the device as on the interpreter (on a GPU these failed: a 0-d upload, CuPy arrays
    handed to NumPy)."""
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    assert_matches_interpreter(ZERO_D, "f", [np.array(2.0, np.float32), x])


ROW_STACK_PROBE = """\
import importlib, sys
import numpy as np
if hasattr(np, "row_stack"):
    del np.row_stack  # NumPy >= 2.5 as far as numba-cuda can tell
from gir.backend.gpu.device import ROW_STACK_MODULE, numba_cuda_numpy_guard
if sys.argv[1] == "guarded":
    numba_cuda_numpy_guard()
try:
    importlib.import_module(ROW_STACK_MODULE)
except AttributeError as e:
    print("BROKEN:", e)
    sys.exit(0)
print("OK", hasattr(np, "row_stack"))
"""


@pytest.mark.parametrize("guarded", ["guarded", "bare"])
def test_numba_cuda_imports_under_numpy_without_row_stack(guarded: str) -> None:
    """numba-cuda 0.30.4 names np.row_stack, which NumPy 2.5 removed: its typing module fails
    to import (every kernel compile on a GPU failed). The guard (device.py, run when a GPU is
    found) imports it with the name present for the import only: NumPy is left without it.
    The bare import shows the break is still there (when it is fixed upstream, drop the guard)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", ROW_STACK_PROBE, guarded], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    if guarded == "guarded":
        assert done.stdout.strip() == "OK False", done.stdout + done.stderr
    elif done.stdout.startswith("OK"):
        pytest.skip("this numba-cuda no longer needs np.row_stack: the guard can go")
    else:
        assert "row_stack" in done.stdout, done.stdout


def test_gpu_extras_pair_one_cuda_major() -> None:
    """pyproject's gpu extras: each installs numba-cuda and CuPy built for the same CUDA major
    (a CUDA 12 CuPy beside CUDA 13 compiler wheels loads two runtimes); `gpu` is the CUDA 12 set."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gpu"] == extras["gpu-cu12"]
    for major in ("12", "13"):
        deps = extras[f"gpu-cu{major}"]
        assert any(d.startswith(f"numba-cuda[cu{major}]") for d in deps), deps
        assert any(d.startswith(f"cupy-cuda{major}x") for d in deps), deps


# ---------------------------------------------------------------------------------------------
# What a training step costs on the device, counted (not timed): fn.stats.per_step

STEP_COUNTS = {
    # model: {direction: (kernel_launches, gemm_calls, xp_launches, copies) per time step}
    "rnn": {"forward": (1, 1, 0, 0), "reverse": (2, 1, 0, 0)},
    "gru": {"forward": (1, 1, 0, 0), "reverse": (2, 1, 0, 0)},
    "lstm": {"forward": (1, 1, 0, 0), "reverse": (2, 1, 0, 0)},
}
"""Pinned in the simulator at T=3, batch 2, input 3, hidden 4 (the counts do not depend on the
sizes). Measured before this work (kernels, GEMMs, copies per time step, forward and backward
together; CuPy reductions were not counted then): rnn 4 / 2 / 6, gru 10 / 2 / 25, lstm
10 / 2 / 24, and 1 + 4 CuPy reductions per forward + backward step of the gru and lstm.
What took them down (backend/gpu/codegen.py): stack rows written in place and carries swapped
by pointer or double-buffered, a stacked carry and its stacked next value one buffer a row apart
(place_scan); the column slices of the step's GEMM read in place
by the kernels (absorbed slices); concat pieces written in place by their kernels
(claim_pieces; a piece of two concats stored into both); a sum read by one fused kernel
computed inside it (folded reductions); consecutive independent fused ops of one shape (the
bias-gradient accumulations) launched as one kernel (fused_runs); the step's group, the loss
term's sum and the loss accumulation as one kernel (fused_totals: a grid-wide total); groups
reading each other's results at the same index as one kernel (fused_chains); independent groups
of different shapes after the backward GEMM as one kernel over two index ranges (fused_runs)."""


def _per_step(fn: JitFunction) -> dict[str, dict[str, float]]:
    return {label.split(" at ")[0].split()[1]: counts for label, counts in fn.stats.per_step.items()}


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_training_step_counts(model: str) -> None:
    """Per time step and direction: the generated kernels, GEMMs, other xp launches and device
    copies of a training step (forward scan + BPTT), counted where each happens; results as
    the interpreter's. A change that adds work per step fails here."""
    from gir.testing import assert_all_close
    from rnn_cases import training_step

    src, args, want = training_step(model, 3, 2, 3, 4)
    fn = gir.jit(src, f"{model}_grads", device="gpu")
    assert_all_close(fn(*args), want, what=model)
    got = {d: tuple(c[k] for k in ("kernel_launches", "gemm_calls", "xp_launches", "copies"))
           for d, c in _per_step(fn).items()}
    assert got == {d: tuple(float(x) for x in v) for d, v in STEP_COUNTS[model].items()}, got
    assert all(c["graph_replays"] == 0 for c in fn.stats.per_step.values())
    s = fn.stats
    assert s.launches == s.kernel_launches + s.gemm_calls + s.xp_launches + s.copies


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_training_step_meets_the_issue_target(model: str) -> None:
    """Issue 26's per-step targets, in counts: at most 2 launches (GEMM included) per forward
    step, 3 per backward step, 0 copies (the times need a GPU: bench/gpu_check.sh)."""
    from rnn_cases import training_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    fn = gir.jit(src, f"{model}_grads", device="gpu")
    fn(*args)
    steps = _per_step(fn)
    launches = {d: c["kernel_launches"] + c["gemm_calls"] + c["xp_launches"] + c["copies"] for d, c in steps.items()}
    assert launches["forward"] <= 2 and launches["reverse"] <= 3, launches
    assert all(c["copies"] == 0 for c in steps.values()), steps


CARRY_SWAP = """\
func @f(%xs: tensor<4x2xf32>, %a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>) {
  %a.1, %b.1, %ys = scan (%x in %xs) carry (%p = %a, %q = %b) {
    %n = tanh(%p + %x)
    yield (%q, %n) stack (%n)
  } : tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>
  return %a.1, %b.1, %ys
}
"""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_scan_placement_mixes_swaps_stacks_and_copies(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A carry taking another carry's value (copied), one taking a stacked value (a pointer to
    the stack row), in the arena and with a buffer per value: the interpreter's results."""
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    xs = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    fn = assert_matches_interpreter(CARRY_SWAP, "f", [xs, np.array([0.5, -0.5], np.float32),
                                                      np.array([0.1, 0.2], np.float32)])
    (counts,) = fn.stats.per_step.values()
    assert counts["copies"] == 1, counts  # %q into %p; %n is written into its stack row


def test_scan_swapping_two_carries_copies_through_a_temporary() -> None:
    """yield (%q, %p): both carries copied, each through a temporary (each reads the other's
    storage; one temporary would do: 3 copies, not 4)."""
    source = CARRY_SWAP.replace("yield (%q, %n)", "yield (%q, %p)")
    xs = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    fn = assert_matches_interpreter(source, "f", [xs, np.array([0.5, -0.5], np.float32),
                                                  np.array([0.1, 0.2], np.float32)])
    (counts,) = fn.stats.per_step.values()
    assert counts["copies"] == 4, counts


LOWERED_PTX = """\
import json, sys
from numba import cuda
from gir.backend.gpu import kernels
try:
    cuda.compile_ptx(kernels._define(cuda, kernels.generate([], [], [], ()).text).py_func, "void(int64)", cc=(8, 0))
except Exception as e:  # no NVVM / NVRTC: numba-cuda without its [cu12]/[cu13] extra
    print("NO NVVM:", type(e).__name__, e)
    sys.exit(0)
marker = sys.argv[2] if len(sys.argv) > 2 else None
done = coherent = 0
for text, signature in json.load(open(sys.argv[1])):
    code, _ = cuda.compile_ptx(kernels._define(cuda, text).py_func, signature, cc=(8, 0))
    assert ".entry" in code, text
    done += 1
    if marker is not None and marker in text:  # must read through coherent loads (assert_compiles_to_ptx)
        assert "ld.global.nc" not in code, text
        coherent += 1
print("PTX OK", done, *(("COHERENT", coherent) if marker is not None else ()))
"""


def test_every_kernel_a_training_step_launches_compiles_to_ptx(tmp_path: Path) -> None:
    """Every kernel the rnn/gru/lstm training steps launch, as lowered (absorbed slices read
    through their strides included), through numba.cuda's real compiler, in a process without
    the simulator. Skipped where NVVM/NVRTC is missing (pip install 'gir[gpu]')."""
    from rnn_cases import training_step

    sources = {}
    for model in ("rnn", "gru", "lstm"):
        src, args, _ = training_step(model, 3, 2, 3, 4)
        fn = gir.jit(src, f"{model}_grads", device="gpu")
        for k in fn.compiled.lowering.kernels:
            sources[k.source.text] = k.source.signature
    assert any("i * " in t or "c0 * " in t for t in sources)  # strided reads are among them
    assert_compiles_to_ptx(sources, tmp_path)


def assert_compiles_to_ptx(sources: dict[str, str], tmp_path: Path, coherent: str | None = None) -> None:
    """Each kernel source (-> its signature) through numba.cuda's real compiler, in a process
    without the simulator (which runs Python and checks no types). The sources containing
    `coherent` must load only through coherent `ld.global`, never the read-only cache's
    `ld.global.nc` (a kernel reading back what it wrote through another parameter). Skips
    without NVVM/NVRTC."""
    listing = tmp_path / "kernels.json"
    listing.write_text(json.dumps(sorted(sources.items())))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    marker = [coherent] if coherent is not None else []
    done = subprocess.run([sys.executable, "-c", LOWERED_PTX, str(listing), *marker], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    if done.stdout.startswith("NO NVVM"):
        pytest.skip(done.stdout.strip())
    checked = f" COHERENT {sum(coherent in text for text in sources)}" if coherent is not None else ""
    assert done.stdout.strip() == f"PTX OK {len(sources)}{checked}", done.stdout


PIECES = """\
func @f(%a: tensor<2x3xf32>, %b: tensor<3xi32>)
    -> (tensor<2x9xf32>, tensor<3x3xi32>, tensor<2x3xf32>, tensor<3xf32>, tensor<2x6xf32>) {
  %t = tanh %a : tensor<2x3xf32>
  %e = %t * 2.0
  %c = concat %t, %e, %e {axis = 1} : tensor<2x9xf32>
  %m = mul %b, %b : tensor<3xi32>
  %s = stack %m, %b, %m {axis = 0} : tensor<3x3xi32>
  %d = concat %e, %t {axis = 1} : tensor<2x6xf32>
  return %c, %s, %e + 1.0, sum(%t, axes = [0]), %d
}
"""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_concat_and_stack_pieces_written_in_place(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel results written straight into their concat/stack (a value in two results: stored
    into both by its kernel; a value twice in one: the second occurrence copied), read after
    that by a kernel (in place), a reduction (a strided view) and returned: the interpreter's
    results, and only the repeated occurrences and the argument copied."""
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    a = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    fn = assert_matches_interpreter(PIECES, "f", [a, np.array([1, -2, 3], np.int32)], pipeline="ssa,canonicalize")
    assert fn.stats.copies == 3, fn.stats  # %e's second place, %b (an argument), %m's second place


FOLDED = """\
func @f(%x: tensor<5x6xDT>, %w: tensor<6x8xDT>, %acc: tensor<4xDT>, %s: tensor<DT>)
    -> (tensor<4xDT>, tensor<DT>, tensor<1x1xDT>, tensor<6xDT>) {
  %g = matmul %x, %w : tensor<5x8xDT>
  %left = slice %g {limits = [5, 4], starts = [0, 0]} : tensor<5x4xDT>
  %t = tanh(%left)
  %col = %acc + sum(%t, axes = [0])
  %whole = %s + sum(%x * %x)
  %keep = exp(mean(%x, axes = [0, 1], keepdims = true))
  %mid = slice %g {limits = [5, 8], starts = [0, 2]} : tensor<5x6xDT>
  return %col, %whole, %keep, mean(%mid, axes = [0]) * 2.0 + index(%x, 0)
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_reductions_read_by_one_kernel_are_computed_inside_it(dtype: str) -> None:
    """A sum or mean over leading axes read only by one fused kernel: computed in that kernel
    (a column loop, or one block's tree for a whole array; over a contiguous value or a slice
    read in place), no CuPy reduction launched; the interpreter's results."""
    rng = np.random.default_rng(0)
    np_dt = np.float32 if dtype == "f32" else np.float64
    args = [rng.standard_normal(shape).astype(np_dt) for shape in [(5, 6), (6, 8), (4,), ()]]
    fn = assert_matches_interpreter(FOLDED.replace("DT", dtype), "f", args)
    assert fn.stats.xp_launches == 0, fn.stats
    assert any("cuda.shared.array" in k for k in fn.compiled.kernel_sources)


COLUMNS = """\
func @f(%a: tensor<3x4xf32>, %b: tensor<3x4xf32>, %c: tensor<2x3x4xf32>, %d: tensor<4xf32>, %e: tensor<5x8xf32>,
        %w: tensor<8x8xf32>)
    -> tensor<4xf32> {
  %g = matmul %e, %w : tensor<5x8xf32>
  %s = slice %g {limits = [5, 8], starts = [0, 4]} : tensor<5x4xf32>
  %r = %d + sum(%a, axes = [0]) * mean(%b, axes = [0]) - sum(%c, axes = [0, 1]) + sum(%s, axes = [0])
  return %r
}
"""


def test_column_sums_of_one_kernel_share_a_loop_per_row_count(tmp_path: Path) -> None:
    """Column sums read by one kernel (a backward step's bias gradients): one `for r` loop per
    row count, not one each (numba compiles one loop several times faster than ten: a
    LayerNorm-LSTM's gradient kernel 0.58 -> 0.27 s), each sum over its own rows and layout
    (a slice of a GEMM result read in place); the interpreter's results."""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (3, 4), (2, 3, 4), (4,), (5, 8)]]
    fn = assert_matches_interpreter(COLUMNS, "f", args + [rng.standard_normal((8, 8)).astype(np.float32)])
    assert fn.stats.xp_launches == 0, fn.stats
    (source,) = [k.source for k in fn.compiled.lowering.kernels if "for r in range" in k.source.text]
    loops = sorted(line.strip() for line in source.text.splitlines() if "for r in range" in line)
    assert loops == ["for r in range(3):", "for r in range(5):", "for r in range(6):"], source.text
    assert_compiles_to_ptx({source.text: source.signature}, tmp_path)


WHOLES = """\
func @f(%u: tensor<2x2x3xf64>, %s: tensor<2x3xf64>, %h: tensor<5xf32>) -> tensor<f64> {
  %loss = sum(%u) + mean(%s) + cast(mean(%h), dtype="f64")
  return %loss
}
"""


def test_whole_reductions_folded_into_one_kernel_each_have_their_own_tree(tmp_path: Path) -> None:
    """Several sums or means to one element read by one kernel (a loss `sum(a) + mean(b)`, of
    differently sized values and dtypes): one block, a shared-memory tree each; each reads its
    own total, divided by its own count (fuzz seed 0 input 3: every read took the first tree's
    total). Past kernels.MAX_WHOLE_READS the rest are CuPy reductions."""
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 3)), rng.standard_normal(5).astype(np.float32)]
    fn = assert_matches_interpreter(WHOLES, "f", args)
    assert (fn.stats.kernel_launches, fn.stats.xp_launches) == (1, 0), fn.stats
    (kernel,) = fn.compiled.lowering.kernels
    assert_compiles_to_ptx({kernel.source.text: kernel.source.signature}, tmp_path)  # f32 and f64 trees
    many = kernels.MAX_WHOLE_READS + 1
    params = ", ".join(f"%a{k}: tensor<{k + 2}xf64>" for k in range(many))
    terms = " + ".join(f"mean(%a{k})" for k in range(many))
    text = f"func @g({params}) -> tensor<f64> {{\n  %r = {terms}\n  return %r\n}}\n"
    fn = assert_matches_interpreter(text, "g", [rng.standard_normal(k + 2) for k in range(many)])
    assert (fn.stats.kernel_launches, fn.stats.xp_launches) == (1, 1), fn.stats


SHIFTED = """\
func @f(%xs: tensor<4x2xf32>, %h0: tensor<2xf32>, %c0: tensor<2xf32>)
    -> (tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>) {
  %h.1, %c.1, %hs, %ns, %cs = scan DIR(%x in %xs) carry (%h = %h0, %c = %c0) {
    %n = tanh(%h + %x)
    %d = %c * 0.5 + %x
    yield (%n, %d) stack (%h, %n, %c)
  } : tensor<2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>
  return %h.1, %c.1, %hs, %ns, %cs
}
"""


@pytest.mark.parametrize("arena", ["1", "0"])
@pytest.mark.parametrize("direction", ["", "reverse "])
def test_a_stacked_carry_shares_a_buffer_with_its_next_values(direction: str, arena: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`stack (%h, %n)` with %n the next %h: one buffer of T + 1 rows, the stacks a row apart;
    `stack (%c)` with %c's next value in no stack: written into the buffer's next row. Forward
    and reverse, in the arena and with a buffer per value: no copy per step."""
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    xs = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    fn = assert_matches_interpreter(SHIFTED.replace("DIR", direction), "f",
                                    [xs, np.array([0.5, -0.5], np.float32), np.array([0.1, 0.2], np.float32)])
    (counts,) = fn.stats.per_step.values()
    assert counts["copies"] == 0, counts


class _Foreign:
    """Another library's device array: only `__cuda_array_interface__` (as PyTorch or Numba)."""

    def __init__(self, a: object) -> None:
        self._a = a  # keeps the memory alive
        self.__cuda_array_interface__ = a.__cuda_array_interface__  # type: ignore[attr-defined]
        self.shape, self.dtype = a.shape, a.dtype  # type: ignore[attr-defined]


def test_device_arrays_in_device_arrays_out() -> None:
    """Device arrays (xp's, or any `__cuda_array_interface__`) are taken as they are: copied on
    the device into the argument buffers, never through the host; then the results come back
    as device arrays (fresh copies: the next call reuses the arena), as JAX and CuPy answer.
    Training steps can so keep their parameters on the device; NumPy in gives NumPy out."""
    from gir.testing import assert_all_close
    from rnn_cases import training_step

    src, args, want = training_step("gru", 3, 2, 3, 4)
    fn = gir.jit(src, "gru_grads", device="gpu")
    xp = DEVICE.xp
    on_device = [xp.asarray(a) for a in args]
    on_device[1] = _Foreign(on_device[1])
    got = fn(*on_device)
    assert all(isinstance(g, xp.ndarray) for g in got)
    assert_all_close([g.get() for g in got], want, what="device arrays")
    s = fn.stats
    assert (s.h2d, s.d2h) == (0, 0), s
    again = fn(*on_device)  # the first results are copies: the second call does not change them
    assert_all_close([g.get() for g in got], [g.get() for g in again], what="first results after a second call")
    host = fn(*args)
    packs = fn.compiled.lowering.packs  # the arguments of a concat are uploaded as one
    assert all(isinstance(h, np.ndarray) for h in host)
    assert fn.stats.h2d == len(args) - sum(len(p.args) - 1 for p in packs) < len(args), fn.stats
    with pytest.raises(gir.GirError, match="device array of dtype float64"):
        fn(xp.asarray(args[0].astype(np.float64)), *on_device[1:])


TOTAL = """\
func @f(%x: tensor<5x6xDT>, %s: tensor<DT>) -> (tensor<5x6xDT>, tensor<DT>) {
  %y = tanh(%x) * 2.0
  return %y, %s + REDUCE(%y) * 3.0
}
"""


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_a_group_and_the_total_of_its_result_are_one_kernel(dtype: str, reduce: str) -> None:
    """`%s + sum(%y)` after the group making %y: one kernel (each block's sum added atomically
    into a total the last block finishes with), over more elements than threads (the grid-stride
    loop) and several blocks; a second call gives the same (the kernel resets its total)."""
    rng = np.random.default_rng(1)
    np_dt = np.float32 if dtype == "f32" else np.float64
    args = [rng.standard_normal((5, 6)).astype(np_dt), np.array(0.25, np_dt)]
    fn = assert_matches_interpreter(TOTAL.replace("DT", dtype).replace("REDUCE", reduce), "f", args)
    assert (fn.stats.kernel_launches, fn.stats.xp_launches) == (1, 0), fn.stats
    assert any("cuda.atomic.add(acc" in k for k in fn.compiled.kernel_sources)
    first = fn(*args)
    np.testing.assert_allclose(fn(*args)[1], first[1], rtol=1e-6)


CHAINED = """\
func @f(%x: tensor<3x4xf32>, %b: tensor<4xf32>, %acc: tensor<4xf32>, %v: tensor<4xf32>)
    -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %a = tanh(%x + %b)
  %s = sum(%a, axes = [0])
  %c = %a * %x - %b
  %acc.1 = %acc + %s
  %v.1 = %v * 0.5
  return %a, %c, %acc.1, %v.1
}
"""


@pytest.mark.parametrize("arena", ["1", "0"])
def test_groups_chained_and_run_over_two_ranges(arena: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels merged by the backend, against the interpreter: a group reading an earlier one's
    result at the same index, across a reduction between them (one kernel, the later group's
    register read); independent groups after them, across a constant (one kernel)."""
    monkeypatch.setenv("GIR_GPU_ARENA", arena)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (4,), (4,), (4,)]]
    fn = assert_matches_interpreter(CHAINED, "f", args, pipeline="ssa,canonicalize,fuse")
    assert fn.stats.kernel_launches == 2, fn.stats  # %a with %c (across the sum), %acc.1 with %v.1
    assert fn.stats.xp_launches == 0, fn.stats  # the sum is computed by the %acc.1 kernel
