"""Compiled code as a shared library (backend/cpu/native.py, externals.py): the compile cache
stores the final object linked by the system linker, and a hit loads it with the dynamic
loader, without LLVM; anything that goes wrong there falls back to LLVM's JIT linker.

The interpreter is the oracle: code loaded either way gives its results, also on the two-core
schedule's worker thread and from several threads at once.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys
import threading

import gir
import numpy as np
import pytest
from gir.backend.cpu import externals, native, runtime
from gir.errors import GirError
from gir.ir.interpreter import random_inputs
from gir.testing import assert_all_close
from rnn_cases import training_step

SOURCE = """\
func @f(%x: tensor<5x7xf32>, %w: tensor<7x3xf32>) -> tensor<5x3xf32> {
  return tanh(%x @ %w) * 2.0 + exp(%x @ %w)
}
"""

needs_linker = pytest.mark.skipif(native._linker() is None, reason="no system linker (cc, gcc, clang or ld) here")


@pytest.fixture(autouse=True)
def own_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GIR_CACHE_DIR", str(root))
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.delenv("GIR_CPU_SHARED", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")  # the model's paths: an entry is final at once
    monkeypatch.setenv("GIR_LLVM_TIER", "0")  # -O3 at once, stored at once
    return root


def _args() -> list[np.ndarray]:
    return random_inputs(gir.parse(SOURCE).functions["f"], 0)


def _want() -> list[np.ndarray]:
    return list(gir.jit(SOURCE, "f", device="interp")(*_args()))


@needs_linker
def test_a_hit_loads_the_shared_library_and_matches_the_interpreter() -> None:
    first = gir.jit(SOURCE, "f")
    assert first.compiled.code.info.from_cache == ""
    assert not isinstance(first.compiled._entry.engine, native.Library)  # compiled here: LLVM loaded it
    second = gir.jit(SOURCE, "f")
    assert second.compiled.code.info.from_cache == "compiled"
    assert second.compiled.code.shared is not None
    assert isinstance(second.compiled._entry.engine, native.Library)
    assert_all_close(list(second(*_args())), _want(), what="shared library")
    np.testing.assert_array_equal(second(*_args())[0], first(*_args())[0])  # the same -O3 code
    assert "gir_main" in second.asm  # inspection still works (it loads LLVM then)


HIT_IN_A_NEW_PROCESS = """\
import json, sys
import gir
from gir.ir.interpreter import random_inputs
fn = gir.jit(sys.argv[1], "f")
out = fn(*random_inputs(fn.signature, 0))[0]
print(json.dumps({"cache": fn.compiled.code.info.from_cache, "llvm": "llvmlite.binding" in sys.modules,
                  "out": out.tolist(), "threads": fn.stats.compile.threads}))
"""


@needs_linker
def test_a_hit_in_a_new_process_never_loads_llvm(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f.gir"
    path.write_text(SOURCE)
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(gir.__file__).resolve().parent.parent)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", HIT_IN_A_NEW_PROCESS, str(path)], env=env, check=True,
                                      capture_output=True, text=True, timeout=300).stdout) for _ in range(2)]
    assert runs[0]["cache"] == "" and runs[0]["llvm"]
    assert runs[1]["cache"] == "compiled" and not runs[1]["llvm"], runs[1]
    assert runs[1]["out"] == runs[0]["out"] and runs[1]["threads"] >= 1


def _mapped_libraries() -> int:
    """How many of native.load's libraries this process has mapped (Linux's /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return len({word for line in f for word in line.split() if "load.tmp." in word})  # "... (deleted)"


@needs_linker
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_two_loads_are_independent_and_closed_when_unused(own_cache: pathlib.Path) -> None:
    gir.jit(SOURCE, "f")
    before = _mapped_libraries()
    a, b = gir.jit(SOURCE, "f"), gir.jit(SOURCE, "f")
    assert a.compiled._entry.engine is not b.compiled._entry.engine
    assert _mapped_libraries() == before + 2  # a file of its own each
    assert not list((own_cache / "compiled").glob("load.tmp.*"))  # deleted once open
    want = a(*_args())[0]
    from gir.backend.cpu import tiers

    # A hit on quick code holds its function while the -O3 code is made for it (issue 28's
    # "better code in the background"): the library is closed once nothing uses it, that job included.
    assert tiers.wait_all(120)
    del a
    gc.collect()
    assert _mapped_libraries() == before + 1  # a's library is closed; b's is its own
    np.testing.assert_array_equal(b(*_args())[0], want)


