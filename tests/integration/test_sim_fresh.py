"""`gpuops sim up --fresh` (issue 28 item 6): the nodes' state (what applies changed, what they
recorded) is kept in --dir from one run to the next, and --fresh starts from the scenario again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.agent_helpers import REPO


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", "sim", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def test_sim_up_keeps_the_nodes_state_and_fresh_forgets_it(tmp_path: Path) -> None:
    where = tmp_path / "sim"
    first = _sim("up", "--dir", str(where), "--nodes", "2")
    assert first.returncode == 0, first.stderr
    try:
        node_state = sorted(p for p in (where / "state").iterdir() if p.is_dir())[0]
        assert (node_state / "history").is_dir()  # what the node records lives here
        marker = node_state / "left-by-an-earlier-run"
        marker.write_text("x")
    finally:
        assert _sim("down", "--dir", str(where)).returncode == 0
    again = _sim("up", "--dir", str(where), "--nodes", "2")
    assert again.returncode == 0, again.stderr
    try:
        assert marker.exists()  # kept: the same fleet again
    finally:
        assert _sim("down", "--dir", str(where)).returncode == 0
    fresh = _sim("up", "--dir", str(where), "--nodes", "2", "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    try:
        assert not marker.exists() and (node_state / "history").is_dir()  # the scenario again
    finally:
        assert _sim("down", "--dir", str(where)).returncode == 0
