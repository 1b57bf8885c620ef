"""Sizes a program may write but the compiler must not allocate or crash on: zero-size and
huge constants under folding, huge arenas, ranks past NumPy's, literals past their dtype.

Huge cases are checked with tracemalloc (NumPy reports its buffers to it): compiling them must
stay far below the size of the tensors they name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.cpu import runtime as cpu_runtime
from gir.errors import GirError
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


# -- workspaces larger than memory --------------------------------------------------------------

HUGE = """func @f(%x: tensor<f32>) -> tensor<f32> {
  %b = broadcast %x {shape = [100000, 100000, 100]} : tensor<100000x100000x100xf32>
  %t = tanh %b : tensor<100000x100000x100xf32>
  %l = sum %t : tensor<f32>
  return %l
}"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cpu_huge_tensor_is_a_located_error(cache_dir: Path) -> None:
    module = gir.parse(HUGE, "size.gir")
    with allocates_little(), pytest.raises(GirError) as e:
        gir.jit(module, "f")(np.float32(1))
    assert str(e.value).startswith("size.gir:2:8: error: @f: 'broadcast' makes a tensor<100000x100000x100xf32> "
                                   "of 3.6 TiB, more than this machine's memory")


def test_cpu_arena_larger_than_memory(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each value fits (1 MiB); %a, %b and %c live at once (3 MiB) do not fit in 1.5 MiB.
    src = """func @f(%x: tensor<512x512xf32>) -> tensor<f32> {
  %a = matmul %x, %x : tensor<512x512xf32>
  %b = matmul %a, %x : tensor<512x512xf32>
  %c = matmul %a, %b : tensor<512x512xf32>
  %l = sum %c : tensor<f32>
  return %l
}"""
    monkeypatch.setattr(cpu_runtime, "host_memory_bytes", lambda: 3 << 19)
    module = gir.parse(src, "size.gir")
    with pytest.raises(GirError, match=r"^size.gir:1:6: error: @f needs a workspace of 3.0 MiB, more than this "
                                       r"machine's memory \(1.5 MiB\)"):
        gir.jit(module, "f")(np.ones((512, 512), np.float32))


def test_gpu_huge_tensor_is_a_located_error(tmp_path: Path) -> None:
    # In a subprocess: the simulator must be chosen before numba.cuda is first imported.
    script = f"""
import gir, numpy as np, tracemalloc
tracemalloc.start()
try:
    gir.jit(gir.parse({HUGE!r}, "size.gir"), "f", device="gpu")(np.float32(1))
except gir.GirError as e:
    print(str(e).splitlines()[0])
print(tracemalloc.get_traced_memory()[1] < {SMALL})
"""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "GIR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[1] == "True", out.stdout + out.stderr
    assert lines[0].startswith("size.gir:2:8: error: @f: 'broadcast' makes a tensor<100000x100000x100xf32> of "
                               "3.6 TiB, more than this machine's memory"), lines


# -- types and literals past their limits -------------------------------------------------------

RANK65 = "x".join(["1"] * 65)


@pytest.mark.parametrize(("src", "message"), [
    (f"func @f(%x: tensor<{RANK65}xf32>) -> tensor<f32> {{\n  %y = sum %x : tensor<f32>\n  return %y\n}}",
     "size.gir:1:9: error: a tensor of rank 65 has more than 64 dimensions (NumPy's limit)"),
    (f"func @f(%x: tensor<1xf32>) -> tensor<f32> {{\n  %y = reshape %x {{shape = [{', '.join(['1'] * 65)}]}}\n"
     "  %z = sum %y : tensor<f32>\n  return %z\n}",
     "size.gir:2:8: error: a tensor of rank 65 has more than 64 dimensions (NumPy's limit)"),
    ("func @f(%x: tensor<" + "9" * 5000 + "xf32>) -> tensor<f32> {\n  %y = sum %x : tensor<f32>\n  return %y\n}",
     "size.gir:1:9: error: a dimension is larger than 2**63 - 1"),
    ("func @f(%x: tensor<f32>) -> tensor<4611686018427387904x4xf32> {\n"
     "  %y = broadcast %x {shape = [4611686018427387904, 4]}\n  return %y\n}",
     "size.gir:1:6: error: tensor<4611686018427387904x4xf32> has more than 2**63 - 1 bytes"),
    ("func @f() -> tensor<f32> {\n  %y = constant 1e39 : tensor<f32>\n  return %y\n}",
     "size.gir:2:8: error: 'constant': the literal does not fit f32 (write inf for an infinity)"),
    ("func @f() -> tensor<2xf32> {\n  %y = constant [1.0, -1e39] : tensor<2xf32>\n  return %y\n}",
     "size.gir:2:8: error: 'constant': the literal does not fit f32 (write inf for an infinity)"),
    ("func @f(%x: tensor<f32>) -> tensor<f32> {\n  %y = %x * 1e39\n  return %y\n}",
     "size.gir:2:13: error: 'constant': the literal does not fit f32 (write inf for an infinity)"),
    ("func @f(%x: tensor<f64>) -> tensor<f64> {\n  %y = %x * 1e400\n  return %y\n}",
     "size.gir:2:13: error: the literal 1e400 is too large for any float dtype (write inf for an infinity)"),
    ("func @f(%x: tensor<f64>) -> tensor<f64> {\n  %y = %x * " + "9" * 5000 + ".0\n  return %y\n}",
     "size.gir:2:13: error: the literal 9999999999...9999.0 (5002 characters) is too large for any float dtype "
     "(write inf for an infinity)"),
], ids=["rank65-param", "rank65-reshape", "dim-5000-digits", "bytes-past-int64", "constant-f32", "list-f32",
        "surface-f32", "surface-f64", "surface-f64-5000-digits"])
def test_type_and_literal_limits(src: str, message: str) -> None:
    with pytest.raises(GirError) as e:
        gir.parse(src, "size.gir")
    assert str(e.value).splitlines()[0] == message


def test_inf_written_as_inf_is_fine() -> None:
    module = gir.parse("func @f(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>) {\n  %y = %x * inf\n"
                       "  %z = constant -inf : tensor<f32>\n  return %y, %z\n}", "size.gir")
    y, z = gir.interpret(module, "f", np.float32(2))
    assert y == np.inf and z == -np.inf


HUGE_INT = "9" * 5000  # past Python's 4300-digit limit for int()


@pytest.mark.parametrize("src, message, col", [
    (f"func @f(%x: tensor<i64>) -> tensor<i64> {{\n  return %x + {HUGE_INT}\n}}\n",
     "the integer literal 9999999999...999999 (5000 characters) is too large for any integer dtype", 15),
    (f"func @f(%x: tensor<4xf32>) -> tensor<4xf32> {{\n  %y = reshape %x {{shape = [{HUGE_INT}]}} : tensor<4xf32>\n"
     "  return %y\n}\n", "is too large for any integer dtype", 29),
    ("func @f(%x: tensor<f64>) -> tensor<f64> {\n  %c = constant 1e400 : tensor<f64>\n  return %c\n}\n",
     "the literal 1e400 is too large for any float dtype (write inf for an infinity)", 17),
], ids=["int-operand", "int-attribute", "float-constant"])  # the sources would make 5000-character test ids
def test_literals_past_every_dtype_are_located_syntax_errors(src: str, message: str, col: int) -> None:
    """The parser reports them (a raw ValueError before; 1e400 silently became inf in the generic form)."""
    with pytest.raises(gir.GirError) as info:
        gir.parse(src, filename="big.gir")
    assert message in info.value.message
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.col) == ("big.gir", 2, col)
