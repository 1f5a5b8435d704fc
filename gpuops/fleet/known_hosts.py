"""known_hosts files: read bounded (local_files.py), parsed with every bad line located, matched
and appended to as OpenSSH does.

A line asyncssh cannot read (not UTF-8, not an entry) is an error naming `file:line`: skipping it
could drop a `@revoked` line, and an error is what the operator can fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import asyncssh

from gpuops.fleet.errors import SshError
from gpuops.fleet.local_files import KNOWN_HOSTS_LIMIT, load_parsed


class _BadLine(ValueError):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


def _parse(data: bytes) -> asyncssh.SSHKnownHosts:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadLine(data.count(b"\n", 0, exc.start) + 1, "not UTF-8 text") from None
    try:
        return asyncssh.import_known_hosts(text)
    except (ValueError, asyncssh.KeyImportError):
        pass
    # Rare: find the line (asyncssh's message quotes it whole, however long).
    for number, line in enumerate(text.splitlines(), 1):
        try:
            asyncssh.import_known_hosts(line)
        except (ValueError, asyncssh.KeyImportError):
            raise _BadLine(number, "not a known_hosts entry (hosts, key type, key)") from None
    raise _BadLine(1, "not a known_hosts file")


def load(path: Path) -> asyncssh.SSHKnownHosts:
    """The parsed file; a missing file knows no host yet (first use, accept-new)."""
    if not os.path.lexists(path):
        return asyncssh.import_known_hosts("")
    try:
        return load_parsed("known_hosts", str(path), KNOWN_HOSTS_LIMIT, _parse)
    except _BadLine as exc:
        raise SshError("local_file", f"known_hosts {path}:{exc.line}: {exc.problem}") from None


def has_entry(known: asyncssh.SSHKnownHosts, host: str, addr: str, port: int) -> bool:
    """Whether any key or CA is recorded for the host (then an untrusted key is a changed one)."""
    host_keys, ca_keys, *_rest = known.match(host, addr, port if port != 22 else None)
    return bool(host_keys or ca_keys)


def pattern(host: str, port: int) -> str:
    """How OpenSSH names a host in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def record(path: Path, host: str, port: int, key: asyncssh.SSHKey) -> None:
    """Append the host's key, as OpenSSH's accept-new does (the file is made if missing)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{pattern(host, port)} {key.export_public_key('openssh').decode().strip()}\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        problem = f"cannot record the host key: {exc.strerror}"
        raise SshError("local_file", f"known_hosts {path}: {problem}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SshError("local_file", f"known_hosts {path}: not a regular file")
        os.write(fd, line.encode("ascii"))
    finally:
        os.close(fd)
