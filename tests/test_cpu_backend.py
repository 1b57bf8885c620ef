"""What only the CPU backend has (llvmlite JIT, BLAS, packing), checked against the
interpreter, the oracle. Everything both backends do is in tests/test_backend_conformance.py,
run on `cpu` and `gpu`.

- Math: float32 exp/tanh/sigmoid/log/sqrt/pow (LLVM polynomial approximations) to a few ulp.
- GEMM paths: every matmul form on each forced path (`GIR_GEMM_PATH`: openblas, mkl); GEMM and
  pack counts in a scan; a training loop (an outer scan over minibatches whose body
  differentiates an RNN with `grad` and updates the weights) packs each packed weight once per
  minibatch, however long the inner loop is (`fn.stats.pack_calls`).
- Arguments: a non-contiguous view is copied by gir.jit's calling convention; the bare
  CPUFunction (which reads arguments in place) still rejects one.
- The disk cache of compiled code (GIR_CACHE_DIR), a corrupt cached object recompiled.
- Inspection (`fn.ir`, `fn.llvm_ir`, `fn.asm`: the RNN's fused tanh loop is vectorised) and the
  command line (`gir run --repeat`, `gir compile --emit llvm|asm|obj`).

float32 results agree to 1e-4 of the largest magnitude of each result, float64 to 1e-10.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gir
import gir.cli
import llvmlite.binding as llvm
import numpy as np
import pytest
from gir.backend.cpu import blas
from gir.driver.jit import JitFunction
from gir.ir.interpreter import random_inputs
from gir.testing import RTOL, assert_all_close, assert_close

REPO = Path(__file__).resolve().parent.parent
HAS_MKL = blas.providers().has_mkl


# ---------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(autouse=True, scope="module")
def fresh_code_cache(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Compiled code is cached on disk by content (GIR_CACHE_DIR); a cache of its own makes this
    module compile everything with the backend as it is now."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIR_CACHE_DIR", str(tmp_path_factory.mktemp("gir-cache")))
        yield




def run_both(source: str, entry: str, args: list[np.ndarray] | None = None, seed: int = 0,
             rtol: float | None = None) -> JitFunction:
    """Runs @entry on cpu and on the interpreter (seeded random inputs unless given) and
    compares; returns the cpu JitFunction."""
    if args is None:
        args = random_inputs(gir.parse(source).functions[entry], seed)
    want = gir.jit(source, entry, device="interp")(*args)
    fn = gir.jit(source, entry, device="cpu")
    got = fn(*args)
    assert_all_close(got, want, rtol, f"@{entry}")
    return fn


def interp_and_cpu(source: str, entry: str, *args: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return gir.jit(source, entry, device="interp")(*args), gir.jit(source, entry, device="cpu")(*args)


# ---------------------------------------------------------------------------------------------
# float32 math


def test_float32_math_accuracy() -> None:
    """exp/tanh/sigmoid/log/sqrt/pow in float32 over a wide range (finite results): within
    1e-5 of each element's magnitude (the polynomial approximations are a few ulp)."""
    source = """\
func @f(%x: tensor<4001xf32>) -> (tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>,
                                  tensor<4001xf32>) {
  %small = %x * 4.0
  return exp(%x), tanh(%small), log(abs(%x) + 0.001), sqrt(abs(%x)), pow(abs(%x) + 0.5, 1.7)
}
"""
    x = np.linspace(-87.0, 88.0, 4001).astype(np.float32)
    want, got = interp_and_cpu(source, "f", x)
    for g, w, name in zip(got, want, ["exp", "tanh", "log", "sqrt", "pow"]):
        assert np.all(np.isfinite(g)), name
        rel = np.abs(g.astype(np.float64) - w) / np.maximum(np.abs(w.astype(np.float64)), 1e-30)
        assert float(rel.max()) < 1e-5, (name, x[np.argmax(rel)], g[np.argmax(rel)], w[np.argmax(rel)])
    sig = "func @g(%x: tensor<4001xf32>) -> tensor<4001xf32> {\n  return sigmoid(%x / 4.0)\n}\n"
    want, got = interp_and_cpu(sig, "g", x)
    assert_close(got[0], want[0], 1e-6, "sigmoid")


