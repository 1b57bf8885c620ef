"""gir: a compiler for tensor programs with loops (scan), their gradients, and a JIT.

    import gir
    module = gir.load("examples/rnn.gir")      # or gir.parse(text); print(module) re-parses
    gir.interpret(module, "rnn_loss", xs, h0, wx, wh, b)
"""

from .driver.jit import jit  # `gir.jit` is the function: no module of gir is named jit
from .driver.reference import interpret
from .errors import GirArgumentError, GirError, GirPassError, GirSyntaxError, GirTypeError, GirVerifyError
from .frontend.parser import load, parse
from .ir.core import Module
from .ir.verifier import verify
from .version import __version__

__all__ = ["GirArgumentError", "GirError", "GirPassError", "GirSyntaxError", "GirTypeError", "GirVerifyError",
           "Module", "interpret", "jit", "load", "parse", "verify", "__version__"]

# The Python tracing frontend (DESIGN.md §7, docs/python.md) is loaded on first use of one of its
# names (PEP 562): `gir opt`, `gir run` and gir.jit of a .gir file never need it, and importing
# it (with driver/pyjit.py, which installs the eager runner of gir.tanh(array) and friends) cost a
# quarter of `import gir`. Its names are listed here so that `gir.__all__`, `dir(gir)` and
# `from gir import *` need no import; tests/test_imports.py checks the list against its __all__.
_PYTHON_FRONTEND = (
    "GirTraceError", "Spec", "Traced", "Tracer", "abs", "add", "astype", "concatenate", "divide", "exp", "grad",
    "log", "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "multiply", "negative", "ones",
    "ones_like", "power", "relu", "reshape", "scan", "sigmoid", "spec", "sqrt", "stack", "subtract", "sum", "tanh",
    "trace", "trace_entry", "transpose", "value_and_grad", "where", "zeros", "zeros_like")
__all__ += [*_PYTHON_FRONTEND, "PythonJit"]


def __getattr__(name: str) -> object:
    """`gir.scan`, `gir.PythonJit`, ...: imports the Python frontend and binds all its names."""
    if name not in _PYTHON_FRONTEND and name != "PythonJit":
        raise AttributeError(f"module 'gir' has no attribute '{name}'")
    from .driver.pyjit import PythonJit  # installs the eager runner, as importing gir used to
    from .frontend import python

    namespace = globals()
    namespace.update({n: getattr(python, n) for n in python.__all__})
    namespace["PythonJit"] = PythonJit
    return namespace[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
