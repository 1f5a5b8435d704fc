"""Starting the node agent at the far end of an SSH connection.

Three ways, chosen per node in fleet.yaml (`agent.mode`):
- `installed`: run the node's own agent: the one ansible/bootstrap.yml installed under the
  node's prefix (`<agent.prefix>/bin/gpuops-agent`, which carries the node's own state, history
  and limiter directories, so the session serves the history its recorder keeps), else
  `gpuops agent --stdio` from the node's PATH;
- `push`: upload the zipapp (fleet/zipapp.py) over SFTP into `~/.cache/gpuops/`, named by its
  hash, unless it is already there, and run it with the node's `python3`;
- `auto` (default): `installed` when the node has one of those, else `push`.

Which one ran is kept in the attempt's `Progress.agent` (`gpuops discover` shows it).

The remote command line is built from a list with shlex quoting: values from fleet.yaml are
never pasted into a shell string.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from dataclasses import dataclass

import asyncssh

from gpuops.fleet import zipapp
from gpuops.fleet.agent_client import AgentClient
from gpuops.fleet.ssh import Progress, SshError

AUTO, INSTALLED, PUSH = "auto", "installed", "push"
# What ran, as `gpuops discover` names it: the bootstrapped agent under the prefix, a `gpuops`
# on the node's PATH, or the zipapp pushed for this session.
BOOTSTRAPPED, ON_PATH, PUSHED = "bootstrapped", "installed", "pushed"
DEFAULT_PREFIX = "/opt/gpuops"
BOOTSTRAP_AGENT = "bin/gpuops-agent"  # under the prefix; written by ansible/roles/gpuops_node
HELLO_TIMEOUT = 30.0
CACHE_DIR = ".cache/gpuops"  # relative to the login directory, where SFTP and exec start
# A constant script: the prefix from fleet.yaml comes in as $1, never pasted into the text.
PROBE = (
    f'if [ -x "$1/{BOOTSTRAP_AGENT}" ]; then echo {BOOTSTRAPPED}; '
    f"elif command -v gpuops >/dev/null 2>&1; then echo {ON_PATH}; else echo none; fi"
)


@dataclass(frozen=True)
class AgentLaunch:
    mode: str = AUTO
    python: str = "python3"
    backend: str = "nvml"
    sim_spec: str | None = None
    prefix: str = DEFAULT_PREFIX

    def agent_args(self) -> list[str]:
        args = ["agent", "--stdio", "--backend", self.backend]
        if self.sim_spec:
            args += ["--sim-spec", self.sim_spec]
        return args


async def _installed_agent(conn: asyncssh.SSHClientConnection, prefix: str) -> str | None:
    """BOOTSTRAPPED or ON_PATH: the agent the node has installed (one round trip), else None."""
    result = await conn.run(shlex.join(["sh", "-c", PROBE, "sh", prefix]), check=False)
    said = result.stdout.strip() if isinstance(result.stdout, str) else ""
    return said if result.exit_status == 0 and said in (BOOTSTRAPPED, ON_PATH) else None


async def push_zipapp(conn: asyncssh.SSHClientConnection) -> str:
    """Make sure the current zipapp is in the node's cache; returns its path (relative to home)."""
    app = zipapp.build()
    path = f"{CACHE_DIR}/{app.name}"
    try:
        async with conn.start_sftp_client() as sftp:
            if await sftp.exists(path) and (await sftp.stat(path)).size == len(app.data):
                return path
            await sftp.makedirs(CACHE_DIR, exist_ok=True)
            await sftp.chmod(CACHE_DIR, 0o700)
            # Upload under a private name, then rename: a half-written agent is never run.
            partial = f"{path}.{secrets.token_hex(4)}.partial"
            async with sftp.open(partial, "wb") as f:
                await f.write(app.data)
            await sftp.chmod(partial, 0o600)
            await sftp.posix_rename(partial, path)
    except (asyncssh.SFTPError, asyncssh.Error, OSError) as exc:
        raise SshError("agent", f"cannot upload the agent over SFTP: {exc}") from None
    return path


class _AgentSession(asyncssh.SSHClientSession[bytes]):
    """The SSH channel of one agent: its bytes go straight into the client (no task per read)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.stderr = bytearray()

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            if len(self.stderr) < 4096:  # keep the start: it says why an agent failed
                self.stderr += data[: 4096 - len(self.stderr)]
        else:
            self.client.feed(data)

    def eof_received(self) -> bool:
        self.client.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.feed_eof(exc)


class _ChannelWriter:
    """What AgentClient writes to: the channel, once it exists. Requests are small lines, so the
    channel's own buffering is enough and drain() has nothing to wait for."""

    def __init__(self) -> None:
        self.channel: asyncssh.SSHClientChannel[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self.channel is None:
            raise ConnectionError("the agent channel is not open")
        self.channel.write(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


async def start_agent(
    conn: asyncssh.SSHClientConnection, launch: AgentLaunch, name: str, progress: Progress | None = None
) -> tuple[AgentClient, asyncssh.SSHClientChannel[bytes]]:
    """Start the agent on the node and greet it; raises SshError or AgentError."""
    progress = progress if progress is not None else Progress()
    installed = None
    if launch.mode != PUSH:
        progress.to("logged in, asking the node whether gpuops is installed")
        installed = await _installed_agent(conn, launch.prefix)
    if installed == BOOTSTRAPPED:
        # The wrapper is `gpuops agent` with the node's directories: same arguments after it.
        argv = [f"{launch.prefix.rstrip('/')}/{BOOTSTRAP_AGENT}", *launch.agent_args()[1:]]
    elif installed == ON_PATH or launch.mode == INSTALLED:
        # mode installed on a node without one: `gpuops` is run anyway, and its "not found"
        # is the reason the node shows.
        installed = ON_PATH
        argv = ["gpuops", *launch.agent_args()]
    else:
        progress.to("logged in, uploading the agent over SFTP")
        installed = PUSHED
        argv = [launch.python, await push_zipapp(conn), *launch.agent_args()]
    progress.agent, progress.agent_command = installed, argv[0] if installed != PUSHED else argv[1]
    progress.to(f"started the agent ({argv[0]}), waiting for its first reply")
    writer = _ChannelWriter()
    client = AgentClient(None, writer, name=name)
    session = _AgentSession(client)
    channel, _ = await conn.create_session(lambda: session, shlex.join(argv), encoding=None)
    writer.channel = channel
    try:
        await asyncio.wait_for(client.start(), HELLO_TIMEOUT)
    except (Exception, asyncio.CancelledError) as exc:
        channel.close()
        if isinstance(exc, asyncio.CancelledError):
            raise
        said = _last_line(bytes(session.stderr))
        if said:
            raise SshError("agent", f"the agent did not start: {said}") from None
        if isinstance(exc, TimeoutError):
            raise SshError("agent", f"the agent did not answer within {HELLO_TIMEOUT:g}s") from None
        raise
    return client, channel


def _last_line(data: bytes) -> str:
    """The last non-empty line a failed agent wrote to stderr (e.g. `python3: not found`)."""
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""
