"""Reading every node's history (gpuops/tenancy/gather.py): the cyclic collector is off while the
replies are read and decoded, and as it was afterwards, whatever happened."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from gpuops.fleet.session import NodeTarget
from gpuops.fleet.ssh import SshTarget
from gpuops.tenancy import gather
from gpuops.tenancy.accounting import parse_window


def _targets(n: int) -> list[NodeTarget]:
    return [NodeTarget(name=f"n{i}", ssh=SshTarget(host="127.0.0.1")) for i in range(n)]


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_the_collector_is_off_while_reading_and_restored(
    monkeypatch: pytest.MonkeyPatch, enabled: bool, fails: bool
) -> None:
    seen: list[bool] = []

    async def read_history(target: NodeTarget, *_args: Any) -> str:
        await asyncio.sleep(0)
        seen.append(gc.isenabled())
        if fails and target.name == "n2":
            raise RuntimeError("boom")
        return "unreachable"

    monkeypatch.setattr(gather, "read_history", read_history)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        if fails:
            with pytest.raises(RuntimeError):
                asyncio.run(gather.read_histories(_targets(4), parse_window("7d"), 1e9))
        else:
            got = asyncio.run(gather.read_histories(_targets(4), parse_window("7d"), 1e9))
            assert got == {f"n{i}": "unreachable" for i in range(4)}
        assert seen and not any(seen)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


# ---- a malformed reply ---------------------------------------------------------------------------


def _ask_history(result: Any) -> Any:
    """AgentClient.history against a peer that answers `result`: the History, or the AgentError."""
    import json

    from gpuops.core import protocol as proto
    from gpuops.fleet.agent_client import AgentClient, AgentError

    async def run() -> Any:
        loop = asyncio.get_running_loop()

        class Peer:
            def write(self, data: bytes) -> None:
                request_id = json.loads(data)["id"]
                loop.call_soon(client.feed, proto.reply(request_id, result))

            async def drain(self) -> None:
                return None

        client = AgentClient(None, Peer(), "n1")
        try:
            return await client.history("hour", 0.0, 7200.0)
        except AgentError as exc:
            return exc

    return asyncio.run(run())


def test_a_malformed_history_reply_is_a_located_one_line_error() -> None:
    from gpuops.core.history import history_to_json
    from gpuops.fleet.agent_client import AgentError
    from tests.unit.test_history_format import _history

    good = history_to_json(_history())
    assert _ask_history(good) == _history()
    bad_user = history_to_json(_history())
    bad_user["buckets"][0]["gpus"][0]["users"][1]["held"] = -1.0
    bad_gpu = history_to_json(_history())
    bad_gpu["buckets"][0]["gpus"][1]["users"] = {"user": "x"}
    for result, where in (
        (bad_user, "History.buckets[0].gpus[0].users[1].held: expected a finite number >= 0"),
        (bad_gpu, "History.buckets[0].gpus[1].users: expected a list"),
        ([1, 2], "History: expected an object"),
        ({**good, "buckets": [good["buckets"][1], good["buckets"][0]]}, "History.buckets[1].start"),
    ):
        error = _ask_history(result)
        assert isinstance(error, AgentError) and error.code == "invalid_request"
        assert error.message.startswith("n1: agent sent an invalid history: " + where)
        assert "\n" not in error.message
