"""gir: a compiler for tensor programs with loops (scan), their gradients, and a JIT.

    import gir
    module = gir.load("examples/rnn.gir")      # or gir.parse(text); print(module) re-parses
    gir.interpret(module, "rnn_loss", xs, h0, wx, wh, b)
"""

import importlib
import sys
import types
from typing import cast

from .driver.jit import jit  # `gir.jit` is the function: no module of gir is named jit
from .driver.reference import interpret
from .errors import GirArgumentError, GirError, GirPassError, GirSyntaxError, GirTypeError, GirVerifyError, did_you_mean
from .frontend import EAGER_LOADERS as _EAGER_LOADERS
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
    "GirTraceError", "Spec", "Traced", "Tracer", "abs", "add", "arange", "argmax", "argmin", "astype", "clip",
    "concatenate", "cond", "cos", "cumsum", "divide", "einsum", "exp", "expand_dims", "expm1", "eye", "flip",
    "fori_loop", "full", "grad", "isfinite", "isnan", "log", "log1p", "log_softmax", "logsumexp", "matmul",
    "max", "maximum", "mean", "min", "minimum", "multiply", "negative", "one_hot", "ones", "ones_like", "pad",
    "power", "prod", "relu", "repeat", "reshape", "scan", "sigmoid", "sign", "sin", "softmax", "spec", "split",
    "sqrt", "square", "squeeze", "stack", "std", "stop_gradient", "subtract", "sum", "take_along_axis", "tanh",
    "tile", "trace", "trace_entry", "transpose", "value_and_grad", "var", "vmap", "where", "while_loop",
    "zeros", "zeros_like")
__all__ += [*_PYTHON_FRONTEND, "PythonJit"]
_TRANSFERS = ("device_get", "device_put")
"""`gir.device_put` / `gir.device_get` (driver/transfer.py: pytrees to the GPU and back), loaded
on first use too."""
__all__ += list(_TRANSFERS)

_NAMESPACES = {"numpy": "gnumpy", "nn": "nn", "lax": "lax", "tree_util": "tree_util", "optim": "optim"}
"""`gir.numpy` (as jax.numpy), `gir.nn`, `gir.lax`, `gir.tree_util`, `gir.optim`: modules of the
Python frontend (frontend/python/<file>.py), registered here as lazy modules so that `import
gir.numpy as gnp` works without loading the frontend until a name is used. (No file named
numpy.py may sit in this package's folder: run from the repository root, it would shadow
NumPy itself.)"""


def _lazy_namespace(short: str, target: str) -> types.ModuleType:
    module = types.ModuleType(f"{__name__}.{short}", f"gir.{short}: frontend/python/{target}.py, loaded on first use")

    def load(name: str) -> object:
        real = importlib.import_module(f".frontend.python.{target}", __name__)
        module.__dict__.update({n: vars(real)[n] for n in real.__all__})
        module.__dict__.update(__all__=list(real.__all__), __doc__=real.__doc__)
        if name in module.__dict__:
            return module.__dict__[name]
        raise AttributeError(f"module 'gir.{short}' has no attribute '{name}'"
                             + did_you_mean(name, real.__all__))

    module.__getattr__ = load  # type: ignore[method-assign]
    module.__dir__ = lambda: sorted(cast(list[str], load("__all__")))  # type: ignore[method-assign]
    sys.modules[module.__name__] = module
    return module


for _short, _target in _NAMESPACES.items():
    globals()[_short] = _lazy_namespace(_short, _target)
__all__ += list(_NAMESPACES)


def _load_eager_runner() -> None:
    """Fills the tracing frontend's eager runner (driver/pyjit.py sets numpy_api.EAGER): called by
    the frontend on its first eager call, so `from gir.frontend.python import tanh` runs too."""
    from .driver import pyjit  # noqa: F401


_EAGER_LOADERS.append(_load_eager_runner)


def __getattr__(name: str) -> object:
    """`gir.scan`, `gir.PythonJit`, ...: imports the Python frontend and binds all its names."""
    if name in _TRANSFERS:
        from .driver import transfer

        globals().update(device_get=transfer.device_get, device_put=transfer.device_put)
        return globals()[name]
    if name not in _PYTHON_FRONTEND and name != "PythonJit":
        raise AttributeError(f"module 'gir' has no attribute '{name}'" + did_you_mean(name, __all__))
    from .driver.pyjit import PythonJit  # installs the eager runner, as importing gir used to
    from .frontend import python

    namespace = globals()
    namespace.update({n: getattr(python, n) for n in python.__all__})
    namespace["PythonJit"] = PythonJit
    return namespace[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
