"""gir: a compiler for tensor programs with loops (scan), their gradients, and a JIT.

    import gir
    module = gir.load("examples/rnn.gir")      # or gir.parse(text); print(module) re-parses
    gir.interpret(module, "rnn_loss", xs, h0, wx, wh, b)
"""

from .errors import GirArgumentError, GirError, GirPassError, GirSyntaxError, GirTypeError, GirVerifyError
from .frontend import python as _python
from .frontend.parser import load, parse
from .frontend.python import *  # noqa: F403 - the Python frontend's names (DESIGN.md §7), listed in its __all__
from .ir.core import Module
from .ir.verifier import verify
from .jit import jit
from .pyjit import PythonJit  # also installs the eager runner of gir's functions (gir.tanh(array))
from .reference import interpret

__version__ = "0.1.0"
__all__ = ["GirArgumentError", "GirError", "GirPassError", "GirSyntaxError", "GirTypeError", "GirVerifyError",
           "Module", "interpret", "jit", "load", "parse", "verify", "__version__"]
# The Python tracing frontend (DESIGN.md §7, docs/python.md).
__all__ += [*_python.__all__, "PythonJit"]
