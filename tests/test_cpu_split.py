"""The CPU backend's split schedule (backend/cpu/team.py): a scan body's elementwise loops run
half on the calling thread, half on OpenBLAS's pool thread (blas_level1_thread).

The interpreter is the oracle: programs compiled with every splittable loop split
(GIR_CPU_SPLIT=1) give the interpreter's results, call after call, in float32 and float64,
with odd row counts, broadcast operands, several results per loop, a loop writing where it
reads, `?` batch sizes, and from two threads at once; `fn.stats.schedule["split"]` says
which loops were split and why.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import gir
import numpy as np
import pytest
from gir.testing import assert_all_close
from rnn_cases import training_step


def _split_notes(fn) -> list:  # noqa: ANN001
    notes = fn.stats.schedule.get("split")
    if isinstance(notes, str) and "GIR_CPU_SPLIT" not in notes:
        pytest.skip(f"split schedule unavailable here: {notes}")
    return notes if isinstance(notes, list) else []


@pytest.mark.parametrize("model,batch", [("rnn", 3), ("gru", 5), ("lstm", 2), ("lstm", 7)])
def test_training_step_split_matches_interpreter(model: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    src, args, want = training_step(model, 6, batch, 4, 9)
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    fn = gir.jit(src, f"{model}_grads")
    for _ in range(3):
        assert_all_close(fn(*args), want, what=model)
    notes = _split_notes(fn)
    assert notes and all(n["used"] for n in notes), fn.stats.schedule
    assert sum(n["split_loops"] for n in notes) >= 2
    assert fn.stats.schedule["overlap"] == "off: the split schedule (team.py) uses the second core"
    monkeypatch.setenv("GIR_CPU_SPLIT", "0")
    off = gir.jit(src, f"{model}_grads")
    assert_all_close(off(*args), want, what=f"{model} unsplit")
    assert off.stats.schedule["split"] == "off: GIR_CPU_SPLIT=0"


LOOPS = """
func @f(%xs: tensor<5x{R}x{C}x{T}>, %h0: tensor<{R}x{C}x{T}>, %b: tensor<{C}x{T}>)
    -> (tensor<5x{R}x{C}x{T}>, tensor<5x{R}x{C}x{T}>, tensor<{R}x{C}x{T}>) {{
  %h = %h0
  for %x in %xs {{
    %a = tanh(%x * %h + %b)
    %s = sigmoid(%a - %x) * %h
    %h = %a * 0.5 + %s
    collect %a into %as
    collect %s into %ss
  }}
  return %as, %ss, %h
}}
"""


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("rows,cols", [(2, 3), (7, 33), (33, 129), (64, 65)])
def test_loops_split_match_interpreter(dtype: str, rows: int, cols: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Odd and even row counts, a broadcast bias, two stacked results, a carry read and written."""
    src = LOOPS.format(R=rows, C=cols, T=dtype)
    rng = np.random.default_rng(rows * cols)
    np_type = np.float32 if dtype == "f32" else np.float64
    args = [rng.standard_normal(s).astype(np_type) for s in ((5, rows, cols), (rows, cols), (cols,))]
    want = gir.jit(src, "f", device="interp")(*args)
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    fn = gir.jit(src, "f")
    for _ in range(2):
        assert_all_close(fn(*args), want, what=f"{dtype} {rows}x{cols}")
    notes = _split_notes(fn)
    assert notes and notes[0]["used"] and notes[0]["split_loops"] >= 1, fn.stats.schedule


def test_auto_splits_only_large_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    from gir.backend.cpu import team

    monkeypatch.delenv("GIR_CPU_SPLIT", raising=False)
    rng = np.random.default_rng(1)
    for rows, cols, large in ((4, 8, False), (32, 256, True)):
        src = LOOPS.format(R=rows, C=cols, T="f32")
        args = [rng.standard_normal(s).astype(np.float32) for s in ((5, rows, cols), (rows, cols), (cols,))]
        fn = gir.jit(src, "f")
        assert_all_close(fn(*args), gir.jit(src, "f", device="interp")(*args))
        notes = _split_notes(fn)
        assert notes[0]["used"] is large, notes
        assert notes[0]["why"] == f"loops of at least {team.MIN_ELEMENTS} elements"


def test_dynamic_batch_is_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """`?` rows: not split (a loop is split only with static shapes), and still right."""
    src = LOOPS.format(R="?", C=40, T="f64").replace("tensor<5x?", "tensor<?x?")
    rng = np.random.default_rng(2)
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    fn = gir.jit(src, "f")
    ref = gir.jit(src, "f", device="interp")
    for steps, rows in ((3, 5), (2, 8), (4, 1)):
        args = [rng.standard_normal(s) for s in ((steps, rows, 40), (rows, 40), (40,))]
        assert_all_close(fn(*args), ref(*args), what=f"{steps}x{rows}")


