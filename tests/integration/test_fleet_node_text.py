"""Text a node sends (its agent's stderr, any string in its agent's messages) never reaches the
operator's terminal with control characters in it: they are escaped where the text enters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.fleet_cli import discover, fake_agent, fleet_yaml, has_control, ssh_settings
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    sshd_loopback_factory_fixture,
    sshd_loopback_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import Sshd

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")

# Clear the screen, set the window title, a C1 CSI (red), a bidi override that reverses the rest.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eboom"


def test_an_agents_stderr_is_escaped_in_discovers_table(sshd_loopback: Sshd, tmp_path: Path) -> None:
    # rich markup in it too: an unmatched closing tag once ended discover with a traceback
    liar = fake_agent(tmp_path / "liar", f"sys.stderr.write({HOSTILE!r} + ' [/oops]\\n'); sys.exit(1)")
    node = {"name": "n1", "host": sshd_loopback.host, "port": sshd_loopback.port}
    fleet = fleet_yaml(
        tmp_path / "fleet.yaml",
        [node],
        ssh_settings(sshd_loopback),
        agent={"mode": "push", "backend": "sim", "python": str(liar)},
    )
    table = discover(fleet, "--timeout", "20", home=tmp_path)
    assert table.returncode == 3, table.stderr
    assert "boom [/oops]" in table.stdout
    assert not has_control(table.stdout.replace("\n", "")), repr(table.stdout)
    assert "\\x1b[2J" in table.stdout and "\\x07" in table.stdout and "\\u202e" in table.stdout
    reason = discover(fleet, "--json", "--timeout", "20", home=tmp_path).nodes()["n1"]["reason"]
    assert "boom" in reason and not has_control(reason) and "\u202e" not in reason, repr(reason)


def test_strings_in_agent_messages_are_escaped(sshd_loopback: Sshd, tmp_path: Path) -> None:
    spec = tmp_path / "node.json"
    spec.write_text(
        json.dumps(
            {
                "version": 1,
                "gpus": [{"model": "A100-SXM4-40GB"}],
                "workloads": [
                    {
                        "name": "w",
                        "kind": "training",
                        "user": "alice",
                        "gpu": 0,
                        "command": f"train {HOSTILE}",
                    }
                ],
            }
        )
    )
    node = {"name": "n1", "host": sshd_loopback.host, "port": sshd_loopback.port}
    fleet = fleet_yaml(
        tmp_path / "fleet.yaml",
        [node],
        ssh_settings(sshd_loopback),
        agent={"mode": "push", "backend": "sim", "sim_spec": str(spec)},
    )
    result = discover(fleet, "--json", "--timeout", "30", home=tmp_path)
    assert result.returncode == 0, result.stderr
    sample = result.nodes()["n1"]["sample"]
    commands = [p["command"] for gpu in sample["gpus"] for p in gpu["processes"]]
    assert commands and all(c.startswith("train ") for c in commands), commands
    assert not any(has_control(c) or "\u202e" in c for c in commands), commands
    assert "\\x1b[2J" in commands[0] and "boom" in commands[0]
