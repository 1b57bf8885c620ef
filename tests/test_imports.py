"""What `import gir` and `gir opt` load (issue 15: start-up is part of every `gir opt`).

The Python frontend (and driver/pyjit.py) is loaded on first use of one of its names; Lark only when
the hand-written parser declines the text (or GIR_PARSER=lark); the backends, llvmlite, Numba
and SciPy never by `gir opt`. Each check runs in a fresh interpreter, as `sys.modules` of this
one holds whatever other tests imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gir
import pytest

HEAVY = ("gir.frontend.python", "gir.driver.pyjit", "gir.backend", "gir.frontend.lark_parser", "gir.frontend.lexer",
         "lark", "interegular", "regex", "llvmlite", "numba", "scipy")
"""Modules `gir opt` of valid text does not need (roots: their submodules count too)."""

PROGRAM = (Path(gir.__file__).resolve().parent / "examples" / "rnn.gir").read_text()


def loaded_after(code: str, env: dict[str, str]) -> set[str]:
    """The HEAVY modules (or their submodules) in sys.modules after running code in a fresh python."""
    script = (f"{code}\nimport sys, json\n"
              f"print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
              f"for h in {HEAVY!r}))))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GIR_CACHE_DIR": str(tmp_path / "cache")}


def test_import_gir_and_its_cli_load_none_of_the_heavy_modules(env: dict[str, str]) -> None:
    assert loaded_after("import gir, gir.cli", env) == set()


def test_gir_opt_loads_none_of_the_heavy_modules(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "p.gir"
    path.write_text(PROGRAM)
    opt = f"from gir.cli import main\nassert main(['opt', {str(path)!r}, '-o', {os.devnull!r}]) == 0"
    loaded_after(opt, env)  # the first process ever makes the parser tables (from Lark's parser)
    assert loaded_after(opt, env) == set()
    # A syntax error is reported by Lark, imported for it.
    path.write_text(PROGRAM + "\nfunc @broken(%x: tensor<4xf32>) -> tensor<f32> {\n  return sum(%x\n}\n")
    bad = f"from gir.cli import main\nassert main(['opt', {str(path)!r}, '-o', {os.devnull!r}]) == 1"
    assert {"lark", "gir.frontend.lark_parser"} <= loaded_after(bad, env)


def test_the_python_frontend_loads_on_first_use(env: dict[str, str]) -> None:
    code = ("import sys, gir, numpy as np\nassert 'gir.frontend.python' not in sys.modules\n"
            "scan = gir.scan\nfrom gir import value_and_grad, PythonJit\n"
            "assert abs(float(gir.tanh(np.float32(0.5))) - float(np.tanh(np.float32(0.5)))) < 1e-6")
    assert {"gir.frontend.python", "gir.driver.pyjit"} <= loaded_after(code, env)


def test_the_frontend_alone_still_runs_functions_eagerly(env: dict[str, str]) -> None:
    """`gir.tanh(array)` outside a trace runs through driver/pyjit.py's runner, which importing gir no
    longer installs: the frontend installs it on first eager call."""
    code = ("import numpy as np\nfrom gir.frontend.python import tanh, grad\n"
            "assert abs(float(tanh(np.float32(0.5))) - float(np.tanh(np.float32(0.5)))) < 1e-6\n"
            "d = grad(lambda x: tanh(x))(np.float32(0.5))\n"
            "assert abs(float(d) - (1 - float(np.tanh(np.float32(0.5))) ** 2)) < 1e-5")
    assert "gir.driver.pyjit" in loaded_after(code, env)


def test_lazy_names_are_the_frontends_and_listed() -> None:
    from gir.frontend import python

    assert sorted(gir._PYTHON_FRONTEND) == sorted(python.__all__)  # the list in __init__.py is kept up to date
    for name in python.__all__:
        assert getattr(gir, name) is getattr(python, name), name
    assert set(gir.__all__) <= set(dir(gir))
    namespace: dict[str, object] = {}
    exec("from gir import *", namespace)
    assert set(gir.__all__) <= set(namespace)
    assert callable(gir.jit) and not isinstance(gir.jit, type(gir))  # the function, not the submodule
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        gir.not_a_name  # noqa: B018
