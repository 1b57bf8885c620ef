"""A process exiting while a daemon thread is inside LLVM (backend/cpu/llvm_exit.py).

Before exit waited for LLVM's call in progress, most of these runs died in LLVM's code (SIGSEGV,
SIGABRT on assertions such as "DAG root value is not a chain!"): the process ran its static
destructors under the thread's instruction selection. Each case runs a few processes, since
one that exits between two LLVM calls passed before too.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import gir
import pytest

ROOT = str(pathlib.Path(gir.__file__).resolve().parent.parent)

MEASURER = """\
import sys, threading, time
from gir.backend.cpu import llvm_jit, packed_gemm
shape = packed_gemm.Shape("f32", 37, 1000, 61, True, True, 1.0)
def compile_forever():  # as blas.py's measurer compiles gir-packed kernels
    while True:
        llvm_jit.packed_functions(shape, 8)
threading.Thread(target=compile_forever, daemon=True).start()
time.sleep(float(sys.argv[1]))
"""

TIERED = """\
import sys
sys.path.insert(0, sys.argv[2])
import gir
from rnn_cases import bench_module
rnn = bench_module("rnn")
src = rnn.gir_source("gru", 5, 4, 3, 7)
p = rnn.make_inputs("gru", 5, 4, 3, 7, 0)
fn = gir.jit(src, "gru_grads")
fn(*([p["xs"]] + [p[n] for n in rnn.param_names("gru")]))
"""


def _exits_cleanly(script: str, args: list[str], env: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-c", script, *args], env={**os.environ, "PYTHONPATH": ROOT, **env},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "Assertion" not in run.stderr, (run.returncode, run.stderr[-2000:])


@pytest.mark.parametrize("delay", ["0.4", "0.7", "1.0"])
def test_exit_while_the_measurer_compiles(delay: str) -> None:
    _exits_cleanly(MEASURER, [delay], {})


@pytest.mark.parametrize("run", [0, 1])
def test_exit_while_the_final_tier_compiles(run: int, tmp_path: pathlib.Path) -> None:
    """No time to finish the -O3 compile (GIR_LLVM_EXIT_WAIT=0): the process exits in its
    instruction selection unless exit waits for the LLVM call."""
    _exits_cleanly(TIERED, [str(run), str(pathlib.Path(__file__).parent)],
                   {"GIR_CACHE_DIR": str(tmp_path), "GIR_LLVM_EXIT_WAIT": "0", "GIR_LLVM_TIER": "1",
                    "GIR_GEMM_MEASURE": "off"})


def test_the_llvm_lock_is_found() -> None:
    """llvm_exit reads llvmlite's private lock: a llvmlite that moved it would silently bring
    the crash back, so this fails instead."""
    from gir.backend.cpu import llvm_exit, llvm_jit

    llvm_jit.host()  # loads LLVM
    lock = llvm_exit.llvm_lock()
    assert lock is not None and lock.acquire(timeout=10)
    lock.release()
