"""`gpuops discover -f` tables on a narrow terminal (issue 18 items 7 and 8), against real sshd: a
long reason never squeezes the states, names and figures of the other columns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_helpers import REPO
from tests.integration.test_cli_fleet import _fleet_yaml
from tests.sshtest.sshd import Sshd, free_port

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


def _discover(fleet: Path, columns: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "-f", str(fleet), "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": str(columns)},
    )


@pytest.mark.parametrize("columns", [80, 100])
def test_a_long_reason_leaves_the_other_columns_whole(
    sshd_loopback: Sshd, tmp_path: Path, columns: int
) -> None:
    gone = free_port()
    result = _discover(_fleet_yaml(tmp_path, sshd_loopback, extra_node_port=gone), columns)
    assert result.returncode == 3, result.stderr  # gpu-gone is unreachable
    lines = result.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), result.stdout
    assert "…" not in result.stdout, result.stdout
    cells = [line.replace("│", " ").replace("┃", " ").split() for line in lines]
    rows = {name: next(c for c in cells if c[:1] == [name]) for name in ("gpu-a-01", "gpu-gone")}
    assert rows["gpu-a-01"][1] == "live" and rows["gpu-gone"][1] == "unreachable", result.stdout
    header = next(c for c in cells if c[:1] == ["Node"])
    assert header[:9] == ["Node", "State", "Age", "Owner", "GPUs", "Busy", "Util", "Memory", "Procs"], header
    # The reason is there in full (wrapped in its column or noted under the table), whatever the width.
    said = " ".join(" ".join(line.replace("│", " ").split()) for line in lines)
    assert f"[127.0.0.1]:{gone}: connection refused" in said, result.stdout


def test_one_shot_discover_names_no_refresh_interval(sshd_loopback: Sshd, tmp_path: Path) -> None:
    result = _discover(_fleet_yaml(tmp_path, sshd_loopback), 200)
    assert result.returncode == 0, result.stderr
    title = result.stdout.splitlines()[0]
    assert title.startswith("1 nodes: 1 live") or title.startswith("1 node: 1 live"), title
    assert "interval" not in result.stdout, title
