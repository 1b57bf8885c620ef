"""Frontend tuples -> IR (see parser.py for the tuple forms).

Names assigned once (anywhere in a function, nested loops included) become SSA values; names
assigned more than once become a `var` at the top of the function with `store` at each
assignment and `load` at each read. A surface `for` loop becomes a `for` region op whose
`yield () stack (...)` carries the collected values. The `ssa` pass turns this into SSA.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lark import Token

from ..errors import GirSyntaxError, GirTypeError, Location
from ..ir.core import Block, Function, Module, Operation, Region, Value
from ..ir.ops import REGISTRY, declared_matches, make_op
from ..ir.printer import format_attr
from ..ir.types import FLOAT_DTYPES, TensorType, VarType


def emit_module(funcs: list[tuple], filename: str) -> Module:
    module = Module(filename=filename)
    signatures: dict[str, Function] = {}
    for f in funcs:
        _, name_tok, params, results, _body, loc = f
        name = str(name_tok)[1:]
        floc = loc or Location(filename, name_tok.line, name_tok.column)
        if name in signatures:
            raise GirTypeError(f"function @{name} is defined twice", floc)
        seen: set[str] = set()
        for p in params:
            if str(p[0]) in seen:
                raise GirTypeError(f"parameter {p[0]} is declared twice", _tok_loc(filename, p[0]))
            seen.add(str(p[0]))
        signatures[name] = Function(name, [p[1] for p in params], results or [],
                                    [str(p[0])[1:] for p in params], floc)
    for f in funcs:
        function = signatures[str(f[1])[1:]]
        _FunctionEmitter(function, signatures, filename).emit(f)
        module.add(function)
    return module


def _tok_loc(filename: str, tok: Token) -> Location:
    return Location(filename, tok.line or 0, tok.column or 0)


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

    # -- helpers ----------------------------------------------------------------------------
    def loc(self, tok: Token | None) -> Location:
        if self.loc_override is not None:
            return self.loc_override
        if tok is None:
            return self.function.loc
        return _tok_loc(self.filename, tok)

    @contextmanager
    def located(self, loc: Location | None) -> Iterator[None]:
        """Ops emitted inside take `loc` (a written `loc(...)`) instead of their token's position."""
        saved, self.loc_override = self.loc_override, loc
        try:
            yield
        finally:
            self.loc_override = saved

    def op(self, name: str, operands: list[Value], tok: Token | None, **kw: Any) -> Operation:
        op = make_op(name, operands, loc=self.loc(tok), **kw)
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
        raise GirTypeError(f"use of undefined value {name}", self.loc(tok))

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
    def emit(self, f: tuple) -> None:
        _, _name, params, _results, body, _loc = f
        counts: Counter[str] = Counter(str(p[0]) for p in params)
        _count_assignments(body, counts)
        self.var_names = {n for n, c in counts.items() if c > 1}
        for p, arg in zip(params, self.function.args):
            self.define(p[0], arg)
        self.statements(body)

    def statements(self, stmts: list[tuple]) -> None:
        for s in stmts:
            try:
                getattr(self, "stmt_" + s[0])(s)
            except RecursionError:
                # Emission recurses once per level of nesting (`tanh(tanh(...))`); Python's stack
                # gives out at a few hundred levels.
                raise GirSyntaxError("expression nested too deeply", self.loc(_statement_token(s))) from None

    def stmt_assign(self, s: tuple) -> None:
        _, targets, rhs, loc = s
        with self.located(loc):
            values = self.rhs(rhs, len(targets))
        if len(values) != len(targets):
            raise GirTypeError(f"{len(targets)} name(s) on the left but {len(values)} value(s) on the right",
                               self.loc(targets[0]))
        for tok, value in zip(targets, values):
            self.define(tok, value)

    def stmt_op(self, s: tuple) -> None:
        _, rhs, loc = s
        with self.located(loc):
            values = self.rhs(rhs, 0)
        if values:
            raise GirTypeError(f"the results of '{rhs[1]}' are not assigned to names", self.loc(rhs[1]))

    def stmt_return(self, s: tuple) -> None:
        _, tok, exprs, loc = s
        with self.located(loc):
            values = [self.expr(e) for e in exprs]
            types = [v.type for v in values]
            if types != self.function.result_types and declared_matches(types, self.function.result_types):
                self.function.result_types = types  # a `?` result made precise (a specialised signature)
            if types != self.function.result_types:
                want = ", ".join(map(str, self.function.result_types)) or "nothing"
                got = ", ".join(map(str, types)) or "nothing"
                raise GirTypeError(f"@{self.function.name} returns {want} but this returns {got}", self.loc(tok))
            self.op("return", values, tok)

    def stmt_yield(self, s: tuple) -> None:
        raise GirTypeError("'yield' may only end a scan or for body", self.loc(s[1]))

    def stmt_collect(self, s: tuple) -> None:
        _, tok, expr, into = s
        if not self.loops:
            raise GirTypeError("'collect' outside a for loop", self.loc(tok))
        frame = self.loops[-1]
        if str(into) in frame.collected:
            raise GirTypeError(f"{into} is collected twice in one loop", self.loc(tok))
        frame.collected[str(into)] = (into, self.expr(expr))

    def stmt_for(self, s: tuple) -> None:
        _, tok, binds, body = s
        seqs = [self.lookup(seq) for _, seq in binds]
        for (_, seq_tok), seq in zip(binds, seqs):
            t = seq.type
            if not isinstance(t, TensorType) or t.rank == 0:
                raise GirTypeError(f"cannot loop over {seq_tok} of type {t}: it needs a leading axis",
                                   self.loc(seq_tok))
        frame = _LoopFrame()
        block = Block([s.tensor_type.with_shape(s.tensor_type.shape[1:]) for s in seqs])
        self.enter(block)
        self.loops.append(frame)
        for (elem, _), arg in zip(binds, block.args):
            self.define(elem, arg)
        self.statements(body)
        self.loops.pop()
        stacks = [v for _, v in frame.collected.values()]
        block.append(make_op("yield", stacks, loc=self.loc(tok), segments=(0, len(stacks))))
        self.leave(block)
        op = self.op("for", seqs, tok, regions=[Region(block)])
        for (into, _), result in zip(frame.collected.values(), op.results):
            self.define(into, result)

    def enter(self, block: Block) -> None:
        """Emits into a loop body; names defined there are not visible after `leave`."""
        self.outer_blocks.append(self.block)
        self.block = block
        self.scopes.append({})

    def leave(self, block: Block) -> None:
        self.scopes.pop()
        self.block = self.outer_blocks.pop()

    # -- right-hand sides -------------------------------------------------------------------
    def rhs(self, rhs: tuple, n_targets: int) -> list[Value]:
        kind = rhs[0]
        if kind == "generic":
            return self.generic(rhs)
        if kind == "call":
            _, tok, fname, values, types = rhs
            return self.call(tok, fname, [self.lookup(v) for v in values], types)
        if kind == "grad":
            return self.grad(rhs)
        if kind == "loop":
            return self.loop(rhs)
        if kind == "fused":
            return self.fused(rhs)
        if kind == "fcall" and n_targets != 1:
            return self.call(rhs[1], rhs[1], [self.expr(e) for e in rhs[2]], None)
        return [self.expr(rhs)]

    def generic(self, rhs: tuple) -> list[Value]:
        _, name_tok, operands, literal, attrs, types = rhs
        name = str(name_tok)
        spec = REGISTRY.get(name)
        if spec is None:
            raise GirTypeError(f"unknown op '{name}'", self.loc(name_tok))
        if spec.category == "structural" and name not in ("var", "load", "store"):
            raise GirTypeError(f"'{name}' has its own syntax; see docs/language.md", self.loc(name_tok))
        if literal is not None:
            if not spec.literal:
                raise GirTypeError(f"'{name}' takes no literal", self.loc(name_tok))
            attrs = {**attrs, "value": literal}
        values = [self.lookup(v) for v in operands]
        kw: dict[str, Any] = {"attrs": attrs, "declared": types}
        return self.op(name, values, name_tok, **kw).results

    def call(self, tok: Token, fname: Token, args: list[Value], types: list[TensorType] | None) -> list[Value]:
        callee = self.signatures.get(str(fname)[1:])
        if callee is None:
            raise GirTypeError(f"call of undefined function {fname}", self.loc(fname))
        got = [a.type for a in args]
        if got != callee.arg_types:
            raise GirTypeError(f"{fname} takes (" + ", ".join(map(str, callee.arg_types)) + ") but is called with ("
                               + ", ".join(map(str, got)) + ")", self.loc(fname))
        if types is not None and types != callee.result_types:
            raise GirTypeError(f"{fname} returns " + ", ".join(map(str, callee.result_types))
                               + " but the written type is " + ", ".join(map(str, types)), self.loc(fname))
        return self.op("call", args, tok, attrs={"callee": str(fname)[1:]}, declared=callee.result_types).results

    def grad(self, rhs: tuple) -> list[Value]:
        _, tok, fname, exprs, wrt_items, types = rhs
        callee = self.signatures.get(str(fname)[1:])
        if callee is None:
            raise GirTypeError(f"grad of undefined function {fname}", self.loc(fname))
        args = [self.expr(e) for e in exprs]
        if [a.type for a in args] != callee.arg_types:
            raise GirTypeError(f"{fname} takes (" + ", ".join(map(str, callee.arg_types)) + ") but grad passes ("
                               + ", ".join(str(a.type) for a in args) + ")", self.loc(fname))
        rt = callee.result_types
        if len(rt) != 1 or rt[0].shape != () or rt[0].dtype not in FLOAT_DTYPES:
            raise GirTypeError(f"grad needs {fname} to return one float scalar, it returns "
                               + (", ".join(map(str, rt)) or "nothing"), self.loc(fname))
        positions = [self.wrt_position(item, exprs, args) for item in wrt_items]
        declared = [rt[0]] + [callee.arg_types[p] for p in positions]
        if types is not None and types != declared:
            raise GirTypeError("grad produces " + ", ".join(map(str, declared)) + " but the written type is "
                               + ", ".join(map(str, types)), self.loc(tok))
        return self.op("grad", args, tok, attrs={"callee": str(fname)[1:], "wrt": positions},
                       declared=declared).results

    def wrt_position(self, item: Token, exprs: list[tuple], args: list[Value]) -> int:
        if item.type == "INT":
            pos = int(item)
            if not 0 <= pos < len(args):
                raise GirTypeError(f"wrt position {pos} is out of range for {len(args)} argument(s)", self.loc(item))
            return pos
        matches = [i for i, e in enumerate(exprs) if e[0] == "val" and str(e[1]) == str(item)]
        if not matches:
            raise GirTypeError(f"{item} is not one of the arguments passed to grad", self.loc(item))
        if len(matches) > 1:
            raise GirTypeError(f"{item} is passed more than once; name the position instead", self.loc(item))
        return matches[0]

    def loop(self, rhs: tuple) -> list[Value]:
        _, kw, mods, seq_binds, carry_binds, stmts, yield_stmt, types = rhs
        kind = str(kw)
        if kind == "for" and carry_binds:
            raise GirTypeError("a 'for' op has no carries; use 'scan'", self.loc(kw))
        seqs = [self.lookup(seq) for _, seq in seq_binds]
        inits = [self.lookup(init) for _, init in carry_binds]
        for (_, tok), seq in zip(seq_binds, seqs):
            if not isinstance(seq.type, TensorType) or seq.type.rank == 0:
                raise GirTypeError(f"cannot loop over {tok} of type {seq.type}: it needs a leading axis",
                                   self.loc(tok))
        arg_types = [s.tensor_type.with_shape(s.tensor_type.shape[1:]) for s in seqs] + [v.type for v in inits]
        block = Block(arg_types)
        self.enter(block)
        _, ytok, ycarries, ystacks, yloc = yield_stmt
        with self.located(None):
            for (name, _), arg in zip(list(seq_binds) + list(carry_binds), block.args):
                self.define(name, arg)
            self.statements(stmts)
            with self.located(yloc):
                carries = [self.lookup(v) for v in ycarries]
                stacks = [self.lookup(v) for v in ystacks]
                block.append(make_op("yield", carries + stacks, loc=self.loc(ytok),
                                     segments=(len(carries), len(stacks))))
        self.leave(block)
        segments = (len(seqs), len(inits)) if kind == "scan" else ()
        attrs = {"reverse": bool(mods.get("reverse", False)), "length": mods.get("length")}
        return self.op(kind, seqs + inits, kw, attrs=attrs, regions=[Region(block)], declared=types,
                       segments=segments).results

    def fused(self, rhs: tuple) -> list[Value]:
        _, kw, binds, stmts, yield_stmt, types = rhs
        inputs = [self.lookup(v) for _, v in binds]
        block = Block([v.type for v in inputs])
        self.enter(block)
        _, ytok, youts, ystacks, yloc = yield_stmt
        with self.located(None):
            for (name, _), arg in zip(binds, block.args):
                self.define(name, arg)
            self.statements(stmts)
            with self.located(yloc):
                outs = [self.lookup(v) for v in youts] + [self.lookup(v) for v in ystacks]
                block.append(make_op("yield", outs, loc=self.loc(ytok), segments=(len(youts), len(ystacks))))
        self.leave(block)
        return self.op("fused", inputs, kw, regions=[Region(block)], declared=types).results

    # -- surface expressions ----------------------------------------------------------------
    def expr(self, e: tuple, dtype: str | None = None) -> Value:
        kind = e[0]
        if kind == "val":
            return self.lookup(e[1])
        if kind == "num":
            return self.literal(e[1], e[2], dtype)
        if kind == "bin":
            return self.binary_chain(e)
        if kind == "neg":
            if e[2][0] == "num":
                return self.literal(-e[2][1], e[1], dtype)
            return self.op("neg", [self.expr(e[2], dtype)], e[1]).result
        if kind == "builtin":
            return self.builtin(e)
        if kind == "fcall":
            results = self.call(e[1], e[1], [self.expr(a) for a in e[2]], None)
            if len(results) != 1:
                raise GirTypeError(f"{e[1]} returns {len(results)} values; assign them to as many names",
                                   self.loc(e[1]))
            return results[0]
        if kind in ("generic", "call", "grad", "loop"):
            tok = e[1]
            raise GirTypeError("an op in generic form cannot be nested in an expression", self.loc(tok))
        raise AssertionError(kind)

    def binary_chain(self, e: tuple) -> Value:
        """Emits `a + b - c * d ...` without recursing down the left operands: a parsed sum of
        n terms is a left-deep tree n levels deep, too deep for Python's stack at n ~ 300."""
        chain = []
        while e[0] == "bin":
            chain.append(e)
            e = e[2]
        lhs: Value | tuple = e
        for _, op_tok, _, rhs in reversed(chain):
            operands = self.operands_of([lhs, rhs])
            lhs = self.op(_INFIX[str(op_tok)], operands, op_tok).result
        assert isinstance(lhs, Value)
        return lhs

    def operands_of(self, exprs: list[tuple | Value], skip: int = 0, integer: frozenset[int] = frozenset()
                    ) -> list[Value]:
        """Emits expressions (an entry may be a Value emitted already); number literals take the
        dtype of the first non-literal operand after the first `skip` (select's i1 condition says
        nothing about its values), else f32/i32. A literal at a position in `integer` (an
        operand that only takes integers, like index's) is i64 and lends no dtype to the others."""
        values: list[Value | None] = [e if isinstance(e, Value) else None if _is_literal(e) else self.expr(e)
                                      for e in exprs]
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
        return self.op("constant", [], tok, attrs={"value": value}, declared=[TensorType((), dtype)]).result

    def builtin(self, e: tuple) -> Value:
        _, name_tok, args, kwargs = e
        name = str(name_tok)
        if name in ("max", "min") and len(args) == 1:
            name = "reduce_" + name
        spec = REGISTRY.get(name)
        if spec is None or spec.category == "structural":
            raise GirTypeError(f"unknown function '{name}'", self.loc(name_tok))
        kwargs = dict(kwargs)
        integer = frozenset(spec.operands.index(o) for o in spec.integer_operands)
        values = self.operands_of(args, skip=1 if name == "select" else 0, integer=integer)
        declared = None
        if name in ("cast", "zeros", "ones", "fill", "constant"):
            declared = [self.declared_type(name_tok, name, kwargs, values)]
        return self.op(name, values, name_tok, attrs=kwargs, declared=declared).result

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
        raise GirTypeError(f"unknown dtype {dtype!r}; use one of " + ", ".join(_DTYPE_NAMES), self.loc(tok))


