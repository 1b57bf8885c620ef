"""Compiled code as a shared library: linked once when the compile cache stores it, loaded on a
cache hit with the system's dynamic loader, so a hit in a new process loads neither llvmlite
(~30 ms to import) nor LLVM's JIT linker.

The object code is position-independent and calls every external through the table it is
passed (externals.py), so the system linker (`cc -shared`, else `ld -shared`) links it as it
is. Each load writes the library to a file of its own and opens that, so two loads never
share a handle (or its globals), and closes it when the code is no longer referenced.
Anything that fails here (no linker, a `noexec` folder, a library the loader refuses) returns
None and the caller uses LLVM's JIT linker instead. GIR_CPU_SHARED=0 turns linking off.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os

from ...config import current
from ...support import cache as disk


def enabled() -> bool:
    return current().cpu_shared


def _linker() -> list[str] | None:
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is not None:
        return [cc, "-shared"]
    ld = shutil.which("ld")
    return [ld, "-shared"] if ld is not None else None


def link(obj: bytes) -> bytes | None:
    """The shared library of an object (None: linking is off or failed)."""
    linker = _linker() if enabled() else None
    if linker is None:
        return None
    import subprocess  # here, not at the top: a cache hit imports this module and never links
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gir-link-") as folder:
        src, out = os.path.join(folder, "code.o"), os.path.join(folder, "code.so")
        with open(src, "wb") as f:
            f.write(obj)
        try:
            done = subprocess.run([*linker, "-o", out, src], capture_output=True, timeout=60)
            if done.returncode != 0:
                return None
            with open(out, "rb") as f:
                return f.read()
        except (OSError, subprocess.SubprocessError):
            return None


class Library:
    """An opened shared library; closed when garbage (nothing calls into it by then: a call
    holds the entry that holds this)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def __del__(self) -> None:
        try:
            _ctypes.dlclose(self.lib._handle)
        except (OSError, AttributeError, TypeError):
            pass


def load(data: bytes) -> Library | None:
    """Opens a library from its bytes, or None where this process cannot. The file is created
    with a name of its own (O_EXCL: no other process, container or host sharing the cache
    folder can write to it while it is opened) and deleted once open."""
    if not enabled():
        return None
    import tempfile

    compiled = os.path.join(disk.cache_root(), "compiled")
    for folder in (compiled if disk.private_folder(compiled) else None, None):  # never a folder others may write
        path = None
        try:
            fd, path = tempfile.mkstemp(prefix="load.tmp.", suffix=".so", dir=folder)  # `.tmp.`: trim skips it
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return Library(ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW))
        except OSError:
            continue  # unwritable, or mounted noexec: the next folder (None: the system's temporary one)
        finally:
            if path is not None:
                try:
                    os.unlink(path)  # the mapping stays valid; nothing is left on disk
                except OSError:
                    pass
    return None


def address(library: Library, name: str) -> int:
    return ctypes.cast(getattr(library.lib, name), ctypes.c_void_p).value or 0
