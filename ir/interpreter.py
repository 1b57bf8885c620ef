"""The reference semantics: runs a function on NumPy arrays, op by op.

Every pass and backend is tested against this. Pure ops run their registry kernel; the
structural ops (`scan`, `for`, `var`/`load`/`store`, `call`) are run here. `grad` must be
expanded by the autodiff pass first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import GirArgumentError, GirError, did_you_mean
from .core import Block, Function, Module, Operation, Value
from .loops import LoopView
from .ops import REGISTRY, reduction_axes
from .specialize import specialize
from .types import TensorType
from .verifier import call_cycle_error

Env = dict[Value, Any]


def check_arguments(f: Function, args: Sequence[Any], device_array: Callable[[Any], bool] | None = None
                    ) -> list[np.ndarray]:
    """Checks count, dtype and shape of arguments against f's signature; returns arrays (a
    value device_array accepts, the GPU backend's device arrays, as it is)."""
    if len(args) != len(f.args):
        raise GirArgumentError(f"@{f.name} takes {len(f.args)} argument(s), got {len(args)}", f.loc)
    arrays = []
    for i, (a, param) in enumerate(zip(args, f.args)):
        t = param.tensor_type
        name = "%" + (param.name_hint or str(i))
        if device_array is not None and device_array(a):
            pass  # checked below by its shape and dtype, never copied to the host
        elif not isinstance(a, (np.ndarray, np.generic)):
            raise GirArgumentError(f"argument {name} of @{f.name} must be a NumPy array of {t}, "
                                   f"got {type(a).__name__}", f.loc)
        else:
            a = np.asarray(a)
        if not t.matches(a):
            raise GirArgumentError(f"argument {name} of @{f.name} must be {t}, got an array of shape "
                                   f"{a.shape} and dtype {a.dtype}", f.loc)
        arrays.append(a)
    return arrays


