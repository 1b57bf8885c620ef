"""A compiled function called from several Python threads at once: every result equals the
interpreter's, a run-time error is raised in the thread whose call made it and in no other.

The program is a training step: an RNN's loss and gradients (a forward scan and its reverse
scan, GEMMs with a loop-invariant weight, fused elementwise ops) and an integer division whose
divisor is zero in some calls. Every thread waits at a barrier, then calls the one shared
compiled function many times, cycling through inputs of its own (each checked against the
interpreter's result, computed once per input before the threads start); one thread in four
calls it with a zero divisor every third call and must get "integer division by zero" while
the others succeed.

- cpu: each thread has its own arena, pinned area (packed weights) and counters
  (backend/cpu/runtime.py); also with MKL's packed path forced, where every call packs its
  weights into the calling thread's pinned area.
- gpu (the CUDA simulator without a GPU): calls are serialised by a lock
  (backend/gpu/runtime.py); smaller sizes, fewer calls (the simulator runs every CUDA thread as
  a Python thread).
- `stats`: the last call the reading thread completed.

With one arena per function (before), 8 threads x 12 calls on the cpu got 53 to 83 of 96
calls wrong (wrong gradients, a lost or misplaced division error), 88 of 96 with the packed
path; the gpu test 10 of 12 (the simulator's launches failed: 'Thread' object has no
attribute 'blockIdx').
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import gir
import numpy as np
import pytest
from gir.backend.cpu import blas
from gir.testing import assert_all_close

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

PROGRAM = """
func @rnn_loss(%xs: tensor<TxBxHxf32>, %h0: tensor<BxHxf32>, %wx: tensor<HxHxf32>,
               %wh: tensor<HxHxf32>, %b: tensor<Hxf32>) -> tensor<f32> {
  %h = %h0
  %loss = constant 0.0 : tensor<f32>
  for %x in %xs {
    %h = tanh(%x @ %wx + %h @ %wh + %b)
    %loss = %loss + sum(%h * %h)
  }
  return %loss
}

