"""Long sequences in a memory budget: an LSTM training step at T = 1,000 .. 100,000.

What is measured
----------------
One training step (loss and the gradients of every weight, bias and initial state) of the LSTM
of bench/rnn.py, float32, batch 32, hidden 256 (input 256 unless --input), on the CPU, for each
T and each budget: none (only where the planned peak fits --max-gb), 1 GB and 256 MB
(`gir.jit(..., memory_budget=...)`, docs/memplan.md "Memory budget"). Per run:

- planned: the final memory plan's peak (`fn.stats.compile.planned_peak`), and the workspace the
  CPU code allocates (`arena_bytes`: arena + pinned packed weights);
- rss: the growth of the process's resident set during the first call, over what it was after
  compiling with the inputs in memory (VmHWM after resetting it through /proc/self/clear_refs,
  minus VmRSS before the call; Linux);
- step: the median of --repeat calls after that one (the -O3 code: tiered compilation is off);
- segment, checkpoints, recompute factor: the `checkpoint` pass's decision;
- grad diff: the largest relative difference of the loss and every gradient against the
  un-checkpointed step at the same T, where that ran (float32; the float64 equality to 1e-10
  is tests/test_checkpoint.py's);
- compile: seconds to compile (should not grow with T: nothing is unrolled), the -O3 code,
  GEMM paths from the model (`GIR_GEMM_MEASURE=off`: no measurement counted as compile time).

JAX (`--jax`, where importable): `jax.checkpoint` around a `lax.scan` over segments of a
`lax.scan` over steps (S the divisor of T nearest below √T), gates fused into one weight per
side, the input projection inside the segment; the same columns except planned.

Every (T, budget) runs in a fresh subprocess (its RSS is its own). Usage:

    python bench/long_sequences.py                      # T = 1000, 10000, 100000; none, 1GB, 256MB
    python bench/long_sequences.py --steps 200 --budgets 2MB --batch 4 --hidden 16 --input 16 --repeat 1
    python bench/long_sequences.py --jax --out docs/performance-long-sequences.md

The machine should be otherwise idle; T = 100,000 needs the inputs (3.3 GB at input 256) plus
the budget in memory, and about a minute per step.
"""

# ruff: noqa: E741  (I is the input size, as in T, B, I, H)
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def rnn_bench():  # bench/rnn.py (not a package): the LSTM's source, inputs and parameter names
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gir_bench_rnn", HERE / "rnn.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def vm(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM); 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measured_call(call) -> tuple[object, int | None]:
    """(result, RSS growth in bytes during the call, None where it cannot be measured)."""
    before = vm("VmRSS")
    ok = reset_peak()
    out = call()
    return out, (vm("VmHWM") - before) if ok and before else None


def inputs(T: int, B: int, I: int, H: int) -> tuple[list[np.ndarray], list[str]]:
    rnn = rnn_bench()
    p = rnn.make_inputs("lstm", T, B, I, H, 0)
    names = rnn.param_names("lstm")
    return [p["xs"].astype(np.float32)] + [p[n].astype(np.float32) for n in names], names


# ---------------------------------------------------------------------------------------------
# One run, in its own process


def run_gir(T: int, B: int, I: int, H: int, budget: str, repeat: int, max_bytes: int, save: str | None) -> dict:
    os.environ["GIR_LLVM_TIER"] = "0"  # one compile, -O3: time the final code from the first call
    cache = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, cache, True)
    os.environ["GIR_CACHE_DIR"] = cache  # compiled here: the passes' reports, the compile time
    # GEMM paths from the model, not measured: measuring a T-long GEMM through every path takes
    # minutes at T = 100,000 and would be counted as compile time; every run gets the same choice.
    os.environ.setdefault("GIR_GEMM_MEASURE", "off")
    import gir

    args, _ = inputs(T, B, I, H)
    start = time.perf_counter()
    fn = gir.jit(rnn_bench().gir_source("lstm", T, B, I, H), "lstm_grads",
                 memory_budget=budget if budget != "none" else None)
    compile_s = time.perf_counter() - start
    st = fn.stats.compile
    row = {"T": T, "budget": budget, "planned": st.planned_peak, "workspace": st.arena_bytes,
           "compile_s": compile_s, "decision": "; ".join(st.checkpoints)}
    if (st.arena_bytes or 0) > max_bytes:
        row["skipped"] = f"workspace {st.arena_bytes / 1e9:.1f} GB > --max-gb"
        return row
    out, row["rss"] = measured_call(lambda: fn(*args))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    row["step_s"] = statistics.median(times) if times else None
    if save:
        np.savez(save, *[np.asarray(a) for a in out])
    return row