def random_inputs(f: Function, seed: int) -> list[np.ndarray]:
    """Seeded random arguments for f: floats ~ N(0, 0.1), ints in [0, 3), bools fair."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in f.args:
        t = arg.tensor_type
        if not t.is_static:
            raise GirArgumentError(f"random inputs cannot invent a size for {t} (argument %{arg.name_hint}); "
                                   "pass real inputs", f.loc)
        shape = t.static_shape
        if t.is_float:
            out.append((0.1 * rng.standard_normal(shape)).astype(t.numpy_dtype))
        elif t.dtype == "i1":
            out.append(rng.integers(0, 2, shape).astype(bool))
        else:
            out.append(rng.integers(0, 3, shape).astype(t.numpy_dtype))
    return out



def empty_reduction(op: Operation, shape: tuple[int, ...]) -> str | None:
    """Why reduction `op` has no value on an operand of this shape, or None: its spec says
    `empty_is_error` (max, min) and a reduced axis has size 0, as NumPy says. The interpreter
    raises it; the backends, which know the shape when they compile, raise it when the op runs."""
    reduction = op.spec.reduction
    if reduction is None or not reduction.empty_is_error:
        return None
    for axis in reduction_axes(op.attrs, len(shape)):
        if shape[axis] == 0:
            dims = "x".join(map(str, shape))
            return f"'{op.name}' of no element has no value: axis {axis} of its {dims} operand is empty"
    return None


class Interpreter:
    def __init__(self, module: Module):
        self.module = module
        self.calling: list[str] = []
        """The functions being run, outermost first: a call of one of them is a cycle (the
        verifier rejects cycles; a module built through the API may not have been verified)."""
        self.specialisations: dict[tuple, Interpreter] = {}
        """(entry, argument shapes) -> an interpreter of the module specialised on them."""

    def call(self, name: str, args: Sequence[Any]) -> list[np.ndarray]:
        f = self.module.functions.get(name)
        if f is None:
            raise GirArgumentError(f"no function @{name}; the module has "
                                   + ", ".join("@" + n for n in self.module.functions)
                                   + did_you_mean(name, self.module.functions, prefix="@"))
        return self.run_checked(f, check_arguments(f, args))

    def run_checked(self, f: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Runs f (a function of this module) on arguments `check_arguments` has checked."""
        name = f.name
        if self._has_unknown_dims():
            return self._specialised(name, f, arrays)
        env: Env = dict(zip(f.args, arrays))
        self.calling = [name]
        return self.run_block(f.body, env)

    def _has_unknown_dims(self) -> bool:
        return any(not t.is_static for g in self.module.functions.values() for t in g.arg_types)

    def _specialised(self, name: str, f: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Runs @name of the module specialised on the arguments' shapes, as gir.jit compiles it:
        with every `?` fixed, a loop of zero steps knows the shape of what it stacks (tensor<0x3xf32>
        from a tensor<?x?xf32> sequence given 0x3), and sizes that disagree are type errors at
        their op, as the backends report them."""
        key = (name, tuple(a.shape for a in arrays))
        inner = self.specialisations.get(key)
        if inner is None:
            types = [t.with_shape(a.shape) for t, a in zip(f.arg_types, arrays)]
            inner = self.specialisations[key] = Interpreter(specialize(self.module, name, types))
        return inner.run_checked(inner.module.functions[name], arrays)

    def run_block(self, block: Block, env: Env) -> list[Any]:
        for op in block:
            if op.spec.terminator:
                return [env[v] for v in op.operands]
            self.run_op(op, env)
        raise AssertionError("block without terminator")

    def run_op(self, op: Operation, env: Env) -> None:
        spec = REGISTRY[op.name]
        args = [env[v] for v in op.operands]
        if spec.reduction is not None:
            message = empty_reduction(op, args[0].shape)
            if message is not None:
                raise GirError(f"{message} at run time", op.loc)  # as the backends say it
        try:
            if spec.kernel is not None:
                out = spec.kernel(op, *args)
                outs = [out] if len(op.results) == 1 else list(out)
            else:
                outs = getattr(self, "op_" + op.name)(op, args, env)
        except GirError:
            raise
        except (ArithmeticError, IndexError, ValueError) as e:
            raise GirError(f"'{op.name}' failed at run time: {e}", op.loc) from None
        except MemoryError:  # NumPy could not allocate a result (the backends check sizes first)
            sizes = ", ".join(str(r.type) for r in op.results)
            raise GirError(f"'{op.name}' makes {sizes}: more than the memory NumPy could allocate", op.loc) from None
        for r, value in zip(op.results, outs):
            if isinstance(r.type, TensorType):
                value = np.asarray(value, dtype=r.type.numpy_dtype)
            env[r] = value

    # -- structural ops ---------------------------------------------------------------------
    def op_var(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        return [[None]]

    def op_load(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        value = args[0][0]
        if value is None:
            raise GirError("load of a variable that was never stored", op.loc)
        return [value]

    def op_store(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        args[0][0] = args[1]
        return []

    def op_call(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        f = self.module.functions[op.attrs["callee"]]
        if f.name in self.calling:
            raise call_cycle_error(self.calling[self.calling.index(f.name):], op)
        self.calling.append(f.name)
        try:
            return self.run_block(f.body, dict(zip(f.args, args)))
        finally:
            self.calling.pop()

    def op_grad(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        raise GirError("'grad' must be expanded by the autodiff pass before it can run", op.loc)

    def op_scan(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        view = LoopView(op)
        seqs = [env[v] for v in view.sequences]
        carries = [env[v] for v in view.inits]
        steps = seqs[0].shape[0] if seqs else op.attrs["length"]
        if any(s.shape[0] != steps for s in seqs):
            raise GirError("the sequences of this loop have different lengths: "
                           + ", ".join(str(s.shape[0]) for s in seqs), op.loc)
        length = op.attrs["length"]
        if length is not None and steps != length:
            raise GirError(f"this loop has 'length {length}' but its sequences have {steps} elements", op.loc)
        stacks: list[list[Any]] = [[None] * steps for _ in view.stacked_results]
        element_args, carry_args = view.element_args, view.carry_args
        yielded_carries, yielded_stacks = view.yielded_carries, view.yielded_stacks
        order = range(steps - 1, -1, -1) if view.reverse else range(steps)
        for t in order:
            env.update(zip(element_args, [s[t] for s in seqs]))
            env.update(zip(carry_args, carries))
            self.run_block(view.body, env)
            carries = [env[v] for v in yielded_carries]
            for stack, v in zip(stacks, yielded_stacks):
                stack[t] = env[v]
        values: dict[Value, Any] = dict(zip(view.final_carries, carries))
        for r, stack in zip(view.stacked_results, stacks):
            values[r] = np.stack(stack) if steps else _no_steps(op, r.tensor_type)
        return [values[r] for r in op.results]

    op_for = op_scan

    def op_fused(self, op: Operation, args: list[Any], env: Env) -> list[Any]:
        env.update(zip(op.arg_group("inputs"), [env[v] for v in op.group("inputs")]))
        return self.run_block(op.body, env)


def _no_steps(op: Operation, stacked: TensorType) -> np.ndarray:
    """The stack of a loop that ran no step: no element, of the element type's shape (the
    leading dim is the trip count, 0, even where the type says `?`)."""
    element = tuple(d for d in stacked.shape[1:] if d is not None)
    if len(element) != stacked.rank - 1:
        raise GirError(f"a loop of zero steps cannot tell the shape of its stacked {stacked}: the element "
                       "has `?` dims (gir.jit specialises them on the arguments first)", op.loc)
    return np.zeros((0, *element), stacked.numpy_dtype)


def interpret(module: Module, entry: str, *args: Any) -> list[np.ndarray]:
    """Runs @entry on NumPy arrays with the reference semantics; returns its results."""
    return Interpreter(module).call(entry, args)
