"""A stand-in for CuPy in Numba's CUDA simulator: CuPy's contracts over host memory.

The GPU backend calls one array module, *xp*, outside its generated kernels: CuPy on a GPU,
this module in the simulator (device.py picks). So that the simulator runs the same array calls
as a GPU, and a CI without a GPU catches what would fail there, this module keeps CuPy's
contracts (its `cupy/_core/core.pyx`), not NumPy's:

- `ndarray.set(host)` copies a NumPy array of the *same* shape and dtype onto the device
  (TypeError for another dtype or a non-NumPy argument, ValueError for another shape); `get()`
  is the one way back. `asarray(host)` makes a new device array from host data.
- NumPy does not take device arrays: `np.asarray(d)` / `np.array(d)` raise TypeError
  (`__array__`); a NumPy ufunc runs on the device when every operand is a device array or a
  scalar, and raises TypeError when one is a NumPy array or anything else (`__array_ufunc__`
  returns NotImplemented: NumPy's "operand type(s) all returned NotImplemented from
  __array_ufunc__", as reported by CuPy 14 on a GPU); a NumPy function runs its twin here, and
  raises TypeError where there is none (`__array_function__` returns NotImplemented). Device
  arrays and NumPy arrays never mix: neither in operators, nor as an argument of an xp
  function, nor as the value of `d[...] = v`.
- Indexing returns device arrays (a 0-d view for a single element), never NumPy scalars.

Stricter than CuPy, on purpose: `int(d)`, `float(d)` and `bool(d)` raise (CuPy copies the
element to the host, a hidden synchronisation): the backend reads a value back only through
`Device.download`, which it counts.

Device memory is host memory here: `host_buffer(d)` gives the NumPy array under a device array,
for the simulator's kernel arguments (device.py) and nothing else. Only what the backend and its
tests use is provided; a missing function fails loudly (AttributeError), never falls back to
NumPy.
"""

from __future__ import annotations

import builtins  # this module's max/min/sum are CuPy's
import ctypes
import itertools
import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")
"""CuPy's message for `np.asarray(device_array)`."""


def _unsupported(x: Any) -> TypeError:
    return TypeError(f"Unsupported type {type(x)}")  # CuPy's kernels given a NumPy array


@dataclass(frozen=True)
class MemoryPointer:
    """`ndarray.data`: the address of the first element (CuPy's `cupy.cuda.MemoryPointer.ptr`)."""

    ptr: int


@dataclass(frozen=True)
class Flags:
    c_contiguous: bool
    f_contiguous: bool
    owndata: bool


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (numbers.Number, np.generic, bool))


def _unwrap(x: Any) -> Any:
    """The NumPy value under an xp argument: device arrays unwrapped (also inside lists and
    tuples), scalars and dtypes kept, NumPy arrays refused as CuPy refuses them."""
    if isinstance(x, ndarray):
        return x._host
    if isinstance(x, np.ndarray):
        raise _unsupported(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, np.generic):  # CuPy's reductions and ufuncs give 0-d arrays, not scalars
        return ndarray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    return x


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    out = kwargs.get("out")
    if out is not None and not isinstance(out, ndarray):
        raise TypeError(f"out must be a device array, not {type(out).__name__}")
    host_args, host_kwargs = _unwrap(args), {k: _unwrap(v) for k, v in kwargs.items()}
    if _capturing() is None:
        result = fn(*host_args, **host_kwargs)
        return out if out is not None else _wrap(result)
    if out is not None:  # captured: runs when the graph does
        issue(lambda: fn(*host_args, **host_kwargs))
        return out
    # A new array: its shape from a probe now, its values when the graph runs (garbage until then).
    probe = fn(*host_args, **host_kwargs)
    if probe is None:
        issue(lambda: fn(*host_args, **host_kwargs))
        return None
    buffer = _garbage_like(np.asarray(probe))

    def fill() -> None:
        buffer[...] = fn(*host_args, **host_kwargs)

    issue(fill)
    return ndarray(buffer)


