"""Types checked in CI (issue 27): mypy at 0 errors on every floor, with the configuration in
pyproject.toml (`[tool.mypy]`).

mypy reads the repository as the package `gir` (its root is the package, DESIGN.md §1), so the
test points a `gir` link in a folder of its own at the checkout, whatever the checkout is
named, and keeps mypy's incremental cache beside it: a second run checks only what changed.
Skipped only where mypy is not installed (`pip install -e '.[test]'` installs it).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["-p", "gir.ir", "-p", "gir.analysis", "-p", "gir.passes", "-p", "gir.transforms", "-p", "gir.frontend",
           "-p", "gir.backend.cpu", "-p", "gir.backend.gpu", "-m", "gir.backend.split", "-p", "gir.driver",
           "-p", "gir.support", "-m", "gir.config", "-m", "gir.cli"]
"""What must type-check: ir/, analysis/, passes/, transforms/, frontend/, backend/cpu/ (with
schedule/), backend/gpu/, backend/split.py, driver/, support/, config.py and cli.py. What they
import from distributed.py and testing.py is read for its types (pyproject's
`follow_imports = "silent"`: their own errors are not counted yet)."""


def _package_root() -> Path:
    """A folder with a `gir` link to this checkout, the same one for every run of this checkout."""
    tag = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"gir-mypy-{tag}"
    base.mkdir(exist_ok=True)
    link = base / "gir"
    if not link.is_symlink() or link.resolve() != ROOT:
        if link.is_symlink():
            link.unlink()
        link.symlink_to(ROOT, target_is_directory=True)
    return base


def test_mypy_finds_no_error() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    base = _package_root()
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(base / "cache"), *CHECKED]
    done = subprocess.run(command, cwd=base, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mypy ({' '.join(command[2:])}):\n{done.stdout}{done.stderr}"
