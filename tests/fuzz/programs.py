"""Random well-typed gir programs in the surface form, for differential testing.

    program = generate(random.Random(7))     # Program(text, entry, args, kind, ...)

Each program is one function (and, for `grad`, a loss function and a function taking its
gradients) over a few parameters: a matrix %x0 (B x H), a vector %v0 (H), a scalar %s0, a
weight %w (H x H) and a sequence %xs (T x B x H). B, H and T are drawn from small sizes, zero
included, and sometimes biggish ones; B and T are sometimes written `?` so gir.jit specialises
them. The body is a random chain of ops over the values in scope, with NumPy broadcasting:
elementwise arithmetic, comparisons and `select`, reductions over chosen axes (empty ones
included), matmul, transpose, and `for` loops that carry values through reassigned names,
collect stacks and nest. Float programs are f32 or f64; integer programs (i32, i64) use the
integer ops, floor division included, with extreme values in the inputs.

Float ops are written so the comparisons mean something: a divisor is kept away from zero
(`a / (abs(b) + 0.5)`), exp takes a bounded argument (`exp(tanh(a))`); the comparison itself
uses gir.testing's tolerances unchanged. `grad` programs use only ops that are differentiable
almost everywhere, so central differences in float64 check them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Shape = tuple[int, ...]
INT_EXTREMES = {"i32": [0, -1, 1, 2**31 - 1, -(2**31), 7, -7], "i64": [0, -1, 1, 2**63 - 1, -(2**63), 7, -7]}


@dataclass
class Program:
    text: str
    entry: str
    args: list[np.ndarray]
    dtype: str
    grad: bool = False
    loss: str = ""
    """The loss function's name, for finite differences (grad programs)."""
    wrt: list[int] = field(default_factory=list)
    """The positions of the loss's arguments that `grad` differentiates."""
    small: bool = True
    """Small enough for the GPU simulator."""


@dataclass
class Val:
    name: str
    shape: Shape


