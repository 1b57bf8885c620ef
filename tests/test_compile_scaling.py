"""Compile cost linear in the size of what the user traces (issue 30): a pytree of thousands of
small leaves (backend/cpu/lower/outline.py `OUTLINE_AFTER`: top-level loop nests outlined, so no one
LLVM function grows with the leaves), and a large NumPy array a traced function closes over
(frontend/python/tracer.py `array_constant`: passed as a hidden argument, not printed).

The assertions count what the compile makes (LLVM IR per function, printed IR), never seconds.
"""

from __future__ import annotations

import re

import gir
import numpy as np
import pytest
from gir.backend.cpu.lower import outline


def _step(params: dict, lr: float) -> tuple:
    squares = gir.tree_util.tree_map(lambda p: p * p, params)
    total = sum(gir.sum(q) for q in squares.values())
    return gir.tree_util.tree_map(lambda p, q: p - lr * q, params, squares), total


def _params(n: int) -> dict:
    rng = np.random.default_rng(n)
    return {f"p{i:05d}": rng.standard_normal(2 + i % 3) for i in range(n)}


def _function_sizes(llvm_ir: str) -> dict[str, int]:
    """Each LLVM function of the module -> its instruction count."""
    sizes: dict[str, int] = {}
    name = None
    for line in llvm_ir.splitlines():
        m = re.match(r'define .*@"?([\w.]+)"?\(', line)
        if m:
            name = m.group(1)
            sizes[name] = 0
        elif line == "}":
            name = None
        elif name is not None and line.startswith("  "):
            sizes[name] += 1
    return sizes


def _compiled(n: int) -> tuple[dict[str, int], object]:
    params = _params(n)
    fn = gir.jit(_step)
    out, total = fn(params, 0.1)
    ref, ref_total = gir.jit(_step, device="interp")(params, 0.1)
    for key in params:
        np.testing.assert_allclose(out[key], ref[key], rtol=1e-12)
    np.testing.assert_allclose(total, ref_total, rtol=1e-12)
    return _function_sizes(fn.compiled.llvm_ir), fn


def test_llvm_functions_stay_small_as_pytree_leaves_grow() -> None:
    small, _ = _compiled(300)
    large, _ = _compiled(1200)
    assert any(name.startswith("gir_kernel") for name in large)
    # no loop nest grows with the leaves (the fused chain of adds over the leaves' sums is cut
    # at fuse.MAX_INPUTS): LLVM's superlinear passes (loop strength reduction, the scheduler of
    # one basic block) see functions of bounded size
    kernels = lambda sizes: [n for name, n in sizes.items() if name != "gir_main"]  # noqa: E731
    assert max(kernels(large)) <= 1.1 * max(kernels(small))
    # gir_main, straight-line calls and the pointers they take, and the module grow linearly
    for sizes in (lambda s: s["gir_main"], lambda s: sum(s.values())):
        assert sizes(large) / 1200 == pytest.approx(sizes(small) / 300, rel=0.1)


def test_few_loops_stay_in_gir_main() -> None:
    sizes, _ = _compiled(outline.OUTLINE_AFTER // 8)
    assert not any(name.startswith("gir_kernel") for name in sizes)


# -- closed-over arrays ---------------------------------------------------------------------------


def _closure(n: int, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    w = rng.standard_normal((n, n))

    def loss(x: object) -> object:
        return gir.sum(gir.tanh(x @ w))

    return w, loss


def test_a_large_closed_over_array_is_passed_not_printed() -> None:
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (10, 1000):
        w, loss = _closure(n, rng)
        fn = gir.jit(loss)
        x = rng.standard_normal((3, n))
        np.testing.assert_allclose(fn(x), np.tanh(x @ w).sum(), rtol=1e-12)
        sizes[n] = len(str(fn.module))
        w_at_trace = w.copy()
        w[:] = 0.0  # read when traced, as JAX does: a later change is not seen
        np.testing.assert_allclose(fn(x), np.tanh(x @ w_at_trace).sum(), rtol=1e-12)
    # 10x10 (100 elements) is printed as a constant, 1000x1000 passed: no bigger a module
    assert "constant [[" in str(gir.jit(_closure(10, rng)[1]).trace(np.ones((3, 10))).module)
    assert sizes[1000] <= sizes[10]


def test_gradient_through_a_hidden_argument_and_inside_a_scan() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 40))
    x = rng.standard_normal((3, 40))

    def loss(x: object) -> object:
        def step(h: object, _: object) -> tuple:
            return gir.tanh(h @ w), gir.sum(h)
        h, _ = gir.scan(step, x, None, length=2)
        return gir.sum(h * h) + gir.sum(x @ w)  # w read in the step and in the entry: one argument

    traced = gir.jit(loss).trace(x)
    assert len(traced.hidden) == 1 and len(traced.module.functions[traced.entry].args) == 2
    grad = gir.jit(gir.grad(loss))(x)

    def reference(x: np.ndarray) -> float:
        h = x
        for _ in range(2):
            h = np.tanh(h @ w)
        return float((h * h).sum() + (x @ w).sum())

    eps, numeric = 1e-6, np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        numeric[i] = (reference(x + d) - reference(x - d)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gir.jit(loss, device="interp")(x), reference(x), rtol=1e-12)


def test_gir_trace_prints_the_array() -> None:
    w = np.arange(2000.0).reshape(40, 50)
    module = gir.trace(lambda x: x @ w, np.ones((2, 40)))
    assert "constant [[0.0, 1.0" in str(module) and len(module.functions[list(module.functions)[-1]].args) == 1
