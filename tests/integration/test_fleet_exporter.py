"""The fleet exporter as an operator runs it: `gpuops exporter -f fleet.yaml` as a process, its
nodes behind a real sshd on loopback (the agent pushed as a zipapp, a simulated node), scraped
over HTTP and compared with `gpuops discover --json` taken at the same moment."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpuops.node.backends.sim import SimBackend
from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import Series, one, parse, promtool_problems, scrape
from tests.sshtest.sshd import Sshd, free_port

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")

URL_LINE = re.compile(r"serving metrics on (http://\S+/metrics)")
GIB = 1 << 30
# The node's steady workloads (constant figures, so two agents sampling at two moments agree):
# GPU 0 shared by alice (vision) and erin (research), GPU 1 erin's, GPU 2 in MIG mode with alice
# on its 3g slice and zed (in no team: the GPU's owner's) on its 2g slice, GPU 3 idle.
NODE_SPEC = {
    "version": 1,
    "hostname": "gpu-steady",
    "seed": 7,
    "driver_version": "550.54.15",
    "users": {"alice": 1001, "erin": 1005, "zed": 1009},
    "gpus": [
        {"model": "A100-SXM4-80GB", "count": 2},
        {"model": "A100-SXM4-80GB", "mig": {"enabled": True, "layout": ["3g.40gb", "2g.20gb", "1g.10gb"]}},
        {"model": "A100-SXM4-80GB"},
    ],
    "workloads": [
        {"kind": "steady", "user": "alice", "gpu": 0, "memory": "30GiB", "params": {"util": 60}},
        {"kind": "steady", "user": "erin", "gpu": 0, "memory": "10GiB", "params": {"util": 60}},
        {"kind": "steady", "user": "erin", "gpu": 1, "memory": "20GiB", "params": {"util": 40}},
        {"kind": "steady", "user": "alice", "gpu": 2, "instance": 0, "memory": "12GiB"},
        {"kind": "steady", "user": "zed", "gpu": 2, "instance": 1, "memory": "5GiB"},
    ],
}
TEAM_OF_USER = {"alice": "vision", "erin": "research"}
OWNERS = {0: "vision", 1: "research", 2: "research", 3: "vision"}


def _fleet(tmp_path: Path, server: Sshd | _NoServer, gone_port: int) -> tuple[Path, Path]:
    spec = tmp_path / "node.json"
    spec.write_text(json.dumps({**NODE_SPEC, "epoch": float(int(time.time()) - 3600)}))
    text = f"""\
version: 1
ssh:
  user: {server.user}
  identity_file: {server.client_key}
  known_hosts: {server.known_hosts}
  use_ssh_config: false
  connect_timeout: 3s
agent: {{mode: push, backend: sim, sim_spec: {spec}}}
teams:
  vision: {{users: [alice]}}
  research: {{users: [erin]}}
nodes:
  - name: gpu-a
    host: 127.0.0.1
    port: {server.port}
    owner: vision
    gpus: {{"1-2": research}}
  - name: gpu-gone
    host: 127.0.0.1
    port: {gone_port}
    owner: research
pools:
  shared:
    gpus: [{{nodes: gpu-a, gpus: "3"}}]
    guarantees: {{vision: 50%, research: 25%}}
"""
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path, spec


def _gpuops(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "220"},
    )


@contextmanager
def fleet_exporter(fleet: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`gpuops exporter -f FLEET --listen 127.0.0.1:0 ARGS` as a process; yields (url, process)
    once it serves; SIGTERM at the end, which must exit 0."""
    command = [sys.executable, "-m", "gpuops", "exporter", "-f", str(fleet), "--listen", "127.0.0.1:0", *args]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO, text=True)
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        match = URL_LINE.search(line)
        assert match, f"the exporter did not start: {line!r} {proc.stderr.read() if proc.poll() else ''}"
        yield match.group(1), proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _settled(url: str, deadline_s: float = 60) -> Series:
    """Scrapes until every node has left `connecting` and gpu-a streams."""
    deadline = time.monotonic() + deadline_s
    while True:
        series = parse(scrape(url))
        states = {lbl["node"]: lbl["state"] for lbl, _ in series.get("gpuops_node_up", [])}
        if states.get("gpu-a") == "live" and states.get("gpu-gone") == "unreachable":
            return series
        assert time.monotonic() < deadline, states
        time.sleep(0.5)


