"""The cache trusts nothing on disk it did not make private (issue 31; cache.py, docs/backend.md
"The cache's trust model"): folders 0700 and files 0600 whatever the umask; an entry or folder
others may write is a miss; a FIFO or a link to a device at an entry's path is a miss, never a
hang; an entry copied to another key's name is a miss; trimming and counting touch only gir's
own entries and remove stale temporary files; GIR_CACHE_MAX_MB never raises.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import gir
import numpy as np
import pytest
from gir.cli import main
from gir.ir.interpreter import random_inputs

try:  # the layout change moves cache.py to support/
    from gir.support import cache
except ImportError:
    from gir import cache

F = """\
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return tanh(%x @ %w) * 2.0
}
"""

G = """\
func @f(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  return tanh(%x @ %w) * 5.0
}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("GIR_CACHE_DIR", str(root))
    monkeypatch.delenv("GIR_CACHE", raising=False)
    monkeypatch.delenv("GIR_CACHE_MAX_MB", raising=False)
    monkeypatch.setenv("GIR_GEMM_MEASURE", "off")
    monkeypatch.setenv("GIR_LLVM_TIER", "0")  # the final code, stored at once
    return root


def _args() -> list[np.ndarray]:
    return random_inputs(gir.parse(F).functions["f"], 0)


def _want(scale: float) -> np.ndarray:
    x, w = _args()
    return np.tanh(x @ w) * scale


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("compiled/*.entry")) + sorted(root.glob("objects/*.entry"))


def _hit(source: str = F) -> bool:
    return gir.jit(source, "f").compiled.code.info.from_cache == "compiled"


def test_folders_0700_and_files_0600_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own_cache = tmp_path / "home" / ".cache" / "gir"  # missing parents are made private too
    monkeypatch.setenv("GIR_CACHE_DIR", str(own_cache))
    old = os.umask(0)
    try:
        gir.jit(F, "f")
    finally:
        os.umask(old)
    folders = [own_cache.parent.parent, own_cache.parent, own_cache, own_cache / "compiled", own_cache / "objects"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in folders), [oct(p.stat().st_mode) for p in folders]
    files = [p for p in own_cache.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


@pytest.mark.parametrize("where", ["entry", "compiled", "root"])
def test_an_entry_others_may_write_is_a_miss(own_cache: Path, where: str) -> None:
    """Another user's entry cannot be made here without root; one writable by the group or by
    others stands for it (as ssh treats keys): whoever may write it may have planted it."""
    gir.jit(F, "f")
    assert _hit()
    target = {"entry": None, "compiled": own_cache / "compiled", "root": own_cache}[where]
    for path in [target] if target is not None else _entries(own_cache):
        path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o022)
    fn = gir.jit(F, "f")
    # compiled/ writable by others: the private objects/ folder's entry may still serve
    assert fn.compiled.code.info.from_cache == ("objects" if where == "compiled" else "")
    np.testing.assert_allclose(fn(*_args())[0], _want(2.0), rtol=1e-5)