def _garbage_like(a: np.ndarray) -> np.ndarray:
    """A new array like a, holding what uninitialised device memory might: nan for floats (so a
    graph that was never launched shows in a test), a large value for integers."""
    buffer = np.empty_like(a)
    buffer.fill(np.nan if buffer.dtype.kind in "fc" else 123456789 % (1 << 7))
    return buffer


def _device_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn (a NumPy function) on device arrays, with CuPy's argument rules."""
    def on_device(*args: Any, **kwargs: Any) -> Any:
        return _call(fn, args, kwargs)

    on_device.__name__ = fn.__name__
    return on_device


class ndarray(np.lib.mixins.NDArrayOperatorsMixin):  # noqa: N801 (CuPy's name)
    """A device array: a NumPy array standing in for device memory, behind CuPy's interface."""

    __array_priority__ = 100  # as CuPy's

    def __init__(self, host: np.ndarray):
        self._host = host

    # -- attributes (no copy) -------------------------------------------------------------
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    ndim = property(lambda self: self._host.ndim)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    T = property(lambda self: ndarray(self._host.T))

    @property
    def flags(self) -> Flags:
        f = self._host.flags
        return Flags(bool(f.c_contiguous), bool(f.f_contiguous), bool(f.owndata))

    @property
    def data(self) -> MemoryPointer:
        return MemoryPointer(int(self._host.__array_interface__["data"][0]))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CuPy's export (version 3; stream 1, the legacy default stream, as CuPy gives it)."""
        h = self._host
        return {"shape": h.shape, "typestr": h.dtype.str, "descr": h.dtype.descr, "version": 3, "stream": 1,
                "strides": None if h.flags.c_contiguous else h.strides,
                "data": (self.data.ptr if h.size else 0, False)}

    def __len__(self) -> int:
        if not self.ndim:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:  # no values: that would be a copy to the host
        return f"simcupy.ndarray(shape={self.shape}, dtype={self.dtype})"

    # -- crossing to the host: explicit only -------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(IMPLICIT)

    def _implicit(self, *_: Any) -> Any:
        raise TypeError("the CuPy stand-in refuses an implicit copy to the host (CuPy would synchronise): "
                        "use Device.download")

    __int__ = __float__ = __bool__ = __index__ = __complex__ = _implicit

    def get(self, stream: Any = None, order: Any = "C", out: np.ndarray | None = None) -> np.ndarray:
        """A new NumPy array holding a copy (CuPy's only way back to the host)."""
        _refuse_during_capture("a copy to the host (ndarray.get)")
        if out is not None:
            np.copyto(out, self._host)
            return out
        return np.array(self._host, copy=True, order=order)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copies the NumPy array arr (same shape and dtype) onto this device array."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self.flags.c_contiguous or self.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        _refuse_during_capture("a copy from pageable host memory (ndarray.set)")
        self._host[...] = arr

    # -- NumPy interoperation, as CuPy does it ---------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__":
            return NotImplemented
        outs = kwargs.get("out", ())
        if not all(isinstance(x, ndarray) or _is_scalar(x) for x in (*inputs, *outs)):
            return NotImplemented  # a NumPy array too: NumPy then raises TypeError, as with CuPy 14
        if outs:
            if len(outs) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            kwargs["out"] = outs[0]
        return _call(ufunc, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        twin = globals().get(func.__name__)
        if twin is None or not callable(twin) or any(t not in (ndarray, np.ndarray) for t in types):
            return NotImplemented
        return twin(*args, **kwargs)

    # -- views and copies on the device ---------------------------------------------------
    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(self._host[_view_key(_unwrap(key))])

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):
            raise _unsupported(value)
        host, where, v = self._host, _unwrap(key), _unwrap(value)

        def assign() -> None:
            host[where] = v

        issue(assign)

    def __iter__(self) -> Any:
        if not self.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(self._host.reshape(*shape))

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._host.view(dtype))

    def transpose(self, *axes: Any) -> ndarray:
        return ndarray(self._host.transpose(*axes))

    def ravel(self) -> ndarray:
        return ndarray(self._host.ravel())

    def copy(self, order: Any = "C") -> ndarray:
        return _new_array(lambda h: h.copy(order=order), self._host)

    def astype(self, dtype: Any, copy: bool = True) -> ndarray:
        if not copy and self.dtype == np.dtype(dtype):
            return self
        return _new_array(lambda h: h.astype(dtype), self._host)

    def fill(self, value: Any) -> None:
        host, v = self._host, _unwrap(value)
        issue(lambda: host.fill(v))

    def sum(self, *args: Any, **kwargs: Any) -> ndarray:
        return sum(self, *args, **kwargs)

    def max(self, *args: Any, **kwargs: Any) -> ndarray:
        return max(self, *args, **kwargs)

    def min(self, *args: Any, **kwargs: Any) -> ndarray:
        return min(self, *args, **kwargs)

    def mean(self, *args: Any, **kwargs: Any) -> ndarray:
        return mean(self, *args, **kwargs)


