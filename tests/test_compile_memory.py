"""Memory per compile: what a process compiling many shapes keeps (issue 31).

llvmlite never freed a pass manager of its new pass manager API (`ModulePassManager` inherits
`ObjectRef._dispose`, a no-op, before `NewPassManager._dispose`), so every compile kept its whole
-O3 pipeline: about 0.23 MB for a small function, 0.78 MB for examples/rnn.gir's gradients, per
compiled program, for the life of the process. `llvm_jit.run_and_free` frees it. Then a
`gir.jit` function kept every specialisation it compiled (about 0.15 MB each for a small
function): at most GIR_MAX_SPECIALISATIONS are kept now, the least recently used evicted and
freed (driver/specialisations.py). LLVM modules are parsed into a context of their own (the
global one kept every compile's constants), and the type memo of ir/ops.py starts again when
full. docs/reliability.md has the measurements.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Iterator

import gir
import llvmlite.binding as llvm
import numpy as np
import pytest
from gir.backend.cpu import llvm_jit
from gir.testing import assert_all_close

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")

SOURCE = ("func @f(%x: tensor<16x8xf32>, %w: tensor<8xf32>) -> tensor<f32> {\n"
          "  return sum(tanh(%x * %w + 1.0) * %x)\n}\n")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_200_o3_compiles_leave_the_resident_memory_flat() -> None:
    """200 runs of the -O3 pipeline on a small function (about 20 ms each): 45 MB of growth
    before the fix, under 1 MB after. The bound, 10 MB, leaves room for the allocator."""
    ir = gir.jit(SOURCE, "f", device="cpu").llvm_ir

    def compile_once() -> None:
        mod = llvm.parse_assembly(ir)
        llvm_jit.optimize(mod, 3)
        llvm_jit.target_machine().emit_object(mod)

    for _ in range(20):  # the allocator's and LLVM's one-time state
        compile_once()
    gc.collect()
    before = rss_mb()
    for _ in range(200):
        compile_once()
    gc.collect()
    grown = rss_mb() - before
    assert grown < 10, f"{grown:.1f} MB more resident memory after 200 compiles"


def test_run_and_free_disposes_the_pass_manager_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism: the pass manager is disposed (by llvmlite's own dispose function) once,
    and detached, so that its finaliser disposes nothing again. (Other pass managers may be
    disposed meanwhile: -O3 compiles of earlier tests finish in the background.)"""
    from llvmlite.binding.newpassmanagers import NewPassManager

    mod = llvm.parse_assembly(gir.jit(SOURCE, "f").llvm_ir)
    pb = llvm.create_pass_builder(llvm_jit.target_machine(), llvm.create_pipeline_tuning_options(speed_level=1))
    pm = pb.getModulePassManager()
    disposed: list[bool] = []
    real = NewPassManager._dispose
    monkeypatch.setattr(NewPassManager, "_dispose", lambda self: (disposed.append(self is pm), real(self)))
    llvm_jit.run_and_free(pm, mod, pb)
    assert disposed.count(True) == 1 and pm.closed
    pm.close()  # what its finaliser does: nothing more is disposed
    assert disposed.count(True) == 1


SHAPED = ("func @f(%x: tensor<?x8xf32>, %w: tensor<8xf32>) -> tensor<f32> {\n"
          "  return sum(tanh(%x * %w + 1.0) * %x)\n}\n")


