"""The fleet over real SSH: Debian's OpenSSH sshd on loopback and in network namespaces, the
agent pushed as a zipapp over SFTP and run by the node's python3, the collector following it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuops.fleet import zipapp
from gpuops.fleet.collector import Collector
from gpuops.fleet.remote_agent import AgentLaunch
from gpuops.fleet.session import NodeTarget
from gpuops.fleet.source import LIVE, UNREACHABLE, FleetSnapshot
from gpuops.fleet.ssh import ACCEPT_NEW, SshError, SshTarget, connect
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    NetnsFactory,
    netns_hosts_fixture,
    sshd_loopback_factory_fixture,
    sshd_loopback_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import Sshd, generate_keypair

pytestmark = pytest.mark.usefixtures("sshtest_leak_check")

SIM = AgentLaunch(mode="push", python="python3", backend="sim")


def _target(server: Sshd, **changes: object) -> SshTarget:
    fields: dict[str, object] = {
        "host": server.host,
        "port": server.port,
        "user": server.user,
        "identity_files": (str(server.client_key),),
        "known_hosts": str(server.known_hosts),
        "use_ssh_config": False,
        "connect_timeout": 5.0,
        "login_timeout": 5.0,
    }
    fields.update(changes)
    return SshTarget(**fields)  # type: ignore[arg-type]


async def _until(
    collector: Collector, check: Callable[[FleetSnapshot], bool], timeout: float
) -> FleetSnapshot:
    deadline = time.monotonic() + timeout
    while True:
        snapshot = collector.snapshot()
        if check(snapshot):
            return snapshot
        if time.monotonic() > deadline:
            states = {n.name: (n.state, n.reason) for n in snapshot.nodes}
            raise AssertionError(f"fleet did not reach the expected state in {timeout}s: {states}")
        await collector.wait_changed(0.2)


def _state(snapshot: FleetSnapshot, name: str) -> str:
    return next(n.state for n in snapshot.nodes if n.name == name)


def test_agent_pushed_over_sftp_and_followed(sshd_loopback: Sshd) -> None:
    async def run() -> None:
        collector = Collector([NodeTarget("n1", _target(sshd_loopback), SIM)], interval=0.3)
        collector.start()
        try:
            snap = await _until(collector, lambda s: _state(s, "n1") == LIVE, 30)
            view = snap.nodes[0]
            assert view.hello is not None and view.hello.backend == "sim"
            assert view.inventory is not None and len(view.inventory.gpus) == 8
            first = view.last_seen
            assert first is not None
            # Samples keep arriving at the interval on the same session.
            await asyncio.sleep(1.0)
            later = collector.snapshot().nodes[0]
            assert later.last_seen is not None and later.last_seen > first
        finally:
            await collector.stop()

    asyncio.run(run())
    cached = Path.home() / ".cache" / "gpuops" / zipapp.build().name
    assert cached.exists() and cached.read_bytes() == zipapp.build().data
    assert oct(cached.stat().st_mode & 0o777) == "0o600"


def test_unknown_host_key_is_refused_with_fingerprint(sshd_loopback: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SshError) as info:
        asyncio.run(connect(_target(sshd_loopback, known_hosts=str(empty))))
    message = str(info.value)
    assert info.value.kind == "host_key_unknown"
    assert sshd_loopback.host_keys.fingerprint() in message
    assert f"ssh-keyscan -p {sshd_loopback.port} 127.0.0.1" in message
    assert "\n" not in message
    assert empty.read_text() == ""  # nothing trusted behind the user's back


def test_changed_host_key_is_refused_even_with_accept_new(sshd_loopback: Sshd, tmp_path: Path) -> None:
    other = generate_keypair(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd_loopback.port} {other.public_key()}\n")
    with pytest.raises(SshError) as info:
        asyncio.run(connect(_target(sshd_loopback, known_hosts=str(known), host_key_policy=ACCEPT_NEW)))
    assert info.value.kind == "host_key_changed"
    assert "HOST KEY CHANGED" in str(info.value)


def test_accept_new_records_the_key_once(sshd_loopback: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"

    async def run() -> None:
        conn = await connect(_target(sshd_loopback, known_hosts=str(known), host_key_policy=ACCEPT_NEW))
        conn.close()
        conn = await connect(_target(sshd_loopback, known_hosts=str(known)))  # now strict works
        conn.close()

    asyncio.run(run())
    lines = known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{sshd_loopback.port} ssh-ed25519 ")


def test_wrong_user_or_key_is_one_clear_line(sshd_loopback: Sshd, tmp_path: Path) -> None:
    stranger = generate_keypair(tmp_path / "stranger")
    for target in (
        _target(sshd_loopback, identity_files=(str(stranger.private),)),
        _target(sshd_loopback, user="nobody-such-user"),
    ):
        with pytest.raises(SshError) as info:
            asyncio.run(connect(target))
        assert info.value.kind == "auth", info.value
        assert "authentication failed" in str(info.value) and "\n" not in str(info.value)


def test_refused_port_is_unreachable_not_a_hang(sshd_loopback: Sshd) -> None:
    sshd_loopback.stop()
    started = time.monotonic()
    with pytest.raises(SshError) as info:
        asyncio.run(connect(_target(sshd_loopback)))
    assert info.value.kind == "refused"
    assert time.monotonic() - started < 5


def test_dead_frozen_and_cut_nodes_do_not_stall_the_others(netns_hosts: NetnsFactory) -> None:
    hosts = netns_hosts(4)
    names = [h.hostname for h in hosts]
    targets = [NodeTarget(h.hostname, _target(h), SIM) for h in hosts]

    async def run() -> None:
        collector = Collector(targets, interval=0.3, silence_limit=3.0, backoff_max=1.0)
        collector.start()
        try:
            await _until(collector, lambda s: all(n.state == LIVE for n in s.nodes), 60)
            killed, frozen, cut, healthy = hosts
            killed.kill()
            frozen.freeze()
            cut.cut()
            snap = await _until(
                collector, lambda s: all(_state(s, h.hostname) == UNREACHABLE for h in hosts[:3]), 30
            )
            reasons = {n.name: n.reason for n in snap.nodes}
            assert "no data" in reasons[frozen.hostname] or "no answer" in reasons[frozen.hostname]
            assert reasons[cut.hostname]
            assert reasons[killed.hostname]
            # Meanwhile the healthy node kept refreshing at the interval.
            before = collector.snapshot().nodes[3].last_seen
            await asyncio.sleep(1.0)
            now = collector.snapshot()
            assert _state(now, healthy.hostname) == LIVE
            assert (
                now.nodes[3].last_seen is not None and before is not None and now.nodes[3].last_seen > before
            )
            # Everything comes back once restored.
            killed.restart()
            frozen.thaw()
            cut.restore()
            await _until(collector, lambda s: all(n.state == LIVE for n in s.nodes), 60)
            kinds = [(e.node, e.kind) for e in collector.events()]
            for name in names[:3]:
                assert (name, UNREACHABLE) in kinds and (name, LIVE) in kinds
        finally:
            await collector.stop()

    asyncio.run(run())


def test_a_node_behind_a_jump_host(sshd_loopback_factory: Callable[..., Sshd]) -> None:
    bastion = sshd_loopback_factory(name="bastion")
    node = sshd_loopback_factory(
        name="node", client_keys=bastion.client_keys, known_hosts=bastion.known_hosts
    )
    jump = _target(bastion)
    target = _target(node, jump=jump)

    async def run() -> None:
        collector = Collector([NodeTarget("behind", target, SIM)], interval=0.3)
        collector.start()
        try:
            snap = await _until(collector, lambda s: _state(s, "behind") == LIVE, 30)
            assert snap.nodes[0].inventory is not None
        finally:
            await collector.stop()

    asyncio.run(run())
    # We logged in to the bastion but ran nothing there: it only forwarded to the node, which
    # ran the agent.
    assert "Accepted publickey" in bastion.logs() and "Starting session" not in bastion.logs()
    assert "Starting session: command" in node.logs()