def test_two_threads_call_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread has its own workspace; both hand loops to OpenBLAS's pool at once."""
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    src = LOOPS.format(R=32, C=96, T="f32")
    fn = gir.jit(src, "f")
    rng = np.random.default_rng(3)
    inputs = [[rng.standard_normal(s).astype(np.float32) for s in ((5, 32, 96), (32, 96), (96,))] for _ in range(2)]
    ref = gir.jit(src, "f", device="interp")
    wants = [ref(*a) for a in inputs]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for _ in range(40):
                assert_all_close(fn(*inputs[k]), wants[k], what=f"thread {k}")
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a call hung"
    assert not errors, errors
    assert _split_notes(fn)[0]["used"]


@pytest.mark.parametrize("pool", ["", "1"])
def test_process_exits_after_split_calls(pool: str) -> None:
    """No thread of gir's to end: the process exits. With OpenBLAS's pool started with one
    thread (OPENBLAS_NUM_THREADS=1) nothing is split (its other half would wait forever)."""
    code = (f"import numpy as np, gir\nsrc = {LOOPS.format(R=16, C=64, T='f32')!r}\n"
            "fn = gir.jit(src, 'f')\n"
            "args = [np.ones(s, np.float32) for s in ((5, 16, 64), (16, 64), (64,))]\n"
            "for _ in range(3): fn(*args)\nprint(fn.stats.schedule['split'])\n")
    env = {**os.environ, "GIR_CPU_SPLIT": "1"}
    if pool:
        env["OPENBLAS_NUM_THREADS"] = pool
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if pool:
        assert "off:" in done.stdout, done.stdout


def test_loop_computed_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `fuse`, memplan computes `tanh(%a)` in place of %a (the same arena offset): the
    task's run-time overlap check then runs the copy of the loop without `noalias`."""
    from gir.passes.pipeline import DEFAULT_PIPELINE

    src = """
    func @f(%xs: tensor<6x9x40xf32>, %h0: tensor<9x40xf32>) -> tensor<9x40xf32> {
      %h = %h0
      for %x in %xs {
        %a = %h * %x
        %b = tanh(%a)
        %h = %b * %x
      }
      return %h
    }
    """
    rng = np.random.default_rng(4)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((6, 9, 40), (9, 40))]
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    fn = gir.jit(src, "f", pipeline=f"{DEFAULT_PIPELINE},inline,canonicalize,memplan")
    for _ in range(2):
        assert_all_close(fn(*args), gir.jit(src, "f", device="interp")(*args))
    assert _split_notes(fn)[0]["split_loops"] == 3


def test_one_blas_thread_set_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Code compiled with two BLAS threads, called with one set (threadpoolctl): each split
    loop reads OpenBLAS's setting and runs whole on the calling thread."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    src = LOOPS.format(R=32, C=96, T="f32")
    fn = gir.jit(src, "f")
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 32, 96), (32, 96), (96,))]
    want = gir.jit(src, "f", device="interp")(*args)
    assert_all_close(fn(*args), want)
    with threadpoolctl.threadpool_limits(limits=1):
        for _ in range(2):
            assert_all_close(fn(*args), want, what="one BLAS thread")
    assert_all_close(fn(*args), want, what="two again")
    assert _split_notes(fn)[0]["used"]


def test_split_code_from_the_compile_cache(tmp_path: pathlib.Path) -> None:
    """A second process loads the split code from the cache (the shared library where there is
    a linker) without probing OpenBLAS or loading LLVM, and gets the interpreter's results."""
    code = (f"import sys, numpy as np, gir\nsrc = {LOOPS.format(R=24, C=64, T='f32')!r}\n"
            "fn = gir.jit(src, 'f')\n"
            "rng = np.random.default_rng(0)\n"
            "args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 24, 64), (24, 64), (64,))]\n"
            "got = fn(*args)\nwant = gir.jit(src, 'f', device='interp')(*args)\n"
            "err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))\n"
            "print(fn.compiled.from_cache, fn.stats.schedule['split'][0]['used'], err < 1e-4)\n")
    env = {**os.environ, "GIR_CPU_SPLIT": "1", "GIR_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
            for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr
    assert runs[0].stdout.split() == ["False", "True", "True"], runs[0].stdout
    assert runs[1].stdout.split() == ["True", "True", "True"], runs[1].stdout