@pytest.fixture
def compiles_here(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every call compiles (no cache), each `?` size a specialisation of its own (GIR_LENGTHS=0),
    in this process at one LLVM level (no background job holds a function): -O1, which keeps
    each compile short (the -O3 pipeline's own memory is the first test's)."""
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GIR_CACHE", "0")
    monkeypatch.setenv("GIR_LENGTHS", "0")
    monkeypatch.setenv("GIR_LLVM_OPT", "1")
    yield
    gc.collect()


def _grow_over(calls: int, call: object) -> float:
    """MB of resident memory added by calls of call(i) (a warm-up of 20 first). The cyclic
    collector runs after each: what is measured is what stays, not what Python's collector
    has not reached yet (without it, the first hundred compiles of a small process add about
    13 MB of garbage awaiting a full collection, once). The objects alive before are frozen
    (gc.freeze) so that each collection scans only what the calls made: in the whole suite's
    process, with every test's modules loaded, a full collection took about 0.4 s and these
    two tests 135 s instead of 12 s."""
    gc.collect()
    gc.freeze()
    try:
        for i in range(20):
            call(10_000 + i)  # type: ignore[operator]
            gc.collect()
        before = rss_mb()
        for i in range(calls):
            call(i)  # type: ignore[operator]
            gc.collect()
        return rss_mb() - before
    finally:
        gc.unfreeze()


def test_200_shapes_of_one_jit_function_keep_the_memory_flat(compiles_here: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """200 whole `gir.jit` compiles (specialise, passes, lowering, -O3, loading, a call) of
    distinct shapes of one function: 13 MB of growth when every specialisation was kept (27 MB
    at -O3), under 1 MB with 8 kept. The bound, 5 MB, leaves room for the allocator."""
    monkeypatch.setenv("GIR_MAX_SPECIALISATIONS", "8")
    fn = gir.jit(SHAPED, "f")
    w = np.linspace(-1, 1, 8, dtype=np.float32)
    grown = _grow_over(200, lambda i: fn(np.ones((i + 1, 8), np.float32), w))
    assert fn.specialisations_kept == 8 and fn.specialisations_evicted == 220 - 8
    assert grown < 5, f"{grown:.1f} MB more resident memory after 200 compiles"


def test_100_jit_functions_dropped_after_use_leave_the_memory_flat(compiles_here: None) -> None:
    """`gir.jit` objects, each compiling one shape and dropped: each compile's LLVM modules,
    context, engine and Python objects are freed (about 10 KB a compile stays: the memo of
    types). A guard: this held before the bound too (the pass managers were freed already)."""
    w = np.ones(8, np.float32)
    grown = _grow_over(100, lambda i: gir.jit(SHAPED, "f")(np.ones((i + 1, 8), np.float32), w))
    assert grown < 6, f"{grown:.1f} MB more resident memory after 100 compiles"


def test_eviction_keeps_the_bound_and_evicted_shapes_compile_again(compiles_here: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Past GIR_MAX_SPECIALISATIONS the least recently used specialisation goes (a recently
    called one stays), its code is freed once nothing holds it, and a call with its shapes
    compiles it again: every result equals the interpreter's."""
    monkeypatch.setenv("GIR_MAX_SPECIALISATIONS", "3")
    fn = gir.jit(SHAPED, "f")
    reference = gir.jit(SHAPED, "f", device="interp")
    rng = np.random.default_rng(31)
    w = rng.standard_normal(8).astype(np.float32)
    xs = {n: rng.standard_normal((n, 8)).astype(np.float32) for n in (1, 2, 3, 4, 5)}
    for n in (1, 2, 3):
        assert_all_close(fn(xs[n], w), reference(xs[n], w))
    first = weakref.ref(fn.compiled)  # n = 3's
    fn(xs[1], w)  # 1 is used again: 2 is now the least recently used
    for n in (4, 5):
        assert_all_close(fn(xs[n], w), reference(xs[n], w))
    assert fn.specialisations_kept == 3 and fn.specialisations_evicted == 2 and fn.specialisations == 5
    kept = {shape[0][0] for shape in fn._compiled._found}
    assert kept == {1, 4, 5}, kept
    gc.collect()
    assert first() is None, "evicted code is still referenced"
    for n in (2, 3, 5, 3):
        assert_all_close(fn(xs[n], w), reference(xs[n], w))
    assert fn.specialisations == 7 and fn.specialisations_kept == 3  # 2 and 3 again; 5 and 3 kept


LOOP = """
func @f(%xs: tensor<?x?x4xf64>, %w: tensor<4x4xf64>) -> tensor<f64> {
  %loss = constant 0.0 : tensor<f64>
  for %x in %xs {
    %loss = %loss + sum(tanh(%x @ %w))
  }
  return %loss
}
"""


def test_evicted_code_for_every_length_is_dropped_and_made_again(compiles_here: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Code for every length (GIR_LENGTHS=1; each batch size its own) is kept under the shapes
    of its first call and, once a second length calls it, under its generic key. Evicting the
    first key (used once) keeps the code while the generic key holds it; evicting both drops it
    from the function's tables, and its batch's next call makes code for every length again.
    Results equal the interpreter's."""
    monkeypatch.setenv("GIR_LENGTHS", "1")
    monkeypatch.setenv("GIR_MAX_SPECIALISATIONS", "2")
    fn = gir.jit(LOOP, "f")
    reference = gir.jit(LOOP, "f", device="interp")
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 4))
    calls = [(1, 2, 1), (1, 5, 1), (2, 2, 2), (1, 7, 2), (2, 5, 2), (3, 2, 3), (3, 5, 3), (1, 2, 4), (1, 9, 4)]
    for batch, t, made in calls:  # made: specialisations compiled after the call
        xs = rng.standard_normal((t, batch, 4))
        assert_all_close(fn(xs, w), reference(xs, w), rtol=1e-9)
        assert fn.stats.compile.lengths.startswith("every length"), fn.stats.compile.lengths
        assert fn.specialisations == made, (batch, t)
        assert fn.specialisations_kept <= 2 and len(fn._every_length) <= 2
        assert all(k in fn._every_length for k in fn._served.values())


