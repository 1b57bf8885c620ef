"""Training-step benchmark: gir against PyTorch, JAX, PyTensor and a hand-written NumPy BPTT.

What is measured
----------------
One training step of a recurrent model, float32, on the CPU: the forward pass over T steps and
back-propagation through time, giving the loss (sum over the steps of sum(h_t * h_t)) and the
gradients of ALL weights, ALL biases and the initial state (h0, and c0 for the LSTM). Models
(the forms of examples/rnn.gir, gru.gir, lstm.gir):

    rnn   h = tanh(x wx + h wh + b)
    gru   z = sig(x w_z + h u_z + b_z), r = sig(x w_r + h u_r + b_r),
          n = tanh(x w_n + b_n + r * (h u_n + b_hn)), h = (1 - z) n + z h   (cuDNN / PyTorch form)
    lstm  i, f, o = sig(x w_* + h u_* + b_*), g = tanh(x w_g + h u_g + b_g),
          c = f c + i g, h = o tanh(c)

at S (T=50, batch 32, input = hidden = 256) and M (T=100, batch 64, input = hidden = 512),
with 1 and 2 threads (`--quick` swaps in tiny sizes, input != hidden, for a smoke run that
checks every peer's gradients).

The peers, each written the way a careful user would write it
---------------------------------------------------------------
- gir: the .gir source is generated here from the examples' form with the sizes substituted
  and `grad ... wrt (h0, [c0,] every weight, every bias)`; `gir.jit` compiles it.
- PyTorch: nn.RNN(tanh) / nn.GRU / nn.LSTM on the CPU, forward + `loss.backward()`, weights
  copied from the same NumPy arrays. Biases: gir's single bias goes in `bias_ih`, `bias_hh`
  is zero, except the GRU's b_hn, which is torch's b_hn (the n part of `bias_hh`).
- JAX: `lax.scan` + `jax.value_and_grad` under `jax.jit`, gates fused into one weight matrix
  per side and the input projection of all steps done as one GEMM before the scan.
- PyTensor: the same math with `pytensor.scan` + `pytensor.grad`, default mode (the Numba
  linker in PyTensor 3). PyTensor pins older numba/llvmlite than gir, so it runs from its own
  virtualenv (`--pytensor-python`, see below): this same file runs there as a worker that
  gets the arrays through .npz files and hands gradients and timings back through .npz.
- NumPy: hand-written BPTT (`numpy_step`): the input projections of all steps as one GEMM
  before the loop, one GEMM per step for the recurrence forward and one backward, the weight
  gradients as one GEMM each after the loop.

Method
------
- Inputs are made once from a fixed seed and handed to every peer through .npz files.
- Every (thread count, peer) pair runs in a fresh subprocess, so that thread settings stick:
  OMP/MKL/OPENBLAS_NUM_THREADS in the environment, the process pinned to that many cores
  (where the machine has more), `torch.set_num_threads`, XLA_FLAGS
  `--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1` for one thread, MKL's
  `MKL_Set_Num_Threads` and threadpoolctl's `threadpool_limits` for gir and NumPy.
- gir runs first and is the reference. Each other peer's loss and gradients are compared
  with gir's BEFORE it is timed (max |peer - gir| / max |gir| < 1e-3, per array); a peer that
  disagrees is reported and not timed. A peer whose library is missing is skipped with a notice.
- Timing: `--warmup` untimed steps (the first call, which compiles, is never timed), then
  `--repeat` timed steps in the same process; the median is reported.
- Floor: the GEMM FLOPs of one step (2*T*B*g*H*(2*I + 3*H) for g gates: forward x W and h U,
  backward dW, dU and dh U^T; no input gradient) divided by the machine's measured sgemm peak
  at the same thread count (a 2048^3 sgemm, the best of MKL and OpenBLAS). The fraction
  floor / time says how close a peer comes to spending all its time in peak-speed GEMMs.

On the GPU (`--device gpu`, or `--device auto` where there is one)
------------------------------------------------------------------
gir with `device="gpu"` (CuPy arrays in and out, so the parameters stay on the device; call 1
eager, call 2 captures the CUDA graph every later call replays: both untimed warm-up) against
PyTorch's cuDNN nn.RNN/GRU/LSTM (a Python loop of tensor ops for the peephole and the
LayerNorm-LSTM cells, which cuDNN lacks) and JAX (lax.scan + jit) on the same GPU, at S, M and
L (T=100, batch 256, hidden 1024), rnn, gru, lstm, peephole and lnlstm; one process per peer, each step synchronised
before the clock stops; gradients checked against gir's first (cuDNN and XLA may use TF32:
the tolerance is the same 1e-3). Writes docs/performance-gpu.md with the GPU's name and the
ratios against issue 26's targets. Without a GPU, `--device gpu` stops with the reason (no
numba-cuda, no CuPy, no device) and `--device auto` runs the CPU benchmark.

    python bench/rnn.py --device gpu                   # S, M, L; all five models
    python bench/rnn.py --device gpu --sizes S --repeat 10 --out /tmp/performance-gpu.md

Usage
-----
    pip install -e '.[bench]'                    # torch==2.13.0 (CPU), jax, threadpoolctl, matplotlib
    python -m venv ../pytensor-venv && ../pytensor-venv/bin/pip install pytensor numpy
    python bench/rnn.py                          # all models, S and M, 1 and 2 threads
    python bench/rnn.py --quick                  # tiny sizes: checks every peer, prints only
    python bench/rnn.py --models rnn,gru --sizes S --threads 2 --repeat 20 \
        --out docs/performance-rnn.md --plot bench/rnn.png

PyTensor's interpreter: `--pytensor-python PATH`, else $GIR_BENCH_PYTENSOR_PYTHON, else this
interpreter if it can import pytensor, else ../pytensor-venv/bin/python beside the checkout.
The machine should be otherwise idle while it runs.
"""

# ruff: noqa: E741  (I is the input size, as in T, B, I, H)
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"S": (50, 32, 256, 256), "M": (100, 64, 512, 512)}  # T, batch, input, hidden
QUICK_SIZES = {"S": (5, 3, 4, 6), "M": (7, 4, 6, 8)}
GPU_SIZES = {**SIZES, "L": (100, 256, 1024, 1024)}  # issue 26's S, M, L
GPU_QUICK_SIZES = {**QUICK_SIZES, "L": (6, 5, 7, 9)}
GPU_PEERS = ("gir", "pytorch", "jax")
"""On the GPU: gir (device="gpu", device arrays in and out), PyTorch (cuDNN's nn.RNN/GRU/LSTM),
JAX (lax.scan + jit); PyTensor and NumPy have no GPU path here."""
DEVICE = "cpu"
"""The worker's device (`cpu` or `gpu`), from the job."""
MODELS = ("rnn", "gru", "lstm", "peephole", "lnlstm")
"""peephole: an LSTM whose gates also read the cell (c * p_i, c * p_f, c_t * p_o), a cell cuDNN
does not offer (issue 26): PyTorch runs it as a Python loop of tensor ops (`setup_pytorch_loop`),
JAX and gir compile it; NumPy and PyTensor have no peephole form here.
lnlstm: a LayerNorm-LSTM (Ba et al. 2016, normalised per gate as TensorFlow's
LayerNormBasicLSTMCell does: each gate's pre-activation x W + h U, and the new cell before its
tanh, normalised over the hidden units, then scaled by a gain and shifted), likewise custom."""
CUSTOM = ("peephole", "lnlstm")
"""Models cuDNN has no kernel for."""
PEERS = ("gir", "pytorch", "jax", "pytensor", "numpy")
PEER_TITLES = {"gir": "gir", "pytorch": "PyTorch", "jax": "JAX", "pytensor": "PyTensor", "numpy": "NumPy"}
PEER_MODULES = {"pytorch": "torch", "jax": "jax", "numpy": "numpy"}
TOLERANCE = 1e-3
PEAK_N, PEAK_N_QUICK = 2048, 512

# ---------------------------------------------------------------------------------------------
# Models: parameter names (gir's layout), initial values, the fused layout, GEMM FLOPs

GATES = {"rnn": ("h",), "gru": ("z", "r", "n"), "lstm": ("i", "f", "g", "o"), "peephole": ("i", "f", "g", "o"),
         "lnlstm": ("i", "f", "g", "o")}
