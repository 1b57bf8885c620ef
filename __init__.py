"""gir: a compiler for tensor programs with loops (scan), their gradients, and a JIT.

    import gir
    module = gir.load("examples/rnn.gir")      # or gir.parse(text); print(module) re-parses
    gir.interpret(module, "rnn_loss", xs, h0, wx, wh, b)
"""

from .errors import GirArgumentError, GirError, GirPassError, GirSyntaxError, GirTypeError, GirVerifyError
from .frontend.parser import load, parse
from .frontend.python import (
    GirTraceError,
    Spec,
    Tracer,
    abs,
    add,
    astype,
    concatenate,
    divide,
    exp,
    grad,
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
    scan,
    sigmoid,
    spec,
    sqrt,
    stack,
    subtract,
    sum,
    tanh,
    trace,
    transpose,
    value_and_grad,
    where,
    zeros,
    zeros_like,
)
from .ir.core import Module
from .ir.interpreter import interpret
from .ir.verifier import verify
from .jit import jit
from .pyjit import PythonJit  # also installs the eager runner of gir's functions (gir.tanh(array))

__version__ = "0.1.0"
__all__ = ["GirArgumentError", "GirError", "GirPassError", "GirSyntaxError", "GirTypeError", "GirVerifyError",
           "Module", "interpret", "jit", "load", "parse", "verify", "__version__"]
# The Python tracing frontend (DESIGN.md §7, docs/python.md).
__all__ += ["GirTraceError", "PythonJit", "Spec", "Tracer", "abs", "add", "astype", "concatenate", "divide", "exp",
            "grad", "log", "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "multiply", "negative",
            "ones", "ones_like", "power", "relu", "reshape", "scan", "sigmoid", "spec", "sqrt", "stack", "subtract",
            "sum", "tanh", "trace", "transpose", "value_and_grad", "where", "zeros", "zeros_like"]
