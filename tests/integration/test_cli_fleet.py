"""`gpuops discover -f` and `gpuops status -f --once` as a user runs them, against real sshd."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent_helpers import REPO
from tests.sshtest.sshd import Sshd, free_port

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


def _fleet_yaml(tmp_path: Path, server: Sshd, extra_node_port: int | None = None, pools: str = "") -> Path:
    text = f"""\
version: 1
ssh:
  user: {server.user}
  identity_file: {server.client_key}
  known_hosts: {server.known_hosts}
  use_ssh_config: false
  connect_timeout: 3s
agent: {{mode: push, backend: sim}}
teams:
  vision: {{users: [alice]}}
  research: {{users: [erin]}}
nodes:
  - name: gpu-a-01
    host: 127.0.0.1
    port: {server.port}
    owner: vision
    gpus: {{"4-7": research}}
"""
    if extra_node_port is not None:
        text += f"""\
  - name: gpu-gone
    host: 127.0.0.1
    port: {extra_node_port}
    owner: research
"""
    path = tmp_path / "fleet.yaml"
    path.write_text(text + pools)
    return path


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "220"},
    )


def test_discover_a_fleet_over_ssh(sshd_loopback: Sshd, tmp_path: Path) -> None:
    result = _gpuops("discover", "-f", str(_fleet_yaml(tmp_path, sshd_loopback)))
    assert result.returncode == 0, result.stderr
    assert "gpu-a-01" in result.stdout and "live" in result.stdout
    assert "Teams" in result.stdout and "vision" in result.stdout and "research" in result.stdout


def test_discover_json_and_a_dead_node(sshd_loopback: Sshd, tmp_path: Path) -> None:
    fleet = _fleet_yaml(tmp_path, sshd_loopback, extra_node_port=free_port())
    result = _gpuops("discover", "-f", str(fleet), "--json", "--timeout", "20")
    assert result.returncode == 3, result.stderr  # some nodes unreachable
    document = json.loads(result.stdout)
    nodes = {n["name"]: n for n in document["nodes"]}
    assert nodes["gpu-a-01"]["state"] == "live" and len(nodes["gpu-a-01"]["sample"]["gpus"]) == 8
    assert nodes["gpu-gone"]["state"] == "unreachable"
    assert "connection refused" in nodes["gpu-gone"]["reason"]
    teams = {t["team"]: t for t in document["teams"]}
    assert teams["vision"]["gpus_owned"] == 4 and teams["research"]["gpus_owned"] == 4
    assert teams["vision"]["gpus_busy"] + teams["vision"]["gpus_idle"] == 4
    assert teams["vision"]["gpus_pooled"] == 0


def test_discover_counts_pooled_gpus_apart(sshd_loopback: Sshd, tmp_path: Path) -> None:
    """Two of research's GPUs in a pool: still research's (owned), but shared, so neither its
    busy nor its idle silo capacity."""
    pools = "pools:\n  shared:\n    gpus: [{nodes: gpu-a-01, gpus: '6-7'}]\n"
    fleet = _fleet_yaml(tmp_path, sshd_loopback, pools=pools)
    result = _gpuops("discover", "-f", str(fleet), "--json")
    assert result.returncode == 0, result.stderr
    teams = {t["team"]: t for t in json.loads(result.stdout)["teams"]}
    research = teams["research"]
    assert research["gpus_owned"] == 4 and research["gpus_pooled"] == 2
    assert research["gpus_busy"] + research["gpus_idle"] + research["gpus_unknown"] == 2
    (tmp_path / "silos").mkdir()
    silos = _fleet_yaml(tmp_path / "silos", sshd_loopback)
    alone = {
        t["team"]: t for t in json.loads(_gpuops("discover", "-f", str(silos), "--json").stdout)["teams"]
    }
    # what its cards hold is counted all the same (memory, processes)
    assert research["memory_total_bytes"] == alone["research"]["memory_total_bytes"] > 0
    assert teams["vision"]["gpus_pooled"] == 0
    table = _gpuops("discover", "-f", str(fleet))
    assert "In pools" in table.stdout, table.stdout


def test_status_once(sshd_loopback: Sshd, tmp_path: Path) -> None:
    result = _gpuops("status", "-f", str(_fleet_yaml(tmp_path, sshd_loopback)), "--once")
    assert result.returncode == 0, result.stderr
    assert "1 nodes: 1 live" in result.stdout


def test_a_broken_fleet_file_gives_located_errors(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\nnodes:\n  - name: a\n    host: 10.0.0.1\n    port: 70000\n")
    result = _gpuops("discover", "-f", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{path}:5:" in result.stderr and "port" in result.stderr


def test_demo_shows_a_live_fleet_and_leaves_nothing_behind() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuops", "demo", "--plain", "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    # --plain in a pipe: status' lines as they happen (it printed nothing until it was stopped).
    lines = [line for _, line in _lines_as_they_come(demo, 4, 40)]
    demo.send_signal(signal.SIGINT)
    rest = demo.communicate(timeout=30)[0].decode(errors="replace")
    assert demo.returncode == 0, rest[-2000:]
    started, *refreshes = lines
    assert started.endswith("Ctrl-C stops it"), started
    assert all(" 8 nodes: " in line and "/48 GPUs busy" in line for line in refreshes), refreshes
    assert any(" 8 nodes: 8 live," in line for line in refreshes), refreshes
    (stopped,) = [line for line in rest.splitlines() if "stopped" in line]
    assert stopped.startswith("simulated fleet in ") and stopped.endswith(" stopped"), rest[-2000:]
    directory = started.split("(", 1)[1].split(")", 1)[0].rsplit("/", 1)[0]
    left = subprocess.run(["pgrep", "-f", f"simfleet serve --dir {directory}"], capture_output=True)
    assert left.returncode == 1, left.stdout


def _lines_as_they_come(
    process: subprocess.Popen[bytes], want: int, deadline_s: float
) -> list[tuple[float, str]]:
    """The first `want` lines of `process`'s stdout, each with the monotonic time it arrived."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    lines: list[tuple[float, str]] = []
    pending = b""
    deadline = time.monotonic() + deadline_s
    while len(lines) < want:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            process.kill()
            pytest.fail(f"{len(lines)} of {want} lines after {deadline_s:.0f}s: {lines}")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(b"\n")
        lines += [(time.monotonic(), line.decode()) for line in complete]
    assert not pending or len(lines) >= want, f"a line cut short: {pending[-200:]!r}"
    return lines


