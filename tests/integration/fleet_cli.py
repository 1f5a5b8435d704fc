"""Helpers for tests that run `gpuops discover -f` as a user does against the tests' sshds: a
fleet.yaml per test, the command in a real process with its own HOME (so ~/.ssh/config is the
test's) and no ssh-agent unless the test gives one, and fake agents for the far side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.agent_helpers import REPO
from tests.sshtest.sshd import Sshd

CONTROL = "".join(chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)))


@dataclass(frozen=True)
class Discovered:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def nodes(self) -> dict[str, dict[str, Any]]:
        """--json's nodes by name."""
        return {n["name"]: n for n in json.loads(self.stdout)["nodes"]}


def fleet_yaml(
    path: Path,
    nodes: list[dict[str, Any]],
    ssh: Mapping[str, Any],
    agent: Mapping[str, Any] | None = None,
) -> Path:
    """Write a fleet.yaml: `nodes` (name, host, port, and optional ssh:/agent: overrides), the
    fleet's `ssh:` settings and `agent:` (default: push the zipapp, sim backend). JSON is YAML."""
    document = {
        "version": 1,
        "ssh": dict(ssh),
        "agent": dict(agent or {"mode": "push", "backend": "sim"}),
        "nodes": nodes,
    }
    path.write_text(json.dumps(document, indent=2))
    return path


def ssh_settings(server: Sshd, **changes: Any) -> dict[str, Any]:
    """fleet.yaml's ssh: for one test sshd, without ~/.ssh/config; `changes` override."""
    settings: dict[str, Any] = {
        "user": server.user,
        "identity_file": str(server.client_key),
        "known_hosts": str(server.known_hosts),
        "use_ssh_config": False,
        "connect_timeout": "5s",
    }
    settings.update(changes)
    return {k: v for k, v in settings.items() if v is not None}


def discover(
    fleet: Path, *args: str, home: Path, env: Mapping[str, str] | None = None, timeout: float = 90
) -> Discovered:
    """`gpuops discover -f FLEET --json ARGS` in a real process with HOME=`home` (its ~/.ssh) and
    no SSH_AUTH_SOCK unless `env` gives one."""
    base = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "-f", str(fleet), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**base, "HOME": str(home), "COLUMNS": "250", **(env or {})},
    )
    return Discovered(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def fake_agent(path: Path, body: str) -> Path:
    """An executable Python script to name as `agent.python`: the node runs it instead of
    python3, with the pushed zipapp and the agent's arguments as its arguments."""
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return path


def has_control(text: str) -> bool:
    return any(c in CONTROL for c in text)