def test_float32_tanh_is_a_few_ulp_bounded_and_odd() -> None:
    """The rational tanh (mathlib.py): within 8 float32 ulp of tanh in float64 on a dense grid
    (the near-zero part relative, the rest against the ulp of the result), never beyond +-1,
    exactly odd, +-1 at +-inf and NaN through."""
    n = 200_001
    source = f"func @t(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n  return tanh(%x)\n}}\n"
    fn = gir.jit(source, "t", device="cpu")
    x = np.linspace(-12.0, 12.0, n).astype(np.float32)
    got = fn(x)[0]
    want = np.tanh(x.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert float(ulps.max()) <= 8.0, (x[np.argmax(ulps)], got[np.argmax(ulps)], want[np.argmax(ulps)])
    assert float(np.abs(got).max()) <= 1.0
    assert np.array_equal(got, -fn(-x)[0])
    special = np.full(n, np.nan, np.float32)
    special[:2] = [np.inf, -np.inf]
    out = fn(special)[0]
    assert out[0] == 1.0 and out[1] == -1.0 and np.isnan(out[2:]).all()


# ---------------------------------------------------------------------------------------------
# GEMM paths and packing

MATMULS = """\
func @f(%a: tensor<5x3xDT>, %b: tensor<3x4xDT>, %at: tensor<3x5xDT>, %bt: tensor<4x3xDT>,
        %x: tensor<2x5x3xDT>, %y: tensor<2x3x4xDT>, %m: tensor<6x1x3x4xDT>)
    -> (tensor<5x4xDT>, tensor<5x4xDT>, tensor<5x4xDT>, tensor<5x4xDT>, tensor<2x5x4xDT>, tensor<2x5x4xDT>,
        tensor<2x5x4xDT>, tensor<6x2x5x4xDT>, tensor<2x5x4xDT>) {
  %ab = %a @ %b
  %atb = transpose(%at) @ %b
  %abt = %a @ transpose(%bt)
  %both = transpose(%at) @ transpose(%bt)
  %xb = %x @ %b
  %xy = %x @ %y
  %ay = %a @ %y
  %xm = %x @ %m
  %xbt = %x @ transpose(%bt)
  return %ab, %atb, %abt, %both, %xb, %xy, %ay, %xm, %xbt
}
"""


def gemm_paths() -> list[str]:
    """The forced paths; the default choice is tested in tests/test_backend_conformance.py."""
    return ["openblas"] + (["mkl"] if HAS_MKL else [])


@pytest.mark.parametrize("path", gemm_paths())
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_matmuls_on_each_gemm_path(dtype: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """2-D, transposed left/right/both operands (folded into GEMM flags), batched (3-D @ 2-D,
    3-D @ 3-D, 2-D @ 3-D, broadcast batch dims) on each GEMM path."""
    monkeypatch.setenv("GIR_GEMM_PATH", path)
    source = MATMULS.replace("DT", dtype)
    fn = run_both(source, "f", seed=2, rtol=RTOL[dtype] if dtype == "f64" else 1e-5)
    assert set(fn.stats.gemm_paths) == {path}, fn.stats


def test_gemm_and_pack_counts_in_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """One GEMM per step for a product that depends on the carry; with the packed path forced,
    its loop-invariant weight is packed once for the whole loop."""
    if HAS_MKL:
        monkeypatch.setenv("GIR_GEMM_PATH", "mkl-packed")
    source = """\
func @f(%h0: tensor<4x6xf32>, %w: tensor<6x6xf32>) -> tensor<4x6xf32> {
  %h = scan length 7 () carry (%c = %h0) {
    %p = matmul %c, %w : tensor<4x6xf32>
    %n = tanh %p : tensor<4x6xf32>
    yield (%n)
  } : tensor<4x6xf32>
  return %h
}
"""
    fn = run_both(source, "f", seed=8)
    assert fn.stats.gemm_calls == 7
    assert fn.stats.pack_calls == (1 if HAS_MKL else 0)
    assert fn.stats.seconds > 0


# ---------------------------------------------------------------------------------------------
# Arguments


ARGS_PROGRAM = """\
func @f(%x: tensor<3x4xf32>, %n: tensor<4xi32>) -> tensor<3x4xf32> {
  return %x * cast(%n, dtype="f32")
}
"""


@pytest.mark.parametrize("view", ["transposed", "strided"])
def test_non_contiguous_view_is_copied_by_jit(view: str) -> None:
    """gir.jit copies a view to C order, as NumPy users expect (driver/calling.py); the CPUFunction
    under it reads arguments in place and rejects a view it is handed directly."""
    fn = gir.jit(ARGS_PROGRAM, "f")
    base = np.arange(24, dtype=np.float32)
    x = base[:12].reshape(4, 3).T if view == "transposed" else base.reshape(3, 8)[:, ::2]
    assert not x.flags.c_contiguous
    n = np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(fn(x, n)[0], x * n)
    with pytest.raises(gir.GirArgumentError, match="%x"):
        fn.compiled(x, n)
    np.testing.assert_array_equal(fn(np.ascontiguousarray(x), n)[0], x * n)


# ---------------------------------------------------------------------------------------------
# Packing in a compiled training loop


def training_loop(n: int, t: int, batch: int = 3, hidden: int = 6) -> str:
    """N minibatches, each an RNN over T steps; the weights are carries of the outer scan,
    updated by SGD with gradients from `grad` inside its body."""
    seq, h, w = f"{t}x{batch}x{hidden}xf32", f"{batch}x{hidden}xf32", f"{hidden}x{hidden}xf32"
    return f"""\
func @loss(%xs: tensor<{seq}>, %h0: tensor<{h}>, %wx: tensor<{w}>, %wh: tensor<{w}>) -> tensor<f32> {{
  %h = %h0
  %l = constant 0.0 : tensor<f32>
  for %x in %xs {{
    %h = tanh(%x @ %wx + %h @ %wh)
    %l = %l + sum(%h * %h)
  }}
  return %l
}}

func @train(%data: tensor<{n}x{seq}>, %h0: tensor<{h}>, %wx0: tensor<{w}>, %wh0: tensor<{w}>)
    -> (tensor<{w}>, tensor<{w}>, tensor<{n}xf32>) {{
  %wx = %wx0
  %wh = %wh0
  for %xs in %data {{
    %l, %dwx, %dwh = grad @loss(%xs, %h0, %wx, %wh) wrt (%wx, %wh)
    %wx = %wx - 0.05 * %dwx
    %wh = %wh - 0.05 * %dwh
    collect %l into %losses
  }}
  return %wx, %wh, %losses
}}
"""


@pytest.mark.parametrize("path", ["mkl-packed", "openblas-copy", "gir-packed"])
def test_training_loop_packs_once_per_minibatch(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Packs = N x (packed weights and directions): wh in the forward scan (h @ wh) and in the
    backward scan (dh @ wh^T), once per minibatch, whatever T is; wx is not packed (its product
    is hoisted out of the loop). The trained weights equal the interpreter's. openblas-copy's
    "pack" is the weight copied to the other orientation (the backward scan's wh^T becomes a
    plain operand, the forward's wh a transposed one)."""
    if path == "mkl-packed" and not HAS_MKL:
        pytest.skip("MKL (cblas_?gemm_pack) is not available")
    if path == "openblas-copy" and not blas.has_transpose_copy():
        pytest.skip("this OpenBLAS has no ?omatcopy_")
    monkeypatch.setenv("GIR_GEMM_PATH", path)
    packs = {}
    for n, t in [(3, 2), (3, 6), (2, 6)]:
        text = training_loop(n, t)
        module = gir.parse(text)
        args = random_inputs(module.functions["train"], 0)
        args[2] *= 3  # weights large enough that the updates matter
        args[3] *= 3
        fn = gir.jit(text, "train")
        got = fn(*args)
        want = gir.jit(text, "train", device="interp")(*args)
        assert_all_close(got, want, what=f"train N={n} T={t}")
        assert not np.allclose(got[1], args[3])  # the weights moved
        assert fn.stats.gemm_paths.get(path, 0) == 2, fn.stats  # forward and backward
        assert fn.stats.pack_calls == n * 2, fn.stats
        packs[n, t] = fn.stats.pack_calls
        assert fn.stats.gemm_calls > fn.stats.pack_calls * t
    assert packs[3, 2] == packs[3, 6]  # independent of T
    assert packs[2, 6] * 3 == packs[3, 6] * 2  # proportional to N


# ---------------------------------------------------------------------------------------------
# The disk cache of compiled code

CACHED = """\
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return tanh(%x @ %w) * 2.0
}
"""


def test_compiled_code_is_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    # The model's GEMM paths, final: a path measured in the background between the two gir.jit
    # calls would make the second a (correct) recompile, not a hit.
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    monkeypatch.setenv("GIR_LLVM_TIER", "0")  # stored at once (tiered stores: tests/test_compile_tiers.py)
    args = random_inputs(gir.parse(CACHED).functions["f"], 0)
    first = gir.jit(CACHED, "f")
    assert not first._current().from_cache
    assert list((tmp_path / "objects").glob("*.entry")) and list((tmp_path / "compiled").glob("*.entry"))
    second = gir.jit(CACHED, "f")
    assert second._current().from_cache
    assert second.llvm_ir == first.llvm_ir and second.asm
    np.testing.assert_array_equal(second(*args)[0], first(*args)[0])
    assert second.stats.gemm_calls == 1
    monkeypatch.setenv("GIR_GEMM_PATH", "openblas")  # another GEMM path is other code
    third = gir.jit(CACHED, "f")
    assert not third._current().from_cache
    assert_close(third(*args)[0], first(*args)[0], 1e-5)


CORRUPT_CACHE_SCRIPT = """\
import pathlib, sys
import numpy as np
import gir
src = sys.argv[1]
x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
w = np.ones((4, 2), np.float32)
want = gir.jit(src, "f")(x, w)[0]
for obj in pathlib.Path(sys.argv[2]).glob("*/*.entry"):
    data = obj.read_bytes()
    obj.write_bytes(data[: len(data) // 2])  # a truncated object, as after a crash or a full disk
got = gir.jit(src, "f")(x, w)[0]
assert np.allclose(got, want), (got, want)
print("ok")
"""


def test_corrupt_cached_object_is_recompiled(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CORRUPT_CACHE_SCRIPT, CACHED, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "GIR_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


# ---------------------------------------------------------------------------------------------
# Inspection


def test_ir_llvm_and_asm_and_vectorised_tanh_loop() -> None:
    fn = gir.jit(str(REPO / "examples" / "rnn.gir"), "rnn_loss")
    assert fn.compiled.wait_for_final_code(120)  # tiered compilation: the -O3 code (tiers.py)
    for text in (fn.ir, fn.llvm_ir, fn.asm):
        assert isinstance(text, str) and text.strip()
    assert "fused" in fn.ir and "scan" in fn.ir
    assert "define" in fn.llvm_ir and "gir_main" in fn.llvm_ir
    assert "gir_main" in fn.asm
    optimized = fn._current().optimized_ir  # fn.llvm_ir is the IR before LLVM's passes
    # tanh is a rational function (mathlib.py): a vector division is the tanh loop vectorised
    assert re.search(r"fdiv [a-z ]*<\d+ x float>", optimized), "the fused tanh loop is not vectorised"
    if llvm.get_host_cpu_features().get("avx2", False):
        assert "<8 x float>" in optimized and re.search(r"\bymm\d", fn.asm)


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_run_repeat(capsys: pytest.CaptureFixture) -> None:
    code = gir.cli.main(["run", str(REPO / "examples" / "mlp.gir"), "-e", "mlp_loss", "--device", "cpu",
                         "--repeat", "3"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"median of 2 repeated runs: [\d.]+ ms \(cpu\)", out), out


@pytest.mark.parametrize("emit", ["llvm", "asm", "obj"])
def test_cli_compile_emits(emit: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / f"mlp.{emit}"
    code = gir.cli.main(["compile", str(REPO / "examples" / "mlp.gir"), "-e", "mlp_grads", "--emit", emit,
                         "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    data = out.read_bytes()
    if emit == "obj":
        assert data.startswith(b"\x7fELF")
    elif emit == "llvm":
        assert b"define" in data and b"gir_main" in data
    else:
        assert b"gir_main" in data


def test_cli_compile_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = gir.cli.main(["compile", str(REPO / "examples" / "mlp.gir"), "-e", "mlp_loss", "--emit", "obj",
                         "-o", str(tmp_path / "no" / "such" / "dir" / "x.o")])
    err = capsys.readouterr().err
    assert code == 1 and "cannot write" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["run", "examples/rnn.gir", "-e", "nope", "--device", "cpu"],
    ["compile", "examples/rnn.gir", "-e", "nope", "--emit", "obj", "-o", "OUT"],
])
def test_cli_errors_exit_1_without_traceback(argv: list[str], tmp_path: Path) -> None:
    argv = [str(tmp_path / "x.o") if a == "OUT" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "gir.cli", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "error: no function @nope" in proc.stderr
    assert not (tmp_path / "x.o").exists()



SCAN_WEIGHTS = """\
func @f(%h0: tensor<4x6xDT>, %w: tensor<6x5xDT>, %v: tensor<6x5xDT>) -> (tensor<4x6xDT>, tensor<4x5xDT>) {
  %vt = transpose %v {perm = [1, 0]} : tensor<5x6xDT>
  %h = scan length 5 () carry (%c = %h0) {
    %p = matmul %c, %w : tensor<4x5xDT>
    %q = matmul %p, %vt : tensor<4x6xDT>
    %n = tanh %q : tensor<4x6xDT>
    yield (%n)
  } : tensor<4x6xDT>
  %last = matmul %h, %w : tensor<4x5xDT>
  return %h, %last
}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_openblas_copy_path_in_both_orientations(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """openblas-copy on a loop-invariant weight read as is (c @ w) and transposed (p @ v^T),
    each copied once before the loop to the other orientation: the same results as the
    interpreter; the product outside the loop keeps the plain path."""
    if not blas.has_transpose_copy():
        pytest.skip("this OpenBLAS has no ?omatcopy_")
    monkeypatch.setenv("GIR_GEMM_PATH", "openblas-copy")
    fn = run_both(SCAN_WEIGHTS.replace("DT", dtype), "f", seed=4, rtol=RTOL[dtype] if dtype == "f64" else 1e-5)
    assert fn.stats.gemm_paths == {"openblas-copy": 2, "openblas": 1}, fn.stats
    assert fn.stats.pack_calls == 2 and fn.stats.gemm_calls == 11, fn.stats


@pytest.mark.parametrize("tb", [False, True])
def test_gemm_caller_openblas_copy_equals_numpy(tb: bool) -> None:
    """The measuring harness's openblas-copy caller computes the same product as NumPy (the
    copy it makes outlives the call)."""
    if not blas.has_transpose_copy():
        pytest.skip("this OpenBLAS has no ?omatcopy_")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 7)).astype(np.float32)
    b = rng.standard_normal((3, 7) if tb else (7, 3)).astype(np.float32)
    c = np.zeros((4, 3), np.float32)
    call = blas.gemm_caller("openblas-copy", "f32", 4, 3, 7, False, tb, a, b, c)
    call()
    np.testing.assert_allclose(c, a @ (b.T if tb else b), rtol=1e-5)


def test_one_candidate_is_chosen_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a single candidate path (no MKL, not in a loop) nothing is measured or queued."""
    from gir.backend.cpu import snapshot
    from gir.backend.cpu.schedule import plan
    from gir.config import current

    monkeypatch.setattr(blas, "_candidates", lambda packable: ["openblas"])
    monkeypatch.setattr(blas, "path_times", lambda *params: pytest.fail("measured a shape with one path"))
    monkeypatch.setattr(blas, "measure_later", lambda params: pytest.fail("queued a shape with one path"))
    monkeypatch.delenv("GIR_GEMM_PATH", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "background")
    f = gir.parse("func @f(%a: tensor<3x5xf32>, %b: tensor<5x4xf32>) -> tensor<3x4xf32> {\n"
                  "  return %a @ %b\n}\n").functions["f"]
    measured, missing = snapshot.take(f, current())
    schedule = plan(f, None, measured, current())
    assert not missing and [g.path for g in schedule.gemms] == ["openblas"] and not schedule.provisional
    assert blas.is_measured([("f32", 3, 4, 5, False, False, False)])


def test_a_measurement_finishing_while_lowering_changes_no_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A background measurement can finish between the scan packing (or copying) a weight and
    the GEMM's lowering (it once asserted: 'the enclosing scan copies this weight before its
    loop', in tests/test_accepted_programs.py under CI). The lowering follows the schedule, made
    from one snapshot of the times before it starts (snapshot.py): it never asks BLAS's times
    again, so a measurement finishing meanwhile cannot change a path."""
    from gir.backend.cpu import snapshot

    monkeypatch.delenv("GIR_GEMM_PATH", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "background")
    monkeypatch.setenv("GIR_CACHE", "0")  # compiled here, not loaded
    taken: list[bool] = []
    real_take = snapshot.take

    def take(*args):  # noqa: ANN002, ANN202
        found = real_take(*args)
        taken.append(True)
        return found

    def times(dtype, m, n, k, ta, tb, packable):  # noqa: ANN001, ANN202
        assert not taken, "the lowering asked for GEMM times after the schedule's snapshot"
        return {c: 1.0 if c == "openblas" else 2.0 for c in blas._candidates(packable)}

    monkeypatch.setattr(snapshot, "take", take)
    monkeypatch.setattr(blas, "path_times", times)
    fn = run_both(SCAN_WEIGHTS.replace("DT", "f32"), "f", seed=5, rtol=1e-5)
    assert taken and fn.stats.gemm_paths == {"openblas": 3}, fn.stats