_DTYPE_NAMES = ("f32", "f64", "i32", "i64", "i1")


def _is_literal(e: tuple) -> bool:
    """A number written in place, `1.5` or `-2`: it takes its dtype from the other operands."""
    return e[0] == "num" or (e[0] == "neg" and e[2][0] == "num")


def _statement_token(s: tuple) -> Token | None:
    """The token a statement's errors point at: its first target, keyword or op name."""
    kind = s[0]
    if kind == "assign":
        return s[1][0]
    if kind == "op":
        return s[1][1]
    return s[1] if isinstance(s[1], Token) else None


_INFIX = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul"}


def _count_assignments(stmts: list[tuple], counts: Counter[str]) -> None:
    for s in stmts:
        kind = s[0]
        if kind == "assign":
            for t in s[1]:
                counts[str(t)] += 1
            rhs = s[2]
            if rhs[0] == "loop":
                _count_loop(rhs, counts)
        elif kind == "op" and s[1][0] == "loop":
            _count_loop(s[1], counts)
        if kind == "assign" and s[2][0] == "fused":
            for name, _ in s[2][2]:
                counts[str(name)] += 1
            _count_assignments(s[2][3], counts)
        elif kind == "for":
            for elem, _ in s[2]:
                counts[str(elem)] += 1
            _count_assignments(s[3], counts)
        elif kind == "collect":
            counts[str(s[3])] += 1


def _count_loop(rhs: tuple, counts: Counter[str]) -> None:
    for name, _ in list(rhs[3]) + list(rhs[4]):
        counts[str(name)] += 1
    _count_assignments(rhs[5], counts)
