"""A cell that is none of RNN, GRU and LSTM takes the same fast paths: a peephole LSTM and a
two-layer stacked GRU, written in .gir, compiled by the generic pipeline.

For each model it prints what the compiled training step does (`fn.stats`: GEMM calls and
paths, stacked values written in place, the two-core schedule and the measured model behind
it), checks its gradients against the same function compiled without the two-core schedule
(GIR_CPU_OVERLAP=0) and, at a tiny size, against the interpreter, then times the two
variants interleaved in one process (same BLAS provider: the same thread pools).

    python bench/generic_cell.py                   # T=50 batch=32 256 wide, 10 rounds
    python bench/generic_cell.py --quick           # tiny sizes: the checks only
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

PEEPHOLE = """
func @loss(%xs: tensor<{T}x{B}x{I}xf32>, %h0: tensor<{B}x{H}xf32>, %c0: tensor<{B}x{H}xf32>,
           %w_i: tensor<{I}x{H}xf32>, %w_f: tensor<{I}x{H}xf32>, %w_g: tensor<{I}x{H}xf32>, %w_o: tensor<{I}x{H}xf32>,
           %u_i: tensor<{H}x{H}xf32>, %u_f: tensor<{H}x{H}xf32>, %u_g: tensor<{H}x{H}xf32>, %u_o: tensor<{H}x{H}xf32>,
           %p_i: tensor<{H}xf32>, %p_f: tensor<{H}xf32>, %p_o: tensor<{H}xf32>,
           %b_i: tensor<{H}xf32>, %b_f: tensor<{H}xf32>, %b_g: tensor<{H}xf32>, %b_o: tensor<{H}xf32>) -> tensor<f32> {{
  %h = %h0
  %c = %c0
  %loss = constant 0.0 : tensor<f32>
  for %x in %xs {{
    %i = sigmoid(%x @ %w_i + %h @ %u_i + %c * %p_i + %b_i)
    %f = sigmoid(%x @ %w_f + %h @ %u_f + %c * %p_f + %b_f)
    %g = tanh(%x @ %w_g + %h @ %u_g + %b_g)
    %c = %f * %c + %i * %g
    %o = sigmoid(%x @ %w_o + %h @ %u_o + %c * %p_o + %b_o)
    %h = %o * tanh(%c)
    %loss = %loss + sum(%h * %h)
  }}
  return %loss
}}
"""
PEEPHOLE_PARAMS = ["w_i", "w_f", "w_g", "w_o", "u_i", "u_f", "u_g", "u_o", "p_i", "p_f", "p_o",
                   "b_i", "b_f", "b_g", "b_o"]

STACKED_GRU = """
func @loss(%xs: tensor<{T}x{B}x{I}xf32>, %h0: tensor<{B}x{H}xf32>, %k0: tensor<{B}x{H}xf32>,
           %w_z: tensor<{I}x{H}xf32>, %w_r: tensor<{I}x{H}xf32>, %w_n: tensor<{I}x{H}xf32>,
           %u_z: tensor<{H}x{H}xf32>, %u_r: tensor<{H}x{H}xf32>, %u_n: tensor<{H}x{H}xf32>,
           %v_z: tensor<{H}x{H}xf32>, %v_r: tensor<{H}x{H}xf32>, %v_n: tensor<{H}x{H}xf32>,
           %s_z: tensor<{H}x{H}xf32>, %s_r: tensor<{H}x{H}xf32>, %s_n: tensor<{H}x{H}xf32>,
           %b_z: tensor<{H}xf32>, %b_r: tensor<{H}xf32>, %b_n: tensor<{H}xf32>) -> tensor<f32> {{
  %h = %h0
  %k = %k0
  %loss = constant 0.0 : tensor<f32>
  for %x in %xs {{
    %z = sigmoid(%x @ %w_z + %h @ %u_z + %b_z)
    %r = sigmoid(%x @ %w_r + %h @ %u_r + %b_r)
    %n = tanh(%x @ %w_n + %r * (%h @ %u_n))
    %h = (1.0 - %z) * %n + %z * %h
    %z2 = sigmoid(%h @ %v_z + %k @ %s_z)
    %r2 = sigmoid(%h @ %v_r + %k @ %s_r)
    %n2 = tanh(%h @ %v_n + %r2 * (%k @ %s_n))
    %k = (1.0 - %z2) * %n2 + %z2 * %k
    %loss = %loss + sum(%k * %k)
  }}
  return %loss
}}
"""
GRU2_PARAMS = ["w_z", "w_r", "w_n", "u_z", "u_r", "u_n", "v_z", "v_r", "v_n", "s_z", "s_r", "s_n",
               "b_z", "b_r", "b_n"]

MODELS = {"peephole-lstm": (PEEPHOLE, ["h0", "c0"], PEEPHOLE_PARAMS),
          "stacked-gru": (STACKED_GRU, ["h0", "k0"], GRU2_PARAMS)}


def source(model: str, T: int, B: int, I: int, H: int) -> str:  # noqa: E741
    text, states, params = MODELS[model]
    body = text.format(T=T, B=B, I=I, H=H)
    sig = body[body.index("(") + 1 : body.index(") -> tensor<f32>")]
    names = ["xs"] + states + params
    call = ", ".join(f"%{n}" for n in names)
    wrt = ", ".join(f"%{n}" for n in params)
    outs = ", ".join(["%l"] + [f"%d{n}" for n in params])
    types = []
    for part in sig.split("%")[1:]:
        types.append(part.split(":", 1)[1].strip().rstrip(","))
    results = ", ".join(["tensor<f32>"] + types[1 + len(states):])
    return (body + f"\nfunc @grads({sig}) -> ({results}) {{\n  {outs} = grad @loss({call}) wrt ({wrt})\n"
            f"  return {outs}\n}}\n")


def inputs(model: str, T: int, B: int, I: int, H: int, seed: int = 0) -> list[np.ndarray]:  # noqa: E741
    import gir

    fn = gir.parse(source(model, T, B, I, H)).functions["grads"]
    rng = np.random.default_rng(seed)
    out = []
    for arg in fn.args:
        shape = tuple(int(d) for d in arg.tensor_type.shape)
        scale = 1.0 if len(shape) == 3 else (0.5 if len(shape) == 2 and shape[0] == B else 1.0 / np.sqrt(H))
        out.append((rng.standard_normal(shape) * scale).astype(np.float32))
    return out


def compile_variant(src: str, overlap: str):  # noqa: ANN201
    import gir

    old = os.environ.get("GIR_CPU_OVERLAP")
    os.environ["GIR_CPU_OVERLAP"] = overlap
    try:
        return gir.jit(src, "grads")
    finally:
        if old is None:
            os.environ.pop("GIR_CPU_OVERLAP")
        else:
            os.environ["GIR_CPU_OVERLAP"] = old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="peephole-lstm,stacked-gru")
    ap.add_argument("--size", default="50,32,256,256", help="T,batch,input,hidden")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import gir
    from gir.testing import assert_all_close

    T, B, I, H = (int(x) for x in args.size.split(","))  # noqa: E741
    for model in args.models.split(","):
        tiny = source(model, 5, 3, 4, 6)
        xs = inputs(model, 5, 3, 4, 6)
        want = gir.jit(tiny, "grads", device="interp")(*xs)
        forced = compile_variant(tiny, "1")
        assert_all_close(forced(*xs), want, what=f"{model} (tiny, two-core) vs interpreter")
        print(f"{model}: tiny size, two-core schedule forced: gradients match the interpreter; "
              f"schedule {forced.stats.schedule}")
        if args.quick:
            continue
        src = source(model, T, B, I, H)
        xs = inputs(model, T, B, I, H)
        fns = {"auto": compile_variant(src, "auto"), "off": compile_variant(src, "0")}
        outs = {k: f(*xs) for k, f in fns.items()}
        assert_all_close(outs["auto"], outs["off"], what=f"{model} two-core vs not")
        st = fns["auto"].stats
        print(f"{model} T={T} B={B} I={I} H={H}: {st.gemm_calls} GEMM calls, paths {st.gemm_paths}")
        print(f"  schedule: {st.schedule}")
        times: dict[str, list[float]] = {k: [] for k in fns}
        ratios = []
        for r in range(args.rounds):
            med = {}
            for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                ts = []
                for _ in range(args.per_round):
                    start = time.perf_counter()
                    fns[k](*xs)
                    ts.append(time.perf_counter() - start)
                times[k] += ts
                med[k] = statistics.median(ts)
            ratios.append(med["off"] / med["auto"])
        print(f"  median ms: auto {1e3 * statistics.median(times['auto']):.2f}, without the two-core schedule "
              f"{1e3 * statistics.median(times['off']):.2f}; per-round ratio off/auto median "
              f"{statistics.median(ratios):.2f} (load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
