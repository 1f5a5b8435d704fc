"""Files that fleet.yaml points to (known_hosts, identity_file) are the operator's own files, read
as OpenSSH reads them: only regular files, bounded in size, a private key not readable by others,
and every problem one line that names the file (and line) as the node's reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.fleet_cli import discover, fleet_yaml, ssh_settings
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    sshd_loopback_factory_fixture,
    sshd_loopback_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import Sshd

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


def _discover_with(server: Sshd, tmp_path: Path, **ssh: object) -> tuple[str, float]:
    """The node's state and reason, after a discover whose fleet.yaml has `ssh` changed."""
    node = {"name": "n1", "host": server.host, "port": server.port}
    fleet = fleet_yaml(tmp_path / "fleet.yaml", [node], ssh_settings(server, **ssh))
    result = discover(fleet, "--json", "--timeout", "20", home=tmp_path, timeout=40)
    assert "Traceback" not in result.stderr, result.stderr
    view = result.nodes()["n1"]
    return f"{view['state']}: {view['reason']}", result.seconds


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("setting", ["known_hosts", "identity_file"])
def test_a_fifo_is_refused_not_waited_on(sshd_loopback: Sshd, tmp_path: Path, setting: str) -> None:
    fifo = _fifo(tmp_path, f"{setting}.fifo")
    said, seconds = _discover_with(sshd_loopback, tmp_path, **{setting: str(fifo)})
    assert said.startswith("unreachable: ") and str(fifo) in said and "not a regular file" in said, said
    assert "\n" not in said and seconds < 15


@pytest.mark.parametrize("setting", ["known_hosts", "identity_file"])
def test_a_device_is_refused_before_it_is_read(sshd_loopback: Sshd, tmp_path: Path, setting: str) -> None:
    """/dev/zero once grew the process to 24 GB: now its type is checked before any byte is read."""
    said, seconds = _discover_with(sshd_loopback, tmp_path, **{setting: "/dev/zero"})
    assert said.startswith("unreachable: ") and "/dev/zero" in said and "not a regular file" in said, said
    assert seconds < 15


def test_an_oversized_identity_file_is_refused(sshd_loopback: Sshd, tmp_path: Path) -> None:
    big = tmp_path / "huge_key"
    with open(big, "wb") as f:
        f.truncate(2 * 1024 * 1024)  # sparse: 2 MiB of zeros without writing them
    big.chmod(0o600)
    said, _ = _discover_with(sshd_loopback, tmp_path, identity_file=str(big))
    assert said.startswith("unreachable: ") and str(big) in said and "larger than 1 MiB" in said, said


def test_an_oversized_known_hosts_is_refused(sshd_loopback: Sshd, tmp_path: Path) -> None:
    big = tmp_path / "huge_known_hosts"
    with open(big, "wb") as f:
        f.write(sshd_loopback.known_hosts.read_bytes())
        f.truncate(65 * 1024 * 1024)
    said, _ = _discover_with(sshd_loopback, tmp_path, known_hosts=str(big))
    assert said.startswith("unreachable: ") and str(big) in said and "larger than 64 MiB" in said, said


def test_a_garbage_known_hosts_names_file_and_line(sshd_loopback: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(sshd_loopback.known_hosts.read_bytes() + b"# fine\n\xff\xfe\x00garbage\n")
    said, _ = _discover_with(sshd_loopback, tmp_path, known_hosts=str(known))
    assert said.startswith("unreachable: ") and f"{known}:3:" in said and "UTF-8" in said, said
    assert "UnicodeDecodeError" not in said


def test_a_malformed_known_hosts_line_names_file_and_line(sshd_loopback: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(b"lonelyword\n" + sshd_loopback.known_hosts.read_bytes())
    said, _ = _discover_with(sshd_loopback, tmp_path, known_hosts=str(known))
    assert said.startswith("unreachable: ") and f"{known}:1:" in said, said


def test_a_private_key_others_can_read_is_refused_as_openssh_does(
    sshd_loopback: Sshd, tmp_path: Path
) -> None:
    loose = tmp_path / "loose_key"
    loose.write_bytes(sshd_loopback.client_key.read_bytes())
    loose.chmod(0o644)
    said, _ = _discover_with(sshd_loopback, tmp_path, identity_file=str(loose))
    assert said.startswith("unreachable: ") and str(loose) in said, said
    assert "0644" in said and f"chmod 600 {loose}" in said, said
    loose.chmod(0o600)
    said, _ = _discover_with(sshd_loopback, tmp_path, identity_file=str(loose))
    assert said.startswith("live"), said


def test_a_missing_identity_file_is_one_line(sshd_loopback: Sshd, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_key"
    said, _ = _discover_with(sshd_loopback, tmp_path, identity_file=str(missing))
    assert said.startswith("unreachable: ") and str(missing) in said and "No such file" in said, said
