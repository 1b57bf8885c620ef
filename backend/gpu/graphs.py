"""CUDA graphs: a compiled function's whole device work captured once, replayed per call.

Terms.
- *Capture*: CuPy stream capture (`stream.begin_capture()` ... `end_capture()` ->
  `cupy.cuda.Graph`) on a stream of the function's own, made current (`with stream:`) so that
  CuPy's work goes to it; the generated kernels are launched on it through
  `numba.cuda.external_stream(stream.ptr)` (device.py, `Device.launch`). Nothing runs while
  capturing: the graph's first launch does the work.
- *Replay*: `graph.launch(stream)`: every kernel, GEMM, reduction and copy of the function in
  one launch from Python, on the memory it was captured with (the arena, the argument buffers,
  the constants: all allocated once per compiled function, so the addresses stay valid).
- *GEMMs while capturing*: CuPy refuses every cuBLAS call during capture (NotImplementedError),
  so a captured GEMM is a call of cuBLAS's C API (`cublasSgemm_v2` / `cublasDgemm_v2` through
  ctypes, on a handle bound to the capturing stream with a workspace of its own set, as cuBLAS
  asks for graph capture). `gemm_call` translates a row-major `out = a @ b` of 2-D strided
  views into cuBLAS's column-major call; the simulator runs the same call on host memory
  (simcupy.cublas_gemm), so the translation is tested without a GPU.
- *Refused*: what cannot be captured raises while capturing (a host read-back: `index` by a
  computed index, a gather's bounds check; a batched or oddly strided GEMM: `CaptureRefused`);
  the runtime then drops the capture and runs that function eagerly for good, the reason in
  `fn.stats.graph`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import glob
import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

COUNTED = ("kernel_launches", "gemm_calls", "xp_launches", "copies")
"""The captured counts a replay reports (codegen.COUNTED but graph_replays)."""

OP_N, OP_T = 0, 1
"""cublasOperation_t."""

WORKSPACE_BYTES = 32 << 20
"""cuBLAS's workspace for captured GEMMs (cuBLAS allocates none itself during capture; 32 MiB
covers Hopper's recommendation)."""


class CaptureRefused(Exception):
    """Work that the capture path cannot put in a graph (the function then runs eagerly)."""


@dataclass(frozen=True)
class GemmCall:
    """One cuBLAS gemm (alpha 1, beta 0), column-major: C (m x n) = op(A) (m x k) op(B) (k x n)."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    a_ptr: int
    lda: int
    b_ptr: int
    ldb: int
    c_ptr: int
    ldc: int


def _as_column_major_transpose(x: Any, address: int) -> tuple[int, int]:
    """(op, ld) for a row-major r x c view x: the column-major matrix at its address that,
    under op, is x^T (c x r). Raises CaptureRefused where the strides allow neither."""
    r, c = x.shape
    s0, s1 = (s // x.itemsize for s in x.strides)
    if c == 1 or s1 == 1:
        return OP_N, s0 if r > 1 else max(c, 1)      # x^T stored column-major, c x r
    if r == 1 or s0 == 1:
        return OP_T, s1 if c > 1 else max(r, 1)      # x stored column-major, r x c
    raise CaptureRefused(f"a GEMM operand with strides {x.strides} (neither rows nor columns contiguous)")


def gemm_call(a: Any, b: Any, out: Any, address: Any) -> GemmCall:
    """out = a @ b (row-major 2-D views) as cuBLAS's column-major call: out^T = b^T a^T. A
    stack of rows times a matrix (`%xs @ %wx` over every time step: a and out N-D, b 2-D) is one
    2-D GEMM when a's and out's leading dims collapse into rows without a copy."""
    if a.ndim > 2 and b.ndim == 2 and out.ndim == a.ndim and _rows_collapse(a) and _rows_collapse(out):
        a, out = a.reshape(-1, a.shape[-1]), out.reshape(-1, out.shape[-1])
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise CaptureRefused(f"a batched GEMM ({a.ndim}-D @ {b.ndim}-D): the C-API path takes 2-D operands")
    m_rows, k = a.shape
    n_cols = b.shape[1]
    if out.shape != (m_rows, n_cols) or a.dtype != b.dtype or a.dtype != out.dtype \
            or a.dtype not in (np.float32, np.float64):
        raise CaptureRefused(f"a GEMM of {a.dtype} {a.shape} @ {b.dtype} {b.shape} -> {out.dtype}")
    c_op, ldc = _as_column_major_transpose(out, address(out))
    if c_op != OP_N:
        raise CaptureRefused("a GEMM result with non-contiguous rows")
    b_op, ldb = _as_column_major_transpose(b, address(b))
    a_op, lda = _as_column_major_transpose(a, address(a))
    return GemmCall(b_op, a_op, n_cols, m_rows, k, address(b), ldb, address(a), lda, address(out), ldc)


def _rows_collapse(x: Any) -> bool:
    """Whether x's dims but the last are one run of rows (a view reshapes them, no copy)."""
    return all(x.strides[i] == x.strides[i + 1] * x.shape[i + 1] for i in range(x.ndim - 2))


