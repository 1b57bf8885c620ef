"""Random well-typed gir programs in the surface form, for differential testing.

    program = generate(random.Random(7))     # Program(text, entry, args, kind, ...)

Each program is one function (and, for `grad`, a loss function and a function taking its
gradients) over a few parameters: a matrix %x0 (B x H), a vector %v0 (H), a scalar %s0, a
weight %w (H x H) and a sequence %xs (T x B x H). B, H and T are drawn from small sizes, zero
included, and sometimes biggish ones; B and T are sometimes written `?` so gir.jit specialises
them. The body is a random chain of ops over the values in scope, with NumPy broadcasting:
elementwise arithmetic, comparisons and `select`, reductions over chosen axes (empty ones
included), matmul, transpose, and `for` loops that carry values through reassigned names,
collect stacks and nest. Two programs in three also use the registry's layout kinds, casts,
gathers and scatters by an integer parameter `%ids`, `logsumexp` and calls of helper
functions (layout_ops.py); `generate(.., want_error=True)` adds an index out of range.
Float programs are f32 or f64; integer programs (i32, i64) use the integer ops, floor division
included, with extreme values in the inputs.

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
from layout_ops import LayoutSteps

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
    expect_error: tuple[int, int] | None = None
    """(line, column) of an `index`/`scatter_add` whose index is out of range on purpose: every
    backend must raise a GirError located there."""


@dataclass
class Val:
    name: str
    shape: Shape


@dataclass
class Helper:
    name: str
    params: list[Shape]
    results: list[Shape]


class _Gen(LayoutSteps):
    def __init__(self, rng: random.Random, dtype: str, smooth: bool, h: int = 1, grad: bool = False,
                 unknown: set[int] | None = None, layout: float = 0.0):
        self.rng, self.dtype, self.smooth = rng, dtype, smooth
        self.side = random.Random(hash(rng.getstate()[1]))  # the state's ints: hash(None) varies per process
        """For choices added after the first campaigns (scans of a fixed `length`): drawn from a
        stream of their own, rng's draws stay as they were, so most programs of a seed are the
        ones earlier versions wrote (tests/test_fuzz_campaigns.py picks programs by index)."""
        self.is_float = dtype.startswith("f")
        self.lines: list[str] = []
        self.counter = 0
        self.depth = 0
        self.h, self.grad, self.unknown = h, grad, unknown or set()
        self.layout = layout
        """The share of steps that are a layout op, a cast or a call (0: the older programs)."""
        self.ids: Val | None = None
        """An integer parameter with values in [0, H), for gathers and scatters."""
        self.helpers: list[Helper] = []
        self.helper_text: list[str] = []
        self.in_helper = False
        self.extra: list[Val] = []
        self.type_of: Callable[[Shape], str] = lambda shape: ""

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
        kinds = ["sum", "mean"] + (["logsumexp"] if self.layout else []) if self.is_float else ["sum"]
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

    def grow(self, pool: list[Val], h: int, w: Val | None) -> None:
        """Appends one step's values (a call may make two) to pool."""
        pool.append(self.step(pool, h, w))
        pool += self.extra
        self.extra = []

    def step(self, pool: list[Val], h: int, w: Val | None) -> Val:
        """One new value from the pool."""
        r = self.rng
        a = self.pick(pool)
        choice = r.random()
        if self.layout and r.random() < self.layout:
            if not self.in_helper and r.random() < 0.15:
                return self.call(pool, h)
            got = self.layout_step(pool, a)
            if got is not None:
                name = self.fresh()
                self.emit(f"{name} = {got[0]}")
                return Val(name, got[1])
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

    def scan(self, pool: list[Val], xs: Val | None, h: int, w: Val | None,
             type_of: Callable[[Shape], str]) -> list[Val]:
        """The SSA form: `%c.., %s.. = scan [reverse] [length N] (%x in xs) carry (%c = init) {
        ... yield (..) stack (..) }`. Without xs (or in 30% of scans over one) `scan length N ()`
        with no sequence, N from 0, 1, 2, 3, 5 but a `?` size (a stack's leading dim is then N,
        written as a number); over a sequence of a static length, `length T` is written in 20%."""
        r, side = self.rng, self.side
        length = None
        if xs is None or side.random() < 0.3:
            length, xs = side.choice([n for n in (0, 1, 2, 3, 5) if n not in self.unknown]), None
        elif xs.shape[0] not in self.unknown and side.random() < 0.2:
            length = xs.shape[0]
        trips = length if xs is None else xs.shape[0]
        elem = Val(self.fresh("x"), xs.shape[1:]) if xs is not None else None
        inits = [self.pick(pool) for _ in range(r.randint(1, 2))]
        args = [Val(self.fresh("a"), v.shape) for v in inits]
        binds = ", ".join(f"{a.name} = {v.name}" for a, v in zip(args, inits))
        head = len(self.lines)
        self.emit("")  # the scan's first line, written once its results are known
        self.depth += 1
        inner = pool + ([elem] if elem is not None else []) + args
        for _ in range(r.randint(1, 4)):
            self.grow(inner, h, w)
        yielded = []
        for a in args:
            v = self.pick(inner, a.shape)
            if v.shape != a.shape:
                v = a
            name = self.fresh("n")
            expr = self.same_shape(v) if self.layout and r.random() < 0.4 else v.name
            self.emit(f"{name} = {self.unary(Val(expr, v.shape)) if self.is_float and r.random() < 0.6 else expr}")
            yielded.append(name)
        stacked = [self.pick(inner) for _ in range(r.randint(0, 2))]
        self.emit(f"yield ({', '.join(yielded)}) stack ({', '.join(v.name for v in stacked)})")
        self.depth -= 1
        finals = [Val(self.fresh("f"), a.shape) for a in args]
        stacks = [Val(self.fresh("s"), (trips,) + v.shape) for v in stacked]
        types = ", ".join(type_of(v.shape) for v in finals + stacks)
        self.emit(f"}} : {types}")
        results = ", ".join(v.name for v in finals + stacks)
        mods = ("reverse " if r.random() < 0.5 else "") + (f"length {length} " if length is not None else "")
        seqs = f"{elem.name} in {xs.name}" if elem is not None and xs is not None else ""
        line = f"{results} = scan {mods}({seqs}) carry ({binds}) {{"
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
            self.grow(inner, h, w)
        if nest > 0 and len(elem.shape) >= 1 and r.random() < 0.4:
            inner += self.loop(inner, elem, h, w, nest - 1)
        for c in carries:  # the carry keeps its shape: a value of that shape, broadcast if need be
            v = self.pick(inner, c.shape)
            expr = v.name if v.shape == c.shape else f"({c.name} + {v.name})"
            if v.shape != c.shape and tuple(np.broadcast_shapes(c.shape, v.shape)) != c.shape:
                expr = c.name + (" * 0.5" if self.is_float else " * 2")
            if self.layout and r.random() < 0.4:  # the carry made by layout ops
                expr = self.same_shape(Val(f"({expr})", c.shape))
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


    def call(self, pool: list[Val], h: int) -> Val:
        """`%r.. = @hN(..)`: a call of a helper function made for values of the pool's shapes
        (or of an earlier one whose parameter shapes the pool has)."""
        r = self.rng
        fits = [f for f in self.helpers if all(any(v.shape == s for v in pool) for s in f.params)]
        if fits and r.random() < 0.5:
            f = r.choice(fits)
        else:
            f = self.helper([self.pick(pool) for _ in range(r.randint(1, 2))], h)
        args = [self.pick(pool, s) for s in f.params]
        results = [Val(self.fresh("r"), s) for s in f.results]
        self.emit(f"{', '.join(v.name for v in results)} = {f.name}({', '.join(a.name for a in args)})")
        self.extra = results[1:]
        return results[0]

    def helper(self, params: list[Val], h: int) -> Helper:
        """A function of a few random steps over its parameters (no loop, no call, no %ids)."""
        r = self.rng
        saved = self.lines, self.depth, self.ids
        self.lines, self.depth, self.ids, self.in_helper = [], 0, None, True
        inner = [Val(self.fresh("p"), v.shape) for v in params]
        for _ in range(r.randint(1, 3)):
            self.grow(inner, h, None)
        outs = r.sample(inner[len(params):], min(len(inner) - len(params), r.randint(1, 2)))
        body = "\n".join(self.lines)
        self.lines, self.depth, self.ids = saved
        self.in_helper = False
        f = Helper(f"@h{len(self.helpers)}", [v.shape for v in params], [v.shape for v in outs])
        sig = ", ".join(f"{v.name}: {self.type_of(v.shape)}" for v in inner[:len(params)])
        self.helper_text.append(f"func {f.name}({sig}) -> ({', '.join(self.type_of(v.shape) for v in outs)}) {{\n"
                                f"{body}\n  return {', '.join(v.name for v in outs)}\n}}\n\n")
        self.helpers.append(f)
        return f

    def bad_index(self, pool: list[Val], xs: Val | None, t: int) -> tuple[Val, str, str | None, int]:
        """An `index` or `scatter_add` whose index is out of range, at top level or in a loop
        that runs at least one step; returns the value to return, the op's line and the text
        of an integer parameter holding the bad indices (or None) and the indexed leading dim."""
        r = self.rng
        in_loop = xs is not None and t > 0 and r.random() < 0.4
        if in_loop:
            elem = Val(self.fresh("x"), xs.shape[1:])
            self.emit(f"for {elem.name} in {xs.name} {{")
            self.depth += 1
            pool = pool + [elem]
        cands = [v for v in pool if v.shape and v.shape[0] not in self.unknown] or [pool[0]]
        a = r.choice(cands)
        n = a.shape[0] if a.shape else 0
        name, bad_param = self.fresh("bad"), None
        form = r.choice(["scalar", "computed", "gather", "scatter"]) if a.shape else "none"
        if form == "computed":  # a scalar read from an integer tensor (every entry of it is bad)
            expr, shape = f"index({a.name}, index(%bad_ids, {r.randrange(3)}))", a.shape[1:]
            bad_param = "%bad_ids: tensor<3xi64>"
            n = -n - 1 if r.random() < 0.5 else n  # _bad_ids(.., every=True) reads the sign
        elif form == "scalar":
            expr, shape = f"index({a.name}, {r.choice([n, n + 3, -1, -(n + 1), 2**31])})", a.shape[1:]
        elif form == "gather":
            expr, shape, bad_param = f"index({a.name}, %bad_ids)", (3,) + a.shape[1:], "%bad_ids: tensor<3xi64>"
        elif form == "scatter":
            zeros = f"zeros(shape={list((3,) + a.shape[1:])}, dtype=\"{self.dtype}\")"
            expr, shape, bad_param = f"scatter_add({a.name}, %bad_ids, {zeros})", a.shape, "%bad_ids: tensor<3xi64>"
        else:  # a scalar: index a one-element stack of it
            expr, shape = f"index(stack({a.name}), {r.choice([1, -2])})", ()
        self.emit(f"{name} = {expr}")
        line = self.lines[-1]
        out = Val(name, shape)
        if in_loop:
            out = Val(self.fresh("ys"), (xs.shape[0],) + shape)
            self.emit(f"collect {name} into {out.name}")
            self.depth -= 1
            self.emit("}")
        return out, line, bad_param, n


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


