"""Compile cost linear in the size of what the user traces (issue 30): a pytree of thousands of
small leaves (backend/cpu/codegen.py `OUTLINE_AFTER`: top-level loop nests outlined, so no one
LLVM function grows with the leaves), and a large NumPy array a traced function closes over
(frontend/python/tracer.py `array_constant`: passed as a hidden argument, not printed).

The assertions count what the compile makes (LLVM IR per function, printed IR), never seconds.
"""

from __future__ import annotations

import re

import gir
import numpy as np
import pytest
from gir.backend.cpu import codegen


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
    sizes, _ = _compiled(codegen.OUTLINE_AFTER // 8)
    assert not any(name.startswith("gir_kernel") for name in sizes)