def _find_libcublas() -> ctypes.CDLL:
    """The libcublas the CUDA wheels ship (cuda-pathfinder finds it as CuPy and numba-cuda find
    theirs: `nvidia/cu13/lib`, `nvidia/cublas/lib`), else the system's."""
    candidates: list[str] = []
    try:
        pathfinder = importlib.import_module("cuda.pathfinder")  # not everywhere (mypy included)

        candidates.append(pathfinder.load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:  # noqa: BLE001 (no pathfinder, or no cuBLAS where it looks: the fallbacks)
        pass
    try:
        nvidia_cublas = importlib.import_module("nvidia.cublas")

        for root in list(getattr(nvidia_cublas, "__path__", [])):
            candidates += sorted(glob.glob(os.path.join(root, "lib", "libcublas.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("cublas")
    candidates += [found] if found else []
    candidates += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for name in candidates:
        if "Lt" in os.path.basename(name):
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CaptureRefused("no libcublas found for the C-API GEMMs (pip install nvidia-cublas-cu12)")


class CublasC:
    """cuBLAS through its C API on one stream: a handle, its stream, its workspace (GPU only)."""

    def __init__(self, xp: Any, stream_ptr: int):
        self.lib = _find_libcublas()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream_v2")
        self.workspace = xp.empty((WORKSPACE_BYTES,), np.uint8)  # held: the graph uses it
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(int(self.workspace.data.ptr)),
                                                   ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace_v2")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CaptureRefused(f"{what} returned cuBLAS status {status}")

    def gemm(self, dtype: np.dtype, call: GemmCall) -> None:
        scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
        fn = self.lib.cublasSgemm_v2 if dtype == np.float32 else self.lib.cublasDgemm_v2
        one, zero = scalar(1.0), scalar(0.0)
        p = ctypes.c_void_p
        self._check(fn(self.handle, call.transa, call.transb, call.m, call.n, call.k, ctypes.byref(one),
                       p(call.a_ptr), call.lda, p(call.b_ptr), call.ldb, ctypes.byref(zero),
                       p(call.c_ptr), call.ldc), "cublasGemm")


class SimulatedCublas:
    """The same C-API call in the simulator: simcupy.cublas_gemm on host memory."""

    def __init__(self, simcupy: Any):
        self.simcupy = simcupy

    def gemm(self, dtype: np.dtype, call: GemmCall) -> None:
        self.simcupy.cublas_gemm(np.dtype(dtype), call.transa, call.transb, call.m, call.n, call.k,
                                 call.a_ptr, call.lda, call.b_ptr, call.ldb, call.c_ptr, call.ldc)


def c_api_blas(dev: Any, stream_ptr: int) -> Any:
    """cuBLAS's C API bound to the stream (the simulator's stand-in there)."""
    if dev.simulated:
        return SimulatedCublas(dev.xp)
    return CublasC(dev.xp, stream_ptr)


class CallGraph:
    """A compiled function's graph path (runtime.GPUFunction): its stream, its graph.

    Call 1 runs eagerly (on the function's stream): numba compiles and loads each kernel at its
    first launch and CuPy builds its own kernels and fills its memory pool then, none of which
    belongs in a capture. Call 2 captures the whole call's device work (the error flag's reset,
    every step) and launches the graph; every later call launches it again. A capture that
    raises (`CaptureRefused`, CuPy's NotImplementedError for a cuBLAS call, a read-back refused
    while capturing) is dropped and the function stays eager for good (`path` says why)."""

    def __init__(self, fn: Any, enabled: bool):
        self.fn = fn
        self.enabled = enabled
        self.graph: Any = None
        self.results: list[Any] = []
        self.reason: str | None = None
        self.calls = 0
        self.stream: Any = None
        self.blas: Any = None
        self.captured: Any = None
        """The counters of the captured work (what each replay does on the device)."""

    @property
    def path(self) -> str:
        if not self.enabled:
            return "off"
        if self.reason is not None:
            return f"eager: {self.reason}"
        return "replayed" if self.graph is not None else "eager: the first call (warm-up before capture)"

    def stream_context(self) -> Any:
        """The function's own stream as the current one (on the graph path), else nothing."""
        if not self.enabled or self.reason is not None:
            return contextlib.nullcontext()
        if self.stream is None:
            # Blocking: ordered after the user's work on the legacy default stream (arguments
            # made there), and that stream's later work after ours (device results read there).
            self.stream = self.fn.dev.xp.cuda.Stream(non_blocking=False)
        return self.stream

    def run(self) -> list[Any]:
        """One call's device work: eager, or one graph launch; the results as device arrays."""
        self.calls += 1
        fn = self.fn
        if self.enabled and self.graph is None and self.reason is None and self.calls > 1:
            self._capture()
        if self.graph is None:
            return fn.run_on_device(check_indices=False)  # runtime._run checked them
        counters = fn.lowering.counters
        counters.reset()
        for name in COUNTED:
            setattr(counters, name, getattr(self.captured, name))
        counters.per_step = dict(self.captured.per_step)
        counters.graph_replays = 1
        self.graph.launch(self.stream)
        fn._raise_flagged()  # where a kernel can flag an error: its download waits for the graph
        return list(self.results)

    def _capture(self) -> None:
        fn = self.fn
        low = fn.lowering
        try:
            if self.blas is None:
                self.blas = c_api_blas(fn.dev, int(self.stream.ptr))
        except (CaptureRefused, OSError, AttributeError) as e:
            self.reason = f"no cuBLAS C API: {e}"
            return
        low.counters.reset()
        low.captured_arrays = []
        failure: BaseException | None = None
        env: dict[Any, Any] = {}
        low.blas = self.blas
        self.stream.begin_capture()
        try:
            env = fn.issue_steps()
        except Exception as e:  # noqa: BLE001 (anything refused while capturing: stay eager)
            failure = e
        finally:
            low.blas = None
            try:
                graph = self.stream.end_capture()
            except Exception as e:  # noqa: BLE001 (an invalidated capture)
                graph, failure = None, failure or e
        if failure is not None or graph is None:
            self.reason = f"capture refused: {failure}"
            low.captured_arrays = []
            return
        self.graph, self.results = graph, [env[v] for v in fn.results]
        self.captured = copy.deepcopy(low.counters)
