"""The agent's NVML events and GPM figures through a real agent process on the fake
libnvidia-ml.so.1: the health thread waits on NVML's event set beside the backend thread, the
samples carry what it saw to clients that ask ("extras"), older clients get the samples they
always got, and the agent still stops promptly."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpuops.core.codec import from_json
from gpuops.core.model import NodeSample, XidCount
from tests.fakes.nvml_fake import GiB, gpu, write_config
from tests.node.test_mps_agent import StdioAgent

EXTRAS = {"extras": ["mig_utilization", "health"]}


def _config() -> dict[str, Any]:
    h100 = gpu(
        "H100-80GB",
        0,
        mig={
            "current": True,
            "pending": True,
            "gpu_instances": [
                {
                    "id": 2,
                    "profile_id": 9,
                    "start": 4,
                    "memory_used": 5 * GiB,
                    "sm_util": 70.0,
                    "compute_instances": [{"id": 0, "profile_id": 2, "start": 0}],
                }
            ],
        },
        events=[
            {"after_ms": 300, "type": "xid", "data": 79, "gpu_instance_id": 2, "compute_instance_id": 0},
            {"after_ms": 400, "type": "ecc_double_bit"},
            {"after_ms": 500, "type": "xid", "data": 79},
            {"after_ms": 600, "type": "pstate"},  # not listened to
        ],
    )
    a100 = gpu("A100-SXM4-40GB", 1, events=[{"after_ms": 350, "type": "xid", "data": 13}])
    return {"devices": [h100, a100]}


def _agent(tmp_path: Path, library: Path, config: dict[str, Any]) -> StdioAgent:
    conf = write_config(config, tmp_path / "nvml.conf")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(GPUOPS_NVML_LIBRARY=str(library), FAKE_NVML_CONFIG=str(conf))
    return StdioAgent(
        ["--backend", "nvml", "--state-dir", str(tmp_path / "state"), "--limiter-dir", str(tmp_path / "lim")],
        env=env,
    )


def _until(agent: StdioAgent, done: Any, timeout: float = 15.0) -> NodeSample:
    deadline = time.monotonic() + timeout
    while True:
        sample = from_json(NodeSample, agent.ok("sample", EXTRAS))
        if done(sample) or time.monotonic() > deadline:
            return sample
        time.sleep(0.1)


def test_nvml_events_reach_the_client_that_asks(tmp_path: Path, fake_nvml_library: Path) -> None:
    agent = _agent(tmp_path, fake_nvml_library, _config())
    try:
        assert "extras" in agent.ok("hello")["capabilities"]
        sample = _until(agent, lambda s: s.health is not None and len(s.health.events) >= 4)
        assert sample.health is not None and sample.health.error == ""
        seen = [
            (e.seq, e.gpu, e.kind, e.xid, e.gpu_instance_id, e.compute_instance_id)
            for e in sample.health.events
        ]
        assert seen == [
            (1, 0, "xid", 79, 2, 0),
            (2, 1, "xid", 13, None, None),
            (3, 0, "ecc_double_bit", None, None, None),
            (4, 0, "xid", 79, None, None),
        ]
        assert sample.health.events[0].uuid == sample.gpus[0].info.uuid
        counts = [(c.gpu, c.xid, c.count) for c in sample.health.xid_counts]
        assert counts == [(0, 79, 2), (1, 13, 1)]
        assert all(isinstance(c, XidCount) and c.last_timestamp > 0 for c in sample.health.xid_counts)
        # GPM: the MIG instance's SM utilization, from two samples.
        sample = _until(agent, lambda s: isinstance(s.gpus[0].mig_samples[0].sm_utilization_percent, float))
        assert sample.gpus[0].mig_samples[0].sm_utilization_percent == pytest.approx(70.0, abs=0.01)
    finally:
        started = time.monotonic()
        agent.close()  # exit 0 on EOF though the health thread is waiting in NVML
        assert time.monotonic() - started < 5.0


def test_older_clients_get_the_sample_they_always_got(tmp_path: Path, fake_nvml_library: Path) -> None:
    agent = _agent(tmp_path, fake_nvml_library, _config())
    try:
        # The events have come (waited for, not slept on: a loaded machine delays the health thread).
        _until(agent, lambda s: s.health is not None and len(s.health.events) >= 4)
        plain = agent.ok("sample")
        assert "health" not in plain
        assert all("sm_utilization_percent" not in m for g in plain["gpus"] for m in g["mig_samples"])
        only_health = agent.ok("sample", {"extras": ["health"]})
        assert len(only_health["health"]["events"]) == 4
        assert all("sm_utilization_percent" not in m for g in only_health["gpus"] for m in g["mig_samples"])
        refused = agent.error("sample", {"extras": ["gossip"]})
        assert refused["code"] == "invalid_args" and "gossip" in refused["message"]
        assert agent.error("watch", {"interval": 1, "extras": "health"})["code"] == "invalid_args"
    finally:
        agent.close()


def test_a_gpu_without_events_says_why(tmp_path: Path, fake_nvml_library: Path) -> None:
    config = {"devices": [gpu("T4", 0, events_supported=0)]}
    agent = _agent(tmp_path, fake_nvml_library, config)
    try:
        sample = from_json(NodeSample, agent.ok("sample", EXTRAS))
        assert sample.health is not None and sample.health.error == "NOT_SUPPORTED"
        assert sample.health.events == ()
    finally:
        agent.close()
