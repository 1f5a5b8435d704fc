"""Test hosts with their own addresses: network namespaces joined to this machine by veth pairs.

Host ``i`` of a test run is the namespace ``gpuops-t<pid>-<i>`` (``<pid>``: the test process).
Its interface ``eth0`` is one end of a veth pair whose other end, ``gt<pid>v<i>``, stays in the
root namespace. Each :class:`NetnsLab` takes one private /24 (``10.213.<k>.0/24``, ``k`` not
used by any other lab on the machine) and gives host ``i`` the /30 ``10.213.<k>.<4i>``: the
root side is ``.4i+1``, the host ``.4i+2``. No route leads anywhere else: these addresses exist
only on these veths, the namespaces have no default route, and a guard route ``unreachable
10.213.<k>.0/24`` (metric 4242, protocol 213) makes sure that a root-side veth taken down never
sends the lab's traffic to the default gateway.

Breaking a host (:class:`NetnsHost`):

* ``cut()`` takes the host's own ``eth0`` down: the root side keeps its route but loses carrier,
  so packets to the host vanish silently. New connections time out and live ones hang, as with
  a pulled cable or a partition. ``cut("unreachable")`` takes the *root-side* veth down instead:
  its route goes, the guard route answers, and connections fail at once with "No route to host".
* ``restore()`` brings both ends up again and waits for the route.

Cleanup: :meth:`NetnsLab.destroy` kills every process in the lab's namespaces, deletes them (the
veth pairs go with them) and the guard route; the fixtures call it in their teardown, an ``atexit``
hook calls it for labs still alive when the process exits, and :func:`sweep_stale` (run before
each new lab) removes namespaces, veths and guard routes of test runs whose process is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tests.sshtest.sshd import (
    INSTALL_HINT,
    KeyPair,
    Sshd,
    SshdError,
    alive,
    generate_keypair,
    sshd_unavailable_reason,
)

NS_PREFIX = "gpuops-t"
VETH_PREFIX = "gt"
NS_IFNAME = "eth0"
NET_PREFIX = "10.213"
GUARD_METRIC = 4242
GUARD_PROTO = 213
MAX_HOSTS = 63  # /30s in a /24
_NS_RE = re.compile(rf"^{re.escape(NS_PREFIX)}(\d+)-(\w+)$")
_VETH_RE = re.compile(rf"^{re.escape(VETH_PREFIX)}(\d+)v\d+$")
_COUNTER = itertools.count()
_LABS: dict[int, NetnsLab] = {}
_LABS_LOCK = threading.Lock()


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its stderr."""


