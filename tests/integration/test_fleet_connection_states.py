"""Every state a discover ends in says why, with true times: a port that accepts and never
answers, a discover that ends before a node's handshake or agent does, an agent that stays
silent, and an agent that sends one endless line (the client holds at most 16 MiB of a line)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
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


@pytest.fixture(name="mute_port")
def mute_port_fixture() -> Iterator[int]:
    """A port on loopback whose connections the kernel accepts and nobody ever answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def _node(port: int) -> dict[str, object]:
    return {"name": "n1", "host": "127.0.0.1", "port": port}


def test_a_mute_port_is_reported_with_the_time_it_was_given(
    sshd_loopback: Sshd, mute_port: int, tmp_path: Path
) -> None:
    settings = ssh_settings(sshd_loopback, connect_timeout="2s")
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [_node(mute_port)], settings)
    result = discover(fleet, "--json", "--timeout", "20", home=tmp_path)
    view = result.nodes()["n1"]
    assert view["state"] == "unreachable", view
    said = re.search(r"no answer within (\d+(?:\.\d+)?)s", view["reason"])
    assert said is not None, view["reason"]
    # the time it says is the time it waited: connect_timeout, not connect_timeout + login_timeout
    assert 2 <= float(said.group(1)) < 4 and result.seconds < 15, (view["reason"], result.seconds)
    assert "SSH" in view["reason"], view["reason"]


def test_a_node_still_connecting_when_discover_ends_says_where_it_is(
    sshd_loopback: Sshd, mute_port: int, tmp_path: Path
) -> None:
    settings = ssh_settings(sshd_loopback, connect_timeout="30s")
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [_node(mute_port)], settings)
    result = discover(fleet, "--json", "--timeout", "3", home=tmp_path)
    assert result.returncode == 3 and result.seconds < 15
    view = result.nodes()["n1"]
    assert view["state"] == "connecting", view
    assert "3s" in view["reason"] and "SSH" in view["reason"], view["reason"]


def test_a_silent_agent_is_named_when_discover_ends(sshd_loopback: Sshd, tmp_path: Path) -> None:
    mute = fake_agent(tmp_path / "mute", "time.sleep(60)")
    node = _node(sshd_loopback.port)
    fleet = fleet_yaml(
        tmp_path / "fleet.yaml",
        [node],
        ssh_settings(sshd_loopback),
        agent={"mode": "push", "backend": "sim", "python": str(mute)},
    )
    result = discover(fleet, "--json", "--timeout", "5", home=tmp_path)
    assert result.returncode == 3
    view = result.nodes()["n1"]
    assert view["state"] == "connecting", view
    assert "5s" in view["reason"] and "agent" in view["reason"], view["reason"]


def test_an_endless_line_from_the_agent_ends_its_session(sshd_loopback: Sshd, tmp_path: Path) -> None:
    flood = fake_agent(
        tmp_path / "flood",
        "chunk = b'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.buffer.write(chunk)\n"
        "sys.stdout.flush()\ntime.sleep(60)",
    )
    fleet = fleet_yaml(
        tmp_path / "fleet.yaml",
        [_node(sshd_loopback.port)],
        ssh_settings(sshd_loopback),
        agent={"mode": "push", "backend": "sim", "python": str(flood)},
    )
    result = discover(fleet, "--json", "--timeout", "20", home=tmp_path)
    view = result.nodes()["n1"]
    assert view["state"] == "unreachable", view
    assert "line" in view["reason"] and "16 MiB" in view["reason"], view["reason"]
    assert not has_control(view["reason"]) and len(view["reason"]) < 300, view["reason"]
    assert result.seconds < 15