def _view_key(key: Any) -> Any:
    """key, made to give a 0-d view where NumPy would give a scalar (CuPy gives a 0-d array)."""
    parts = key if isinstance(key, tuple) else (key,)
    if any(p is Ellipsis or isinstance(p, np.ndarray) for p in parts):
        return key
    return (*parts, Ellipsis)


def host_buffer(a: ndarray) -> np.ndarray:
    """The NumPy array under a device array: the simulator's device memory. For the simulator's
    kernel arguments only (device.py)."""
    return a._host


# -- creating device arrays -----------------------------------------------------------------

def empty(shape: Any, dtype: Any = float, order: Any = "C") -> ndarray:
    return ndarray(np.empty(shape, dtype, order))


def zeros(shape: Any, dtype: Any = float, order: Any = "C") -> ndarray:
    return ndarray(np.zeros(shape, dtype, order))


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """A device array of a: a itself (or a cast copy) when on the device; a view, no copy, of
    another producer's `__cuda_array_interface__` (device memory is host memory here); else a
    new device array holding a copy of the host data (an explicit host-to-device copy, as in
    CuPy)."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    _refuse_during_capture("a copy from pageable host memory (asarray)")
    if hasattr(a, "__cuda_array_interface__"):
        view = ndarray(_from_interface(a.__cuda_array_interface__))
        return view if dtype is None or view.dtype == np.dtype(dtype) else view.astype(dtype)
    return ndarray(np.array(a, dtype=dtype, order=order or "K", copy=True))


def _from_interface(cai: dict[str, Any]) -> np.ndarray:
    """The memory a `__cuda_array_interface__` describes, as a NumPy view (the simulator's
    device memory is host memory, so its pointer is a host address)."""
    shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides") or None
    ptr = int(cai["data"][0])
    if not ptr or not math.prod(shape):
        return np.empty(shape, dtype)
    extent = builtins.max((d - 1) * abs(s) for d, s in zip(shape, strides)) + dtype.itemsize if strides else \
        math.prod(shape) * dtype.itemsize
    buffer = (ctypes.c_char * extent).from_address(ptr)
    return np.ndarray(shape, dtype, buffer=buffer, strides=strides)


def from_dlpack(a: Any) -> ndarray:
    """cupy.from_dlpack; in the simulator only CPU DLPack producers exist (NumPy), whose memory
    is this stand-in's device memory."""
    return ndarray(np.from_dlpack(a))


array = asarray