def _node_up(series: Series) -> dict[str, tuple[dict[str, str], float]]:
    return {lbl["node"]: (lbl, v) for lbl, v in series["gpuops_node_up"]}


def _slices(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


def _tenants_from(node: dict[str, Any]) -> tuple[dict[str, float], dict[str, int]]:
    """Per team from discover --json's sample, worked out here from the definitions (docs/tui.md):
    GPU time split by the memory each team's processes hold; a MIG slice counts its compute
    slices over the GPU's 7 while it holds a process; a process of no team is its GPU's owner's."""
    used: dict[str, float] = {}
    memory: dict[str, int] = {}
    for gpu in node["sample"]["gpus"]:
        owner = OWNERS[gpu["info"]["index"]]
        groups: dict[int | None, list[tuple[str, int]]] = {}
        for p in gpu["processes"]:
            team = TEAM_OF_USER.get(p["user"], owner)
            memory[team] = memory.get(team, 0) + p["used_memory_bytes"]
            groups.setdefault(p["gpu_instance_id"], []).append((team, p["used_memory_bytes"]))
        profiles = {gi["id"]: gi["profile_name"] for gi in (gpu["mig"] or {}).get("gpu_instances", [])}
        for instance, held in groups.items():
            if instance is None:
                weight = gpu["sample"]["utilization_gpu_percent"] / 100.0
            else:
                weight = _slices(profiles[instance]) / 7
            total = sum(m for _, m in held)
            for team, m in held:
                used[team] = used.get(team, 0.0) + weight * m / total
    return used, memory


def test_a_scrape_agrees_with_discover(sshd_loopback: Sshd, tmp_path: Path) -> None:
    fleet, spec = _fleet(tmp_path, sshd_loopback, free_port())
    with fleet_exporter(fleet, "--interval", "0.5s") as (url, _proc):
        _settled(url)
        discovered = _gpuops("discover", "-f", str(fleet), "--json", "--timeout", "20")
        text = scrape(url)
    assert discovered.returncode == 3, discovered.stderr  # gpu-gone is unreachable
    document = json.loads(discovered.stdout)
    nodes = {n["name"]: n for n in document["nodes"]}
    series = parse(text)

    # Reachability, with discover's reason for the node it cannot reach.
    up = _node_up(series)
    assert up["gpu-a"] == ({"node": "gpu-a", "Hostname": "gpu-steady", "state": "live", "reason": ""}, 1.0)
    gone, value = up["gpu-gone"]
    assert value == 0.0 and gone["state"] == "unreachable" == nodes["gpu-gone"]["state"]
    assert gone["reason"] == nodes["gpu-gone"]["reason"] and "connection refused" in gone["reason"]
    assert not [
        lbl
        for name, values in series.items()
        for lbl, _ in values
        if lbl.get("node") == "gpu-gone" and name != "gpuops_node_up"
    ]  # no figures for a node without current data

    # Every GPU as discover saw it, with fleet.yaml's team and pool.
    node = nodes["gpu-a"]
    (taken,) = [v for lbl, v in series["gpuops_node_sample_timestamp_seconds"] if lbl["node"] == "gpu-a"]
    at_scrape = SimBackend(spec=str(spec), clock=lambda: taken).sample()
    assert len(series["gpuops_gpu_info"]) == len(node["sample"]["gpus"]) == 4
    for gpu, expected in zip(node["sample"]["gpus"], at_scrape.gpus, strict=True):
        info, s = gpu["info"], gpu["sample"]
        index = info["index"]
        labels = {
            "gpu": str(index),
            "UUID": info["uuid"],
            "device": f"nvidia{index}",
            "modelName": info["name"],
            "pci_bus_id": info["pci_bus_id"],
            "Hostname": node["sample"]["hostname"],
            "node": "gpu-a",
            "team": OWNERS[index],
            "pool": "shared" if index == 3 else "",
        }
        mig = "enabled" if gpu["mig"]["current"] else "disabled"
        info_labels = {**labels, "driver_version": node["inventory"]["driver_version"], "mig_mode": mig}
        assert [lbl for lbl, _ in series["gpuops_gpu_info"] if lbl["gpu"] == str(index)] == [info_labels]
        assert one(series, "gpuops_gpu_memory_used_bytes", **labels) == s["memory_used_bytes"]
        assert one(series, "gpuops_gpu_memory_total_bytes", **labels) == s["memory_total_bytes"]
        util = s["utilization_gpu_percent"]
        if isinstance(util, dict):  # {"na": "NOT_SUPPORTED"} with MIG on: no series, never a 0
            assert one(series, "gpuops_gpu_utilization_ratio", **labels) is None
        else:
            assert one(series, "gpuops_gpu_utilization_ratio", **labels) == pytest.approx(util / 100)
        # Power and temperature move a little between two moments: the exporter's are its
        # sample's, the node's state at that sample's time.
        assert expected.sample is not None
        assert one(series, "gpuops_gpu_power_watts", **labels) == expected.sample.power_watts
        assert one(series, "gpuops_gpu_temperature_celsius", **labels) == expected.sample.temperature_celsius
        profiles = {gi["id"]: gi["profile_name"] for gi in (gpu["mig"] or {}).get("gpu_instances", [])}
        for m in gpu["mig_samples"]:
            got = one(
                series,
                "gpuops_mig_instance_memory_used_bytes",
                GPU_I_ID=str(m["gpu_instance_id"]),
                GPU_I_PROFILE=profiles[m["gpu_instance_id"]],
                **{k: v for k, v in labels.items() if k != "pci_bus_id"},
            )
            assert got == m["memory_used_bytes"]
        for gi in gpu["mig"]["gpu_instances"] if gpu["mig"] and gpu["mig"]["current"] else ():
            got = one(
                series,
                "gpuops_mig_instance_processes",
                GPU_I_ID=str(gi["id"]),
                GPU_I_PROFILE=gi["profile_name"],
                **{k: v for k, v in labels.items() if k != "pci_bus_id"},
            )
            assert got == sum(1 for p in gpu["processes"] if p["gpu_instance_id"] == gi["id"]), gi
    assert len(series["gpuops_mig_instance_memory_used_bytes"]) == 3
    assert len(series["gpuops_mig_instance_processes"]) == 3

    # Tenants: what each team uses on the node, worked out from discover's processes.
    used, memory = _tenants_from(node)
    assert (
        used["vision"] == pytest.approx(0.75 + 3 / 7) and memory["research"] == 35 * GIB
    )  # the oracle's sense
    got_used = {lbl["tenant"]: v for lbl, v in series["gpuops_tenant_gpu_used"] if lbl["node"] == "gpu-a"}
    got_memory = {lbl["tenant"]: v for lbl, v in series["gpuops_tenant_memory_used_bytes"]}
    assert got_used == pytest.approx(used) and got_memory == memory
    # Ownership and pools: discover's per-team table, fleet.yaml's guarantees.
    teams = {t["team"]: t for t in document["teams"]}
    owned = {lbl["tenant"]: v for lbl, v in series["gpuops_tenant_owned_gpus"]}
    assert owned == {t: row["gpus_owned"] for t, row in teams.items()} == {"vision": 2, "research": 2}
    assert series["gpuops_pool_gpus"] == [({"pool": "shared"}, 1.0)]
    guaranteed = {(lbl["tenant"], lbl["pool"]): v for lbl, v in series["gpuops_tenant_guaranteed_gpus"]}
    assert guaranteed == {
        ("vision", ""): teams["vision"]["gpus_owned"] - teams["vision"]["gpus_pooled"],
        ("research", ""): 2,
        ("vision", "shared"): 0.5,
        ("research", "shared"): 0.25,
    }
    problems = promtool_problems(text)
    assert not problems, problems


def test_a_node_that_goes_away_loses_its_figures(sshd_loopback: Sshd, tmp_path: Path) -> None:
    """sshd killed: the node turns unreachable with the reason, and its GPU and tenant series go."""
    fleet, _spec = _fleet(tmp_path, sshd_loopback, free_port())
    with fleet_exporter(fleet, "--interval", "0.5s") as (url, _proc):
        before = _settled(url)
        assert one(before, "gpuops_gpu_info", node="gpu-a", gpu="0") == 1.0
        sshd_loopback.kill()
        deadline = time.monotonic() + 30
        while True:
            series = parse(scrape(url))
            labels, value = _node_up(series)["gpu-a"]
            if labels["state"] == "unreachable":
                break
            assert time.monotonic() < deadline, labels
            time.sleep(0.5)
    assert value == 0.0 and labels["reason"]
    assert "gpuops_gpu_info" not in series and "gpuops_tenant_gpu_used" not in series
    assert {lbl["tenant"]: v for lbl, v in series["gpuops_tenant_owned_gpus"]} == {"vision": 2, "research": 2}


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_used_port_is_one_line(tmp_path: Path) -> None:
    fleet, _ = _fleet(tmp_path, _NoServer(), free_port())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_line_error(
            _gpuops("exporter", "-f", str(fleet), "--listen", f"127.0.0.1:{port}", timeout=30)
        )
    assert f"--listen 127.0.0.1:{port}: cannot listen: Address already in use" in line


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("300.1.1.1:9836", "'300.1.1.1' is not an IP address"),
        ("gpu-box:9836", "'gpu-box' is not an IP address"),
        ("127.0.0.1:99999", "the port must be a number"),
        (":9836", "say which address to bind"),
        ("192.0.2.1:0", "cannot listen: Cannot assign requested address"),
    ],
)
def test_a_bad_address_is_one_line(tmp_path: Path, listen: str, says: str) -> None:
    fleet, _ = _fleet(tmp_path, _NoServer(), free_port())
    line = _one_line_error(_gpuops("exporter", "-f", str(fleet), "--listen", listen, timeout=30))
    assert line.startswith("error: --listen") and says in line, line


