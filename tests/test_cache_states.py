"""Store what ran, and say so (issue 28; compile_cache.py, docs/backend.md "Cache states"): a
process stores the code it runs before it ends whatever its background work is doing; later
processes load the best entry there is (no passes, no LLVM) and never wait for better code;
`fn.stats.compile`, `gir run -v` and `gir cache info` say where the code came from, its state
and what better code is being prepared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import gir
import numpy as np
import pytest
from gir import cli
from gir.backend.cpu import tiers
from gir.driver import compile_cache
from gir.ir.interpreter import random_inputs

RNN = """\
func @loss(%xs: tensor<6x4x8xf32>, %h0: tensor<4x8xf32>, %wx: tensor<8x8xf32>, %wh: tensor<8x8xf32>,
           %b: tensor<8xf32>) -> tensor<f32> {
  %h = %h0
  %l = constant 0.0 : tensor<f32>
  for %x in %xs {
    %h = tanh(%x @ %wx + %h @ %wh + %b)
    %l = %l + sum(%h * %h)
  }
  return %l
}

func @grads(%xs: tensor<6x4x8xf32>, %h0: tensor<4x8xf32>, %wx: tensor<8x8xf32>, %wh: tensor<8x8xf32>,
            %b: tensor<8xf32>) -> (tensor<f32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8xf32>) {
  %l, %dwx, %dwh, %db = grad @loss(%xs, %h0, %wx, %wh, %b) wrt (%wx, %wh, %b)
  return %l, %dwx, %dwh, %db
}
"""

RUN = """\
import json, sys
import gir
from gir.ir.interpreter import random_inputs
fn = gir.jit(sys.argv[1], "grads")
outs = fn(*random_inputs(gir.parse(sys.argv[1]).functions["grads"], 0))
s = fn.stats.compile
print(json.dumps({"cache": s.cache, "passes": sorted(s.passes), "stages": sorted(s.stages), "tier": s.tier,
                  "preparing": s.preparing, "outs": [o.tolist() for o in outs]}))
"""

BUSY = "while True: pass"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GIR_CACHE_DIR", str(root))
    for name in ("GIR_CACHE", "GIR_LLVM_OPT", "GIR_LLVM_TIER", "GIR_CACHE_MAX_MB"):
        monkeypatch.delenv(name, raising=False)
    return root


def _run_process(root: Path) -> dict:
    # GIR_LLVM_EXIT_WAIT=0: exit never waits for the -O3 code, as on a busy machine that misses
    # the wait: what is stored is what ran (the quick code, unless the -O3 code came in time)
    env = {**os.environ, "GIR_CACHE_DIR": str(root), "GIR_LLVM_EXIT_WAIT": "0"}
    proc = subprocess.run([sys.executable, "-c", RUN, RNN], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_three_fresh_processes_beside_two_busy_ones(own_cache: Path) -> None:
    """The issue's test: two CPU-bound processes run beside; the first of three fresh processes
    compiles, the second and third load from the cache (no passes, no LLVM stages) and agree."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        runs = [_run_process(own_cache) for _ in range(3)]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    first, *later = runs
    assert first["cache"] == "miss" and first["passes"]
    for run in later:
        assert run["cache"] == "hit", run
        assert run["passes"] == [] and run["stages"] == ["cache-load"], run  # nothing compiled
        for got, want in zip(run["outs"], first["outs"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # quick and -O3 code may round apart


def _held_back(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    gate = threading.Event()
    run = tiers.FinalCompile.run_job

    def gated(self: tiers.FinalCompile) -> None:
        gate.wait(60)
        run(self)

    monkeypatch.setattr(tiers.FinalCompile, "run_job", gated)
    return gate


def test_stats_run_v_and_cache_info_say_so(own_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")  # the model's paths are final: one better version, -O3
    gate = _held_back(monkeypatch)
    path = tmp_path / "rnn.gir"
    path.write_text(RNN)
    fn = gir.jit(str(path), "grads")
    s = fn.stats.compile
    assert s.cache == "miss" and s.tier == "quick" and s.preparing == "-O3 code"
    assert "quick code; preparing -O3 code in the background" in s.describe()
    assert compile_cache.wait_for_stores(60)  # the quick code is stored beside the first call
    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert "@grads (6x4x8, 4x8, 8x8, 8x8, 8): quick code (-O3 pending)" in info, info
    # `gir run -v` of the same file: a hit on the quick entry, -O3 being prepared (its wait for
    # the background compile is skipped here: the gate holds it)
    monkeypatch.setattr(cli, "_wait_for_final_code", lambda: None)
    assert cli.main(["run", str(path), "--entry", "grads", "-v"]) == 0
    err = capsys.readouterr().err
    assert "code cache: hit" in err and "preparing -O3 code in the background" in err, err
    gate.set()
    assert fn.compiled.wait_for_final_code(60)
    assert tiers.wait_all(60)
    assert fn.stats.compile.preparing == "" and fn.stats.compile.tier == "final"
    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert "@grads (6x4x8, 4x8, 8x8, 8x8, 8): final -O3 code, GEMM paths" in info and "pending" not in info, info
    assert "signature @grads" in info
    again = gir.jit(str(path), "grads")
    assert again.stats.compile.cache == "hit" and again.stats.compile.preparing == ""
    a = random_inputs(gir.parse(RNN).functions["grads"], 1)
    for got, want in zip(again(*a), fn(*a)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
