"""The on-disk cache gir keeps under `GIR_CACHE_DIR` (default ~/.cache/gir): compiled functions,
the fast parser's terminal table and the measured GEMM times.

    compiled/<key>.entry    a compiled specialisation (object code + what `fn.ir`, `fn.llvm_ir`,
                            the layout and the signature need); its key is known before any work
    compiled/<key>.sig      the signature of an entry function of a source text
    objects/<key>.entry     object code keyed by the function after the passes (a second level:
                            the same IR reached from another text skips LLVM)
    parser-<hash>.terminals.json  the fast parser's terminal table, only where the one shipped in
                            frontend/terminals_table.json does not match (another Lark version)
    gemm-times-<machine>.json  measured GEMM seconds per shape and path, per machine
    gemm-thread-times-<machine>.json  1- and 2-thread GEMM seconds (the two-core schedule)

Trust (docs/backend.md, "The cache's trust model"): a hit `dlopen`s an entry's code, so the
cache is private, as ssh treats its keys. Folders are created 0700 and files 0600 whatever the
umask; a folder or file that is not this user's, or that group or others may write, is not
used (every lookup misses, nothing is stored); a file is opened only without following a
link, and read only if it is a regular file of at most `MAX_FILE_BYTES` (a FIFO or a device at
an entry's path is a miss, never a hang). Lark's tables are not kept at all (no unpickling of
anything on disk). An entry records its key, checked on load: an entry copied to another
key's name is a miss.

Every file is written to a temporary name and renamed into place (atomic on POSIX), so
processes sharing the cache never read half a file. An entry carries the SHA-256 of its
payload: a truncated or overwritten entry reads as a miss, and the next store replaces it.
Entries are bounded by `GIR_CACHE_MAX_MB` (default 512 MiB; `inf`: no bound) in total:
when a store may have passed the bound, the least recently used (by mtime; a hit touches its
entry) of gir's own entries (by name and by header: a user's file in these folders is never
touched) are deleted until the cache is under 90% of the bound; temporary files older than
`STALE_TMP_SECONDS` (left by a process killed between writing and renaming) are deleted too.
A store knows whether it may have passed the bound from a running estimate of the entries'
total (`SIZE_FILE`, `_after_store`), not by listing the folders: those are scanned (`trim`)
only when the estimate nears the bound and every `TRIM_EVERY` stores. `GIR_CACHE=0` turns
the compile cache off (the terminal table and GEMM times are still kept).

`gir cache info` and `gir cache clear` show and empty it. This module imports only the
standard library (and the leaf config.py): every stage may use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import current

MAGIC = b"GIRC2\n"
"""The first bytes of an entry; a file without them is not ours (or from an older format)."""

SUBDIRS = ("compiled", "objects")
"""The folders of entries, bounded together."""

MAX_FILE_BYTES = 1 << 30
"""No cache file gir writes is larger; a larger one is not read (a bounded read)."""

STALE_TMP_SECONDS = 600.0
"""A temporary file this old belongs to a process that died between writing and renaming."""

_ENTRY_NAME = re.compile(r"[0-9A-Za-z_-]{1,128}\.(entry|sig)")
"""The names of gir's entries (`<key>.entry`, `<key>.sig`): only these are counted and trimmed."""
_TMP_NAME = re.compile(r"(?:[0-9A-Za-z_.-]+\.tmp\.\d+\.\d+|load\.tmp\.[0-9A-Za-z_]+\.so)")
"""The names of gir's temporary files (`atomic_write`'s and native.load's)."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def cache_root() -> str:
    return current().cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "gir")


def enabled() -> bool:
    """Whether compiled functions are looked up and stored (GIR_CACHE=0 turns that off)."""
    return current().cache


def max_bytes() -> int | None:
    """The bound of the entries in bytes (GIR_CACHE_MAX_MB); None: no bound."""
    return current().cache_max_bytes


# ---------------------------------------------------------------------------------------------
# Trust: private folders and files, opened without following links, of bounded size


def _uid() -> int | None:
    geteuid = getattr(os, "geteuid", None)
    return geteuid() if geteuid is not None else None


def trusted(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else (as ssh requires of its keys)."""
    uid = _uid()
    return (uid is None or st.st_uid == uid) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted_folder(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and trusted(st)


def _levels(folder: str, root: str) -> list[str]:
    """The folders from root down to folder (folder alone when it is not inside root)."""
    root, folder = os.path.abspath(root), os.path.abspath(folder)
    rel = os.path.relpath(folder, root)
    if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return [folder]
    levels = [root]
    for part in rel.split(os.sep):
        levels.append(os.path.join(levels[-1], part))
    return levels


def private_folder(folder: str, create: bool = False) -> bool:
    """Whether folder (and the cache root above it) is trusted; create: make the missing ones,
    0700. A folder another user owns, or that others may write, is refused: its files could
    have been planted."""
    for level in _levels(folder, cache_root()):
        if create and not os.path.isdir(level) and not _make_private(level):
            return False
        if not _trusted_folder(level):
            return False
    return True


def _make_private(folder: str) -> bool:
    """Makes folder and its missing parents 0700 (os.makedirs gives parents the umask's mode:
    a world-writable ~/.cache under `umask 000` would let others replace the cache folder)."""
    parent = os.path.dirname(folder)
    if parent and parent != folder and not os.path.isdir(parent) and not _make_private(parent):
        return False
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)  # the umask only ever removes bits: make it exact
    except FileExistsError:
        pass  # made by another process meanwhile: checked like any other
    except OSError:
        return False
    return True


