"""MIG changes through the agent protocol: per-GPU results, the node lock, bad requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuops.core import protocol as proto
from gpuops.core.mig.layout import fingerprint, layout_of
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.node.agent import Agent
from gpuops.node.backends.sim import SimBackend
from gpuops.node.state import NodeState
from tests.node.test_mig_apply import _layout, _spec


async def _client(backend: SimBackend, state_dir: Path) -> tuple[AgentClient, Any, Any]:
    import socket

    left, right = socket.socketpair()
    agent = Agent(backend, "sim", hostname="n1", state_dir=str(state_dir))
    a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
    serving = asyncio.create_task(agent.serve(a_reader, a_writer))
    reader, writer = await asyncio.open_unix_connection(sock=right)
    client = AgentClient(reader, writer, "n1")
    await client.start()
    return client, serving, a_writer


def test_each_gpu_is_its_own_transaction(tmp_path: Path) -> None:
    backend = SimBackend(_spec(), clock=lambda: 1_700_000_000.0)
    gpus = backend.sample().gpus

    async def run() -> proto.MigApplyReply:
        client, serving, a_writer = await _client(backend, tmp_path / "state")
        try:
            return await client.mig_apply(
                [
                    {"gpu": 0, "layout": _layout(("7g.40gb", 0)).to_json(), "expect": fingerprint(gpus[0])},
                    {"gpu": 1, "layout": _layout(("7g.40gb", 0)).to_json(), "expect": fingerprint(gpus[1])},
                ],
                holder="test",
            )
        finally:
            await client.close()
            await asyncio.wait_for(serving, 10)
            a_writer.close()

    result = asyncio.run(run())
    first, second = result.results
    assert first == proto.MigResult(gpu=0, ok=True, changed=True, stopped=())
    assert second.ok is False and second.code == "in_use" and "(alice)" in second.message
    assert layout_of(backend.sample().gpus[0]) == _layout(("7g.40gb", 0))


def test_a_held_node_lock_is_busy_and_bad_requests_are_refused(tmp_path: Path) -> None:
    backend = SimBackend(_spec(), clock=lambda: 1_700_000_000.0)
    state = NodeState(str(tmp_path / "state"))
    held = state.lock("apply by someone else")

    async def run() -> list[str]:
        client, serving, a_writer = await _client(backend, tmp_path / "state")
        codes = []
        try:
            for changes in (
                [{"gpu": 0, "layout": _layout(("7g.40gb", 0)).to_json()}],
                [{"gpu": 0, "layout": {"enabled": "yes"}}],
                [],
            ):
                with pytest.raises(AgentError) as info:
                    await client.mig_apply(changes)
                codes.append(info.value.code)
        finally:
            await client.close()
            await asyncio.wait_for(serving, 10)
            a_writer.close()
        return codes

    assert asyncio.run(run()) == [proto.BUSY, proto.INVALID_ARGS, proto.INVALID_ARGS]
    NodeState.unlock(held)