PEEPHOLES = ("p_i", "p_f", "p_o")
"""The peephole LSTM's extra parameters (each of shape (H,))."""
LN_GAINS = ("a_i", "a_f", "a_g", "a_o", "a_c")
"""The LayerNorm-LSTM's gains (per gate and for the cell), each of shape (H,), initialised near 1;
its shifts are the gates' biases b_* and the cell's b_c."""
EXTRAS = {"peephole": PEEPHOLES, "lnlstm": (*LN_GAINS, "b_c")}
"""Per model, the parameters beyond the gates' w, u, b (each of shape (H,)), in gir's order."""
LN_EPS = 1e-5
"""Gate order of the fused layout used by NumPy, JAX and PyTensor (W = [w_z w_r w_n], ...)."""


def w_name(model: str, gate: str) -> str:
    return "wx" if model == "rnn" else f"w_{gate}"


def u_name(model: str, gate: str) -> str:
    return "wh" if model == "rnn" else f"u_{gate}"


def b_name(model: str, gate: str) -> str:
    return "b" if model == "rnn" else f"b_{gate}"


def states(model: str) -> list[str]:
    return ["h0", "c0"] if model in ("lstm", "peephole", "lnlstm") else ["h0"]


def param_names(model: str) -> list[str]:
    """Everything the gradient is taken with respect to, in gir's argument order."""
    gates = GATES[model]
    names = states(model) + [w_name(model, g) for g in gates] + [u_name(model, g) for g in gates]
    names += [b_name(model, g) for g in gates]
    return names + (["b_hn"] if model == "gru" else []) + list(EXTRAS.get(model, ()))


def param_shape(name: str, B: int, I: int, H: int) -> tuple[int, ...]:
    if name in ("h0", "c0"):
        return (B, H)
    if name.startswith("b") or name in PEEPHOLES or name in LN_GAINS:
        return (H,)
    return (I, H) if name in ("wx",) or name.startswith("w_") else (H, H)


def make_inputs(model: str, T: int, B: int, I: int, H: int, seed: int) -> dict[str, np.ndarray]:
    """xs ~ N(0, 1); weights and biases ~ U(-1/sqrt(H), 1/sqrt(H)) as PyTorch initialises them;
    initial states ~ 0.1 N(0, 1); LayerNorm gains 1 + U(-1/sqrt(H), 1/sqrt(H))."""
    rng = np.random.default_rng(seed)
    k = 1.0 / np.sqrt(H)
    arrays = {"xs": rng.standard_normal((T, B, I))}
    for name in param_names(model):
        shape = param_shape(name, B, I, H)
        arrays[name] = 0.1 * rng.standard_normal(shape) if name in ("h0", "c0") else rng.uniform(-k, k, shape)
        if name in LN_GAINS:
            arrays[name] += 1.0
    return {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in arrays.items()}


