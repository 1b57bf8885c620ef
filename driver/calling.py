"""The calling convention of `gir.jit` functions and `gir.interpret`: binding Python arguments
to a function's parameters and converting them to NumPy arrays of the parameters' dtypes.

    fn(xs, h0, wx=wx, wh=wh, b=b)     # positional, then keywords by parameter name (no `%`)

Binding, as Python binds a call: positional arguments fill the parameters in order, keywords
(`xs=` or `**{"%xs": ...}`) fill them by name; too many, a missing one, an unknown keyword or
one given twice is a `GirArgumentError` naming the parameters.

Converting (docs/backend.md, "Calling convention"):

- A NumPy array (or anything with `__array__`: a CPU torch tensor, a JAX array) keeps its
  dtype when it is the parameter's. A *widening* within one kind is done by a copy, since it
  is exact: f32 -> f64, i32 -> i64. Anything else is an error that says what to write:
  f64 -> f32 would lose precision, int -> float and float -> int change kind; gir never
  narrows silently (PyTorch refuses mixed dtypes the same way; JAX would silently demote f64
  when x64 is off).
- A Python number, bool, or (nested) list or tuple of them is *weakly typed*, as in JAX and
  PyTorch: it takes the parameter's dtype. A Python float becomes the nearest float32 for an
  f32 parameter (`0.1` is not exactly representable in either: this is the rounding every
  f32 program does). An integer parameter takes only integral values in its range; an `i1`
  parameter takes only bools; a float parameter takes no bools. A list holding NumPy arrays
  or scalars is an array of their dtype (the rules above apply).

Shapes are not converted or broadcast: after conversion, `check_arguments` checks the rank and
sizes against the signature (`?` matches any size).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import GirArgumentError
from ..ir.core import Function
from ..ir.types import TensorType

_MISSING = object()


def parameter_names(f: Function) -> list[str]:
    """The names a keyword may use: the parameters' names without `%` (their position where unnamed)."""
    return [p.name_hint or str(i) for i, p in enumerate(f.args)]


def bind_arguments(f: Function, args: Sequence[Any], kwargs: Mapping[str, Any],
                   device_view: Callable[[Any], Any] | None = None) -> list[np.ndarray]:
    """args and kwargs bound to f's parameters and converted to arrays of their dtypes; a
    value that device_view (the GPU backend's: backend/gpu/device.device_view) turns into a
    device array, without a copy, is taken as that array, if its dtype is the parameter's."""
    if not kwargs and len(args) == len(f.args) and all(
            type(a) is np.ndarray and a.dtype == p.tensor_type.numpy_dtype and a.flags.c_contiguous
            for a, p in zip(args, f.args)):
        return list(args)  # the common call: every argument a C-ordered array of its parameter's dtype
    names = parameter_names(f)
    listed = ", ".join("%" + n for n in names) or "none"
    if len(args) > len(names):
        raise GirArgumentError(f"@{f.name} takes {len(names)} argument(s) ({listed}), got {len(args)}", f.loc)
    bound: list[Any] = list(args) + [_MISSING] * (len(names) - len(args))
    for key, value in kwargs.items():
        name = key.removeprefix("%")
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean %{close[0]}? " if close else ""
            raise GirArgumentError(f"@{f.name} has no parameter %{name}; {hint}its parameters are {listed}", f.loc)
        i = names.index(name)
        if bound[i] is not _MISSING:
            how = "by position and by name" if i < len(args) else "twice"
            raise GirArgumentError(f"argument %{name} of @{f.name} is given {how}", f.loc)
        bound[i] = value
    missing = [names[i] for i, v in enumerate(bound) if v is _MISSING]
    if missing:
        raise GirArgumentError(f"@{f.name} is missing argument(s) " + ", ".join("%" + n for n in missing)
                               + f"; it takes {listed}", f.loc)
    out = []
    for i, (p, v) in enumerate(zip(f.args, bound)):
        view = device_view(v) if device_view is not None else None
        out.append(view if view is not None and _device_dtype(f, names[i], p.tensor_type, view)
                   else convert_argument(f, names[i], p.tensor_type, v))
    return out


def _device_dtype(f: Function, name: str, t: TensorType, value: Any) -> bool:
    """True when a device array has t's dtype; else an error (no conversion on the device)."""
    if np.dtype(value.dtype) != t.numpy_dtype:
        raise GirArgumentError(f"argument %{name} of @{f.name} must be {t}, got a device array of dtype "
                               f"{np.dtype(value.dtype)}: convert it on the device first (.astype)", f.loc)
    return True


