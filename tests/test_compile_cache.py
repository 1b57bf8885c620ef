"""The compile cache (driver/compile_cache.py, support/cache.py): keys known before any work, a hit that skips
parsing, the passes and LLVM, corrupt entries recompiled, the size bound, processes sharing a
cache, `gir cache info|clear`; the parser tables on disk; GEMM paths from the model refined
once measured (in the background: the lookup loads what exists); the reproducer replay of the
pass manager; the --timing tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.cpu import blas
from gir.backend.cpu.code import Code
from gir.cli import main
from gir.driver import compile_cache
from gir.ir.interpreter import random_inputs
from gir.passes.pass_manager import PassManager
from gir.support import cache, timing

SOURCE = """\
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return tanh(%x @ %w) * 2.0
}
"""

DYNAMIC = """\
func @g(%x: tensor<?x4xf64>) -> tensor<?x4xf64> {
  return exp(%x) + %x
}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GIR_CACHE_DIR", str(root))
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.delenv("GIR_CACHE_MAX_MB", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")  # the model's paths, final: no refinement in between
    monkeypatch.setenv("GIR_LLVM_TIER", "0")  # stored at once (tiered stores: tests/test_compile_tiers.py)
    return root


def _args() -> list[np.ndarray]:
    return random_inputs(gir.parse(SOURCE).functions["f"], 0)


def test_a_hit_skips_parsing_passes_and_llvm(monkeypatch: pytest.MonkeyPatch) -> None:
    first = gir.jit(SOURCE, "f")
    assert first.compiled.code.info.from_cache == ""
    want = first(*_args())[0]

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("a hit must not parse, run passes or lower")

    jit_module = sys.modules["gir.driver.jit"]  # `gir.jit` is the function
    monkeypatch.setattr(jit_module, "parse", boom)
    monkeypatch.setattr("gir.driver.compile.PassManager", boom)  # the drivers' one pass manager
    monkeypatch.setattr("gir.backend.cpu.llvm_jit.lower_function", boom)
    second = gir.jit(SOURCE, "f")
    assert second.compiled.code.info.from_cache == "compiled"
    np.testing.assert_array_equal(second(*_args())[0], want)
    # What inspection needs is in the entry: the gir IR, LLVM IR before/after, assembly, stats.
    assert second.ir == first.ir and "fused" in second.ir
    assert second.llvm_ir == first.llvm_ir and "gir_main" in second.asm
    assert second.stats.compile is not None and second.stats.compile.opt_level == first.stats.compile.opt_level
    assert second.stats.gemm_calls == 1
    assert second.signature.name == "f" and [str(t) for t in second.signature.arg_types] == \
        ["tensor<3x4xf32>", "tensor<4x2xf32>"]


def test_the_key_covers_text_file_entry_pipeline_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa")
    assert base == compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa")
    others = [compile_cache.source_key(SOURCE + "\n", "<jit>", "f", "cpu", "ssa"),
              compile_cache.source_key(SOURCE, "a.gir", "f", "cpu", "ssa"),
              compile_cache.source_key(SOURCE, "<jit>", None, "cpu", "ssa"),
              compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa,canonicalize")]
    monkeypatch.setenv("GIR_GEMM_PATH", "openblas")
    others.append(compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa"))
    monkeypatch.delenv("GIR_GEMM_PATH")
    monkeypatch.setenv("GIR_LLVM_OPT", "1")
    others.append(compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa"))
    assert base not in others and len(set(others)) == len(others)
    assert compile_cache.source_key(SOURCE, "<jit>", "f", "interp", "ssa") is None  # no cache for the interpreter
    monkeypatch.setenv("GIR_CACHE", "0")
    assert compile_cache.source_key(SOURCE, "<jit>", "f", "cpu", "ssa") is None


def test_each_shape_of_a_dynamic_signature_is_its_own_entry(own_cache: Path) -> None:
    fn = gir.jit(DYNAMIC, "g")
    for rows in (2, 5):
        x = np.linspace(-1, 1, rows * 4).reshape(rows, 4)
        np.testing.assert_allclose(fn(x)[0], np.exp(x) + x, rtol=1e-12)
    assert len(list((own_cache / "compiled").glob("*.entry"))) == 2
    again = gir.jit(DYNAMIC, "g")
    assert again._source is None  # the signature came from the cache: nothing parsed
    x = np.ones((5, 4))
    np.testing.assert_allclose(again(x)[0], np.exp(x) + x)
    assert again.compiled.code.info.from_cache == "compiled"
    x = np.ones((7, 4))  # a new shape misses: the source is parsed then
    np.testing.assert_allclose(again(x)[0], np.exp(x) + x)
    assert again.compiled.code.info.from_cache == "" and again._source is not None


def test_a_module_given_in_python_is_cached_by_its_printed_form() -> None:
    module = gir.parse(SOURCE, "m.gir")
    assert gir.jit(module, "f").compiled.code.info.from_cache == ""
    assert gir.jit(gir.parse(SOURCE, "m.gir"), "f").compiled.code.info.from_cache == "compiled"


def test_a_file_path_is_cached_and_an_edited_file_is_not_stale(tmp_path: Path) -> None:
    path = tmp_path / "p.gir"
    path.write_text(SOURCE)
    assert gir.jit(str(path), "f").compiled.code.info.from_cache == ""
    assert gir.jit(str(path), "f").compiled.code.info.from_cache == "compiled"
    path.write_text(SOURCE.replace("* 2.0", "* 3.0"))
    fn = gir.jit(str(path), "f")
    assert fn.compiled.code.info.from_cache == ""
    x, w = _args()
    np.testing.assert_allclose(fn(x, w)[0], np.tanh(x @ w) * 3.0, rtol=1e-5)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_corrupt_entry_is_recompiled_and_replaced(own_cache: Path, damage: str) -> None:
    want = gir.jit(SOURCE, "f")(*_args())[0]
    entries = sorted((own_cache / "compiled").glob("*.entry")) + sorted((own_cache / "objects").glob("*.entry"))
    assert entries
    for path in entries:
        data = path.read_bytes()
        if damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "flip":
            data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
        else:
            data = b"not an entry at all"
        path.write_bytes(data)
    fn = gir.jit(SOURCE, "f")
    assert fn.compiled.code.info.from_cache == ""  # neither level accepted a damaged entry
    np.testing.assert_array_equal(fn(*_args())[0], want)
    assert gir.jit(SOURCE, "f").compiled.code.info.from_cache == "compiled"  # and it was replaced


def test_the_cache_is_bounded_least_recently_used_first(own_cache: Path) -> None:
    for i in range(6):
        cache.store("compiled", f"k{i}", {"i": i}, bytes(100_000))
        os.utime(own_cache / "compiled" / f"k{i}.entry", (1000 + i, 1000 + i))
    assert cache.load("compiled", "k0") is not None  # a hit makes k0 the most recent
    removed = cache.trim(limit=350_000)
    left = sorted(p.stem for p in (own_cache / "compiled").glob("*.entry"))
    assert removed == 3 and left == ["k0", "k4", "k5"]
    assert cache.trim(limit=350_000) == 0


def test_the_bound_is_applied_on_store(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CACHE_MAX_MB", "0.5")
    for i in range(12):
        cache.store("compiled", f"k{i}", {}, bytes(100_000))
    total = sum(p.stat().st_size for p in (own_cache / "compiled").glob("*.entry"))
    assert total <= 0.5 * 1024 * 1024


CONCURRENT = """\
import sys, numpy as np, gir
fn = gir.jit(sys.argv[1], "f")
x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
w = np.ones((4, 2), np.float32)
print(repr(fn(x, w)[0].tolist()))
"""


def test_processes_sharing_a_cache(own_cache: Path) -> None:
    env = {**os.environ, "GIR_CACHE_DIR": str(own_cache), "GIR_GEMM_MEASURE": "off"}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, SOURCE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert len({o for o, _ in outs}) == 1
    assert not [p for p in own_cache.rglob("*") if ".tmp." in p.name]  # every write was renamed into place


def test_cli_cache_info_and_clear(own_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gir.jit(SOURCE, "f")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(own_cache) in out and "compiled entries: 3" in out  # signature, specialisation, object
    (own_cache / "not-ours.txt").write_text("a file gir did not write")
    (own_cache / "gemm-thread-times-0123.json").write_text("{}")  # the two-core schedule's times: gir's own
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not list(own_cache.rglob("*.entry")) and not list(own_cache.glob("parser-*"))
    assert not list(own_cache.glob("gemm-*"))
    assert (own_cache / "not-ours.txt").exists()  # GIR_CACHE_DIR may be a shared folder
    assert main(["cache", "info"]) == 0
    assert "compiled entries: 0" in capsys.readouterr().out


def test_gir_run_hits_the_cache_and_times_as_one_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.gir"
    path.write_text(SOURCE)
    assert main(["run", str(path), "--timing"]) == 0
    cold = capsys.readouterr()
    assert "gir compile timing report" in cold.err
    for phase in ("parse", "verify", "pass ssa", "LLVM: optimise", "LLVM: emit object", "cache: store"):
        assert phase in cold.err, phase
    assert main(["run", str(path), "--timing"]) == 0
    warm = capsys.readouterr()
    assert warm.out == cold.out  # same results
    assert "cache: lookup" in warm.err and "LLVM" not in warm.err and "pass ssa" not in warm.err


def test_parser_tables_are_kept_on_disk(own_cache: Path) -> None:
    env = {**os.environ, "GIR_CACHE_DIR": str(own_cache)}
    # With the shipped terminal table (frontend/terminals_table.json) valid text needs no Lark
    # and writes nothing to the cache.
    code = "import gir, sys; gir.parse(sys.argv[1]); print('ok', 'lark' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code, SOURCE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok False", proc.stderr[-2000:]
    assert not list(own_cache.glob("parser-*"))
    # Without it (a table made with another Lark version reads as absent), the table is built
    # from Lark's parser once and kept in the cache as JSON; Lark's own tables (a pickle) never are.
    code = ("import gir, sys; import gir.frontend.terminals as t; t.SHIPPED = '/nonexistent/terminals.json'; "
            "gir.parse(sys.argv[1]); print('ok')")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, SOURCE], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert not list(own_cache.glob("parser-*.lark"))
    terminals = list(own_cache.glob("parser-*.terminals.json"))
    assert len(terminals) == 1 and "skipping_regex" in json.loads(terminals[0].read_text())
    assert terminals[0].stat().st_mode & 0o777 == 0o600
    # A damaged table is built again and replaced by the next parse.
    terminals[0].write_bytes(b"damaged")
    proc = subprocess.run([sys.executable, "-c", code, SOURCE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert "skipping_regex" in json.loads(terminals[0].read_text())


PLANT = """import os, pickle, sys
import lark
import gir
try:  # the layout change moves cache.py to support/
    from gir.support import cache
except ImportError:
    from gir import cache

class Boom:
    def __reduce__(self):
        return (os.mkdir, (sys.argv[1],))

grammar = open(os.path.join(os.path.dirname(gir.__file__), "frontend", "grammar.lark")).read()
name = f"parser-{cache.digest(grammar, lark.__version__, sys.version_info[:2])}.lark"
os.makedirs(cache.cache_root(), mode=0o700, exist_ok=True)
with open(os.path.join(cache.cache_root(), name), "wb") as f:
    pickle.dump(Boom(), f)
"""


@pytest.mark.parametrize("cache_switch", ["1", "0"])
def test_a_planted_parser_table_is_never_unpickled(own_cache: Path, tmp_path: Path, cache_switch: str) -> None:
    """Issue 31: Lark's tables were `pickle.load`ed from the cache folder for every text with a
    syntax error (even with GIR_CACHE=0), at a name anyone can compute."""
    marker = tmp_path / "ran-planted-code"
    env = {**os.environ, "GIR_CACHE_DIR": str(own_cache), "GIR_CACHE": cache_switch}
    proc = subprocess.run([sys.executable, "-c", PLANT, str(marker)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = ("import gir, sys\ntry:\n    gir.parse('func @f( {')\nexcept gir.GirSyntaxError as e:\n"
            "    print('syntax error:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "syntax error" in proc.stdout, proc.stderr[-2000:]
    assert not marker.exists()


def test_timing_tree_nests_phases() -> None:
    with timing.collect("top") as root:
        with timing.phase("a"):
            with timing.phase("b"):
                time.sleep(0.001)
        with timing.phase("a"):
            pass
    a = root.find("a")
    assert a is not None and a.count == 2 and root.find("b") is not None
    assert "a (x2)" in root.tree() and "100.0%  top" in root.tree()
    with timing.phase("outside"):  # no tree: nothing recorded, nothing raised
        pass


@pytest.mark.skipif(not blas.providers().has_mkl, reason="one provider: nothing to choose")
def test_gemm_paths_from_the_model_are_refined_once_measured(monkeypatch: pytest.MonkeyPatch,
                                                           own_cache: Path) -> None:
    monkeypatch.setenv("GIR_GEMM_MEASURE", "background")
    monkeypatch.setattr(blas, "_choices", None)  # this test's cache dir: nothing measured yet
    fn = gir.jit(SOURCE, "f")
    assert fn.compiled.code.info.gemm_measured is False and fn.compiled.layout.provisional
    assert blas.wait_for_measurements(120)
    assert list(own_cache.glob(f"gemm-times-{blas.machine_key()}.json"))
    asked: list[bool] = []
    stale = Code.stale
    monkeypatch.setattr(Code, "stale", lambda self: asked.append(stale(self)) or asked[-1])
    again = gir.jit(SOURCE, "f")  # the entry there is: loaded, never compiled again in the lookup (issue 28)
    assert again.compiled.code.info.from_cache == "compiled" and again.stats.compile.cache == "hit"
    assert again.compiled.code.info.gemm_measured is False
    # whether the model's paths are measured now (it loads MKL) is asked after the first call
    assert asked == [] and again.compiled.compile_stats.preparing == ""
    np.testing.assert_allclose(again(*_args())[0], fn(*_args())[0], rtol=1e-5)
    assert again.compiled.wait_for_final_code(120), again.compiled.final_error  # made in the background
    assert asked[:1] == [True]  # (the object cache asks again for its entry)
    assert again.compiled.code.info.gemm_measured is True and again.stats.compile.preparing == ""
    np.testing.assert_allclose(again(*_args())[0], fn(*_args())[0], rtol=1e-5)
    third = gir.jit(SOURCE, "f")  # the better code replaced the entry
    assert third.compiled.code.info.from_cache == "compiled" and third.compiled.code.info.gemm_measured is True
    assert third.compiled.compile_stats.preparing == ""


HIT_IN_A_NEW_PROCESS = """\
import json, sys
import numpy as np
import gir
from gir.backend.cpu import blas, tiers
held = []
tiers.submit = held.append  # background jobs are held: nothing runs beside the first call
fn = gir.jit(sys.argv[1], "f")
queued_at_lookup = len(held)
x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
w = np.linspace(0, 2, 8, dtype=np.float32).reshape(4, 2)
out = fn(x, w)[0]
with open("/proc/self/maps") as f:
    mkl_mapped = any("libmkl" in line for line in f)
print(json.dumps({"from_cache": fn.compiled.code.info.from_cache, "paths": sorted(fn.stats.gemm_paths),
                  "providers_called": blas.providers.cache_info().currsize, "mkl_mapped": mkl_mapped,
                  "from_model": fn.compiled.code.from_model(), "queued_at_lookup": queued_at_lookup,
                  "queued_after_call": len(held), "out": out.tolist()}))
"""


@pytest.mark.parametrize("path", ["openblas", "mkl"])
def test_a_hit_whose_code_calls_no_mkl_loads_no_mkl(own_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                    path: str) -> None:
    """Issue 28: a hit in a new process costs what it must (loading MKL is ~6 ms): the key is
    computed from files, MKL's table slots are filled only for code that calls MKL, and whether
    the model's decisions are measured now is asked after the first call, in the background."""
    if path == "mkl" and not blas.providers().has_mkl:
        pytest.skip("no MKL here")
    monkeypatch.setenv("GIR_GEMM_PATH", path)
    fn = gir.jit(SOURCE, "f")  # compiled and stored here, final code at once (GIR_LLVM_TIER=0)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    w = np.linspace(0, 2, 8, dtype=np.float32).reshape(4, 2)
    want = fn(x, w)[0]
    proc = subprocess.run([sys.executable, "-c", HIT_IN_A_NEW_PROCESS, SOURCE], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["from_cache"] == "compiled" and got["paths"] == [path]
    assert got["providers_called"] == (path == "mkl") and got["mkl_mapped"] == (path == "mkl")
    assert got["queued_at_lookup"] == 0 and got["queued_after_call"] == int(got["from_model"])
    np.testing.assert_array_equal(np.array(got["out"], np.float32), want)


def test_work_queued_after_the_first_call_runs_once_and_never_fails_the_call() -> None:
    fn = gir.jit(SOURCE, "f")
    want = fn(*_args())[0]
    compiled = fn.compiled
    ran: list[int] = []

    def refused() -> None:
        raise RuntimeError("the queue refused the job")

    compiled.after_first_call(refused)
    compiled.after_first_call(lambda: ran.append(1))
    np.testing.assert_array_equal(fn(*_args())[0], want)
    assert ran == [1] and isinstance(compiled.final_error, RuntimeError)
    fn(*_args())
    assert ran == [1]


FAILING_PIPELINE = "ssa,canonicalize,test-crash-on-mul"


def test_reproducer_by_replay_equals_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `reparse` the pass manager prints the input once and replays the passes before the
    failing one; the reproducer is the same text as printing before every pass gave."""
    import importlib.util

    from gir.passes.pipeline import PASSES

    spec = importlib.util.spec_from_file_location("gir_test_passes_for_cache", Path(__file__).parent / "test_passes.py")
    assert spec is not None and spec.loader is not None
    tests = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tests
    spec.loader.exec_module(tests)  # its failing test passes
    TEST_PASSES, module = tests.TEST_PASSES, tests.module
    for cls in TEST_PASSES:
        monkeypatch.setitem(PASSES, cls.name, cls)
    texts = []
    for reparse, folder in ((None, tmp_path / "a"), (gir.parse, tmp_path / "b")):
        with pytest.raises(gir.GirPassError) as info:
            PassManager(FAILING_PIPELINE, reproducer=True, reproducer_dir=str(folder), reparse=reparse).run(module())
        texts.append(Path(info.value.reproducer).read_text().split("\n", 2)[2])  # type: ignore[attr-defined]
    assert texts[0] == texts[1] and "scan" in texts[0]
