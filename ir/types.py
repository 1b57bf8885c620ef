"""Tensor types: `tensor<50x32x256xf32>`, `tensor<f32>` (a scalar), `tensor<?x256xf32>`.

A dimension is an int or None (printed `?`, unknown until the JIT specialises on arguments).
`VarType` is the type of a pre-SSA variable made by `var`; it is printed as the tensor type
it holds, and only `load` and `store` may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import GirTypeError, Location

DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "i1": np.dtype(np.bool_),
}
FLOAT_DTYPES = ("f32", "f64")
INT_DTYPES = ("i32", "i64")
_NAME_OF_NUMPY = {v: k for k, v in DTYPES.items()}

Dim = int | None


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: str
    """One of DTYPES' keys."""

    def __str__(self) -> str:
        dims = "".join(("?" if d is None else str(d)) + "x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def numpy_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape, every dim known: what a backend lays memory out by. A `?` dim here is a
        bug of the caller (the driver specialises before any backend runs): a GirTypeError."""
        return self.static_shape_at(None)

    def static_shape_at(self, loc: Location | None) -> tuple[int, ...]:
        """`static_shape`, its error located at loc (the value's op or function)."""
        dims = tuple(d for d in self.shape if d is not None)
        if len(dims) != len(self.shape):
            raise GirTypeError(f"{self} has a `?` dim where a static shape is needed", loc)
        return dims

    def num_elements(self) -> int | None:
        n = 1
        for d in self.shape:
            if d is None:
                return None
            n *= d
        return n

    def nbytes(self) -> int | None:
        n = self.num_elements()
        return None if n is None else n * self.numpy_dtype.itemsize

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(self.shape, dtype)

    def matches(self, array: np.ndarray) -> bool:
        """Whether a concrete array has this type (`?` matches any size)."""
        if array.dtype != self.numpy_dtype or array.ndim != self.rank:
            return False
        return all(d is None or d == s for d, s in zip(self.shape, array.shape))


@dataclass(frozen=True)
class VarType:
    """The type of a mutable variable holding values of `held`."""

    held: TensorType

    def __str__(self) -> str:
        return str(self.held)


Type = TensorType | VarType


def dtype_name(dt: np.dtype) -> str:
    return _NAME_OF_NUMPY[np.dtype(dt)]


def scalar(dtype: str) -> TensorType:
    return TensorType((), dtype)


MAX_RANK = 64
"""NumPy's limit on an array's dimensions."""
MAX_BYTES = 2**63 - 1
"""A tensor's size in bytes must fit int64 (NumPy's and the backends' index type)."""


@lru_cache(maxsize=4096)
def type_problem(t: TensorType) -> str | None:
    """Why no array can have type t (rank past NumPy's, size past int64), or None."""
    if t.rank > MAX_RANK:
        return f"a tensor of rank {t.rank} has more than {MAX_RANK} dimensions (NumPy's limit)"
    if any(d is not None and d > MAX_BYTES for d in t.shape):
        return "a dimension is larger than 2**63 - 1"
    nbytes = t.numpy_dtype.itemsize
    for d in t.shape:
        nbytes *= d or 1
        if nbytes > MAX_BYTES:
            return f"{_short(t)} has more than 2**63 - 1 bytes"
    return None


def _short(t: TensorType) -> str:
    text = str(t)
    return text if len(text) <= 80 else text[:60] + "...>"


@lru_cache(maxsize=4096)
def parse_type(text: str) -> TensorType:
    """Parses `tensor<...>`; the lexer has already checked the form. A dimension of more than 19
    digits reads as 2**63, past int64 (type_problem reports it where the type is written):
    Python refuses to convert more than 4300 digits at all."""
    body = text[len("tensor<") : -1]
    *dims, dtype = body.split("x")
    shape = tuple(None if d == "?" else int(d) if len(d) <= 19 else 2**63 for d in dims)
    return TensorType(shape, dtype)


def type_of_array(array: np.ndarray) -> TensorType:
    return TensorType(tuple(array.shape), dtype_name(array.dtype))
