"""Specialising a module on argument types: `?` dims fixed, every type re-inferred.

    specialize(module, "loss_grads", [tensor<8x2x3xf64>, ...]) -> a new Module

The entry function gets the given argument types; every op is rebuilt from its spec with
`make_op`, so result types are inferred again from the new operand types, through loop bodies
(their argument types from `OpSpec.region_arg_types`) and through `call` and `grad`: a callee
is specialised on the argument types at the call site (one copy per distinct signature; the
first keeps the callee's name, later ones are named `@f.1`, `@f.2`). Only the entry and the
functions it reaches are in the result. The input module is not changed.

A pre-SSA `var` declared with `?` dims takes the type of the values stored into it. The
specialiser walks each function in program order, as the `ssa` pass does, keeping the type of
every variable's current value: a `load` reads the variable of that type. Where one `?`
variable is stored with different static shapes (`%c = %a` then `%c = %b`, with `%a` and `%b`
both `tensor<?x3xf64>` given 2 and 4 rows), it is split into one `var` per shape, declared
next to the first; each store writes the one of its value's type. A loop-carried variable must
have the same shape at the end of a step as before the loop (a scan's carry has one type); a
variable first stored in a loop body is local to each step, as in the `ssa` pass.

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
        self.var_by_type: dict[Value, dict[TensorType, Value]] = {}
        """A `?` variable of the result -> its variable for each type stored into it (itself first)."""
        self.declared: dict[Value, TensorType] = {}
        """A `?` variable of the result -> the type its `var` op declared."""
        self.current: dict[Value, TensorType] = {}
        """A `?` variable of the result -> the type of its current value, at the op being rebuilt."""

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
            operands[0] = self.store_var(operands[0], operands[1].tensor_type)
        elif op.name == "load":
            operands[0] = self.load_var(operands[0])
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
        stored = list(dict.fromkeys(value_map[s.operands[0]] for s in op.walk()
                                    if s.name == "store" and s.operands[0] in value_map))
        before = {v: self.current[v] for v in stored if v in self.current}
        for v in stored:  # stored in the body and not before: local to each step
            if v not in before:
                self.current.pop(v, None)
        out = []
        for region in op.regions:
            old = region.block
            block = Block(rule(ctx), [a.name_hint for a in old.args])
            value_map.update(zip(old.args, block.args))
            self.block(old, block, value_map)
            out.append(Region(block))
        for v in stored:
            if v not in before:
                self.current.pop(v, None)
            elif self.current.get(v) != before[v]:
                name = v.name_hint or "?"
                raise GirTypeError(f"%{name} holds {before[v]} before the loop and {self.current.get(v)} after a "
                                   "step: a value carried through a loop keeps its shape", op.loc)
        return out

    def store_var(self, var: Value, t: TensorType) -> Value:
        """The variable a store of a t into var writes: var itself, or var's split of type t."""
        by_type = self.var_by_type.get(var)
        if by_type is None:
            held = var.type
            if not isinstance(held, VarType) or held.held.is_static or not refines(t, held.held):
                return var  # a static variable keeps its type; make_op checks the store
            var.type = VarType(t)  # the first store gives a `?` variable its type
            self.declared[var] = held.held
            by_type = self.var_by_type[var] = {t: var}
        if not refines(t, self.declared[var]):
            return var  # make_op reports the store of a wrong type
        self.current[var] = t
        split = by_type.get(t)
        if split is None:
            decl = var.defining_op
            assert decl is not None and decl.parent is not None
            new = make_op("var", [], {}, (), decl.loc, [t], (), [var.name_hint])
            decl.parent.insert_after(decl, new)
            split = by_type[t] = new.result
        return split

    def load_var(self, var: Value) -> Value:
        """The variable holding var's current value (var itself when it was never split)."""
        t = self.current.get(var)
        return var if t is None else self.var_by_type[var][t]
