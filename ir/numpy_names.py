"""NumPy's names for gir's ops, for hints: a user who writes `where(...)` or `np.maximum(...)`
is told gir's name (`select`, `max`). Names NumPy and gir share (`exp`, `tanh`, `sum`) are
not listed; every entry names an op of the registry (tests/test_diagnostics.py checks it)."""

from __future__ import annotations

NUMPY_NAMES: dict[str, str] = {
    "subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div",
    "power": "pow", "negative": "neg", "absolute": "abs", "maximum": "max", "minimum": "min",
    "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "equal": "eq",
    "not_equal": "ne", "logical_and": "and", "logical_or": "or", "where": "select", "astype": "cast",
    "full": "fill", "dot": "matmul", "swapaxes": "transpose",
    "permute_dims": "transpose", "broadcast_to": "broadcast", "concatenate": "concat",
    "take": "index", "amax": "reduce_max", "amin": "reduce_min",
}
"""NumPy function (or array method) name -> gir op."""
