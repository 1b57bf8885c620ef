"""Native memory per compile: what LLVM's -O3 pipeline leaves behind.

llvmlite never freed a pass manager of its new pass manager API (`ModulePassManager` inherits
`ObjectRef._dispose`, a no-op, before `NewPassManager._dispose`), so every compile kept its whole
-O3 pipeline: about 0.23 MB for a small function, 0.78 MB for examples/rnn.gir's gradients, per
compiled program, for the life of the process (issue 31). `llvm_jit.run_and_free` frees it.
docs/reliability.md has the measurements, and what else a compile leaves behind.
"""

from __future__ import annotations

import gc
import os
import sys

import gir
import llvmlite.binding as llvm
import pytest
from gir.backend.cpu import llvm_jit

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
