"""ansible-playbook pointed at gpuops' simulated fleet (issue 28 item 5): each simulated node is
refused with one line that says what it is, not advice to fix a Python it cannot have, and nothing
is changed. A real `gpuops sim up`, its inventory from `gpuops inventory`, a real playbook run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ansible.helpers import PLAYBOOK, ROOT, ansible_env, ansible_tool


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_playbook_says_a_simulated_node_is_not_a_host(tmp_path: Path) -> None:
    where = tmp_path / "sim"
    up = _gpuops("sim", "up", "--dir", str(where), "--nodes", "2")
    assert up.returncode == 0, up.stderr
    try:
        inventory = _gpuops("inventory", "-f", str(where / "fleet.yaml"))
        assert inventory.returncode == 0, inventory.stderr
        (tmp_path / "hosts.yml").write_text(inventory.stdout)
        run = subprocess.run(
            [
                *(ansible_tool("ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(PLAYBOOK)),
                *("--limit", "gpuops_nodes", "--check"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env=ansible_env(tmp_path),
        )
    finally:
        assert _gpuops("sim", "down", "--dir", str(where)).returncode == 0
    out = run.stdout + run.stderr
    assert run.returncode != 0
    failures = [line for line in out.splitlines() if line.startswith("fatal: [")]
    assert len(failures) == 2, out  # each simulated node, once
    for node in ("sim-vision-01", "sim-speech-01"):
        assert f"simulated node, not a host: {node} is served by `gpuops sim up`" in out, out
    assert "no usable Python" not in out and "ansible_python_interpreter" not in out
