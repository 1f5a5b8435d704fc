"""What the write path puts on the wire and in saved plans stays what it was.

Both fixtures were written by gpuops before its payloads were typed end to end (the protocol's
request dataclasses carried by core/codec.py): `tests/data/plans/plan-v2.json` is a plan
`gpuops plan -o` saved (MIG with a compute split, MPS per MIG device, limiter lines beside a live
table, an AMD partition change), and `plan-v2-requests.json` the requests `apply` sent for it,
line by line. A plan saved then still loads to the plan made now, and applying it sends the same
bytes' worth of JSON: an agent of either age reads what an operator of either age sends.

The node is a simulated one behind a scripted agent (`_Node`): the real AgentClient encodes the
requests and decodes the replies, so the client's encoding is under test too.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gpuops.core import protocol as proto
from gpuops.core.codec import to_json
from gpuops.fleet.agent_client import AgentClient
from gpuops.plan.apply import NodeResult, _NodeApply, shown_node
from gpuops.plan.diff import make_plan
from gpuops.plan.live import NodeLive, read_node
from gpuops.plan.model import Plan
from gpuops.plan.saved import parse_plan
from tests.unit.test_plan_diff import _fleet, _sim

DATA = Path(__file__).resolve().parent.parent / "data" / "plans"
GIB = 1024**3

CARVE = """\
  - select: {nodes: n1, gpus: "0"}
    mig: {enabled: true, profiles: {"3g.20gb": 1, "1g.5gb": 2}, compute: {"3g.20gb": [1c, 2c]}}
    mps: {enabled: true, active_thread_percentage: 50, per_tenant: {vision: {pinned_memory_limit: 1GiB}}}
  - select: {nodes: n1, gpus: "1"}
    limiter:
      policy: fixed-share
      tenants: {vision: {memory: 20GiB, compute: 30%}, nlp: {compute: 60%, class: offline}}
  - select: {nodes: n1, gpus: "2"}
    partition: {compute: CPX, memory: NPS4}
"""


def _backend() -> Any:
    return _sim(
        [
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": ["2g.10gb:0"]}},
            {"model": "A100-SXM4-40GB"},
            {"model": "MI300X"},
        ],
        [
            {"name": "busy", "kind": "training", "user": "alice", "gpu": 0, "instance": 0},
            {"name": "amd", "kind": "training", "user": "bob", "gpu": 2},
        ],
    )


def _config(backend: Any) -> dict[str, Any]:
    """The node's `config` reply: an MPS daemon on GPU 0's MIG device, two limiter lines."""
    gpus = backend.sample().gpus
    device = gpus[0].mig.gpu_instances[0].compute_instances[0].uuid
    return {
        "mps": [
            {
                "device": device,
                "gpu": 0,
                "pipe_directory": f"/run/gpuops/mps/{device}",
                "log_directory": f"/var/log/gpuops/mps/{device}",
                "running": True,
                "active_thread_percentage": 40,
                "pinned_memory_limit": None,
                "tenants": {},
                "servers": [],
            }
        ],
        "limiter": {
            "directory": "/etc/gpuops/limiter",
            "generation": 7,
            "tenants": [
                {
                    "name": "vision",
                    "memory": 10 * GIB,
                    "compute": 30.0,
                    "policy": "fixed-share",
                    "class": "online",
                    "gpus": [],
                },
                {
                    "name": "nlp",
                    "memory": None,
                    "compute": 50.0,
                    "policy": "burst-share",
                    "class": "offline",
                    "gpus": ["2"],
                },
            ],
        },
    }


class _Node:
    """A scripted agent: answers each request line the client writes, and records it."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.client = AgentClient(None, self, "n1")
        self.sent: list[list[Any]] = []

    def write(self, data: bytes) -> None:
        message = json.loads(data)
        op, args = message["op"], message["args"]
        if op != "hello":
            self.sent.append([op, args])
        self.client.feed(proto.reply(message["id"], self._answer(op, args)))

    async def drain(self) -> None:
        return None

    def _answer(self, op: str, args: dict[str, Any]) -> Any:
        if op == "hello":
            return {
                "protocol": 1,
                "agent_version": "test",
                "python": "3",
                "hostname": "n1",
                "backend": "sim",
                "capabilities": [],
            }
        if op == "inventory":
            return to_json(self.backend.inventory())
        if op == "sample":
            return to_json(self.backend.sample())
        if op == "config":
            return _config(self.backend)
        if op == "mig_apply":
            return {"results": [{"gpu": c["gpu"], "ok": True, "changed": True} for c in args["changes"]]}
        if op == "partition_apply":
            return {"results": [{"gpu": c["gpu"], "ok": True, "changed": True} for c in args["changes"]]}
        if op == "mps_apply":
            return {
                "results": [
                    {"device": c["device"], "gpu": c["gpu"], "ok": True, "changed": True}
                    for c in args["changes"]
                ]
            }
        if op == "limiter_apply":
            return {"generation": 8, "changed": True, "directory": "/etc/gpuops/limiter"}
        raise AssertionError(op)


