"""Which OpenBLAS the `openblas` GEMM path calls (backend/cpu/blas.py `openblas()`): NumPy's
ILP64 build by default, SciPy's with GIR_OPENBLAS=scipy; compiled code passes integers of the
library's width either way (a 32-bit dimension read as 64 bits would be a garbage size)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gir.backend.cpu import blas

PROGRAM = """
import numpy as np, gir
from gir.backend.cpu import blas
f = gir.jit('''func @f(%a: tensor<37x300xf32>, %b: tensor<300x45xf32>, %c: tensor<45x300xf64>, %d: tensor<300x2xf64>)
    -> (tensor<37x45xf32>, tensor<45x2xf64>) {
  %x = %a @ %b
  %y = %c @ %d
  return %x, %y
}''', "f")
rng = np.random.default_rng(1)
a, b = rng.standard_normal((37, 300), dtype=np.float32), rng.standard_normal((300, 45), dtype=np.float32)
c, d = rng.standard_normal((45, 300)), rng.standard_normal((300, 2))
x, y = f(a, b, c, d)
assert np.allclose(x, a @ b, rtol=1e-4, atol=1e-4), abs(x - a @ b).max()
assert np.allclose(y, c @ d), abs(y - c @ d).max()
assert all(g.path == "openblas" for g in f.stats.compile.gemms), f.stats.compile.gemms
print(blas.openblas().name if blas.openblas() else "cython_blas", blas.openblas_int_bits())
"""


@pytest.mark.parametrize("choice", ["numpy", "scipy"])
def test_each_openblas_computes_the_same_products(choice: str, tmp_path) -> None:  # noqa: ANN001
    env = dict(os.environ, GIR_OPENBLAS=choice, GIR_GEMM_PATH="openblas", GIR_CACHE_DIR=str(tmp_path),
               GIR_GEMM_MEASURE="off")
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name, bits = out.stdout.split()
    if name == "cython_blas":
        assert bits == "32"
    else:
        assert ("openblas64" in name) == (bits == "64")
        if choice == "scipy":
            assert "openblas64" not in name


def test_default_is_numpys_build_when_its_wheel_bundles_one() -> None:
    found = blas.openblas()
    numpy_libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    bundled = os.path.isdir(numpy_libs) and any("openblas64" in f for f in os.listdir(numpy_libs))
    if os.environ.get("GIR_OPENBLAS") == "scipy" or not bundled:
        pytest.skip("NumPy's wheel bundles no ILP64 OpenBLAS here, or SciPy's is forced")
    assert found is not None and found.int_bits == 64 and "openblas64" in found.name
