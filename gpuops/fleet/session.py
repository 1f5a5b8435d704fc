"""Agent sessions on a node: connect, start the agent, greet it, close.

`node_agent` is for commands that ask a node something and then go (plan, apply, assert,
export); the collector's long-lived streams use `agent_connection`, which also hands over the
SSH connection (the collector turns its keepalives off while a stream flows).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncssh

from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.remote_agent import AgentLaunch, start_agent
from gpuops.fleet.ssh import Progress, SshTarget, connect

CLOSE_TIMEOUT = 2.0


@dataclass(frozen=True)
class NodeTarget:
    """One node as a session reaches it (built from fleet.yaml by fleet/targets.py)."""

    name: str
    ssh: SshTarget
    launch: AgentLaunch = field(default_factory=AgentLaunch)
    owner: str | None = None
    labels: tuple[tuple[str, str], ...] = ()


@contextlib.asynccontextmanager
async def agent_connection(
    target: NodeTarget, handshakes: asyncio.Semaphore | None = None, progress: Progress | None = None
) -> AsyncIterator[tuple[asyncssh.SSHClientConnection, AgentClient]]:
    """Connect, start the node's agent and yield the connection and the greeted agent; raises
    SshError or AgentError (backend_unavailable when the agent runs but cannot reach the GPUs).
    The agent, its channel and the connection are closed on the way out, whatever happened.
    `progress` follows the way taken and each step, for a node that has not answered yet."""
    progress = progress if progress is not None else Progress()
    conn = await connect(target.ssh, handshakes, progress)
    try:
        client, channel = await start_agent(conn, target.launch, target.name, progress)
        try:
            hello = client.hello
            if hello is not None and hello.backend_error:
                raise AgentError("backend_unavailable", hello.backend_error)
            yield conn, client
        finally:
            await client.close()
            channel.close()
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.wait_closed(), CLOSE_TIMEOUT)


@contextlib.asynccontextmanager
async def node_agent(
    target: NodeTarget, handshakes: asyncio.Semaphore | None = None
) -> AsyncIterator[AgentClient]:
    """The node's greeted agent (see `agent_connection`), for a one-off session."""
    async with agent_connection(target, handshakes) as (_, client):
        yield client
