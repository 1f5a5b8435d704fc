"""The node agent driven through its protocol: in-process over a socket, and as a real process."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.core import protocol as proto
from gpuops.core.codec import SAMPLE_ROW_FIELDS, from_json, from_rows
from gpuops.core.delta import apply
from gpuops.core.model import Node, NodeSample
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.node.backends.sim import SimBackend
from tests.agent_helpers import agent_socket, roundtrip, spawn_agent
from tests.hypothesis_budget import examples


def _sim() -> SimBackend:
    return SimBackend(clock=lambda: 1_700_000_000.0)


def test_hello_inventory_sample_in_process() -> None:
    async def run() -> None:
        async with agent_socket(_sim()) as (reader, writer):
            hello = await roundtrip(reader, writer, proto.request(1, "hello", {"versions": [1]}))
            assert hello["ok"] and hello["result"]["protocol"] == 1
            assert hello["result"]["backend"] == "sim"
            assert "watch" in hello["result"]["capabilities"]
            inv = await roundtrip(reader, writer, proto.request(2, "inventory"))
            node = from_json(Node, inv["result"])
            assert node.gpus and all(g.sample is None for g in node.gpus)
            smp = await roundtrip(reader, writer, proto.request(3, "sample"))
            sample = from_json(NodeSample, smp["result"])
            assert len(sample.gpus) == len(node.gpus)
            assert all(g.sample is not None for g in sample.gpus)

    asyncio.run(run())


def test_errors_keep_the_agent_serving() -> None:
    async def run() -> None:
        async with agent_socket(_sim()) as (reader, writer):
            cases = [
                (b"garbage", proto.PARSE_ERROR, None),
                (b'{"v":1,"id":5,"op":"launch"}', proto.UNKNOWN_OP, 5),
                (b'{"v":9,"id":6,"op":"hello"}', proto.UNSUPPORTED_VERSION, 6),
                (b'{"v":1,"id":7,"op":"sample","args":{"x":1}}', proto.INVALID_ARGS, 7),
                (b'{"v":1,"id":8,"op":"cancel","args":{"id":99}}', proto.INVALID_ARGS, 8),
                (b'{"v":1,"id":9,"op":"watch","args":{"interval":0}}', proto.INVALID_ARGS, 9),
                (b"[" * 10 + b"1" + b"]" * 10, proto.INVALID_REQUEST, None),
            ]
            for line, code, rid in cases:
                answer = await roundtrip(reader, writer, line)
                assert answer["ok"] is False, line
                assert answer["error"]["code"] == code, (line, answer)
                assert answer["id"] == rid
            # An oversized line is skipped whole: one error, then the next request works.
            writer.write(
                b'{"v":1,"id":1,"op":"hello","pad":"' + b"x" * (proto.MAX_REQUEST_BYTES * 3) + b'"}\n'
            )
            answer = await roundtrip(reader, writer, proto.request(10, "hello"))
            assert answer["error"]["code"] == proto.TOO_LARGE
            after = json.loads(await asyncio.wait_for(reader.readline(), 10))
            assert after["id"] == 10 and after["ok"] is True

    asyncio.run(run())


def test_watch_streams_until_cancelled() -> None:
    async def run() -> None:
        async with agent_socket(_sim()) as (reader, writer):
            client = AgentClient(reader, writer, "test")
            await client.start()
            received = []
            async for item in client.watch(0.05):
                assert isinstance(item, NodeSample)
                received.append(item)
                if len(received) == 3:
                    break
            # The stream was cancelled on the agent: further requests still work.
            node = await client.inventory()
            assert node.hostname
            counted = [s async for s in client.watch(0.05, count=2)]
            assert len(counted) == 2
            await client.close()

    asyncio.run(run())


def test_unavailable_backend_is_reported_not_fatal() -> None:
    async def run() -> None:
        async with agent_socket(None, "NVML is unavailable: libnvidia-ml.so.1 not found") as (reader, writer):
            client = AgentClient(reader, writer, "test")
            hello = await client.start()
            assert "libnvidia-ml.so.1" in hello.backend_error
            with pytest.raises(AgentError) as info:
                await client.sample()
            assert info.value.code == proto.BACKEND_UNAVAILABLE
            await client.close()

    asyncio.run(run())


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b and b.strip()), max_size=5)
)
def test_garbage_lines_get_one_error_each(lines: list[bytes]) -> None:
    async def run() -> None:
        async with agent_socket(_sim()) as (reader, writer):
            for line in lines:
                answer = await roundtrip(reader, writer, line)
                assert set(answer) >= {"v", "id", "ok"}
                if answer["ok"] is False:
                    assert answer["error"]["code"] in (
                        proto.PARSE_ERROR,
                        proto.INVALID_REQUEST,
                        proto.UNSUPPORTED_VERSION,
                        proto.UNKNOWN_OP,
                        proto.INVALID_ARGS,
                    )
            hello = await roundtrip(reader, writer, proto.request("last", "hello"))
            assert hello["ok"] and hello["id"] == "last"

    asyncio.run(run())


def test_stdio_agent_process_end_to_end() -> None:
    agent = spawn_agent("--backend", "sim")
    assert agent.stdin is not None and agent.stdout is not None
    requests = [
        b"this is not json\n",
        proto.request(1, "hello"),
        proto.request(2, "sample"),
        proto.request(3, "watch", {"interval": 0.05, "count": 2}),
    ]
    agent.stdin.write(b"".join(requests))
    agent.stdin.flush()
    messages = []
    while not (messages and messages[-1].get("id") == 3 and "ok" in messages[-1]):
        line = agent.stdout.readline()
        assert line, "agent closed its output early"
        messages.append(json.loads(line))
    agent.stdin.close()
    assert agent.wait(timeout=15) == 0
    assert messages[0]["error"]["code"] == proto.PARSE_ERROR
    by_id: dict[object, list[dict[str, object]]] = {}
    for m in messages[1:]:
        by_id.setdefault(m["id"], []).append(m)
    assert by_id[1][0]["ok"] is True
    from_json(NodeSample, by_id[2][0]["result"])
    assert [m.get("event") for m in by_id[3]] == ["sample", "sample", None]
    assert by_id[3][-1]["result"] == {"events": 2, "cancelled": False}


def test_stdio_agent_answers_what_was_asked_before_eof() -> None:
    agent = spawn_agent("--backend", "sim")
    out, err = agent.communicate(
        proto.request(1, "hello")
        + proto.request(2, "inventory")
        + proto.request(3, "watch", {"interval": 60}),
        timeout=30,
    )
    assert agent.returncode == 0, err.decode()
    replies = {m["id"]: m for m in map(json.loads, out.splitlines()) if "ok" in m}
    assert replies[1]["ok"] and replies[2]["ok"]
    assert replies[3]["result"]["cancelled"] is True


def test_stdio_agent_exits_on_eof_while_watching() -> None:
    agent = spawn_agent("--backend", "sim")
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(proto.request(1, "watch", {"interval": 0.05}))
    agent.stdin.flush()
    first = json.loads(agent.stdout.readline())
    assert first["event"] == "sample"
    started = time.monotonic()
    agent.stdin.close()
    assert agent.wait(timeout=15) == 0
    assert time.monotonic() - started < 10


def test_stdio_agent_with_unknown_backend_says_why() -> None:
    agent = spawn_agent("--backend", "quantum")
    out, _ = agent.communicate(proto.request(1, "hello") + proto.request(2, "inventory"), timeout=30)
    hello, inventory = (json.loads(line) for line in out.splitlines())
    assert "unknown backend 'quantum'" in hello["result"]["backend_error"]
    assert inventory["error"]["code"] == proto.BACKEND_UNAVAILABLE


def test_watch_with_deltas_sends_what_changed() -> None:
    clock = [1_700_000_000.0]

    def tick() -> float:
        clock[0] += 0.5
        return clock[0]

    async def run() -> None:
        async with agent_socket(SimBackend(clock=tick)) as (reader, writer):
            writer.write(proto.request(1, "watch", {"interval": 0.05, "count": 3, "delta": True}))
            await writer.drain()
            events = [json.loads(await asyncio.wait_for(reader.readline(), 10)) for _ in range(4)]
            assert "result" in events[0] and "delta" not in events[0]
            assert all("delta" in e and "result" not in e for e in events[1:3])
            assert events[3]["result"] == {"events": 3, "cancelled": False}
            document = events[0]["result"]
            for e in events[1:3]:
                document = apply(document, e["delta"])
                assert len(json.dumps(e["delta"])) * 4 < len(json.dumps(document))
            from_json(NodeSample, document)  # the rebuilt document is a valid sample

    asyncio.run(run())


def test_watch_with_rows_sends_each_gpus_sample_as_a_row() -> None:
    clock = [1_700_000_000.0]

    def tick() -> float:
        clock[0] += 0.5
        return clock[0]

    async def run() -> None:
        async with agent_socket(SimBackend(clock=tick)) as (reader, writer):
            args = {"interval": 0.05, "count": 3, "delta": True, "rows": list(SAMPLE_ROW_FIELDS)}
            writer.write(proto.request(1, "watch", args))
            await writer.drain()
            events = [json.loads(await asyncio.wait_for(reader.readline(), 10)) for _ in range(4)]
            assert "result" in events[0] and "rows" not in events[0]
            assert all("rows" in e and "result" not in e and "delta" not in e for e in events[1:3])
            assert events[3]["result"] == {"events": 3, "cancelled": False}
            sample = from_json(NodeSample, events[0]["result"])
            for e in events[1:3]:
                assert len(json.dumps(e["rows"])) * 8 < len(json.dumps(events[0]["result"]))
                sample = from_rows(sample, e["rows"])
            assert sample.timestamp > from_json(NodeSample, events[0]["result"]).timestamp

    asyncio.run(run())


@pytest.mark.serial  # sample times against the clock: run alone, after the parallel phase
def test_an_aligned_watch_samples_at_multiples_of_the_interval() -> None:
    """`align`: the first sample at once, then at the multiples of the interval on the wall clock,
    so every node of a fleet samples at the same instants."""
    interval = 0.2

    async def run() -> None:
        async with agent_socket(SimBackend()) as (reader, writer):
            hello = await roundtrip(reader, writer, proto.request(1, "hello"))
            assert "align" in hello["result"]["capabilities"]
            writer.write(proto.request(2, "watch", {"interval": interval, "count": 5, "align": True}))
            await writer.drain()
            arrived = []
            for _ in range(5):
                json.loads(await asyncio.wait_for(reader.readline(), 10))
                arrived.append(time.time())
            final = json.loads(await asyncio.wait_for(reader.readline(), 10))
            assert final["result"] == {"events": 5, "cancelled": False}
            phases = [t % interval for t in arrived[1:]]
            assert all(min(p, interval - p) < 0.05 for p in phases), phases
            gaps = [b - a for a, b in itertools.pairwise(arrived[1:])]
            assert all(interval * 0.5 < g < interval * 1.5 for g in gaps), gaps
            bad = await roundtrip(reader, writer, proto.request(3, "watch", {"align": "yes"}))
            assert bad["error"]["code"] == proto.INVALID_ARGS

    asyncio.run(run())


def test_rows_need_delta_and_field_names() -> None:
    async def run() -> None:
        async with agent_socket(_sim()) as (reader, writer):
            for n, args in enumerate(
                ({"rows": ["timestamp"]}, {"delta": True, "rows": []}, {"delta": True, "rows": [1]})
            ):
                reply = await roundtrip(reader, writer, proto.request(n + 1, "watch", args))
                assert reply["error"]["code"] == proto.INVALID_ARGS

    asyncio.run(run())


def test_client_streams_rows_when_the_agent_offers_them() -> None:
    """The client asks for rows when the agent offers them; what it rebuilds is what the agent
    sampled, sample by sample."""
    clock = [1_700_000_000.0]
    sampled: list[NodeSample] = []

    class Recording(SimBackend):
        def sample(self) -> NodeSample:
            clock[0] += 1.0
            sampled.append(super().sample())
            return sampled[-1]

    async def run() -> None:
        async with agent_socket(Recording("mixed-node", clock=lambda: clock[0])) as (reader, writer):
            client = AgentClient(reader, writer, "test")
            hello = await client.start()
            assert "rows" in hello.capabilities
            received = [s async for s in client.watch(0.05, count=5)]
            assert received == sampled[-5:]
            await client.close()

    asyncio.run(run())
