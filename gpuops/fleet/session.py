"""One-off agent sessions for commands that ask a node something and then go (plan, apply,
assert, export), as opposed to the collector's long-lived streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.collector import NodeTarget
from gpuops.fleet.remote_agent import start_agent
from gpuops.fleet.ssh import connect

CLOSE_TIMEOUT = 2.0


@contextlib.asynccontextmanager
async def node_agent(
    target: NodeTarget, handshakes: asyncio.Semaphore | None = None
) -> AsyncIterator[AgentClient]:
    """Connect, start the node's agent and yield it greeted; raises SshError or AgentError
    (backend_unavailable when the agent runs but cannot reach the GPUs)."""
    conn = await connect(target.ssh, handshakes)
    try:
        client, channel = await start_agent(conn, target.launch, target.name)
        try:
            hello = client.hello
            if hello is not None and hello.backend_error:
                raise AgentError("backend_unavailable", hello.backend_error)
            yield client
        finally:
            await client.close()
            channel.close()
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.wait_closed(), CLOSE_TIMEOUT)
