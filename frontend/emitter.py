"""Frontend AST -> IR (the nodes of `ast.py`, built by parser.py).

Names assigned once (anywhere in a function, nested loops included) become SSA values; names
assigned more than once become a `var` at the top of the function with `store` at each
assignment and `load` at each read. A surface `for` loop becomes a `for` region op whose
`yield () stack (...)` carries the collected values. The `ssa` pass turns this into SSA.

Errors point at a node's token (its first target, keyword or op name), in the file this
emitter was given, or at a written `loc(...)`, which overrides the tokens of the ops it covers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import GirSyntaxError, GirTypeError, Location, did_you_mean
from ..ir.core import Block, Function, Module, Operation, Region, Value
from ..ir.ops import ONE_ARGUMENT_ALIASES, REGISTRY, declared_matches, make_op
from ..ir.printer import format_attr
from ..ir.types import FLOAT_DTYPES, TensorType, Type, VarType, type_problem
from . import ast
from .hints import dtype_hint, function_names, functions_note, numpy_name_hint
from .tokens import Token


def emit_module(funcs: list[ast.Func], filename: str) -> Module:
    module = Module(filename=filename)
    signatures: dict[str, Function] = {}
    for f in funcs:
        name = str(f.name)[1:]
        floc = f.loc or Location(filename, f.name.line or 1, f.name.column or 1)
        if name in signatures:
            raise GirTypeError(f"function @{name} is defined twice", floc)
        seen: set[str] = set()
        for t in f.result_types or ():
            _check_type(t, floc)
        for p in f.params:
            _check_type(p.type, _tok_loc(filename, p.name))
            if str(p.name) in seen:
                raise GirTypeError(f"parameter {p.name} is declared twice", _tok_loc(filename, p.name))
            seen.add(str(p.name))
        signatures[name] = Function(name, [p.type for p in f.params], list(f.result_types or ()),
                                    [str(p.name)[1:] for p in f.params], floc)
    for f in funcs:
        function = signatures[str(f.name)[1:]]
        _FunctionEmitter(function, signatures, filename).emit(f)
        module.add(function)
    return module


def _check_type(t: Type, loc: Location) -> None:
    problem = type_problem(t.held if isinstance(t, VarType) else t)
    if problem is not None:
        raise GirTypeError(problem, loc)


def _tok_loc(filename: str, tok: Token) -> Location:
    return Location(filename, tok.line or 0, tok.column or 0)


def _location(filename: str, line: int, col: int, _new: Any = object.__new__, _set: Any = object.__setattr__,
              _cls: type = Location) -> Location:
    """`Location(filename, line, col)`, made once per op: the frozen dataclass's __init__ sets
    its four fields one by one through object.__setattr__ (~1 us); this sets its __dict__ at
    once (the same object: equal, hashed and printed alike; test_incremental_verify checks it)."""
    loc = _new(_cls)
    _set(loc, "__dict__", {"file": filename, "line": line, "col": col, "origin": None})
    return loc


@dataclass
class _LoopFrame:
    collected: dict[str, tuple[Token, Value]] = field(default_factory=dict)


class _FunctionEmitter:
    def __init__(self, function: Function, signatures: dict[str, Function], filename: str):
        self.function = function
        self.signatures = signatures
        self.filename = filename
        self.scopes: list[dict[str, Value]] = [{}]
        self.var_names: set[str] = set()
        self.vars: dict[str, Value] = {}
        self.last_var: Operation | None = None
        self.block = function.body
        self.loops: list[_LoopFrame] = []
        self.outer_blocks: list[Block] = []
        self.loc_override: Location | None = None
        self.left_scope: dict[str, Value] = {}
        """Names local to a loop body that has ended, for the error on a use after it."""
        self.checked_types: set[Any] = set()
        """Result types `_check_type` has passed, as (shape, dtype): a program has few."""

    # -- helpers ----------------------------------------------------------------------------
    def loc(self, tok: Token | None) -> Location:
        if self.loc_override is not None:
            return self.loc_override
        if tok is None:
            return self.function.loc
        return Location(self.filename, tok.line or 0, tok.column or 0)

    @contextmanager
    def located(self, loc: Location | None) -> Iterator[None]:
        """Ops emitted inside take `loc` (a written `loc(...)`) instead of their token's position."""
        saved, self.loc_override = self.loc_override, loc
        try:
            yield
        finally:
            self.loc_override = saved

    def op(self, name: str, operands: list[Value], tok: Token | None, attrs: dict[str, Any] | None = None,
           regions: list[Region] | None = None, declared: Sequence[TensorType] | None = None,
           segments: tuple[int, ...] = (), result_names: list[str] | None = None) -> Operation:
        """Makes an op (make_op's arguments) at tok, or at the written loc(...) around it, and
        appends it to the current block."""
        if self.loc_override is None and tok is not None:  # self.loc(tok), inlined: once per op
            loc = _location(self.filename, tok.line or 0, tok.column or 0)
        else:
            loc = self.loc(tok)
        op = make_op(name, operands, attrs, regions or (), loc, declared, segments, result_names or ())
        checked = self.checked_types
        for r in op.results:
            t = r.type
            key = (t.shape, t.dtype) if type(t) is TensorType else t  # hashed in C, not by the dataclass
            if key not in checked:
                _check_type(t, op.loc)
                checked.add(key)
        self.block.append(op)
        return op

    def lookup(self, tok: Token) -> Value:
        name = str(tok)
        if name in self.var_names:
            var = self.vars.get(name)
            if var is None:
                raise GirTypeError(f"{name} is used before it is assigned", self.loc(tok))
            return self.op("load", [var], tok, result_names=[name[1:]]).result
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.undefined(tok)

    def visible(self, name: str) -> bool:
        return name in self.vars or any(name in scope for scope in self.scopes)

    def undefined(self, tok: Token) -> GirSyntaxError | GirTypeError:
        """The error for a name with no value here, with what the user probably meant."""
        name = str(tok)
        base, dot, attr = name.rpartition(".")
        if dot and attr[:1].isalpha() and self.visible(base):  # `%w.T`: NumPy's attributes
            loc = Location(self.filename, tok.line or 0, (tok.column or 0) + len(base))
            if attr == "T":
                return GirSyntaxError(f"gir has no '.T'; write transpose({base}) (it reverses the axes, as .T does)",
                                      self.loc_override or loc)
            return GirSyntaxError(f"gir values have no attributes ('.{attr}'); a value's shape is in its type",
                                  self.loc_override or loc)
        names = set(self.vars).union(*self.scopes)
        note = None
        gone = self.left_scope.get(name)
        if gone is not None and gone.defining_op is not None:
            note = (f"{name} is defined in a loop body at line {gone.defining_op.loc.line}, and a name assigned "
                    "once in a loop body is local to it: collect it, or assign it before the loop as well")
        return GirTypeError(f"use of undefined value {name}" + did_you_mean(name, names), self.loc(tok), note=note)

    def define(self, tok: Token, value: Value) -> None:
        name = str(tok)
        if name not in self.var_names:
            if value.name_hint is None or value.name_hint.isdigit():
                value.name_hint = name[1:]
            self.scopes[-1][name] = value
            return
        if isinstance(value.type, VarType):
            raise GirTypeError(f"{name} names a variable made by 'var' and is assigned again; write to it with "
                               f"'store {name}, %value' instead", self.loc(tok))
        var = self.vars.get(name)
        if var is None:
            var_op = make_op("var", [], loc=self.loc(tok), declared=[value.tensor_type], result_names=[name[1:]])
            if self.last_var is None:
                self.function.body.prepend(var_op)
            else:
                self.function.body.insert_after(self.last_var, var_op)
            self.last_var = var_op
            var = self.vars[name] = var_op.result
        held = var.type.held if isinstance(var.type, VarType) else var.type
        if value.type != held:
            raise GirTypeError(f"{name} was {held} and is now assigned {value.type}; a reassigned name keeps "
                               "its type", self.loc(tok))
        self.op("store", [var, value], tok)

    # -- functions and statements -----------------------------------------------------------
    def emit(self, f: ast.Func) -> None:
        counts: Counter[str] = Counter(str(p.name) for p in f.params)
        _count_assignments(f.body, counts)
        self.var_names = {n for n, c in counts.items() if c > 1}
        for p, arg in zip(f.params, self.function.args):
            self.define(p.name, arg)
        self.statements(f.body)

    def statements(self, stmts: tuple[ast.Stmt, ...]) -> None:
        for s in stmts:
            try:
                self.statement(s)
            except RecursionError:
                # Emission recurses once per level of nesting (`tanh(tanh(...))`); Python's stack
                # gives out at a few hundred levels.
                raise GirSyntaxError("expression nested too deeply", self.loc(_statement_token(s))) from None

    def statement(self, s: ast.Stmt) -> None:
        match s:
            case ast.Assign():
                self.assign(s)
            case ast.BareOp():
                self.bare_op(s)
            case ast.Return():
                self.return_(s)
            case ast.For():
                self.surface_for(s)
            case ast.Collect():
                self.collect(s)

    def assign(self, s: ast.Assign) -> None:
        if s.loc is None and self.loc_override is None:  # the common case, without a context manager
            values = self.rhs(s.value, len(s.targets))
        else:
            with self.located(s.loc):
                values = self.rhs(s.value, len(s.targets))
        if len(values) != len(s.targets):
            raise GirTypeError(f"{len(s.targets)} name(s) on the left but {len(values)} value(s) on the right",
                               self.loc(s.targets[0]))
        for tok, value in zip(s.targets, values):
            self.define(tok, value)

    def bare_op(self, s: ast.BareOp) -> None:
        with self.located(s.loc):
            values = self.rhs(s.op, 0)
        if values:
            tok = _op_token(s.op)
            raise GirTypeError(f"the results of '{tok}' are not assigned to names", self.loc(tok))

    def return_(self, s: ast.Return) -> None:
        with self.located(s.loc):
            values = [self.expr(e) for e in s.values]
            # a variable returned is `return`'s own error ("is a variable; read it with load")
            types = [v.type.held if isinstance(v.type, VarType) else v.type for v in values]
            if types != self.function.result_types and declared_matches(types, self.function.result_types):
                # a `?` result made precise (a specialised signature); they match: tensors
                self.function.result_types = [t for t in types if isinstance(t, TensorType)]
            if types != self.function.result_types:
                want = ", ".join(map(str, self.function.result_types)) or "nothing"
                got = ", ".join(map(str, types)) or "nothing"
                raise GirTypeError(f"@{self.function.name} returns {want} but this returns {got}",
                                   self.loc(s.keyword))
            self.op("return", values, s.keyword)

    def collect(self, s: ast.Collect) -> None:
        if not self.loops:
            raise GirTypeError("'collect' outside a for loop", self.loc(s.keyword))
        frame = self.loops[-1]
        if str(s.into) in frame.collected:
            raise GirTypeError(f"{s.into} is collected twice in one loop", self.loc(s.keyword))
        frame.collected[str(s.into)] = (s.into, self.expr(s.value))

    def surface_for(self, s: ast.For) -> None:
        seqs = [self.lookup(b.sequence) for b in s.sequences]
        self.check_sequences(s.sequences, seqs)
        frame = _LoopFrame()
        block = Block([seq.tensor_type.with_shape(seq.tensor_type.shape[1:]) for seq in seqs])
        self.enter(block)
        self.loops.append(frame)
        for b, arg in zip(s.sequences, block.args):
            self.define(b.element, arg)
        self.statements(s.body)
        self.loops.pop()
        stacks = [v for _, v in frame.collected.values()]
        block.append(make_op("yield", stacks, loc=self.loc(s.keyword), segments=(0, len(stacks))))
        self.leave(block)
        op = self.op("for", seqs, s.keyword, regions=[Region(block)])
        for (into, _), result in zip(frame.collected.values(), op.results):
            self.define(into, result)

    def check_sequences(self, binds: tuple[ast.SeqBind, ...], seqs: list[Value]) -> None:
        for b, seq in zip(binds, seqs):
            if not isinstance(seq.type, TensorType) or seq.type.rank == 0:
                raise GirTypeError(f"cannot loop over {b.sequence} of type {seq.type}: it needs a leading axis",
                                   self.loc(b.sequence))

    def enter(self, block: Block) -> None:
        """Emits into a loop body; names defined there are not visible after `leave`."""
        self.outer_blocks.append(self.block)
        self.block = block
        self.scopes.append({})

    def leave(self, block: Block) -> None:
        self.left_scope.update(self.scopes.pop())
        self.block = self.outer_blocks.pop()

    # -- right-hand sides -------------------------------------------------------------------
    def rhs(self, rhs: ast.Rhs, n_targets: int) -> Sequence[Value]:
        match rhs:
            case ast.Generic():
                return self.generic(rhs)
            case ast.Call():
                return self.call(rhs.keyword, rhs.callee, [self.lookup(v) for v in rhs.args], rhs.types)
            case ast.Grad():
                return self.grad(rhs)
            case ast.Loop():
                return self.loop(rhs)
            case ast.Fused():
                return self.fused(rhs)
            case ast.FuncCall() if n_targets != 1:
                return self.call(rhs.callee, rhs.callee, [self.expr(e) for e in rhs.args], None)
        return [self.expr(rhs)]

    def generic(self, g: ast.Generic) -> Sequence[Value]:
        name = str(g.name)
        spec = REGISTRY.get(name)
        if spec is None:
            raise GirTypeError(f"unknown op '{name}'" + did_you_mean(name, REGISTRY), self.loc(g.name))
        if spec.own_syntax:
            raise GirTypeError(f"'{name}' has its own syntax; see docs/language.md", self.loc(g.name))
        attrs = g.attrs
        if g.literal is not None:
            if not spec.literal:
                raise GirTypeError(f"'{name}' takes no literal", self.loc(g.name))
            attrs = {**attrs, "value": g.literal}
        values = [self.lookup(v) for v in g.operands]
        return self.op(name, values, g.name, attrs=attrs, declared=g.types).results

    def call(self, tok: Token, fname: Token, args: list[Value], types: ast.Types | None) -> Sequence[Value]:
        callee = self.signatures.get(str(fname)[1:])
        if callee is None:
            raise GirTypeError(f"call of undefined function {fname}" + self.callee_hint(fname), self.loc(fname))
        self.check_arguments(fname, callee, args, "is called with")
        if types is not None and list(types) != callee.result_types:
            raise GirTypeError(f"{fname} returns " + ", ".join(map(str, callee.result_types))
                               + " but the written type is " + ", ".join(map(str, types)), self.loc(fname))
        return self.op("call", args, tok, attrs={"callee": str(fname)[1:]}, declared=callee.result_types).results

    def check_arguments(self, fname: Token, callee: Any, args: list[Value], passes: str) -> None:
        """The arguments of a call or grad have the callee's parameter types. A pre-SSA
        variable prints as the type it holds, so it is named as what it is rather than shown
        as `tensor<3xf32>` where `tensor<3xf32>` is expected."""
        for i, a in enumerate(args):
            if isinstance(a.type, VarType):
                name = f"%{a.name_hint}" if a.name_hint else "the variable"
                raise GirTypeError(f"argument {i + 1} of {fname} is a variable; read it with load "
                                   f"(`load {name} : {a.type}`): only load and store may use a variable",
                                   self.loc(fname))
        if [a.type for a in args] != callee.arg_types:
            raise GirTypeError(f"{fname} takes (" + ", ".join(map(str, callee.arg_types)) + f") but {passes} ("
                               + ", ".join(str(a.type) for a in args) + ")", self.loc(fname))

    def grad(self, g: ast.Grad) -> Sequence[Value]:
        fname = g.callee
        callee = self.signatures.get(str(fname)[1:])
        if callee is None:
            raise GirTypeError(f"grad of undefined function {fname}" + self.callee_hint(fname), self.loc(fname))
        args = [self.expr(e) for e in g.args]
        self.check_arguments(fname, callee, args, "grad passes")
        rt = callee.result_types
        if not rt or rt[0].shape != () or rt[0].dtype not in FLOAT_DTYPES:
            # results after the first are auxiliary values, passed through (has_aux)
            raise GirTypeError(f"grad needs {fname} to return a float scalar first, it returns "
                               + (", ".join(map(str, rt)) or "nothing"), self.loc(fname))
        positions = [self.wrt_position(item, g.args, args) for item in g.wrt]
        declared = list(rt) + [callee.arg_types[p] for p in positions]
        if g.types is not None and list(g.types) != declared:
            raise GirTypeError("grad produces " + ", ".join(map(str, declared)) + " but the written type is "
                               + ", ".join(map(str, g.types)), self.loc(g.keyword))
        return self.op("grad", args, g.keyword, attrs={"callee": str(fname)[1:], "wrt": positions},
                       declared=declared).results

    def callee_hint(self, fname: Token) -> str:
        name = str(fname)[1:]
        hint = did_you_mean(name, self.signatures, prefix="@")
        if not hint and name in function_names():
            hint = f"; '{name}' is a builtin: write {name}(...) without '@'"
        return hint

    def wrt_position(self, item: Token, exprs: tuple[ast.Expr, ...], args: list[Value]) -> int:
        if item.type == "INT":
            pos = int(item)
            if not 0 <= pos < len(args):
                raise GirTypeError(f"wrt position {pos} is out of range for {len(args)} argument(s)", self.loc(item))
            return pos
        matches = [i for i, e in enumerate(exprs) if isinstance(e, ast.Name) and str(e.token) == str(item)]
        if not matches:
            raise GirTypeError(f"{item} is not one of the arguments passed to grad", self.loc(item))
        if len(matches) > 1:
            raise GirTypeError(f"{item} is passed more than once; name the position instead", self.loc(item))
        return matches[0]

    def loop(self, loop: ast.Loop) -> Sequence[Value]:
        kind = str(loop.keyword)
        if kind == "for" and loop.carries:
            raise GirTypeError("a 'for' op has no carries; use 'scan'", self.loc(loop.keyword))
        seqs = [self.lookup(b.sequence) for b in loop.sequences]
        inits = [self.lookup(b.value) for b in loop.carries]
        self.check_sequences(loop.sequences, seqs)
        arg_types = [s.tensor_type.with_shape(s.tensor_type.shape[1:]) for s in seqs] + [v.type for v in inits]
        block = Block(arg_types)
        self.enter(block)
        names = [b.element for b in loop.sequences] + [b.name for b in loop.carries]
        self.region_body(block, names, loop.body, loop.yield_)
        self.leave(block)
        segments = (len(seqs), len(inits)) if kind == "scan" else ()
        attrs = {"reverse": loop.reverse, "length": loop.length}
        return self.op(kind, seqs + inits, loop.keyword, attrs=attrs, regions=[Region(block)], declared=loop.types,
                       segments=segments).results

    def fused(self, fused: ast.Fused) -> Sequence[Value]:
        inputs = [self.lookup(b.value) for b in fused.inputs]
        block = Block([v.type for v in inputs])
        self.enter(block)
        self.region_body(block, [b.name for b in fused.inputs], fused.body, fused.yield_)
        self.leave(block)
        return self.op("fused", inputs, fused.keyword, regions=[Region(block)], declared=fused.types).results

    def region_body(self, block: Block, arg_names: list[Token], body: tuple[ast.Stmt, ...], yield_: ast.Yield
                    ) -> None:
        """Names the block's arguments and emits the body and its yield. A `loc(...)` written on
        the op does not reach inside: the body's ops have their own positions."""
        with self.located(None):
            for name, arg in zip(arg_names, block.args):
                self.define(name, arg)
            self.statements(body)
            with self.located(yield_.loc):
                carries = [self.lookup(v) for v in yield_.carries]
                stacks = [self.lookup(v) for v in yield_.stacks]
                block.append(make_op("yield", carries + stacks, loc=self.loc(yield_.keyword),
                                     segments=(len(carries), len(stacks))))

    # -- surface expressions ----------------------------------------------------------------
    def expr(self, e: ast.Rhs, dtype: str | None = None) -> Value:
        match e:
            case ast.Name():
                return self.lookup(e.token)
            case ast.Num():
                return self.literal(e.value, e.token, dtype)
            case ast.Binary():
                return self.binary_chain(e)
            case ast.Neg(operand=ast.Num() as num):
                return self.literal(-num.value, e.minus, dtype)
            case ast.Neg():
                return self.op("neg", [self.expr(e.operand, dtype)], e.minus).result
            case ast.Builtin():
                return self.builtin(e)
            case ast.FuncCall():
                results = self.call(e.callee, e.callee, [self.expr(a) for a in e.args], None)
                if len(results) != 1:
                    raise GirTypeError(f"{e.callee} returns {len(results)} values; assign them to as many names",
                                       self.loc(e.callee))
                return results[0]
            case ast.Generic() | ast.Call() | ast.Grad() | ast.Loop() | ast.Fused():
                # The grammar keeps op forms out of expressions; `rhs` sends them elsewhere.
                raise GirTypeError("an op in generic form cannot be nested in an expression",
                                   self.loc(_op_token(e)))
        raise AssertionError(e)

    def binary_chain(self, e: ast.Binary) -> Value:
        """Emits `a + b - c * d ...` without recursing down the left operands: a parsed sum of
        n terms is a left-deep tree n levels deep, too deep for Python's stack at n ~ 300."""
        chain = []
        lhs_expr: ast.Expr = e
        while isinstance(lhs_expr, ast.Binary):
            chain.append(lhs_expr)
            lhs_expr = lhs_expr.lhs
        lhs: Value | ast.Expr = lhs_expr
        for b in reversed(chain):
            operands = self.operands_of([lhs, b.rhs])
            lhs = self.op(_INFIX[str(b.op)], operands, b.op).result
        assert isinstance(lhs, Value)
        return lhs

    def operands_of(self, exprs: list[ast.Expr | Value] | tuple[ast.Expr, ...], skip: int = 0,
                    integer: frozenset[int] = frozenset()) -> list[Value]:
        """Emits expressions (an entry may be a Value emitted already); number literals take the
        dtype of the first non-literal operand after the first `skip` (select's i1 condition says
        nothing about its values), else f32/i32. A literal at a position in `integer` (an
        operand that only takes integers, like index's) is i64 and lends no dtype to the others."""
        values: list[Value | None] = [e if isinstance(e, Value) else None if _is_literal(e) else self.expr(e)
                                      for e in exprs]
        if None not in values:  # no literals (the common case): nothing to give a dtype
            return values  # type: ignore[return-value]
        dtypes = [v.tensor_type.dtype for i, v in enumerate(values) if i >= skip and i not in integer
                  and v is not None and isinstance(v.type, TensorType)]
        dtype = dtypes[0] if dtypes else None
        return [v if v is not None else self.expr(e, "i64" if i in integer else dtype)  # type: ignore[arg-type]
                for i, (v, e) in enumerate(zip(values, exprs))]

    def literal(self, value: float | int, tok: Token | None, dtype: str | None) -> Value:
        if dtype is None:
            dtype = "i32" if isinstance(value, int) else "f32"
        if dtype in ("i32", "i64") and isinstance(value, float):
            raise GirTypeError(f"the float literal {value} is used where an integer ({dtype}) is expected",
                               self.loc(tok))
        if dtype == "i1":
            raise GirTypeError("a number literal cannot be an i1 value; use a comparison", self.loc(tok))
        try:
            value = float(value) if dtype in FLOAT_DTYPES else int(value)
        except OverflowError:
            raise GirTypeError(f"the literal is too large for {dtype}", self.loc(tok)) from None
        if tok is not None and isinstance(value, float) and math.isinf(value):
            # Written with digits (`1e400`), not as `inf` (which has no token): past f64's range.
            raise GirTypeError(f"the literal does not fit {dtype} (write inf for an infinity)", self.loc(tok))
        return self.op("constant", [], tok, attrs={"value": value}, declared=[_SCALARS[dtype]]).result

    def builtin(self, e: ast.Builtin) -> Value:
        name = str(e.name)
        if len(e.args) == 1:
            name = ONE_ARGUMENT_ALIASES.get(name, name)
        spec = REGISTRY.get(name)
        if spec is None or spec.category == "structural":
            if name in self.signatures:
                raise GirTypeError(f"unknown function '{name}'; the function @{name} of this module is called as "
                                   f"@{name}(...)", self.loc(e.name))
            hint = (numpy_name_hint(name) or did_you_mean(name, function_names())
                    or did_you_mean(name, self.signatures, prefix="@"))
            raise GirTypeError(f"unknown function '{name}'" + hint, self.loc(e.name), note=functions_note())
        kwargs = dict(e.kwargs)  # declared_type takes dtype= and shape= out
        integer = frozenset(spec.operands.index(o) for o in spec.integer_operands)
        values = self.operands_of(e.args, skip=1 if name == "select" else 0, integer=integer)
        declared = None
        if spec.written_type:
            declared = [self.declared_type(e.name, name, kwargs, values)]
        return self.op(name, values, e.name, attrs=kwargs, declared=declared).result

    def declared_type(self, tok: Token, name: str, kwargs: dict[str, Any], values: list[Value]) -> TensorType:
        """The result type of ops written with a type (`cast`, `zeros`, ...), from dtype= and shape=."""
        dtype = kwargs.pop("dtype", None)
        shape = kwargs.pop("shape", None)
        if name == "cast":
            if dtype is None or len(values) != 1 or not isinstance(values[0].type, TensorType):
                raise GirTypeError("cast takes one tensor and dtype=\"f64\" (or another dtype)", self.loc(tok))
            return values[0].tensor_type.with_dtype(dtype) if dtype in _DTYPE_NAMES else self._bad_dtype(tok, dtype)
        if shape is None or not isinstance(shape, list):
            raise GirTypeError(f"{name} needs shape=[...]", self.loc(tok))
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise GirTypeError(f"{name} needs shape= to be a list of non-negative integers, got "
                               f"{format_attr(shape)}", self.loc(tok))
        dtype = dtype or "f32"
        if dtype not in _DTYPE_NAMES:
            self._bad_dtype(tok, dtype)
        return TensorType(tuple(shape), dtype)

    def _bad_dtype(self, tok: Token, dtype: Any) -> TensorType:
        raise GirTypeError(f"unknown dtype {dtype!r}{dtype_hint(dtype)}; use one of " + ", ".join(_DTYPE_NAMES),
                           self.loc(tok))