def test_a_bad_fleet_file_is_located(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\nnodes:\n  - name: a\n    host: 10.0.0.1\n    port: 70000\n")
    result = _gpuops("exporter", "-f", str(path), timeout=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{path}:5:" in result.stderr and "port" in result.stderr


def test_it_binds_loopback_unless_told(tmp_path: Path) -> None:
    """A port alone binds 127.0.0.1, as the default address does."""
    fleet, _ = _fleet(tmp_path, _NoServer(), free_port())
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuops", "exporter", "-f", str(fleet), "--listen", "0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
        text=True,
    )
    assert proc.stderr is not None
    try:
        match = URL_LINE.search(proc.stderr.readline())
        assert match and match.group(1).startswith("http://127.0.0.1:"), match
        up = _node_up(parse(scrape(match.group(1))))
        assert set(up) == {"gpu-a", "gpu-gone"} and all(v == 0.0 for _, v in up.values())
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        proc.stderr.close()


class _NoServer:
    """Stands in for an Sshd where no node needs to answer."""

    user = "nobody"
    client_key = "/nonexistent/id_ed25519"
    known_hosts = "/nonexistent/known_hosts"

    @property
    def port(self) -> int:
        return free_port()


def test_dcgm_names_with_dcgm_compat_only(sshd_loopback: Sshd, tmp_path: Path) -> None:
    """--dcgm-compat adds dcgm-exporter's names, units and labels for every current node (per GPU
    instance on a MIG GPU); without it there are none."""
    fleet, _spec = _fleet(tmp_path, sshd_loopback, free_port())
    with fleet_exporter(fleet, "--interval", "0.5s", "--dcgm-compat") as (url, _proc):
        series = _settled(url)
        text = scrape(url)
    host = {"Hostname": "gpu-steady"}
    used = one(series, "gpuops_gpu_memory_used_bytes", node="gpu-a", gpu="1")
    assert used is not None and one(series, "DCGM_FI_DEV_FB_USED", gpu="1", **host) == used // (1 << 20)
    util = one(series, "gpuops_gpu_utilization_ratio", node="gpu-a", gpu="1")
    assert util is not None and one(series, "DCGM_FI_DEV_GPU_UTIL", gpu="1", **host) == round(util * 100)
    mig = {lbl["GPU_I_PROFILE"] for lbl, _ in series["DCGM_FI_DEV_FB_USED"] if lbl["gpu"] == "2"}
    assert mig == {"3g.40gb", "2g.20gb", "1g.10gb"}
    assert one(series, "DCGM_FI_DEV_GPU_UTIL", gpu="2", GPU_I_PROFILE="3g.40gb") is None  # Ampere: no GPM
    assert one(series, "DCGM_FI_DEV_POWER_USAGE", gpu="0", **host) == one(
        series, "gpuops_gpu_power_watts", node="gpu-a", gpu="0"
    )
    # The simulated node has no NVML events: no XID gauge said as if none happened.
    assert "DCGM_FI_DEV_XID_ERRORS" not in series
    problems = promtool_problems(text)
    assert not problems, problems
    with fleet_exporter(fleet, "--interval", "0.5s") as (url, _proc):
        plain = _settled(url)
    assert not [name for name in plain if name.startswith("DCGM_")]
