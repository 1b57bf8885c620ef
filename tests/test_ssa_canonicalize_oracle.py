"""The interpreter is the oracle: `ssa` and `ssa,canonicalize` must not change any result.

Checked on every function of examples/*.gir that can run before autodiff (no `grad`), as
written (f32) and with every f32 turned into f64 (and T = 5 steps), and on hypothesis-generated surface
programs: straight-line elementwise / matmul / reduction code over 4x4 f64 tensors, loops
that reassign outer names (carries), names local to a step, `collect`, nested loops, literal
identities (`+ 0.0`, `* 1.0`, ...), duplicated subexpressions and dead code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.ir.core import Module
from gir.ir.interpreter import interpret, random_inputs
from gir.passes.pass_manager import PassManager
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PRE_SSA_OPS = {"var", "load", "store", "for"}


def results_before_and_after(text: str, filename: str, names: list[str] | None = None) -> None:
    """Runs every (named) function before any pass, after ssa and after ssa,canonicalize."""
    module = gir.parse(text, filename)
    names = names if names is not None else list(module.functions)
    inputs = {n: random_inputs(module.functions[n], seed=7) for n in names}
    want = {n: interpret(module, n, *inputs[n]) for n in names}

    PassManager("ssa").run(module)
    left = sorted({op.name for op in module.walk()} & PRE_SSA_OPS)
    assert left == [], f"after ssa the IR still has {left}:\n{module}"
    check(module, names, inputs, want, "ssa")

    PassManager("canonicalize").run(module)
    check(module, names, inputs, want, "ssa,canonicalize")
    assert str(gir.parse(str(module))) == str(module)


def check(module: Module, names: list[str], inputs: dict, want: dict, after: str) -> None:
    for n in names:
        got = interpret(module, n, *inputs[n])
        assert len(got) == len(want[n])
        for i, (a, b) in enumerate(zip(want[n], got)):
            assert a.shape == b.shape and a.dtype == b.dtype, f"@{n} out{i} after {after}"
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=1e-12, atol=1e-12,
                                       equal_nan=True, err_msg=f"@{n} out{i} after {after}\n{module}")


# -- examples -------------------------------------------------------------------------------

def runnable_functions(text: str) -> list[str]:
    module = gir.parse(text)
    return [f.name for f in module.functions.values() if not any(op.name == "grad" for op in f.walk())]


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.gir"))


def test_there_are_examples() -> None:
    assert len(EXAMPLE_FILES) >= 4


@pytest.mark.parametrize("variant", ["as-written", "f64"])
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.name for p in EXAMPLE_FILES])
def test_examples(path: Path, variant: str) -> None:
    text = path.read_text(encoding="utf-8")
    if variant == "f64":  # float64 throughout, and 5 steps instead of 50 to keep it quick
        text = text.replace("xf32>", "xf64>").replace("<f32>", "<f64>").replace("tensor<50x", "tensor<5x")
    names = runnable_functions(text)
    assert names, f"{path.name} has no function that runs before autodiff"
    results_before_and_after(text, path.name, names)


def test_carry_made_invariant_feeds_another_carry() -> None:
    """Found by the generator below (with more examples than it runs here)."""
    results_before_and_after("""\