def fuse(model: str, p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """gir's per-gate arrays -> the fused layout: Wx (I, gH), U (H, gH), b (gH,) [, b_hn]."""
    gates = GATES[model]
    fused = {"xs": p["xs"], **{s: p[s] for s in states(model)},
             "Wx": np.concatenate([p[w_name(model, g)] for g in gates], axis=1),
             "U": np.concatenate([p[u_name(model, g)] for g in gates], axis=1),
             "b": np.concatenate([p[b_name(model, g)] for g in gates])}
    if model == "gru":
        fused["b_hn"] = p["b_hn"]
    for name in EXTRAS.get(model, ()):
        fused[name] = p[name]
    return {n: np.ascontiguousarray(a) for n, a in fused.items()}


def fused_names(model: str) -> list[str]:
    return states(model) + ["Wx", "U", "b"] + (["b_hn"] if model == "gru" else []) \
        + list(EXTRAS.get(model, ()))


def unfuse_grads(model: str, g: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Gradients in the fused layout -> gir's names."""
    gates = GATES[model]
    out = {s: g[s] for s in states(model)}
    for kind, name in (("Wx", w_name), ("U", u_name), ("b", b_name)):
        for gate, part in zip(gates, np.split(np.asarray(g[kind]), len(gates), axis=-1)):
            out[name(model, gate)] = part
    if model == "gru":
        out["b_hn"] = g["b_hn"]
    for name in EXTRAS.get(model, ()):
        out[name] = g[name]
    return out


def gemm_flops(model: str, T: int, B: int, I: int, H: int) -> int:
    """GEMM FLOPs of one training step: forward x W (T B I gH) and h U (T B H gH); backward
    dW = X^T dA, dU = H^T dA and dh = dA U^T (T B H gH each, dh down to dh0); no dxs."""
    return 2 * T * B * len(GATES[model]) * H * (2 * I + 3 * H)


def compare(ref_loss: float, ref: dict[str, np.ndarray], loss: float, got: dict[str, np.ndarray]) -> tuple[float, str]:
    """The worst relative error (max |got - ref| / max |ref|) over the loss and every gradient."""
    worst, where = abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-30), "loss"
    for name, r in ref.items():
        if name not in got:
            return float("inf"), f"missing gradient {name}"
        a = np.asarray(got[name], dtype=np.float64)
        if a.shape != r.shape:
            return float("inf"), f"{name}: shape {a.shape} != {r.shape}"
        err = float(np.max(np.abs(a - r))) / max(float(np.max(np.abs(r))), 1e-30)
        if not err < worst:
            worst, where = err, name
    return worst, where


# ---------------------------------------------------------------------------------------------
# Thread settings (applied by the parent through the environment, by the worker in-process)


def thread_env(threads: int, device: str = "cpu") -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    xla = env.get("XLA_FLAGS", "")
    if threads == 1:
        xla += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    env["XLA_FLAGS"] = xla.strip()
    env["JAX_PLATFORMS"] = "cuda" if device == "gpu" else "cpu"
    if device == "gpu":
        env["NUMBA_ENABLE_CUDASIM"] = "0"  # the real GPU, never the simulator
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside CuPy and PyTorch
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTENSOR_FLAGS"] = ",".join(x for x in (env.get("PYTENSOR_FLAGS", ""), "floatX=float32") if x)
    return env


def pin_to_cores(threads: int) -> None:
    """Pins this process to `threads` cores where it may use more, so that libraries that size
    their pools by the CPUs they may run on (XLA, PyTorch) use that many."""
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > threads:
            os.sched_setaffinity(0, cpus[:threads])


def limit_blas_threads(threads: int) -> object | None:
    """threadpoolctl's limit on every BLAS/OpenMP pool in the process (kept alive by the caller)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads)


def time_step(step, warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------------------------------------
# gir: the generated source, and the sgemm peak

GIR_BODY = {
    "rnn": ["%h = tanh(%x @ %wx + %h @ %wh + %b)"],
    "gru": ["%z = sigmoid(%x @ %w_z + %h @ %u_z + %b_z)",
            "%r = sigmoid(%x @ %w_r + %h @ %u_r + %b_r)",
            "%n = tanh(%x @ %w_n + %b_n + %r * (%h @ %u_n + %b_hn))",
            "%h = (1.0 - %z) * %n + %z * %h"],
    "lstm": ["%i = sigmoid(%x @ %w_i + %h @ %u_i + %b_i)",
             "%f = sigmoid(%x @ %w_f + %h @ %u_f + %b_f)",
             "%g = tanh(%x @ %w_g + %h @ %u_g + %b_g)",
             "%o = sigmoid(%x @ %w_o + %h @ %u_o + %b_o)",
             "%c = %f * %c + %i * %g",
             "%h = %o * tanh(%c)"],
    "peephole": ["%i = sigmoid(%x @ %w_i + %h @ %u_i + %c * %p_i + %b_i)",
                 "%f = sigmoid(%x @ %w_f + %h @ %u_f + %c * %p_f + %b_f)",
                 "%g = tanh(%x @ %w_g + %h @ %u_g + %b_g)",
                 "%c = %f * %c + %i * %g",
                 "%o = sigmoid(%x @ %w_o + %h @ %u_o + %c * %p_o + %b_o)",
                 "%h = %o * tanh(%c)"],
    "lnlstm": [line for gate, act in zip("ifgo", ("sigmoid", "sigmoid", "tanh", "sigmoid"))
               for line in (f"%z_{gate} = %x @ %w_{gate} + %h @ %u_{gate}",
                            f"%m_{gate} = mean(%z_{gate}, axes=[-1], keepdims=true)",
                            f"%d_{gate} = %z_{gate} - %m_{gate}",
                            f"%s_{gate} = sqrt(mean(%d_{gate} * %d_{gate}, axes=[-1], keepdims=true) + {LN_EPS})",
                            f"%{gate} = {act}(%d_{gate} / %s_{gate} * %a_{gate} + %b_{gate})")]
    + ["%c = %f * %c + %i * %g",
       "%m_c = mean(%c, axes=[-1], keepdims=true)",
       "%d_c = %c - %m_c",
       f"%s_c = sqrt(mean(%d_c * %d_c, axes=[-1], keepdims=true) + {LN_EPS})",
       "%h = %o * tanh(%d_c / %s_c * %a_c + %b_c)"],
}


def gir_source(model: str, T: int, B: int, I: int, H: int) -> str:
    """`@<model>_loss` and `@<model>_grads` (loss, then the gradient of every parameter in
    `param_names` order) at these sizes, in the examples' surface form."""
    def ty(shape: tuple[int, ...]) -> str:
        return "tensor<" + "".join(f"{d}x" for d in shape) + "f32>"

    names = param_names(model)
    args = [f"%xs: {ty((T, B, I))}"] + [f"%{n}: {ty(param_shape(n, B, I, H))}" for n in names]
    sig = ",\n    ".join(args)
    call = ", ".join(["%xs"] + [f"%{n}" for n in names])
    inits = "".join(f"  %{s[0]} = %{s}\n" for s in states(model))
    body = "".join(f"    {line}\n" for line in GIR_BODY[model])
    results = ", ".join(["tensor<f32>"] + [ty(param_shape(n, B, I, H)) for n in names])
    grads = ", ".join(["%loss"] + [f"%d_{n}" for n in names])
    wrt = ", ".join(f"%{n}" for n in names)
    return (f"// Generated by bench/rnn.py: {model}, T={T} batch={B} input={I} hidden={H}.\n"
            f"func @{model}_loss(\n    {sig}) -> tensor<f32> {{\n{inits}"
            f"  %loss = constant 0.0 : tensor<f32>\n  for %x in %xs {{\n{body}"
            f"    %loss = %loss + sum(%h * %h)\n  }}\n  return %loss\n}}\n\n"
            f"func @{model}_grads(\n    {sig})\n    -> ({results}) {{\n"
            f"  {grads} = grad @{model}_loss({call}) wrt ({wrt})\n  return {grads}\n}}\n")


def gir_set_threads(threads: int) -> object | None:
    from gir.backend.cpu import blas

    mkl = blas.providers().mkl
    if mkl is not None:
        mkl.MKL_Set_Num_Threads(threads)
    return limit_blas_threads(threads)


def sgemm_peak(n: int) -> tuple[float, str]:
    """(FLOP/s, provider) of the best n^3 float32 GEMM, MKL or OpenBLAS, at the current threads."""
    from gir.backend.cpu import blas

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    c = np.zeros((n, n), np.float32)
    best, provider = 0.0, ""
    for path in (["mkl"] if blas.providers().has_mkl else []) + ["openblas"]:
        call = blas.gemm_caller(path, "f32", n, n, n, False, False, a, b, c)
        call()
        seconds = min(time_step(call, 0, 5))
        if 2.0 * n ** 3 / seconds > best:
            best, provider = 2.0 * n ** 3 / seconds, path
    return best, provider


# ---------------------------------------------------------------------------------------------
# The peers. Each `setup_<peer>(model, inputs)` returns (step, to_gir): `step()` is one training
# step in the peer's own form (timed), `to_gir(step())` gives (loss, {gir name: gradient}).


def setup_gir(model: str, p: dict[str, np.ndarray]):
    import gir

    T, B, I = p["xs"].shape
    H = p["h0"].shape[1]
    # GEMM paths measured before compiling, not in the background while steps are timed.
    os.environ.setdefault("GIR_GEMM_MEASURE", "now")
    fn = gir.jit(gir_source(model, T, B, I, H), f"{model}_grads")
    args = [p["xs"]] + [p[n] for n in param_names(model)]
    fn(*args)  # compiles; tiered compilation swaps in the -O3 code in the background:
    from gir.backend.cpu import tiers

    tiers.wait_all()  # time the -O3 code, without its compile on the other core
    names = param_names(model)
    setup_gir.fn = fn  # for fn.stats
    return (lambda: fn(*args)), (lambda out: (float(out[0]), dict(zip(names, out[1:]))))


def setup_gir_gpu(model: str, p: dict[str, np.ndarray]):
    """gir with device="gpu", the arguments as CuPy arrays (the parameters stay on the GPU, as
    PyTorch's and JAX's do) and the results CuPy arrays; the step waits for the device. Call 1
    runs eagerly, call 2 captures the CUDA graph that every later call replays (docs/gpu.md):
    both are warm-up here."""
    import cupy
    import gir

    T, B, I = p["xs"].shape
    H = p["h0"].shape[1]
    fn = gir.jit(gir_source(model, T, B, I, H), f"{model}_grads", device="gpu")
    args = [cupy.asarray(p["xs"])] + [cupy.asarray(p[n]) for n in param_names(model)]
    names = param_names(model)
    setup_gir.fn = fn  # for fn.stats

    def step():
        out = fn(*args)
        cupy.cuda.Device().synchronize()
        return out

    step()  # compiles, runs eagerly
    return step, (lambda out: (float(cupy.asnumpy(out[0])), {n: cupy.asnumpy(g) for n, g in zip(names, out[1:])}))


def setup_pytorch_loop(model: str, p: dict[str, np.ndarray]):
    """A cell cuDNN does not offer, as a PyTorch user writes it: a Python loop over the steps of
    tensor ops in the fused layout (one GEMM for every step's input projection first), autograd
    for the gradients."""
    from types import SimpleNamespace

    import torch

    if DEVICE == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA GPU (a CPU-only torch build?)")
    dev = torch.device("cuda" if DEVICE == "gpu" else "cpu")
    f = fuse(model, p)
    names = fused_names(model)
    leaves = {n: torch.from_numpy(f[n]).to(dev).requires_grad_() for n in names}
    xs = torch.from_numpy(f["xs"]).to(dev)
    T, B, I = f["xs"].shape
    H = f["h0"].shape[1]
    m = SimpleNamespace(tanh=torch.tanh, sigmoid=torch.sigmoid, dot=torch.matmul,
                        norm=lambda z: torch.nn.functional.layer_norm(z, (z.shape[-1],), eps=LN_EPS))
    peep = extras(model, leaves)

    def step():
        for t in leaves.values():
            t.grad = None
        A = (xs.reshape(T * B, I) @ leaves["Wx"] + (leaves["b"] if model != "lnlstm" else 0.0)).reshape(T, B, -1)
        h, c, loss = leaves["h0"], leaves.get("c0"), 0.0
        for t in range(T):
            h, c = cell(m, model, H, A[t], h, c, leaves["U"], leaves.get("b_hn"), peep)
            loss = loss + (h * h).sum()
        loss.backward()
        if DEVICE == "gpu":
            torch.cuda.synchronize()
        return loss

    def to_gir(loss):
        return float(loss.detach().cpu()), unfuse_grads(model, {n: t.grad.cpu().numpy() for n, t in leaves.items()})

    return step, to_gir


def setup_pytorch(model: str, p: dict[str, np.ndarray]):
    import torch

    if model in CUSTOM:
        return setup_pytorch_loop(model, p)

    T, B, I = p["xs"].shape
    H = p["h0"].shape[1]
    cls = {"rnn": torch.nn.RNN, "gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[model]
    extra = {"nonlinearity": "tanh"} if model == "rnn" else {}
    net = cls(I, H, num_layers=1, bias=True, batch_first=False, **extra)
    dev = torch.device("cuda" if DEVICE == "gpu" else "cpu")
    if DEVICE == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA GPU (a CPU-only torch build?)")
    order = {"rnn": ("h",), "gru": ("r", "z", "n"), "lstm": ("i", "f", "g", "o")}[model]  # torch's gate order
    with torch.no_grad():
        net.weight_ih_l0.copy_(torch.from_numpy(np.concatenate([p[w_name(model, g)].T for g in order])))
        net.weight_hh_l0.copy_(torch.from_numpy(np.concatenate([p[u_name(model, g)].T for g in order])))
        net.bias_ih_l0.copy_(torch.from_numpy(np.concatenate([p[b_name(model, g)] for g in order])))
        net.bias_hh_l0.zero_()
        if model == "gru":
            net.bias_hh_l0[2 * H:] = torch.from_numpy(p["b_hn"])
    net.to(dev)
    xs = torch.from_numpy(p["xs"].copy()).to(dev)
    init = [torch.from_numpy(p[s][None].copy()).to(dev).requires_grad_() for s in states(model)]
    leaves = list(net.parameters()) + init

    def step():
        for t in leaves:
            t.grad = None
        out, _ = net(xs, tuple(init) if model == "lstm" else init[0])
        loss = (out * out).sum()
        loss.backward()
        if DEVICE == "gpu":
            torch.cuda.synchronize()  # time the work, not its launch
        return loss

    def to_gir(loss):
        g = {s: t.grad[0].cpu().numpy() for s, t in zip(states(model), init)}
        parts = {k: np.split(getattr(net, f"{k}_l0").grad.cpu().numpy(), len(order))
                 for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        for gate, wi, wh, bi in zip(order, parts["weight_ih"], parts["weight_hh"], parts["bias_ih"]):
            g[w_name(model, gate)], g[u_name(model, gate)], g[b_name(model, gate)] = wi.T, wh.T, bi
        if model == "gru":
            g["b_hn"] = parts["bias_hh"][2]
        return float(loss.detach().cpu()), g

    return step, to_gir


def extras(model: str, q: dict) -> tuple | None:
    """The cell's parameters beyond Wx, U, b and b_hn (EXTRAS; for lnlstm the gate biases b
    too, added after the normalisation), in the fused layout q."""
    if model not in EXTRAS:
        return None
    return tuple(q[n] for n in EXTRAS[model]) + ((q["b"],) if model == "lnlstm" else ())


def _lnlstm_cell(m, H: int, s, c, ln):
    """The LayerNorm-LSTM's step on s = x W + h U (no bias yet): each gate normalised over its H
    units (m.norm: (z - mean) / sqrt(var + eps)), scaled by its gain and shifted by its bias; the
    new cell normalised likewise before its tanh."""
    a_i, a_f, a_g, a_o, a_c, b_c, b = ln
    i, f, g, o = (m.norm(s[:, k * H:(k + 1) * H]) * gain + b[k * H:(k + 1) * H]
                  for k, gain in enumerate((a_i, a_f, a_g, a_o)))
    c = m.sigmoid(f) * c + m.sigmoid(i) * m.tanh(g)
    return m.sigmoid(o) * m.tanh(m.norm(c) * a_c + b_c), c


def cell(m, model: str, H: int, a, h, c, U, b_hn, peep=None):
    """One step in the fused layout, shared by JAX and PyTensor: `a` is this step's input
    projection x W + b (x W for lnlstm, whose biases come after the normalisation), `m` gives
    tanh, sigmoid, dot (and norm, for lnlstm), `peep` the model's `extras`. Returns the new
    (h, c)."""
    hu = m.dot(h, U)
    if model == "lnlstm":
        return _lnlstm_cell(m, H, a + hu, c, peep)
    if model == "rnn":
        return m.tanh(a + hu), c
    if model == "gru":
        z = m.sigmoid(a[:, :H] + hu[:, :H])
        r = m.sigmoid(a[:, H:2 * H] + hu[:, H:2 * H])
        n = m.tanh(a[:, 2 * H:] + r * (hu[:, 2 * H:] + b_hn))
        return (1.0 - z) * n + z * h, c
    s = a + hu
    if model == "peephole":
        p_i, p_f, p_o = peep
        i, f = m.sigmoid(s[:, :H] + c * p_i), m.sigmoid(s[:, H:2 * H] + c * p_f)
        c = f * c + i * m.tanh(s[:, 2 * H:3 * H])
        return m.sigmoid(s[:, 3 * H:] + c * p_o) * m.tanh(c), c
    i, f, o = m.sigmoid(s[:, :H]), m.sigmoid(s[:, H:2 * H]), m.sigmoid(s[:, 3 * H:])
    c = f * c + i * m.tanh(s[:, 2 * H:3 * H])
    return o * m.tanh(c), c


def layer_norm(z):
    """LayerNorm without gain or shift over the last axis, for NumPy and JAX arrays."""
    return (z - z.mean(axis=-1, keepdims=True)) / (z.var(axis=-1, keepdims=True) + LN_EPS) ** 0.5


def setup_jax(model: str, p: dict[str, np.ndarray]):
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp

    if DEVICE == "gpu" and jax.default_backend() != "gpu":
        raise RuntimeError(f"JAX's backend is {jax.default_backend()!r}, not the GPU (pip install 'jax[cuda12]')")
    m = SimpleNamespace(tanh=jnp.tanh, sigmoid=jax.nn.sigmoid, dot=jnp.dot, norm=layer_norm)
    f = fuse(model, p)
    names = fused_names(model)
    T, B, I = f["xs"].shape
    H = f["h0"].shape[1]

    def loss_fn(xs, *params):
        q = dict(zip(names, params))
        A = (xs.reshape(T * B, I) @ q["Wx"] + (q["b"] if model != "lnlstm" else 0.0)).reshape(T, B, -1)

        def body(carry, a):
            h, c, loss = carry
            peep = extras(model, q)
            h, c = cell(m, model, H, a, h, c, q["U"], q.get("b_hn"), peep)
            return (h, c, loss + jnp.sum(h * h)), None

        (_, _, loss), _ = jax.lax.scan(body, (q["h0"], q.get("c0"), jnp.float32(0)), A)
        return loss

    grad = jax.jit(jax.value_and_grad(loss_fn, argnums=tuple(range(1, len(names) + 1))))
    args = [jax.device_put(f["xs"])] + [jax.device_put(f[n]) for n in names]

    def to_gir(out):
        loss, grads = out
        return float(loss), unfuse_grads(model, {n: np.asarray(g) for n, g in zip(names, grads)})

    return (lambda: jax.block_until_ready(grad(*args))), to_gir


def setup_pytensor(model: str, p: dict[str, np.ndarray]):
    warnings.filterwarnings("ignore", message=".*BLAS.*")  # C BLAS is not used by the Numba linker
    from types import SimpleNamespace

    import pytensor
    import pytensor.tensor as pt

    m = SimpleNamespace(tanh=pt.tanh, sigmoid=pt.sigmoid, dot=pt.dot)
    f = fuse(model, p)
    names = fused_names(model)
    T, B, I = f["xs"].shape
    H = f["h0"].shape[1]
    xs = pt.tensor("xs", shape=f["xs"].shape, dtype="float32")
    q = {n: pt.tensor(n, shape=f[n].shape, dtype="float32") for n in names}
    A = (pt.dot(xs.reshape((T * B, I)), q["Wx"]) + q["b"]).reshape((T, B, f["b"].shape[0]))

    if model == "lstm":
        def body(a, h, c, U):
            return list(cell(m, model, H, a, h, c, U, None))
        (hs, _), _ = pytensor.scan(body, sequences=[A], outputs_info=[q["h0"], q["c0"]], non_sequences=[q["U"]])
    else:
        extra = [q["b_hn"]] if model == "gru" else []

        def body(a, h, U, *b_hn):
            return cell(m, model, H, a, h, None, U, b_hn[0] if b_hn else None)[0]
        hs, _ = pytensor.scan(body, sequences=[A], outputs_info=[q["h0"]], non_sequences=[q["U"]] + extra)
    loss = pt.sum(hs * hs)
    fn = pytensor.function([xs] + [q[n] for n in names], [loss] + pytensor.grad(loss, [q[n] for n in names]))
    args = [f["xs"]] + [f[n] for n in names]

    def to_gir(out):
        return float(out[0]), unfuse_grads(model, dict(zip(names, out[1:])))

    return (lambda: fn(*args)), to_gir


def numpy_step(model: str, xs, h0, Wx, U, b, c0=None, b_hn=None):
    """Hand-written BPTT in the fused layout: (loss, {fused name: gradient})."""
    T, B, I = xs.shape
    H = h0.shape[1]
    G = U.shape[1]
    f32 = np.float32

    def sig(v):
        return 0.5 + 0.5 * np.tanh(0.5 * v)  # overflow-free logistic

    X = xs.reshape(T * B, I)
    A = (X @ Wx).reshape(T, B, G)  # input projections of all steps: one GEMM
    A += b
    hs = np.empty((T + 1, B, H), f32)  # h_{-1} = h0, then h_0 .. h_{T-1}
    hs[0] = h0
    hu = np.empty((B, G), f32)
    if model == "rnn":
        for t in range(T):
            np.matmul(hs[t], U, out=hu)
            hu += A[t]
            np.tanh(hu, out=hs[t + 1])
    elif model == "gru":
        Z, R, N, HN = (np.empty((T, B, H), f32) for _ in range(4))
        for t in range(T):
            np.matmul(hs[t], U, out=hu)
            Z[t] = sig(A[t, :, :H] + hu[:, :H])
            R[t] = sig(A[t, :, H:2 * H] + hu[:, H:2 * H])
            np.add(hu[:, 2 * H:], b_hn, out=HN[t])
            N[t] = np.tanh(A[t, :, 2 * H:] + R[t] * HN[t])
            hs[t + 1] = N[t] + Z[t] * (hs[t] - N[t])
    else:
        S = np.empty((T, B, G), f32)  # gate activations i, f, g, o
        cs = np.empty((T + 1, B, H), f32)
        tcs = np.empty((T, B, H), f32)
        cs[0] = c0
        for t in range(T):
            s = S[t]
            np.matmul(hs[t], U, out=s)
            s += A[t]
            s[:, :2 * H] = sig(s[:, :2 * H])
            np.tanh(s[:, 2 * H:3 * H], out=s[:, 2 * H:3 * H])
            s[:, 3 * H:] = sig(s[:, 3 * H:])
            cs[t + 1] = s[:, H:2 * H] * cs[t] + s[:, :H] * s[:, 2 * H:3 * H]
            np.tanh(cs[t + 1], out=tcs[t])
            np.multiply(s[:, 3 * H:], tcs[t], out=hs[t + 1])
    loss = float(np.vdot(hs[1:], hs[1:]))

    dA = np.empty((T, B, G), f32)  # d(pre-activation) of the recurrent product, per step
    dh = np.zeros((B, H), f32)
    if model == "rnn":
        for t in range(T - 1, -1, -1):
            h = hs[t + 1]
            dh += 2 * h
            np.multiply(dh, 1 - h * h, out=dA[t])
            np.matmul(dA[t], U.T, out=dh)
        dAx = dA
    elif model == "gru":
        dAx = np.empty((T, B, G), f32)  # differs from dA in the n part: d(x w_n) vs d(h u_n)
        for t in range(T - 1, -1, -1):
            z, r, n = Z[t], R[t], N[t]
            dh += 2 * hs[t + 1]
            dn = dh * (1 - z) * (1 - n * n)
            dA[t, :, :H] = dh * (hs[t] - n) * z * (1 - z)
            dA[t, :, H:2 * H] = dn * HN[t] * r * (1 - r)
            np.multiply(dn, r, out=dA[t, :, 2 * H:])
            dAx[t, :, :2 * H] = dA[t, :, :2 * H]
            dAx[t, :, 2 * H:] = dn
            dh = dA[t] @ U.T + dh * z
    else:
        dc = np.zeros((B, H), f32)
        for t in range(T - 1, -1, -1):
            s = S[t]
            i, f, g, o = s[:, :H], s[:, H:2 * H], s[:, 2 * H:3 * H], s[:, 3 * H:]
            dh += 2 * hs[t + 1]
            dc += dh * o * (1 - tcs[t] * tcs[t])
            dA[t, :, :H] = dc * g * i * (1 - i)
            dA[t, :, H:2 * H] = dc * cs[t] * f * (1 - f)
            dA[t, :, 2 * H:3 * H] = dc * i * (1 - g * g)
            dA[t, :, 3 * H:] = dh * tcs[t] * o * (1 - o)
            dc *= f
            np.matmul(dA[t], U.T, out=dh)
        dAx = dA
    grads = {"h0": dh,
             "Wx": X.T @ dAx.reshape(T * B, G),  # weight gradients: one GEMM each
             "U": hs[:-1].reshape(T * B, H).T @ dA.reshape(T * B, G),
             "b": dAx.sum(axis=(0, 1))}
    if model == "gru":
        grads["b_hn"] = dA[:, :, 2 * H:].sum(axis=(0, 1))
    if model == "lstm":
        grads["c0"] = dc
    return loss, grads


def setup_numpy(model: str, p: dict[str, np.ndarray]):
    f = fuse(model, p)
    kwargs = {n: f[n] for n in ("xs", "h0", "Wx", "U", "b", "c0", "b_hn") if n in f}

    def to_gir(out):
        return out[0], unfuse_grads(model, out[1])

    return (lambda: numpy_step(model, **kwargs)), to_gir


SETUP = {"gir": setup_gir, "pytorch": setup_pytorch, "jax": setup_jax, "pytensor": setup_pytensor,
         "numpy": setup_numpy}


def peer_version(peer: str) -> str:
    if peer == "gir":
        import gir
        from gir.backend.cpu import blas

        return f"gir {gir.__version__} ({'MKL + OpenBLAS' if blas.providers().has_mkl else 'OpenBLAS'})"
    if peer == "pytorch":
        import torch

        return f"torch {torch.__version__}"
    if peer == "jax":
        import jax
        import jaxlib

        return f"jax {jax.__version__} (jaxlib {jaxlib.__version__})"
    if peer == "pytensor":
        import pytensor
        from pytensor.compile.mode import get_default_mode

        return f"pytensor {pytensor.__version__} ({type(get_default_mode().linker).__name__})"
    return f"numpy {np.__version__}"


# ---------------------------------------------------------------------------------------------
# The worker: one (peer, thread count) in a fresh process


def worker(peer: str, job_dir: Path, threads: int) -> None:
    """Runs every case of the job for one peer: gradients first (checked against gir's, where
    given), then timing. Writes <peer>.json and <peer>-<case>.npz (the gradients) in job_dir."""
    pin_to_cores(threads)
    job = json.loads((job_dir / "job.json").read_text())
    keep = []
    if peer in ("gir", "numpy"):
        keep.append(gir_set_threads(threads) if peer == "gir" else limit_blas_threads(threads))
    if peer == "pytorch":
        import torch

        torch.set_num_threads(threads)
    result: dict = {"version": peer_version(peer), "cases": {}}
    global DEVICE
    DEVICE = job.get("device", "cpu")
    if peer == "gir" and DEVICE == "cpu":
        n = PEAK_N_QUICK if job["quick"] else PEAK_N
        peak, provider = sgemm_peak(n)
        result["peak"] = {"flops": peak, "provider": provider, "n": n}
        print(f"  sgemm peak ({n}^3, {threads} thread{'s' * (threads > 1)}): {peak / 1e9:.1f} GFLOP/s ({provider})",
              flush=True)
    for case in job["cases"]:
        name, model = case["name"], case["model"]
        r: dict = {}
        result["cases"][name] = r
        try:
            if model in CUSTOM and peer in ("numpy", "pytensor"):
                r["status"], r["message"] = "skipped", f"no {model} form for {PEER_TITLES[peer]}"
                continue
            inputs = dict(np.load(job_dir / f"inputs-{name}.npz"))
            started = time.perf_counter()
            setup = setup_gir_gpu if (peer, DEVICE) == ("gir", "gpu") else SETUP[peer]
            step, to_gir = setup(model, inputs)
            loss, grads = to_gir(step())
            r["first_call_s"] = time.perf_counter() - started
            np.savez(job_dir / f"{peer}-{name}.npz", loss=np.float64(loss), **grads)
            ref_file = job_dir / f"gir-{name}.npz"
            if peer != "gir":
                if not ref_file.exists():
                    raise RuntimeError("no gir reference to check against (gir failed on this case)")
                ref = dict(np.load(ref_file))
                ref_loss = float(ref.pop("loss"))
                err, where = compare(ref_loss, ref, loss, grads)
                r["error"], r["worst"] = err, where
                if not err < TOLERANCE:
                    r["status"] = "mismatch"
                    print(f"  {peer:8s} {name:8s} gradients DISAGREE with gir: rel. error {err:.2e} in {where}; "
                          "not timed", flush=True)
                    continue
            r["times"] = time_step(step, job["warmup"], job["repeat"])
            r["status"] = "ok"
            if peer == "gir" and DEVICE == "gpu":
                st = setup_gir.fn.stats
                r.update(kernel_launches=st.kernel_launches, gemm_calls=st.gemm_calls, copies=st.copies,
                         xp_launches=st.xp_launches, graph_replays=st.graph_replays, graph=st.graph)
            elif peer == "gir":
                st = setup_gir.fn.stats
                r["gemm_calls"], r["pack_calls"], r["gemm_paths"] = st.gemm_calls, st.pack_calls, st.gemm_paths
            check = "" if peer == "gir" else f", gradients match (rel. error {r['error']:.1e})"
            print(f"  {peer:8s} {name:8s} {1e3 * statistics.median(r['times']):10.3f} ms median of "
                  f"{len(r['times'])}{check}", flush=True)
        except Exception as e:  # reported per case; the other cases still run
            r["status"], r["message"] = "error", f"{type(e).__name__}: {e}"
            print(f"  {peer:8s} {name:8s} FAILED: {r['message']}", flush=True)
    (job_dir / f"{peer}.json").write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------------------------------------
# The driver: inputs, one subprocess per (threads, peer), the table and the plot


def find_pytensor_python(option: str | None) -> str | None:
    if option:
        return option
    if os.environ.get("GIR_BENCH_PYTENSOR_PYTHON"):
        return os.environ["GIR_BENCH_PYTENSOR_PYTHON"]
    if importlib.util.find_spec("pytensor") is not None:
        return sys.executable
    sibling = ROOT.parent / "pytensor-venv" / "bin" / "python"
    return str(sibling) if sibling.exists() else None


def missing_notice(peer: str, pytensor_python: str | None) -> str | None:
    if peer == "pytensor":
        if pytensor_python is not None and not Path(pytensor_python).exists():
            return f"PyTensor's python {pytensor_python} does not exist: skipped"
        if pytensor_python is None:
            return ("PyTensor not found: skipped (python -m venv ../pytensor-venv && "
                    "../pytensor-venv/bin/pip install pytensor numpy, or --pytensor-python PATH)")
        return None
    module = PEER_MODULES.get(peer)
    if module and importlib.util.find_spec(module) is None:
        return f"{PEER_TITLES[peer]} not installed: skipped (pip install -e '.[bench]')"
    return None


def run_worker(peer: str, job_dir: Path, threads: int, python: str, device: str = "cpu") -> dict | None:
    log = job_dir / f"{peer}.log"
    cmd = [python, str(Path(__file__).resolve()), "--_worker", peer, "--_job", str(job_dir), "--_threads",
           str(threads)]
    started = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run(cmd, env=thread_env(threads, device), stderr=err, cwd=ROOT)
    print(f"  ({PEER_TITLES[peer]}: {time.perf_counter() - started:.0f} s in all, compiling included)", flush=True)
    out = job_dir / f"{peer}.json"
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"  {peer}: worker failed (exit {proc.returncode}):\n{tail}", flush=True)
        return None
    data = json.loads(out.read_text())
    out.unlink()
    return data


GPU_PROBE = """
import os, sys
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
try:
    from numba import cuda
except ImportError as e:
    sys.exit(f"numba-cuda is not installed ({e}): pip install 'gir[gpu]'")
if not cuda.is_available():
    sys.exit("numba-cuda finds no CUDA GPU (no NVIDIA driver or no device)")
try:
    import cupy
except ImportError as e:
    sys.exit(f"CuPy is not installed ({e}): pip install 'gir[gpu]'")
name = cuda.get_current_device().name
print(name.decode() if isinstance(name, bytes) else name)
"""
"""Prints the GPU's name, or exits non-zero saying what is missing (in a subprocess: the
simulator switch must be set before numba is imported, and a failed CUDA init stays failed)."""


def find_gpu() -> tuple[str | None, str]:
    """(the GPU's name, "") where gir's GPU backend can run here, else (None, why not)."""
    try:
        proc = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"the GPU probe failed: {e}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"the GPU probe exited with {proc.returncode}"
    return proc.stdout.strip().splitlines()[-1], ""


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    count = sum(1 for line in text.splitlines() if line.startswith("processor"))
    flags = set(fields.get("flags", "").split())
    simd = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), "")
    ident = ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields)
    return (f"{fields.get('model name', platform.machine())} ({ident}{', ' + simd if simd else ''}), "
            f"{count} logical CPUs")


