"""The operator's own files that fleet.yaml points to (known_hosts, identity files), read the way
OpenSSH reads them, and never past a bound.

- Only a regular file: a FIFO would block the read forever and a device (`/dev/zero`) never
  ends. The type is checked with stat() before the file is opened, and again on the open
  descriptor (opened non-blocking, so even a FIFO swapped in between cannot hang the open).
- At most `limit` bytes: OpenSSH refuses key files over 1 MiB; known_hosts gets 64 MiB (some
  hundred thousand hosts, several keys each).
- A private key that others may read is refused, as OpenSSH does ("UNPROTECTED PRIVATE KEY
  FILE"), with the chmod that fixes it.

Every refusal is an SshError("local_file") whose one line names the file. What a file parses to
is kept while the file is unchanged (same inode, size and modification time), so a fleet of a
thousand nodes reads and parses its known_hosts once, not once per connection.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

from gpuops.fleet.errors import SshError

T = TypeVar("T")

MIB = 1024 * 1024
KEY_LIMIT = 1 * MIB
KNOWN_HOSTS_LIMIT = 64 * MIB
CONFIG_LIMIT = 1 * MIB

_Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
_parsed: dict[tuple[str, Callable[..., Any]], tuple[_Identity, Any]] = {}


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _size(size: int) -> str:
    return f"{size / MIB:g} MiB" if size >= MIB else f"{size} bytes"


def _check(what: str, path: str, st: os.stat_result, limit: int, private: bool) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SshError("local_file", f"{what} {path}: not a regular file ({_kind(st.st_mode)})")
    if st.st_size > limit:
        raise SshError("local_file", f"{what} {path}: larger than {_size(limit)} ({_size(st.st_size)})")
    if private and st.st_uid == os.getuid() and st.st_mode & 0o077:
        raise SshError(
            "local_file",
            f"{what} {path}: permissions {stat.S_IMODE(st.st_mode):04o} are too open, a private key must not "
            f"be accessible by others (OpenSSH ignores it too); fix with: chmod 600 {path}",
        )


def _open(what: str, path: str, limit: int, private: bool) -> tuple[int, os.stat_result]:
    """An open descriptor of the checked file and its stat; raises SshError("local_file")."""
    try:
        _check(what, path, os.stat(path), limit, private)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise SshError("local_file", f"{what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        _check(what, path, st, limit, private)  # the file may have been swapped since stat()
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(what: str, path: str, limit: int, private: bool = False) -> bytes:
    """The bytes of `path` (labelled `what` in errors), checked as the module says."""
    fd, _st = _open(what, path, limit, private)
    try:
        return _read_all(what, path, fd, limit)
    finally:
        os.close(fd)


def _read_all(what: str, path: str, fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
        except OSError as exc:
            raise SshError("local_file", f"{what} {path}: {exc.strerror or exc}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:  # it grew after the check
            raise SshError("local_file", f"{what} {path}: larger than {_size(limit)}")


def load_parsed(what: str, path: str, limit: int, parse: Callable[[bytes], T], private: bool = False) -> T:
    """`parse(bytes of path)`, reused while the file is unchanged; the checks run every time."""
    fd, st = _open(what, path, limit, private)
    try:
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = _parsed.get((path, parse))
        if cached is not None and cached[0] == identity:
            value: T = cached[1]
            return value
        value = parse(_read_all(what, path, fd, limit))
    finally:
        os.close(fd)
    _parsed[(path, parse)] = (identity, value)
    return value


def check_readable(what: str, path: str, limit: int) -> None:
    """Refuse what `read_bounded` would refuse, for a file another library then reads."""
    fd, _st = _open(what, path, limit, private=False)
    os.close(fd)