def test_a_python_function_keeps_at_most_the_bound(compiles_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_MAX_SPECIALISATIONS", "2")

    def f(x):
        return (x * 2.0).sum()

    fn = gir.jit(f)
    for n in (1, 2, 3, 4, 1):
        x = np.arange(n * 3, dtype=np.float64).reshape(n, 3)
        assert float(fn(x)) == pytest.approx(float((x * 2.0).sum()))
    assert fn.specialisations_kept == 2 and fn.specialisations == 5 and fn.specialisations_evicted == 3


def test_compiles_parse_llvm_ir_into_a_context_of_their_own(compiles_here: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """LLVM's global context keeps every constant and type a module uniqued in it for the life
    of the process (about 3 KB per compile of a small function); each compile's own context is
    freed with its module. (An engine's empty module stays in the global context: it uniques
    nothing, and an engine disposes its modules after llvmlite has dropped their contexts.)"""
    contexts: list[object] = []
    real = llvm.parse_assembly

    def parse(ir: str, context: object = None) -> llvm.ModuleRef:
        if ir:
            contexts.append(context)
        return real(ir, context)

    monkeypatch.setattr(llvm, "parse_assembly", parse)
    fn = gir.jit(SHAPED, "f")
    fn(np.ones((3, 8), np.float32), np.ones(8, np.float32))
    assert fn.asm
    assert len(contexts) == 2 and all(c is not None and c is not llvm.get_global_context() for c in contexts), contexts


def test_the_type_memo_starts_again_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo of inferred types is bounded and keeps memoizing (it had stopped growing at its
    bound and then memoized nothing new)."""
    from gir.ir import ops

    monkeypatch.setattr(ops, "_INFERRED", {})
    monkeypatch.setattr(ops, "_INFERRED_LIMIT", 4)
    for n in range(1, 11):
        gir.parse(f"func @g(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{\n  return tanh(%x)\n}}\n")
        assert 0 < len(ops._INFERRED) <= 4
    newest = gir.ir.types.TensorType((10,), "f32")
    assert any(newest in key[1] for key in ops._INFERRED), list(ops._INFERRED)


def _mapped_libraries() -> int:
    """How many of native.load's libraries (compile-cache hits) this process has mapped."""
    with open("/proc/self/maps") as f:
        return len({word for line in f for word in line.split() if "load.tmp." in word})


def test_evicted_code_from_the_compile_cache_closes_its_library(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile-cache hit maps the entry's shared library (backend/cpu/native.py); evicting
    the specialisation closes it (dlclose), so a process cycling through many cached shapes
    maps at most the bound's libraries."""
    from gir.backend.cpu import native

    if native._linker() is None:
        pytest.skip("no system linker: hits load objects with LLVM")
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.setenv("GIR_LENGTHS", "0")
    monkeypatch.setenv("GIR_LLVM_TIER", "0")  # final code at once: stored with its library
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    w = np.ones(8, np.float32)
    first = gir.jit(SHAPED, "f")
    for n in range(1, 7):
        first(np.ones((n, 8), np.float32), w)
    del first
    gc.collect()
    before = _mapped_libraries()
    monkeypatch.setenv("GIR_MAX_SPECIALISATIONS", "2")
    fn = gir.jit(SHAPED, "f")
    reference = gir.jit(SHAPED, "f", device="interp")
    for n in range(1, 7):
        x = np.linspace(-1, 1, n * 8, dtype=np.float32).reshape(n, 8)
        assert_all_close(fn(x, w), reference(x, w))
        assert fn.stats.compile.cache == "hit", fn.stats.compile.cache
    gc.collect()
    assert fn.specialisations_evicted == 4 and _mapped_libraries() - before == 2


def test_a_dropped_jit_function_is_freed_without_the_cyclic_collector(compiles_here: None) -> None:
    """Its code is freed when the last reference goes, not at the collector's next full run
    (the eviction callback is held weakly: a bound method held strongly made a cycle)."""
    fn = gir.jit(SHAPED, "f")
    fn(np.ones((3, 8), np.float32), np.ones(8, np.float32))
    function, compiled = weakref.ref(fn), weakref.ref(fn.compiled)
    gc.disable()
    try:
        del fn
        assert function() is None and compiled() is None
    finally:
        gc.enable()