def ascontiguousarray(a: ndarray, dtype: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        raise _unsupported(a)
    if a.flags.c_contiguous and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    return _new_array(lambda h: np.ascontiguousarray(h, dtype=dtype), a._host)


def _new_array(make: Callable[[np.ndarray], np.ndarray], source: np.ndarray) -> ndarray:
    """A new device array make(source) (a device copy): made now, or, while capturing, made
    with the right shape now and filled when the graph runs."""
    if _capturing() is None:
        return ndarray(make(source))
    buffer = _garbage_like(make(source))

    def fill() -> None:
        buffer[...] = make(source)

    issue(fill)
    return ndarray(buffer)


def asnumpy(a: ndarray) -> np.ndarray:
    return a.get()


def scatter_add(a: ndarray, slices: Any, value: Any) -> None:
    """cupyx.scatter_add: a[slices] += value, repeated indices accumulating."""
    host, where, v = a._host, _unwrap(slices), _unwrap(value)
    issue(lambda: np.add.at(host, where, v))


# -- the xp functions the backend calls (CuPy has each under this name) -----------------------

def matmul(*args: Any, **kwargs: Any) -> Any:
    """cuBLAS through CuPy: refused while a stream captures, as CuPy 14 refuses it (a GEMM in a
    captured region goes through cuBLAS's C API: `cublas_gemm` here, graphs.py on a GPU)."""
    if _capturing() is not None:
        raise NotImplementedError(CUBLAS_CAPTURE)
    return _call(np.matmul, args, kwargs)


CUBLAS_CAPTURE = "calling cuBLAS API during stream capture is currently unsupported"
"""CuPy's message for a cuBLAS call (matmul, cupy_backends' cublas) while a stream captures."""
sum = _device_function(np.sum)  # noqa: A001 (CuPy's name)
mean = _device_function(np.mean)
max = amax = _device_function(np.max)  # noqa: A001
min = amin = _device_function(np.min)  # noqa: A001
transpose = _device_function(np.transpose)
take = _device_function(np.take)
stack = _device_function(np.stack)
concatenate = _device_function(np.concatenate)
where = _device_function(np.where)
isfinite = _device_function(np.isfinite)
exp = _device_function(np.exp)
log = _device_function(np.log)
add = _device_function(np.add)
subtract = _device_function(np.subtract)
maximum = _device_function(np.maximum)
equal = _device_function(np.equal)
copyto = _device_function(np.copyto)

inf, nan = np.inf, np.nan
float32, float64, int32, int64, bool_ = np.float32, np.float64, np.int32, np.int64, np.bool_


# -- streams and CUDA graphs (cupy.cuda.Stream / cupy.cuda.Graph) ---------------------------
#
# CuPy's capture contract, kept here so that the simulator runs the capture path: between
# `stream.begin_capture()` and `stream.end_capture()` device work issued on the capturing stream
# (the thread's current stream: `with stream:`) is recorded, not run; `end_capture()` gives a
# Graph whose `launch()` runs it all again, on the memory it was recorded with. While capturing,
# a cuBLAS call through CuPy raises NotImplementedError (CuPy 14), and so does anything that
# synchronises with the host or copies from pageable host memory (`get`, `set`, `asarray` of
# host data, `synchronize`: CUDA's cudaErrorStreamCaptureUnsupported); work issued on another
# stream in the capturing thread is refused too (cudaErrorStreamCaptureImplicit).

class CaptureError(RuntimeError):
    """What CUDA answers an operation that a capturing stream does not allow (CuPy raises it as
    cupy_backends.cuda.api.runtime.CUDARuntimeError)."""


_STREAMS = threading.local()
_NEXT_PTR = itertools.count(0x1000, 0x10)


class Stream:
    """cupy.cuda.Stream: `ptr` (the cudaStream_t), `with stream:` makes it the thread's current
    stream, `begin_capture` / `end_capture` / `is_capturing`, `synchronize`."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int | None = None):
        self.ptr = 0 if null else next(_NEXT_PTR) if ptr is None else ptr
        self._graph: Graph | None = None

    def __enter__(self) -> Stream:
        _stack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack().pop()

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise CaptureError("cudaErrorStreamCaptureUnsupported: the null stream cannot be captured")
        if self._graph is not None:
            raise CaptureError("cudaErrorIllegalState: the stream is capturing already")
        self._graph = Graph()

    def end_capture(self) -> Graph:
        if self._graph is None:
            raise CaptureError("cudaErrorIllegalState: the stream is not capturing")
        graph, self._graph = self._graph, None
        return graph

    def is_capturing(self) -> bool:
        return self._graph is not None

    def synchronize(self) -> None:
        _refuse_during_capture("a stream synchronisation")


class Graph:
    """cupy.cuda.Graph: the work recorded while a stream captured; `launch` runs it again."""

    def __init__(self) -> None:
        self.nodes: list[Callable[[], None]] = []

    def launch(self, stream: Stream | None = None) -> None:
        if _capturing() is not None:
            raise CaptureError("the stand-in does not nest graphs: launch outside a capture")
        for node in self.nodes:
            node()

    def upload(self, stream: Stream | None = None) -> None:
        """Instantiation happens at end_capture here: nothing to upload."""


NULL_STREAM = Stream(null=True)


def _stack() -> list[Stream]:
    stack = getattr(_STREAMS, "stack", None)
    if stack is None:
        stack = _STREAMS.stack = []
    return stack


def get_current_stream() -> Stream:
    stack = _stack()
    return stack[-1] if stack else NULL_STREAM


def _capturing() -> Stream | None:
    """The stream capturing in this thread, if any (a capture is this thread's: thread-local
    capture mode)."""
    for stream in _stack():
        if stream._graph is not None:
            return stream
    return None


def issue(work: Callable[[], None]) -> None:
    """Device work on the current stream: run now, or recorded when the stream captures."""
    capturing = _capturing()
    if capturing is None:
        work()
        return
    if get_current_stream() is not capturing:
        raise CaptureError("cudaErrorStreamCaptureImplicit: work on another stream while one captures")
    assert capturing._graph is not None
    capturing._graph.nodes.append(work)


def _refuse_during_capture(what: str) -> None:
    if _capturing() is not None:
        raise CaptureError(f"cudaErrorStreamCaptureUnsupported: {what} while a stream captures")


class _CudaNamespace:
    """`cupy.cuda`, the parts the backend uses."""

    Stream = Stream
    Graph = Graph
    get_current_stream = staticmethod(get_current_stream)


cuda = _CudaNamespace()


# -- cuBLAS's C API (graphs.py calls cuBLAS through ctypes on a GPU; this is that call here) --

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


def cublas_gemm(dtype: np.dtype, transa: int, transb: int, m: int, n: int, k: int, a_ptr: int, lda: int,
                b_ptr: int, ldb: int, c_ptr: int, ldc: int) -> None:
    """cublas{S,D}gemm_v2 with alpha 1 and beta 0, on the current stream: C (m x n) =
    op(A) (m x k) @ op(B) (k x n), every matrix column-major at its address with its leading
    dimension, as cuBLAS reads them (the row-major translation is graphs.py's, tested here)."""
    def col_major(ptr: int, rows: int, cols: int, ld: int) -> np.ndarray:
        if ld < builtins.max(1, rows):
            raise ValueError(f"cuBLAS: leading dimension {ld} < {rows} rows")
        item = dtype.itemsize
        extent = ((cols - 1) * ld + rows) * item if rows and cols else 0
        buffer = (ctypes.c_char * builtins.max(extent, 1)).from_address(ptr)
        return np.ndarray((rows, cols), dtype, buffer=cast(Any, buffer), strides=(item, ld * item))

    a = col_major(a_ptr, *((m, k) if transa == CUBLAS_OP_N else (k, m)), lda)
    b = col_major(b_ptr, *((k, n) if transb == CUBLAS_OP_N else (n, k)), ldb)
    c = col_major(c_ptr, m, n, ldc)
    op_a = a if transa == CUBLAS_OP_N else a.T
    op_b = b if transb == CUBLAS_OP_N else b.T

    def gemm() -> None:
        np.matmul(op_a, op_b, out=c)

    issue(gemm)