def _ids(rng: random.Random, g: _Gen, h: int, unknown: set[int]) -> tuple[str, np.ndarray] | None:
    """The `%ids` parameter (gathers and scatters): an i32 or i64 vector or matrix of rows in
    [0, H), repeats included; its dims avoid the `?` sizes."""
    if not g.layout or rng.random() < 0.3:
        return None
    ks = [k for k in (0, 1, 2, 3, 5) if k not in unknown] or [h]
    shape = (rng.choice(ks),) if rng.random() < 0.7 else (2, rng.choice(ks))
    if 2 in unknown and len(shape) == 2:
        shape = shape[1:]
    dtype = rng.choice(["i32", "i64"])
    g.ids = Val("%ids", shape)
    nprng = np.random.default_rng(rng.randrange(2**32))
    return f"%ids: tensor<{'x'.join([str(d) for d in shape] + [dtype])}>", \
        nprng.integers(0, h, shape).astype(dtype.replace("i", "int"))


def _bad_ids(rng: random.Random, n: int, every: bool) -> np.ndarray:
    """Three rows of a leading dim n, one out of range (every one: n < 0 says -n - 1 and
    below, else n and above)."""
    if every:
        return np.array([n - rng.randrange(3) if n < 0 else n + rng.randrange(3) for _ in range(3)], dtype=np.int64)
    ids = np.array([rng.randrange(n) if n else n for _ in range(3)], dtype=np.int64)
    ids[rng.randrange(3)] = rng.choice([n, n + 7, -1, -(n + 1)])
    return ids


