"""The real-SSH test infrastructure itself, proven with the plain OpenSSH client.

Every ``ssh`` here runs with ``BatchMode=yes``, ``StrictHostKeyChecking=yes`` and the generated
known_hosts (see ``Sshd.ssh_argv``). Skips where sshd or network namespaces are unavailable.
"""

from __future__ import annotations

import json
import os
import selectors
import shlex
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    NetnsFactory,
    SshdFactory,
    netns_hosts_fixture,
    sshd_loopback_factory_fixture,
    sshd_loopback_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.netns import NetnsSshd, ip, netns_unavailable_reason, sweep_stale
from tests.sshtest.sshd import (
    REPO,
    Sshd,
    agent_remote_command,
    alive,
    generate_keypair,
    sshd_unavailable_reason,
    write_known_hosts,
)
from tests.sshtest.sshd import sweep_stale as sweep_stale_sshd

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")


def ssh(
    server: Sshd, *remote: str, timeout: float = 20, connect_timeout: float = 5, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    argv = server.ssh_argv(*remote, connect_timeout=connect_timeout, **kwargs)  # type: ignore[arg-type]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def assert_ok(server: Sshd, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"ssh failed: {result.stderr}\n--- sshd log ---\n{server.log_tail()}"


def assert_fails(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 255, (result.returncode, result.stdout, result.stderr)
    for needle in needles:
        assert needle in result.stderr, result.stderr


class LineReader:
    """Lines from a pipe, with a timeout on each read."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.fd = stream.fileno()
        self.buffer = b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)

    def readline(self, timeout: float) -> bytes | None:
        """One line, or None when none arrived within ``timeout`` s (b"" at end of file)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self.selector.select(left):
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return b""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"


@contextmanager
def session(server: Sshd, command: str) -> Iterator[tuple[subprocess.Popen[bytes], LineReader]]:
    """A live ssh session running ``command``; ended (stdin closed, then killed) on exit."""
    proc = subprocess.Popen(
        server.ssh_argv(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc, LineReader(proc.stdout)  # type: ignore[arg-type]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()


# --------------------------------------------------------------------------- loopback


def test_a_command_runs(sshd_loopback: Sshd) -> None:
    result = ssh(sshd_loopback, "echo hello && id -un")
    assert_ok(sshd_loopback, result)
    assert result.stdout.split() == ["hello", sshd_loopback.user]
    assert "Accepted publickey for " + sshd_loopback.user in sshd_loopback.logs()
    assert sshd_loopback.host == "127.0.0.1" and sshd_loopback.port > 0
    assert sshd_loopback.client_key.exists() and sshd_loopback.known_hosts.exists()


def test_unknown_or_changed_host_key_is_refused(sshd_loopback: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    result = ssh(sshd_loopback, "true", options=[f"UserKnownHostsFile={empty}"])
    assert_fails(result, "No ED25519 host key is known", "Host key verification failed")

    impostor = generate_keypair(tmp_path / "impostor_host_key")
    changed = write_known_hosts(
        tmp_path / "changed_known_hosts", [(sshd_loopback.host, sshd_loopback.port, impostor.public_key())]
    )
    result = ssh(sshd_loopback, "true", options=[f"UserKnownHostsFile={changed}"])
    assert_fails(result, "REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed")
    # The fingerprint ssh prints is the one of the key the server really has.
    assert sshd_loopback.host_keys.fingerprint() in result.stderr


def test_wrong_key_or_user_is_refused(sshd_loopback: Sshd, tmp_path: Path) -> None:
    stranger = generate_keypair(tmp_path / "stranger")
    assert_fails(ssh(sshd_loopback, "true", identity=stranger.private), "Permission denied (publickey)")
    assert_fails(ssh(sshd_loopback, "true", user="nobody"), "Permission denied (publickey)")


def test_freeze_times_out_new_and_live_sessions_and_thaw_brings_them_back(sshd_loopback: Sshd) -> None:
    with session(sshd_loopback, "cat") as (proc, reader):
        send(proc, b"one\n")
        assert reader.readline(10) == b"one\n"

        frozen = sshd_loopback.freeze()
        assert len(frozen) >= 3  # listener, the session's sshd(s), cat
        started = time.monotonic()
        result = ssh(sshd_loopback, "true", connect_timeout=1, timeout=10)
        assert_fails(result, "timed out")
        assert time.monotonic() - started < 5
        send(proc, b"two\n")
        assert reader.readline(0.5) is None  # the live session is frozen too

        sshd_loopback.thaw()
        assert reader.readline(10) == b"two\n"
        assert_ok(sshd_loopback, ssh(sshd_loopback, "true"))


def test_kill_ends_everything_and_restart_comes_back_on_the_same_port(sshd_loopback: Sshd) -> None:
    with session(sshd_loopback, "cat") as (proc, reader):
        send(proc, b"ping\n")
        assert reader.readline(10) == b"ping\n"
        tree = sshd_loopback.processes()
        assert len(tree) >= 3

        sshd_loopback.kill()
        assert not [pid for pid in tree if alive(pid)]
        assert reader.readline(10) == b""  # the client sees the connection end
        assert proc.wait(10) == 255
    assert_fails(ssh(sshd_loopback, "true"), "Connection refused")

    port = sshd_loopback.port
    sshd_loopback.restart()
    assert sshd_loopback.port == port
    assert_ok(sshd_loopback, ssh(sshd_loopback, "true"))


def test_stop_ends_live_sessions(sshd_loopback: Sshd) -> None:
    with session(sshd_loopback, "cat") as (proc, reader):
        send(proc, b"x\n")
        assert reader.readline(10) == b"x\n"
        tree = sshd_loopback.processes()
        sshd_loopback.stop()
        assert not sshd_loopback.running
        assert not [pid for pid in tree if alive(pid)]
        assert reader.readline(10) == b""
        proc.wait(10)


def test_node_agent_answers_hello_over_ssh(sshd_loopback: Sshd) -> None:
    command = agent_remote_command("--backend", "sim")
    assert shlex.split(command)[:2] == ["cd", str(REPO)]
    with session(sshd_loopback, command) as (proc, reader):
        send(proc, b'{"v":1,"id":1,"op":"hello","args":{}}\n')
        line = reader.readline(30)
        assert line, proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else line
        reply = json.loads(line)
        assert reply["ok"] is True and reply["id"] == 1, reply
        assert reply["result"]["backend"] == "sim"
        # The agent is a real process under the sshd session.
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in sshd_loopback.processes()]
        assert any(b"gpuops.node\0agent" in cmdline for cmdline in commands)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(15) == 0


def test_two_loopback_servers_are_independent(sshd_loopback_factory: SshdFactory) -> None:
    first, second = sshd_loopback_factory("first"), sshd_loopback_factory("second")
    assert first.port != second.port
    first.freeze()
    assert_ok(second, ssh(second, "true"))
    first.thaw()
    assert_ok(first, ssh(first, "true"))


# --------------------------------------------------------------------------- process hygiene

_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from pathlib import Path
    from tests.sshtest.sshd import TMP_PREFIX, Sshd
    server = Sshd(workdir=Path(sys.argv[1]) / f"{TMP_PREFIX}{os.getpid()}-child")
    if sys.argv[2] == "thread":  # no PR_SET_PDEATHSIG from a worker thread
        worker = threading.Thread(target=server.start)
        worker.start()
        worker.join()
    else:
        server.start()
    print(server.pid, flush=True)
    time.sleep(60)
    """
)


def _sshd_of_a_killed_run(tmp_path: Path, how: str) -> int:
    """Start an sshd from another Python process, SIGKILL that process; returns the sshd's pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), how], cwd=REPO, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = LineReader(child.stdout).readline(20)
        assert line, "the child did not start its sshd"
        return int(line)
    finally:
        child.kill()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def _gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_sshd_dies_with_the_test_process_that_started_it(tmp_path: Path) -> None:
    if (reason := sshd_unavailable_reason()) is not None:
        pytest.skip(reason)
    pid = _sshd_of_a_killed_run(tmp_path, "main")
    assert _gone(pid), "sshd outlived its test process"


def test_sweep_kills_the_sshd_of_a_killed_run(tmp_path: Path) -> None:
    if (reason := sshd_unavailable_reason()) is not None:
        pytest.skip(reason)
    pid = _sshd_of_a_killed_run(tmp_path, "thread")
    try:
        assert alive(pid)
        assert pid in sweep_stale_sshd()
        assert _gone(pid)
    finally:
        if alive(pid):
            os.kill(pid, 9)


# --------------------------------------------------------------------------- network namespaces


def test_netns_hosts_have_their_own_address_and_name(netns_hosts: NetnsFactory) -> None:
    hosts = netns_hosts(2)
    assert all(isinstance(host, NetnsSshd) for host in hosts)
    assert all(host.netns.startswith(f"gpuops-t{os.getpid()}-") for host in hosts)
    assert len({host.host for host in hosts}) == 2
    for host in hosts:
        assert host.port == 22
        result = ssh(host, "hostname && ip -4 -o addr show dev eth0")
        assert_ok(host, result)
        assert result.stdout.splitlines()[0] == host.hostname
        assert f"inet {host.host}/30" in result.stdout
    # One client key and one known_hosts file serve all hosts.
    assert len({(host.client_key, host.known_hosts) for host in hosts}) == 1
    assert len(hosts[0].known_hosts.read_text().splitlines()) == 2


def test_cut_makes_one_host_unreachable_and_restore_brings_it_back(netns_hosts: NetnsFactory) -> None:
    a, b = netns_hosts(2)
    a.cut()  # silence: packets vanish, connections time out
    started = time.monotonic()
    assert_fails(ssh(a, "true", connect_timeout=1, timeout=10), "timed out")
    assert time.monotonic() - started < 5
    assert_ok(b, ssh(b, "true"))
    a.restore()
    assert_ok(a, ssh(a, "true"))

    b.cut("unreachable")  # root-side veth down: fails at once, nothing leaks to the default route
    started = time.monotonic()
    assert_fails(ssh(b, "true", connect_timeout=5, timeout=10), "No route to host")
    assert time.monotonic() - started < 2
    route = ip("route", "get", b.host, check=False)
    assert "No route to host" in route.stderr and "eth0" not in route.stdout, route
    assert_ok(a, ssh(a, "true"))
    b.restore()
    assert_ok(b, ssh(b, "true"))


def test_a_live_session_hangs_while_cut_and_resumes_after_restore(netns_hosts: NetnsFactory) -> None:
    (host,) = netns_hosts(1)
    with session(host, "cat") as (proc, reader):
        send(proc, b"before\n")
        assert reader.readline(10) == b"before\n"
        host.cut()
        send(proc, b"during\n")
        assert reader.readline(0.5) is None
        host.restore()
        assert reader.readline(15) == b"during\n"  # TCP retransmits: nothing was reset


def test_freeze_and_kill_one_host_leave_the_other_alone(netns_hosts: NetnsFactory) -> None:
    a, b = netns_hosts(2)
    a.freeze()
    assert_fails(ssh(a, "true", connect_timeout=1, timeout=10), "timed out")
    assert_ok(b, ssh(b, "true"))
    a.thaw()
    assert_ok(a, ssh(a, "true"))

    b.kill()
    assert_fails(ssh(b, "true"), "Connection refused")
    assert_ok(a, ssh(a, "true"))
    b.restart()
    assert_ok(b, ssh(b, "true"))


def test_loopback_sshd_is_a_jump_host_to_a_netns_host(sshd_loopback: Sshd, netns_hosts: NetnsFactory) -> None:
    (target,) = netns_hosts(1)
    jump = sshd_loopback.ssh_argv()
    jump[-1:-1] = ["-W", "%h:%p"]  # options before the host name
    result = ssh(target, "hostname", options=[f"ProxyCommand={shlex.join(jump)}"])
    assert_ok(target, result)
    assert result.stdout.strip() == target.hostname


def test_sweep_removes_namespaces_of_a_killed_run() -> None:
    if (reason := netns_unavailable_reason()) is not None:
        pytest.skip(reason)
    dead = subprocess.Popen(["true"])
    dead.wait()
    name, veth = f"gpuops-t{dead.pid}-0", f"gt{dead.pid}v0"
    ip("netns", "add", name)
    sleeper: subprocess.Popen[bytes] | None = None
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        sleeper = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "60"])
        deadline = time.monotonic() + 5
        while str(sleeper.pid) not in ip("netns", "pids", name).stdout and time.monotonic() < deadline:
            time.sleep(0.02)
        removed = sweep_stale()
        assert name in removed
        assert sleeper.wait(5) == -9
        assert name not in ip("netns", "list").stdout
        deadline = time.monotonic() + 5
        while ip("link", "show", veth, check=False).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ip("link", "show", veth, check=False).returncode != 0
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(5)
        ip("link", "del", veth, check=False)
        ip("netns", "del", name, check=False)
