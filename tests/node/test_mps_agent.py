"""The agent's config, mps_apply and limiter_apply ops, through real agent processes.

`python -m gpuops.node agent --stdio` runs as on a node: with the simulated backend and the fake
`nvidia-cuda-mps-control` (tests/node/fake_nvidia_cuda_mps_control), with the simulated backend's
in-memory MPS (simulated workloads are the clients), and with the NVML backend on the fake
libnvidia-ml.so.1 plus the fake control binary, where the client a forced apply ends is a real
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.core import protocol as proto
from gpuops.core.codec import decode_args
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.node.agent import Agent
from gpuops.node.backends.sim import SimBackend
from gpuops.node.limiter import LimiterError, read_table
from gpuops.node.mps import PID_FILE, GiB
from gpuops.node.state import NodeState
from tests.agent_helpers import REPO
from tests.hypothesis_budget import examples
from tests.node.test_mps import FAKE, ME, MY_UID, _kill_daemon, _spec

WAIT = 60.0


class StdioAgent:
    """A real agent process, asked one request at a time."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuops.node", "agent", "--stdio", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        self._watchdog = threading.Timer(300, self.proc.kill)  # a hung agent fails the test
        self._watchdog.start()
        self._id = 0

    def send(self, line: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the agent closed its output: {self.proc.stderr.read()!r}"  # type: ignore[union-attr]
        return json.loads(answer)  # type: ignore[no-any-return]

    def ask(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        answer = self.send(proto.request(self._id, op, args))
        assert answer["id"] == self._id
        return answer

    def ok(self, op: str, args: dict[str, Any] | None = None) -> Any:
        answer = self.ask(op, args)
        assert answer["ok"] is True, answer
        return answer["result"]

    def error(self, op: str, args: dict[str, Any] | None = None) -> dict[str, str]:
        answer = self.ask(op, args)
        assert answer["ok"] is False, answer
        assert set(answer["error"]) == {"code", "message"}
        return answer["error"]  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            assert self.proc.wait(timeout=15) == 0
        finally:
            self._watchdog.cancel()
            self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """State, limiter and MPS directories of one node; daemons left there are ended after."""
    paths = {
        "state": tmp_path / "state",
        "limiter": tmp_path / "limiter",
        "pipe": tmp_path / "mps",
        "log": tmp_path / "mps-log",
        "spec": tmp_path / "spec.json",
    }
    yield paths
    if paths["pipe"].is_dir():
        for pipe in paths["pipe"].iterdir():
            _kill_daemon(pipe)


def _agent(node: dict[str, Path], spec: dict[str, Any], *extra: str) -> StdioAgent:
    node["spec"].write_text(json.dumps(spec))
    return StdioAgent(
        [
            "--backend",
            "sim",
            "--sim-spec",
            str(node["spec"]),
            "--state-dir",
            str(node["state"]),
            "--limiter-dir",
            str(node["limiter"]),
            *extra,
        ]
    )


def _device(node: dict[str, Path], uuid: str, gpu: int = 0, **kw: Any) -> dict[str, Any]:
    change = {
        "gpu": gpu,
        "device": uuid,
        "enabled": True,
        "pipe_directory": str(node["pipe"] / uuid),
        "log_directory": str(node["log"] / uuid),
    }
    change.update(kw)
    return change


def _managed(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in config["mps"] if m["managed"]]


# --------------------------------------------------------------------------- mps_apply


def test_mps_apply_and_config_through_the_agent(node: dict[str, Path]) -> None:
    agent = _agent(node, _spec(), "--mps-control", FAKE)
    try:
        hello = agent.ok("hello")
        assert {"config", "mps_apply", "limiter_apply"} <= set(hello["ops"])
        config = agent.ok("config")
        assert _managed(config) == []
        assert config["limiter"] == {"directory": str(node["limiter"]), "generation": 0, "tenants": []}

        inventory = agent.ok("inventory")
        gpu0 = inventory["gpus"][0]["info"]["uuid"]
        mig = inventory["gpus"][1]["mig"]["gpu_instances"][0]["compute_instances"][0]["uuid"]
        vision = {"name": "vision", "users": [ME], "active_thread_percentage": 30}
        changes = [
            _device(node, gpu0, active_thread_percentage=60, pinned_memory_limit=4 * GiB, tenants=[vision]),
            _device(node, mig, gpu=1, tenants=[{"name": "ghosts", "users": ["nosuchuser"]}]),
        ]
        result = agent.ok("mps_apply", {"changes": changes, "holder": "test"})
        first, second = result["results"]
        assert first["ok"] is True and first["changed"] is True and first["device"] == gpu0
        assert "started the MPS daemon" in first["actions"][0]
        # One device refused does not stop the others; the refusal says why.
        assert second == {
            "device": mig,
            "gpu": 1,
            "ok": False,
            "changed": False,
            "actions": [],
            "notes": [],
            "stopped": [],
            "code": "unknown_user",
            "message": "no such user on this node: nosuchuser (tenant ghosts)",
        }
        assert set(first) == set(second) and (first["code"], first["message"]) == ("", "")
        again = agent.ok("mps_apply", {"changes": changes[:1]})
        assert again["results"][0]["ok"] is True and again["results"][0]["changed"] is False

        (live,) = _managed(agent.ok("config"))
        daemon_pid = int((node["pipe"] / gpu0 / PID_FILE).read_text())
        assert live["device"] == gpu0 and live["gpu"] == 0
        assert live["running"] is True and live["pid"] == daemon_pid
        assert live["pipe_directory"] == str(node["pipe"] / gpu0)
        assert live["log_directory"] == str(node["log"] / gpu0)
        assert (live["active_thread_percentage"], live["pinned_memory_limit"]) == (60, 4 * GiB)
        assert live["tenants"] == {
            "vision": {"users": [ME], "active_thread_percentage": 30, "pinned_memory_limit": None}
        }
        (server,) = live["servers"]
        assert server["uid"] == MY_UID and server["user"] == ME and server["clients"] == []
        assert (server["active_thread_percentage"], server["pinned_memory_limit"]) == (30, 4 * GiB)

        # Bad arguments: one structured error each, and the agent keeps serving.
        for args, words in (
            ({"changes": [dict(changes[0], device="nope")]}, "changes[0].device"),
            ({"changes": [dict(changes[0], active_thread_percentage=0)]}, "active_thread_percentage"),
            ({"changes": [dict(changes[0], pipe_directory="relative/dir")]}, "pipe_directory"),
            ({"changes": [dict(changes[0], log_directory=None)]}, "log_directory"),
            ({"changes": [dict(changes[0], tenants=[{"name": "a", "users": ["x y"]}])]}, "users"),
            ({"changes": changes[:1] * 2}, "once"),
            ({"changes": changes[:1], "force": "yes"}, "force"),
            ({"changes": changes[:1], "colour": 1}, "unknown argument"),
            ({"changes": []}, "changes"),
        ):
            error = agent.error("mps_apply", args)
            assert error["code"] == proto.INVALID_ARGS and words in error["message"], error
        assert agent.error("config", {"x": 1})["code"] == proto.INVALID_ARGS

        # Another apply holds the node lock.
        held = NodeState(str(node["state"])).lock("apply by someone else")
        try:
            error = agent.error("mps_apply", {"changes": changes[:1]})
            assert error["code"] == proto.BUSY and "someone else" in error["message"]
        finally:
            NodeState.unlock(held)

        off = agent.ok("mps_apply", {"changes": [_device(node, gpu0, enabled=False, log_directory=None)]})
        assert off["results"][0]["changed"] is True
        assert _managed(agent.ok("config")) == []
        assert not (node["pipe"] / gpu0 / PID_FILE).exists()
    finally:
        agent.close()


def test_simulated_clients_are_refused_then_ended_by_force(node: dict[str, Path]) -> None:
    """The sim backend's in-memory MPS: a workload that starts while the daemon runs is a client."""
    start = 6.0
    spec = _spec([{"name": "serve", "kind": "training", "user": "alice", "gpu": 0, "start": start}])
    spec["epoch"] = time.time()
    agent = _agent(node, spec)
    try:
        gpu0 = agent.ok("inventory")["gpus"][0]["info"]["uuid"]
        vision = {"name": "vision", "users": ["alice"], "active_thread_percentage": 30}
        first = agent.ok("mps_apply", {"changes": [_device(node, gpu0, tenants=[vision])]})["results"][0]
        assert first["ok"] is True and first["changed"] is True
        assert time.time() < spec["epoch"] + start, "the machine is too slow for this test"
        deadline = time.monotonic() + WAIT
        while not agent.ok("sample")["gpus"][0]["processes"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        (proc,) = agent.ok("sample")["gpus"][0]["processes"]
        (live,) = _managed(agent.ok("config"))
        (server,) = live["servers"]
        assert server["user"] == "alice" and server["clients"] == [proc["pid"]]

        wanted = {"changes": [_device(node, gpu0, tenants=[dict(vision, active_thread_percentage=10)])]}
        refused = agent.ok("mps_apply", wanted)["results"][0]
        assert refused["ok"] is False and refused["code"] == "in_use"
        assert refused["clients"] == [{"pid": proc["pid"], "user": "alice", "server": server["pid"]}]
        assert f"pid {proc['pid']} (alice)" in refused["message"]

        forced = agent.ok("mps_apply", dict(wanted, force=True))["results"][0]
        assert forced["ok"] is True and forced["changed"] is True and forced["stopped"] == [proc["pid"]]
        assert agent.ok("sample")["gpus"][0]["processes"] == []
        (live,) = _managed(agent.ok("config"))
        (server,) = live["servers"]
        assert (server["user"], server["active_thread_percentage"], server["clients"]) == ("alice", 10, [])
    finally:
        agent.close()


def test_forced_apply_ends_a_real_client_on_the_nvml_backend(
    node: dict[str, Path], fake_nvml_library: Path, tmp_path: Path
) -> None:
    """The node as it runs for real: NVML (the fake library), the control binary (the fake), a
    real client process that the forced apply ends with SIGTERM."""
    from tests.fakes.nvml_fake import gpu, write_config

    config = write_config({"devices": [gpu("H100-80GB", 0)]}, tmp_path / "nvml.conf")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(GPUOPS_NVML_LIBRARY=str(fake_nvml_library), FAKE_NVML_CONFIG=str(config))
    agent = StdioAgent(
        [
            "--backend",
            "nvml",
            "--state-dir",
            str(node["state"]),
            "--limiter-dir",
            str(node["limiter"]),
            "--mps-control",
            FAKE,
        ],
        env=env,
    )
    client = subprocess.Popen(["sleep", "600"])
    reaper = threading.Thread(target=client.wait, daemon=True)
    reaper.start()
    try:
        assert agent.ok("hello")["backend"] == "nvml"
        uuid = agent.ok("inventory")["gpus"][0]["info"]["uuid"]
        tenant = {"name": "vision", "users": [ME], "pinned_memory_limit": 2 * GiB}
        change = _device(node, uuid, tenants=[tenant])
        assert agent.ok("mps_apply", {"changes": [change]})["results"][0]["changed"] is True
        pipe = change["pipe_directory"]
        subprocess.run(
            [FAKE, "--fake-client", str(client.pid)],
            env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe),
            check=True,
            timeout=30,
        )
        wanted = {"changes": [_device(node, uuid, tenants=[dict(tenant, pinned_memory_limit=GiB)])]}
        refused = agent.ok("mps_apply", wanted)["results"][0]
        assert refused["code"] == "in_use" and f"pid {client.pid} ({ME})" in refused["message"]
        assert client.poll() is None
        forced = agent.ok("mps_apply", dict(wanted, force=True))["results"][0]
        assert forced["ok"] is True and forced["stopped"] == [client.pid]
        reaper.join(10)
        assert client.returncode is not None
        (live,) = _managed(agent.ok("config"))
        (server,) = live["servers"]
        assert (server["user"], server["pinned_memory_limit"], server["clients"]) == (ME, GiB, [])
    finally:
        with contextlib.suppress(OSError):
            client.kill()
        agent.close()


# --------------------------------------------------------------------------- limiter_apply


def test_limiter_apply_generations_stale_and_unchanged(node: dict[str, Path]) -> None:
    agent = _agent(node, _spec())
    table = node["limiter"] / "tenants"
    tenants = [
        {
            "name": "vision",
            "memory": 8 * GiB,
            "compute": 30,
            "policy": None,
            "class": "online",
            "gpus": ["0"],
        },
        {
            "name": "nlp",
            "memory": None,
            "compute": 20.5,
            "policy": "burst-share",
            "class": "offline",
            "gpus": [],
        },
        {"name": "*", "memory": GiB, "compute": None, "policy": None, "class": "offline", "gpus": []},
    ]
    try:
        assert agent.ok("limiter_apply", {"tenants": tenants, "expect_generation": 0, "holder": "t"}) == {
            "generation": 1,
            "changed": True,
            "directory": str(node["limiter"]),
        }
        mode = table.stat()
        assert stat.S_IMODE(mode.st_mode) == 0o644 and mode.st_uid == os.geteuid()
        # The table and its last good copy (new processes fall back on it: docs/limiter.md), no temporary
        assert sorted(p.name for p in node["limiter"].iterdir()) == ["tenants", "tenants.last-good"]
        assert (node["limiter"] / "tenants.last-good").read_bytes() == table.read_bytes()
        generation, specs = read_table(node["limiter"])
        assert generation == 1 and [s.name for s in specs] == ["vision", "nlp", "*"]
        assert specs[0].policy == "fixed-share" and specs[2].policy == "best-effort"

        # The same table again: not rewritten.
        before = table.stat().st_mtime_ns
        same = agent.ok("limiter_apply", {"tenants": tenants, "expect_generation": 1})
        assert (same["generation"], same["changed"]) == (1, False)
        assert table.stat().st_mtime_ns == before

        # The plan saw another generation: refused, nothing written.
        error = agent.error("limiter_apply", {"tenants": tenants[:1], "expect_generation": 0})
        assert error["code"] == proto.STALE and "generation 1" in error["message"]
        assert read_table(node["limiter"])[0] == 1

        two = agent.ok("limiter_apply", {"tenants": tenants[:1]})
        assert (two["generation"], two["changed"]) == (2, True)

        config = agent.ok("config")["limiter"]
        assert config == {
            "directory": str(node["limiter"]),
            "generation": 2,
            "tenants": [
                {
                    "name": "vision",
                    "memory": 8 * GiB,
                    "compute": 30.0,
                    "policy": "fixed-share",
                    "class": "online",
                    "gpus": ["0"],
                }
            ],
        }

        for bad, words in (
            ([dict(tenants[0], compute=0)], "compute"),
            ([dict(tenants[0], compute=None, policy="fixed-share")], "needs a compute share"),
            ([tenants[0], tenants[0]], "twice"),
            ([dict(tenants[0], colour="red")], "unknown key"),
            ([dict(tenants[0], name="a b")], "name"),
            ([dict(tenants[0], gpus=["0,1"])], "gpus"),
        ):
            error = agent.error("limiter_apply", {"tenants": bad})
            assert error["code"] == proto.INVALID_ARGS and words in error["message"], error
        assert (
            agent.error("limiter_apply", {"tenants": [], "expect_generation": -1})["code"]
            == proto.INVALID_ARGS
        )
        # JSON's non-standard NaN and Infinity parse; they are not percentages or generations.
        for raw in (
            b'{"v":1,"id":"n","op":"limiter_apply","args":{"tenants":[{"name":"a","compute":NaN}]}}\n',
            b'{"v":1,"id":"n","op":"limiter_apply","args":{"tenants":[],"expect_generation":Infinity}}\n',
        ):
            answer = agent.send(raw)
            assert answer["id"] == "n" and answer["error"]["code"] == proto.INVALID_ARGS
        assert read_table(node["limiter"])[0] == 2

        # A table nobody can read: only an apply that does not check the generation replaces it.
        table.write_text("garbage\n")
        assert agent.error("limiter_apply", {"tenants": [], "expect_generation": 2})["code"] == proto.STALE
        assert "error" in agent.ok("config")["limiter"]
        fresh = agent.ok("limiter_apply", {"tenants": []})
        assert fresh["changed"] is True and fresh["generation"] > 2
        assert read_table(node["limiter"]) == (fresh["generation"], [])

        held = NodeState(str(node["state"])).lock("someone else")
        try:
            assert agent.error("limiter_apply", {"tenants": []})["code"] == proto.BUSY
        finally:
            NodeState.unlock(held)
    finally:
        agent.close()


def test_readers_never_see_a_partial_table(node: dict[str, Path]) -> None:
    agent = _agent(node, _spec())
    seen: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(read_table(node["limiter"])[0])
            except LimiterError as exc:
                errors.append(str(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(30):
            lines = [{"name": f"t{i}", "memory": (i + 1) * GiB, "gpus": []} for i in range(n % 7 + 1)]
            assert (
                agent.ok("limiter_apply", {"tenants": lines, "expect_generation": n})["generation"] == n + 1
            )
    finally:
        stop.set()
        reader.join()
        agent.close()
    assert errors == [] and seen == sorted(seen) and len(set(seen)) > 1
    assert read_table(node["limiter"])[0] == 30


# --------------------------------------------------------------------------- garbage


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_MPS_KEYS = st.sampled_from(
    [
        "gpu",
        "device",
        "enabled",
        "pipe_directory",
        "log_directory",
        "active_thread_percentage",
        "pinned_memory_limit",
        "tenants",
        "bogus",
    ]
)
_TENANT = st.dictionaries(
    st.sampled_from(
        [
            "name",
            "users",
            "active_thread_percentage",
            "pinned_memory_limit",
            "memory",
            "compute",
            "policy",
            "class",
            "gpus",
            "x",
        ]
    ),
    _JSON
    | st.sampled_from(["*", "vision", "GPU-1", "/run/x", "root", 50, 1 << 30])
    | st.lists(st.text(max_size=5)),
    max_size=6,
)
_CHANGE = st.dictionaries(
    _MPS_KEYS,
    _JSON
    | st.sampled_from(["GPU-1", "MIG-2", "/run/mps/a", "/", "..", 0, 1, True, 100])
    | st.lists(_TENANT, max_size=3),
    max_size=8,
)
_MPS_ARGS = st.fixed_dictionaries(
    {}, optional={"changes": st.lists(_CHANGE, max_size=3) | _JSON, "force": _JSON, "holder": _JSON}
) | st.dictionaries(st.text(max_size=8), _JSON, max_size=3)
_LIMITER_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "tenants": st.lists(_TENANT, max_size=3) | _JSON,
        "expect_generation": _JSON,
        "holder": _JSON,
    },
) | st.dictionaries(st.text(max_size=8), _JSON, max_size=3)


@settings(max_examples=examples(400), deadline=None)
@given(_MPS_ARGS, _LIMITER_ARGS)
def test_argument_validation_raises_only_value_errors(mps: dict[str, Any], limiter: dict[str, Any]) -> None:
    with contextlib.suppress(ValueError):
        decode_args(proto.MpsApplyRequest, "mps_apply", mps)
    with contextlib.suppress(ValueError):
        decode_args(proto.LimiterApplyRequest, "limiter_apply", limiter)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["mps_apply", "limiter_apply"]), _MPS_ARGS | _LIMITER_ARGS), max_size=4
    )
)
def test_garbage_apply_arguments_get_invalid_args_never_a_crash(
    requests: list[tuple[str, dict[str, Any]]],
) -> None:
    async def run(directory: str) -> None:
        backend = SimBackend(_spec())
        left, right = socket.socketpair()
        agent = Agent(
            backend,
            "sim",
            hostname="n1",
            inline=True,
            state_dir=directory + "/state",
            limiter_dir=directory + "/limiter",
        )
        a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
        serving = asyncio.create_task(agent.serve(a_reader, a_writer))
        reader, writer = await asyncio.open_unix_connection(sock=right)
        client = AgentClient(reader, writer, "n1")
        await client.start()
        try:
            for op, args in requests:
                try:
                    result = await client.request(op, args)
                except AgentError as exc:
                    assert exc.code in (proto.INVALID_ARGS, proto.STALE), (op, args, exc)
                else:
                    assert isinstance(result, dict) and ("results" in result or "generation" in result)
            assert (await client.config())["limiter"]["directory"] == directory + "/limiter"
        finally:
            await client.close()
            await asyncio.wait_for(serving, 10)
            a_writer.close()

    with tempfile.TemporaryDirectory(prefix="gpuops-mps-fuzz-") as directory:
        asyncio.run(run(directory))


