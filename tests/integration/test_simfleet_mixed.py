"""The `mixed` sim fleet (NVIDIA and AMD Instinct MI300X nodes) as a user meets it: `gpuops sim up
--scenario mixed` in a real process serving real SSH on 127.0.0.1, then the real `gpuops discover
-f` and `gpuops tenants -f` (child processes): the AMD nodes' partition modes reach --json over
SSH, and tenants counts the teams' AMD GPUs with their NVIDIA ones."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuops.simfleet import running_pid, stop
from tests.agent_helpers import REPO
from tests.integration.test_plan_apply import gpuops

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("mixed") / "fleet"
    up = subprocess.run(
        [sys.executable, "-m", "gpuops", "sim", "up", "--scenario", "mixed", "--dir", str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield directory
    finally:
        stop(directory)
        assert running_pid(directory) is None


def _gpus(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node["sample"]["gpus"])


def test_discover_shows_the_amd_nodes_partitions_over_ssh(mixed: Path) -> None:
    result = gpuops("discover", "-f", str(mixed / "fleet.yaml"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    carved = _gpus(nodes["sim-chat-02"])
    assert [g["info"]["name"] for g in carved] == ["AMD Instinct MI300X"] * 8
    assert [g["partition"]["compute_mode"] for g in carved] == ["CPX"] * 4 + ["DPX"] * 2 + ["SPX"] * 2
    first = carved[0]
    assert first["partition"] == {
        "compute_mode": "CPX",
        "memory_mode": "NPS4",
        "compute_modes": ["SPX", "DPX", "QPX", "CPX"],
        "memory_modes": ["NPS1", "NPS4"],
        "partitions": 8,
    }
    assert first["mig"] is None and first["info"]["multiprocessor_count"] == 304
    assert first["info"]["pci_bus_id"] == "0000:0c:00.0"
    # What amdsmi does not give as NVML does is n/a with a reason, not a made-up figure.
    assert first["info"]["power_limit_watts"] == {"na": "NOT_SUPPORTED"}
    assert nodes["sim-chat-02"]["inventory"]["cuda_driver_version"] == "6.2.0"
    # NVIDIA GPUs send no partition key at all (their messages are what they were).
    assert all("partition" not in g for g in _gpus(nodes["sim-chat-01"]))


def test_discover_local_table_of_a_simulated_amd_node() -> None:
    table = gpuops("discover", "--local", "--backend", "sim", "--sim-spec", "mi300x-node")
    assert table.returncode == 0, table.stdout + table.stderr
    assert "driver 6.8.5, ROCm 6.2.0" in table.stdout, table.stdout
    assert "partition CPX (8) / NPS4" in table.stdout and "partition SPX (1) / NPS1" in table.stdout


def test_tenants_counts_amd_gpus_with_nvidia_ones(mixed: Path) -> None:
    result = gpuops("tenants", "-f", str(mixed / "fleet.yaml"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["team"]: r for r in json.loads(result.stdout)["tenants"]}
    # vision: 8 A100 + 8 MI300X; chat: 8 H100 + 8 MI300X (partitioned ones count as whole GPUs);
    # research: an idle silo of 4 MI300X.
    assert rows["vision"]["owned"] == 16, rows["vision"]
    assert rows["chat"]["owned"] == 16, rows["chat"]
    assert rows["research"]["owned"] == 4 and rows["research"]["idle_owned"] > 3.5, rows["research"]
    # chat's own MI300X work and vision's work on chat's carved MI300X are used GPU time.
    assert rows["vision"]["used"] > 8, rows["vision"]
