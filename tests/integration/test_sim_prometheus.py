"""`gpuops sim up --prometheus` and `gpuops demo --prometheus` through the CLI (issue 16): a real
Prometheus (Debian's package) on loopback scraping the simulated fleet with gpuops' rules, its URL
in `sim status --json`, stopped by `sim down`; a one-line error when the binary is missing."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.agent_helpers import REPO
from tests.promtest.prometheus import prometheus_unavailable_reason

pytestmark = pytest.mark.slow

needs_prometheus = pytest.mark.skipif(
    prometheus_unavailable_reason() is not None, reason=str(prometheus_unavailable_reason())
)


def _gpuops(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


def _api(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as response:
        return json.loads(response.read())["data"]


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True).returncode == 0


@needs_prometheus
def test_sim_up_prometheus_scrapes_the_fleet_and_sim_down_stops_it(tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "4", "--prometheus")
    assert up.returncode == 0, up.stderr
    try:
        status = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
        url = status["prometheus_url"]
        assert url.startswith("http://127.0.0.1:"), status
        assert f"prometheus: {url}" in up.stdout
        # Every node's exporter is a target, and is scraped.
        wanted = {n["metrics_url"] for n in status["nodes"]}
        deadline = time.monotonic() + 20
        while True:
            targets = _api(url, "/api/v1/targets?state=active")["activeTargets"]
            up_urls = {t["scrapeUrl"] for t in targets if t["health"] == "up"}
            if up_urls == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert up_urls == wanted, targets
        # gpuops' rules are loaded and evaluate without error.
        groups = _api(url, "/api/v1/rules")["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert "team:gpuops_gpus_busy:sum" in names
        assert all(r["health"] != "err" for g in groups for r in g["rules"]), groups
        listening = f"--config.file={directory}/prometheus/prometheus.yml"
        assert _running(listening)
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert not _running(listening), "prometheus outlived sim down"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    assert not (directory / "prometheus" / "data").exists()
    stopped = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
    assert stopped["prometheus_url"] is None


def test_sim_up_prometheus_without_the_binary_is_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "2", "--prometheus", env=env)
    assert up.returncode == 1, up.stdout + up.stderr
    assert up.stderr.strip().splitlines() == [
        "error: Prometheus is not installed (no `prometheus` on PATH): install Debian's package "
        "(apt-get install prometheus) or leave out --prometheus"
    ]
    # Nothing was started.
    status = _gpuops("sim", "status", "--dir", str(directory), "--json")
    assert status.returncode == 1 and json.loads(status.stdout)["state"] == "stopped"


@needs_prometheus
def _until_line(process: subprocess.Popen[bytes], text: str, deadline_s: float) -> str:
    """`process`' output until a line holding `text` has come (bounded), as read so far."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + deadline_s
    while text.encode() not in seen.rsplit(b"\n", 1)[0]:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1 << 20) if ready else b""
        if not chunk:
            process.kill()
            pytest.fail(f"no line with {text!r} after {deadline_s:.0f}s: {seen[-2000:]!r}")
        seen += chunk
    return seen.decode(errors="replace")


def test_demo_prometheus_watches_the_fleet_through_prometheus() -> None:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuops",
            "demo",
            "--plain",
            "--prometheus",
            "--nodes",
            "4",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    # --plain in a pipe: a status line per refresh. Stopped once a line shows every node live
    # through Prometheus (a fixed 10 s stopped a demo still starting on a loaded machine: exit 130).
    early = _until_line(demo, "4 nodes: 4 live", 90)
    demo.send_signal(signal.SIGINT)
    out = early + demo.communicate(timeout=30)[0].decode(errors="replace")
    assert demo.returncode == 0, out[-2000:]
    assert "read through Prometheus http://127.0.0.1:" in out, out[-2000:]
    assert "from prometheus http://127.0.0.1:" in out.split("Ctrl-C stops it", 1)[1], out[-2000:]
    assert "4 nodes: 4 live" in out, out[-2000:]
    directory = out.split("(", 1)[1].split(",", 1)[0].rsplit("/", 1)[0]
    assert not _running(f"simfleet serve --dir {directory}")
    assert not _running(f"--config.file={directory}/prometheus/prometheus.yml")
