"""Specialising a module on argument types: `?` dims fixed, every type re-inferred.

    specialize(module, "loss_grads", [tensor<8x2x3xf64>, ...]) -> a new Module

The entry function gets the given argument types; every op is rebuilt from its spec with
`make_op`, so result types are inferred again from the new operand types, through loop bodies
(their argument types from `OpSpec.region_arg_types`) and through `call` and `grad`: a callee
is specialised on the argument types at the call site (one copy per distinct signature; the
first keeps the callee's name, later ones are named `@f.1`, `@f.2`). Only the entry and the
functions it reaches are in the result. The input module is not changed.

A pre-SSA `var` declared with `?` dims takes the type of its first `store` (the emitter stores
a variable's first value right after declaring it, before any load).

Errors are the type errors `make_op` raises, at the op whose types no longer agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import GirTypeError
from .core import Block, Function, Module, Operation, Region, Value
from .ops import make_op, refines
from .spec import InferContext
from .types import TensorType, VarType


def specialize(module: Module, entry: str, arg_types: Sequence[TensorType]) -> Module:
    """A copy of module with @entry taking arg_types, and every function it reaches retyped."""
    return _Specializer(module).run(entry, list(arg_types))


class _Specializer:
    def __init__(self, module: Module):
        self.source = module
        self.done: dict[tuple[str, tuple[TensorType, ...]], Function] = {}
        self.names: set[str] = set()

    def run(self, entry: str, arg_types: list[TensorType]) -> Module:
        self.function(entry, arg_types)
        return Module(list(self.done.values()), self.source.filename)

    def function(self, name: str, arg_types: list[TensorType]) -> Function:
        key = (name, tuple(arg_types))
        found = self.done.get(key)
        if found is not None:
            return found
        orig = self.source.functions[name]
        new_name = name
        k = 0
        while new_name in self.names:
            k += 1
            new_name = f"{name}.{k}"
        self.names.add(new_name)
        f = Function(new_name, arg_types, orig.result_types, [a.name_hint for a in orig.args], orig.loc)
        self.done[key] = f  # before the body: a recursive call finds it (with the written result types)
        value_map: dict[Value, Value] = dict(zip(orig.args, f.args))
        self.block(orig.body, f.body, value_map)
        term = f.body.terminator
        if term is not None:
            got = [v.tensor_type for v in term.operands]
            for t, written in zip(got, orig.result_types):
                if not refines(t, written):
                    raise GirTypeError(f"@{orig.name} returns {t} where its signature says {written}", term.loc)
            f.result_types = got
        return f

    def block(self, src: Block, dst: Block, value_map: dict[Value, Value]) -> None:
        for op in src:
            dst.append(self.op(op, value_map))

    def op(self, op: Operation, value_map: dict[Value, Value]) -> Operation:
        spec = op.spec
        operands = [value_map.get(v, v) for v in op.operands]
        attrs = dict(op.attrs)
        declared = [r.type for r in op.results]
        if op.name == "store":
            _retype_var(operands[0], operands[1])
        regions = self.regions(op, operands, value_map)
        if spec.callee_results is not None:
            callee = self.function(attrs["callee"], [v.tensor_type for v in operands])
            attrs["callee"] = callee.name
            declared = spec.callee_results(op, callee.arg_types, callee.result_types)
        written = [t.held if isinstance(t, VarType) else t for t in declared]
        names = [r.name_hint for r in op.results]
        new = make_op(op.name, operands, attrs, regions, op.loc, written, op.segments, names)
        value_map.update(zip(op.results, new.results))
        return new

    def regions(self, op: Operation, operands: list[Value], value_map: dict[Value, Value]) -> list[Region]:
        if not op.regions:
            return []
        rule = op.spec.region_arg_types
        assert rule is not None, f"'{op.name}' has a region but no region_arg_types rule"
        ctx = InferContext(op.spec, [v.type for v in operands], op.attrs, None, (), op.segments)
        out = []
        for region in op.regions:
            old = region.block
            block = Block(rule(ctx), [a.name_hint for a in old.args])
            value_map.update(zip(old.args, block.args))
            self.block(old, block, value_map)
            out.append(Region(block))
        return out


def _retype_var(var: Value, value: Value) -> None:
    """A `?` variable takes the (more precise) type of the value stored into it."""
    t = var.type
    if isinstance(t, VarType) and not t.held.is_static and isinstance(value.type, TensorType) \
            and value.type != t.held and refines(value.type, t.held):
        var.type = VarType(value.type)
