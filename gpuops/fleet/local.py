"""The agent of this host, run as a child process: the same protocol as over SSH."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuops.fleet.agent_client import AgentClient

STOP_TIMEOUT = 5.0


@asynccontextmanager
async def local_agent(backend: str = "nvml", sim_spec: str | None = None) -> AsyncIterator[AgentClient]:
    """Start `python -m gpuops.node agent --stdio` and yield a greeted client."""
    argv = [sys.executable, "-m", "gpuops.node", "agent", "--stdio", "--backend", backend]
    if sim_spec is not None:
        argv += ["--sim-spec", sim_spec]
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None
    )
    assert process.stdin is not None and process.stdout is not None
    client = AgentClient(process.stdout, process.stdin, name="local agent")
    try:
        await client.start()
        yield client
    finally:
        await client.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()
