"""Persistent scans on the GPU backend (backend/gpu/persistent.py, GIR_GPU_PERSISTENT): a scan
as one cooperative kernel running every time step, in Numba's CUDA simulator against the
interpreter, eager and replayed from a CUDA graph, arena on and off; the decision's printed
form and its refusals; and every generated persistent kernel through the real compiler to PTX.

The simulator runs a cooperative grid as one block (its grid sync is a block sync), so a
multi-block grid runs only on a GPU: `NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu`. Several
column tiles per block are tested here (the LSTM's recurrent GEMM: 4 tiles in the one block).
"""

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
from gir.backend.gpu import persistent
from gir.ir.loops import LoopView
from gpu_support import device_or_skip

DEV = device_or_skip()

pytestmark = pytest.mark.gpu

ONE_KERNEL = {"kernel_launches": 1 / 3, "gemm_calls": 0.0, "xp_launches": 0.0, "copies": 0.0, "graph_replays": 0.0}
"""Per time step of a persistent scan of 3 steps: its one launch over the steps, nothing else."""


def _jit(src: str, entry: str, **options: object) -> gir.driver.jit.JitFunction:  # type: ignore[name-defined]
    with gir.config.override(**options):
        return gir.jit(src, entry, device="gpu")


def _new_inputs(args: list[np.ndarray], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(a + 0.1 * rng.standard_normal(a.shape)).astype(a.dtype) for a in args]


def _close(got: list[np.ndarray], want: list[np.ndarray], what: str, tol: float = 1e-4) -> None:
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=tol * max(1.0, float(np.abs(w).max())), err_msg=what)


def _assert_persistent(fn: object, mode: str = "on") -> None:
    s = fn.stats  # type: ignore[attr-defined]
    assert len(s.persistent) == 2, s.persistent  # the forward scan and BPTT's reverse scan
    for label, path in s.persistent.items():
        assert path.startswith(f"persistent ({mode}): one launch for 3 steps"), (label, path)
        assert s.per_step[label] == pytest.approx(ONE_KERNEL), (label, s.per_step[label])


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm", "peephole"])
def test_training_step_runs_each_scan_as_one_kernel(model: str) -> None:
    """Forward and backward scans each one persistent launch (0 GEMM calls and 0 copies per
    step), the results the interpreter's: the eager first call, then the CUDA graph (the
    cooperative launch captured in it) replayed with new inputs. The peephole LSTM (a cell
    cuDNN does not offer) likewise."""
    from rnn_cases import training_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    interp = gir.jit(src, f"{model}_grads", device="interp")
    fn = _jit(src, f"{model}_grads", gpu_persistent="on", gpu_graphs=True)
    for call in range(3):
        new = args if call == 0 else _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"{model} call {call + 1}")
        assert fn.stats.graph == ("replayed" if call else "eager: the first call (warm-up before capture)")
        _assert_persistent(fn)
    if model == "lstm" and DEV.simulated:  # the GEMM 2x4 @ 4x16: four column tiles in the simulator's one block
        forward = next(p for label, p in fn.stats.persistent.items() if "forward" in label)
        assert forward == ("persistent (on): one launch for 3 steps, grid 1 x 4, W 4x16 f32 on chip in 4 tile(s) "
                           "of 4 columns (4 per block, 256 B shared)")


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("arena", [True, False])
def test_eager_calls_with_and_without_the_arena(model: str, arena: bool) -> None:
    """GIR_GPU_GRAPHS=0 (every call eager, so every call launches the kernel from Python) and
    GIR_GPU_ARENA on and off (the bases the trace finds: arena views, or a buffer per value)."""
    from rnn_cases import training_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    interp = gir.jit(src, f"{model}_grads", device="interp")
    fn = _jit(src, f"{model}_grads", gpu_persistent="on", gpu_graphs=False, gpu_arena=arena)
    for call in range(2):
        new = _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"{model} call {call + 1}")
        assert fn.stats.graph == "off" and fn.stats.memory.startswith("arena" if arena else "a buffer per value")
        _assert_persistent(fn)


