"""The replies of the write path (mig_apply, mps_apply, limiter_apply) as typed messages
(core/protocol.py): the JSON is what agents always sent, key for key; the operator rebuilds each
reply field by field, and a malformed one is one located error (core/codec.py), never a
traceback, through the client as through the codec."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.core import protocol as proto
from gpuops.core.codec import (
    DecodeError,
    from_json,
    limiter_apply_reply_json,
    mig_apply_reply_json,
    mps_apply_reply_json,
)
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.node.agent import Agent

ints = st.integers(0, 2**31)
texts = st.text(max_size=12)

mig_results = st.builds(
    proto.MigResult,
    gpu=st.integers(0, 255),
    ok=st.just(True),
    changed=st.booleans(),
    stopped=st.lists(ints).map(tuple),
) | st.builds(proto.MigResult, gpu=st.integers(0, 255), ok=st.just(False), code=texts, message=texts)
mig_replies = st.builds(
    proto.MigApplyReply,
    results=st.lists(mig_results, max_size=4).map(tuple),
    recovered=st.lists(texts).map(tuple),
)
mps_clients = st.builds(proto.MpsClient, pid=ints, user=texts, server=ints)
mps_results = st.builds(
    proto.MpsResult,
    device=texts,
    gpu=st.integers(0, 255),
    ok=st.booleans(),
    changed=st.booleans(),
    actions=st.lists(texts, max_size=3).map(tuple),
    notes=st.lists(texts, max_size=3).map(tuple),
    stopped=st.lists(ints, max_size=3).map(tuple),
    code=texts,
    message=texts,
    clients=st.lists(mps_clients, max_size=3).map(tuple),
)
mps_replies = st.builds(proto.MpsApplyReply, results=st.lists(mps_results, max_size=4).map(tuple))
limiter_replies = st.builds(proto.LimiterApplyReply, generation=ints, changed=st.booleans(), directory=texts)


def _wire(data: Any) -> Any:
    """Through JSON text, as the reply travels."""
    return json.loads(proto.reply(1, data))["result"]


@given(mig_replies)
def test_mig_replies_round_trip(reply: proto.MigApplyReply) -> None:
    assert from_json(proto.MigApplyReply, _wire(mig_apply_reply_json(reply))) == reply


@given(mps_replies)
def test_mps_replies_round_trip(reply: proto.MpsApplyReply) -> None:
    assert from_json(proto.MpsApplyReply, _wire(mps_apply_reply_json(reply))) == reply


@given(limiter_replies)
def test_limiter_replies_round_trip(reply: proto.LimiterApplyReply) -> None:
    assert from_json(proto.LimiterApplyReply, _wire(limiter_apply_reply_json(reply))) == reply


def test_the_json_is_what_agents_always_sent() -> None:
    done = proto.MigResult(gpu=0, ok=True, changed=True, stopped=(42,))
    refused = proto.MigResult(gpu=1, ok=False, code="in_use", message="GPU 1 has processes")
    assert mig_apply_reply_json(proto.MigApplyReply((done, refused), ("GPU 2: undone",))) == {
        "results": [
            {"gpu": 0, "changed": True, "stopped": [42], "ok": True},
            {"gpu": 1, "ok": False, "code": "in_use", "message": "GPU 1 has processes"},
        ],
        "recovered": ["GPU 2: undone"],
    }
    plain = proto.MpsResult(device="GPU-a", gpu=0, changed=True, actions=("started",))
    busy = proto.MpsResult(
        device="GPU-b", gpu=1, ok=False, code="in_use", message="m", clients=(proto.MpsClient(7, "alice", 6),)
    )
    every_key = {"device", "gpu", "ok", "changed", "actions", "notes", "stopped", "code", "message"}
    first, second = mps_apply_reply_json(proto.MpsApplyReply((plain, busy)))["results"]
    assert set(first) == every_key  # `clients` only when a refusal names some
    assert second["clients"] == [{"pid": 7, "user": "alice", "server": 6}]
    assert limiter_apply_reply_json(proto.LimiterApplyReply(3, False, "/run/gpuops/limiter")) == {
        "generation": 3,
        "changed": False,
        "directory": "/run/gpuops/limiter",
    }


@pytest.mark.parametrize(
    ("cls", "data", "message"),
    [
        (proto.MigApplyReply, [], "MigApplyReply: expected an object"),
        (proto.MigApplyReply, {"recovered": []}, "MigApplyReply.results: missing"),
        (proto.MigApplyReply, {"results": [1]}, "MigApplyReply.results[0]: expected an object"),
        (
            proto.MigApplyReply,
            {"results": [{"gpu": "0", "ok": True}]},
            "MigApplyReply.results[0].gpu: expected an integer",
        ),
        (
            proto.MigApplyReply,
            {"results": [{"gpu": 0, "ok": 1}]},
            "MigApplyReply.results[0].ok: expected true or false",
        ),
        (
            proto.MigApplyReply,
            {"results": [{"gpu": 0, "ok": True, "stopped": [1, "x"]}]},
            "MigApplyReply.results[0].stopped[1]: expected an integer",
        ),
        (
            proto.MigApplyReply,
            {"results": [], "recovered": [None]},
            "MigApplyReply.recovered[0]: expected a string",
        ),
        (proto.MigApplyReply, {"results": [], "extra": 1}, "MigApplyReply: unknown field 'extra'"),
        (proto.MpsApplyReply, {"results": [{"gpu": 0}]}, "MpsApplyReply.results[0].device: missing"),
        (
            proto.MpsApplyReply,
            {"results": [{"device": "GPU-a", "gpu": 0, "clients": [{"pid": 1, "user": "a"}]}]},
            "MpsApplyReply.results[0].clients[0].server: missing",
        ),
        (
            proto.MpsApplyReply,
            {"results": [{"device": "GPU-a", "gpu": 0, "actions": "started"}]},
            "MpsApplyReply.results[0].actions: expected a list",
        ),
        (
            proto.LimiterApplyReply,
            {"generation": None, "changed": True, "directory": "/d"},
            "LimiterApplyReply.generation: expected an integer",
        ),
        (proto.LimiterApplyReply, {"generation": 1, "directory": "/d"}, "LimiterApplyReply.changed: missing"),
    ],
)
def test_a_malformed_reply_names_the_field(cls: Any, data: Any, message: str) -> None:
    with pytest.raises(DecodeError, match="^" + re.escape(message) + "$"):
        from_json(cls, data)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape, sometimes anything: the errors hide deep in replies that look right."""
    return st.one_of(valid, valid, valid, json_values)