func @train_step(%xs: tensor<TxBxHxf32>, %h0: tensor<BxHxf32>, %wx: tensor<HxHxf32>,
                 %wh: tensor<HxHxf32>, %b: tensor<Hxf32>, %n: tensor<Bxi32>, %d: tensor<Bxi32>)
    -> (tensor<f32>, tensor<HxHxf32>, tensor<HxHxf32>, tensor<Hxf32>, tensor<Bxi32>) {
  %loss, %dwx, %dwh, %db = grad @rnn_loss(%xs, %h0, %wx, %wh, %b) wrt (%wx, %wh, %b)
  return %loss, %dwx, %dwh, %db, %n / %d
}
"""


@dataclass(frozen=True)
class Size:
    steps: int
    batch: int
    hidden: int
    threads: int
    calls: int
    """Calls per thread."""

    def source(self) -> str:
        return PROGRAM.replace("TxBxH", f"{self.steps}x{self.batch}x{self.hidden}") \
            .replace("BxH", f"{self.batch}x{self.hidden}").replace("HxH", f"{self.hidden}x{self.hidden}") \
            .replace("<Hx", f"<{self.hidden}x").replace("<Bx", f"<{self.batch}x")


CPU = Size(steps=20, batch=16, hidden=64, threads=8, calls=12)
GPU = Size(steps=3, batch=2, hidden=4, threads=4, calls=3)


def inputs(size: Size, seed: int, zero_divisor: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    n = rng.integers(-1000, 1000, size.batch).astype(np.int32)
    d = rng.integers(1, 9, size.batch).astype(np.int32) * rng.choice(np.array([-1, 1], np.int32), size.batch)
    if zero_divisor:
        d[seed % size.batch] = 0
    return [f32(size.steps, size.batch, size.hidden), f32(size.batch, size.hidden), f32(size.hidden, size.hidden),
            f32(size.hidden, size.hidden), f32(size.hidden), n, d]


def failing(thread: int, call: int) -> bool:
    """Which calls divide by zero: every third call of one thread in four."""
    return thread % 4 == 1 and call % 3 == 2


VARIANTS = 4
"""Distinct inputs per thread, call c using variant c % VARIANTS (the interpreter's results
are what the test spends its time on)."""


def hammer(device: str, size: Size) -> None:
    """size.threads threads, size.calls calls each, on one compiled function; asserts that no
    result differs from the interpreter's and that exactly the failing calls raised."""
    source = size.source()
    interp = gir.jit(source, "train_step", device="interp")
    fn = gir.jit(source, "train_step", device=device)
    variants = {(t, v): inputs(size, 1000 * t + v, False) for t in range(size.threads) for v in range(VARIANTS)}
    want = {key: interp(*args) for key, args in variants.items()}
    zero_divisor = {t: inputs(size, 1000 * t + VARIANTS, True) for t in range(size.threads)}
    cases = {(t, c): zero_divisor[t] if failing(t, c) else variants[t, c % VARIANTS]
             for t in range(size.threads) for c in range(size.calls)}
    fn(*cases[0, 0])  # compile (and specialise) once, before the threads start
    barrier = threading.Barrier(size.threads)
    wrong: list[str] = []
    gemm_calls: list[int] = []

    def worker(t: int) -> None:
        barrier.wait()
        for c in range(size.calls):
            try:
                got = fn(*cases[t, c])
            except gir.GirError as e:
                if not (failing(t, c) and "integer division by zero at run time" in e.message):
                    wrong.append(f"thread {t} call {c}: unexpected {e.message}")
                continue
            if failing(t, c):
                wrong.append(f"thread {t} call {c}: divided by zero without an error")
                continue
            try:
                assert_all_close(got, want[t, c % VARIANTS], what=f"thread {t} call {c}")
            except AssertionError as e:
                wrong.append(str(e).splitlines()[0])
                continue
            gemm_calls.append(fn.stats.gemm_calls)  # this thread's call, whatever the others did

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(size.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    total = size.threads * size.calls
    assert not wrong, f"{len(wrong)} of {total} concurrent calls wrong:\n" + "\n".join(wrong[:10])
    assert len(set(gemm_calls)) == 1 and gemm_calls[0] > 0, sorted(set(gemm_calls))


@pytest.mark.parametrize("path", ["default", "mkl-packed", "gir-packed"])
def test_cpu_concurrent_calls(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "gir-packed":  # gir's kernel, split across OpenBLAS's pool from several callers at once
        monkeypatch.setenv("GIR_GEMM_PATH", "gir-packed")
    if path == "mkl-packed":
        if not blas.providers().has_mkl:
            pytest.skip("no MKL here: nothing is packed")
        monkeypatch.setenv("GIR_GEMM_PATH", "mkl-packed")
    hammer("cpu", CPU)


def test_cpu_stats_are_the_calling_threads() -> None:
    """`stats` is the last call the reading thread completed; a thread that completed none sees
    the last call completed by any thread. A failed call leaves the thread's stats alone."""
    fn = gir.jit(CPU.source(), "train_step")
    fn(*inputs(CPU, 0, False))
    compiled = fn.compiled
    mine = compiled.stats
    assert mine.gemm_calls > 0, mine
    seen: list[object] = []

    def other() -> None:
        seen.append(compiled.stats)  # none made here yet: the main thread's
        with pytest.raises(gir.GirError, match="integer division by zero"):
            compiled(*inputs(CPU, 1, True))
        seen.append(compiled.stats)
        compiled(*inputs(CPU, 2, False))
        seen.append(compiled.stats)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen[0] is mine and seen[1] is mine and seen[2] is not mine
    assert compiled.stats is mine  # this thread's, though another thread called since
    assert seen[2].gemm_calls == mine.gemm_calls


@pytest.mark.gpu
def test_gpu_concurrent_calls() -> None:
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")
    from gir.backend.gpu.device import get_device

    try:
        get_device()
    except gir.GirError as e:
        pytest.skip(f"no GPU backend here: {e.message}")
    hammer("gpu", GPU)


def test_a_new_shape_called_from_several_threads_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`?` dims: threads that call with the same new shape at once wait for one compile."""
    source = ("func @f(%x: tensor<?x4xf64>) -> tensor<?x4xf64> {\n"
              "  return tanh(%x) * 2.0\n}\n")
    fn = gir.jit(source, "f")
    compiles = []
    real = fn._compile
    monkeypatch.setattr(fn, "_compile", lambda shapes: compiles.append(shapes) or real(shapes))
    barrier = threading.Barrier(6)
    results: list[np.ndarray] = []
    x = np.linspace(-1, 1, 12).reshape(3, 4)

    def call() -> None:
        barrier.wait()
        results.append(fn(x)[0])

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiles == [((3, 4),)] and len(results) == 6
    for r in results:
        np.testing.assert_allclose(r, np.tanh(x) * 2.0, rtol=1e-12)


@pytest.mark.gpu
def test_two_specialisations_of_one_gpu_function_called_from_two_threads() -> None:
    """Each specialisation (a compiled `GPUFunction`) has its own lock, but the CUDA simulator's
    launches share process state (a kernel's `cuda` global is swapped for the launch): launches of
    two specialisations at once failed with "'Thread' object has no attribute 'blockIdx'". One
    process-wide lock (backend/gpu/device.py, SIMULATOR_LAUNCHES) serialises simulated launches."""
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")
    from gir.backend.gpu.device import get_device

    try:
        dev = get_device()
    except gir.GirError as e:
        pytest.skip(f"no GPU backend here: {e.message}")
    source = ("func @f(%x: tensor<?x3xf32>, %y: tensor<?x3xf32>) -> tensor<?x3xf32> {\n"
              "  return tanh(%x * %y + %x) - %y / (abs(%x) + 1.0)\n}\n")
    fn = gir.jit(source, "f", device="gpu")
    rng = np.random.default_rng(5)
    inputs = {rows: [rng.standard_normal((rows, 3)).astype(np.float32) for _ in range(2)] for rows in (5, 7)}
    want = {rows: gir.interpret(gir.parse(source), "f", *xs)[0] for rows, xs in inputs.items()}
    for xs in inputs.values():
        fn(*xs)  # both specialisations compiled before the threads start
    barrier, errors = threading.Barrier(2), []

    def calls(rows: int) -> None:
        barrier.wait()
        try:
            for _ in range(4 if dev.simulated else 50):
                assert_all_close(fn(*inputs[rows])[0], want[rows])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=calls, args=(rows,)) for rows in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, repr(errors[0])
