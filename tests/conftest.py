"""Fixtures every test gets.

A test's GEMM measurements belong to it: queued in the background (blas.measure_in_background)
and left running, they went on measuring through later tests, on the cores those tests time and
with the module state they monkeypatch. After each test the queue is dropped and the running
measurement is waited for. (Where a measurement stores is fixed when it is queued: the cache
folder of its test, tests/test_background_isolation.py.)

The GPU tests run in Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM is set already
(`NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` on a GPU): set here, before any test module
is imported and so before anything imports numba (tests/gpu_support.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


@pytest.fixture(autouse=True)
def _no_gemm_measurement_outlives_its_test() -> Iterator[None]:
    yield
    blas = sys.modules.get("gir.backend.cpu.blas")
    if blas is not None:
        assert blas.drop_queued_measurements(120), "a GEMM measurement still runs after 120 s"