@pytest.mark.parametrize("model", ["rnn", "gru", "lstm"])
def test_float64_training_step(model: str) -> None:
    """float64 (the examples' text with f32 -> f64): the GEMM and the phases in float64, to 1e-10."""
    from rnn_cases import training_step

    src, args, _ = training_step(model, 3, 2, 3, 4)
    src, args = src.replace("f32", "f64"), [a.astype(np.float64) for a in args]
    want = gir.jit(src, f"{model}_grads", device="interp")(*args)
    fn = _jit(src, f"{model}_grads", gpu_persistent="on", gpu_graphs=False)
    _close(fn(*args), want, model, tol=1e-10)
    _assert_persistent(fn)
    assert all(" f64 on chip" in p for p in fn.stats.persistent.values())


SCAN = """
func @f(%xs: tensor<3x2x4xf32>, %h0: tensor<2x4xf32>, %w: tensor<4x4xf32>) -> (tensor<2x4xf32>, tensor<f32>) {
  %l0 = constant 0.0 : tensor<f32>
  %h.1, %l.1 = scan (%x in %xs) carry (%h = %h0, %l = %l0) {
    %m = matmul %h, %w : tensor<2x4xf32>
    %y = add %m, %x : tensor<2x4xf32>
    %z = tanh %y : tensor<2x4xf32>
    %q = sum %z : tensor<f32>
    %l2 = add %l, %q : tensor<f32>
    yield (%z, %l2)
  } : tensor<2x4xf32>, tensor<f32>
  return %h.1, %l.1
}
"""
"""A recurrence with one GEMM and a loss term: eligible; the variants below are not."""

REFUSED = {
    "a reduction per step": (("%q = sum %z", "%q = reduce_max %z"),
                             "host loop: at the first call: an xp launch per step"),
    "two GEMMs": (("%y = add %m, %x", "%z0 = tanh %m : tensor<2x4xf32>\n    %m2 = matmul %z0, %w : tensor<2x4xf32>"
                                      "\n    %y = add %m2, %x"),
                  "host loop: 2 GEMMs per step (at most one is supported)"),
    "W from the body": (("%m = matmul %h, %w", "%wl = mul %w, %l : tensor<4x4xf32>\n    %m = matmul %h, %wl"),
                        "host loop: the step's GEMM has no loop-invariant right operand"),
}


def _scan_case(change: tuple[str, str] | None) -> tuple[str, list[np.ndarray]]:
    src = SCAN if change is None else SCAN.replace(*change)
    rng = np.random.default_rng(1)
    return src, [rng.standard_normal(s).astype(np.float32) for s in [(3, 2, 4), (2, 4), (4, 4)]]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_keep_the_host_loop_and_say_why(case: str) -> None:
    change, reason = REFUSED[case]
    src, args = _scan_case(change)
    fn = _jit(src, "f", gpu_persistent="on", gpu_graphs=False)
    _close(fn(*args), gir.jit(src, "f", device="interp")(*args), case)
    (path,) = fn.stats.persistent.values()
    assert path.startswith(reason), path
    (counts,) = fn.stats.per_step.values()
    assert counts["kernel_launches"] >= 1 and counts != pytest.approx(ONE_KERNEL)


NESTED = """
func @g(%xs: tensor<3x2xf32>, %h0: tensor<2xf32>) -> tensor<2xf32> {
  %h.1 = scan (%x in %xs) carry (%h = %h0) {
    %i.1 = scan length 2 () carry (%c = %h) {
      %c2 = add %c, %x : tensor<2xf32>
      yield (%c2)
    } : tensor<2xf32>
    %t = tanh %i.1 : tensor<2xf32>
    yield (%t)
  } : tensor<2xf32>
  return %h.1
}
"""


def test_a_loop_in_a_loop_stays_on_the_host() -> None:
    """The inner scan's rows and buffers move with the outer step, so a binding made once per
    function would be wrong for it: both scans refuse (the outer for its nested loop)."""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(3, 2), (2,)]]
    fn = _jit(NESTED, "g", gpu_persistent="on", gpu_graphs=False)
    _close(fn(*args), gir.jit(NESTED, "g", device="interp")(*args), "nested")
    paths = sorted(fn.stats.persistent.values())
    assert [p.split(" at ")[0] for p in paths] == ["host loop: a nested loop", "host loop: inside the loop"], paths


