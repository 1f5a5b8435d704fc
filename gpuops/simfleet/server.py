"""SSH servers for simulated nodes: one asyncssh listener per node on 127.0.0.1, all in one process.

Each node has its own port and its own `SimBackend`; the fleet's client code reaches it exactly
as it reaches a real node (public-key login, host key checked against known_hosts, the agent
started by an exec request), so the sim fleet exercises the real SSH path.

What a simulated node accepts:

- login: public-key authentication only, for one user name and one client key (both given by
  the runner); passwords, keyboard-interactive, host-based: refused;
- host key: one ed25519 key for the whole sim fleet (a known_hosts line per node port lists it).
  Real nodes each have their own; here one key keeps start-up and the files small, and host-key
  checking still runs in full on the client;
- exec requests only, split with `shlex.split` and matched against two forms — never run by a
  shell:
  - `command -v gpuops` prints a path, exit 0 (`command -v OTHER`: exit 1, as sh does);
  - the agent probe of fleet/remote_agent.py (`sh -c PROBE sh PREFIX`) answers `installed`: a
    simulated node has `gpuops` on its PATH and nothing bootstrapped under a prefix;
  - `gpuops agent --stdio --backend sim [--sim-spec P] [--log-level L] [--state-dir D]
    [--limiter-dir D] [--mps-control P] [--history-dir D]`: the node agent for this node's
    backend, run inline on the event loop. `--sim-spec` and the directory options are accepted,
    as the real command takes them, and ignored: a sim node's spec, state, limiter table, MPS
    control and history are the fleet's. Another backend gets an agent that says it is
    unavailable, as a node without NVML would;
  - anything else: `NAME: command not found` on stderr, and a line saying this is a gpuops
    simulated node, not a host (so that ansible-playbook pointed at it says so), exit 127;
- a PTY request is accepted, as sshd does, and changes nothing: Ansible asks for one (`ssh -tt`)
  and, refused through its shared connection, loses the command's output;
- refused: shells (sessions without a command), subsystems (SFTP), port, agent and X11
  forwarding;
- bounds: connections per node and in all, sessions per connection and agents per node, login
  timeout; keepalives drop dead clients. The agent bounds its own requests and watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncssh
from asyncssh.constants import MSG_IGNORE

from gpuops.fleet.remote_agent import ON_PATH
from gpuops.fleet.remote_agent import PROBE as AGENT_PROBE
from gpuops.node.agent import Agent
from gpuops.node.backends.base import Backend
from gpuops.node.health import HealthMonitor
from gpuops.node.state import interrupted_applies
from gpuops.simfleet.faults import FaultyBackend, clear_events
from gpuops.simfleet.history import SimHistory

log = logging.getLogger("gpuops.simfleet")

GPUOPS_PATH = "/usr/local/bin/gpuops"  # what `command -v gpuops` answers on a simulated node
NOT_A_HOST = "gpuops simulated node: it runs the gpuops agent only, it is not a host (docs/simulator.md)"


@dataclass(frozen=True)
class Limits:
    connections_per_node: int = 8
    connections_total: int = 10000
    sessions_per_connection: int = 4
    agents_per_node: int = 8
    login_timeout: float = 20.0
    keepalive_interval: float = 30.0
    keepalive_count_max: int = 3


@dataclass
class SimNodeEndpoint:
    """One simulated node as the server holds it."""

    name: str
    backend: Backend
    port: int = 0
    connections: int = 0
    agents: int = 0
    listener: asyncssh.SSHAcceptor | None = field(default=None, repr=False)
    # The node's health events (faults.inject_event), one record for its agents and its exporter,
    # as a node's long-running --metrics service sees every event.
    health: HealthMonitor = field(default_factory=HealthMonitor, repr=False)


def _send_like_sshd(conn: asyncssh.SSHServerConnection) -> None:
    """Put on the wire what OpenSSH's sshd puts there: no SSH_MSG_IGNORE before every packet.

    Once encryption is on, asyncssh sends an empty SSH_MSG_IGNORE before each packet it sends
    (`SSHConnection.send_packet`): RFC 4251 9.3.1's countermeasure for the CBC-mode IV attack,
    applied whatever the cipher. sshd does not (it has offered no CBC cipher by default since
    OpenSSH 6.7, and with AES-GCM, chacha20-poly1305 or AES-CTR there is nothing for it to
    protect). Left in, a simulated node costs the client two packets (two decryptions, two
    dispatches, two wake-ups of the channel code) per sample where a real node costs one.
    Called from connection_made, before the key exchange.
    """
    send_packet = conn.send_packet

    def send_without_ignore(pkttype: int, *args: bytes, handler: Any = None) -> None:
        if pkttype != MSG_IGNORE:
            send_packet(pkttype, *args, handler=handler)

    # An instance attribute: asyncssh's own `self.send_packet(MSG_IGNORE, ...)` resolves to it.
    setattr(conn, "send_packet", send_without_ignore)  # noqa: B010


class _ExecOnlySession(asyncssh.SSHServerProcess[bytes]):
    """An SSH session that accepts exec requests and nothing else."""

    def __init__(self, server: _NodeServer) -> None:
        super().__init__(server.run, None, 0, False)
        self._server: _NodeServer | None = server

    def connection_lost(self, exc: Exception | None) -> None:
        if self._server is not None:  # counted once, whether or not a command ever ran
            self._server.sessions -= 1
            self._server = None
        super().connection_lost(exc)

    def shell_requested(self) -> bool:
        return False

    def subsystem_requested(self, subsystem: str) -> bool:
        return False


class _NodeServer(asyncssh.SSHServer):
    """Per connection: authentication, limits, and the sessions it may open."""

    def __init__(self, fleet: SimFleetServer, node: SimNodeEndpoint) -> None:
        self._fleet = fleet
        self._node = node
        self._conn: asyncssh.SSHServerConnection | None = None
        self.sessions = 0
        self._counted = False

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        _send_like_sshd(conn)
        limits = self._fleet.limits
        if self._node.connections >= limits.connections_per_node or (
            self._fleet.connections >= limits.connections_total
        ):
            log.warning("%s: connection refused: too many connections", self._node.name)
            # Closing from inside connection_made is not safe in asyncssh; do it on the next turn.
            asyncio.get_running_loop().call_soon(
                conn.disconnect, asyncssh.DISC_TOO_MANY_CONNECTIONS, "too many connections to this node"
            )
            return
        self._counted = True
        self._node.connections += 1
        self._fleet.connections += 1
        self._fleet.live.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._node.connections -= 1
            self._fleet.connections -= 1
        if self._conn is not None:
            self._fleet.live.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        return True  # authentication is always required

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        ok = username == self._fleet.user and key.public_data == self._fleet.client_key.public_data
        if not ok:
            log.info("%s: refused key %s for user %r", self._node.name, key.get_fingerprint(), username[:64])
        return ok

    def session_requested(self) -> asyncssh.SSHServerSession[bytes] | bool:
        if not self._counted or self.sessions >= self._fleet.limits.sessions_per_connection:
            return False
        self.sessions += 1
        return _ExecOnlySession(self)

    async def run(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        status = 1
        try:
            status = await self._fleet.run_command(self._node, process.command, process)
        except asyncio.CancelledError:
            raise
        except (asyncssh.Error, OSError, asyncssh.BreakReceived, asyncssh.SignalReceived):
            status = 1
        except Exception:  # one session's surprise must not take the node down
            log.exception("%s: session failed", self._node.name)
            status = 1
        finally:
            with contextlib.suppress(Exception):
                process.exit(status)


class SimFleetServer:
    """Serves every simulated node of a fleet; `start()` binds, `close()` stops."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, Backend]],
        host_key: asyncssh.SSHKey,
        client_key: asyncssh.SSHKey,
        user: str,
        host: str = "127.0.0.1",
        limits: Limits | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.nodes = [SimNodeEndpoint(name, backend) for name, backend in nodes]
        # Each simulated node's "disk" for its apply lock and MIG journal (node/state.py).
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="gpuops-simstate-"))
        for node in self.nodes:
            clear_events(self.state_dir / node.name)
            node.health.poll(cast(Backend, FaultyBackend(node.backend, self.state_dir / node.name)))
        self.host_key = host_key
        self.client_key = client_key
        self.user = user
        self.host = host
        self.limits = limits or Limits()
        self.connections = 0
        self.live: set[asyncssh.SSHServerConnection] = set()
        self._agents: set[asyncio.Task[None]] = set()
        # Set by the runner: every node's recorded history (simfleet/history.py), served by the
        # node's agent (`history` request); None: agents read whatever is in the directory.
        self.history: SimHistory | None = None

    async def start(self, base_port: int = 0) -> dict[str, int]:
        """Listen for every node: on free ports, or on base_port, base_port+1, ...; returns
        node -> port. On failure nothing stays bound."""
        try:
            for i, node in enumerate(self.nodes):
                port = base_port + i if base_port else 0
                node.listener = await asyncssh.listen(
                    self.host,
                    port,
                    server_factory=lambda node=node: _NodeServer(self, node),
                    server_host_keys=[self.host_key],
                    encoding=None,
                    allow_pty=True,
                    agent_forwarding=False,
                    x11_forwarding=False,
                    allow_scp=False,
                    login_timeout=self.limits.login_timeout,
                    keepalive_interval=self.limits.keepalive_interval,
                    keepalive_count_max=self.limits.keepalive_count_max,
                    reuse_address=True,
                )
                node.port = node.listener.get_port()
        except BaseException:
            await self.close()
            raise
        return {node.name: node.port for node in self.nodes}

    async def close(self) -> None:
        """Stop listening, drop every connection, wait (briefly) for the sessions to end."""
        for node in self.nodes:
            if node.listener is not None:
                node.listener.close()
        for node in self.nodes:
            if node.listener is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(node.listener.wait_closed(), 5)
                node.listener = None
        for conn in list(self.live):
            conn.close()
        for conn in list(self.live):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)
        if self._agents:
            await asyncio.wait(list(self._agents), timeout=5)
        for _name, backend in ((n.name, n.backend) for n in self.nodes):
            with contextlib.suppress(Exception):
                backend.close()

    # ---- commands -------------------------------------------------------------------------

    async def run_command(
        self, node: SimNodeEndpoint, command: str | None, process: asyncssh.SSHServerProcess[bytes]
    ) -> int:
        """Run one exec request; returns the exit status."""
        if command is None:  # not reached: shells are refused before a session starts
            process.stderr.write(b"this simulated node runs commands only, no shell\n")
            return 1
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            process.stderr.write(f"sh: syntax error: {exc}\n".encode())
            return 2
        if argv[:1] == ["command"] and len(argv) == 3 and argv[1] == "-v":
            if argv[2] == "gpuops":
                process.stdout.write(f"{GPUOPS_PATH}\n".encode())
                return 0
            return 1
        if len(argv) == 5 and argv[:4] == ["sh", "-c", AGENT_PROBE, "sh"]:
            process.stdout.write(f"{ON_PATH}\n".encode())
            return 0
        if argv[:2] == ["gpuops", "agent"]:
            return await self._agent(node, argv[2:], process)
        name = argv[0] if argv else ""
        process.stderr.write(f"sh: 1: {_printable(name)}: command not found\n".encode())
        # Said so that a tool pointed at a simulated node (ansible-playbook) can tell the operator
        # what it reached, rather than advise fixing a Python that is not there.
        process.stderr.write(f"{NOT_A_HOST}\n".encode())
        return 127

    async def _agent(
        self, node: SimNodeEndpoint, args: list[str], process: asyncssh.SSHServerProcess[bytes]
    ) -> int:
        options, problem = _agent_options(args)
        if problem:
            process.stderr.write(f"Error: {problem}\n".encode())
            return 2
        if "--stdio" not in options:
            process.stderr.write(b"error: the agent only speaks over stdin/stdout for now: add --stdio\n")
            return 2
        if node.agents >= self.limits.agents_per_node:
            process.stderr.write(b"error: too many agents running on this node\n")
            return 1
        backend_name = options.get("--backend", "nvml")
        if backend_name == "sim":
            state = self.state_dir / node.name
            # Faults (faults.py) reach the node's GPUs through this wrapper; "kill" drops this
            # session as a SIGKILLed agent would.
            backend = cast(Backend, FaultyBackend(node.backend, state, on_kill=process.channel.abort))
            # As a real agent does when it starts: say what a killed one left half-done (only
            # an apply resolves it).
            for note in interrupted_applies(str(state)):
                log.warning("%s: %s", node.name, note)
            history = self.history
            agent = Agent(
                backend,
                "sim",
                hostname=node.name,
                inline=True,
                state_dir=str(state),
                limiter_dir=str(state / "limiter"),
                before_history=(lambda: history.prepare(node.name)) if history is not None else None,
                health=node.health,
            )
        else:
            reason = f"backend {backend_name!r} is not available on a simulated node (use --backend sim)"
            agent = Agent(None, backend_name, unavailable_reason=reason, hostname=node.name, inline=True)
        node.agents += 1
        task = asyncio.current_task()
        if task is not None:
            self._agents.add(task)
        log.debug("%s: agent started", node.name)
        try:
            await agent.serve(process.stdin, process.stdout)
        finally:
            node.agents -= 1
            if task is not None:
                self._agents.discard(task)
            log.debug("%s: agent ended", node.name)
        return 0


_AGENT_VALUE_OPTIONS = (
    "--backend",
    "--sim-spec",
    "--log-level",
    # Parsed so that a command line written for a real node starts here too; the node's
    # directories and MPS control are the fleet's (see `_agent`), so the values are not used.
    "--state-dir",
    "--limiter-dir",
    "--mps-control",
    "--history-dir",
)


def _agent_options(args: list[str]) -> tuple[dict[str, str], str]:
    """Parse `gpuops agent` options as the real command would (typer): (options, problem)."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--stdio":
            options[arg] = ""
        elif arg.split("=", 1)[0] in _AGENT_VALUE_OPTIONS:
            if "=" in arg:
                key, value = arg.split("=", 1)
            elif i + 1 < len(args):
                key, value = arg, args[i + 1]
                i += 1
            else:
                return options, f"Option '{arg}' requires an argument."
            options[key] = value
        elif arg.startswith("-"):
            return options, f"No such option: {_printable(arg)}"
        else:
            return options, f"Got unexpected extra argument ({_printable(arg)})"
        i += 1
    return options, ""


def _printable(text: str) -> str:
    text = text[:200]
    return text if text.isprintable() else repr(text)