async def _live(node: _Node) -> NodeLive:
    await node.client.start()
    return await read_node(node.client, "n1")


def _plan() -> tuple[Plan, NodeLive]:
    node = _Node(_backend())
    live = asyncio.run(_live(node))
    return make_plan(_fleet(CARVE), [live], "/srv/fleet.yaml", "abc", 1.0), live


def test_a_plan_saved_before_typed_payloads_loads_as_the_plan_made_now() -> None:
    plan, _live_state = _plan()
    saved = parse_plan((DATA / "plan-v2.json").read_bytes(), "plan-v2.json")
    assert saved == plan
    kinds = {k for g in saved.nodes[0].gpus for k in ("mig", "mps", "limiter", "partition") if getattr(g, k)}
    assert kinds == {"mig", "mps", "limiter", "partition"}


def test_applying_it_sends_what_gpuops_always_sent() -> None:
    node = _Node(_backend())

    async def run() -> NodeResult:
        live = await _live(node)
        saved = parse_plan((DATA / "plan-v2.json").read_bytes(), "plan-v2.json")
        shown = shown_node(saved.nodes[0], live)
        node.sent.clear()
        return await _NodeApply(node.client, live, shown, True, "gpuops apply by test").run()

    result = asyncio.run(run())
    expected = json.loads((DATA / "plan-v2-requests.json").read_text())
    assert [op for op, _ in node.sent] == [op for op, _ in expected["requests"]]
    for (op, args), (_, want) in zip(node.sent, expected["requests"], strict=True):
        assert args == want, op
    # What apply made of the replies (the scripted node changes nothing: verify says so).
    assert result.to_json() == expected["result"]


def test_what_gpuops_always_sent_is_what_the_agent_reads_now() -> None:
    """Each request an operator of before typed payloads sent decodes, with every check beside its
    type, to the request this gpuops would send for it (an agent of either age reads either)."""
    from gpuops.core.codec import decode_args

    types = {
        "mig_apply": proto.MigApplyRequest,
        "partition_apply": proto.PartitionApplyRequest,
        "mps_apply": proto.MpsApplyRequest,
        "limiter_apply": proto.LimiterApplyRequest,
    }
    expected = json.loads((DATA / "plan-v2-requests.json").read_text())
    seen = set()
    for op, args in expected["requests"]:
        if op in types:
            assert to_json(decode_args(types[op], op, args)) == args, op
            seen.add(op)
    assert seen == set(types)


def test_a_payload_its_type_refuses_is_said_once_the_digest_matches() -> None:
    """An edit nobody signed again is an edit first (exit 4); signed again, the payload is put to
    the checks beside its type, located in the plan (said with '; nothing applied', exit 1)."""
    from gpuops.plan.model import PayloadError
    from gpuops.plan.saved import DIGEST_KEY, EditedPlanError, document_digest

    document = json.loads((DATA / "plan-v2.json").read_text())
    (j,) = [k for k, g in enumerate(document["nodes"][0]["gpus"]) if g.get("limiter")]
    document["nodes"][0]["gpus"][j]["limiter"][0]["policy"] = "greedy"
    try:
        parse_plan(json.dumps(document).encode(), "plan.json")
    except EditedPlanError:
        pass
    else:
        raise AssertionError("an unsigned edit was not refused as one")
    document[DIGEST_KEY] = document_digest(document)
    try:
        parse_plan(json.dumps(document).encode(), "plan.json")
    except PayloadError as exc:
        assert str(exc) == (
            f"plan.json: nodes[0].gpus[{j}].limiter[0].policy: tenant nlp: policy 'greedy' is not one of "
            "best-effort, fixed-share, burst-share"
        )
    else:
        raise AssertionError("a policy the limiter does not have was accepted")
