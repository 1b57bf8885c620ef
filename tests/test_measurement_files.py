"""The GEMM measurement files in the cache folder (`gemm-times-*.json`: {shape: {path: seconds}},
`gemm-thread-times-*.json`: {shape and part: seconds}) are read as measurements only when they
have that shape: any other content is as if nothing were measured (the shape is measured again
and the file rewritten). Valid JSON of another shape raised TypeError out of every `gir.jit` of
a program with a matmul (issue 31); a FIFO at the path would have blocked it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.backend.cpu import blas, blas_threads

PARAMS = ("f32", 5, 6, 7, False, False, False)

DAMAGED_FILES = ["[1, 2]", "3", "null", '"fast"', "[[1, 2]]", "true", "{", "", "\x00\xff",
                 "[" * 100_000 + "]" * 100_000]


def _fresh(monkeypatch: pytest.MonkeyPatch, folder: Path, mode: str = "off") -> None:
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv("GIR_CACHE_DIR", str(folder))
    monkeypatch.setenv("GIR_GEMM_MEASURE", mode)
    monkeypatch.setattr(blas, "_choices", None)
    monkeypatch.setattr(blas, "_retried", set())
    monkeypatch.setattr(blas_threads, "_times", None)
    monkeypatch.setattr(blas_threads, "_retried", set())


@pytest.mark.parametrize("content", DAMAGED_FILES, ids=range(len(DAMAGED_FILES)))
def test_a_times_file_that_is_not_an_object_of_times_is_absent(tmp_path: Path, content: str) -> None:
    path = tmp_path / "gemm-times.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    assert blas.read_times(str(path)) == {}
    assert blas.read_times(str(path), blas.is_seconds) == {}


def test_entries_of_the_wrong_shape_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "gemm-times.json"
    path.write_text('{"a": {"openblas": 1e-3, "disturbed": 1}, "b": {"openblas": "fast"}, "c": 5, "d": [1], '
                    '"e": {"openblas": null}, "f": {"mkl": true}, "g": {"mkl": -1}, "h": {"mkl": NaN}, "i": {}}')
    assert blas.read_times(str(path)) == {"a": {"openblas": 1e-3, "disturbed": 1}, "i": {}}
    path.write_text('{"a t1": 0.5, "a t0": 2, "b t1": "x", "c t1": {"x": 1}, "d t1": Infinity, "e t1": false}')
    assert blas.read_times(str(path), blas.is_seconds) == {"a t1": 0.5, "a t0": 2}


def test_a_damaged_entry_is_measured_again_and_overwritten(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fresh(monkeypatch, tmp_path, mode="now")
    key = blas._key(*PARAMS)
    Path(blas._cache_file()).write_text(f'{{"{key}": {{"openblas": "fast", "mkl": [1]}}, "other": 3}}')
    monkeypatch.setattr(blas, "_measure_all", lambda candidates, *a: ({c: 1.0 for c in candidates}, False))
    assert set(blas.path_times(*PARAMS).values()) == {1.0}  # type: ignore[union-attr]
    assert blas.read_times(blas._cache_file()) == {key: {c: 1.0 for c in blas._candidates(False)}}


def test_a_fifo_at_the_times_path_does_not_block(tmp_path: Path) -> None:
    path = tmp_path / "gemm-times.json"
    os.mkfifo(path)
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.append(blas.read_times(str(path))), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "blocked opening a FIFO"
    assert got == [{}]


MATMUL = "func @f(%a: tensor<8x16xf32>, %b: tensor<16x4xf32>) -> tensor<8x4xf32> {\n  return %a @ %b\n}\n"


@pytest.mark.parametrize("content", ["[1, 2]", "null", "3"])
def test_jit_of_a_matmul_with_damaged_times_files_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       content: str) -> None:
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("GIR_CACHE", "0")  # compiled, not loaded: the GEMM path is chosen
    Path(blas._cache_file()).write_text(content)
    Path(blas_threads._cache_file()).write_text(content)
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    (got,) = gir.jit(MATMUL, "f")(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
