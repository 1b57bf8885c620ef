"""gir reads its switches through config.current() (issue 27): the environment is read at each
call, `config.override` reaches every reader, and the cache keys follow config.code_key, so a
code-changing switch cannot be left out of a key. (tests/test_architecture.py checks that no
module but config.py reads os.environ.)"""

from __future__ import annotations

import dataclasses

import pytest
from gir import config
from gir.backend.cpu import blas, overlap, runtime, team, tiers
from gir.driver import compile_cache
from gir.support import cache


def test_every_code_field_changes_the_object_cache_key() -> None:
    """target_key (the object cache) and the compile cache's key part differ for every
    code-changing option set to a non-default value, and not for a non-code one."""
    base = runtime.target_key()
    changes = {"llvm_opt": 1, "gemm_path": "openblas", "packed_gemm": False, "cpu_arena": False,
               "cpu_overlap": "0", "cpu_split": "0", "openblas": "scipy", "no_mkl": True, "gpu_arena": False,
               "gpu_graphs": False, "gpu_persistent": "on", "lengths": False}
    assert set(changes) == set(config.CODE_FIELDS), "a new code field: give it a value here"
    for name, value in changes.items():
        with config.override(**{name: value}):
            assert runtime.target_key() != base, name
            assert compile_cache._environment() != config.code_key(config.Options()), name
    with config.override(progress="1", cache_max_bytes=None):
        assert runtime.target_key() == base


def test_environment_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIR_CPU_SPLIT", "1")
    monkeypatch.setenv("GIR_CPU_OVERLAP", "whole")
    monkeypatch.setenv("GIR_GEMM_MEASURE", "now")
    monkeypatch.setenv("GIR_PACKED_GEMM", "0")
    assert (team.mode(), overlap.mode(), blas.measure_mode()) == ("1", "whole", "now")
    assert "gir-packed" not in blas._candidates(True)
    monkeypatch.setenv("GIR_CPU_SPLIT", "nonsense")  # a value that does not parse: the default
    assert team.mode() == "auto"
    with config.override(cpu_split="0"):  # an override wins over the environment
        assert team.mode() == "0"


def test_llvm_level_and_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GIR_LLVM_OPT", raising=False)
    monkeypatch.delenv("GIR_LLVM_TIER", raising=False)
    assert runtime.opt_level() == runtime.DEFAULT_OPT and tiers.enabled()
    monkeypatch.setenv("GIR_LLVM_OPT", "7")  # clamped to 0-3, as before
    assert runtime.opt_level() == 3 and not tiers.enabled()
    monkeypatch.delenv("GIR_LLVM_OPT")
    monkeypatch.setenv("GIR_LLVM_TIER", "off")
    assert not tiers.enabled()
    monkeypatch.setenv("GIR_LLVM_EXIT_WAIT", "x")
    assert tiers.exit_finish() == 3.0


def test_cache_bound(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("GIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GIR_CACHE_MAX_MB", "inf")  # no bound: trimming deletes nothing
    assert cache.max_bytes() is None and cache.trim() == 0
    assert "no bound" in cache.info().text()
    monkeypatch.setenv("GIR_CACHE_MAX_MB", "0.5")
    assert cache.max_bytes() == 512 * 1024
    assert cache.cache_root() == str(tmp_path)


def test_blas_thread_variables_key_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = blas.thread_setting()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert blas.thread_setting() != one
    assert dataclasses.is_dataclass(config.current())


@pytest.mark.parametrize(("text", "bound"), [(None, 64), ("", 64), ("8", 8), ("1", 1), (" 12 ", 12), ("0", None),
                                              ("-3", None), ("inf", None), ("none", None), ("many", 64), ("2.5", 64)])
def test_max_specialisations_parses_every_spelling(text: str | None, bound: int | None) -> None:
    """GIR_MAX_SPECIALISATIONS (driver/specialisations.py): a positive count; 0, a negative
    number, `inf` or `none` is no bound; anything else the default, 64. Never raises."""
    environ = {} if text is None else {"GIR_MAX_SPECIALISATIONS": text}
    assert config.from_environ(environ).max_specialisations == bound
