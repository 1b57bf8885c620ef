"""The CPU backend's lowering: IR to LLVM IR, following the CpuSchedule (base.py has the entry,
`lower_function`, and the module's calling convention)."""

from .base import LENGTH_AWARE, LOWER, PRIMITIVES, Lowering, lower_function

__all__ = ["LENGTH_AWARE", "LOWER", "PRIMITIVES", "Lowering", "lower_function"]