def run_jax(T: int, B: int, I: int, H: int, repeat: int, save: str | None) -> dict:
    import jax
    import jax.numpy as jnp

    args, names = inputs(T, B, I, H)
    p = dict(zip(["xs"] + names, args))
    w = jnp.concatenate([p[f"w_{g}"] for g in "ifgo"], axis=1)
    u = jnp.concatenate([p[f"u_{g}"] for g in "ifgo"], axis=1)
    b = jnp.concatenate([p[f"b_{g}"] for g in "ifgo"])
    S = max(d for d in range(1, int(T ** 0.5) + 1) if T % d == 0)

    def loss(w, u, b, h0, c0, xs):
        def cell(carry, x):
            h, c, acc = carry
            z = x @ w + h @ u + b
            i, f, g, o = jnp.split(z, 4, axis=1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c, acc + jnp.sum(h * h)), None

        @jax.checkpoint
        def segment(carry, xseg):
            return jax.lax.scan(cell, carry, xseg)[0], None

        (_, _, total), _ = jax.lax.scan(segment, (h0, c0, jnp.float32(0)), xs.reshape(T // S, S, B, I))
        return total

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    start = time.perf_counter()
    jax.block_until_ready(step(w, u, b, p["h0"], p["c0"], p["xs"]))  # compiles
    row = {"T": T, "budget": f"jax S={S}", "compile_s": time.perf_counter() - start}
    out, row["rss"] = measured_call(lambda: jax.block_until_ready(step(w, u, b, p["h0"], p["c0"], p["xs"])))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(step(w, u, b, p["h0"], p["c0"], p["xs"]))
        times.append(time.perf_counter() - t0)
    row["step_s"] = statistics.median(times) if times else None
    if save:
        value, (dw, du, db, dh0, dc0) = out  # type: ignore[misc]
        split = lambda a, axis: np.split(np.asarray(a), 4, axis=axis)  # noqa: E731
        grads = {"h0": dh0, "c0": dc0}
        for prefix, grad, axis in (("w", dw, 1), ("u", du, 1), ("b", db, 0)):
            grads.update({f"{prefix}_{g}": x for g, x in zip("ifgo", split(grad, axis))})
        np.savez(save, np.asarray(value), *[np.asarray(grads[n]) for n in names])
    return row


# ---------------------------------------------------------------------------------------------
# The driver


def max_relative_diff(a: str, b: str) -> float:
    x, y = np.load(a), np.load(b)
    return max(float(np.max(np.abs(x[k] - y[k])) / max(float(np.max(np.abs(y[k]))), 1e-30)) for k in y.files)


def child(argv: list[str], timeout: float) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(argv)], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:  # a GirError's message line, not its source line or caret after it
        lines = r.stderr.strip().splitlines() or ["failed"]
        return {"error": next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1])}
    return json.loads(r.stdout.strip().splitlines()[-1])


def mb(n: object) -> str:
    return f"{n / 1e6:,.1f}" if isinstance(n, (int, float)) else "-"


def table(rows: list[dict]) -> str:
    head = "| T | budget | planned MB | workspace MB | RSS growth MB | step s | compile s | grad diff | decision |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        step = f"{r['step_s']:.4g}" if r.get("step_s") else "-"
        diff = f"{r['diff']:.1e}" if "diff" in r else "-"
        note = r.get("skipped") or r.get("error") or r.get("decision") or ""
        lines.append(f"| {r['T']:,} | {r['budget']} | {mb(r.get('planned'))} | {mb(r.get('workspace'))} | "
                     f"{mb(r.get('rss'))} | {step} | {r.get('compile_s', 0):.2f} | {diff} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="1000,10000,100000", help="sequence lengths T, comma-separated")
    ap.add_argument("--budgets", default="none,1GB,256MB", help="'none' or byte sizes, comma-separated")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--input", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="timed steps after the first (median)")
    ap.add_argument("--max-gb", type=float, default=16.0, help="skip runs whose workspace exceeds this")
    ap.add_argument("--jax", action="store_true", help="also run JAX with jax.checkpoint over segments")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, T, B, I, H, budget, repeat, max_bytes, save = json.loads(args.child)
        row = run_jax(T, B, I, H, repeat, save) if kind == "jax" else \
            run_gir(T, B, I, H, budget, repeat, max_bytes, save)
        print(json.dumps(row))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in [int(t) for t in args.steps.split(",")]:
            reference = None
            runs = [("gir", b) for b in args.budgets.split(",")] + ([("jax", "")] if args.jax else [])
            for kind, budget in runs:
                save = os.path.join(tmp, f"{T}-{kind}-{budget}.npz")
                row = child([kind, T, args.batch, args.input, args.hidden, budget, args.repeat,
                             int(args.max_gb * 1e9), save], args.timeout)
                row.setdefault("T", T)
                row.setdefault("budget", budget or kind)
                if os.path.exists(save):
                    if kind == "gir" and budget == "none":
                        reference = save
                    elif reference is not None:
                        row["diff"] = max_relative_diff(save, reference)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    text = (f"LSTM training step, batch {args.batch}, input {args.input}, hidden {args.hidden}, float32, CPU\n\n"
            + table(rows))
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
