"""What only the GPU backend has (numba.cuda kernels, xp GEMMs, host-driven scans): its
kernels and its device. Everything both backends do is in tests/test_backend_conformance.py,
run on `cpu` and `gpu` against the interpreter, the oracle.

Without a GPU everything runs in Numba's CUDA simulator: NUMBA_ENABLE_CUDASIM is set to 1 at the
top of this module, before numba is imported, unless it is already set. On a machine with a
GPU, `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs the same tests on it.

- Kernels: generated source (grid-stride loop, broadcasting by index arithmetic, math.tanh),
  compiled once per distinct source; without the fuse pass, a kernel per elementwise op.
- Arguments: a non-contiguous view is copied to the device.
- Without a GPU and without the simulator, device="gpu" and `gir run --device gpu` say so.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")

import gir  # noqa: E402
from gir.backend.gpu import kernels  # noqa: E402
from gir.backend.gpu.device import NO_GPU, get_device  # noqa: E402
from gir.driver.jit import JitFunction  # noqa: E402
from gir.ir.interpreter import random_inputs  # noqa: E402

try:
    DEVICE = get_device()
except gir.GirError as e:  # numba.cuda was imported without the simulator, and there is no GPU
    pytest.skip(f"no GPU backend here: {e.message}", allow_module_level=True)

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