@pytest.mark.parametrize("broken", ["garbage", "no linker", "switched off"])
def test_without_a_usable_library_llvm_loads_the_object(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if broken == "no linker":
        monkeypatch.setattr(native, "_linker", lambda: None)
    elif broken == "switched off":
        monkeypatch.setenv("GIR_CPU_SHARED", "0")
    gir.jit(SOURCE, "f")
    hit = gir.jit(SOURCE, "f")
    code = hit.compiled.code
    assert code.info.from_cache == "compiled"
    if broken == "garbage":
        code = runtime.Code(code.obj, code.layout, code.optimized_ir, code.llvm_ir, code.info, shared=b"\x7fELF junk")
        hit = runtime.CPUFunction(hit.compiled.function, code=code)
        run = hit
    else:
        assert code.shared is None
        run = hit.compiled
    assert not isinstance(run._entry.engine, native.Library)
    assert_all_close(list(run(*_args())), _want(), what=f"LLVM-loaded ({broken})")


@needs_linker
def test_shared_library_code_is_safe_from_several_threads() -> None:
    gir.jit(SOURCE, "f")
    fn = gir.jit(SOURCE, "f")
    assert isinstance(fn.compiled._entry.engine, native.Library)
    inputs = [random_inputs(fn.signature, seed) for seed in range(4)]
    wants = [gir.jit(SOURCE, "f", device="interp")(*a)[0] for a in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(50):
            got = fn(*inputs[i])[0]
            if not np.allclose(got, wants[i], rtol=1e-5, atol=1e-5):
                errors.append(f"thread {i}: {np.abs(got - wants[i]).max()}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


@needs_linker
def test_the_two_core_schedule_runs_from_the_shared_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CPU_OVERLAP", "1")  # gir_worker, the futex and the thread setters: all externals
    src, args, want = training_step("gru", 6, 3, 4, 5)
    gir.jit(src, "gru_grads")
    fn = gir.jit(src, "gru_grads")
    if isinstance(fn.stats.schedule.get("overlap"), str):
        pytest.skip(f"two-core schedule unavailable here: {fn.stats.schedule['overlap']}")
    assert isinstance(fn.compiled._entry.engine, native.Library) and fn.compiled._entry.worker is not None
    for _ in range(3):
        assert_all_close(list(fn(*args)), list(want), what="gru with the worker, shared library")


def test_code_calling_a_missing_external_is_refused() -> None:
    fn = gir.jit(SOURCE, "f")
    code = fn.compiled.code
    assert code.layout.externals and set(code.layout.externals) <= set(externals.SLOTS)
    code.layout.externals = [*code.layout.externals, "no_such_function"]
    with pytest.raises(GirError, match="no_such_function") as raised:
        runtime.CPUFunction(fn.compiled.function, code=code)
    assert raised.value.loc == fn.compiled.function.loc  # the function's file:line:col


SHORT_SCRIPT = """\
import json, sys
import gir
from gir.ir.interpreter import random_inputs
fn = gir.jit(sys.argv[1], "f")
out = fn(*random_inputs(fn.signature, 0))[0]
print(json.dumps({"cache": fn.compiled.code.info.from_cache, "tier": fn.compiled.code.info.tier}))
"""


def test_a_short_script_stores_its_final_code_at_exit(tmp_path: pathlib.Path) -> None:
    """Tiered (the quick code ran and the process ended at once): exit finishes the -O3 compile
    and stores it, so the second run hits (before, it compiled again). GIR_LLVM_EXIT_WAIT=0 is
    not tested to store nothing: an -O3 compile this small may finish before exit anyway."""
    path = tmp_path / "f.gir"
    path.write_text(SOURCE)
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(gir.__file__).resolve().parent.parent),
           "GIR_LLVM_EXIT_WAIT": "3"}
    env.pop("GIR_LLVM_TIER")
    runs = [json.loads(subprocess.run([sys.executable, "-c", SHORT_SCRIPT, str(path)], env=env, check=True,
                                      capture_output=True, text=True, timeout=300).stdout) for _ in range(2)]
    assert runs[0]["cache"] == "" and runs[0]["tier"] in ("quick", "final")  # final: -O3 was quick to swap in
    assert runs[1]["cache"] == "compiled", runs


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo")
def test_the_cache_key_names_the_cpu_without_llvm() -> None:
    """Code compiled for the host CPU (its features) must never be loaded on another CPU from a
    shared cache folder: the key holds the CPU's /proc/cpuinfo entry (it held nothing while the
    fields' tab-padded names were not stripped), not its clock."""
    host = runtime.host_id()
    assert any(x.startswith(("flags=", "Features=")) and len(x) > 20 for x in host), host
    assert not any(x.lower().startswith(("cpu mhz=", "bogomips=")) for x in host)
