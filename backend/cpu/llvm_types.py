"""The LLVM types and shape helpers every lowering module uses (lower/, gather.py): a leaf,
so that gather.py needs nothing of lower/ at run time."""

from __future__ import annotations

from llvmlite import ir

from ...errors import GirError
from ...ir.core import Operation
from ...ir.types import TensorType

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
LLVM_TYPES = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "i32": I32, "i64": I64, "i1": I1}
MEM_TYPES = {**LLVM_TYPES, "i1": I8}  # NumPy stores bools as bytes
ALIGN = 64


def _i64(x: int | ir.Value) -> ir.Value:
    """x as an i64 (a constant when it is an int)."""
    return ir.Constant(I64, x) if isinstance(x, int) else x


def _strides(shape: tuple) -> list[int]:
    """Row-major strides; the leading dim is in none of them (it may be a run-time length,
    analysis/lengths.py)."""
    out, acc = [], 1
    for d in reversed(shape[1:]):
        out.append(acc)
        acc *= d
    return [acc, *out[::-1]] if shape else []


def _static(t: TensorType, op: Operation) -> tuple[int, ...]:
    if not t.is_static:
        raise GirError(f"the CPU backend needs static shapes; '{op.name}' has {t} (gir.jit specialises `?` dims "
                       "on the arguments' shapes)", op.loc)
    return tuple(d for d in t.shape if d is not None)