def generate(rng: random.Random, want_grad: bool | None = None, want_error: bool = False) -> Program:
    """One program; `want_error`: a (non-grad) program with an index out of range on purpose."""
    grad = want_grad if want_grad is not None else rng.random() < 0.2
    grad = grad and not want_error
    dtype = "f64" if grad else rng.choice(["f32", "f32", "f64", "f64", "i32", "i64"])
    b, h, t, big = _dims(rng)
    # A `?` dim is written `?` in the result types too: its size must differ from every other
    # dim's, so that a result's dims tell which are B and T.
    unknown_b = rng.random() < 0.25 and b not in (1, h, t)
    unknown_t = rng.random() < 0.25 and t not in (1, h, b)
    unknown = {d for d, u in ((b, unknown_b), (t, unknown_t)) if u}
    # Two programs in three use layout ops, casts, gathers, scatters, logsumexp and calls.
    layout = rng.choice([0.0, 0.25, 0.5])
    g = _Gen(rng, dtype, smooth=grad, h=h, grad=grad, unknown=unknown, layout=layout)
    shapes = {"x0": (b, h), "v0": (h,), "s0": (), "w": (h, h), "xs": (t, b, h)}
    written = {"x0": ("?" if unknown_b else str(b), str(h)), "v0": (str(h),), "s0": (), "w": (str(h), str(h)),
               "xs": ("?" if unknown_t else str(t), "?" if unknown_b else str(b), str(h))}
    params = [n for n in shapes if rng.random() < 0.8 or n == "x0"]
    pool = [Val("%" + n, shapes[n]) for n in params]
    w = next((v for v in pool if v.name == "%w"), None)
    xs = next((v for v in pool if v.name == "%xs"), None)
    ids = _ids(rng, g, h, unknown)

    def type_of(shape: Shape) -> str:
        return f"tensor<{'x'.join(['?' if d in unknown else str(d) for d in shape] + [dtype])}>"

    g.type_of = type_of
    for _ in range(rng.randint(1, 5)):
        g.grow(pool, h, w)
    if xs is not None and rng.random() < 0.7:
        # No nested loop in a big program: the interpreter would run B x T steps of B x H ops.
        pool += g.loop(pool, xs, h, w, nest=0 if big else 1) if rng.random() < 0.7 else g.scan(pool, xs, h, w, type_of)
        for _ in range(rng.randint(0, 3)):
            g.grow(pool, h, w)
    elif g.side.random() < 0.25:  # a loop of a fixed length over no sequence
        pool += g.scan(pool, None, h, w, type_of)
    sig = ", ".join(f"%{n}: tensor<{'x'.join(written[n] + (dtype,))}>" for n in params)
    args = _inputs(rng, dtype, [shapes[n] for n in params])
    if ids is not None:
        sig += ", " + ids[0]
        args.append(ids[1])
    if grad:
        return _grad_program(rng, g, pool, params, written, sig, args, big)
    outs = rng.sample(pool[len(params):] or pool, min(len(pool) - len(params) or 1, rng.randint(1, 3)))
    bad = None
    if want_error:
        value, bad, bad_param, n = g.bad_index(pool, xs, t)
        outs.append(value)
        if bad_param:
            sig += ", " + bad_param
            args.append(_bad_ids(rng, n, every="index(%bad_ids" in bad))
    body = "\n".join(g.lines)
    rets = ", ".join(v.name for v in outs)
    rtypes = ", ".join(type_of(v.shape) for v in outs)
    text = "".join(g.helper_text) + f"func @f({sig}) -> ({rtypes}) {{\n{body}\n  return {rets}\n}}\n"
    where = None
    if bad is not None:
        lines = text.splitlines()
        where = (lines.index(bad) + 1, bad.index("index(" if "index(" in bad else "scatter_add(") + 1)
    return Program(text, "f", args, dtype, small=not big, expect_error=where)


