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
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
Step = Callable[[], object] | None
"""A run's training step (None: skipped)."""


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


def run_gir(T: int, B: int, I: int, H: int, budget: str, max_bytes: int, save: str | None) -> tuple[dict, Step]:
    """Compiles and makes the first call (its RSS growth measured): (the row, the step)."""
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
        return row, None
    out, row["rss"] = measured_call(lambda: fn(*args))
    if save:
        np.savez(save, *[np.asarray(a) for a in out])
    return row, lambda: fn(*args)


def run_jax(T: int, B: int, I: int, H: int, save: str | None) -> tuple[dict, Step]:
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
    def call():  # noqa: ANN202
        return jax.block_until_ready(step(w, u, b, p["h0"], p["c0"], p["xs"]))

    out, row["rss"] = measured_call(call)
    if save:
        value, (dw, du, db, dh0, dc0) = out  # type: ignore[misc]
        split = lambda a, axis: np.split(np.asarray(a), 4, axis=axis)  # noqa: E731
        grads = {"h0": dh0, "c0": dc0}
        for prefix, grad, axis in (("w", dw, 1), ("u", du, 1), ("b", db, 0)):
            grads.update({f"{prefix}_{g}": x for g, x in zip("ifgo", split(grad, axis))})
        np.savez(save, np.asarray(value), *[np.asarray(grads[n]) for n in names])
    return row, call


# ---------------------------------------------------------------------------------------------
# The driver


def max_relative_diff(a: str, b: str) -> float:
    x, y = np.load(a), np.load(b)
    return max(float(np.max(np.abs(x[k] - y[k])) / max(float(np.max(np.abs(y[k]))), 1e-30)) for k in y.files)


def serve(row: dict, step: Step) -> None:
    """The child's side: the row, then `time N` lines answered with N step times (JSON)."""
    print(json.dumps(row), flush=True)
    if step is None:
        return
    for line in sys.stdin:
        times = []
        for _ in range(int(line.split()[1])):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


class Child:
    """One run in its own process (its RSS is its own), kept alive to be timed in rounds."""

    def __init__(self, argv: list, tmp: str):
        self.err = open(os.path.join(tmp, f"stderr-{argv[1]}-{argv[5] or argv[0]}.txt"), "w+")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(argv)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        self.row: dict = json.loads(line) if line else {"error": self._error()}
        self.times: list[float] = []

    def _error(self) -> str:
        self.proc.wait()
        self.err.seek(0)  # a GirError's message line, not its source line or caret after it
        lines = self.err.read().strip().splitlines() or ["failed"]
        return next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1])

    @property
    def timed(self) -> bool:
        return "error" not in self.row and "skipped" not in self.row

    def time(self, n: int) -> list[float]:
        self.proc.stdin.write(f"time {n}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        got = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.times += got
        return got

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()
        self.err.close()


def mb(n: object) -> str:
    return f"{n / 1e6:,.1f}" if isinstance(n, (int, float)) else "-"


def table(rows: list[dict]) -> str:
    head = ("| T | budget | planned MB | workspace MB | RSS growth MB | step s | step / no budget | compile s "
            "| grad diff | decision |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        step = f"{r['step_s']:.4g}" if r.get("step_s") else "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
        diff = f"{r['diff']:.1e}" if "diff" in r else "-"
        note = r.get("skipped") or r.get("error") or r.get("decision") or ""
        lines.append(f"| {r['T']:,} | {r['budget']} | {mb(r.get('planned'))} | {mb(r.get('workspace'))} | "
                     f"{mb(r.get('rss'))} | {step} | {ratio} | {r.get('compile_s', 0):.2f} | {diff} | {note} |")
    return "\n".join(lines) + "\n"


def one_length(T: int, args: argparse.Namespace, tmp: str) -> list[dict]:
    """Every run at T: compiled and called once each, one after the other (so each first call's
    RSS is measured alone), then timed in --repeat rounds, one step of each run a round, half a
    second apart (the last run's BLAS threads stop spinning): a loaded minute weighs on all."""
    runs = [("gir", b) for b in args.budgets.split(",")] + ([("jax", "")] if args.jax else [])
    children, reference = [], None
    for kind, budget in runs:
        save = os.path.join(tmp, f"{T}-{kind}-{budget}.npz")
        c = Child([kind, T, args.batch, args.input, args.hidden, budget, int(args.max_gb * 1e9), save], tmp)
        c.row.setdefault("T", T)
        c.row.setdefault("budget", budget or kind)
        if os.path.exists(save):
            if kind == "gir" and budget == "none":
                reference = save
            elif reference is not None:
                c.row["diff"] = max_relative_diff(save, reference)
        children.append(c)
    timed = [c for c in children if c.timed]
    base = next((c for c in timed if c.row["budget"] == "none"), None)
    ratios: dict[int, list[float]] = {id(c): [] for c in timed}
    for _ in range(args.repeat):
        got = {}
        for c in timed:
            time.sleep(0.5)
            got[id(c)] = c.time(1)[0]
        for c in timed:
            if base is not None:
                ratios[id(c)].append(got[id(c)] / got[id(base)])
    for c in children:
        if c.times:
            c.row["step_s"] = statistics.median(c.times)
        if ratios.get(id(c)):
            c.row["ratio"] = statistics.median(ratios[id(c)])
        c.close()
        print(table([c.row]).splitlines()[-1], flush=True)
    return [c.row for c in children]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="1000,10000,100000", help="sequence lengths T, comma-separated")
    ap.add_argument("--budgets", default="none,1GB,256MB", help="'none' or byte sizes, comma-separated")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--input", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of one timed step per run (median)")
    ap.add_argument("--max-gb", type=float, default=16.0, help="skip runs whose workspace exceeds this")
    ap.add_argument("--jax", action="store_true", help="also run JAX with jax.checkpoint over segments")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, T, B, I, H, budget, max_bytes, save = json.loads(args.child)
        serve(*(run_jax(T, B, I, H, save) if kind == "jax" else run_gir(T, B, I, H, budget, max_bytes, save)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in [int(t) for t in args.steps.split(",")]:
            rows += one_length(T, args, tmp)
    text = (f"LSTM training step, batch {args.batch}, input {args.input}, hidden {args.hidden}, float32, CPU\n\n"
            + table(rows))
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
