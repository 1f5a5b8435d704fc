"""~/.ssh/config as OpenSSH reads it: a Host alias's HostName and Port name the host in
known_hosts (checked, recorded by accept-new, and in every message), and its ProxyJump is the
way to the node, through the bastion, with the same host-key checks on every hop."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.integration.fleet_cli import discover, fleet_yaml, ssh_settings
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    NetnsFactory,
    netns_hosts_fixture,
    sshd_loopback_factory_fixture,
    sshd_loopback_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import Sshd, generate_keypair

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


def _ssh_config(home: Path, text: str) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "config").write_text(textwrap.dedent(text))


def _alias_fleet(server: Sshd, home: Path, known_hosts: Path, **ssh: object) -> Path:
    """A node written as the alias `nodea`, which ~/.ssh/config resolves to the test sshd."""
    _ssh_config(home, f"Host nodea\n    HostName {server.host}\n    Port {server.port}\n")
    settings = ssh_settings(server, known_hosts=str(known_hosts), use_ssh_config=True, **ssh)
    return fleet_yaml(home / "fleet.yaml", [{"name": "a", "host": "nodea"}], settings)


def test_an_unknown_host_behind_an_alias_is_refused_with_its_real_name(
    sshd_loopback: Sshd, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    view = discover(_alias_fleet(sshd_loopback, tmp_path, known), "--json", home=tmp_path).nodes()["a"]
    assert view["state"] == "unreachable", view
    reason = view["reason"]
    assert "unknown host key" in reason and sshd_loopback.host_keys.fingerprint() in reason, reason
    assert f"ssh-keyscan -p {sshd_loopback.port} 127.0.0.1" in reason, reason
    assert "ValueError" not in reason and known.read_text() == ""


def test_accept_new_records_a_host_reached_by_alias(sshd_loopback: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    fleet = _alias_fleet(sshd_loopback, tmp_path, known, host_key_policy="accept-new")
    first = discover(fleet, "--json", home=tmp_path)
    assert first.nodes()["a"]["state"] == "live", first.nodes()["a"]["reason"]
    # recorded as OpenSSH records it: under the HostName and Port the alias stands for
    recorded = f"[127.0.0.1]:{sshd_loopback.port} {sshd_loopback.host_keys.public_key()}"
    assert known.read_text().splitlines() == [recorded]
    strict = _alias_fleet(sshd_loopback, tmp_path, known, host_key_policy="strict")
    second = discover(strict, "--json", home=tmp_path)
    assert second.nodes()["a"]["state"] == "live", second.nodes()["a"]["reason"]
    assert len(known.read_text().splitlines()) == 1


def test_a_changed_key_behind_an_alias_is_refused(sshd_loopback: Sshd, tmp_path: Path) -> None:
    other = generate_keypair(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd_loopback.port} {other.public_key()}\n")
    fleet = _alias_fleet(sshd_loopback, tmp_path, known, host_key_policy="accept-new")
    view = discover(fleet, "--json", home=tmp_path).nodes()["a"]
    assert view["state"] == "unreachable" and "HOST KEY CHANGED" in view["reason"], view
    assert f"[127.0.0.1]:{sshd_loopback.port}" in view["reason"]
    assert known.read_text() == f"[127.0.0.1]:{sshd_loopback.port} {other.public_key()}\n"


def test_proxyjump_in_ssh_config_is_the_way_to_the_node(netns_hosts: NetnsFactory, tmp_path: Path) -> None:
    """The node listens on 127.0.0.1 inside the bastion's namespace: only the bastion reaches it."""
    (bastion,) = netns_hosts(1)
    node = netns_hosts.behind(bastion)
    _ssh_config(
        tmp_path,
        f"""\
        Host bastion
            HostName {bastion.host}
        Host hidden
            HostName 127.0.0.1
            Port {node.port}
            ProxyJump bastion
        """,
    )
    settings = ssh_settings(bastion, use_ssh_config=True)
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [{"name": "hidden", "host": "hidden"}], settings)
    result = discover(fleet, "--json", "--timeout", "40", home=tmp_path)
    view = result.nodes()["hidden"]
    assert view["state"] == "live", view["reason"]
    assert view["route"] == f"via bastion (ProxyJump in {tmp_path}/.ssh/config)", view["route"]
    assert "Accepted publickey" in bastion.logs() and "Starting session" not in bastion.logs()
    assert "Starting session: command" in node.logs()
    table = discover(fleet, "--timeout", "40", home=tmp_path)
    assert "via bastion" in table.stdout, table.stdout


def test_a_bastions_unknown_host_key_is_refused_too(netns_hosts: NetnsFactory, tmp_path: Path) -> None:
    (bastion,) = netns_hosts(1)
    node = netns_hosts.behind(bastion)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{node.port} {node.host_keys.public_key()}\n")  # not the bastion's
    _ssh_config(
        tmp_path,
        f"Host hidden\n    HostName 127.0.0.1\n    Port {node.port}\n    ProxyJump {bastion.host}\n",
    )
    settings = ssh_settings(bastion, use_ssh_config=True, known_hosts=str(known))
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [{"name": "hidden", "host": "hidden"}], settings)
    view = discover(fleet, "--json", "--timeout", "40", home=tmp_path).nodes()["hidden"]
    assert view["state"] == "unreachable", view
    assert f"{bastion.host}: unknown host key" in view["reason"], view["reason"]
    assert "Accepted publickey" not in bastion.logs()