def _object(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    shaped = st.fixed_dictionaries(
        {k: _maybe(v) for k, v in required.items()}, optional={k: _maybe(v) for k, v in optional.items()}
    )
    return _maybe(shaped | shaped.map(lambda d: {**d, "unexpected": 1}))


_mig_result = _object(
    {"gpu": st.integers(0, 255), "ok": st.booleans()},
    {"changed": st.booleans(), "stopped": st.lists(ints), "code": texts, "message": texts},
)
_mps_client = _object({"pid": ints, "user": texts, "server": ints}, {})
_mps_result = _object(
    {"device": texts, "gpu": st.integers(0, 255)},
    {
        "ok": st.booleans(),
        "changed": st.booleans(),
        "actions": st.lists(texts),
        "notes": st.lists(texts),
        "stopped": st.lists(ints),
        "code": texts,
        "message": texts,
        "clients": st.lists(_mps_client, max_size=3),
    },
)
near_replies = st.one_of(
    st.tuples(
        st.just(proto.MigApplyReply),
        _object({"results": st.lists(_mig_result, max_size=3)}, {"recovered": st.lists(texts)}),
    ),
    st.tuples(st.just(proto.MpsApplyReply), _object({"results": st.lists(_mps_result, max_size=3)}, {})),
    st.tuples(
        st.just(proto.LimiterApplyReply),
        _object({"generation": ints, "changed": st.booleans(), "directory": texts}, {}),
    ),
)


@given(near_replies)
def test_a_reply_decodes_or_is_one_located_error(case: tuple[Any, Any]) -> None:
    cls, data = case
    try:
        reply = from_json(cls, _wire(data))
    except DecodeError as exc:
        assert str(exc).startswith(cls.__name__) and "\n" not in str(exc)
    else:
        assert isinstance(reply, cls)


@given(json_values)
def test_garbage_is_a_decode_error_only(data: Any) -> None:
    for cls in (proto.MigApplyReply, proto.MpsApplyReply, proto.LimiterApplyReply):
        try:
            from_json(cls, data)
        except DecodeError as exc:
            assert str(exc).startswith(cls.__name__)


# ---- through the client: an agent that answers the write path with a malformed reply ---------


class _Lying(Agent):
    """A real agent (hello and the rest), except that every apply is answered with `lie`."""

    def __init__(self, lie: Any, state_dir: Path) -> None:
        super().__init__(None, "sim", "no backend", hostname="n1", inline=True, state_dir=str(state_dir))
        self.lie = lie

    async def _answer(self, request: proto.Request) -> None:
        await self._send(proto.reply(request.id, self.lie))

    _op_mig_apply = _op_mps_apply = _op_limiter_apply = _answer


async def _ask(lie: Any, state_dir: Path, op: str) -> Any:
    left, right = socket.socketpair()
    agent = _Lying(lie, state_dir)
    a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
    serving = asyncio.create_task(agent.serve(a_reader, a_writer))
    reader, writer = await asyncio.open_unix_connection(sock=right)
    client = AgentClient(reader, writer, "n1")
    try:
        await client.start()
        if op == "mig_apply":
            return await client.mig_apply([{"gpu": 0, "layout": {"enabled": False}}])
        if op == "mps_apply":
            return await client.mps_apply([])
        return await client.limiter_apply([])
    finally:
        await client.close()
        await asyncio.wait_for(serving, 10)
        a_writer.close()


@pytest.mark.parametrize(
    ("op", "lie", "where"),
    [
        ("mig_apply", {"results": [1]}, "MigApplyReply.results[0]: expected an object"),
        (
            "mig_apply",
            {"results": [{"gpu": "x", "ok": True}]},
            "MigApplyReply.results[0].gpu: expected an integer",
        ),
        (
            "mps_apply",
            {"results": [{"device": 3, "gpu": 0}]},
            "MpsApplyReply.results[0].device: expected a string",
        ),
        ("limiter_apply", {"changed": True}, "LimiterApplyReply.generation: missing"),
    ],
)
def test_the_client_refuses_a_malformed_reply_with_its_place(
    tmp_path: Path, op: str, lie: Any, where: str
) -> None:
    with pytest.raises(AgentError) as info:
        asyncio.run(_ask(lie, tmp_path, op))
    assert info.value.code == proto.INVALID_REQUEST
    assert info.value.message.startswith("n1: agent sent an invalid ") and info.value.message.endswith(where)


def test_the_client_hands_back_typed_replies(tmp_path: Path) -> None:
    wire = {"results": [{"gpu": 0, "changed": True, "stopped": [9], "ok": True}], "recovered": []}
    reply = asyncio.run(_ask(wire, tmp_path, "mig_apply"))
    assert reply == proto.MigApplyReply((proto.MigResult(gpu=0, ok=True, changed=True, stopped=(9,)),))
