"""Tiered compilation (backend/cpu/tiers.py): a first compile runs quick code at once and
swaps to -O3 code compiled in the background; the compile cache holds the quick code at once,
then the -O3 code; GIR_LLVM_TIER=0 and an explicit GIR_LLVM_OPT give one compile as before.
Small programs; results checked against the interpreter on random inputs and against each
other across the swap.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.cpu import runtime, tiers
from gir.driver import compile_cache
from gir.ir.interpreter import random_inputs
from gir.support import cache

RNN = """\
func @loss(%xs: tensor<6x4x8xf32>, %h0: tensor<4x8xf32>, %wx: tensor<8x8xf32>, %wh: tensor<8x8xf32>,
           %b: tensor<8xf32>) -> tensor<f32> {
  %h = %h0
  %l = constant 0.0 : tensor<f32>
  for %x in %xs {
    %h = tanh(%x @ %wx + %h @ %wh + %b)
    %l = %l + sum(%h * %h)
  }
  return %l
}

func @grads(%xs: tensor<6x4x8xf32>, %h0: tensor<4x8xf32>, %wx: tensor<8x8xf32>, %wh: tensor<8x8xf32>,
            %b: tensor<8xf32>) -> (tensor<f32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8xf32>) {
  %l, %dwx, %dwh, %db = grad @loss(%xs, %h0, %wx, %wh, %b) wrt (%wx, %wh, %b)
  return %l, %dwx, %dwh, %db
}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GIR_CACHE_DIR", str(root))
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.delenv("GIR_LLVM_OPT", raising=False)
    monkeypatch.delenv("GIR_LLVM_TIER", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")  # the model's paths: no recompile for measured ones
    return root


def _oracle(inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The interpreter on the IR after the passes (autodiff expands `grad`)."""
    return list(gir.jit(RNN, "grads", device="interp")(*inputs))


def _inputs(seed: int) -> list[np.ndarray]:
    return random_inputs(gir.parse(RNN).functions["grads"], seed)


def _held_back(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Holds every background compile until the returned event is set (so a test sees the quick
    code first, deterministically)."""
    gate = threading.Event()
    run = tiers.FinalCompile.run_job

    def gated(self: tiers.FinalCompile) -> None:
        gate.wait(60)
        run(self)

    monkeypatch.setattr(tiers.FinalCompile, "run_job", gated)
    return gate


def _stored(root: Path) -> list[runtime.Code]:
    """The code of the object-code entries in the cache (objects/ and compiled/*.entry)."""
    found = []
    for path in sorted(root.glob("*/*.entry")):
        key = path.name[: -len(".entry")]
        entry = cache.load(path.parent.name, key)
        assert entry is not None
        found.append(runtime.Code.from_entry(*entry, path.parent.name))
    return found


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_quick_code_then_the_swap_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _held_back(monkeypatch)
    fn = gir.jit(RNN, "grads")
    inputs = [_inputs(seed) for seed in range(3)]
    want = [_oracle(a) for a in inputs]
    quick = [fn(*a) for a in inputs]
    assert fn.stats.compile.tier == "quick" and fn.compiled.tier == "quick"
    assert fn.stats.compile.opt_level == 0 and fn.compiled.code.info.opt_level == 0
    assert not fn.compiled.wait_for_final_code(0.05)  # held back: still the quick code
    gate.set()
    assert fn.compiled.wait_for_final_code(60), fn.compiled.final_error
    final = [fn(*a) for a in inputs]
    assert fn.stats.compile.tier == "final" and fn.stats.compile.opt_level == 3
    assert fn.compiled.code.info.tier == "final"
    for q, f, w in zip(quick, final, want):
        _close(list(q), w)
        _close(list(f), w)
        _close(list(f), list(q))
    assert "quick code" not in fn.stats.compile.describe()


def test_quick_code_is_stored_at_once_then_replaced(monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    """Issue 28, "store what ran": the quick code is in the compile cache before the -O3 code
    exists (a process ending now leaves a hit for the next: its store runs beside the first
    call, on a thread exit joins); the -O3 code replaces it."""
    gate = _held_back(monkeypatch)
    fn = gir.jit(RNN, "grads")
    assert fn.compiled.tier == "quick"
    assert compile_cache.wait_for_stores(60)
    stored = _stored(own_cache)
    assert len(stored) == 1 and stored[0].info.tier == "quick" and stored[0].info.opt_level == 0  # compiled/ only
    assert fn.stats.compile.preparing == "-O3 code"
    # A second lookup loads the quick entry at once (no wait) and follows this process's job.
    again = gir.jit(RNN, "grads")
    info = again.compiled.code.info
    assert info.from_cache == "compiled" and info.tier == "quick" and again.compiled.preparing == "-O3 code"
    assert again.compiled._final is fn.compiled._final
    a = _inputs(1)
    _close(list(again(*a)), _oracle(a))
    gate.set()
    assert fn.compiled.wait_for_final_code(60) and again.compiled.wait_for_final_code(60)
    shapes = tuple(tuple(x.shape) for x in _inputs(0))
    tiers.wait_for_key(compile_cache.specialisation_key(fn._cache_key, shapes))
    stored = _stored(own_cache)
    assert len(stored) == 2 and all(c.info.opt_level == 3 for c in stored)  # objects/ and compiled/
    assert all(c.optimized_ir == fn.compiled.optimized_ir for c in stored)
    assert again.compiled.optimized_ir == fn.compiled.optimized_ir and again.stats.compile.preparing == ""
    third = gir.jit(RNN, "grads")
    info = third.compiled.code.info
    assert info.from_cache == "compiled" and info.opt_level == 3 and info.tier == ""
    assert third.compiled.preparing == "" and third.compiled.compile_stats.preparing == ""
    _close(list(third(*a)), list(fn(*a)))
    assert third.stats.compile.cache == "hit" and third.stats.compile.tier == ""


def test_quick_code_never_replaces_better_code(monkeypatch: pytest.MonkeyPatch, own_cache: Path,
                                              tmp_path: Path) -> None:
    """Two processes missing at once: the one whose quick code is stored last must not replace
    the -O3 entry the other stored meanwhile."""
    monkeypatch.setenv("GIR_LLVM_TIER", "0")
    final = gir.jit(RNN, "grads")
    key = compile_cache.specialisation_key(final._cache_key, tuple(tuple(a.shape) for a in _inputs(0)))
    monkeypatch.setenv("GIR_LLVM_TIER", "1")
    gate = _held_back(monkeypatch)
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path / "elsewhere"))  # a miss: quick code
    quick = gir.jit(RNN, "grads")
    assert quick.compiled.tier == "quick"
    compile_cache.store_compiled(key, quick.compiled, root=str(own_cache))
    monkeypatch.setenv("GIR_CACHE_DIR", str(own_cache))
    entry = cache.load("compiled", key)
    assert entry is not None and runtime.Code.from_entry(*entry, "compiled").info.opt_level == 3
    gate.set()


def test_a_second_compile_never_waits() -> None:
    fn = gir.jit(RNN, "grads")  # not held back: the -O3 code may or may not be there yet
    again = gir.jit(RNN, "grads")
    info = again.compiled.code.info
    assert info.from_cache == "compiled" and info.opt_level in (0, 3)
    assert fn.compiled.wait_for_final_code(60) and again.compiled.wait_for_final_code(60)
    assert again.compiled.code.info.opt_level == 3


def test_four_threads_calling_through_the_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _held_back(monkeypatch)
    fn = gir.jit(RNN, "grads")
    inputs = [_inputs(seed) for seed in range(4)]
    want = [_oracle(a) for a in inputs]
    errors: list[BaseException] = []
    tiers_seen: list[set[str]] = [set() for _ in range(4)]
    start = threading.Barrier(5)

    def caller(i: int) -> None:
        try:
            start.wait()
            deadline = time.monotonic() + 60
            while "final" not in tiers_seen[i] and time.monotonic() < deadline:  # call across the swap
                _close(list(fn(*inputs[i])), want[i])
                tiers_seen[i].add(fn.stats.compile.tier)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    start.wait()
    gate.set()  # the swap happens while the four call
    assert fn.compiled.wait_for_final_code(60)
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert any("quick" in s for s in tiers_seen) and all("final" in s for s in tiers_seen), tiers_seen
    for i in range(4):  # every thread, after the swap, runs the final code
        _close(list(fn(*inputs[i])), want[i])
    assert fn.stats.compile.tier == "final"


def test_two_core_schedule_swaps_both_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")  # gir_worker on its own thread, whatever the model says
    gate = _held_back(monkeypatch)
    fn = gir.jit(RNN, "grads")
    a = _inputs(2)
    want = _oracle(a)
    quick_entry = fn.compiled._entry
    _close(list(fn(*a)), want)
    gate.set()
    assert fn.compiled.wait_for_final_code(60)
    final_entry = fn.compiled._entry
    assert final_entry is not quick_entry and final_entry.code.info.tier == "final"
    assert (final_entry.worker is None) == (quick_entry.worker is None)
    _close(list(fn(*a)), want)


@pytest.mark.parametrize("switch", [("GIR_LLVM_TIER", "0"), ("GIR_LLVM_OPT", "3"), ("GIR_LLVM_OPT", "1")])
def test_tiering_off_compiles_once(monkeypatch: pytest.MonkeyPatch, switch: tuple[str, str]) -> None:
    monkeypatch.setenv(*switch)
    submitted: list[object] = []
    monkeypatch.setattr(tiers, "submit", submitted.append)
    fn = gir.jit(RNN, "grads")
    level = 3 if switch[0] == "GIR_LLVM_TIER" else int(switch[1])
    info = fn.compiled.code.info
    assert not submitted and info.tier == "" and info.opt_level == level and info.from_cache == ""
    assert fn.compiled.wait_for_final_code(0) and fn.compiled.code.final is None
    a = _inputs(0)
    _close(list(fn(*a)), _oracle(a))
    assert fn.stats.compile.tier == "" and fn.stats.compile.opt_level == level
    assert gir.jit(RNN, "grads").compiled.code.info.from_cache == "compiled"  # stored at once


def test_a_failed_final_compile_keeps_the_quick_code(monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    def broken(self: tiers.FinalCompile) -> None:
        self.error = RuntimeError("no -O3 today")
        self._finish()

    monkeypatch.setattr(tiers.FinalCompile, "run_job", broken)
    fn = gir.jit(RNN, "grads")
    assert not fn.compiled.wait_for_final_code(60)
    assert "no -O3 today" in str(fn.compiled.final_error) and fn.compiled.tier == "quick"
    a = _inputs(0)
    _close(list(fn(*a)), _oracle(a))
    assert compile_cache.wait_for_stores(60)
    stored = _stored(own_cache)  # the quick code, stored beside the first call, is what the cache keeps
    assert len(stored) == 1 and stored[0].info.tier == "quick"


def test_gir_run_waits_so_its_cache_fills(tmp_path: Path, own_cache: Path, capsys: pytest.CaptureFixture) -> None:
    from gir.cli import main

    path = tmp_path / "rnn.gir"
    path.write_text(RNN)
    assert main(["run", str(path), "--repeat", "3"]) == 0
    stored = _stored(own_cache)  # waited for the -O3 code: both caches hold it
    assert len(stored) == 2 and all(c.info.opt_level == 3 for c in stored)
    assert main(["run", str(path), "-v"]) == 0
    assert "code cache: hit" in capsys.readouterr().err


def test_the_final_code_is_the_untiered_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap brings the very object a compile without tiering makes (so run time after the
    swap is unchanged): same IR after LLVM's passes, same machine code."""
    monkeypatch.setenv("GIR_CACHE", "0")
    tiered = gir.jit(RNN, "grads")
    assert tiered.compiled.wait_for_final_code(60)
    monkeypatch.setenv("GIR_LLVM_TIER", "0")
    once = gir.jit(RNN, "grads")
    assert once.compiled.code.info.tier == "" and tiered.compiled.code.info.tier == "final"
    assert tiered.compiled.optimized_ir == once.compiled.optimized_ir
    assert tiered.compiled.code.obj == once.compiled.code.obj
