"""The Python tracing frontend: Python functions on abstract tensors -> the IR (DESIGN.md §7).

`gir.trace`, `gir.scan`, `gir.grad`, `gir.value_and_grad`, `gir.spec` (transforms.py), the
NumPy-spelled functions (numpy_api.py) and the `Tracer` they work on (tracer.py). `gir.jit` of a
Python function lives in driver/pyjit.py (it wires this frontend to the passes and backends).
"""

from .numpy_api import (
    abs,
    add,
    astype,
    concatenate,
    divide,
    exp,
    log,
    logsumexp,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    multiply,
    negative,
    ones,
    ones_like,
    power,
    relu,
    reshape,
    sigmoid,
    sqrt,
    stack,
    subtract,
    sum,
    tanh,
    transpose,
    where,
    zeros,
    zeros_like,
)
from .tracer import GirTraceError, Tracer
from .transforms import Spec, Traced, grad, scan, spec, trace, trace_entry, value_and_grad

__all__ = ["GirTraceError", "Spec", "Traced", "Tracer", "abs", "add", "astype", "concatenate", "divide", "exp",
           "grad", "log", "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "multiply", "negative",
           "ones", "ones_like", "power", "relu", "reshape", "scan", "sigmoid", "spec", "sqrt", "stack", "subtract",
           "sum", "tanh", "trace", "trace_entry", "transpose", "value_and_grad", "where", "zeros", "zeros_like"]
