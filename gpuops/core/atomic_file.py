"""Replacing a file so that a reader (or a crash) sees the old file or the new one, never part of
one: written in full under a temporary name in the same directory (a rename across file systems
is not atomic), then renamed over the target.

The one module of core/ that does I/O: both sides write files this way (the node its history,
tenant table, journals and records; the operator saved plans, proposals and fleet.yaml), and
core/ is the only place both may import. Valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import binascii
import contextlib
import os
from pathlib import Path
from typing import Tuple, Union

PRIVATE = 0o600
_TRIES = 100


def atomic_write(
    path: Union[str, Path],
    data: Union[str, bytes],
    mode: int = PRIVATE,
    umask: bool = False,
    durable: bool = True,
    sync_directory: bool = False,
) -> None:
    """Replace `path` with `data` (text is written as UTF-8); raises OSError.

    `mode` is the new file's mode, exactly: the temporary file is created 0600 (no moment where
    another user could open a file that is still being written, as OpenSSH makes its private
    files) and given `mode` just before the rename. With `umask=True` it is created with `mode`
    filtered by the process umask instead, as `open()` creates files. `durable` syncs the data
    before the rename; `sync_directory` syncs the directory after it, so that the rename itself
    survives a power cut (ignored where the file system cannot sync a directory).
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _create(directory or ".", name, mode if umask else PRIVATE)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            if not umask:
                os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_directory:
        _sync_directory(directory or ".")


def _create(directory: str, name: str, mode: int) -> Tuple[int, str]:
    """A new file `.NAME.<random>.tmp` beside the target: hidden, and ending in `.tmp` so that the
    cleaners of a directory (node/history.py, the simulator) know it for a leftover."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TRIES):
        token = binascii.hexlify(os.urandom(4)).decode("ascii")
        tmp = os.path.join(directory, ".%s.%s.tmp" % (name, token))
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError("no free temporary name for %s in %s" % (name, directory))


def _sync_directory(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(dfd)


__all__ = ["PRIVATE", "atomic_write"]
