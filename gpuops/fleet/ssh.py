"""SSH connections to nodes (asyncssh): host keys checked, timeouts and a bound on handshakes.

Every failure becomes an `SshError` with a kind and one line a person can act on. Host keys are
checked against known_hosts; an unknown host is refused with its fingerprint and the command
that trusts it. `accept-new` (as OpenSSH's StrictHostKeyChecking=accept-new) records a key only
for a host that has none yet: a *changed* key is always refused. The host is named as asyncssh
reached it: an ~/.ssh/config alias by its HostName and Port, as OpenSSH names it.

The way to a node is fleet.yaml's jump host, else ~/.ssh/config's ProxyJump (its hops, first to
last), else direct; every hop is a connection of ours, with the node's known_hosts and host-key
policy (asyncssh's own ProxyJump would check the bastion against its defaults instead).
`Progress` tells the collector the way taken and where a connection attempt is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from gpuops.fleet import known_hosts
from gpuops.fleet.errors import SshError as SshError  # where callers have always found it
from gpuops.fleet.identity import ClientKeys, load_client_keys
from gpuops.fleet.ssh_config import MAX_HOPS, HostConfig, config_file, parse_hop, resolve

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
    # Connect without a jump host, whatever ProxyJump ~/.ssh/config has (fleet.yaml's
    # `jump_host: none`, and the later hops of a ProxyJump list); HostName, Port... still apply.
    direct: bool = False

    @property
    def effective_port(self) -> int:
        return 22 if self.port is None else self.port

    @property
    def address(self) -> str:
        """How OpenSSH names the host in known_hosts: `host`, or `[host]:port` off port 22."""
        return self.host if self.effective_port == 22 else f"[{self.host}]:{self.effective_port}"

    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts"))


@dataclass
class Progress:
    """Where one connection attempt is (the collector shows it for a node not answering yet),
    and the way it takes: `route` is "direct" or "via HOPS (where they were configured)"."""

    phase: str = "waiting to connect"
    route: str = ""
    agent: str = ""  # which agent the session started (fleet/remote_agent.py: bootstrapped, ...)
    agent_command: str = ""  # the program it ran (the zipapp's path when pushed)

    def to(self, phase: str) -> None:
        self.phase = phase


class _HostKeyCheck(asyncssh.SSHClient):
    """Sees the connection start (and tells `progress`), and the key a server offered when
    known_hosts does not trust it: accepted only under accept-new, for a host known_hosts has
    nothing for."""

    def __init__(
        self, known: asyncssh.SSHKnownHosts, accept_new: bool, progress: Progress, where: str
    ) -> None:
        self.known = known
        self.accept_new = accept_new
        self.progress = progress
        self.where = where
        self.connected = False
        self.offered: asyncssh.SSHKey | None = None
        self.seen: tuple[str, str, int] | None = None  # host, address, port as asyncssh checked them
        self.record = False

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.connected = True
        self.progress.to(f"SSH handshake with {self.where} (TCP connected, waiting for the server)")

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered, self.seen = key, (host, addr, port)
        self.record = self.accept_new and not known_hosts.has_entry(self.known, host, addr, port)
        return self.record


def _trust_hint(host: str, port: int, path: Path) -> str:
    scan = ["ssh-keyscan"]
    if port != 22:
        scan += ["-p", str(port)]
    scan.append(host)
    return f"{shlex.join(scan)} >> {shlex.quote(str(path))}"


def _options(
    target: SshTarget, known: asyncssh.SSHKnownHosts, keys: ClientKeys, config: Path | None, tunnel: Any
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "known_hosts": known,
        "connect_timeout": target.connect_timeout,
        "login_timeout": target.login_timeout,
        "keepalive_interval": target.keepalive_interval,
        "keepalive_count_max": 3,
        # Ours (a hop connection, or None for direct): asyncssh then ignores the config's ProxyJump.
        "tunnel": tunnel,
        # AES-GCM first: one AEAD call per packet in `cryptography` (AES-NI), where asyncssh's
        # chacha20-poly1305 builds three cipher contexts per packet; both are strong.
        "encryption_algs": PREFERRED_CIPHERS,
        "config": [str(config)] if config is not None else None,
    }
    if target.port is not None:
        options["port"] = target.port
    if target.user:
        options["username"] = target.user
    if keys.keys:
        options["client_keys"] = keys.keys
    return options


def _where(target: SshTarget, resolved: HostConfig) -> str:
    """user@host as reached; an alias is named with what it stands for."""
    user = f"{resolved.user}@" if resolved.user else ""
    real = known_hosts.pattern(resolved.host, resolved.port)
    return f"{user}{real}" if resolved.host == target.host else f"{target.host} ({user}{real})"


def _route(target: SshTarget, depth: int = 0) -> tuple[list[SshTarget], str]:
    """The hops to go through before `target` (first to last) and how to say the way."""
    if depth > MAX_HOPS:
        raise SshError("local_file", f"{target.host}: more than {MAX_HOPS} jump hosts (a ProxyJump loop?)")
    if target.jump is not None:
        before, _ = _route(target.jump, depth + 1)
        jump = target.jump
        name = f"{jump.user + '@' if jump.user else ''}{jump.host}{':' + str(jump.port) if jump.port else ''}"
        return [*before, jump], f"via {name} (jump_host in fleet.yaml)"
    config = config_file(target.use_ssh_config)
    if target.direct or config is None:
        return [], "direct"
    resolved = resolve(target.host, target.port, target.user, config)
    if not resolved.proxy_jump:
        return [], "direct"
    hops: list[SshTarget] = []
    for i, text in enumerate(resolved.proxy_jump):
        hop = parse_hop(text, config)
        # A hop has the node's policies and is offered the node's key (as fleet.yaml's jump
        # hosts are); its own name, port and user are the hop's, then its config's.
        hop_target = dataclasses.replace(target, host=hop.host, port=hop.port, user=hop.user, jump=None)
        if i == 0:
            before, _ = _route(hop_target, depth + 1)
            hops += before
        hops.append(dataclasses.replace(hop_target, direct=i > 0))
    return hops, f"via {', '.join(resolved.proxy_jump)} (ProxyJump in {config})"


async def connect(
    target: SshTarget, handshakes: asyncio.Semaphore | None = None, progress: Progress | None = None
) -> asyncssh.SSHClientConnection:
    """Open a connection, through its jump hosts if any; raises SshError. Closing it closes
    the hops' connections too."""
    progress = progress if progress is not None else Progress()
    hops, progress.route = _route(target)
    tunnel: asyncssh.SSHClientConnection | None = None
    try:
        for hop in [*hops, target]:
            conn = await _connect_hop(hop, tunnel, handshakes, progress)
            if tunnel is not None:
                conn.set_tunnel(tunnel)  # asyncssh closes it with the connection through it
            tunnel = conn
    except BaseException:
        if tunnel is not None:
            tunnel.close()
        raise
    assert tunnel is not None
    return tunnel


