"""Checks the IR's invariants; linear in the number of ops.

- dominance with region scoping: an operand is a block argument or an earlier result of its
  own block or of an enclosing block (a loop body may read any value defined before the loop);
- types: every op's result types are what its spec's rule infers from its operands now;
- terminators: a function body ends in `return` (with the signature's types), a loop body in
  `yield`, and neither appears anywhere else;
- calls name functions of the module with matching types; variables are used only where a
  spec's `variable_operands` allows (`load`, `store`);
- the call graph (`call` and `grad`, the ops whose spec is `interprocedural`) has no cycle: gir
  has no control flow that could end a recursion, so `@f` calling itself, directly or through
  other functions, is an error at the call that closes the cycle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..errors import GirTypeError, GirVerifyError
from .core import Block, Function, Module, Operation, Value
from .ops import REGISTRY, OpSpec, ShapeError, check_arity, infer_types, stamp_holds, type_stamp, verifier_declared
from .types import Type, VarType


def _name(v: Value) -> str:
    return "%" + (v.name_hint or "?")


def _takes_variable(spec: OpSpec, i: int) -> bool:
    """Operand i of an op of kind `spec` may be a variable (`OpSpec.variable_operands`)."""
    return i < len(spec.operands) and spec.operands[i] in spec.variable_operands


class Verifier:
    def __init__(self, module: Module):
        self.module = module
        self.calls: dict[str, list[Operation]] = {}
        """Function name -> its call and grad ops, recorded by the op walk for the cycle check."""
        self.current = ""
        """The function being walked."""

    def run(self) -> None:
        for f in self.module.functions.values():
            self.calls[f.name] = []
            self.current = f.name
            self.function(f)
        self.call_graph()

    def call_graph(self) -> None:
        """Raises at the first call that closes a cycle (depth-first, functions in module order).

        Iterative, so a long chain of calls does not hit Python's recursion limit."""
        done: set[str] = set()
        for root in self.module.functions.values():
            if root.name in done:
                continue
            path: list[str] = [root.name]
            pending: list[Iterator[Operation]] = [iter(self.calls[root.name])]
            while pending:
                op = next(pending[-1], None)
                if op is None:
                    done.add(path.pop())
                    pending.pop()
                    continue
                callee = op.attrs["callee"]
                if callee in done:
                    continue
                if callee in path:
                    raise call_cycle_error(path[path.index(callee):], op)
                path.append(callee)
                pending.append(iter(self.calls[callee]))

    def function(self, f: Function) -> None:
        body = f.body
        term = body.terminator
        if term is None or term.name != "return":
            raise GirVerifyError(f"@{f.name} must end with 'return'", term.loc if term else f.loc)
        got = [v.type for v in term.operands]
        if got != f.result_types:
            raise GirVerifyError(f"@{f.name} returns " + ", ".join(map(str, got)) + " but its signature says "
                                 + ", ".join(map(str, f.result_types)), term.loc)
        visible: set[Value] = set()
        self.block(body, visible, "return")

    def block(self, block: Block, visible: set[Value], terminator: str) -> None:
        defined: list[Value] = list(block.args)
        visible.update(defined)
        last = block.last
        # Bound methods and the registry's lookup, taken once: this loop runs once per op after
        # the parse and after every pass that changed the IR (~2 us an op at 25k ops).
        spec_of, issuperset, see, keep = REGISTRY.get, visible.issuperset, visible.update, defined.extend
        op = block.first
        while op is not None:
            name = op.name
            spec = spec_of(name)
            if spec is None:
                raise GirVerifyError(f"unknown op '{name}'", op.loc)
            if op is last:
                if name != terminator:
                    raise GirVerifyError(f"this block must end with '{terminator}', not '{name}'", op.loc)
            elif spec.terminator:
                raise GirVerifyError(f"'{name}' must be the last op of its block", op.loc)
            operands = op.operands
            if not issuperset(operands):
                self.dominance(op, visible)
            results = op.results
            types = [v.type for v in operands]
            result_types = [r.type for r in results]
            stamp = op.checked
            regions = op.regions
            # The stamp (ops.type_stamp) is what the last passing check of the op's operand
            # types, region count, arity and result types saw: unchanged, the op passes them
            # again. The comparisons inline ops.stamp_holds but for the attributes.
            if stamp is None or regions or stamp[1] != types or stamp[2] != result_types or stamp[0] != name \
                    or stamp[4] != op.segments or ((stamp[3] or op.attrs)
                                                   and not stamp_holds(stamp, op, types, result_types)):
                self.checks(op, spec, types, result_types)
            if spec.callee_results is not None:  # OpSpec.interprocedural
                self.callee(op)
                self.calls[self.current].append(op)
            if regions:
                for region in regions:
                    self.block(region.block, visible, "yield")
            see(results)
            keep(results)
            op = op.next
        visible.difference_update(defined)

    def dominance(self, op: Operation, visible: set[Value]) -> None:
        """Raises for the first operand of op not visible here."""
        i, v = next((i, v) for i, v in enumerate(op.operands) if v not in visible)
        raise GirVerifyError(f"operand #{i} of '{op.name}' ({_name(v)}) does not dominate this use", op.loc)

    def checks(self, op: Operation, spec: OpSpec, types: list[Type], results: list[Type]) -> None:
        """Variables only where the spec allows them, the region count, the arity, the types."""
        operands = op.operands
        if VarType in map(type, types):  # the exact type: a set of types is checked in C, not per operand
            for i, v in enumerate(operands):
                if isinstance(v.type, VarType) and not _takes_variable(spec, i):
                    raise GirVerifyError(f"variable {_name(v)} may only be read by load and written by store",
                                         op.loc)
        regions = op.regions
        if len(regions) != spec.num_regions:
            raise GirVerifyError(f"'{op.name}' needs {spec.num_regions} region(s), has {len(regions)}", op.loc)
        _arity(op, spec)
        for region in regions:  # the type rule reads the body's yield groups: their sizes first
            term = region.block.terminator
            spec_of_term = REGISTRY.get(term.name) if term is not None else None
            if spec_of_term is not None:
                _arity(term, spec_of_term)  # type: ignore[arg-type]
        self.types(op, spec, types, results)

    def types(self, op: Operation, spec: OpSpec, types: list[Type], results: list[Type]) -> None:
        """The op's result types are what its type rule infers. An op without regions that
        passes is stamped (ops.type_stamp): until its kind, operand or result types, segments
        or attributes change, a later verification (after the next pass) skips the rule."""
        declared = verifier_declared(results)
        try:
            inferred = infer_types(spec, types, op.attrs, declared, op.regions, op.segments)  # type: ignore[arg-type]
        except ShapeError as e:
            raise GirVerifyError(f"'{op.name}': {e}", op.loc) from None
        if inferred != results:
            raise GirVerifyError(f"'{op.name}' results are " + ", ".join(str(r.type) for r in op.results)
                                 + " but its operands give " + ", ".join(map(str, inferred)), op.loc)
        if not op.regions:
            op.checked = type_stamp(op, types, results)

    def callee(self, op: Operation) -> None:
        f = self.module.functions.get(op.attrs["callee"])
        if f is None:
            raise GirVerifyError(f"'{op.name}' of undefined function @{op.attrs['callee']}", op.loc)
        if [v.type for v in op.operands] != f.arg_types:
            raise GirVerifyError(f"@{f.name} is passed arguments of the wrong types", op.loc)
        wrt = op.attrs.get("wrt", [])
        if any(not isinstance(p, int) or not 0 <= p < len(f.args) for p in wrt):
            raise GirVerifyError(f"grad wrt positions {wrt} are out of range", op.loc)
        assert op.spec.callee_results is not None
        want = op.spec.callee_results(op, f.arg_types, f.result_types)
        if [r.type for r in op.results] != want:
            raise GirVerifyError(f"'{op.name}' of @{f.name} has the wrong result types", op.loc)


def _arity(op: Operation, spec: OpSpec) -> None:
    """ops.check_arity (operand count and group sizes) as a verifier error, so the pass manager
    names the pass that broke it."""
    try:
        check_arity(spec, len(op.operands), op.segments, op.loc)
    except GirTypeError as e:
        raise GirVerifyError(e.message, e.loc) from None


def call_cycle_error(cycle: Sequence[str], op: Operation) -> GirVerifyError:
    """The error for `op`, the call of `cycle[0]` made in `cycle[-1]`, where each function of
    `cycle` calls the next."""
    through = "" if len(cycle) == 1 else " through " + ", ".join(f"@{name}" for name in cycle[1:])
    return GirVerifyError(f"@{cycle[0]} calls itself{through}", op.loc,
                          note="gir functions cannot recurse: there is no control flow to end the recursion")


def verify(module: Module) -> None:
    Verifier(module).run()
