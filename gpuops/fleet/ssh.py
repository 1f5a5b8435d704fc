"""SSH connections to nodes (asyncssh): host keys checked, timeouts and a bound on handshakes.

Every failure becomes an `SshError` with a kind and one line a person can act on. Host keys are
checked against known_hosts; an unknown host is refused with its fingerprint and the command
that trusts it. `accept-new` (as OpenSSH's StrictHostKeyChecking=accept-new) records a key only
for a host that has none yet: a *changed* key is always refused.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

T = TypeVar("T")

STRICT = "strict"
ACCEPT_NEW = "accept-new"
PREFERRED_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop to run the fleet on: uvloop's when it is installed (its transports,
    timers and polling are C: about a fifth less operator CPU per node-sample at 1000 nodes,
    docs/benchmarks.md), else None for asyncio's own. GPUOPS_EVENT_LOOP=asyncio forces the
    latter (to compare, or to rule uvloop out when chasing a bug)."""
    if os.environ.get("GPUOPS_EVENT_LOOP", "") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to reach one host; built from fleet.yaml (see fleet/targets.py)."""

    host: str
    port: int | None = None  # None: ~/.ssh/config decides, else 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    host_key_policy: str = STRICT
    connect_timeout: float = 10.0
    login_timeout: float = 20.0
    keepalive_interval: float = 15.0
    use_ssh_config: bool = True
    jump: SshTarget | None = field(default=None)

    @property
    def effective_port(self) -> int:
        return 22 if self.port is None else self.port

    @property
    def address(self) -> str:
        """How OpenSSH names the host in known_hosts: `host`, or `[host]:port` off port 22."""
        return self.host if self.effective_port == 22 else f"[{self.host}]:{self.effective_port}"

    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts"))


class SshError(Exception):
    """A connection could not be made or was lost; `kind` for code, str() for people."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _HostKeyCheck(asyncssh.SSHClient):
    """Remembers the key a server offered, and accepts it only under accept-new for a new host."""

    def __init__(self, accept_new: bool) -> None:
        self.accept_new = accept_new
        self.offered: asyncssh.SSHKey | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = key
        return self.accept_new


def _known_entries(target: SshTarget) -> bool:
    """Whether known_hosts has any key for this host (then a mismatch is a changed key)."""
    path = target.known_hosts_path()
    if not path.exists():
        return False
    try:
        known = asyncssh.read_known_hosts(str(path))
    except (OSError, ValueError, asyncssh.Error):
        return False
    try:
        addr = socket.gethostbyname(target.host)
    except OSError:
        addr = target.host
    port = target.effective_port if target.effective_port != 22 else None
    host_keys, ca_keys, *_rest = known.match(target.host, addr, port)
    return bool(host_keys or ca_keys)


def _record_host_key(target: SshTarget, key: asyncssh.SSHKey) -> None:
    path = target.known_hosts_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{target.address} {key.export_public_key('openssh').decode().strip()}\n"
    with open(path, "a", encoding="ascii") as f:
        f.write(line)


def _trust_hint(target: SshTarget) -> str:
    scan = ["ssh-keyscan"]
    if target.effective_port != 22:
        scan += ["-p", str(target.effective_port)]
    scan.append(target.host)
    return f"{shlex.join(scan)} >> {shlex.quote(str(target.known_hosts_path()))}"


def _options(target: SshTarget, tunnel: Any) -> dict[str, Any]:
    known = target.known_hosts_path()
    options: dict[str, Any] = {
        # A missing file means "no host is known yet", not an error (first use, accept-new).
        "known_hosts": str(known) if known.exists() else asyncssh.import_known_hosts(""),
        "connect_timeout": target.connect_timeout,
        "login_timeout": target.login_timeout,
        "keepalive_interval": target.keepalive_interval,
        "keepalive_count_max": 3,
        "tunnel": tunnel,
        # AES-GCM first: one AEAD call per packet in `cryptography` (AES-NI), where asyncssh's
        # chacha20-poly1305 builds three cipher contexts per packet; both are strong.
        "encryption_algs": PREFERRED_CIPHERS,
    }
    if target.port is not None:
        options["port"] = target.port
    if target.user:
        options["username"] = target.user
    if target.identity_files:
        options["client_keys"] = [os.path.expanduser(p) for p in target.identity_files]
    config = Path(os.path.expanduser("~/.ssh/config"))
    options["config"] = [str(config)] if target.use_ssh_config and config.exists() else None
    return options


async def connect(
    target: SshTarget, handshakes: asyncio.Semaphore | None = None
) -> asyncssh.SSHClientConnection:
    """Open a connection (through the jump host, if any); raises SshError."""
    tunnel = None
    if target.jump is not None:
        tunnel = await connect(target.jump, handshakes)
    try:
        if handshakes is None:
            return await _handshake(target, tunnel)
        async with handshakes:
            return await _handshake(target, tunnel)
    except BaseException:
        if tunnel is not None:
            tunnel.close()
        raise


async def _handshake(target: SshTarget, tunnel: Any) -> asyncssh.SSHClientConnection:
    accept_new = target.host_key_policy == ACCEPT_NEW and not _known_entries(target)
    checker = _HostKeyCheck(accept_new)
    where = f"{target.user + '@' if target.user else ''}{target.address}"
    deadline = target.connect_timeout + target.login_timeout
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(target.host, client_factory=lambda: checker, **_options(target, tunnel)),
            deadline,
        )
    except asyncssh.HostKeyNotVerifiable:
        raise _host_key_error(target, checker) from None
    except asyncssh.PermissionDenied:
        raise SshError("auth", f"{where}: authentication failed (wrong user or key?)") from None
    except TimeoutError:
        raise SshError("timeout", f"{where}: no answer within {deadline:g}s") from None
    except ConnectionRefusedError:
        raise SshError(
            "refused", f"{where}: connection refused (is sshd running on port {target.effective_port}?)"
        ) from None
    except socket.gaierror as exc:
        raise SshError("unreachable", f"{where}: cannot resolve host ({exc.strerror})") from None
    except OSError as exc:
        raise SshError("unreachable", f"{where}: {exc.strerror or exc}") from None
    except asyncssh.Error as exc:
        raise SshError("disconnected", f"{where}: {exc.reason}") from None
    if accept_new and checker.offered is not None:
        _record_host_key(target, checker.offered)
    return conn


def _host_key_error(target: SshTarget, checker: _HostKeyCheck) -> SshError:
    key = checker.offered
    fingerprint = f"{key.get_algorithm()} {key.get_fingerprint()}" if key is not None else "unknown key"
    if _known_entries(target):
        return SshError(
            "host_key_changed",
            f"{target.address}: HOST KEY CHANGED — the server offered {fingerprint}, which is not the key "
            f"recorded in {target.known_hosts_path()}; refusing (possible man-in-the-middle). If the host "
            "was reinstalled, remove the old entry with ssh-keygen -R and add the new one",
        )
    return SshError(
        "host_key_unknown",
        f"{target.address}: unknown host key {fingerprint}; if that is the right key, trust it with: "
        f"{_trust_hint(target)}  (or set ssh.host_key_policy: accept-new)",
    )