class _Gen:
    def __init__(self, rng: random.Random, dtype: str, smooth: bool):
        self.rng, self.dtype, self.smooth = rng, dtype, smooth
        self.is_float = dtype.startswith("f")
        self.lines: list[str] = []
        self.counter = 0
        self.depth = 0

    def fresh(self, stem: str = "t") -> str:
        self.counter += 1
        return f"%{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " * (self.depth + 1) + line)

    def lit(self, x: float) -> str:
        return repr(float(x)) if self.is_float else str(int(x))

    # -- ops ------------------------------------------------------------------------------
    def pick(self, pool: list[Val], shape: Shape | None = None) -> Val:
        if shape is not None:
            same = [v for v in pool if v.shape == shape]
            if same:
                return self.rng.choice(same)
        return self.rng.choice(pool)

    def unary(self, a: Val) -> str:
        r = self.rng
        if not self.is_float:
            return r.choice([f"-{a.name}", f"abs({a.name})", f"relu({a.name})", f"max({a.name}, 0)",
                             f"({a.name} * 3)", f"({a.name} / 2)", f"({a.name} / -3)", f"({a.name} - 1)"])
        smooth = [f"tanh({a.name})", f"sigmoid({a.name})", f"exp(tanh({a.name}))", f"-{a.name}",
                  f"log({a.name} * {a.name} + 1.0)", f"sqrt({a.name} * {a.name} + 0.25)", f"({a.name} * 0.5)",
                  f"({a.name} / ({a.name} * {a.name} + 1.0))", f"pow({a.name} * {a.name} + 0.5, 1.5)"]
        kinks = [f"relu({a.name})", f"abs({a.name})", f"max({a.name}, 0.1)", f"min({a.name}, -0.1)"]
        return r.choice(smooth + ([] if self.smooth and r.random() < 0.7 else kinks))

    def binary(self, a: Val, b: Val) -> str:
        ops = ["+", "-", "*"]
        if not self.is_float:
            a_, b_ = a.name, b.name
            div = f"({a_} / {b_})" if self.rng.random() < 0.3 else f"({a_} / (abs({b_}) + 1))"
            forms = [f"({a_} {o} {b_})" for o in ops] + [
                div, f"max({a_}, {b_})", f"min({a_}, {b_})", f"select(lt({a_}, {b_}), {a_}, {b_})",
                f"select(eq({a_}, {b_}), {b_}, -{a_})"]
            return self.rng.choice(forms)
        forms = [f"({a.name} {o} {b.name})" for o in ops] + [f"({a.name} / (abs({b.name}) + 0.5))" if not self.smooth
                                                            else f"({a.name} / ({b.name} * {b.name} + 0.5))"]
        if not self.smooth or self.rng.random() < 0.2:
            forms += [f"max({a.name}, {b.name})", f"min({a.name}, {b.name})",
                      f"select(gt({a.name}, {b.name}), {a.name}, {b.name} * 2.0)"]
        return self.rng.choice(forms)

    def reduce(self, a: Val) -> tuple[str, Shape]:
        r = self.rng
        rank = len(a.shape)
        kinds = ["sum", "mean"] if self.is_float else ["sum"]
        if not self.smooth or r.random() < 0.2:
            kinds += ["max", "min"]
        kind = r.choice(kinds)
        if rank == 0 or r.random() < 0.25:
            return f"{kind}({a.name})", ()
        axes = sorted(r.sample(range(rank), r.randint(1, rank)))
        keep = r.random() < 0.4
        shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape)) if keep else \
            tuple(d for i, d in enumerate(a.shape) if i not in axes)
        written = [ax - rank if r.random() < 0.3 else ax for ax in axes]
        return f"{kind}({a.name}, axes={written}, keepdims={'true' if keep else 'false'})", shape

    def step(self, pool: list[Val], h: int, w: Val | None) -> Val:
        """One new value from the pool."""
        r = self.rng
        a = self.pick(pool)
        choice = r.random()
        if choice < 0.3:
            expr, shape = self.unary(a), a.shape
        elif choice < 0.65:
            b = self.pick(pool)
            try:
                shape = tuple(np.broadcast_shapes(a.shape, b.shape))
            except ValueError:
                b = a
                shape = a.shape
            expr = self.binary(a, b)
        elif choice < 0.8:
            expr, shape = self.reduce(a)
        elif choice < 0.9 and w is not None and len(a.shape) == 2 and a.shape[1] == h:
            expr, shape = f"({a.name} @ {w.name})", (a.shape[0], h)
            if self.is_float:
                expr = f"tanh({expr})" if r.random() < 0.5 else expr
        elif choice < 0.95 and len(a.shape) == 2:
            expr, shape = f"transpose({a.name})", (a.shape[1], a.shape[0])
        else:
            c = r.choice(pool)
            if c.shape != a.shape:
                c = a
            cmp = r.choice(["lt", "le", "gt", "ge", "ne"])
            expr, shape = f"select({cmp}({a.name}, {c.name}), {a.name}, {c.name})", a.shape
        name = self.fresh()
        self.emit(f"{name} = {expr}")
        return Val(name, shape)

    def scan(self, pool: list[Val], xs: Val, h: int, w: Val | None, type_of: Callable[[Shape], str]) -> list[Val]:
        """The SSA form: `%c.., %s.. = scan [reverse] (%x in xs) carry (%c = init) { ... yield (..) stack (..) }`."""
        r = self.rng
        elem = Val(self.fresh("x"), xs.shape[1:])
        inits = [self.pick(pool) for _ in range(r.randint(1, 2))]
        args = [Val(self.fresh("a"), v.shape) for v in inits]
        binds = ", ".join(f"{a.name} = {v.name}" for a, v in zip(args, inits))
        head = len(self.lines)
        self.emit("")  # the scan's first line, written once its results are known
        self.depth += 1
        inner = pool + [elem] + args
        for _ in range(r.randint(1, 4)):
            inner.append(self.step(inner, h, w))
        yielded = []
        for a in args:
            v = self.pick(inner, a.shape)
            if v.shape != a.shape:
                v = a
            name = self.fresh("n")
            self.emit(f"{name} = {self.unary(v) if self.is_float and r.random() < 0.6 else v.name}")
            yielded.append(name)
        stacked = [self.pick(inner) for _ in range(r.randint(0, 2))]
        self.emit(f"yield ({', '.join(yielded)}) stack ({', '.join(v.name for v in stacked)})")
        self.depth -= 1
        finals = [Val(self.fresh("f"), a.shape) for a in args]
        stacks = [Val(self.fresh("s"), (xs.shape[0],) + v.shape) for v in stacked]
        types = ", ".join(type_of(v.shape) for v in finals + stacks)
        self.emit(f"}} : {types}")
        results = ", ".join(v.name for v in finals + stacks)
        mods = "reverse " if r.random() < 0.5 else ""
        line = f"{results} = scan {mods}({elem.name} in {xs.name}) carry ({binds}) {{"
        self.lines[head] = "  " * (self.depth + 1) + line
        return finals + stacks

    def loop(self, pool: list[Val], xs: Val, h: int, w: Val | None, nest: int) -> list[Val]:
        """`for %x in xs { ... }` carrying one or two values and collecting one or two; returns
        the carried values (after the loop) and the stacks."""
        r = self.rng
        elem = Val(self.fresh("x"), xs.shape[1:])
        carries = []
        for _ in range(r.randint(0, 2)):
            init = self.pick(pool)
            name = self.fresh("c")
            self.emit(f"{name} = {init.name}")
            carries.append(Val(name, init.shape))
        self.emit(f"for {elem.name} in {xs.name} {{")
        self.depth += 1
        inner = pool + [elem] + carries
        for _ in range(r.randint(1, 4)):
            inner.append(self.step(inner, h, w))
        if nest > 0 and len(elem.shape) >= 1 and r.random() < 0.4:
            inner += self.loop(inner, elem, h, w, nest - 1)
        for c in carries:  # the carry keeps its shape: a value of that shape, broadcast if need be
            v = self.pick(inner, c.shape)
            expr = v.name if v.shape == c.shape else f"({c.name} + {v.name})"
            if v.shape != c.shape and tuple(np.broadcast_shapes(c.shape, v.shape)) != c.shape:
                expr = c.name + (" * 0.5" if self.is_float else " * 2")
            if self.is_float and r.random() < 0.5:
                expr = f"tanh({expr})"
            self.emit(f"{c.name} = {expr}")
        stacks = []
        for _ in range(r.randint(0 if carries else 1, 2)):
            v = self.pick(inner)
            name = self.fresh("ys")
            self.emit(f"collect {v.name} into {name}")
            stacks.append(Val(name, (xs.shape[0],) + v.shape))
        self.depth -= 1
        self.emit("}")
        return carries + stacks


