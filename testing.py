"""Comparing results the way gir's own tests do: a backend's arrays against the interpreter's.

    from gir.testing import assert_all_close
    assert_all_close(gir.jit(m, "f")(*args), gir.jit(m, "f", device="interp")(*args))

Integers and booleans must be equal; floats must have their nan and inf in the same places
and differ by at most `rtol` times the largest finite magnitude of the expected array (a GEMM
that sums in another order rounds differently, by an amount that scales with the result).
"""

from __future__ import annotations

import numpy as np

RTOL = {"f32": 1e-4, "f64": 1e-10}
"""The default tolerance by dtype (float32 GEMMs of a training step stay well inside 1e-4)."""


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "") -> None:
    """Equal shapes and dtypes; integers and booleans exactly; floats with the same nan and inf
    positions and |got - want| <= rtol * (largest finite magnitude of want)."""
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}"
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: got {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: nan positions differ")
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{what}: inf positions differ")
    finite = np.isfinite(want)
    assert np.all(np.isfinite(got[finite])), f"{what}: got inf/nan where the interpreter has finite values"
    scale = float(np.max(np.abs(want[finite]), initial=0.0))
    err = float(np.max(np.abs(got[finite].astype(np.float64) - want[finite]), initial=0.0))
    assert err <= rtol * max(scale, float(np.finfo(want.dtype).tiny)), \
        f"{what}: max error {err:.3g} > {rtol:g} * {scale:.3g}\ngot:\n{got}\nwant:\n{want}"


def assert_all_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float | None = None,
                     what: str = "") -> None:
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        r = rtol if rtol is not None else RTOL["f64" if w.dtype == np.float64 else "f32"]
        assert_close(g, w, r, f"{what} result {i}")