func @f(%xs: tensor<5x4xf64>, %a0: tensor<4xf64>, %b0: tensor<4xf64>) -> tensor<4xf64> {
  %a = %a0
  %b = %b0
  for %x in %xs {
    %b = %a
    %a = %a * 1.0
  }
  return %b
}
""", "carry.gir")


# -- generated programs ---------------------------------------------------------------------

Shape = tuple[int, ...]
MAT: Shape = (4, 4)
PARAMS: dict[str, Shape] = {"%a": MAT, "%b": MAT, "%c": MAT, "%xs": (3, 4, 4), "%xss": (2, 3, 4, 4)}


def tensor(shape: Shape) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + "f64>"


class ProgramGen:
    """Builds one surface-form function from hypothesis draws.

    Every expression is a 4x4 f64 value, so any name may be reassigned by any expression.
    Scopes follow the frontend: a name first assigned in a loop body is visible only there;
    names assigned before a loop and reassigned in it are carried; `collect` targets are
    visible after the loop."""

    def __init__(self, draw: Callable) -> None:
        self.draw = draw
        self.scopes: list[dict[str, Shape]] = [dict(PARAMS)]
        self.lines: list[str] = []
        self.fresh = 0
        self.depth = 0

    def name(self, prefix: str = "v") -> str:
        self.fresh += 1
        return f"%{prefix}{self.fresh}"

    def visible(self) -> dict[str, Shape]:
        out: dict[str, Shape] = {}
        for scope in self.scopes:
            out.update(scope)
        return out

    def pick(self, options: list) -> object:
        return options[self.draw(st.integers(0, len(options) - 1))]

    # expressions (text of a 4x4 f64 value)
    def leaf(self) -> str:
        names = sorted(self.visible().items())
        name, shape = self.pick(names)  # type: ignore[misc]
        if shape == MAT:
            return name
        axes = list(range(len(shape) - 2))
        return f"{self.pick(['sum', 'mean'])}({name}, axes = {axes})"

    def expr(self, depth: int) -> str:
        if depth == 0 or self.draw(st.integers(0, 3)) == 0:
            return self.leaf()
        kind = self.draw(st.integers(0, 9))
        e = self.expr(depth - 1)
        if kind == 0:
            return f"({e} {self.pick(['+', '-', '*'])} {self.expr(depth - 1)})"
        if kind == 1:
            return f"({e} @ {self.expr(depth - 1)})"
        if kind == 2:
            return f"{self.pick(['tanh', 'sigmoid', 'relu', 'abs'])}({e})"
        if kind == 3:
            return str(self.pick([f"({e} + 0.0)", f"(0.0 + {e})", f"({e} * 1.0)", f"(1.0 * {e})", f"({e} / 1.0)",
                                  f"({e} - 0.0)", f"({e} * -1.0)", f"(0.0 - {e})", f"-(-{e})", f"({e} / 2.0)"]))
        if kind == 4:
            return str(self.pick([f"transpose({e})", f"transpose(transpose({e}))",
                                  f"reshape(reshape({e}, shape = [16]), shape = [4, 4])"]))
        if kind == 5:
            return f"({e} + sum({self.expr(depth - 1)}, axes = [1], keepdims = true))"
        if kind == 6:
            return f"({e} * max({self.expr(depth - 1)}))"
        if kind == 7:
            return f"({e} + {e})"  # a duplicated subexpression: work for CSE
        if kind == 8:
            return f"select(gt({e}, {self.expr(depth - 1)}), {e}, -{e})"
        return f"exp(tanh({e}))"

    # statements
    def emit(self, text: str) -> None:
        self.lines.append("  " * (self.depth + 1) + text)

    def statements(self, n: int, collects: dict[str, Shape] | None) -> None:
        for _ in range(n):
            kind = self.draw(st.integers(0, 9))
            mats = sorted(n for n, s in self.visible().items() if s == MAT)
            seqs = sorted(n for n, s in self.visible().items() if len(s) >= 3)
            if kind <= 3:
                target = self.name()
                self.emit(f"{target} = {self.expr(3)}")
                self.scopes[-1][target] = MAT
            elif kind <= 6:
                self.emit(f"{self.pick(mats)} = {self.expr(3)}")  # a reassignment
            elif kind == 7 and collects is not None:
                target = self.name("c")
                self.emit(f"collect {self.expr(2)} into {target}")
                collects[target] = MAT
            elif self.depth < 2 and seqs:
                self.loop(str(self.pick(seqs)))
            else:
                self.emit(f"{self.name('dead')} = exp({self.leaf()})")

    def loop(self, seq: str) -> None:
        shape = self.visible()[seq]
        elem = self.name("x")
        self.emit(f"for {elem} in {seq} {{")
        self.depth += 1
        self.scopes.append({elem: shape[1:]})
        collects: dict[str, Shape] = {}
        self.statements(self.draw(st.integers(1, 4)), collects)
        self.scopes.pop()
        self.depth -= 1
        self.emit("}")
        for name, s in collects.items():
            self.scopes[-1][name] = (shape[0],) + s

    def program(self) -> str:
        self.statements(self.draw(st.integers(1, 7)), None)
        outer = sorted(self.scopes[0].items())
        results = [(n, s) for n, s in outer if self.draw(st.booleans())] or [outer[-1]]
        params = ", ".join(f"{n}: {tensor(s)}" for n, s in PARAMS.items())
        types = ", ".join(tensor(s) for _, s in results)
        body = "\n".join(self.lines)
        values = ", ".join(n for n, _ in results)
        return f"func @gen({params}) -> ({types}) {{\n{body}\n  return {values}\n}}\n"


@st.composite
def programs(draw: Callable) -> str:
    return ProgramGen(draw).program()


@settings(derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_generated_programs(text: str) -> None:
    results_before_and_after(text, "gen.gir")


def test_generator_covers_the_features() -> None:
    """Over a fixed sample, the generator produces every feature at least once."""
    seen: set[str] = set()

    @settings(derandomize=True, deadline=None, max_examples=60, database=None)
    @given(programs())
    def collect(text: str) -> None:
        ops = list(gir.parse(text).walk())
        seen.update(op.name for op in ops)
        if any(op.name == "for" and any(inner.name == "for" for inner in op.body.walk()) for op in ops):
            seen.add("nested for")
        if "collect" in text:
            seen.add("collect")
        if "+ 0.0" in text or "* 1.0" in text:
            seen.add("identity")

    collect()
    assert {"for", "var", "store", "load", "nested for", "collect", "identity", "matmul", "sum"} <= seen