def read_file(path: str, limit: int = MAX_FILE_BYTES, count: int | None = None) -> bytes | None:
    """The bytes of a cache file (its first `count` only, if given), or None: absent, in an
    untrusted folder, a link, not a regular file (a FIFO is opened without blocking and
    refused), not this user's or writable by others, or larger than limit."""
    if not private_folder(os.path.dirname(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not trusted(st) or st.st_size > limit:
            return None
        chunks, left = [], st.st_size if count is None else min(count, st.st_size)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break  # truncated meanwhile: the checksum refuses it
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _create_private(path: str) -> int:
    """A new file at path, 0600, opened for writing (never through a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # left by a killed process that had this pid and thread id
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def atomic_write(path: str, data: bytes) -> bool:
    """Writes data to path (0600, in a private folder: made if missing) through a temporary file
    in the same folder and a rename, so a reader sees the old file or the new one, never a
    part; False when it could not (an untrusted folder is never written to)."""
    if len(data) > MAX_FILE_BYTES or not private_folder(os.path.dirname(path), create=True):
        return False
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        fd = _create_private(tmp)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        _remove(tmp)
        return False  # an unwritable cache only costs compiling again


def digest(*parts: Any) -> str:
    """A key from parts (strings, numbers, tuples: anything with a stable repr)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return h.hexdigest()[:40]


# ---------------------------------------------------------------------------------------------
# Entries: a JSON header and a binary blob, checksummed, naming their key


def entry_path(kind: str, key: str, suffix: str = ".entry", root: str | None = None) -> str:
    return os.path.join(root or cache_root(), kind, key + suffix)


def store(kind: str, key: str, meta: dict[str, Any], blob: bytes = b"", suffix: str = ".entry",
          root: str | None = None) -> None:
    """Stores meta (JSON-able) and blob under key, then trims the cache to its bound. The header
    records the key (`load` checks it). root: the cache folder (default: the current one); a
    background compile passes the folder its compile looked up, so a store finishing after
    GIR_CACHE_DIR changed lands there."""
    header = json.dumps({**meta, "key": f"{kind}/{key}{suffix}"}, separators=(",", ":")).encode()
    payload = len(header).to_bytes(8, "little") + header + blob
    data = MAGIC + hashlib.sha256(payload).digest() + payload
    if atomic_write(entry_path(kind, key, suffix, root), data):
        _after_store(len(data), root)


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(meta, blob) of an entry's bytes; ValueError when they are not a whole entry."""
    if not data.startswith(MAGIC):
        raise ValueError("not an entry")
    checksum, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != checksum:
        raise ValueError("checksum")
    n = int.from_bytes(payload[:8], "little")
    meta = json.loads(payload[8 : 8 + n])
    if not isinstance(meta, dict):
        raise ValueError("header")
    return meta, payload[8 + n :]


def load(kind: str, key: str, suffix: str = ".entry", root: str | None = None) -> tuple[dict[str, Any], bytes] | None:
    """(meta, blob) stored under key (in the cache folder root; default: the current one), or
    None: missing, untrusted (see `read_file`), corrupt, or recording another key (an entry
    copied or renamed to this key's name)."""
    path = entry_path(kind, key, suffix, root)
    data = read_file(path)
    if data is None:
        return None
    try:
        meta, blob = decode(data)
    except ValueError:
        return None  # the next store replaces it
    if meta.get("key") != f"{kind}/{key}{suffix}":
        return None
    try:
        os.utime(path, follow_symlinks=False)  # least recently used is by mtime: a hit makes the entry recent
    except (OSError, NotImplementedError):
        pass
    return meta, blob


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _names(folder: str) -> list[str]:
    """The files in folder; none where it does not exist, cannot be read or is not trusted."""
    if not private_folder(folder):
        return []
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _own_file(path: str) -> os.stat_result | None:
    """path's status when it is a regular file of this user (not a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # deleted by another process meanwhile
    return st if stat.S_ISREG(st.st_mode) and trusted(st) else None


@dataclass(frozen=True)
class EntryFile:
    path: str
    size: int
    mtime: float


def entries(root: str | None = None, check_header: bool = True) -> list[EntryFile]:
    """gir's entries under root: files named like an entry, regular, this user's, starting with
    MAGIC (check_header); a user's file in these folders is not one."""
    out = []
    root = root or cache_root()
    for kind in SUBDIRS:
        folder = os.path.join(root, kind)
        for name in _names(folder):
            path = os.path.join(folder, name)
            if not _ENTRY_NAME.fullmatch(name):
                continue
            st = _own_file(path)
            if st is not None and (not check_header or _starts_with_magic(path)):
                out.append(EntryFile(path, st.st_size, st.st_mtime))
    return out


def _starts_with_magic(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(MAGIC)) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_stale_temporaries(root: str | None = None, age: float = STALE_TMP_SECONDS) -> int:
    """Deletes gir's temporary files older than age seconds (a process killed between writing
    and renaming leaves them); returns how many."""
    root = root or cache_root()
    removed, now = 0, time.time()
    for folder in (root, *(os.path.join(root, kind) for kind in SUBDIRS)):
        for name in _names(folder):
            path = os.path.join(folder, name)
            if not _TMP_NAME.fullmatch(name):
                continue
            st = _own_file(path)
            if st is not None and now - st.st_mtime >= age:
                _remove(path)
                removed += 1
    return removed


def trim(limit: int | None = None, root: str | None = None) -> int:
    """Deletes the least recently used of gir's entries under root (default: the current cache
    folder) until they take less than 90% of the bound (when they take more than the bound:
    `limit`, default GIR_CACHE_MAX_MB; no bound: nothing), and stale temporary files; returns
    how many entries were deleted. Writes the total left as the running estimate (`SIZE_FILE`)."""
    limit = max_bytes() if limit is None else limit
    remove_stale_temporaries(root)
    if limit is None:
        _write_estimate(root, None, 0)  # not counted: a store under a bound set later scans
        return 0
    found = entries(root, check_header=False)  # headers are read only to delete
    total = sum(e.size for e in found)
    removed = 0
    if total > limit:
        for e in sorted(found, key=lambda e: (e.mtime, e.path)):
            if total <= 0.9 * limit:
                break
            if _starts_with_magic(e.path):  # gir's: a user's file named like an entry is left alone
                _remove(e.path)
                removed += 1
                total -= e.size
    _write_estimate(root, total, 0)
    return removed


# ---------------------------------------------------------------------------------------------
# When a store trims: a running estimate instead of a scan per store


SIZE_FILE = "entries-size.json"
"""At the top of the cache folder: {"bytes": the entries' total as the last scan found it plus
every store since (null: not counted), "stores": stores since that scan}."""

TRIM_EVERY = 64
"""Stores between two full scans whatever the estimate says: a scan corrects an estimate that
lost an update (two processes storing at once), never saw an entry (copied in by hand, stored
by another gir) or counted a replaced entry twice, and removes stale temporary files."""


def _after_store(size: int, root: str | None) -> None:
    """After a store of size bytes: a full scan (`trim`) only when the running estimate says the
    bound may be exceeded, is missing or damaged, or every TRIM_EVERY stores; otherwise the
    estimate grows by size (one small file read and written, no folder listed). Listing
    `compiled/` and `objects/` on every store cost a hit that replaces its entry (better code)
    time in proportion to the cache's size."""
    limit = max_bytes()
    estimate = _read_estimate(root)
    if estimate is not None:
        total, stores = estimate
        total = None if total is None else total + size
        if stores + 1 < TRIM_EVERY and (limit is None or (total is not None and total <= limit)):
            _write_estimate(root, total, stores + 1)
            return
    trim(root=root)


def _read_estimate(root: str | None) -> tuple[int | None, int] | None:
    """(bytes or None, stores) of SIZE_FILE; None when absent, untrusted or damaged (a scan)."""
    data = read_file(os.path.join(root or cache_root(), SIZE_FILE), limit=4096)
    try:
        parsed = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    total, stores = parsed.get("bytes"), parsed.get("stores")
    if not _count(stores) or not (total is None or _count(total)):
        return None
    assert isinstance(stores, int) and (total is None or isinstance(total, int))  # _count's checks, for mypy
    return total, stores


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _write_estimate(root: str | None, total: int | None, stores: int) -> None:
    atomic_write(os.path.join(root or cache_root(), SIZE_FILE),
                 json.dumps({"bytes": total, "stores": stores}).encode())


# ---------------------------------------------------------------------------------------------
# gir cache info / clear


def header(path: str) -> dict[str, Any] | None:
    """An entry's JSON header, None when it does not parse (the blob is not read, nor the
    checksum checked: `gir cache info` lists many entries; a lookup checks both)."""
    start = len(MAGIC) + 32
    head = read_file(path, count=start + 8)
    if head is None or len(head) < start + 8 or not head.startswith(MAGIC):
        return None
    n = int.from_bytes(head[start:], "little")
    data = read_file(path, count=start + 8 + n)
    try:
        meta = json.loads(data[start + 8 :]) if data is not None and len(data) == start + 8 + n else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def describe_entry(path: str, meta: dict[str, Any] | None) -> str:
    """One line of `gir cache info`: the entry, what it holds and its state."""
    name = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    if meta is None:
        return f"{name}: unreadable (a miss; the next store replaces it)"
    about = meta.get("about") or {}
    what = f"@{about['entry']}" if "entry" in about else ""
    if about.get("shapes") is not None:
        what += " (" + ", ".join("x".join(map(str, s)) or "scalar" for s in about["shapes"]) + ")"
    if path.endswith(".sig"):
        return f"{name}: signature {what}".rstrip()
    state = meta.get("state") or {}
    tier = {"quick": "quick code (-O3 pending)", "final": "final -O3 code"}.get(str(state.get("tier")), "")
    tier = tier or f"-O{meta.get('opt_level', '?')} code"
    gemm = "GEMM paths measured" if state.get("measured", True) else "GEMM paths from the model"
    return f"{name}: {what + ': ' if what else ''}{tier}, {gemm}"


@dataclass
class Info:
    root: str
    entries: int
    bytes: int
    limit: int | None
    other_files: list[str]
    lines: list[str] = field(default_factory=list)
    """One line per entry (`describe_entry`), most recent first."""
    trusted: bool = True

    def text(self) -> str:
        bound = "no bound" if self.limit is None else f"of {self.limit / 2**20:.0f} MiB"
        lines = [f"cache directory: {self.root}"]
        if not self.trusted:
            lines.append("not used: this folder (or compiled/, objects/) is another user's or writable by others; "
                         f"if it is yours, `chmod 700 {self.root}` (docs/backend.md, \"The cache's trust model\")")
        lines += [f"compiled entries: {self.entries}, {self.bytes / 2**20:.2f} MiB {bound} (GIR_CACHE_MAX_MB)",
                  f"compile cache: {'on' if enabled() else 'off (GIR_CACHE=0)'}"]
        lines += [f"  {line}" for line in self.lines]
        lines += [f"also: {name}" for name in self.other_files]
        return "\n".join(lines) + "\n"


def info() -> Info:
    root = cache_root()
    found = sorted(entries(), key=lambda e: -e.mtime)
    others = sorted(n for n in _names(root) if n not in SUBDIRS)
    lines = [describe_entry(e.path, header(e.path)) for e in found]
    trusted_root = all(not os.path.exists(folder) or private_folder(folder)
                       for folder in (root, *(os.path.join(root, kind) for kind in SUBDIRS)))
    return Info(root, len(found), sum(e.size for e in found), max_bytes(), others, lines, trusted_root)


OWN_FILES = ("parser-", "gemm-times", "gemm-paths", "gemm-thread-times", "entries-size")
"""Prefixes of gir's own files at the top of the cache directory (`clear` deletes only those,
and the entry folders: GIR_CACHE_DIR may point at a folder shared with other files)."""


def clear() -> int:
    """Deletes gir's files from the cache (entries, terminal tables, GEMM times, temporary
    files); returns how many."""
    root = cache_root()
    removed = remove_stale_temporaries(root, age=0.0)
    for e in entries(root):
        _remove(e.path)
        removed += 1
    for kind in SUBDIRS:
        try:
            os.rmdir(os.path.join(root, kind))
        except OSError:
            pass  # something else lives there: left alone
    for name in _names(root):
        if name.startswith(OWN_FILES) and _own_file(os.path.join(root, name)) is not None:
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
        # the package root, not support/ (where this file moved): every pass and backend counts
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        stamps = []
        for folder, dirs, names in os.walk(here):
            dirs[:] = sorted(d for d in dirs if d not in ("tests", "bench", "docs", "examples", "__pycache__")
                             and not d.startswith("."))  # .git, .venv: not gir's code, and slow to walk
            for name in sorted(names):
                if name.endswith((".py", ".lark")):
                    st = os.stat(os.path.join(folder, name))
                    # the path below here, as os.path.relpath gives it (which cost ~40% of this walk)
                    stamps.append((os.path.join(folder[len(here) + 1:], name), st.st_size, st.st_mtime_ns))
        _fingerprint = digest(stamps)
    return _fingerprint