def test_a_fifo_at_an_entry_path_does_not_block(own_cache: Path) -> None:
    gir.jit(F, "f")
    for path in _entries(own_cache):
        path.unlink()
        os.mkfifo(path)
    code = "import gir, sys; fn = gir.jit(sys.argv[1], 'f'); print(fn.compiled.code.info.from_cache or 'compiled')"
    proc = subprocess.run([sys.executable, "-c", code, F], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GIR_CACHE_DIR": str(own_cache)})
    assert proc.returncode == 0 and proc.stdout.strip() == "compiled", proc.stderr[-2000:]


def test_a_link_to_dev_zero_is_a_miss(own_cache: Path) -> None:
    gir.jit(F, "f")
    for path in _entries(own_cache):
        path.unlink()
        path.symlink_to("/dev/zero")
    fn = gir.jit(F, "f")
    assert fn.compiled.code.info.from_cache == ""
    np.testing.assert_allclose(fn(*_args())[0], _want(2.0), rtol=1e-5)
    assert cache.read_file("/dev/zero") is None


@pytest.mark.parametrize("kind", ["compiled", "objects"])
def test_an_entry_copied_to_another_keys_name_is_a_miss(own_cache: Path, kind: str) -> None:
    """One program's entry copied over another's (both with valid checksums) must not run as
    the other program."""
    gir.jit(F, "f")
    f_entries = set(own_cache.glob(f"{kind}/*.entry"))
    gir.jit(G, "f")
    g_entries = set(own_cache.glob(f"{kind}/*.entry")) - f_entries
    assert len(f_entries) == 1 and len(g_entries) == 1
    (g_entry,), (f_entry,) = g_entries, f_entries
    g_entry.write_bytes(f_entry.read_bytes())
    if kind == "objects":  # reach the object level: no compiled/ entry for G
        for path in own_cache.glob("compiled/*.entry"):
            path.unlink()
    fn = gir.jit(G, "f")
    # a miss at the copied level (G's own object entry may serve when compiled/ is the copy)
    assert fn.compiled.code.info.from_cache == ("objects" if kind == "compiled" else "")
    np.testing.assert_allclose(fn(*_args())[0], _want(5.0), rtol=1e-5)


def test_trim_and_count_touch_only_gir_entries(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gir.jit(F, "f")
    users = [own_cache / "objects" / "thesis.tex", own_cache / "compiled" / "data.entry",
             own_cache / "compiled" / "notes.sig"]
    for path in users:
        path.write_bytes(b"the user's own file" * 10_000)
    before = cache.info()
    assert before.entries == 3  # signature, specialisation, object: the user's files are not counted
    monkeypatch.setenv("GIR_CACHE_MAX_MB", "0.000001")
    cache.store("compiled", "k0", {}, bytes(1000))  # far over the bound: trims every entry of gir's
    assert not cache.entries() and all(p.exists() for p in users)
    assert main(["cache", "clear"]) == 0
    assert all(p.exists() for p in users)


def test_stale_temporary_files_are_removed(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gir.jit(F, "f")
    old = own_cache / "compiled" / f"{'a' * 40}.entry.tmp.12345.678"
    fresh = own_cache / "objects" / f"{'b' * 40}.entry.tmp.12345.679"
    library = own_cache / "compiled" / "load.tmp.abc_123.so"
    user = own_cache / "compiled" / "mine.tmp.txt"
    for path in (old, fresh, library, user):
        path.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    for path in (old, library, user):
        os.utime(path, (an_hour_ago, an_hour_ago))
    monkeypatch.setattr(cache, "TRIM_EVERY", 1)  # a store that scans (every TRIM_EVERY-th one does)
    cache.store("compiled", "k1", {}, b"")
    assert not old.exists() and not library.exists()  # a killed process's leftovers
    assert fresh.exists()  # may be another process's write in progress
    assert user.exists()


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every os.listdir / os.scandir call from now on, by folder."""
    calls: list[str] = []
    for name in ("listdir", "scandir"):
        real = getattr(os, name)

        def counted(path: str = ".", _real=real) -> object:  # noqa: ANN001
            calls.append(str(path))
            return _real(path)

        monkeypatch.setattr(os, name, counted)
    return calls


def test_a_store_far_under_the_bound_lists_no_folder(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.store("compiled", "k0", {}, bytes(1000))  # no estimate yet: this one scans and writes it
    calls = _count_listings(monkeypatch)
    for i in range(1, 5):
        cache.store("compiled", f"k{i}", {}, bytes(1000))
    assert calls == []
    estimate = cache._read_estimate(str(own_cache))
    assert estimate is not None and estimate[1] == 4
    assert estimate[0] == sum(p.stat().st_size for p in (own_cache / "compiled").glob("*.entry"))


def test_a_store_scans_every_trim_every_stores_and_near_the_bound(own_cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "TRIM_EVERY", 3)
    cache.store("compiled", "k0", {}, bytes(1000))
    calls = _count_listings(monkeypatch)
    cache.store("compiled", "k1", {}, bytes(1000))
    cache.store("compiled", "k2", {}, bytes(1000))
    assert calls == []
    cache.store("compiled", "k3", {}, bytes(1000))  # the third store since the scan: scans
    assert calls and cache._read_estimate(str(own_cache))[1] == 0  # type: ignore[index]
    calls.clear()
    estimate = cache._read_estimate(str(own_cache))
    assert estimate is not None and estimate[0] is not None
    monkeypatch.setenv("GIR_CACHE_MAX_MB", str((estimate[0] + 1500) / 2**20))  # room for one more, not two
    cache.store("compiled", "k4", {}, bytes(1000))
    assert calls == []
    cache.store("compiled", "k5", {}, bytes(1000))  # the estimate passes the bound: scans, trims
    assert calls and not (own_cache / "compiled" / "k0.entry").exists()


@pytest.mark.parametrize("damage", [b"", b"[1, 2]", b'{"bytes": -5, "stores": 0}', b'{"bytes": true, "stores": 1}',
                                    b"not json"])
def test_a_damaged_estimate_means_a_scan(own_cache: Path, monkeypatch: pytest.MonkeyPatch, damage: bytes) -> None:
    cache.store("compiled", "k0", {}, bytes(1000))
    (own_cache / cache.SIZE_FILE).write_bytes(damage)
    calls = _count_listings(monkeypatch)
    cache.store("compiled", "k1", {}, bytes(1000))
    assert calls  # scanned, and the estimate is whole again
    assert cache._read_estimate(str(own_cache)) is not None


@pytest.mark.parametrize("value", ["inf", "1e400", "-1", "garbage", "nan", ""])
def test_any_bound_never_raises(own_cache: Path, monkeypatch: pytest.MonkeyPatch, value: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GIR_CACHE_MAX_MB", value)
    fn = gir.jit(F, "f")
    np.testing.assert_allclose(fn(*_args())[0], _want(2.0), rtol=1e-5)
    assert _hit()
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "compiled entries: 3" in out
    assert ("no bound" in out) == (value in ("inf", "1e400", "-1"))


def test_a_cache_folder_of_others_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("GIR_CACHE_DIR", str(shared))
    fn = gir.jit(F, "f")
    np.testing.assert_allclose(fn(*_args())[0], _want(2.0), rtol=1e-5)
    assert not list(shared.iterdir())  # nothing stored where others could replace it
    assert gir.jit(F, "f").compiled.code.info.from_cache == ""
    assert "not used" in cache.info().text() and "chmod 700" in cache.info().text()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("what", ["entries", "folder"])
def test_another_users_entry_or_folder_is_a_miss(own_cache: Path, what: str) -> None:
    """Run as root (containers, CI): the files of another user, truly owned by it."""
    gir.jit(F, "f")
    targets = _entries(own_cache) if what == "entries" else [own_cache / "compiled", own_cache / "objects"]
    for path in targets:
        os.chown(path, 12345, 12345)  # mode unchanged: 0600 / 0700, only the owner differs
    fn = gir.jit(F, "f")
    assert fn.compiled.code.info.from_cache == ""
    np.testing.assert_allclose(fn(*_args())[0], _want(2.0), rtol=1e-5)
