"""Sizes a program may write but the compiler must not allocate or crash on: zero-size and
huge constants under folding, huge arenas, ranks past NumPy's, literals past their dtype.

Huge cases are checked with tracemalloc (NumPy reports its buffers to it): compiling them must
stay far below the size of the tensors they name.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import gir
from gir.passes.pass_manager import PassManager

SMALL = 64 << 20
"""Peak bytes a compile of a huge program may allocate (the programs name 40+ GiB)."""


@contextmanager
def allocates_little() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < SMALL, f"allocated {peak} bytes at compile time"


def canonicalize(src: str) -> str:
    module = gir.parse(src, "size.gir")
    PassManager("canonicalize").run(module)
    return str(module)


# -- constant folding -------------------------------------------------------------------------

def test_fold_zero_size_constant() -> None:
    out = canonicalize("""func @f() -> tensor<3x0xf32> {
  %a = constant 1.0 : tensor<3x0xf32>
  %b = neg %a : tensor<3x0xf32>
  return %b
}""")
    assert "neg" not in out and "constant 0.0 : tensor<3x0xf32>" in out


def test_fold_huge_constant_is_left_alone() -> None:
    src = """func @f() -> tensor<f32> {
  %a = constant 1.0 : tensor<100000x100000xf32>
  %b = sum(%a)
  return %b
}"""
    with allocates_little():
        out = canonicalize(src)
    assert "sum" in out


def test_fold_huge_splats_elementwise_on_one_element() -> None:
    src = """func @f() -> tensor<100000x100000xf32> {
  %a = constant 1.5 : tensor<100000x100000xf32>
  %b = constant 2.0 : tensor<f32>
  %c = mul %a, %b : tensor<100000x100000xf32>
  return %c
}"""
    with allocates_little():
        out = canonicalize(src)
    assert "mul" not in out and "constant 3.0 : tensor<100000x100000xf32>" in out


def test_grad_through_huge_broadcast_allocates_nothing() -> None:
    # autodiff seeds the cotangent of the huge tanh with a broadcast of a constant: canonicalize
    # must fold it as a splat, never as a 37 GiB array.
    src = """func @loss(%x: tensor<f32>) -> tensor<f32> {
  %b = broadcast %x {shape = [100000, 100000]} : tensor<100000x100000xf32>
  %t = tanh %b : tensor<100000x100000xf32>
  %l = sum %t : tensor<f32>
  return %l
}

func @g(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %l, %dx = grad @loss(%x) wrt (%x) : tensor<f32>, tensor<f32>
  return %l, %dx
}"""
    module = gir.parse(src, "size.gir")
    with allocates_little():
        PassManager("autodiff,canonicalize").run(module)
    out = str(module).split("func @g")[1]
    assert out.count("broadcast") == 1  # the forward one; the seed folded, then x * 1 -> x
