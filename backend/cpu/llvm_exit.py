"""Process exit while another thread is inside LLVM.

Two daemon threads call LLVM: tiers.py's background -O3 compile and blas.py's measurer (it
compiles the `gir-packed` kernel, llvm_jit.packed_functions). Their exit handlers stop them at
their next stage or round, waiting a bounded time; a stage (LLVM's passes, instruction
selection) can take longer than that on a loaded machine. The process then ran its C++ static
destructors while the thread was still inside LLVM, and LLVM crashed: SIGSEGV or assertions
such as "DAG root value is not a chain!" (tests/test_llvm_exit.py reproduced it in most runs of
a process exiting while a thread compiled).

So the last exit handler of the CPU backend takes llvmlite's process-wide lock, the one every
LLVM call holds (llvmlite.binding.ffi), and keeps it: exit waits for the LLVM call in progress
(one stage, not the thread's whole job) and no other call starts. The handler is registered
when the backend package is imported, before blas.py's and tiers.py's handlers, so it runs
after them (atexit runs handlers last registered first): they still finish their jobs with the
lock free. The lock is reentrant, so this thread's own LLVM calls later in exit still run.

Known gap: the lock is llvmlite's private attribute (`lib._lock._lock`); where it is not
found, nothing is held (the race is back, nothing else changes).
"""

from __future__ import annotations

import atexit
import sys
from typing import Any


def llvm_lock() -> Any:
    """llvmlite's process-wide LLVM lock, if llvmlite is loaded (None otherwise: no thread can
    be inside LLVM through it, and exit must not load it)."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper = getattr(getattr(ffi, "lib", None), "_lock", None)
    lock = getattr(wrapper, "_lock", None)
    return lock if hasattr(lock, "acquire") else None


def hold_llvm() -> None:
    """Waits for the LLVM call in progress on any thread to end and keeps every other thread
    out of LLVM from now on (never released: the process is exiting)."""
    lock = llvm_lock()
    if lock is not None:
        lock.acquire()


def register() -> None:
    """Registers `hold_llvm` to run at exit (after every handler registered later)."""
    atexit.register(hold_llvm)
