"""An exporter told to listen on every interface says so (security issue, item 9): `gpuops agent
--metrics 0.0.0.0:PORT` and `gpuops exporter --listen 0.0.0.0:PORT` serve plain HTTP without
authentication to every network the machine is on; one line on stderr names docs/prometheus.md's
safe ways. The processes as an operator starts them; nothing but loopback is contacted (the fleet
has no nodes, the node is simulated), and each runs for a few seconds at most."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import demo_spec

SERVING = "serving metrics on "
WARNING = "serves /metrics on every interface"


def _stderr_of(command: list[str]) -> str:
    """Run `command` until it serves (and a moment more, for what it says right after), then
    SIGTERM it; its stderr."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(line.decode("utf-8", "replace") for line in proc.stderr or ()),
        daemon=True,
    )
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any(SERVING in line for line in lines):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        time.sleep(0.5)
        proc.terminate()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    return "".join(lines)


def _node(tmp_path: Path, address: str) -> list[str]:
    spec = demo_spec(tmp_path)
    return [
        sys.executable,
        "-m",
        "gpuops",
        "agent",
        "--metrics",
        address,
        "--backend",
        "sim",
        "--sim-spec",
        str(spec),
        "--state-dir",
        str(tmp_path / "state"),
        "--limiter-dir",
        str(tmp_path / "limiter"),
    ]


def _fleet(tmp_path: Path, address: str) -> list[str]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("version: 1\nnodes: []\n")
    return [sys.executable, "-m", "gpuops", "exporter", "-f", str(fleet), "--listen", address]


@pytest.mark.parametrize("exporter", [_node, _fleet], ids=["node", "fleet"])
def test_every_interface_is_said_once(tmp_path: Path, exporter: object) -> None:
    assert callable(exporter)
    option = "--metrics" if exporter is _node else "--listen"
    err = _stderr_of(exporter(tmp_path, "0.0.0.0:0"))
    warnings = [line for line in err.splitlines() if WARNING in line]
    assert len(warnings) == 1, err
    (line,) = warnings
    assert line.startswith("warning: ") and f"{option} 0.0.0.0:" in line, line
    assert "without authentication" in line and "docs/prometheus.md" in line, line
    assert "127.0.0.1" in line and "SSH tunnel" in line, line  # the safe options, by name


@pytest.mark.parametrize("exporter", [_node, _fleet], ids=["node", "fleet"])
def test_loopback_says_nothing(tmp_path: Path, exporter: object) -> None:
    assert callable(exporter)
    err = _stderr_of(exporter(tmp_path, "127.0.0.1:0"))
    assert SERVING in err and WARNING not in err and "warning" not in err.lower(), err
