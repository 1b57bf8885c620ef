"""Programs gir accepts that must also compile: each runs through `gir.jit` on the `interp` and
`cpu` devices and is checked against the interpreter on the module as written (`?` dims and
all), and each pass is checked to leave IR the verifier accepts.

- `?` dims and reassigned names: gir.jit specialises a `?` signature by re-inferring every
  type (ir/specialize.py), so a variable declared `tensor<?x3xf64>` takes the shapes of the
  values stored into it, one `var` per shape where they differ.
- `fused` ops written by hand (docs/language.md's `@fused_group`) or made by an earlier `fuse`:
  `fuse` neither joins nor enters them, so `fuse,fuse` prints what `fuse` prints.
- A loop whose only static sequence is unused (`for %x in %a, %y in %b`, `%a: ?x2`, `%b: 3`):
  canonicalize drops `%b` and keeps the trip count as `length 3`.
"""

from __future__ import annotations

from pathlib import Path

import gir
import gir.cli
import numpy as np
import pytest
from gir.ir.specialize import specialize
from gir.ir.types import TensorType
from gir.passes.pass_manager import PassManager
from gir.passes.pipeline import DEFAULT_PIPELINE
from gir.testing import assert_all_close

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def fresh_code_cache(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A code cache of this module's own, so the CPU backend compiles what the passes make now."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIR_CACHE_DIR", str(tmp_path_factory.mktemp("gir-cache")))
        yield


def oracle(source: str, entry: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """The interpreter on the module as written, `?` dims and all, after the default pipeline."""
    module = gir.parse(source)
    PassManager(DEFAULT_PIPELINE).run(module)
    return gir.interpret(module, entry, *args)


def check_jit(source: str, entry: str, arg_sets: list[list[np.ndarray]],
              static_sources: list[str] | None = None) -> None:
    """gir.jit on `interp` and `cpu`, one specialisation per argument set, against the oracle
    (run on static_sources[i], the program written for argument set i, where given)."""
    for device in ("interp", "cpu"):
        fn = gir.jit(source, entry, device=device)
        for i, args in enumerate(arg_sets):
            want = oracle(static_sources[i] if static_sources else source, entry, args)
            assert_all_close(fn(*args), want, what=f"{device} {[a.shape for a in args]}")


def normal(rng: np.random.Generator, *shape: int, dtype: type = np.float64) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------
# `?` dims and reassigned names (ir/specialize.py)

REASSIGNED_IN_LOOP = """
func @f(%xs: tensor<?x3xf64>, %x: tensor<3xf64>) -> tensor<?x3xf64> {
  %c = %xs
  for %y in %xs {
    %c = %c + %x
  }
  return %c
}
"""

RNN_DYNAMIC = """
func @rnn_loss(%xs: tensor<?x?x3xf32>, %h0: tensor<?x3xf32>,
               %wx: tensor<3x3xf32>, %wh: tensor<3x3xf32>, %b: tensor<3xf32>) -> tensor<f32> {
  %h = %h0
  %loss = constant 0.0 : tensor<f32>
  for %x in %xs {
    %h = tanh(%x @ %wx + %h @ %wh + %b)
    %loss = %loss + sum(%h * %h)
  }
  return %loss
}

func @rnn_grads(%xs: tensor<?x?x3xf32>, %h0: tensor<?x3xf32>,
                %wx: tensor<3x3xf32>, %wh: tensor<3x3xf32>, %b: tensor<3xf32>)
    -> (tensor<f32>, tensor<3x3xf32>, tensor<3x3xf32>, tensor<3xf32>) {
  %loss, %dwx, %dwh, %db = grad @rnn_loss(%xs, %h0, %wx, %wh, %b) wrt (%wx, %wh, %b)
  return %loss, %dwx, %dwh, %db
}
"""

TWO_SHAPES = """
func @f(%a: tensor<?x3xf64>, %b: tensor<?x3xf64>) -> tensor<?x3xf64> {
  %c = %a
  %s = sum(%c * 2.0)
  %c = %b
  return %c * %s
}
"""

NESTED = """
func @f(%xss: tensor<?x?x3xf64>, %h0: tensor<?x3xf64>) -> (tensor<?x3xf64>, tensor<?x?x3xf64>) {
  %h = %h0
  for %xs in %xss {
    for %x in %xs {
      %h = tanh(%h + %x)
    }
    collect %h into %hs
  }
  return %h, %hs
}
"""

LOCAL_THEN_OUTER = """
func @f(%xs: tensor<?x?xf64>, %y: tensor<?xf64>) -> (tensor<?x?xf64>, tensor<?xf64>) {
  for %x in %xs {
    %t = %x * 2.0
    %t = %t + %x
    collect %t into %ys
  }
  %t = %y
  %t = %t * %t
  return %ys, %t
}
"""


def test_reassigned_in_loop() -> None:
    rng = np.random.default_rng(0)
    check_jit(REASSIGNED_IN_LOOP, "f", [[normal(rng, n, 3), normal(rng, 3)] for n in (3, 5)])


@pytest.mark.parametrize("entry", ["rnn_loss", "rnn_grads"])
def test_rnn_dynamic_batch(entry: str) -> None:
    """The language guide's RNN with `?` steps and batch. Its oracle is the same program written
    with static shapes: `autodiff` cannot differentiate a loop whose carry has a `?` dim."""
    rng = np.random.default_rng(1)
    sizes = ((5, 2), (3, 4))
    arg_sets = [[normal(rng, t, n, 3, dtype=np.float32), normal(rng, n, 3, dtype=np.float32),
                 normal(rng, 3, 3, dtype=np.float32), normal(rng, 3, 3, dtype=np.float32),
                 normal(rng, 3, dtype=np.float32)] for t, n in sizes]
    static = [RNN_DYNAMIC.replace("?x?x3", f"{t}x{n}x3").replace("?x3", f"{n}x3") for t, n in sizes]
    check_jit(RNN_DYNAMIC, entry, arg_sets, static)


def test_one_variable_two_shapes() -> None:
    """%c holds 2 rows, then 4: the specialised module has one `var` per shape."""
    module = specialize(gir.parse(TWO_SHAPES), "f", [TensorType((2, 3), "f64"), TensorType((4, 3), "f64")])
    gir.verify(module)
    assert sorted(str(op.results[0].type) for op in module.walk() if op.name == "var") == \
        ["tensor<2x3xf64>", "tensor<4x3xf64>"]
    rng = np.random.default_rng(2)
    check_jit(TWO_SHAPES, "f", [[normal(rng, 2, 3), normal(rng, 4, 3)], [normal(rng, 5, 3), normal(rng, 1, 3)]])


def test_nested_loops() -> None:
    rng = np.random.default_rng(3)
    check_jit(NESTED, "f", [[normal(rng, 2, 3, 3), normal(rng, 1, 3)], [normal(rng, 4, 2, 3), normal(rng, 2, 3)]])


def test_local_in_loop_then_other_shape_after() -> None:
    """%t is local to each step (shape of a row of %xs), then holds %y's shape after the loop."""
    rng = np.random.default_rng(4)
    check_jit(LOCAL_THEN_OUTER, "f", [[normal(rng, 2, 3), normal(rng, 5)], [normal(rng, 4, 5), normal(rng, 2)]])


def test_carry_changing_shape_is_a_type_error() -> None:
    """A loop-carried variable whose shape changes in the loop has no static type: a clear error."""
    source = """
    func @f(%a: tensor<?xf64>, %xs: tensor<?x?xf64>) -> tensor<?xf64> {
      %c = %a
      for %x in %xs {
        %c = %x
      }
      return %c
    }
    """
    rng = np.random.default_rng(5)
    fn = gir.jit(source, "f")
    args = [normal(rng, 4), normal(rng, 3, 4)]
    assert_all_close(fn(*args), oracle(source, "f", args))
    with pytest.raises(gir.GirTypeError, match="%c holds tensor<2xf64> before the loop and tensor<4xf64>"):
        fn(normal(rng, 2), normal(rng, 3, 4))


# ---------------------------------------------------------------------------------------------
# `fuse` leaves existing `fused` ops alone (transforms/fuse.py)

FUSED_GROUP = """
func @fused_group(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %r, %s = fused (%a = %x, %b = %y) {
    %c = constant 2.0 : tensor<f32>
    %0 = add %a, %b : tensor<4xf32>
    %1 = mul %0, %c : tensor<4xf32>
    yield (%1, %0)
  } : tensor<4xf32>, tensor<4xf32>
  return %r
}
"""


def gir_opt(capsys: pytest.CaptureFixture[str], path: Path, pipeline: str) -> str:
    """`gir opt -p PIPELINE FILE`'s output (the pass manager verifies the IR after each pass)."""
    assert gir.cli.main(["opt", "-p", pipeline, str(path)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_docs_fused_group_compiles() -> None:
    """The `@fused_group` example of docs/language.md: a hand-written `fused` op is not fused again."""
    rng = np.random.default_rng(6)
    check_jit(FUSED_GROUP, "fused_group", [[normal(rng, 4, dtype=np.float32), normal(rng, 4, dtype=np.float32)]])


@pytest.mark.parametrize("source", ["fused_group", "rnn.gir", "lstm.gir"])
def test_fuse_is_idempotent(source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fuse,fuse` prints what `fuse` prints: the second run finds nothing to group."""
    path = REPO / "examples" / source if source.endswith(".gir") else tmp_path / "f.gir"
    if not source.endswith(".gir"):
        path.write_text(FUSED_GROUP)
    before = f"{DEFAULT_PIPELINE},inline,canonicalize"
    once = gir_opt(capsys, path, f"{before},fuse")
    twice = gir_opt(capsys, path, f"{before},fuse,fuse")
    assert "fused" in once
    assert twice == once
    gir.verify(gir.parse(twice))


# ---------------------------------------------------------------------------------------------
# Dropping the sequence that fixed a loop's trip count (transforms/loops.py rebuild_scan)

UNUSED_STATIC_SEQUENCE = """
func @f(%a: tensor<?x2xf32>, %b: tensor<3xf32>) -> tensor<3x2xf32> {
  for %x in %a, %y in %b {
    collect %x * 2.0 into %ys
  }
  return %ys
}
"""

UNUSED_STATIC_SEQUENCE_SCAN = """
func @f(%a: tensor<?x2xf64>, %b: tensor<4x5xf64>, %z: tensor<2xf64>) -> (tensor<2xf64>, tensor<4x2xf64>) {
  %acc, %all = scan reverse (%x in %a, %y in %b) carry (%c = %z) {
    %c.1 = add %c, %x : tensor<2xf64>
    yield (%c.1) stack (%c.1)
  } : tensor<2xf64>, tensor<4x2xf64>
  return %acc, %all
}
"""


@pytest.mark.parametrize(("source", "steps"), [(UNUSED_STATIC_SEQUENCE, 3), (UNUSED_STATIC_SEQUENCE_SCAN, 4)],
                         ids=["for", "scan"])
def test_canonicalize_keeps_the_trip_count(source: str, steps: int, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The unused %b alone said the loop has `steps` steps (%a is `?` long): canonicalize drops
    %b and writes `length` instead, so the stacked results keep their types."""
    path = tmp_path / "f.gir"
    path.write_text(source)
    out = gir_opt(capsys, path, "ssa,canonicalize")
    assert f"length {steps} (%x in %a)" in out
    canonical = gir.parse(out)
    gir.verify(canonical)
    before = gir.parse(source)
    PassManager("ssa").run(before)
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(t.shape if t.is_static else (steps, 2)).astype(t.numpy_dtype)
            for t in before.functions["f"].arg_types]
    assert_all_close(gir.interpret(canonical, "f", *args), gir.interpret(before, "f", *args))
    gir_opt(capsys, path, DEFAULT_PIPELINE)
    check_jit(source, "f", [args])
