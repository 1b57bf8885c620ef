"""The device under the GPU backend: a CUDA GPU, or Numba's CUDA simulator.

Terms.
- *xp*: the array module the backend uses outside generated kernels (GEMMs, reductions,
  copies): CuPy on a GPU (its matmul is cuBLAS), NumPy in the simulator. Both modes run the
  same backend code; this module is the only one that knows which mode it is in.
- *Device array*: an `xp.ndarray`. In the simulator, device memory is host memory.
- *Kernel argument*: what a numba.cuda kernel is launched with: a flat (1-D) view of a device
  array, wrapped without a copy and without a synchronisation: `cuda.as_cuda_array(a,
  sync=False)` on a GPU (CuPy and Numba both use the default stream, so launch order is kept),
  a FakeCUDAArray in the simulator (the simulator's own handling of a NumPy argument copies it
  in and back out after the launch, which would undo a kernel writing in place of an input).
- The mode is fixed when numba.cuda is first imported: NUMBA_ENABLE_CUDASIM=1 must be set
  before that (tests set it at the top of their module).

Known gaps: the current device only, the default stream only; outputs come back as NumPy
arrays (no DLPack / CuPy outputs yet).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
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
    """True under NUMBA_ENABLE_CUDASIM=1 (kernels run as Python, NumPy is xp)."""
    cuda: Any
    """The numba.cuda module (the simulator's, in the simulator)."""
    xp: Any
    """cupy on a GPU, numpy in the simulator."""
    name: str
    threads_per_block: int
    max_blocks: int
    """Launches never exceed this many blocks: the kernels' grid-stride loops cover the rest.
    In the simulator every CUDA thread is a Python thread, so launches there are tiny."""
    _wrap: Any = None
    """The simulator's FakeCUDAArray (None on a GPU)."""

    def launch_shape(self, n: int) -> tuple[int, int]:
        """(blocks, threads per block) for n elements."""
        blocks = min(max(1, -(-n // self.threads_per_block)), self.max_blocks)
        return blocks, self.threads_per_block

    def address(self, a: Any) -> int:
        """The device address of a's first element."""
        if self.simulated:
            return int(a.__array_interface__["data"][0])
        return int(a.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.xp.empty(shape, dtype)

    def to_device(self, host: np.ndarray) -> Any:
        """A new device array holding a copy of host."""
        if self.simulated:
            return np.array(host, copy=True, order="C")
        return self.xp.asarray(np.ascontiguousarray(host))

    def upload(self, dst: Any, host: np.ndarray) -> None:
        """Copies host into the device array dst (same shape and dtype)."""
        if self.simulated:
            dst[...] = host
        else:
            dst.set(np.ascontiguousarray(host))

    def download(self, a: Any) -> np.ndarray:
        """A new NumPy array holding a copy of the device array a (waits for the device)."""
        if self.simulated:
            return np.array(a, copy=True, order="C")
        return a.get()

    def add_at(self, a: Any, rows: Any, updates: Any) -> None:
        """a[rows[j]] += updates[j] for every j, repeated rows accumulating (NumPy's add.at)."""
        if self.simulated:
            np.add.at(a, rows, updates)
        else:
            import cupyx

            cupyx.scatter_add(a, rows, updates)

    def kernel_arg(self, a: Any) -> Any:
        """a, flat, as a kernel argument (no copy; a must be C-contiguous)."""
        flat = a.reshape(-1)
        if self.simulated:
            return self._wrap(flat)
        return self.cuda.as_cuda_array(flat, sync=False)


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

        return Device(True, cuda, np, "the CUDA simulator", threads_per_block=4, max_blocks=2, _wrap=FakeCUDAArray)
    if not cuda.is_available():
        late = cuda_simulator_requested()
        raise GirError(NO_GPU, note="NUMBA_ENABLE_CUDASIM=1 must be set before numba is imported" if late else None)
    try:
        import cupy
    except ImportError as e:
        raise GirError(f"the GPU backend needs CuPy on a GPU: pip install cupy-cuda12x ({e})") from None
    gpu = cuda.get_current_device()
    name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
    return Device(False, cuda, cupy, name, threads_per_block=256, max_blocks=32 * int(gpu.MULTIPROCESSOR_COUNT))
