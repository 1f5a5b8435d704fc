"""AMD partition modes through `carve: partition:`: `gpuops plan` and `gpuops apply` (real
processes) against a node reached over a real OpenSSH sshd, whose agent (the pushed zipapp) runs
the AMD backend plugin, installed by pip, over AMD's real `amdsmi` binding and the fake
libamd_smi.so (tests/fakes/fake_amdsmi). Partition modes outlive each agent, as the driver's do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import amdsmi_fake as fake
from tests.integration.fleet_cli import fleet_yaml, ssh_settings
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    SshdFactory,
    sshd_loopback_factory_fixture,
    sshtest_leak_check_fixture,
)

pytestmark = [pytest.mark.usefixtures("sshtest_leak_check"), pytest.mark.timeout(300)]

CARVE = [
    {
        "select": {"nodes": "amd-01", "gpus": {"model": "MI300X"}},
        "partition": {"compute": "CPX", "memory": "NPS4"},
    }
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake.install_plugin(tmp_path_factory.mktemp("amd-plugin"))


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a job on GPU 1 (the fake lists its pid; /proc tells its user)."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def node(
    tmp_path: Path, installed: Path, sshd_loopback_factory: SshdFactory, worker: subprocess.Popen[bytes]
) -> Path:
    """fleet.yaml of one AMD node: GPU 0 idle, GPU 1 running `worker`, GPU 2 idle but failing
    its compute partition change as a driver restart would."""
    gpus = [
        fake.gpu(0),
        fake.gpu(1, procs=[(worker.pid, 2 * fake.GiB, "trainer")]),
        fake.gpu(2, fail={"amdsmi_set_gpu_compute_partition": "AMDGPU_RESTART_ERR"}),
    ]
    env = fake.environment({"gpus": gpus}, tmp_path)
    state = tmp_path / "node-state"
    server = sshd_loopback_factory(
        set_env={
            "ROCM_PATH": env["ROCM_PATH"],
            "FAKE_AMDSMI_CONFIG": env["FAKE_AMDSMI_CONFIG"],
            "FAKE_AMDSMI_STATE": env["FAKE_AMDSMI_STATE"],
            "PYTHONPATH": str(installed),
            "GPUOPS_STATE_DIR": str(state),
        }
    )
    path = fleet_yaml(
        tmp_path / "fleet.yaml",
        [{"name": "amd-01", "host": server.host, "port": server.port}],
        ssh_settings(server),
        agent={"mode": "push", "python": sys.executable, "backend": "amd"},
    )
    document = json.loads(path.read_text())
    document["carve"] = CARVE
    path.write_text(json.dumps(document, indent=2))
    return path


def gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb"},
    )


def modes(carve: Path) -> list[Any]:
    found = gpuops("discover", "-f", str(carve), "--json")
    assert found.returncode == 0, found.stderr
    (node,) = json.loads(found.stdout)["nodes"]
    return [(g["partition"]["compute_mode"], g["partition"]["memory_mode"]) for g in node["sample"]["gpus"]]


def test_apply_changes_idle_gpus_refuses_busy_ones_and_rolls_back_failures(
    node: Path, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    plan = gpuops("plan", str(node))
    assert plan.returncode == 2, plan.stdout + plan.stderr
    out = plan.stdout
    assert "~ memory partition NPS1 -> NPS4  ! disruptive" in out
    assert "~ compute partition SPX -> CPX (8 logical GPUs)  ! disruptive" in out
    assert f"pid {worker.pid}" in out  # the job the change would stop, on GPU 1

    applied = gpuops("apply", str(node), "--yes")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    out = applied.stdout
    assert "GPU 0: partition modes CPX/NPS4 applied" in out
    assert f"GPU 1: partition in_use: GPU 1 is in use by pid {worker.pid}" in out
    assert "needs it idle; --force ends them" in out
    assert "GPU 2: partition rolled_back" in out and "AMDGPU_RESTART_ERR" in out
    assert "its old modes SPX/NPS1 are restored" in out
    assert worker.poll() is None  # not forced: the job runs on

    # Another agent, another process: the modes are the driver's, not the session's.
    assert modes(node) == [("CPX", "NPS4"), ("SPX", "NPS1"), ("SPX", "NPS1")]
    assert not list((tmp_path / "node-state").glob("partition-*.json"))  # no journal left

    again = gpuops("plan", str(node))
    assert "GPU 0" not in again.stdout.split("node amd-01", 1)[-1].split("GPU 1", 1)[0]


def test_a_bad_mode_for_the_model_is_one_located_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "version: 1\nnodes:\n  - {name: amd-01, host: 10.0.0.1, labels: {model: MI300A}}\n"
        "carve:\n  - select: {nodes: amd-01}\n    partition: {compute: QPX}\n"
    )
    checked = gpuops("validate", str(path))
    assert checked.returncode == 1
    assert checked.stderr.strip().splitlines() == [
        f"{path}:6:26: carve[0].partition.compute: MI300A has no compute partition mode QPX; "
        "MI300A takes compute SPX/TPX/CPX and memory NPS1"
    ]
    assert "Traceback" not in checked.stderr