def _status(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops", "status", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "220"},
    )


def test_status_on_a_pipe_prints_a_line_per_refresh(sshd_loopback: Sshd, tmp_path: Path) -> None:
    """Not a terminal: no live table to redraw, so one line per refresh, each as it happens
    (it used to print nothing until Ctrl-C)."""
    fleet = _fleet_yaml(tmp_path, sshd_loopback, extra_node_port=free_port())
    process = _status("-f", str(fleet), "--interval", "1s")
    try:
        lines = _lines_as_they_come(process, 3, deadline_s=40)
        assert process.poll() is None  # still running: the lines came per refresh, not at the end
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    assert lines[2][0] - lines[0][0] > 1.0  # two intervals apart, give or take scheduling
    for _, line in lines:
        assert "2 nodes: 1 live, 0 stale, 1 unreachable" in line, line
        assert (
            "/8 GPUs busy" in line
            and "not live: gpu-gone unreachable (" in line
            and "connection refused" in line
        )


def test_status_json_lines_and_count(sshd_loopback: Sshd, tmp_path: Path) -> None:
    """--json: one document per refresh, one per line; --count ends it, exit 0."""
    process = _status(
        "-f", str(_fleet_yaml(tmp_path, sshd_loopback)), "--json", "--interval", "1s", "--count", "2"
    )
    lines = _lines_as_they_come(process, 2, deadline_s=40)
    out, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    assert out == b""  # --count 2: two documents, no more
    assert lines[1][0] - lines[0][0] > 0.5  # each arrived at its refresh, a second apart
    documents = [json.loads(line) for _, line in lines]
    assert documents[1]["time"] > documents[0]["time"]
    for document in documents:
        (node,) = document["nodes"]
        assert node["name"] == "gpu-a-01" and node["state"] == "live" and len(node["sample"]["gpus"]) == 8
        assert {t["team"] for t in document["teams"]} == {"vision", "research"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--count", "0"], "--count must be at least 1"),
        (["--once", "--count", "2"], "either --once or --count"),
    ],
)
def test_status_count_is_checked(tmp_path: Path, args: list[str], message: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\nnodes:\n  - name: a\n    host: 127.0.0.1\n")
    result = _gpuops("status", "-f", str(path), *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
