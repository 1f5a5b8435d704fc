"""The limiter's tenant label as the first attribution source on a node that runs for real: a
program under the real library (tenant from its environment) and one without it, both listed by
NVML (the fake libnvidia-ml.so.1) on the GPU; the node agent (a real process, NVML backend)
tags the first with its tenant, source "limiter", and leaves the second to the user and group
sources. The history recorder keeps the same label."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.core.codec import from_json
from gpuops.core.model import NodeSample
from gpuops.node.limiter_tags import LimiterTagger
from tests.fakes.nvml_fake import build_library, gpu, write_config
from tests.native.conftest import MIB, Lab, read_until, step
from tests.node.test_mps_agent import StdioAgent


@pytest.fixture(scope="module")
def fake_nvml() -> Path:
    return build_library()


def _nvml_env(fake_nvml: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(GPUOPS_NVML_LIBRARY=str(fake_nvml), FAKE_NVML_CONFIG=str(config))
    return env


def test_the_agent_tags_processes_under_the_limiter(lab: Lab, fake_nvml: Path, tmp_path: Path) -> None:
    lab.table("tenant vision memory=100MiB", "tenant speech")
    under = lab.start("init", "alloc", "30m", "ready", "wait", tenant="vision")
    read_until(under, "ready")
    bare = subprocess.Popen(["sleep", "600"])  # a GPU process without the limiter
    try:
        processes = [
            {"pid": under.pid, "used_memory": 30 * MIB},
            {"pid": bare.pid, "used_memory": 10 * MIB},
        ]
        config = write_config({"devices": [gpu("A100-SXM4-40GB", 0, processes=processes)]}, tmp_path / "c")
        agent = StdioAgent(
            ["--backend", "nvml", "--state-dir", str(tmp_path / "state"), "--limiter-dir", str(lab.dir)],
            env=_nvml_env(fake_nvml, config),
        )
        try:
            sample = from_json(NodeSample, agent.ok("sample"))
        finally:
            agent.close()
        procs = {p.pid: p for p in sample.gpus[0].processes}
        assert (procs[under.pid].tenant, procs[under.pid].tenant_source) == ("vision", "limiter")
        assert (procs[bare.pid].tenant, procs[bare.pid].tenant_source) == (None, "")
    finally:
        bare.kill()
        bare.wait()
        step(under)
        under.wait(timeout=30)


def test_the_recorder_keeps_the_limiters_tenant(lab: Lab, fake_nvml: Path, tmp_path: Path) -> None:
    lab.table("tenant vision")
    under = lab.start("init", "alloc", "20m", "ready", "wait", tenant="vision")
    read_until(under, "ready")
    try:
        processes = [{"pid": under.pid, "used_memory": 20 * MIB}]
        config = write_config({"devices": [gpu("A100-SXM4-40GB", 0, processes=processes)]}, tmp_path / "c")
        history = tmp_path / "history"
        recorder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuops.node",
                "agent",
                "--record",
                "--backend",
                "nvml",
                "--history-dir",
                str(history),
                "--record-interval",
                "0.2",
                "--limiter-dir",
                str(lab.dir),
            ],
            env=_nvml_env(fake_nvml, config),
        )
        try:
            # At least one sample folded in, then SIGTERM writes the files.
            deadline = 50
            while deadline and not (history / "minutes.json").exists():
                subprocess.run(["sleep", "0.2"], check=True)
                deadline -= 1
            recorder.terminate()
            assert recorder.wait(timeout=30) == 0
        finally:
            recorder.kill()
        minutes = json.loads((history / "minutes.json").read_text())
        keys = {
            (u.get("user"), u.get("tenant"))
            for b in minutes["buckets"]
            for g in b["gpus"]
            for u in g.get("users", [])
        }
        assert any(tenant == "vision" for _user, tenant in keys), keys
    finally:
        step(under)
        under.wait(timeout=30)


def test_the_tagger_reads_regions_only_when_it_has_to(lab: Lab) -> None:
    """One reading for a process it does not know, none for the next samples of the same ones,
    one more when a new process appears (at most once a second), one every refresh."""
    lab.table("tenant vision")
    under = lab.start("init", "alloc", "1m", "ready", "wait", tenant="vision")
    read_until(under, "ready")
    now = [1000.0]
    tagger = LimiterTagger(lab.dir, clock=lambda: now[0])
    try:
        from gpuops.core.model import Gpu, GpuInfo, GpuProcess

        info = GpuInfo(0, "GPU-x", "A100", "0", 0x20B010DE, 1, False)

        def sample(*pids: int) -> NodeSample:
            procs = tuple(GpuProcess(pid=p, used_memory_bytes=1) for p in pids)
            return NodeSample(hostname="n", timestamp=now[0], gpus=(Gpu(info=info, processes=procs),))

        tagged = tagger.tag(sample(under.pid, 1))
        assert [p.tenant for p in tagged.gpus[0].processes] == ["vision", None]
        assert tagger.readings == 1
        now[0] += 1.5
        tagger.tag(sample(under.pid, 1))
        assert tagger.readings == 1  # nothing new
        tagger.tag(sample(under.pid, 1, 2))
        assert tagger.readings == 2  # pid 2 is new, a second has passed
        now[0] += 0.2
        tagger.tag(sample(under.pid, 1, 3))
        assert tagger.readings == 2  # new, but within a second of the last reading
        now[0] += 11
        tagger.tag(sample(under.pid))
        assert tagger.readings == 3  # the refresh
        empty = sample()
        assert tagger.tag(empty) is empty
    finally:
        step(under)
        under.wait(timeout=30)