def test_an_elementwise_recurrence_is_one_kernel_too() -> None:
    """No GEMM in the step (`h * h` for `h @ W`): the phases alone, no W in shared memory."""
    src, args = _scan_case(("%m = matmul %h, %w", "%m = mul %h, %h"))
    fn = _jit(src, "f", gpu_persistent="on")
    interp = gir.jit(src, "f", device="interp")
    for call in range(2):
        new = _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"call {call + 1}")
    (path,) = fn.stats.persistent.values()
    assert path.endswith(", no GEMM") and path.startswith("persistent (on): one launch for 3 steps"), path
    (counts,) = fn.stats.per_step.values()
    assert counts == pytest.approx(ONE_KERNEL)


def test_the_conformance_scans_with_persistent_scans_on() -> None:
    """Every scan program of tests/test_backend_conformance.py (forward and reverse, stacks,
    swapped carries, counters, zero steps...) with GIR_GPU_PERSISTENT=on, against the interpreter:
    each scan persistent or refused with its reason, never wrong."""
    import test_backend_conformance as conformance

    persistent_scans = 0
    for entry in gir.parse(conformance.SCANS).functions:
        with gir.config.override(gpu_persistent="on"):
            fn = conformance.run_both("gpu", conformance.SCANS, entry, seed=6)
        persistent_scans += sum(p.startswith("persistent (on)") for p in fn.stats.persistent.values())
    assert persistent_scans >= 3  # cumsum both ways, powers


def test_off_is_the_default_and_prints_the_plan_it_would_use() -> None:
    src, args = _scan_case(None)
    fn = _jit(src, "f")
    _close(fn(*args), gir.jit(src, "f", device="interp")(*args), "off")
    (path,) = fn.stats.persistent.values()
    assert path.startswith("host loop: GIR_GPU_PERSISTENT=off (eligible: one launch for 3 steps, grid "), path
    if DEV.simulated:  # one block (a GPU: a block per column here, 4 x 256)
        assert path.endswith("grid 1 x 4, W 4x4 f32 on chip in 1 tile(s) of 4 columns (1 per block, 64 B shared))")
    (counts,) = fn.stats.per_step.values()
    assert (counts["kernel_launches"], counts["gemm_calls"]) == (1, 1)  # the host loop's step: GEMM + kernel
    on = _jit(src, "f", gpu_persistent="on")
    _close(on(*args), gir.jit(src, "f", device="interp")(*args), "on")
    (counts,) = on.stats.per_step.values()
    assert counts == pytest.approx(ONE_KERNEL)


def test_measure_in_the_simulator_times_both_and_keeps_the_host_loop() -> None:
    """`measure` runs both ways at the first call and times them; the simulator's times say
    nothing of a GPU's, so there it keeps the host loop (on a GPU, the faster: docs/gpu.md)."""
    src, args = _scan_case(None)
    fn = _jit(src, "f", gpu_persistent="measure", gpu_graphs=True)
    interp = gir.jit(src, "f", device="interp")
    for call in range(3):
        new = _new_inputs(args, call)
        _close(fn(*new), interp(*new), f"measure call {call + 1}")
        (path,) = fn.stats.persistent.values()
        assert "(measure): one launch for 3 steps" in path and "measured host loop" in path, path
        if DEV.simulated:
            assert path.startswith("host loop (measure)") and "the simulator's times say nothing" in path, path
    (counts,) = fn.stats.per_step.values()
    if path.startswith("host loop"):
        assert (counts["kernel_launches"], counts["gemm_calls"]) == (1, 1)
    else:  # on a GPU where the persistent kernel was faster
        assert counts == pytest.approx(ONE_KERNEL)


def _stand_in_device(multiprocessors: int) -> SimpleNamespace:
    gpu = SimpleNamespace(MULTIPROCESSOR_COUNT=multiprocessors)
    return SimpleNamespace(simulated=False, threads_per_block=256,
                           cuda=SimpleNamespace(get_current_device=lambda: gpu))


