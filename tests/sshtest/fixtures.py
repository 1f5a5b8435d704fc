"""pytest fixtures for real-SSH tests. A test module imports the ones it uses::

    from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
        sshd_loopback_fixture,
        sshtest_leak_check_fixture,
    )

    pytestmark = pytest.mark.usefixtures("sshtest_leak_check")

    def test_something(sshd_loopback: Sshd) -> None:
        argv = sshd_loopback.ssh_argv("true")   # or: host, port, user, client_key, known_hosts

The functions are named ``<fixture>_fixture`` and registered under ``<fixture>`` (pytest's
``name=``), so a test's parameter ``sshd_loopback`` does not shadow an import (ruff F811) and no
``conftest.py`` or ``pytest_plugins`` is needed.

* ``sshd_loopback`` -> a started :class:`~tests.sshtest.sshd.Sshd` on 127.0.0.1, random port.
* ``sshd_loopback_factory(**kwargs)`` -> another one each call (e.g. a jump host next to it).
* ``netns_hosts(n, **kwargs)`` -> ``n`` started :class:`~tests.sshtest.netns.NetnsSshd`, each on
  port 22 of its own namespace address, all with one client key and one known_hosts file.
  ``netns_hosts.behind(host)`` -> a started :class:`~tests.sshtest.netns.NetnsLoopbackSshd` on
  127.0.0.1 inside ``host``'s namespace (same key and known_hosts): reachable only through
  ``host``'s sshd, as a node behind a bastion.
* ``sshtest_leak_check`` (module scope) -> fails the module's last test's teardown when any sshd,
  namespace or veth of this process is still there.

Each fixture skips the test, with the reason, where it cannot run (no sshd, not root, no
namespaces). Teardown stops every server (and the sessions under it) and destroys the namespaces,
whether the test passed or not; it fails when a process survives. Server directories (keys,
configs, logs) are under the test's ``tmp_path``; the tail of each sshd log is printed at teardown,
which pytest shows when the test failed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sshtest.netns import (
    NetnsLab,
    NetnsLoopbackSshd,
    NetnsSshd,
    destroy_all_labs,
    make_hosts,
    own_leftovers,
    sshd_in_netns_unavailable_reason,
)
from tests.sshtest.sshd import (
    TMP_PREFIX,
    Sshd,
    live_servers,
    sshd_unavailable_reason,
    stop_all,
    sweep_stale,
)

SshdFactory = Callable[..., Sshd]


class NetnsFactory:
    """What the ``netns_hosts`` fixture gives: call it for hosts; ``behind`` for a hidden sshd."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared
        self.lab: NetnsLab | None = None
        self.servers: list[Sshd] = []

    def __call__(self, n: int = 2, **kwargs: Any) -> list[NetnsSshd]:
        if self.lab is None:
            self.lab = NetnsLab()
        made = make_hosts(self.lab, n, self.shared, **kwargs)
        self.servers.extend(made)
        return made

    def behind(self, host: NetnsSshd, **kwargs: Any) -> NetnsLoopbackSshd:
        """A started sshd on 127.0.0.1 in ``host``'s namespace, with the hosts' key and known_hosts."""
        server = NetnsLoopbackSshd(
            host.netns_host,
            workdir=self.shared / f"{host.netns}-lo-{len(self.servers)}",
            client_keys=host.client_keys,
            known_hosts=host.known_hosts,
            **kwargs,
        )
        self.servers.append(server)
        server.start()
        return server


def _teardown(servers: list[Sshd]) -> None:
    """Stop every server; report their logs; raise if any process survived."""
    errors: list[str] = []
    for server in servers:
        try:
            server.stop()
        except Exception as exc:
            errors.append(f"{server.name}: {exc}")
        print(
            f"--- {server.name} ({server.host}:{server.port}) sshd log, last lines ---\n{server.log_tail(20)}"
        )
    if errors:
        raise AssertionError("test sshd did not stop: " + "; ".join(errors))


@pytest.fixture(name="sshd_loopback_factory")
def sshd_loopback_factory_fixture(tmp_path: Path) -> Iterator[SshdFactory]:
    """Make started sshds on 127.0.0.1 (random free ports); all stopped at teardown."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()
    servers: list[Sshd] = []

    def make(name: str = "loopback", **kwargs: Any) -> Sshd:
        # The directory name carries our pid: sweep_stale() of a later run recognises the sshd.
        workdir = tmp_path / f"{TMP_PREFIX}{os.getpid()}-{name}-{len(servers)}"
        server = Sshd("127.0.0.1", name=name, workdir=workdir, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        _teardown(servers)


@pytest.fixture(name="sshd_loopback")
def sshd_loopback_fixture(sshd_loopback_factory: SshdFactory) -> Sshd:
    """A started sshd on 127.0.0.1: ``host``, ``port``, ``user``, ``client_key``, ``known_hosts``,
    ``stop()``, ``kill()``, ``freeze()``, ``thaw()``, ``restart()``, ``logs()``, ``ssh_argv()``."""
    return sshd_loopback_factory()


@pytest.fixture(name="netns_hosts")
def netns_hosts_fixture(tmp_path: Path) -> Iterator[NetnsFactory]:
    """Factory: ``netns_hosts(n, **sshd_kwargs)`` -> ``n`` test hosts, each with a started sshd.

    Every call adds hosts to the same lab (one /24); all hosts of the test share
    ``tmp_path/netns/id_ed25519`` and ``tmp_path/netns/known_hosts``.
    """
    reason = sshd_in_netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()  # sshds of dead runs; the lab sweeps namespaces of dead runs itself
    shared = tmp_path / "netns"
    shared.mkdir()
    factory = NetnsFactory(shared)
    try:
        yield factory
    finally:
        try:
            _teardown(factory.servers)
        finally:
            if factory.lab is not None:
                factory.lab.destroy()
                left = factory.lab.leftovers()
                assert not left, f"network namespaces or veths left behind: {left}"


@pytest.fixture(name="sshtest_leak_check", scope="module")
def sshtest_leak_check_fixture() -> Iterator[None]:
    """At the end of the module: no sshd, namespace or veth of this process may be left."""
    yield
    leftover = [server.name for server in live_servers()]
    stop_all()
    netns_left = own_leftovers()
    if netns_left:
        destroy_all_labs()
    assert not leftover, f"sshd still running after the tests: {leftover}"
    assert not netns_left, f"network namespaces or veths left behind: {netns_left}"
