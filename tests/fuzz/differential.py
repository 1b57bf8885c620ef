"""Differential campaign: random well-typed programs (tests/fuzz/programs.py) run by the
interpreter, the CPU backend and the GPU backend (Numba's CUDA simulator unless
NUMBA_ENABLE_CUDASIM=0), `grad` programs against central finite differences in float64, and
one compiled function called from several threads against its sequential results.

    nice -n 19 python tests/fuzz/differential.py --n 2000 --seed 0
    python tests/fuzz/differential.py --seed 0 --only 17      # one program, with its text

Oracle, per program:
- the program parses (the generator writes only well-typed programs);
- `gir.interpret` (the reference) and `gir.jit(..., device="cpu")` agree within gir.testing's
  tolerances, or both raise a `GirError` (an integer division by zero, a `max` over an empty
  axis); nothing else escapes;
- every GPU_EVERY-th small program: the same for device="gpu";
- every THREADS_EVERY-th program: 4 threads calling one compiled function on inputs of
  their own get what sequential calls got;
- a `grad` program: the CPU backend's gradients equal the interpreter's (after the default
  pipeline expands `grad`), and the interpreter's equal central differences of the loss
  (h = 1e-6, up to 8 elements per differentiated argument);
- every `ERROR_EVERY`-th program (out-of-range mode) indexes out of range on purpose: the
  interpreter, the CPU backend and (small programs) the GPU backend raise a GirError located
  at that op (or all at an op that fails before it).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import random  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import gir  # noqa: E402
import numpy as np  # noqa: E402
from gir.ir.specialize import specialize  # noqa: E402
from gir.passes.pass_manager import PassManager  # noqa: E402
from gir.passes.pipeline import DEFAULT_PIPELINE  # noqa: E402
from gir.testing import assert_all_close  # noqa: E402
from harness import Counters, Finding, main  # noqa: E402
from programs import Program, generate  # noqa: E402

GPU_EVERY = 8
THREADS_EVERY = 10
FD_STEP = 1e-6
FD_ELEMENTS = 8
ERROR_EVERY = 10


def _bump(counters: Counters, key: str) -> None:
    counters[key] = counters.get(key, 0) + 1


def program_for(seed: int, index: int) -> Program:
    rng = random.Random(seed * 1_000_003 + index)
    # Every fourth program differentiates, so a 2,000-program run checks 500 gradients; one
    # in ten (an even index: never a grad one) indexes out of range on purpose.
    return generate(rng, want_grad=index % 4 == 3, want_error=index % ERROR_EVERY == 6)


def _run(fn: Any, args: list[np.ndarray]) -> tuple[list[np.ndarray] | None, gir.GirError | None]:
    try:
        return [np.asarray(r) for r in fn(*args)], None
    except gir.GirError as e:
        return None, e


def _compare(what: str, got: tuple, want: tuple, p: Program, counters: Counters) -> None:
    (g, gerr), (w, werr) = got, want
    if werr is not None or gerr is not None:
        if werr is None or gerr is None:
            raise Finding("mismatch", f"{what}: the reference {'raised ' + str(werr) if werr else 'ran'}, but it "
                                      f"{'raised ' + str(gerr) if gerr else 'ran'}", p.text)
        _bump(counters, f"{what}_both_raised")
        return
    try:
        assert_all_close(g, w, what=what)
    except AssertionError as e:
        raise Finding("mismatch", f"{what}: {e}", p.text) from None


def _guard(what: str, p: Program, thunk: Any) -> Any:
    """Runs thunk; anything but a GirError escaping it is a finding."""
    try:
        return thunk()
    except gir.GirError:
        raise
    except Finding:
        raise
    except RecursionError:
        raise Finding("escape", f"{what}: RecursionError", p.text) from None
    except Exception as e:
        raise Finding("escape", f"{what}: {type(e).__name__}: {e}", p.text) from e


def run_one(seed: int, index: int, counters: Counters) -> None:
    warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice": nan is the answer
    p = program_for(seed, index)
    try:
        module = gir.parse(p.text, filename="program.gir")
    except gir.GirError as e:
        raise Finding("invalid", f"the generator wrote a program gir rejects: {e}", p.text) from None
    _bump(counters, "programs")
    _bump(counters, f"dtype_{p.dtype}")
    if p.grad:
        return _grad(p, module, counters, index)
    if p.expect_error:
        return _expect_error(p, module, counters)
    want = _guard("interp", p, lambda: _run(lambda *a: gir.interpret(module, p.entry, *a), p.args))
    cpu_fn = _guard("cpu compile", p, lambda: _compiled(p, "cpu"))
    got = _guard("cpu", p, lambda: _run(cpu_fn, p.args)) if not isinstance(cpu_fn, gir.GirError) else (None, cpu_fn)
    _compare("cpu", got, want, p, counters)
    _bump(counters, "cpu_compared")
    if p.small and index % GPU_EVERY == 0:
        gpu_fn = _guard("gpu compile", p, lambda: _compiled(p, "gpu"))
        gpu = _guard("gpu", p, lambda: _run(gpu_fn, p.args)) if not isinstance(gpu_fn, gir.GirError) \
            else (None, gpu_fn)
        _compare("gpu", gpu, want, p, counters)
        _bump(counters, "gpu_compared")
    if index % THREADS_EVERY == 0 and not isinstance(cpu_fn, gir.GirError) and want[1] is None:
        _threads(p, cpu_fn, counters)


def _expect_error(p: Program, module: gir.Module, counters: Counters) -> None:
    """An index out of range on purpose: the interpreter, the CPU backend and (small programs)
    the GPU backend all raise a GirError located at that op, unless the interpreter stops at
    an earlier failing op (an integer division by zero): then they all raise there."""
    line, col = p.expect_error
    want = _guard("interp", p, lambda: _run(lambda *a: gir.interpret(module, p.entry, *a), p.args))
    if want[1] is None:
        raise Finding("mismatch", f"interp: ran, but the index at {line}:{col} is out of range", p.text)
    where = f":{line}:{col}:"
    if where not in str(want[1]):
        _bump(counters, "error_mode_earlier_error")
        where = ":" + str(want[1]).split(": error:")[0].split(":", 1)[1] + ":" if ": error:" in str(want[1]) else ""
    devices = ["cpu", "gpu"] if p.small else ["cpu"]
    for device in devices:
        fn = _guard(f"{device} compile", p, lambda d=device: _compiled(p, d))
        got = _guard(device, p, lambda f=fn: _run(f, p.args)) if not isinstance(fn, gir.GirError) else (None, fn)
        if got[1] is None:
            raise Finding("mismatch", f"{device}: ran, but the interpreter raised {want[1]}", p.text)
        if where not in str(got[1]):
            raise Finding("located", f"{device}: raised {got[1]}\nwhere the interpreter raised {want[1]}", p.text)
        _bump(counters, f"error_mode_{device}")
    _bump(counters, "error_mode_programs")


def _compiled(p: Program, device: str) -> Any:
    try:
        return gir.jit(p.text, p.entry, device=device)
    except gir.GirError as e:
        return e


def _perturbed(p: Program, k: int) -> list[np.ndarray]:
    rng = np.random.default_rng(k)
    out = []
    for a in p.args:
        if a.dtype.kind == "f":
            out.append((a + rng.standard_normal(a.shape) * 0.1).astype(a.dtype))
        else:
            out.append(a)
    return out


def _threads(p: Program, fn: Any, counters: Counters, threads: int = 4, calls: int = 3) -> None:
    inputs = [_perturbed(p, k) for k in range(threads * calls)]
    sequential = [_run(fn, args) for args in inputs]
    results: list[Any] = [None] * len(inputs)
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        barrier.wait()
        for c in range(calls):
            k = t * calls + c
            try:
                results[k] = _run(fn, inputs[k])
            except BaseException as e:  # an escape in a thread: reported below
                results[k] = (None, e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    for k, (got, want) in enumerate(zip(results, sequential)):
        if got[1] is not None and not isinstance(got[1], gir.GirError):
            raise Finding("escape", f"threads: {type(got[1]).__name__}: {got[1]}", p.text)
        _compare(f"thread call {k}", got, want, p, counters)
    _bump(counters, "thread_checks")


def _grad(p: Program, module: gir.Module, counters: Counters, index: int) -> None:
    expanded = gir.parse(p.text, filename="program.gir")
    f = expanded.functions[p.entry]
    if not all(t.is_static for t in f.arg_types):  # autodiff needs static shapes: as gir.jit does, specialise first
        expanded = specialize(expanded, p.entry, [t.with_shape(a.shape) for t, a in zip(f.arg_types, p.args)])
    _guard("autodiff", p, lambda: PassManager(DEFAULT_PIPELINE).run(expanded))
    want = _guard("interp", p, lambda: _run(lambda *a: gir.interpret(expanded, p.entry, *a), p.args))
    cpu_fn = _guard("cpu compile", p, lambda: _compiled(p, "cpu"))
    got = _guard("cpu", p, lambda: _run(cpu_fn, p.args)) if not isinstance(cpu_fn, gir.GirError) else (None, cpu_fn)
    _compare("cpu grad", got, want, p, counters)
    _bump(counters, "grad_cpu_compared")
    if want[1] is not None:
        return
    _finite_differences(p, module, want[0], counters)
    if p.small and index % GPU_EVERY == 3:
        gpu_fn = _guard("gpu compile", p, lambda: _compiled(p, "gpu"))
        gpu = _guard("gpu", p, lambda: _run(gpu_fn, p.args)) if not isinstance(gpu_fn, gir.GirError) \
            else (None, gpu_fn)
        _compare("gpu grad", gpu, want, p, counters)
        _bump(counters, "gpu_compared")


def _finite_differences(p: Program, module: gir.Module, results: list[np.ndarray], counters: Counters) -> None:
    loss, grads = float(results[0]), results[1:]
    if not np.isfinite(loss):  # a mean over no element: nan, and so are its differences
        _bump(counters, "grad_fd_skipped_nonfinite_loss")
        return
    rng = np.random.default_rng(len(p.text))

    def f(args: list[np.ndarray]) -> float:
        return float(gir.interpret(module, p.loss, *args)[0])

    checked = 0
    for position, g in zip(p.wrt, grads):
        x = p.args[position]
        if x.size == 0:
            continue
        tol = 1e-7 * (abs(loss) + 1.0) + 1e-6 * float(np.max(np.abs(g), initial=0.0))
        # A big program's loss takes seconds in the interpreter: two elements per argument.
        for flat in rng.choice(x.size, size=min(FD_ELEMENTS if p.small else 2, x.size), replace=False):
            idx = np.unravel_index(flat, x.shape)
            plus, minus = [a.copy() for a in p.args], [a.copy() for a in p.args]
            plus[position][idx] += FD_STEP
            minus[position][idx] -= FD_STEP
            fd = (f(plus) - f(minus)) / (2 * FD_STEP)
            if not abs(fd - g[idx]) <= tol:
                raise Finding("gradient", f"d loss / d arg{position}{list(idx)}: autodiff {g[idx]!r}, central "
                                          f"differences {fd!r} (tolerance {tol:.3g})", p.text)
            checked += 1
    counters["fd_elements"] = counters.get("fd_elements", 0) + checked
    _bump(counters, "grad_fd_checked")


def show(seed: int, index: int) -> None:
    p = program_for(seed, index)
    print(p.text)
    for a in p.args:
        print(a.dtype, a.shape, a.reshape(-1)[:8])


if __name__ == "__main__":
    sys.exit(main(run_one, __doc__.splitlines()[0], {"n": 200, "timeout": 300.0, "memory_gib": 8.0},
                  show_one=show))