_DTYPE_NAMES = ("f32", "f64", "i32", "i64", "i1")
_SCALARS = {dtype: TensorType((), dtype) for dtype in _DTYPE_NAMES}


def _is_literal(e: ast.Expr) -> bool:
    """A number written in place, `1.5` or `-2`: it takes its dtype from the other operands."""
    return isinstance(e, ast.Num) or (isinstance(e, ast.Neg) and isinstance(e.operand, ast.Num))


def _op_token(op: ast.OpForm) -> Token:
    """The token an op form's errors point at: a generic op's name, else its keyword."""
    return op.name if isinstance(op, ast.Generic) else op.keyword


def _statement_token(s: ast.Stmt) -> Token:
    """The token a statement's errors point at: its first target, keyword or op name."""
    match s:
        case ast.Assign():
            return s.targets[0]
        case ast.BareOp():
            return _op_token(s.op)
    return s.keyword


_INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul"}


def _count_assignments(stmts: tuple[ast.Stmt, ...], counts: Counter[str]) -> None:
    """Counts how often each name is assigned, nested bodies included: a name assigned more
    than once becomes a `var`."""
    for s in stmts:
        match s:
            case ast.Assign(targets=targets, value=value):
                counts.update(str(t) for t in targets)
                if isinstance(value, ast.Loop):
                    _count_loop(value, counts)
                elif isinstance(value, ast.Fused):
                    counts.update(str(b.name) for b in value.inputs)
                    _count_assignments(value.body, counts)
            case ast.BareOp(op=ast.Loop() as loop):
                _count_loop(loop, counts)
            case ast.BareOp(op=ast.Fused() as fused):
                counts.update(str(b.name) for b in fused.inputs)
                _count_assignments(fused.body, counts)
            case ast.For(sequences=sequences, body=body):
                counts.update(str(b.element) for b in sequences)
                _count_assignments(body, counts)
            case ast.Collect(into=into):
                counts[str(into)] += 1


def _count_loop(loop: ast.Loop, counts: Counter[str]) -> None:
    counts.update(str(b.element) for b in loop.sequences)
    counts.update(str(b.name) for b in loop.carries)
    _count_assignments(loop.body, counts)
