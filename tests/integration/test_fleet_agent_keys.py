"""An encrypted identity_file is used as `ssh -i` uses it: through the ssh-agent that holds the
key; without one, the node's reason says what to do. gpuops never asks for a passphrase."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fleet_cli import discover, fleet_yaml, ssh_settings
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    SshdFactory,
    sshd_loopback_factory_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import KeyPair, Sshd, generate_keypair

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


@pytest.fixture(name="ssh_agent")
def ssh_agent_fixture(tmp_path: Path) -> Iterator[Path]:
    """A real ssh-agent of this test, on its own socket; killed at teardown."""
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        yield sock
    finally:
        agent.kill()
        agent.wait(10)


def _encrypted_key_held_by(agent: Path | None, tmp_path: Path) -> KeyPair:
    """A key the agent holds (when given), then encrypted on disk with a passphrase."""
    keys = generate_keypair(tmp_path / "id_encrypted")
    if agent is not None:
        add = subprocess.run(
            ["ssh-add", str(keys.private)],
            env={**os.environ, "SSH_AUTH_SOCK": str(agent)},
            capture_output=True,
            timeout=10,
        )
        assert add.returncode == 0, add.stderr
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-P", "", "-N", "not-known-to-gpuops", "-f", str(keys.private)],
        check=True,
        capture_output=True,
        timeout=10,
    )
    return keys


def _reason(server: Sshd, keys: KeyPair, tmp_path: Path, agent: Path | None) -> str:
    node = {"name": "n1", "host": server.host, "port": server.port}
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [node], ssh_settings(server, identity_file=str(keys.private)))
    env = {"SSH_AUTH_SOCK": str(agent)} if agent is not None else {}
    result = discover(fleet, "--json", "--timeout", "30", home=tmp_path, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    view = result.nodes()["n1"]
    return f"{view['state']}: {view['reason']}"


@pytest.mark.parametrize("public_file", [True, False], ids=["with .pub", "without .pub"])
def test_the_agents_copy_of_an_encrypted_key_is_used(
    sshd_loopback_factory: SshdFactory, ssh_agent: Path, tmp_path: Path, public_file: bool
) -> None:
    keys = _encrypted_key_held_by(ssh_agent, tmp_path)
    server = sshd_loopback_factory(client_keys=keys)
    if not public_file:
        keys.public.unlink()  # the public half then comes from the key file itself, as ssh does
    # OpenSSH's own client does it, with the same key and agent:
    ssh = server.ssh_argv("true", options=[f"IdentityAgent={ssh_agent}"])
    assert subprocess.run(ssh, capture_output=True, timeout=30).returncode == 0
    assert _reason(server, keys, tmp_path, ssh_agent) == "live: "


def test_an_encrypted_key_the_agent_lacks_says_what_to_do(
    sshd_loopback_factory: SshdFactory, ssh_agent: Path, tmp_path: Path
) -> None:
    keys = _encrypted_key_held_by(None, tmp_path)
    server = sshd_loopback_factory(client_keys=keys)
    said = _reason(server, keys, tmp_path, ssh_agent)
    assert said.startswith("unreachable: ") and "ssh-agent does not hold it" in said, said
    assert f"ssh-add {keys.private}" in said and "Passphrase must be specified" not in said, said


def test_an_encrypted_key_without_an_agent_says_what_to_do(
    sshd_loopback_factory: SshdFactory, tmp_path: Path
) -> None:
    keys = _encrypted_key_held_by(None, tmp_path)
    server = sshd_loopback_factory(client_keys=keys)
    said = _reason(server, keys, tmp_path, None)
    assert said.startswith("unreachable: ") and "no ssh-agent" in said, said
    assert f"ssh-add {keys.private}" in said, said