def convert_argument(f: Function, name: str, t: TensorType, value: Any) -> np.ndarray:
    """value as an array of t's dtype, by the rules of the module docstring."""
    what = f"argument %{name} of @{f.name}"
    if isinstance(value, (bool, int, float, list, tuple)) and not isinstance(value, np.generic):
        if not _holds_arrays(value):
            return _weak(f, what, t, value)
        value = np.asarray(value)  # a list of arrays keeps their dtype: the rules for arrays apply
    if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
        try:
            array = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - whatever __array__ raises, say which argument
            raise GirArgumentError(f"{what} cannot be read as an array: {e}", f.loc) from None
        return _strong(f, what, t, array)
    raise GirArgumentError(f"{what} must be a NumPy array of {t} (or a Python number or list), got "
                           f"{type(value).__name__}", f.loc)


def _strong(f: Function, what: str, t: TensorType, a: np.ndarray) -> np.ndarray:
    want = t.numpy_dtype
    if a.dtype.byteorder not in "=|" and a.dtype.isnative is False:
        a = a.astype(a.dtype.newbyteorder("="))  # a big-endian array (from a file) is the same numbers
    if a.dtype == want:
        # A transposed, strided or Fortran-order view is copied to C order, as NumPy users expect
        # (the CPU backend reads arguments in place); a 0-d array is always contiguous.
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    if a.dtype.kind == want.kind and a.dtype.kind in "fi" and a.dtype.itemsize < want.itemsize:
        return a.astype(want, order="C")  # exact: every f32 is an f64, every i32 an i64
    if a.dtype.kind == want.kind and a.dtype.itemsize > want.itemsize:
        why = "loses precision" if want.kind == "f" else "may overflow"
    elif a.dtype.kind in "fiub" and want.kind in "fib":
        why = "changes the kind of number"
    else:
        raise GirArgumentError(f"{what} must be {t}, got an array of dtype {a.dtype}", f.loc)
    raise GirArgumentError(f"{what} must be {t}, got a {a.dtype} array; gir does not convert {a.dtype} to "
                           f"{want} implicitly ({why}): pass .astype(np.{want}) to convert", f.loc)


def _weak(f: Function, what: str, t: TensorType, value: Any) -> np.ndarray:
    try:
        raw = np.asarray(value)
    except ValueError:
        raw = np.asarray(None, dtype=object)
    if raw.dtype == object or raw.dtype.kind not in "biuf":
        raise GirArgumentError(f"{what} must be {t}: a number, or a rectangular (nested) list of numbers, got "
                               f"{_describe(value)}", f.loc)
    want = t.numpy_dtype
    if want.kind == "b" and raw.dtype.kind != "b" and raw.size:
        raise GirArgumentError(f"{what} is {t}: pass Python bools (True/False), not {raw.dtype.name} values",
                               f.loc)
    if want.kind == "f" and raw.dtype.kind == "b":
        raise GirArgumentError(f"{what} is {t}: pass numbers, not bools", f.loc)
    if want.kind == "i":
        if raw.dtype.kind == "b" or (raw.dtype.kind == "f" and not np.all(np.mod(raw, 1) == 0)):
            raise GirArgumentError(f"{what} is {t}: pass integers, not {_kind_name(raw)}", f.loc)
        info = np.iinfo(want)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            raise GirArgumentError(f"{what} is {t}: {raw.max() if raw.max() > info.max else raw.min()} is "
                                   f"outside its range [{info.min}, {info.max}]", f.loc)
    with np.errstate(over="ignore"):
        out = raw.astype(want)
    if want.kind == "f" and not np.all(np.isfinite(out) | ~np.isfinite(raw)):
        raise GirArgumentError(f"{what} is {t}: a value is too large for {want} (it would be inf)", f.loc)
    return out


def _holds_arrays(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_arrays(v) for v in value)
    return isinstance(value, (np.ndarray, np.generic))


def _kind_name(raw: np.ndarray) -> str:
    return "bools" if raw.dtype.kind == "b" else "fractions"


def _describe(value: Any) -> str:
    return "a ragged list" if isinstance(value, (list, tuple)) else type(value).__name__
