"""The device under the GPU backend: a CUDA GPU, or Numba's CUDA simulator.

Terms.
- *xp*: the array module the backend uses outside generated kernels (GEMMs, reductions,
  copies): CuPy on a GPU (its matmul is cuBLAS), simcupy.py in the simulator: a stand-in
  with CuPy's contracts (`set` demands equal shapes and dtypes, NumPy refuses device arrays,
  nothing crosses to the host implicitly), so that both modes run the same array calls and the
  simulator fails where a GPU would. This module is the only one that knows which mode it is in.
- *Device array*: an `xp.ndarray`. In the simulator, device memory is host memory.
- *Transfers*: `to_device` / `upload` (host to device: `xp.asarray`, `ndarray.set`) and
  `download` (`ndarray.get`) are the only crossings, on both paths.
- *Kernel argument*: what a numba.cuda kernel is launched with: a flat (1-D) view of a device
  array, wrapped without a copy and without a synchronisation: `cuda.as_cuda_array(a,
  sync=False)` on a GPU (CuPy and Numba both use the default stream, so launch order is kept),
  a FakeCUDAArray in the simulator (the simulator's own handling of a NumPy argument copies it
  in and back out after the launch, which would undo a kernel writing in place of an input).
- The mode is fixed when numba.cuda is first imported: NUMBA_ENABLE_CUDASIM=1 must be set
  before that (tests set it at the top of their module).

Known gaps: the current device only; one stream per function (the default one, or the
function's own while it is captured and replayed as a CUDA graph: graphs.py).
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...config import cuda_simulator_requested
from ...errors import GirError

NO_GPU = "no CUDA GPU; set NUMBA_ENABLE_CUDASIM=1 to run the kernels in the simulator"

SIMULATOR_LAUNCHES = threading.Lock()
"""Held around every kernel launch in the simulator, process-wide. A launch there swaps the
kernel's `cuda` global for a fake module and runs each CUDA thread as a Python thread that reads
`blockIdx` from it: two launches at once (two specialisations of one function, each with its own
call lock, or two functions, from two threads) swapped each other's module back, and a thread
found "'Thread' object has no attribute 'blockIdx'". On a GPU, launches need no lock."""


@dataclass(eq=False)
class Device:
    simulated: bool
    """True under NUMBA_ENABLE_CUDASIM=1 (kernels run as Python, simcupy is xp)."""
    cuda: Any
    """The numba.cuda module (the simulator's, in the simulator)."""
    xp: Any
    """cupy on a GPU, simcupy (CuPy's contracts over host memory) in the simulator."""
    name: str
    threads_per_block: int
    max_blocks: int
    """Launches never exceed this many blocks: the kernels' grid-stride loops cover the rest.
    In the simulator every CUDA thread is a Python thread, so launches there are tiny."""
    _wrap: Any = None
    """The simulator's FakeCUDAArray (None on a GPU)."""
    _scatter_add: Any = None
    """cupyx.scatter_add (simcupy's in the simulator)."""
    _numba_streams: dict[int, Any] = field(default_factory=dict)
    """CuPy stream pointer -> numba's external stream on it (made once each)."""

    def launch_shape(self, n: int) -> tuple[int, int]:
        """(blocks, threads per block) for n elements."""
        blocks = min(max(1, -(-n // self.threads_per_block)), self.max_blocks)
        return blocks, self.threads_per_block

    def launch(self, kernel: Any, shape: tuple[int, int], args: tuple) -> None:
        """A numba.cuda kernel on xp's current stream (the capturing one while a graph is
        captured: graphs.py). In the simulator through simcupy.issue, so that a capture records
        it; on a GPU on `cuda.external_stream(ptr)` of CuPy's current stream (the default stream
        where that is CuPy's null stream, as before)."""
        if self.simulated:
            def run() -> None:
                with SIMULATOR_LAUNCHES:  # the simulator's launches share process state
                    kernel[shape](*args)

            self.xp.issue(run)
            return
        ptr = int(self.xp.cuda.get_current_stream().ptr)
        if not ptr:
            kernel[shape](*args)
            return
        stream = self._numba_streams.get(ptr)
        if stream is None:
            stream = self._numba_streams[ptr] = self.cuda.external_stream(ptr)
        kernel[tuple(shape) + (stream,)](*args)

    def address(self, a: Any) -> int:
        """The device address of a's first element."""
        return int(a.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.xp.empty(shape, dtype)

    def to_device(self, host: np.ndarray) -> Any:
        """A new device array holding a copy of host (same shape, 0-d included)."""
        return self.xp.asarray(host)

    def upload(self, dst: Any, host: np.ndarray) -> None:
        """Copies host into the device array dst, of the same shape (0-d included); host's
        dtype is cast to dst's first (CuPy's `set` demands both equal). A strided dst (an
        argument's buffer that is a piece of a concat: aliasing.PackedArguments, filled by the
        split executor) through a temporary, one device copy (CuPy's `set` refuses strides)."""
        if not dst.flags.c_contiguous:
            dst[...] = self.xp.asarray(host_copy_source(host, dst.dtype))
            return
        dst.set(host_copy_source(host, dst.dtype))

    def as_device(self, a: Any) -> Any:
        """A device array given by the caller (is_device_array) as an xp array, without a copy:
        through `__cuda_array_interface__` (CuPy, PyTorch, Numba), else DLPack (JAX)."""
        if hasattr(a, "__cuda_array_interface__"):
            return self.xp.asarray(a)
        return self.xp.from_dlpack(a)

    def download(self, a: Any) -> np.ndarray:
        """A new NumPy array holding a copy of the device array a (waits for the device)."""
        return a.get()

    def add_at(self, a: Any, rows: Any, updates: Any) -> None:
        """a[rows[j]] += updates[j] for every j, repeated rows accumulating (NumPy's add.at)."""
        self._scatter_add(a, rows, updates)

    def kernel_arg(self, a: Any) -> Any:
        """a, flat, as a kernel argument (no copy; a must be C-contiguous)."""
        flat = a.reshape(-1)
        if self.simulated:
            from . import simcupy

            return self._wrap(simcupy.host_buffer(flat))
        return self.cuda.as_cuda_array(flat, sync=False)


DLPACK_CUDA_DEVICES = (2, 3, 13)
"""DLPack device types of CUDA memory: kDLCUDA, kDLCUDAHost, kDLCUDAManaged."""


def is_device_array(a: Any) -> bool:
    """Whether a is an array in CUDA memory that a compiled function takes as it is (no trip
    through the host): anything with `__cuda_array_interface__` (CuPy, PyTorch, Numba; in the
    simulator, simcupy's arrays), or with a DLPack device in CUDA memory (JAX)."""
    if isinstance(a, np.ndarray):
        return False
    if hasattr(a, "__cuda_array_interface__"):
        return True
    where = getattr(a, "__dlpack_device__", None)
    try:
        return where is not None and int(where()[0]) in DLPACK_CUDA_DEVICES
    except Exception:  # noqa: BLE001 (not a DLPack producer after all)
        return False


def device_view(a: Any) -> Any:
    """a as an xp array without a copy when it is a device array (is_device_array), else None."""
    return get_device().as_device(a) if is_device_array(a) else None


def host_copy_source(host: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """host as `ndarray.set` takes it: C-contiguous, of dtype, and of host's own shape.
    (`np.ascontiguousarray` would do the first two but makes a 0-d array 1-d.)"""
    if host.dtype == dtype and host.flags.c_contiguous:
        return host
    return np.array(host, dtype=dtype, order="C", copy=True)


_DEVICE: Device | None = None


def get_device() -> Device:
    """The device, found on first use; a GirError says what is missing when there is none."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = _find_device()
    return _DEVICE


def available() -> bool:
    """Whether GPU code can run here (a CUDA GPU with CuPy, or the simulator)."""
    try:
        get_device()
    except GirError:
        return False
    return True


def _find_device() -> Device:
    try:
        from numba import cuda
    except ImportError as e:
        raise GirError(f"the GPU backend needs numba-cuda: pip install 'gir[gpu]' ({e})") from None
    if "simulator" in getattr(cuda.jit, "__module__", ""):
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        from . import simcupy

        return Device(True, cuda, simcupy, "the CUDA simulator", threads_per_block=4, max_blocks=2,
                      _wrap=FakeCUDAArray, _scatter_add=simcupy.scatter_add)
    if not cuda.is_available():
        late = cuda_simulator_requested()
        raise GirError(NO_GPU, note="NUMBA_ENABLE_CUDASIM=1 must be set before numba is imported" if late else None)
    try:
        import cupy
        import cupyx
    except ImportError as e:
        raise GirError(f"the GPU backend needs CuPy on a GPU: pip install 'gir[gpu]' ({e})") from None
    numba_cuda_numpy_guard()
    gpu = cuda.get_current_device()
    name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
    return Device(False, cuda, cupy, name, threads_per_block=256, max_blocks=32 * int(gpu.MULTIPROCESSOR_COUNT),
                  _scatter_add=cupyx.scatter_add)


def numba_cuda_numpy_guard() -> None:
    """numba-cuda up to at least 0.30.4 registers an overload for `np.row_stack` when its
    array typing module is first imported (at the first kernel compile), and NumPy 2.5 removed
    `np.row_stack` (long an alias of `np.vstack`): every compile then fails with AttributeError.
    Import that module now with the name present for the import only, then take it away
    again, so that NumPy stays as the user has it. Does nothing where the name exists (NumPy
    < 2.5) or the module is already imported. (No version constraint instead: `numpy<2.5` in
    the `gpu` extras would downgrade NumPy under every other package; docs/gpu.md.)"""
    if hasattr(np, "row_stack") or ROW_STACK_MODULE in sys.modules:
        return
    setattr(np, "row_stack", _row_stack)  # noqa: B010 - NumPy 2.5's stubs have no row_stack
    try:
        importlib.import_module(ROW_STACK_MODULE)
    finally:
        delattr(np, "row_stack")


ROW_STACK_MODULE = "numba.cuda.np.arrayobj"
"""numba-cuda's module that names `np.row_stack` at import time."""


def _row_stack(tup: Any, *, dtype: Any = None, casting: Any = "same_kind") -> np.ndarray:
    """A function of its own for numba-cuda's `overload(np.row_stack)` (np.vstack has one)."""
    return np.vstack(tup, dtype=dtype, casting=casting)