def test_agent_client_methods(node: dict[str, Path]) -> None:
    """AgentClient.config / mps_apply / limiter_apply decode replies and raise AgentError."""
    backend = SimBackend(_spec())
    uuid = backend.inventory().gpus[0].info.uuid

    async def run() -> None:
        left, right = socket.socketpair()
        agent = Agent(
            backend,
            "sim",
            hostname="n1",
            inline=True,
            state_dir=str(node["state"]),
            limiter_dir=str(node["limiter"]),
        )
        a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
        serving = asyncio.create_task(agent.serve(a_reader, a_writer))
        reader, writer = await asyncio.open_unix_connection(sock=right)
        client = AgentClient(reader, writer, "n1")
        await client.start()
        try:
            done = await client.mps_apply([_device(node, uuid, active_thread_percentage=25)], holder="t")
            assert done.results[0].ok is True
            config = await client.config()
            (live,) = _managed(config)
            assert live["active_thread_percentage"] == 25 and live["running"] is True
            assert (
                await client.limiter_apply([{"name": "a", "memory": GiB}], expect_generation=0)
            ).generation == 1
            with pytest.raises(AgentError) as info:
                await client.limiter_apply([], expect_generation=0)
            assert info.value.code == proto.STALE
            with pytest.raises(AgentError) as info:
                await client.mps_apply([])
            assert info.value.code == proto.INVALID_ARGS
        finally:
            await client.close()
            await asyncio.wait_for(serving, 10)
            a_writer.close()

    asyncio.run(run())
