"""The on-disk cache gir keeps under `GIR_CACHE_DIR` (default ~/.cache/gir): compiled functions,
the parser's tables and the measured GEMM times.

    compiled/<key>.entry    a compiled specialisation (object code + what `fn.ir`, `fn.llvm_ir`,
                            the layout and the signature need); its key is known before any work
    compiled/<key>.sig      the signature of an entry function of a source text
    objects/<key>.entry     object code keyed by the function after the passes (a second level:
                            the same IR reached from another text skips LLVM)
    parser-<hash>.lark      the LALR tables of frontend/grammar.lark (Lark's cache format)
    parser-<hash>.terminals.json  the fast parser's terminal table, only where the one shipped in
                            frontend/terminals_table.json does not match (another Lark version)
    gemm-times-<machine>.json  measured GEMM seconds per shape and path, per machine
    gemm-thread-times-<machine>.json  1- and 2-thread GEMM seconds (the two-core schedule)

Every file is written to a temporary name and renamed into place (atomic on POSIX), so
processes sharing the cache never read half a file. An entry carries the SHA-256 of its
payload: a truncated or overwritten entry reads as a miss (and is deleted), so it is compiled
again rather than crashing the process. Entries are bounded by `GIR_CACHE_MAX_MB` (default
512 MiB) in total: after a store, the least recently used (by mtime; a hit touches its entry)
are deleted until the cache is under 90% of the bound. `GIR_CACHE=0` turns the compile cache
off (the parser tables and GEMM times are still kept).

`gir cache info` and `gir cache clear` show and empty it. This module imports only the
standard library: every stage may use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from ..config import current

MAGIC = b"GIRC1\n"
"""The first bytes of an entry; a file without them is not ours (or from an older format)."""

SUBDIRS = ("compiled", "objects")
"""The folders of entries, bounded together."""

DEFAULT_MAX_MB = 512


def cache_root() -> str:
    return current().cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "gir")


def enabled() -> bool:
    """Whether compiled functions are looked up and stored (GIR_CACHE=0 turns that off)."""
    return current().cache


def max_bytes() -> int | None:
    """GIR_CACHE_MAX_MB in bytes; None: no bound."""
    return current().cache_max_bytes


def atomic_write(path: str, data: bytes) -> bool:
    """Writes data to path through a temporary file in the same folder and a rename, so a
    reader sees the old file or the new one, never a part; False when it could not."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False  # an unwritable cache only costs compiling again


def digest(*parts: Any) -> str:
    """A key from parts (strings, numbers, tuples: anything with a stable repr)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:40]


# ---------------------------------------------------------------------------------------------
# Entries: a JSON header and a binary blob, checksummed


def _entry_path(kind: str, key: str, suffix: str = ".entry", root: str | None = None) -> str:
    return os.path.join(root or cache_root(), kind, key + suffix)


def store(kind: str, key: str, meta: dict[str, Any], blob: bytes = b"", suffix: str = ".entry",
          root: str | None = None) -> None:
    """Stores meta (JSON-able) and blob under key, then trims the cache to its bound. root: the
    cache folder (default: the current one); a background compile passes the folder its
    compile looked up, so a store finishing after GIR_CACHE_DIR changed lands there."""
    header = json.dumps(meta, separators=(",", ":")).encode()
    payload = len(header).to_bytes(8, "little") + header + blob
    if atomic_write(_entry_path(kind, key, suffix, root), MAGIC + hashlib.sha256(payload).digest() + payload):
        trim(root=root)


def load(kind: str, key: str, suffix: str = ".entry") -> tuple[dict[str, Any], bytes] | None:
    """(meta, blob) stored under key, or None: missing, unreadable, or corrupt (then deleted,
    so the next store replaces it)."""
    path = _entry_path(kind, key, suffix)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not an entry")
        checksum, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
        if hashlib.sha256(payload).digest() != checksum:
            raise ValueError("checksum")
        n = int.from_bytes(payload[:8], "little")
        meta = json.loads(payload[8 : 8 + n])
        if not isinstance(meta, dict):
            raise ValueError("header")
        blob = payload[8 + n :]
    except ValueError:
        _remove(path)
        return None
    try:
        os.utime(path)  # least recently used is by mtime: a hit makes the entry recent
    except OSError:
        pass
    return meta, blob


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _names(folder: str) -> list[str]:
    """The files in folder; none where it does not exist or cannot be read."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _entries(root: str | None = None) -> list[tuple[float, int, str]]:
    out = []
    root = root or cache_root()
    for kind in SUBDIRS:
        folder = os.path.join(root, kind)
        for name in _names(folder):
            if ".tmp." in name:
                continue
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue  # deleted by another process meanwhile
            out.append((st.st_mtime, st.st_size, os.path.join(folder, name)))
    return out


