"""IR -> text in the SSA form of the grammar; `parse(print(m))` prints identically.

The printer owns naming: a value prints as its source name when it has one (`%h`), made unique
within the function by a `.N` suffix (`%h.1`), else as a number (`%0`, `%1`, ...) in program
order. Attributes equal to their spec default are not printed. Comments are never printed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .loops import LoopView  # loops.py names core's classes for type checking only
from .spec import REGISTRY

if TYPE_CHECKING:  # printer.py is imported by core.py, so it names IR nodes for type hints only
    from .core import Function, Module, Operation, Value
    from .spec import OpSpec


class _Names:
    def __init__(self) -> None:
        self.names: dict[Value, str] = {}
        self.used: set[str] = set()
        self.counter = 0
        self.next_suffix: dict[str, int] = {}

    def assign(self, value: Value) -> None:
        hint = value.name_hint
        if hint is None or hint.isdigit():
            while str(self.counter) in self.used:
                self.counter += 1
            name = str(self.counter)
            self.counter += 1
        elif hint not in self.used:
            name = hint
        else:
            i = self.next_suffix.get(hint, 1)  # resume where this name left off: linear, not quadratic
            while f"{hint}.{i}" in self.used:
                i += 1
            self.next_suffix[hint] = i + 1
            name = f"{hint}.{i}"
        self.used.add(name)
        self.names[value] = "%" + name

    def __getitem__(self, value: Value) -> str:
        name = self.names.get(value)
        return name if name is not None else "%<undefined>"


def format_attr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, (list, tuple)):  # None in a list: `?`, a dim kept whole (slice limits, reshape shape)
        return "[" + ", ".join("?" if v is None else format_attr(v) for v in value) + "]"
    if hasattr(value, "tolist"):
        return format_attr(value.tolist())
    raise TypeError(f"cannot print attribute {value!r}")


class Printer:
    def __init__(self, print_locations: bool = False):
        self.print_locations = print_locations

    def module(self, module: Module) -> str:
        return "\n".join(self.function(f) for f in module.functions.values())

    def function(self, f: Function) -> str:
        names = _Names()
        for arg in f.args:
            names.assign(arg)
        for op in f.walk():
            for region in op.regions:
                for arg in region.block.args:
                    names.assign(arg)
            for r in op.results:
                names.assign(r)
        self.names = names
        params = ", ".join(f"{names[a]}: {a.type}" for a in f.args)
        rts = f.result_types
        results = "" if not rts else f" -> {rts[0]}" if len(rts) == 1 else " -> (" + ", ".join(map(str, rts)) + ")"
        lines = [f"func @{f.name}({params}){results} {{"]
        for op in f.body:
            self.op(op, "  ", lines)
        lines.append("}" + self.loc(f.loc) + "\n")
        return "\n".join(lines)

    def loc(self, loc: Any) -> str:
        if not self.print_locations or loc is None or loc.line == 0:
            return ""
        file = loc.file.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # the parser undoes it
        return f' loc("{file}":{loc.line}:{loc.col})'

    def op(self, op: Operation, indent: str, lines: list[str]) -> None:
        """Appends op's lines: the custom form of a structural op, else the generic form."""
        spec = REGISTRY[op.name]
        if spec.loop:
            self._loop(op, indent, lines)
        elif op.name == "fused":
            self._fused(op, indent, lines)
        elif op.name == "yield":
            lines.append(indent + self._yield(op) + self.loc(op.loc))
        elif op.name == "return":
            args = ", ".join(self.names[v] for v in op.operands)
            lines.append(f"{indent}return{' ' + args if args else ''}{self.loc(op.loc)}")
        elif spec.interprocedural:
            lines.append(indent + self._results(op) + self._call(op) + self._types(op) + self.loc(op.loc))
        elif len(op.results) == 1:  # most ops: `%r = name operands {attrs} : type`, with fewer calls
            result = op.results[0]
            text = f"{indent}{self.names[result]} = {self._generic(op, spec)} : {result.type}"
            lines.append(text + self.loc(op.loc) if self.print_locations else text)
        else:
            lines.append(indent + self._results(op) + self._generic(op, spec) + self._types(op) + self.loc(op.loc))

    def _results(self, op: Operation) -> str:
        """`%a, %b = `, or nothing for an op without results."""
        return ", ".join(self.names[r] for r in op.results) + " = " if op.results else ""

    def _types(self, op: Operation) -> str:
        """` : type, type` of the results, or nothing."""
        return " : " + ", ".join(str(r.type) for r in op.results) if op.results else ""

    def _region(self, op: Operation, header: str, indent: str, lines: list[str]) -> None:
        """`results = header {`, the body one level deeper, then `} : types`."""
        lines.append(f"{indent}{self._results(op)}{header} {{")
        for inner in op.body:
            self.op(inner, indent + "  ", lines)
        lines.append(f"{indent}}}{self._types(op)}{self.loc(op.loc)}")

    def _loop(self, op: Operation, indent: str, lines: list[str]) -> None:
        """`scan reverse length N (%x in %xs) carry (%h = %h0) { ... }`; `for` has no carries.
        Reads no yield, so a loop left half-built by a failing pass still prints."""
        n = self.names
        view = LoopView(op)
        mods = (" reverse" if view.reverse else "") + (f" length {view.length}" if view.length is not None else "")
        binds = ", ".join(f"{n[a]} in {n[s]}" for a, s in zip(view.element_args, view.sequences))
        carry = ""
        if view.inits:
            carry = " carry (" + ", ".join(f"{n[a]} = {n[v]}" for a, v in zip(view.carry_args, view.inits)) + ")"
        self._region(op, f"{op.name}{mods} ({binds}){carry}", indent, lines)

    def _fused(self, op: Operation, indent: str, lines: list[str]) -> None:
        """`fused (%a = %x, ...) { ... }`: each body argument bound to its operand."""
        binds = ", ".join(f"{self.names[a]} = {self.names[v]}" for a, v in zip(op.arg_group("inputs"),
                                                                                  op.group("inputs")))
        self._region(op, f"fused ({binds})", indent, lines)

    def _yield(self, op: Operation) -> str:
        """`yield (carries) stack (stacks)`; the carry list is printed (maybe empty) when stacks follow."""
        n = self.names
        carries, stacks = op.group("carries"), op.group("stacks")
        text = "yield"
        if carries or stacks:
            text += " (" + ", ".join(n[v] for v in carries) + ")"
        if stacks:
            text += " stack (" + ", ".join(n[v] for v in stacks) + ")"
        return text

    def _call(self, op: Operation) -> str:
        """`call @f(args)`, or `grad @f(args) wrt (...)` naming each wrt argument by value, or by
        position where the same value is passed more than once (the name would be ambiguous)."""
        n = self.names
        args = ", ".join(n[v] for v in op.operands)
        text = f"{op.name} @{op.attrs['callee']}({args})"
        if op.name == "grad":
            items = []
            for pos in op.attrs["wrt"]:
                v = op.operands[pos]
                items.append(n[v] if op.operands.count(v) == 1 else str(pos))
            text += " wrt (" + ", ".join(items) + ")"
        return text

    def _generic(self, op: Operation, spec: OpSpec) -> str:
        """`name [literal] operands {attrs}`, the form every registry op prints in."""
        text = op.name
        if spec.literal:
            text += " " + format_attr(op.attrs["value"])
        if op.operands:
            text += " " + ", ".join(self.names[v] for v in op.operands)
        return text + self._attrs(op, spec) if op.attrs else text

    def _attrs(self, op: Operation, spec: OpSpec) -> str:
        """` {k = v, ...}` sorted by name, leaving out defaults, None and a literal's value."""
        shown = {k: v for k, v in op.attrs.items()
                 if not (spec.literal and k == "value") and v != spec.attrs.get(k) and v is not None}
        if not shown:
            return ""
        return " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in sorted(shown.items())) + "}"

def print_module(module: Module, print_locations: bool = False) -> str:
    return Printer(print_locations).module(module)


def print_function(f: Function, print_locations: bool = False) -> str:
    return Printer(print_locations).function(f)
