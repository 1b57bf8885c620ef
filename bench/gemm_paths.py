"""Which GEMM path the CPU backend picks for each GEMM of bench/rnn.py's training steps.

For every model (rnn, gru, lstm), size (S, M) and thread count, the training step is compiled
through gir.jit's pipeline and every GEMM site of the compiled function (`schedule.gemms.sites`: shape,
transposes, packable, times run per step) is measured through each available path (MKL
`cblas_sgemm`, MKL packed, OpenBLAS from SciPy; `blas.path_times`, the measurement the backend
itself makes and caches). Printed: the provider the backend chooses for the function
(the schedule's `choose_family`, backend/cpu/schedule/gemms.py), the path of each site
within it, and the summed time per step by provider:
whether MKL ever pays on this machine (the question behind the `gir[mkl]` extra).

    python bench/gemm_paths.py                   # S and M, 1 and 2 threads
    python bench/gemm_paths.py --sizes S --threads 1
    python bench/gemm_paths.py --sizes S --threads 1 --steps 15    # + whole steps, default vs plain OpenBLAS

`--steps N` also times N whole training steps of the function as compiled by default and as
compiled with `GIR_GEMM_PATH=openblas` (plain OpenBLAS calls: no MKL and no weight copied to
the other orientation, `openblas-copy`), interleaved in this one process (A, B, A, B, ...), and
prints the medians and their ratio.

Uses a fresh GIR_CACHE_DIR unless one is set, so the measurements are made now, on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("GIR_CACHE_DIR", tempfile.mkdtemp(prefix="gir-gemm-paths-"))
os.environ.setdefault("GIR_GEMM_MEASURE", "now")  # path_times measures here, not in the background

import gir  # noqa: E402
from gir.backend.cpu import (
    blas,  # noqa: E402
    llvm_jit,  # noqa: E402, F401  (registers the `gir-packed` path's caller, which runs through LLVM)
    snapshot,  # noqa: E402
)
from gir.backend.cpu.schedule import plan  # noqa: E402
from gir.backend.cpu.schedule.gemms import choose_path  # noqa: E402
from gir.backend.cpu.schedule.gemms import sites as _gemm_sites  # noqa: E402
from gir.config import current  # noqa: E402
from gir.passes.pass_manager import PassManager  # noqa: E402
from gir.passes.pipeline import BACKEND_PIPELINE, DEFAULT_PIPELINE  # noqa: E402
from rnn import MODELS, SIZES, gir_source, make_inputs, param_names  # noqa: E402


def function_of(model: str, size: str):  # noqa: ANN201
    T, B, I, H = SIZES[size]  # noqa: E741
    module = gir.parse(gir_source(model, T, B, I, H), filename=f"{model}.gir")
    PassManager(f"{DEFAULT_PIPELINE},{BACKEND_PIPELINE}").run(module)
    return module.functions[f"{model}_grads"]


def report(model: str, size: str, threads: int) -> dict[str, float]:
    f = function_of(model, size)
    sites = _gemm_sites(f)
    measured, _ = snapshot.take(f, current())  # GIR_GEMM_MEASURE=now measures what is missing
    family = plan(f, None, measured, current()).family
    totals: dict[str, float] = {}
    lines = []
    for params, count in sites:
        times = measured.gemm_times.get(params) or measured.model_times[params]
        best, _ = choose_path(params, family, measured, current())
        overall = min(times, key=times.__getitem__)
        for family_name, paths in blas.FAMILIES.items():
            totals[family_name] = totals.get(family_name, 0.0) + count * min(
                times[p] for p in paths if p in times)
        dtype, m, n, k, ta, tb, packable = params
        shown = "  ".join(f"{p} {times[p] * 1e6:8.1f}us" for p in sorted(times))
        lines.append(f"    {dtype} m={m:5d} n={n:4d} k={k:5d} ta={int(ta)} tb={int(tb)} x{count:<4d} "
                     f"takes {best:10s} (fastest alone: {overall:10s}) {shown}")
    print(f"{model} {size} threads={threads}: the function calls {family}; per step "
          + ", ".join(f"{f} {t * 1e3:.2f} ms" for f, t in sorted(totals.items())))
    print("\n".join(lines))
    return totals


def end_to_end(model: str, size: str, steps: int) -> None:
    """Medians of whole steps: the default choice against plain OpenBLAS, interleaved."""
    import statistics
    import time

    T, B, I, H = SIZES[size]  # noqa: E741
    p = make_inputs(model, T, B, I, H, seed=0)
    args = [p["xs"]] + [p[n] for n in param_names(model)]
    source = gir_source(model, T, B, I, H)
    fns = {}
    for name, forced in (("default", None), ("openblas", "openblas")):
        if forced:
            os.environ["GIR_GEMM_PATH"] = forced
        fns[name] = gir.jit(source, f"{model}_grads")
        fns[name](*args)  # compiles now, under this GIR_GEMM_PATH
        os.environ.pop("GIR_GEMM_PATH", None)
    from gir.backend.cpu import tiers

    tiers.wait_all()  # time the -O3 code, without its compile on the other core
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    paths = {name: dict(fn.stats.gemm_paths) for name, fn in fns.items()}
    print(f"  whole step, median of {steps}: default {med['default'] * 1e3:.1f} ms {paths['default']}, "
          f"plain OpenBLAS {med['openblas'] * 1e3:.1f} ms; plain OpenBLAS / default = "
          f"{med['openblas'] / med['default']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sizes", default="S,M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=0, help="also time N whole steps, default vs plain OpenBLAS")
    args = ap.parse_args(argv)
    prov = blas.providers()
    if not prov.has_mkl:
        print(f"no MKL here ({prov.notice}): every GEMM takes OpenBLAS")
        return 0
    print(f"CPU: {os.cpu_count()} cores; GEMM times cached in {os.environ['GIR_CACHE_DIR']}")
    for threads in (int(t) for t in args.threads.split(",")):
        prov.mkl.MKL_Set_Num_Threads(threads)  # type: ignore[union-attr]
        try:
            from threadpoolctl import threadpool_limits
            limit = threadpool_limits(threads)
        except ImportError:
            limit = None
            os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
        for size in args.sizes.split(","):
            for model in args.models.split(","):
                report(model, size, threads)
                if args.steps:
                    end_to_end(model, size, args.steps)
        del limit
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
