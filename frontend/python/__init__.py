"""The Python tracing frontend: Python functions on abstract tensors -> the IR (DESIGN.md §7).

`gir.trace`, `gir.scan`, `gir.grad`, `gir.value_and_grad`, `gir.spec` (transforms.py), the
NumPy-spelled functions (numpy_api.py) and the `Tracer` they work on (tracer.py). `gir.jit` of a
Python function lives in driver/pyjit.py (it wires this frontend to the passes and backends).
"""

from . import at_update  # noqa: F401 - installs `x.at[idx].set/add/multiply/get` on Tracer
from .control import cond, fori_loop, vmap, while_loop
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
from .numpy_extra import (
    arange,
    argmax,
    argmin,
    clip,
    cos,
    cumsum,
    einsum,
    expand_dims,
    expm1,
    eye,
    flip,
    full,
    isfinite,
    isnan,
    log1p,
    log_softmax,
    one_hot,
    pad,
    prod,
    repeat,
    sign,
    sin,
    softmax,
    split,
    square,
    squeeze,
    std,
    stop_gradient,
    take_along_axis,
    tile,
    var,
)
from .tracer import GirTraceError, Tracer
from .transforms import Spec, Traced, grad, scan, spec, trace, trace_entry, value_and_grad

__all__ = ["GirTraceError", "Spec", "Traced", "Tracer", "abs", "add", "arange", "argmax", "argmin", "astype",
           "clip", "concatenate", "cond", "cos", "cumsum", "divide", "einsum", "exp", "expand_dims", "expm1", "eye",
           "flip", "fori_loop", "full", "grad", "isfinite", "isnan", "log", "log1p", "log_softmax", "logsumexp",
           "matmul", "max", "maximum", "mean", "min", "minimum", "multiply", "negative", "one_hot", "ones",
           "ones_like", "pad", "power", "prod", "relu", "repeat", "reshape", "scan", "sigmoid", "sign", "sin",
           "softmax", "spec", "split", "sqrt", "square", "squeeze", "stack", "std", "stop_gradient", "subtract",
           "sum", "take_along_axis", "tanh", "tile", "trace", "trace_entry", "transpose", "value_and_grad", "var",
           "vmap", "where", "while_loop", "zeros", "zeros_like"]