async def _connect_hop(
    target: SshTarget,
    tunnel: asyncssh.SSHClientConnection | None,
    handshakes: asyncio.Semaphore | None,
    progress: Progress,
) -> asyncssh.SSHClientConnection:
    if handshakes is None:
        return await _handshake(target, tunnel, progress)
    progress.to("waiting for a free handshake slot (max_handshakes)")
    async with handshakes:
        return await _handshake(target, tunnel, progress)


async def _handshake(
    target: SshTarget, tunnel: asyncssh.SSHClientConnection | None, progress: Progress
) -> asyncssh.SSHClientConnection:
    config = config_file(target.use_ssh_config)
    resolved = resolve(target.host, target.port, target.user, config)
    where = _where(target, resolved)
    known_path = target.known_hosts_path()
    known = known_hosts.load(known_path)
    checker = _HostKeyCheck(known, target.host_key_policy == ACCEPT_NEW, progress, where)
    deadline = target.connect_timeout + target.login_timeout
    started = time.monotonic()
    progress.to(f"connecting to {where}")
    keys = ClientKeys()
    try:
        # Keys inside the deadline: an encrypted key asks its agent, which might not answer.
        keys = await asyncio.wait_for(load_client_keys(target.identity_files), deadline)
        options = _options(target, known, keys, config, tunnel)
        conn = await asyncio.wait_for(
            asyncssh.connect(target.host, client_factory=lambda: checker, **options),
            deadline - (time.monotonic() - started),
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise _host_key_error(target, resolved, checker, exc.reason) from None
    except asyncssh.PermissionDenied:
        raise SshError("auth", f"{where}: authentication failed (wrong user or key?)") from None
    except TimeoutError:
        waited = time.monotonic() - started
        stage = "TCP connected, no SSH handshake" if checker.connected else "no TCP connection"
        limit = f"connect_timeout {target.connect_timeout:g}s"
        raise SshError("timeout", f"{where}: no answer within {waited:.0f}s ({stage}; {limit})") from None
    except ConnectionRefusedError:
        hint = f"is sshd running on port {resolved.port}?"
        raise SshError("refused", f"{where}: connection refused ({hint})") from None
    except socket.gaierror as exc:
        raise SshError("unreachable", f"{where}: cannot resolve host ({exc.strerror})") from None
    except OSError as exc:
        raise SshError("unreachable", f"{where}: {exc.strerror or exc}") from None
    except asyncssh.Error as exc:
        raise SshError("disconnected", f"{where}: {exc.reason}") from None
    finally:
        keys.close()
    if checker.record and checker.offered is not None and checker.seen is not None:
        host, _addr, port = checker.seen
        known_hosts.record(known_path, host, port, checker.offered)
    return conn


def _host_key_error(target: SshTarget, resolved: HostConfig, checker: _HostKeyCheck, reason: str) -> SshError:
    host, addr, port = checker.seen or (resolved.host, "", resolved.port)
    name = known_hosts.pattern(host, port)
    key = checker.offered
    path = target.known_hosts_path()
    if key is None:  # refused before our check: revoked, or a certificate's CA not trusted
        return SshError("host_key_unknown", f"{name}: host key refused ({reason}); see {path}")
    fingerprint = f"{key.get_algorithm()} {key.get_fingerprint()}"
    if known_hosts.has_entry(checker.known, host, addr, port):
        return SshError(
            "host_key_changed",
            f"{name}: HOST KEY CHANGED — the server offered {fingerprint}, which is not the key "
            f"recorded in {path}; refusing (possible man-in-the-middle). If the host "
            "was reinstalled, remove the old entry with ssh-keygen -R and add the new one",
        )
    return SshError(
        "host_key_unknown",
        f"{name}: unknown host key {fingerprint}; if that is the right key, trust it with: "
        f"{_trust_hint(host, port, path)}  (or set ssh.host_key_policy: accept-new)",
    )