def _dims(rng: random.Random) -> tuple[int, int, int, bool]:
    """B, H, T and whether the program is big (then not run in the GPU simulator)."""
    if rng.random() < 0.08:
        return rng.choice([64, 128, 256]), rng.choice([32, 96, 200]), rng.choice([2, 4]), True
    return rng.choice([0, 1, 1, 2, 3, 4, 5]), rng.choice([1, 2, 3, 4, 7]), rng.choice([0, 1, 2, 3, 5]), False


def _inputs(rng: random.Random, dtype: str, shapes: list[Shape]) -> list[np.ndarray]:
    nprng = np.random.default_rng(rng.randrange(2**32))
    out = []
    for shape in shapes:
        if dtype.startswith("f"):
            out.append(nprng.standard_normal(shape).astype(dtype.replace("f", "float")))
        else:
            a = nprng.integers(-6, 7, shape).astype(dtype.replace("i", "int"))
            if a.size and rng.random() < 0.5:
                flat = a.reshape(-1)
                for _ in range(rng.randint(1, 3)):
                    flat[nprng.integers(0, flat.size)] = rng.choice(INT_EXTREMES[dtype])
            out.append(a)
    return out


def generate(rng: random.Random, want_grad: bool | None = None) -> Program:
    grad = want_grad if want_grad is not None else rng.random() < 0.2
    dtype = "f64" if grad else rng.choice(["f32", "f32", "f64", "f64", "i32", "i64"])
    b, h, t, big = _dims(rng)
    # A `?` dim is written `?` in the result types too: its size must differ from every other
    # dim's, so that a result's dims tell which are B and T.
    unknown_b = rng.random() < 0.25 and b not in (1, h)
    unknown_t = rng.random() < 0.25 and t not in (1, h, b)
    unknown = {d for d, u in ((b, unknown_b), (t, unknown_t)) if u}
    g = _Gen(rng, dtype, smooth=grad)
    shapes = {"x0": (b, h), "v0": (h,), "s0": (), "w": (h, h), "xs": (t, b, h)}
    written = {"x0": ("?" if unknown_b else str(b), str(h)), "v0": (str(h),), "s0": (), "w": (str(h), str(h)),
               "xs": ("?" if unknown_t else str(t), "?" if unknown_b else str(b), str(h))}
    params = [n for n in shapes if rng.random() < 0.8 or n == "x0"]
    pool = [Val("%" + n, shapes[n]) for n in params]
    w = next((v for v in pool if v.name == "%w"), None)
    xs = next((v for v in pool if v.name == "%xs"), None)
    for _ in range(rng.randint(1, 5)):
        pool.append(g.step(pool, h, w))
    def type_of(shape: Shape) -> str:
        return f"tensor<{'x'.join(['?' if d in unknown else str(d) for d in shape] + [dtype])}>"

    if xs is not None and rng.random() < 0.7:
        # No nested loop in a big program: the interpreter would run B x T steps of B x H ops.
        pool += g.loop(pool, xs, h, w, nest=0 if big else 1) if rng.random() < 0.7 else g.scan(pool, xs, h, w, type_of)
        for _ in range(rng.randint(0, 3)):
            pool.append(g.step(pool, h, w))
    sig = ", ".join(f"%{n}: tensor<{'x'.join(written[n] + (dtype,))}>" for n in params)
    args = _inputs(rng, dtype, [shapes[n] for n in params])
    if grad:
        # The loss reads the last few values, so most of the body is live.
        last, rest = pool[-1], pool[len(params):-1][-3:]
        g.emit(f"%loss = sum({last.name} * {last.name})" + "".join(f" + mean({v.name})" for v in rest))
        body = "\n".join(g.lines)
        floats = [i for i, n in enumerate(params)]
        wrt = sorted(rng.sample(floats, rng.randint(1, len(floats))))
        names = ", ".join("%" + p for p in params)
        grads = ", ".join(str(i) for i in wrt)
        rtypes = ", ".join(f"tensor<{'x'.join(written[params[i]] + (dtype,))}>" for i in wrt)
        text = (f"func @loss({sig}) -> tensor<{dtype}> {{\n{body}\n  return %loss\n}}\n\n"
                f"func @grads({sig}) -> (tensor<{dtype}>, {rtypes}) {{\n"
                f"  %l, {', '.join(f'%d{i}' for i in wrt)} = grad @loss({names}) wrt ({grads})\n"
                f"  return %l, {', '.join(f'%d{i}' for i in wrt)}\n}}\n")
        return Program(text, "grads", args, dtype, True, "loss", wrt, small=not big)
    outs = rng.sample(pool[len(params):] or pool, min(len(pool) - len(params) or 1, rng.randint(1, 3)))
    body = "\n".join(g.lines)
    rets = ", ".join(v.name for v in outs)
    rtypes = ", ".join(type_of(v.shape) for v in outs)
    text = f"func @f({sig}) -> ({rtypes}) {{\n{body}\n  return {rets}\n}}\n"
    return Program(text, "f", args, dtype, small=not big)
