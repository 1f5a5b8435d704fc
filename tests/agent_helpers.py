"""Shared test helpers for driving the node agent."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gpuops.node.agent import Agent
from gpuops.node.backends.base import Backend

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@asynccontextmanager
async def agent_socket(backend: Backend | None, reason: str = "") -> AsyncIterator[tuple[Any, Any]]:
    """An in-process agent serving one end of a socketpair; yields the client's (reader, writer)."""
    left, right = socket.socketpair()
    agent = Agent(backend, "sim" if backend else "nvml", reason, hostname="test-node")
    a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
    serving = asyncio.create_task(agent.serve(a_reader, a_writer))
    c_reader, c_writer = await asyncio.open_unix_connection(sock=right)
    try:
        yield c_reader, c_writer
    finally:
        c_writer.close()
        await asyncio.wait_for(serving, 10)
        a_writer.close()


async def roundtrip(reader: Any, writer: Any, line: bytes) -> dict[str, Any]:
    writer.write(line if line.endswith(b"\n") else line + b"\n")
    await writer.drain()
    return json.loads(await asyncio.wait_for(reader.readline(), 10))  # type: ignore[no-any-return]


def spawn_agent(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops.node", "agent", "--stdio", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