def _grad_program(rng: random.Random, g: _Gen, pool: list[Val], params: list[str], written: dict,
                  sig: str, args: list[np.ndarray], big: bool) -> Program:
    dtype = g.dtype
    # The loss reads the last few values, so most of the body is live.
    last, rest = pool[-1], pool[len(params):-1][-3:]
    g.emit(f"%loss = sum({last.name} * {last.name})" + "".join(f" + mean({v.name})" for v in rest))
    body = "\n".join(g.lines)
    floats = list(range(len(params)))  # %ids, an integer, comes after them and is not differentiated
    wrt = sorted(rng.sample(floats, rng.randint(1, len(floats))))
    names = ", ".join("%" + p for p in params) + (", %ids" if g.ids is not None else "")
    grads = ", ".join(str(i) for i in wrt)
    rtypes = ", ".join(f"tensor<{'x'.join(written[params[i]] + (dtype,))}>" for i in wrt)
    text = "".join(g.helper_text) + (
        f"func @loss({sig}) -> tensor<{dtype}> {{\n{body}\n  return %loss\n}}\n\n"
        f"func @grads({sig}) -> (tensor<{dtype}>, {rtypes}) {{\n"
        f"  %l, {', '.join(f'%d{i}' for i in wrt)} = grad @loss({names}) wrt ({grads})\n"
        f"  return %l, {', '.join(f'%d{i}' for i in wrt)}\n}}\n")
    return Program(text, "grads", args, dtype, True, "loss", wrt, small=not big)