def cell_text(row: dict, peer: str) -> str:
    r = row["peers"].get(peer)
    if r is None:
        return "—"
    if r["status"] == "skipped":
        return r.get("message", "not installed")
    if r["status"] == "mismatch":
        return f"grads differ ({r['error']:.1e}, {r['worst']})"
    if r["status"] != "ok":
        return "failed"
    ms = r["median"] * 1e3
    parts = [f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"]
    gir = row["peers"].get("gir")
    if peer != "gir" and gir and gir["status"] == "ok":
        parts.append(f"{r['median'] / gir['median']:.2f}×")
    if row.get("floor"):
        frac = 100 * row["floor"] / r["median"]
        parts.append(f"{frac:.0f} %" if frac >= 10 else f"{frac:.1f} %")
    return " · ".join(parts)


TARGETS = [
    ("issue 7: at 2 threads, RNN and GRU, gir faster than every peer and at least 80 % of the floor",
     ("rnn", "gru"), 0.8, 1.0),
    ("issue 14: at 2 threads, every model, gir at least 70 % of the floor and faster than every peer "
     "(aim: 1.15x the best peer)", ("rnn", "gru", "lstm"), 0.7, 1.0),
]
"""(title, models, share of the floor, speed-up over the best peer) of the targets reported."""


def target_lines(rows: list[dict], peers: list[str], models: tuple[str, ...] = ("rnn", "gru"),
                 share: float = 0.8, speedup: float = 1.0) -> list[str]:
    """A target per 2-thread row of `models`: gir faster than every peer by `speedup` and at
    `share` or more of the sgemm-peak floor; the verdict names the best peer's ratio."""
    lines = []
    for row in rows:
        if row["model"] not in models or row["threads"] != 2:
            continue
        gir = row["peers"].get("gir")
        if not gir or gir["status"] != "ok":
            lines.append(f"- {row['model']} {row['size']}: gir did not run")
            continue
        ran = {p: row["peers"][p]["median"] for p in peers
               if p != "gir" and row["peers"].get(p, {}).get("status") == "ok"}
        slower = [PEER_TITLES[p] for p, t in ran.items() if t < gir["median"] * speedup]
        frac = row["floor"] / gir["median"] if row.get("floor") else float("nan")
        verdict = "met" if not slower and frac >= share else "NOT met"
        facts = [f"{100 * frac:.0f} % of the floor"]
        if ran:
            best = min(ran, key=ran.__getitem__)
            facts.append(f"{ran[best] / gir['median']:.2f}x {PEER_TITLES[best]}, the fastest peer")
        if slower:
            facts.append(("not faster than " if speedup == 1.0 else f"not {speedup:g}x faster than ")
                         + ", ".join(slower))
        lines.append(f"- {row['model']} {row['size']}: {verdict} ({'; '.join(facts)})")
    return lines


def write_markdown(path: Path, rows: list[dict], peers: list[str], meta: dict) -> None:
    heads = ["model", "size", "threads", "GEMM GFLOP", "floor ms"] + [PEER_TITLES[p] for p in peers]
    lines: list[str] = [
        "# Training step of RNN, GRU and LSTM: gir against PyTorch, JAX, PyTensor and NumPy",
        "",
        "Written by `bench/rnn.py` (its docstring explains the method). One training step = forward",
        "over T steps and BPTT: the loss (sum over steps of sum(h*h)) and the gradients of every",
        "weight, every bias and the initial state, float32, CPU. Every peer's gradients were checked",
        f"against gir's (relative error to the largest magnitude < {TOLERANCE:g}) before it was timed.",
        "",
    ]
    if meta["quick"]:
        lines += ["**A `--quick` run: tiny sizes, a smoke test of the peers; its times mean nothing.**", ""]
    lines += [
        f"- Command: `{meta['command']}`",
        f"- Machine: {meta['cpu']}; {meta['platform']}; Python {platform.python_version()}",
        f"- Versions: {'; '.join(meta['versions'])}",
        f"- Timing: median of {meta['repeat']} steps after {meta['warmup']} warm-up steps, one process "
        "per peer and thread count",
        "- Sizes: " + "; ".join(f"{k}: T={t} batch={b} input={i} hidden={h}"
                                for k, (t, b, i, h) in meta["sizes"].items()),
        "- Measured sgemm peak (best of MKL/OpenBLAS): " + "; ".join(
            f"{t} thread{'s' * (t > 1)}: {pk['flops'] / 1e9:.1f} GFLOP/s ({pk['provider']}, {pk['n']}^3)"
            for t, pk in sorted(meta["peaks"].items())),
        "",
        "Each cell: median time · time relative to gir (> 1: gir is faster) · fraction of the",
        "sgemm-peak floor (floor / time; floor = GEMM FLOPs of the step / measured sgemm peak).",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * (len(heads) - 3)) + "|",
    ]
    for row in rows:
        floor = f"{row['floor'] * 1e3:.4g}" if row.get("floor") else "—"
        cells = [row["model"], row["size"], str(row["threads"]), f"{row['flops'] / 1e9:.4g}", floor]
        lines.append("| " + " | ".join(cells + [cell_text(row, p) for p in peers]) + " |")
    for title, models, share, speedup in TARGETS:
        lines += ["", f"Performance target ({title}):", ""]
        lines += target_lines(rows, peers, models, share, speedup) or \
            [f"- not measured in this run (needs 2 threads and {'/'.join(models)})"]
    if meta["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in meta["notes"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if path.exists():  # the hand-written analysis below the marker survives a new table
        old = path.read_text()
        if KEEP_MARKER in old:
            kept = "\n" + old[old.index(KEEP_MARKER):]
    path.write_text("\n".join(lines) + "\n" + kept)


KEEP_MARKER = "<!-- kept by bench/rnn.py: written by hand below -->"


GPU_TARGETS = "every case at most 1.0x PyTorch cuDNN's time; LSTM-S and GRU-S at most 0.8x the faster of cuDNN and JAX"
"""Issue 26's targets (docs/performance-gpu.md reports each row's ratios against them)."""


def write_markdown_gpu(path: Path, rows: list[dict], peers: list[str], meta: dict) -> None:
    """docs/performance-gpu.md: the GPU's name, the cases, each peer's median and ratio to gir."""
    heads = ["model", "size"] + [PEER_TITLES[p] for p in peers] + ["gir / cuDNN", "gir / best peer"]
    lines = [
        f"# Training step of RNN, GRU and LSTM on the GPU ({meta['gpu']})",
        "",
        "Written by `bench/rnn.py --device gpu` (its docstring explains the method). One training step",
        "(forward over T steps + BPTT, every gradient), float32, on one GPU: gir `device=\"gpu\"` (CuPy",
        "arrays in and out, a CUDA graph replayed per call after two warm-up calls), PyTorch's cuDNN",
        "nn.RNN/GRU/LSTM and JAX (lax.scan + jit), in the same run. Every peer's gradients were checked",
        f"against gir's (relative error < {TOLERANCE:g}) before it was timed.",
        "",
    ]
    if meta["quick"]:
        lines += ["**A `--quick` run: tiny sizes, a smoke test of the peers; its times mean nothing.**", ""]
    lines += [
        f"- Command: `{meta['command']}`",
        f"- GPU: {meta['gpu']}; host: {meta['cpu']}; {meta['platform']}",
        f"- Versions: {'; '.join(meta['versions'])}",
        f"- Timing: median of {meta['repeat']} steps after {meta['warmup']} warm-up steps, one process per peer",
        "- Sizes: " + "; ".join(f"{k}: T={t} batch={b} input={i} hidden={h}"
                                for k, (t, b, i, h) in meta["sizes"].items()),
        f"- Targets (issue 26): {GPU_TARGETS}; the custom cells ({', '.join(CUSTOM)}) within 1.5x of cuDNN's "
        "plain LSTM",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(heads) - 2)) + "|",
    ]
    cudnn_lstm = {row["size"]: row["peers"]["pytorch"]["median"] for row in rows
                  if row["model"] == "lstm" and row["peers"].get("pytorch", {}).get("status") == "ok"}
    for row in rows:
        ok = {p: row["peers"][p]["median"] for p in peers if row["peers"].get(p, {}).get("status") == "ok"}
        gir_t = ok.get("gir")
        vs_cudnn = f"{gir_t / ok['pytorch']:.2f}" if gir_t and "pytorch" in ok else "—"
        if row["model"] in CUSTOM:  # PyTorch's is a Python loop: the target is cuDNN's plain LSTM
            lstm_t = cudnn_lstm.get(row["size"])
            vs_cudnn = f"{gir_t / lstm_t:.2f} (vs the LSTM's)" if gir_t and lstm_t else "—"
        best = min((t for p, t in ok.items() if p != "gir"), default=None)
        vs_best = f"{gir_t / best:.2f}" if gir_t and best else "—"
        lines.append("| " + " | ".join([row["model"], row["size"]] + [cell_text(row, p) for p in peers]
                                       + [vs_cudnn, vs_best]) + " |")
    if meta["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in meta["notes"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = ""
    if path.exists():
        old = path.read_text()
        if KEEP_MARKER in old:
            kept = "\n" + old[old.index(KEEP_MARKER):]
    path.write_text("\n".join(lines) + "\n" + kept)


def write_plot(path: Path, rows: list[dict], peers: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thread_counts = sorted({r["threads"] for r in rows})
    fig, axes = plt.subplots(1, len(thread_counts), figsize=(6.5 * len(thread_counts), 4.8), squeeze=False)
    width = 0.8 / len(peers)
    for ax, threads in zip(axes[0], thread_counts):
        group = [r for r in rows if r["threads"] == threads]
        for k, peer in enumerate(peers):
            xs, ys = [], []
            for j, row in enumerate(group):
                r = row["peers"].get(peer)
                if r and r["status"] == "ok":
                    xs.append(j - 0.4 + (k + 0.5) * width)
                    ys.append(r["median"] * 1e3)
            ax.bar(xs, ys, width, label=PEER_TITLES[peer])
        for j, row in enumerate(group):
            if row.get("floor"):
                ax.hlines(row["floor"] * 1e3, j - 0.45, j + 0.45, colors="black", linestyles="dashed",
                          label="sgemm-peak floor" if j == 0 else None)
        ax.set_xticks(range(len(group)), [f"{r['model']} {r['size']}" for r in group])
        ax.set_yscale("log")
        ax.set_ylabel("training step, median ms (log)")
        ax.set_title(f"{threads} thread{'s' * (threads > 1)}")
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small", frameon=False)
    fig.suptitle("RNN / GRU / LSTM training step (forward + BPTT), float32, CPU")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma-separated: rnn,gru,lstm,peephole,lnlstm (default "
                    "rnn,gru,lstm on the CPU, rnn,gru,lstm,peephole,lnlstm on the GPU)")
    ap.add_argument("--sizes", default=None, help="comma-separated: S (T=50 B=32 256), M (T=100 B=64 512) and, on "
                    "the GPU, L (T=100 B=256 1024) (default S,M on the CPU, S,M,L on the GPU)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, each in fresh processes")
    ap.add_argument("--peers", default=None,
                    help="peers beside gir (gir always runs: it is the reference; default pytorch,jax,pytensor,numpy "
                    "on the CPU, pytorch,jax on the GPU)")
    ap.add_argument("--repeat", type=int, default=None, help="timed steps per case (default 15; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps before timing (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run that checks every peer")
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"),
                    help="cpu; gpu: gir device='gpu' against PyTorch cuDNN and JAX on the same GPU (fails "
                    "without one); auto: gpu where there is one, else cpu")
    ap.add_argument("--out", default=None, help="markdown table (default docs/performance-rnn.md, on the GPU "
                    "docs/performance-gpu.md; none with --quick)")
    ap.add_argument("--plot", default=None, help="PNG bar chart (default bench/rnn.png; none with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pytensor-python", default=None, help="python of a virtualenv with pytensor")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_job", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        worker(args._worker, Path(args._job), args._threads)
        return 0
    device, gpu_name = args.device, None
    if device in ("gpu", "auto"):
        gpu_name, why = find_gpu()
        if gpu_name is None and device == "gpu":
            ap.error(f"--device gpu: no GPU for gir's GPU backend here: {why} (--device auto falls back to the CPU)")
        device = "gpu" if gpu_name else "cpu"
        print(f"device: {gpu_name or 'cpu (' + why + ')'}", flush=True)
    on_gpu = device == "gpu"
    all_sizes, all_peers = (GPU_SIZES, GPU_PEERS) if on_gpu else (SIZES, PEERS)
    models = [m.strip().lower() for m in (args.models or ("rnn,gru,lstm,peephole,lnlstm" if on_gpu else "rnn,gru,lstm"))
              .split(",") if m.strip()]
    sizes = [s.strip().upper() for s in (args.sizes or ("S,M,L" if on_gpu else "S,M")).split(",") if s.strip()]
    others = [p.strip().lower() for p in (args.peers or ("pytorch,jax" if on_gpu else "pytorch,jax,pytensor,numpy"))
              .split(",") if p.strip() and p.strip().lower() != "gir"]
    for bad, allowed, what in ((set(models) - set(MODELS), MODELS, "--models"),
                               (set(sizes) - set(all_sizes), tuple(all_sizes), "--sizes"),
                               (set(others) - set(all_peers), all_peers, "--peers")):
        if bad:
            ap.error(f"{what}: unknown {', '.join(sorted(bad))} (choose from {', '.join(allowed)})")
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error("--threads: comma-separated integers, e.g. 1,2")
    if not thread_counts or min(thread_counts) < 1:
        ap.error("--threads: at least one count, each >= 1")
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 15)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if repeat < 1 or warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    if on_gpu:
        thread_counts = [1]  # the host side of a GPU step: one process, one thread count
    default_out = "performance-gpu.md" if on_gpu else "performance-rnn.md"
    out = Path(args.out) if args.out else (None if args.quick else ROOT / "docs" / default_out)
    plot = Path(args.plot) if args.plot else (None if args.quick or on_gpu else ROOT / "bench" / "rnn.png")
    quick_table, full_table = (GPU_QUICK_SIZES, GPU_SIZES) if on_gpu else (QUICK_SIZES, SIZES)
    size_table = {s: (quick_table if args.quick else full_table)[s] for s in sizes}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    notes: list[str] = []
    if max(thread_counts) > cpus:
        notes.append(f"asked for {max(thread_counts)} threads on {cpus} available CPUs")
        print(f"warning: {notes[-1]}", file=sys.stderr)

    pytensor_python = find_pytensor_python(args.pytensor_python)
    peers = ["gir"]
    for p in [p for p in PEERS if p in others]:
        notice = missing_notice(p, pytensor_python)
        if notice:
            notes.append(notice)
            print(f"notice: {notice}", flush=True)
        else:
            peers.append(p)
    skipped = [p for p in others if p not in peers]

    cases = [{"name": f"{m}-{s}", "model": m, "size": s} for s in sizes for m in models]
    rows: list[dict] = []
    peaks: dict[int, dict] = {}
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gir-bench-rnn-") as tmp:
        job_dir = Path(tmp)
        for case in cases:
            T, B, I, H = size_table[case["size"]]
            np.savez(job_dir / f"inputs-{case['name']}.npz", **make_inputs(case["model"], T, B, I, H, args.seed))
        (job_dir / "job.json").write_text(json.dumps({"cases": cases, "repeat": repeat, "warmup": warmup,
                                                      "quick": args.quick, "device": device}))
        for threads in thread_counts:
            print(f"== {threads} thread{'s' * (threads > 1)} ==", flush=True)
            results: dict[str, dict | None] = {}
            for stale in job_dir.glob("gir-*.npz"):  # the reference is gir's at this thread count
                stale.unlink()
            for peer in peers:
                python = pytensor_python if peer == "pytensor" else sys.executable
                results[peer] = run_worker(peer, job_dir, threads, python, device)
                if results[peer]:
                    versions[peer] = results[peer]["version"]
                if peer == "gir" and results["gir"] and "peak" in results["gir"]:
                    peaks[threads] = results["gir"]["peak"]
            for case in cases:
                T, B, I, H = size_table[case["size"]]
                flops = gemm_flops(case["model"], T, B, I, H)
                peak = peaks.get(threads, {}).get("flops")
                row = {"model": case["model"], "size": case["size"], "threads": threads, "flops": flops,
                       "floor": flops / peak if peak else None, "peers": {}}
                for peer in peers:
                    r = (results.get(peer) or {}).get("cases", {}).get(case["name"])
                    if r is None:
                        row["peers"][peer] = {"status": "error"}
                        notes.append(f"{PEER_TITLES[peer]}, {case['name']}, {threads} thread(s): the worker "
                                     "process failed (its log is printed above)")
                        continue
                    if r.get("status") == "ok":
                        r["median"] = statistics.median(r["times"])
                    row["peers"][peer] = r
                    if r.get("status") in ("error", "mismatch"):
                        detail = r.get("message") or f"gradients differ from gir's: {r['error']:.2e} in {r['worst']}"
                        notes.append(f"{PEER_TITLES[peer]}, {case['name']}, {threads} thread(s): {detail}")
                for peer in skipped:
                    row["peers"][peer] = {"status": "skipped"}
                gir_r = row["peers"]["gir"]
                if gir_r.get("status") == "ok" and on_gpu:
                    notes.append(f"gir {case['name']}: {gir_r['graph']}; per call {gir_r['kernel_launches']} kernels, "
                                 f"{gir_r['gemm_calls']} GEMMs, {gir_r['xp_launches']} other launches, "
                                 f"{gir_r['copies']} device copies, {gir_r['graph_replays']} graph launch(es)")
                elif gir_r.get("status") == "ok" and threads == thread_counts[0]:
                    notes.append(f"gir {case['name']}: {gir_r['gemm_calls']} GEMM calls and {gir_r['pack_calls']} "
                                 f"packs per training step; GEMM paths {gir_r['gemm_paths']}")
                rows.append(row)

    shown = [p for p in PEERS if p in peers or p in skipped]
    print()
    print(f"{'model':6s} {'size':4s} {'thr':>3s} {'floor ms':>9s}  "
          + "  ".join(f"{PEER_TITLES[p]:>26s}" for p in shown))
    for row in rows:
        floor = f"{row['floor'] * 1e3:9.3f}" if row.get("floor") else f"{'—':>9s}"
        print(f"{row['model']:6s} {row['size']:4s} {row['threads']:3d} {floor}  "
              + "  ".join(f"{cell_text(row, p):>26s}" for p in shown))
    print("(cell: median · peer/gir time · floor/time)")
    for n in notes:
        print(f"note: {n}")
    command = "python bench/rnn.py" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    meta = {"command": command, "cpu": cpu_name(), "gpu": gpu_name, "platform": platform.platform(), "repeat": repeat,
            "warmup": warmup, "sizes": size_table, "quick": args.quick, "peaks": peaks, "notes": notes,
            "versions": [versions[p] for p in peers if p in versions]}
    if out:
        (write_markdown_gpu if on_gpu else write_markdown)(out, rows, shown, meta)
        print(f"wrote {out}")
    if plot:
        try:
            write_plot(plot, rows, shown)
            print(f"wrote {plot}")
        except ImportError:
            print("notice: matplotlib not installed: no plot (pip install -e '.[bench]')")
    failed = any(r["peers"]["gir"].get("status") != "ok" for r in rows) or any(
        r["peers"][p].get("status") in ("mismatch", "error") for r in rows for p in peers)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