def ip(*args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS...``; raise :class:`NetnsError` when it fails and ``check``."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Serialise address allocation and sweeps between test processes on this machine."""
    directory = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())
    with open(directory / "gpuops-netns.lock", "a+") as handle:
        deadline = time.monotonic() + 30
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NetnsError(f"{directory}/gpuops-netns.lock held for 30 s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@cache
def netns_unavailable_reason() -> str | None:
    """Why test hosts in network namespaces cannot be made here (a skip reason), or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return f"iproute2 is not installed (no `ip`); {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "network namespaces and veth pairs need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run as root"
    name = f"{NS_PREFIX}{os.getpid()}-probe"
    veth = f"{VETH_PREFIX}{os.getpid()}v99999"
    try:
        made = ip("netns", "add", name, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace (ip netns add: {made.stderr.strip()})"
        pair = ip("link", "add", veth, "type", "veth", "peer", "name", NS_IFNAME, "netns", name, check=False)
        if pair.returncode != 0:
            return f"cannot create a veth pair (ip link add ... type veth: {pair.stderr.strip()})"
        run = subprocess.run(
            ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if run.returncode != 0:
            return f"cannot run programs in a network namespace (ip netns exec: {run.stderr.strip()})"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces unusable: {exc}"
    finally:
        ip("link", "del", veth, check=False)
        ip("netns", "del", name, check=False)
    return None


def sshd_in_netns_unavailable_reason() -> str | None:
    """Skip reason for sshd test hosts in namespaces: both sshd and namespaces must work."""
    return sshd_unavailable_reason() or netns_unavailable_reason()


# --------------------------------------------------------------------------- sweeping


def _kill_namespace_processes(name: str, timeout: float = 5) -> None:
    result = ip("netns", "pids", name, check=False)
    pids = [int(word) for word in result.stdout.split() if word.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _namespaces() -> list[str]:
    result = ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    """Names of the links in the root namespace (``gt1v0``, not ``gt1v0@if2``)."""
    names = []
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) >= 3:
            names.append(parts[1].strip().split("@")[0])
    return names


def own_leftovers() -> list[str]:
    """Namespaces and veths of this process that still exist."""
    if shutil.which("ip") is None:
        return []
    pid = os.getpid()
    left = [name for name in _namespaces() if name.startswith(f"{NS_PREFIX}{pid}-")]
    return left + [link for link in _links() if link.startswith(f"{VETH_PREFIX}{pid}v")]


def _sweep_guard_routes() -> None:
    """Delete guard routes of /24s where no address of ours is left."""
    routes = ip("-4", "route", "show", "proto", str(GUARD_PROTO), check=False).stdout
    addresses = ip("-4", "-o", "addr", "show", check=False).stdout
    for line in routes.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "unreachable":
            continue
        subnet = words[1]
        stem = subnet.rsplit(".", 1)[0] + "."
        if f"inet {stem}" not in addresses:
            ip("route", "del", "unreachable", subnet, "metric", str(GUARD_METRIC), check=False)


def sweep_stale() -> list[str]:
    """Remove namespaces, veths and guard routes of test runs whose process is gone."""
    removed: list[str] = []
    with _machine_lock():
        for name in _namespaces():
            match = _NS_RE.match(name)
            if match is None or int(match.group(1)) == os.getpid() or alive(int(match.group(1))):
                continue
            _kill_namespace_processes(name)
            ip("netns", "del", name, check=False)
            removed.append(name)
        for link in _links():
            match = _VETH_RE.match(link)
            if match is not None and int(match.group(1)) != os.getpid() and not alive(int(match.group(1))):
                ip("link", "del", link, check=False)
                removed.append(link)
        _sweep_guard_routes()
    return removed


# --------------------------------------------------------------------------- hosts


class NetnsHost:
    """One test host: a network namespace with ``eth0`` at :attr:`address`."""

    def __init__(self, lab: NetnsLab, index: int, local: int, subnet: int) -> None:
        self.lab = lab
        self.index = index
        self.name = f"{NS_PREFIX}{os.getpid()}-{index}"
        self.veth = f"{VETH_PREFIX}{os.getpid()}v{index}"
        self.hostname = f"node-{local}"
        self.gateway = f"{NET_PREFIX}.{subnet}.{4 * local + 1}"
        self.address = f"{NET_PREFIX}.{subnet}.{4 * local + 2}"
        self.cut_mode: str | None = None

    def create(self) -> None:
        ip("netns", "add", self.name)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", NS_IFNAME, "netns", self.name)
        ip("addr", "add", f"{self.gateway}/30", "dev", self.veth)
        ip("link", "set", self.veth, "up")
        ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", NS_IFNAME)
        ip("-n", self.name, "link", "set", NS_IFNAME, "up")
        ip("-n", self.name, "link", "set", "lo", "up")

    def exec_prefix(self, hostname: bool = True) -> list[str]:
        """argv prefix that runs a program in this host: its namespace and (``hostname``) its own
        UTS namespace named :attr:`hostname`. Each step ``exec``s the next (same pid)."""
        prefix = ["ip", "netns", "exec", self.name]
        if hostname and shutil.which("unshare") and shutil.which("hostname"):
            prefix += ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname]
        return prefix

    def run(self, *argv: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        """Run a command inside this host and wait for it."""
        return subprocess.run(
            [*self.exec_prefix(hostname=False), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pids(self) -> list[int]:
        """Every process inside this host's namespace."""
        return [
            int(word) for word in ip("netns", "pids", self.name, check=False).stdout.split() if word.isdigit()
        ]

    def cut(self, mode: str = "drop") -> None:
        """Cut the host off: ``"drop"`` (silence, timeouts) or ``"unreachable"`` (fails at once)."""
        if mode == "drop":
            ip("-n", self.name, "link", "set", NS_IFNAME, "down")
        elif mode == "unreachable":
            ip("link", "set", self.veth, "down")
        else:
            raise ValueError(f"cut mode must be 'drop' or 'unreachable', not {mode!r}")
        self.cut_mode = mode

    def restore(self, timeout: float = 5) -> None:
        """Bring the host back on the network and wait until its route is usable again."""
        ip("link", "set", self.veth, "up")
        ip("-n", self.name, "link", "set", NS_IFNAME, "up")
        self.cut_mode = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = ip("-o", "link", "show", self.veth, check=False).stdout
            route = ip("route", "get", self.address, check=False).stdout
            if "NO-CARRIER" not in state and f"dev {self.veth}" in route:
                return
            time.sleep(0.02)
        raise NetnsError(f"{self.name}: link did not come back in {timeout}s")

    @property
    def is_cut(self) -> bool:
        return self.cut_mode is not None

    def destroy(self) -> None:
        _kill_namespace_processes(self.name)
        ip("link", "del", self.veth, check=False)
        ip("netns", "del", self.name, check=False)

    def __repr__(self) -> str:
        return f"<NetnsHost {self.name} {self.address}{' cut' if self.is_cut else ''}>"


class NetnsLab:
    """A set of test hosts sharing one private /24; make with :meth:`add_hosts`, end with :meth:`destroy`."""

    def __init__(self) -> None:
        reason = netns_unavailable_reason()
        if reason is not None:
            raise NetnsError(reason)
        self.subnet: int | None = None
        self.hosts: list[NetnsHost] = []
        self.destroyed = False

    def _guard_route(self) -> list[str]:
        return ["unreachable", f"{NET_PREFIX}.{self.subnet}.0/24", "metric", str(GUARD_METRIC)]

    def _allocate_subnet(self) -> int:
        """A /24 no interface or route on this machine uses (call under the machine lock)."""
        used = ip("-4", "-o", "addr", "show").stdout + ip("-4", "route", "show", "table", "all").stdout
        start = os.getpid() % 256
        for offset in range(256):
            k = (start + offset) % 256
            if f"{NET_PREFIX}.{k}." not in used:
                return k
        raise NetnsError(f"no free /24 left in {NET_PREFIX}.0.0/16")

    def add_hosts(self, n: int) -> list[NetnsHost]:
        """Create ``n`` more hosts (namespaces up, addresses set); returns them."""
        if self.destroyed:
            raise NetnsError("this lab was destroyed")
        if len(self.hosts) + n > MAX_HOSTS:
            raise NetnsError(f"a lab holds at most {MAX_HOSTS} hosts")
        sweep_stale()
        with _LABS_LOCK:
            _LABS[id(self)] = self
        new: list[NetnsHost] = []
        with _machine_lock():
            if self.subnet is None:
                self.subnet = self._allocate_subnet()
                ip("route", "add", *self._guard_route(), "proto", str(GUARD_PROTO))
            for _ in range(n):
                host = NetnsHost(self, next(_COUNTER), len(self.hosts), self.subnet)
                self.hosts.append(host)
                new.append(host)
                host.create()
        return new

    def destroy(self) -> None:
        """Kill everything in the hosts, delete namespaces, veths and the guard route."""
        if self.destroyed:
            return
        self.destroyed = True
        try:
            for host in self.hosts:
                host.destroy()
            if self.subnet is not None:
                ip("route", "del", *self._guard_route(), check=False)
        finally:
            with _LABS_LOCK:
                _LABS.pop(id(self), None)

    def leftovers(self) -> list[str]:
        """Namespaces or veths of this lab that still exist (should be none after destroy)."""
        names = set(_namespaces()) | set(_links())
        return [name for host in self.hosts for name in (host.name, host.veth) if name in names]


def destroy_all_labs() -> None:
    with _LABS_LOCK:
        labs = list(_LABS.values())
    for lab in labs:
        with contextlib.suppress(Exception):
            lab.destroy()


# Registered after sshd's stop_all, so it runs before it (atexit is last in, first out): the
# namespaces' processes, sshds included, are killed here; stop_all then reaps what is left.
atexit.register(destroy_all_labs)


class NetnsSshd(Sshd):
    """An sshd on port 22 of a :class:`NetnsHost`, with the host's :meth:`cut` and :meth:`restore`."""

    def __init__(self, netns_host: NetnsHost, **kwargs: Any) -> None:
        super().__init__(
            netns_host.address, 22, name=netns_host.name, prefix=netns_host.exec_prefix(), **kwargs
        )
        self.netns_host = netns_host

    @property
    def netns(self) -> str:
        return self.netns_host.name

    @property
    def hostname(self) -> str:
        """What ``hostname`` (and the agent) say inside this host."""
        return self.netns_host.hostname

    def cut(self, mode: str = "drop") -> None:
        self.netns_host.cut(mode)

    def restore(self, timeout: float = 5) -> None:
        self.netns_host.restore(timeout)

    def start(self, timeout: float = 10) -> NetnsSshd:
        if self.netns_host.lab.destroyed:
            raise SshdError(f"{self.name}: its namespace is gone")
        super().start(timeout)
        return self


class NetnsLoopbackSshd(Sshd):
    """An sshd on 127.0.0.1 *inside* a :class:`NetnsHost`: only programs in that namespace reach
    it (its sshd, forwarding for a client it logged in), never this machine directly. A node
    behind a bastion: the bastion is the host's own sshd on its address."""

    def __init__(self, netns_host: NetnsHost, **kwargs: Any) -> None:
        super().__init__("127.0.0.1", name=f"{netns_host.name}-lo", prefix=netns_host.exec_prefix(), **kwargs)
        self.netns_host = netns_host

    def wait_ready(self, timeout: float = 10) -> None:
        """Wait for the banner, asked from inside the namespace (here, 127.0.0.1 is ours)."""
        if not self.running:
            raise SshdError(f"{self.name} exited:\n{self.log_tail()}")
        try:
            probe = subprocess.run(
                [
                    *self.netns_host.exec_prefix(hostname=False),
                    *(sys.executable, "-c", _BANNER_PROBE, self.host, str(self.port), str(timeout)),
                ],
                capture_output=True,
                text=True,
                timeout=timeout + 5,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SshdError(f"{self.name}: the banner probe hung:\n{self.log_tail()}") from None
        if probe.returncode != 0:
            where = f"{self.host}:{self.port} in {self.netns_host.name}"
            said = probe.stderr.strip()
            raise SshdError(f"{self.name} did not answer on {where}: {said}\n{self.log_tail()}")


# Run in the namespace by NetnsLoopbackSshd.wait_ready: connect until an SSH banner comes back.
_BANNER_PROBE = """
import socket, sys, time
host, port, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
last = "no attempt"
while time.monotonic() < deadline:
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.settimeout(2)
            if sock.recv(256).startswith(b"SSH-2.0-"):
                sys.exit(0)
    except OSError as exc:
        last = str(exc)
    time.sleep(0.02)
sys.exit("no banner: " + last)
"""


def make_hosts(lab: NetnsLab, n: int, shared_dir: Path, **sshd_kwargs: Any) -> list[NetnsSshd]:
    """``n`` new hosts in ``lab``, each with a started sshd; one client key and known_hosts for all."""
    keys_path = shared_dir / "id_ed25519"
    if keys_path.exists():
        keys = KeyPair(keys_path, keys_path.with_name("id_ed25519.pub"))
    else:
        keys = generate_keypair(keys_path, "netns-client")
    servers: list[NetnsSshd] = []
    for host in lab.add_hosts(n):
        server = NetnsSshd(
            host,
            workdir=shared_dir / host.name,
            client_keys=keys,
            known_hosts=shared_dir / "known_hosts",
            **sshd_kwargs,
        )
        servers.append(server)
        server.start()
    return servers


__all__: Sequence[str] = (
    "NetnsError",
    "NetnsHost",
    "NetnsLab",
    "NetnsLoopbackSshd",
    "NetnsSshd",
    "destroy_all_labs",
    "make_hosts",
    "netns_unavailable_reason",
    "own_leftovers",
    "sshd_in_netns_unavailable_reason",
    "sweep_stale",
)
