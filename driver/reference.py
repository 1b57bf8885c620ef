"""`gir.interpret`: the reference semantics of a module as written, whatever it needs first.

    gir.interpret(module, "rnn_grads", xs, h0, wx, wh, b)      # `grad` and all

The interpreter (ir/interpreter.py) runs every op but `grad`, which only the `autodiff` pass
gives a meaning. So when the entry reaches a `grad`, this runs `ssa,autodiff` (nothing else:
no rewrite that the reference should not depend on) on a copy of the module, specialised on
the arguments' shapes first where the signature has `?` dims (autodiff makes zero
cotangents, which need static shapes): `compile_entry` on the `interp` target
(driver/compile.py). The module given is never changed. Arguments follow
the JIT's calling convention (driver/calling.py); results are named as the JIT's (driver/results.py).
"""

from __future__ import annotations

from typing import Any

from ..errors import GirArgumentError, did_you_mean
from ..ir.core import Module
from ..ir.interpreter import check_arguments
from ..passes.pass_manager import DebugOptions
from .calling import bind_arguments
from .compile import CompileOptions, compile_entry
from .results import name_results

AUTODIFF_PIPELINE = "ssa,autodiff"
"""What a module with `grad` needs before the interpreter can run it."""


def needs_autodiff(module: Module) -> bool:
    return any(op.name == "grad" for op in module.walk())


def interpret(module: Module, entry: str, *args: Any, **kwargs: Any) -> tuple:
    """Runs @entry of module on arguments (NumPy arrays, Python numbers or lists; by position
    or by parameter name) with the reference semantics; returns its named results. A module
    with `grad` is differentiated first (on a copy), as gir.jit does."""
    if not isinstance(module, Module):
        raise GirArgumentError(f"gir.interpret takes a Module (gir.parse / gir.load), not {type(module).__name__}")
    name = entry.lstrip("@")
    f = module.functions.get(name)
    if f is None:
        raise GirArgumentError(f"no function @{name}; the module has " + ", ".join("@" + n for n in module.functions)
                               + did_you_mean(name, module.functions, prefix="@"))
    arrays = check_arguments(f, bind_arguments(f, args, kwargs))
    if needs_autodiff(module):  # on the arguments' shapes: autodiff's zero cotangents need them
        types = [t.with_shape(a.shape) for t, a in zip(f.arg_types, arrays)]
        executable = compile_entry(module, name, types, "interp", AUTODIFF_PIPELINE, QUIET)
    else:  # the module as written, `?` dims and all (the interpreter specialises calls itself)
        executable = compile_entry(module, name, f.arg_types, "interp", "", AS_GIVEN)
    return name_results(f, executable.run(arrays))


QUIET = CompileOptions(progress=False)
"""The reference prints no progress line: it compiles nothing but the autodiff pass."""
AS_GIVEN = CompileOptions(progress=False, debug=DebugOptions(input_verified=True))
"""No pass: the module runs as given, not verified again (the interpreter checks what it runs)."""
