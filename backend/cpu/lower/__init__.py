"""The CPU backend's lowering: IR to LLVM IR, following the CpuSchedule (base.py has the entry,
`lower_function`, and the module's calling convention). One module per concern: base.py (the
Lowering's state and storage), table.py (the dispatch table), elementwise.py, views.py,
reductions.py, gemm.py, scan.py, lengths.py (sizes that follow the run-time length) and
two_core.py (the worker thread's and the split loops' code)."""

from .base import Lowering, lower_function
from .elementwise import PRIMITIVES
from .table import LENGTH_AWARE, LOWER

__all__ = ["LENGTH_AWARE", "LOWER", "PRIMITIVES", "Lowering", "lower_function"]