SIZED = """
func @f(%xs: tensor<3x2xNNxf32>, %h0: tensor<2xKKxf32>, %w: tensor<KKxNNxf32>) -> tensor<2xKKxf32> {
  %h.1 = scan (%x in %xs) carry (%h = %h0) {
    %m = matmul %h, %w : tensor<2xNNxf32>
    %y = add %m, %x : tensor<2xNNxf32>
    %s = slice %y {limits = [2, KK], starts = [0, 0]} : tensor<2xKKxf32>
    %z = tanh %s : tensor<2xKKxf32>
    yield (%z)
  } : tensor<2xKKxf32>
  return %h.1
}
"""
"""A recurrence of hidden size KK whose GEMM makes NN columns (NN = 4 KK: the LSTM's four gates)."""


@pytest.mark.parametrize("hidden, expected", [
    (256, "persistent (on): one launch for 3 steps, grid 128 x 256, W 256x1024 f32 on chip in 128 tile(s) of 8 "
          "columns (1 per block, 8192 B shared)"),
    (512, "persistent (on): one launch for 3 steps, grid 128 x 256, W 512x2048 f32 on chip in 128 tile(s) of 16 "
          "columns (1 per block, 32768 B shared)"),
    (1024, "host loop: W's columns per block need 131072 B of shared memory, over the budget of 40960 B"),
])
def test_the_plan_on_a_gpu_of_132_multiprocessors(hidden: int, expected: str) -> None:
    """The decision is an analysis of the IR and the device alone: the LSTM's recurrent GEMM at
    the issue's sizes S, M, L on an H200-like device (132 multiprocessors, 256 threads a block);
    at L a block's slice of W does not fit its shared memory, so that scan stays a host loop."""
    src = SIZED.replace("NN", str(4 * hidden)).replace("KK", str(hidden))
    (function,) = gir.parse(src).functions.values()
    loop = LoopView(next(op for op in function.body if op.name == "scan"))
    path = persistent.decide(loop, "scan", _stand_in_device(132), "on")  # type: ignore[arg-type]
    assert path.render() == expected


PTX = """\
import json, sys
from types import SimpleNamespace
from numba import cuda
import numba.cuda.dispatcher as dispatcher
from gir.backend.gpu import kernels
# numba-cuda compiles the overload behind cuda.cg.this_grid() for the current device's compute
# capability even in compile_ptx; without a driver, say which (the cc compile_ptx is given).
dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(8, 0))
try:
    cuda.compile_ptx(kernels._define(cuda, kernels.generate([], [], [], ()).text).py_func, "void(int64)", cc=(8, 0))
except Exception as e:  # no NVVM / NVRTC: numba-cuda without its [cu12]/[cu13] extra
    print("NO NVVM:", type(e).__name__, e)
    sys.exit(0)
for text, signature in json.load(open(sys.argv[1])):
    code, _ = cuda.compile_ptx(kernels._define(cuda, text).py_func, signature, cc=(8, 0))
    assert ".entry" in code and "cudaCGSynchronize" in code and ".shared" in code, text
print("PTX OK", len(json.load(open(sys.argv[1]))))
"""


def test_every_persistent_kernel_compiles_to_ptx(tmp_path: Path) -> None:
    """The persistent kernels of the rnn/gru/lstm/peephole training steps (forward and backward) through
    numba.cuda's real compiler, in a process without the simulator: the grid sync, the shared
    W tiles, the inlined phases typed for real. Skipped without NVVM/NVRTC."""
    from rnn_cases import training_step

    sources = {}
    for model in ("rnn", "gru", "lstm", "peephole"):
        src, args, _ = training_step(model, 3, 2, 3, 4)
        fn = _jit(src, f"{model}_grads", gpu_persistent="on", gpu_graphs=False)
        fn(*args)
        for k in fn.compiled.lowering.kernels:
            if isinstance(k, persistent.PersistentKernel):
                sources[k.source.text] = k.source.signature
    assert len(sources) == 8, len(sources)
    listing = tmp_path / "kernels.json"
    listing.write_text(json.dumps(sorted(sources.items())))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", PTX, str(listing)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    if done.stdout.startswith("NO NVVM"):
        pytest.skip(done.stdout.strip())
    assert done.stdout.strip() == f"PTX OK {len(sources)}", done.stdout
