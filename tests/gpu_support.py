"""What every GPU test module starts with: `DEV = device_or_skip()` at its top, then
`pytestmark = pytest.mark.gpu`.

Without a GPU the GPU tests run in Numba's CUDA simulator: tests/conftest.py sets
NUMBA_ENABLE_CUDASIM to 1 unless it is set already, before any test module is imported (so
before anything imports numba; importing gir imports no numba). On a machine with a GPU,
`NUMBA_ENABLE_CUDASIM=0 python -m pytest -m gpu` runs the same tests on it."""

from __future__ import annotations

import gir
import pytest
from gir.backend.gpu.device import Device, get_device


def device_or_skip() -> Device:
    """The GPU backend's device (the simulator's, or the GPU's); the calling module is skipped
    where numba-cuda is missing, or where numba.cuda was imported without the simulator and
    there is no GPU."""
    pytest.importorskip("numba.cuda", reason="the GPU backend needs numba-cuda (pip install 'gir[gpu]')")
    try:
        return get_device()
    except gir.GirError as e:
        pytest.skip(f"no GPU backend here: {e.message}", allow_module_level=True)