def trim(limit: int | None = None, root: str | None = None) -> int:
    """Deletes the least recently used entries of root (default: the current cache folder)
    until they take less than 90% of the bound (when they take more than the bound); returns
    how many were deleted."""
    limit = max_bytes() if limit is None else limit
    if limit is None:
        return 0  # GIR_CACHE_MAX_MB=inf: no bound
    entries = _entries(root)
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    removed = 0
    for _, size, path in sorted(entries):
        if total <= 0.9 * limit:
            break
        _remove(path)
        total -= size
        removed += 1
    return removed


@dataclass
class Info:
    root: str
    entries: int
    bytes: int
    limit: int | None
    other_files: list[str]

    def text(self) -> str:
        bound = "no bound" if self.limit is None else f"{self.limit / 2**20:.0f} MiB"
        lines = [f"cache directory: {self.root}",
                 f"compiled entries: {self.entries}, {self.bytes / 2**20:.2f} MiB of {bound} (GIR_CACHE_MAX_MB)",
                 f"compile cache: {'on' if enabled() else 'off (GIR_CACHE=0)'}"]
        lines += [f"also: {name}" for name in self.other_files]
        return "\n".join(lines) + "\n"


def info() -> Info:
    entries = _entries()
    root = cache_root()
    others = sorted(n for n in _names(root) if n not in SUBDIRS)
    return Info(root, len(entries), sum(s for _, s, _ in entries), max_bytes(), others)


OWN_FILES = ("parser-", "gemm-times", "gemm-paths", "gemm-thread-times")
"""Prefixes of gir's own files at the top of the cache directory (`clear` deletes only those,
and the entry folders: GIR_CACHE_DIR may point at a folder shared with other files)."""


def clear() -> int:
    """Deletes gir's files from the cache (entries, parser tables, GEMM times); returns how many."""
    root = cache_root()
    removed = 0
    for kind in SUBDIRS:
        folder = os.path.join(root, kind)
        for name in _names(folder):
            if name.endswith((".entry", ".sig")) or ".tmp." in name:
                _remove(os.path.join(folder, name))
                removed += 1
        try:
            os.rmdir(folder)
        except OSError:
            pass  # something else lives there: left alone
    for name in _names(root):
        if name.startswith(OWN_FILES) and os.path.isfile(os.path.join(root, name)):
            _remove(os.path.join(root, name))
            removed += 1
    return removed


# ---------------------------------------------------------------------------------------------
# What every key includes


_fingerprint: str | None = None


def build_fingerprint() -> str:
    """gir's own code: the size and mtime of every source file of the package, so an edited
    pass or backend (without a version bump) never gets an entry compiled by the old code."""
    global _fingerprint
    if _fingerprint is None:
        here = os.path.dirname(os.path.abspath(__file__))
        stamps = []
        for folder, dirs, names in os.walk(here):
            dirs[:] = sorted(d for d in dirs if d not in ("tests", "bench", "docs", "examples", "__pycache__")
                             and not d.startswith("."))  # .git, .venv: not gir's code, and slow to walk
            for name in sorted(names):
                if name.endswith((".py", ".lark")):
                    st = os.stat(os.path.join(folder, name))
                    stamps.append((os.path.relpath(os.path.join(folder, name), here), st.st_size, st.st_mtime_ns))
        _fingerprint = digest(stamps)
    return _fingerprint
