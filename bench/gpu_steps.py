"""GPU training-step probe: gir on the GPU, checked against gir on the CPU, for bench/rnn.py's
models; prints per call and per time step what gir put on the device (fn.stats), the first
call's time (compile included) and the median time of a step. (PyTorch/JAX on the same GPU:
bench/rnn.py --device gpu, issue 26 item 5, not written yet.)

    NUMBA_ENABLE_CUDASIM=0 python bench/gpu_steps.py --sizes S --repeat 10
    NUMBA_ENABLE_CUDASIM=1 python bench/gpu_steps.py --sizes Q --repeat 1   # the counts only

    NUMBA_ENABLE_CUDASIM=0 python bench/gpu_steps.py --sizes S --persistent on,measure   # + persistent scans

Sizes are bench/rnn.py's (S, M) plus Q (T=3, batch 2, input 3, hidden 4, as the tests pin).
`--persistent MODES` times the step again per GIR_GPU_PERSISTENT mode (`on`: each eligible scan
one cooperative kernel; `measure`: both ways timed at the first call, the faster kept), checked
against the CPU too, and prints each scan's decision (fn.stats.persistent: the plan, or why not,
and measure's two times).
Times from the simulator mean nothing; counts are the same there. This is a probe for a GPU
session's one device check (bench/gpu_check.sh), not the benchmark (bench/rnn.py)."""

# ruff: noqa: E741  (I is the input size, as in bench/rnn.py)
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"Q": (3, 2, 3, 4), "S": (50, 32, 256, 256), "M": (100, 64, 512, 512), "L": (100, 256, 1024, 1024)}


def bench_rnn():
    spec = importlib.util.spec_from_file_location("_gir_bench_rnn", HERE / "rnn.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def median_ms(step, warmup: int, repeat: int, sync=None) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rnn,gru,lstm")
    ap.add_argument("--sizes", default="S")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--persistent", default="", help="GIR_GPU_PERSISTENT modes to time too: on, measure")
    ap.add_argument("--persistent-sizes", default="", help="the sizes to time those at (default: every size)")
    args = ap.parse_args()
    import gir
    from gir.testing import assert_all_close

    rnn = bench_rnn()
    for size in args.sizes.split(","):
        T, B, I, H = SIZES[size]
        for model in args.models.split(","):
            src = rnn.gir_source(model, T, B, I, H)
            p = rnn.make_inputs(model, T, B, I, H, 0)
            call_args = [p["xs"]] + [p[n] for n in rnn.param_names(model)]
            start = time.perf_counter()
            fn = gir.jit(src, f"{model}_grads", device="gpu")
            got = fn(*call_args)
            first = time.perf_counter() - start
            want = gir.jit(src, f"{model}_grads", device="cpu")(*call_args)
            assert_all_close(got, want, rtol=5e-3, what=f"{model} {size} gpu against cpu")
            ms = median_ms(lambda f=fn, a=call_args: f(*a), args.warmup, args.repeat)
            replayed = fn(*call_args)  # a replayed call (the graph path), checked too
            assert_all_close(replayed, want, rtol=5e-3, what=f"{model} {size} gpu, a replayed call, against cpu")
            s = fn.stats
            with gir.config.override(gpu_graphs=False):  # the eager path on the same GPU, for the ratio
                eager = gir.jit(src, f"{model}_grads", device="gpu")
            eager_ms = median_ms(lambda f=eager, a=call_args: f(*a), args.warmup, args.repeat)
            print(f"{model} {size} (T={T} B={B} I={I} H={H}) on {s.device}: first call {first:.2f} s, "
                  f"median {ms:.2f} ms ({s.graph}; eager: {eager_ms:.2f} ms); per call: {s.host_launches} launched "
                  f"from Python; device work {s.kernel_launches} kernels + {s.gemm_calls} GEMMs + "
                  f"{s.xp_launches} xp + {s.copies} copies, {s.graph_replays} graph replays",
                  flush=True)
            for label, counts in s.per_step.items():
                print(f"    per step, {label}: " + ", ".join(f"{k} {v:g}" for k, v in counts.items()), flush=True)
            modes = args.persistent.split(",") if size in (args.persistent_sizes or size).split(",") else []
            for mode in filter(None, modes):
                persistent_step(model, size, mode, src, call_args, want, args)
    return 0


def persistent_step(model: str, size: str, mode: str, src: str, call_args: list, want: list, args) -> None:
    """The step with GIR_GPU_PERSISTENT=mode: first call, median (graph replays), the decisions."""
    import gir
    from gir.testing import assert_all_close

    start = time.perf_counter()
    with gir.config.override(gpu_persistent=mode):
        fn = gir.jit(src, f"{model}_grads", device="gpu")
    got = fn(*call_args)
    first = time.perf_counter() - start
    assert_all_close(got, want, rtol=5e-3, what=f"{model} {size} gpu persistent={mode} against cpu")
    ms = median_ms(lambda f=fn, a=call_args: f(*a), args.warmup, args.repeat)
    assert_all_close(fn(*call_args), want, rtol=5e-3, what=f"{model} {size} persistent={mode}, replayed")
    s = fn.stats
    print(f"{model} {size} GIR_GPU_PERSISTENT={mode}: first call {first:.2f} s, median {ms:.2f} ms ({s.graph}); "
          f"device work {s.kernel_launches} kernels + {s.gemm_calls} GEMMs + {s.xp_launches} xp + {s.copies} copies",
          flush=True)
    for label, path in s.persistent.items():
        print(f"    {label}: {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
