"""The sim fleet process, and starting and stopping it in the background.

`python -m gpuops.simfleet serve --dir DIR [--scenario S] [--nodes N] [--seed S]` builds the
scenario, generates keys, listens on 127.0.0.1 (one port per node), writes the files below into
DIR and serves until SIGTERM or SIGINT. `launch()` and `stop()` are what `gpuops sim up/down` call.

Files in DIR (mode 0700):

| file | what |
|---|---|
| `fleet.yaml` | the inventory: one node per simulated node, `agent: {mode: installed, backend: sim}` |
| `known_hosts` | the sim fleet's host key for every node's `[127.0.0.1]:port` |
| `id_ed25519`, `id_ed25519.pub` | the client key, the only one the nodes accept (0600) |
| `simfleet.json` | what runs: pid, scenario, seed, epoch, teams, nodes (SSH and metrics ports, queued work) |
| `demand.json` | the queued work: where each job runs, what is done, per team (demand.py) |
| `state/` | a directory per node (history, limiter, MPS); `pasts.json`: the pasts built so far |
| `prometheus/` | with `--prometheus`: its config, log and storage (prometheus.py) |
| `simfleet.log` | the process's log (and its stdout/stderr when started by `launch`) |
| `simfleet.lock` | held (flock) by the running process: at most one fleet per DIR |
| `simfleet.pid`, `ready` | written when every port listens; removed on a clean exit |

Keys are generated on every start: ports change anyway, and nothing stale is ever trusted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gc
import getpass
import json
import logging
import logging.handlers
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuops.core.atomic_file import atomic_write
from gpuops.simfleet.prometheus import (
    MISSING,
    SimPrometheus,
    SimPrometheusError,
    prometheus_binary,
    rules_files,
)
from gpuops.simfleet.scenarios import DEFAULT_SPEED, SCENARIOS, ScenarioError, SimFleetPlan, build_fleet
from gpuops.simfleet.tether import Lifeline, lifeline_pair, stop_on_sigterm_while_starting

if TYPE_CHECKING:
    import asyncssh

# What only the fleet process needs (asyncssh, the node agents, the backends, the recorders) is
# imported where it serves (`_serve`): `gpuops sim up/down/status`, the processes that call
# `launch` and `stop`, and the workers that build pasts (history.py) skip a quarter of a second
# of imports each.

log = logging.getLogger("gpuops.simfleet")

HOST = "127.0.0.1"
KNOWN_HOSTS_PER_LINE = 64  # hosts per known_hosts line: one key parse covers many nodes
STATE_VERSION = 1
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
MAX_QUEUE_SPEED = 100000.0  # a 12 h job in half a second: faster says nothing


class SimFleetError(Exception):
    """Starting or stopping failed; the message is one line for a person."""


@dataclass(frozen=True)
class SimPaths:
    dir: Path

    @property
    def fleet(self) -> Path:
        return self.dir / "fleet.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def client_pub(self) -> Path:
        return self.dir / "id_ed25519.pub"

    @property
    def state(self) -> Path:
        return self.dir / "simfleet.json"

    @property
    def log(self) -> Path:
        return self.dir / "simfleet.log"

    @property
    def lock(self) -> Path:
        return self.dir / "simfleet.lock"

    @property
    def pid(self) -> Path:
        return self.dir / "simfleet.pid"

    @property
    def ready(self) -> Path:
        return self.dir / "ready"


def default_dir() -> Path:
    """`$XDG_RUNTIME_DIR/gpuops-sim`, else `~/.cache/gpuops/sim`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "gpuops-sim"
    return Path.home() / ".cache" / "gpuops" / "sim"


# ---- files -------------------------------------------------------------------------------------


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write atomically with exactly this mode (no fsync: the simulated fleet's files live as long
    as its run)."""
    atomic_write(path, data, mode, durable=False)


def known_hosts_text(ports: Sequence[int], host_key: asyncssh.SSHKey, host: str = HOST) -> str:
    public = host_key.export_public_key("openssh").decode().split()
    key = f"{public[0]} {public[1]}"
    lines = ["# gpuops sim fleet: one host key for every simulated node\n"]
    for i in range(0, len(ports), KNOWN_HOSTS_PER_LINE):
        names = ",".join(f"[{host}]:{p}" for p in ports[i : i + KNOWN_HOSTS_PER_LINE])
        lines.append(f"{names} {key}\n")
    return "".join(lines)


def fleet_document(plan: SimFleetPlan, ports: dict[str, int], paths: SimPaths, user: str) -> dict[str, Any]:
    """fleet.yaml as plain data (the schema of docs/fleet-yaml.md)."""
    return {
        "version": 1,
        "ssh": {
            "user": user,
            "identity_file": str(paths.client_key),
            "known_hosts": str(paths.known_hosts),
            "host_key_policy": "strict",
        },
        "agent": {"mode": "installed", "backend": "sim"},
        "interval": "1s",
        "teams": {team: {"users": list(users)} for team, users in plan.teams.items()},
        "nodes": [
            {
                "name": node.name,
                "host": HOST,
                "port": ports[node.name],
                "owner": node.owner,
                "labels": dict(node.labels),
            }
            for node in plan.nodes
        ],
    }


def fleet_yaml_text(document: dict[str, Any], plan: SimFleetPlan, path: Path) -> str:
    """fleet.yaml text as the spec package writes it (`dump_fleet`). A document of plain names,
    as every scenario's is, is written here (`plain_fleet_yaml`): the spec package, its models
    and its YAML emitter, were a fifth of the fleet process's CPU at start (0.2 s), for one
    file. Anything else is written by the spec package and checked by its loader. A test
    compares both ways on every scenario and reads the text back with the loader
    (tests/unit/test_simfleet_yaml.py)."""
    comment = (
        f"Written by `gpuops sim up` (scenario {plan.scenario}, seed {plan.seed}, {len(plan.nodes)} nodes);\n"
        "rewritten on every start. Stop the fleet with: gpuops sim down"
    )
    text = plain_fleet_yaml(document, comment)
    if text is not None:
        return text
    from gpuops.spec import dump_fleet, fleet_from_data, parse_fleet

    fleet = fleet_from_data(document, str(path), base_dir=path.parent)
    text = dump_fleet(fleet, comment=comment)
    parse_fleet(text, str(path), base_dir=path.parent)  # what we write, we can read back
    return text


# A string the spec package's emitter writes bare everywhere (inside `{...}` too): a name or path
# of letters, digits and `_./-` that starts with a letter, `_` or `/`, or an IPv4 address, and is
# no YAML word for a boolean or null.
_BARE = re.compile(r"\A(?:[A-Za-z_/][A-Za-z0-9_./-]*|[0-9]{1,3}(?:\.[0-9]{1,3}){3})\Z")
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})
# What the loader checks in the parts that come from outside the scenario (`--user`, `--dir`):
# spec/types.py's USER_RE (a test keeps them the same) and a path length well within MAX_PATH.
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
_MAX_PATH = 1024
_FLOW_WIDTH = 72  # spec/dump.py's: a mapping or list of plain values this short is on one line
_SSH_FIELDS = ("user", "identity_file", "known_hosts", "host_key_policy")
_AGENT_FIELDS = ("mode", "backend")
_NODE_FIELDS = ("name", "host", "port", "labels", "owner")
_DEFAULT_INTERVAL = "1s"  # fleet.yaml's default (spec/model.py), which `dump_fleet` leaves out


def plain_fleet_yaml(document: dict[str, Any], comment: str) -> str | None:
    """`fleet_document`'s fleet.yaml text, the same as `dump_fleet` writes it (the fields in the
    model's order, the defaults left out, short mappings and lists of plain values on one line,
    the emitter's indentation), without the spec package; None where the document holds
    anything else than those fields with names, paths and numbers written bare (then the spec
    package writes it)."""
    ssh, agent, nodes = document.get("ssh"), document.get("agent"), document.get("nodes")
    teams = document.get("teams")
    if (
        set(document) != {"version", "ssh", "agent", "interval", "teams", "nodes"}
        or document["interval"] != _DEFAULT_INTERVAL
        or not isinstance(ssh, dict)
        or set(ssh) != set(_SSH_FIELDS)
        or not isinstance(agent, dict)
        or set(agent) != set(_AGENT_FIELDS)
        or not isinstance(teams, dict)
        or not teams
        or not isinstance(nodes, list)
        or not nodes
        or not isinstance(ssh["user"], str)
        or not _USER.match(ssh["user"])
        or any(len(str(ssh[k])) > _MAX_PATH for k in ("identity_file", "known_hosts"))
    ):
        return None
    data: dict[str, Any] = {
        "version": document["version"],
        "ssh": {k: ssh[k] for k in _SSH_FIELDS},
        "agent": {k: agent[k] for k in _AGENT_FIELDS},
        "teams": {},
        "nodes": [],
    }
    for team, members in teams.items():
        if not isinstance(members, dict) or set(members) != {"users"}:
            return None
        data["teams"][team] = {"users": members["users"]}
    for node in nodes:
        if not isinstance(node, dict) or set(node) != set(_NODE_FIELDS):
            return None
        data["nodes"].append({k: node[k] for k in _NODE_FIELDS})
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    try:
        _block_mapping(data, 0, lines)
    except ValueError:
        return None
    return "\n".join(lines) + "\n"


def _bare(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _BARE.match(value) and value.lower() not in _YAML_WORDS:
        return value
    raise ValueError(value)


def _flow(value: Any) -> str | None:
    """A non-empty mapping or list of plain values whose repr is short, on one line (as
    spec/dump.py's `compact`); None for what goes in a block."""
    if not isinstance(value, (dict, list)) or not value:
        raise ValueError(value)
    items = value.values() if isinstance(value, dict) else value
    if any(isinstance(v, (dict, list)) for v in items) or len(repr(value)) > _FLOW_WIDTH:
        return None
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_bare(k)}: {_bare(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_bare(v) for v in value) + "]"


def _block_mapping(value: dict[str, Any], indent: int, lines: list[str], first: str | None = None) -> None:
    """Each key on a line of its own at `indent` (the first after `first`, a sequence's dash)."""
    for key, item in value.items():
        pad = first if first is not None else " " * indent
        first = None
        if not isinstance(item, (dict, list)):
            lines.append(f"{pad}{_bare(key)}: {_bare(item)}")
            continue
        one_line = _flow(item)
        if one_line is not None:
            lines.append(f"{pad}{_bare(key)}: {one_line}")
            continue
        lines.append(f"{pad}{_bare(key)}:")
        if isinstance(item, dict):
            _block_mapping(item, indent + 2, lines)
        else:
            _block_sequence(item, indent + 2, lines)


def _block_sequence(value: list[Any], indent: int, lines: list[str]) -> None:
    """Each item after a dash at `indent` (mappings' keys at `indent` + 2)."""
    for item in value:
        if isinstance(item, dict):
            if _flow(item) is not None:
                raise ValueError(item)  # a one-line mapping as an item: not in a fleet document
            _block_mapping(item, indent + 2, lines, first=" " * indent + "- ")
        elif isinstance(item, list):
            raise ValueError(item)
        else:
            lines.append(f"{' ' * indent}- {_bare(item)}")


def state_document(
    plan: SimFleetPlan,
    ports: dict[str, int],
    paths: SimPaths,
    user: str,
    metrics_ports: dict[str, int] | None = None,
    prometheus_url: str | None = None,
) -> dict[str, Any]:
    metrics_ports = metrics_ports or {}
    return {
        "version": STATE_VERSION,
        "pid": os.getpid(),
        "started": time.time(),
        "scenario": plan.scenario,
        "seed": plan.seed,
        "epoch": plan.epoch,
        "user": user,
        "host": HOST,
        "fleet": str(paths.fleet),
        # The fleet's own Prometheus (`sim up --prometheus`), else None.
        "prometheus_url": prometheus_url,
        "teams": {team: list(users) for team, users in plan.teams.items()},
        "nodes": [
            {
                "name": node.name,
                "port": ports[node.name],
                # The node's exporter (exporters.py), as `gpuops agent --metrics` on a real node.
                "metrics_port": metrics_ports.get(node.name),
                "owner": node.owner,
                "profile": node.profile,
                "gpus": node.gpu_count,
                "queued": node.queued(),
            }
            for node in plan.nodes
        ],
    }


def read_state(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(SimPaths(directory).state.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---- the lock: at most one fleet per directory -------------------------------------------------


def _try_lock(paths: SimPaths) -> int | None:
    """The locked fd, or None when another process holds the lock."""
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _read_pid(paths: SimPaths) -> int | None:
    try:
        text = paths.pid.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def running_pid(directory: Path) -> int | None:
    """The pid of the fleet running in `directory` (0 if it runs but its pid is not known yet),
    or None when none runs. Decided by the lock, so a stale pid file never counts."""
    paths = SimPaths(directory)
    if not paths.lock.exists():
        return None
    fd = _try_lock(paths)
    if fd is not None:
        os.close(fd)
        return None
    return _read_pid(paths) or 0


# ---- the serving process -----------------------------------------------------------------------


def _utc_offset() -> str:
    seconds = time.localtime().tm_gmtoff
    sign = "+" if seconds >= 0 else "-"
    seconds = abs(seconds)
    return f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"


def _setup_logging(paths: SimPaths) -> None:
    handler = logging.handlers.RotatingFileHandler(paths.log, maxBytes=4 * 1024 * 1024, backupCount=1)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("gpuops")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if sys.stderr.isatty():
        root.addHandler(logging.StreamHandler(sys.stderr))
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("asyncssh").addHandler(handler)


def _raise_fd_limit(nodes: int) -> None:
    """A listener and a few connections per node: lift the soft limit on open files (often 1024)
    towards the hard one when the fleet needs more."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * nodes + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open files limit raised from %d to %d", soft, target)


async def serve(
    directory: Path,
    scenario: str = "silos",
    nodes: int | None = None,
    seed: int = 0,
    user: str | None = None,
    base_port: int = 0,
    queue_speed: float = DEFAULT_SPEED,
    prometheus: bool = False,
    lifeline: Lifeline | None = None,
) -> None:
    """Serve a sim fleet until SIGTERM/SIGINT, or until the process at the other end of
    `lifeline` has ended (the lock must be held by the caller)."""
    paths = SimPaths(directory)
    user = user or getpass.getuser()
    started = time.monotonic()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if lifeline is not None:  # watched from the start: a demo dying while this starts counts
        lifeline.watch(loop, stop.set)
    try:
        await _serve(paths, scenario, nodes, seed, user, base_port, queue_speed, prometheus, stop, started)
    finally:
        if lifeline is not None:
            lifeline.unwatch(loop)
        if stop.is_set() and lifeline is not None and lifeline.cut():
            log.info("the process that started this fleet has ended")


async def _serve(
    paths: SimPaths,
    scenario: str,
    nodes: int | None,
    seed: int,
    user: str,
    base_port: int,
    queue_speed: float,
    prometheus: bool,
    stop: asyncio.Event,
    started: float,
) -> None:
    plan = build_fleet(scenario, nodes, seed, epoch=float(int(time.time())), utc_offset=_utc_offset())

    import asyncssh

    from gpuops.node.backends.sim import SimBackend
    from gpuops.simfleet.demand import Demand
    from gpuops.simfleet.exporters import SimExporters
    from gpuops.simfleet.history import SimHistory
    from gpuops.simfleet.server import SimFleetServer

    _raise_fd_limit(len(plan.nodes))
    backends = [(node.name, SimBackend(spec=node.spec)) for node in plan.nodes]
    host_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuops-sim-host")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuops-sim-client")
    server = SimFleetServer(backends, host_key, client_key, user, host=HOST, state_dir=paths.dir / "state")
    ports = await server.start(base_port)
    exporters = SimExporters(
        backends, server.state_dir, host=HOST, health={node.name: node.health for node in server.nodes}
    )
    try:
        metrics_ports = await exporters.start()
    except BaseException:
        await server.close()
        raise
    scraper: SimPrometheus | None = None
    if prometheus:
        targets = [f"{HOST}:{metrics_ports[node.name]}" for node in plan.nodes]
        scraper = SimPrometheus(paths.dir / "prometheus", targets, rules_files())
        try:
            await scraper.start()
        except BaseException:
            await exporters.close()
            await server.close()
            raise
    # Every node keeps history as `gpuops agent --record` would, and has a simulated past.
    history = SimHistory(
        [
            (node.name, backend, node.spec)
            for node, (_name, backend) in zip(plan.nodes, backends, strict=True)
        ],
        server.state_dir,
    )
    server.history = history
    recording = asyncio.ensure_future(history.run())
    # The batch scheduler that runs queued work where it is granted (demand.py).
    demand = Demand(backends, server.state_dir, paths.dir / "demand.json", speed=queue_speed)
    with contextlib.suppress(OSError):
        (paths.dir / "demand.json").unlink()  # a previous fleet's jobs are not this one's
    scheduling = asyncio.ensure_future(demand.run()) if demand.jobs else None
    try:
        port_list = [ports[node.name] for node in plan.nodes]
        _write(paths.client_key, client_key.export_private_key("openssh"), 0o600)
        _write(paths.client_pub, client_key.export_public_key("openssh"), 0o644)
        _write(paths.known_hosts, known_hosts_text(port_list, host_key), 0o644)
        _write(paths.fleet, fleet_yaml_text(fleet_document(plan, ports, paths, user), plan, paths.fleet))
        _write(
            paths.state,
            json.dumps(
                state_document(
                    plan, ports, paths, user, metrics_ports, scraper.url if scraper is not None else None
                ),
                indent=1,
            )
            + "\n",
        )
        # The fleet's models, servers and recorders live as long as the process: frozen, the
        # cyclic collector stops walking them each time the agents' replies have made enough
        # garbage (an eighth of the CPU of answering a 200-node `history` round).
        gc.freeze()
        _write(paths.pid, f"{os.getpid()}\n")
        _write(paths.ready, f"{os.getpid()}\n")
        log.info(
            "serving %d simulated nodes (scenario %s, seed %d) on %s ports %d-%d as user %s; ready in %.2fs",
            len(plan.nodes),
            plan.scenario,
            plan.seed,
            HOST,
            min(port_list),
            max(port_list),
            user,
            time.monotonic() - started,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping")
    finally:
        for path in (paths.ready, paths.pid):
            with contextlib.suppress(OSError):
                path.unlink()
        for task in (recording, scheduling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if scraper is not None:
            await scraper.stop()
        await exporters.close()
        await server.close()
        history.close()
        log.info("stopped")


def serve_main(
    directory: Path,
    scenario: str,
    nodes: int | None,
    seed: int,
    user: str | None,
    base_port: int,
    queue_speed: float = DEFAULT_SPEED,
    prometheus: bool = False,
    lifeline_fd: int | None = None,
) -> int:
    """Serve in the foreground; with `lifeline_fd` (the read end of a pipe whose write end only
    the starting process holds), only while that process lives, and the directory goes with the
    fleet when that process ends first (tether.py)."""
    directory = directory.expanduser().absolute()
    lifeline = None
    if lifeline_fd is not None:
        try:
            lifeline = Lifeline(lifeline_fd)
        except OSError as exc:
            print(f"error: --lifeline {lifeline_fd}: {exc.strerror}", file=sys.stderr)
            return 2
        stop_on_sigterm_while_starting()
        if lifeline.cut():  # ended before this started: nothing to serve
            shutil.rmtree(directory, ignore_errors=True)
            return 1
    try:
        return _serve_locked(
            directory, scenario, nodes, seed, user, base_port, queue_speed, prometheus, lifeline
        )
    finally:
        if lifeline is not None and lifeline.cut():
            _remove_tree(directory)


def _remove_tree(directory: Path, within: float = 20.0) -> None:
    """rmtree until the directory is gone: threads of this process (recorders, backend workers)
    may still write into it while it is removed, which leaves it half there (ENOTEMPTY)."""
    deadline = time.monotonic() + within
    while True:
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _serve_locked(
    directory: Path,
    scenario: str,
    nodes: int | None,
    seed: int,
    user: str | None,
    base_port: int,
    queue_speed: float,
    prometheus: bool,
    lifeline: Lifeline | None = None,
) -> int:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = SimPaths(directory)
    lock = _try_lock(paths)
    if lock is None:
        pid = _read_pid(paths)
        print(f"error: a simulated fleet already runs in {directory} (pid {pid or '?'})", file=sys.stderr)
        return 1
    try:
        for path in (paths.ready, paths.pid):
            with contextlib.suppress(OSError):
                path.unlink()
        _setup_logging(paths)
        try:
            asyncio.run(
                serve(directory, scenario, nodes, seed, user, base_port, queue_speed, prometheus, lifeline)
            )
        except ScenarioError as exc:
            log.error("%s", exc)
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except SimPrometheusError as exc:
            log.error("%s", exc)
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            log.error("cannot serve: %s", exc)
            print(f"error: cannot serve: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # the log must say why, in one last line
            log.exception("the sim fleet failed")
            log.error("the sim fleet failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:300])
            return 1
        return 0
    finally:
        os.close(lock)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuops.simfleet")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="serve a simulated fleet in the foreground")
    run.add_argument("--dir", type=Path, default=None, help="where to write fleet.yaml, keys, log")
    run.add_argument("--scenario", choices=SCENARIOS, default="silos")
    run.add_argument("--nodes", type=int, default=None)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--user", default=None, help="the login the nodes accept (default: you)")
    run.add_argument(
        "--base-port", type=int, default=0, help="consecutive ports from here (default: free ports)"
    )
    run.add_argument(
        "--queue-speed",
        type=float,
        default=DEFAULT_SPEED,
        help="queued work runs this much faster than real time",
    )
    run.add_argument("--prometheus", action="store_true", help="start a Prometheus scraping the fleet")
    run.add_argument(
        "--lifeline",
        type=int,
        default=None,
        metavar="FD",
        help="stop when the other end of pipe FD closes (its process ended), and remove --dir then "
        "(gpuops demo's fleet)",
    )
    args = parser.parse_args(argv)
    directory = args.dir if args.dir is not None else default_dir()
    return serve_main(
        directory,
        args.scenario,
        args.nodes,
        args.seed,
        args.user,
        args.base_port,
        args.queue_speed,
        args.prometheus,
        args.lifeline,
    )


# ---- starting and stopping it in the background -----------------------------------------------


@dataclass(frozen=True)
class Launched:
    pid: int
    dir: Path
    state: dict[str, Any]
    seconds: float  # from start to ready


def _last_log_line(paths: SimPaths) -> str:
    try:
        with open(paths.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


_lifelines: dict[Path, int] = {}  # a tied fleet's directory -> the write end of its lifeline


def launch(
    directory: Path,
    scenario: str = "silos",
    nodes: int | None = None,
    seed: int = 0,
    user: str | None = None,
    base_port: int = 0,
    timeout: float = READY_TIMEOUT,
    queue_speed: float = DEFAULT_SPEED,
    prometheus: bool = False,
    tied: bool = False,
    fresh: bool = False,
) -> Launched:
    """Start the fleet process detached (own session, stdio to the log) and wait until ready;
    with `prometheus`, the fleet starts its own Prometheus too (prometheus.py); with `tied`, the
    fleet ends, and removes `directory`, when this process dies without stopping it (tether.py).
    The node agents' state (recorded history, the MPS record, a MIG journal) is kept in
    `directory`/state from one run to the next; `fresh` removes it first."""
    count = len(build_fleet(scenario, nodes, seed).nodes)  # a bad scenario or count fails here
    if not (math.isfinite(queue_speed) and 0 < queue_speed <= MAX_QUEUE_SPEED):
        raise ScenarioError(
            f"--queue-speed {queue_speed:g}: give a number above 0 and at most {MAX_QUEUE_SPEED:g}"
        )
    if base_port and not 1 <= base_port <= 65536 - count:
        raise ScenarioError(f"--base-port {base_port} leaves no room for {count} consecutive ports")
    if prometheus and prometheus_binary() is None:
        raise SimFleetError(MISSING)  # before anything starts: nothing to undo
    directory = directory.expanduser().absolute()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = SimPaths(directory)
    pid = running_pid(directory)
    if pid is not None:
        raise SimFleetError(
            f"a simulated fleet already runs in {directory} (pid {pid or '?'}); "
            f"stop it first: gpuops sim down --dir {directory}"
        )
    with contextlib.suppress(OSError):
        paths.ready.unlink()
    if fresh:
        shutil.rmtree(paths.dir / "state", ignore_errors=True)
    argv = [sys.executable, "-m", "gpuops.simfleet", "serve", "--dir", str(directory)]
    argv += ["--scenario", scenario, "--seed", str(seed), "--base-port", str(base_port)]
    argv += ["--queue-speed", repr(float(queue_speed))]
    if nodes is not None:
        argv += ["--nodes", str(nodes)]
    if user:
        argv += ["--user", user]
    if prometheus:
        argv += ["--prometheus"]
    lifeline: tuple[int, int] | None = None
    if tied:
        lifeline = lifeline_pair()
        argv += ["--lifeline", str(lifeline[0])]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # so `-m gpuops...` works from "/"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    started = time.monotonic()
    try:
        with open(paths.log, "ab") as log_file:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                cwd="/",
                env=env,
                start_new_session=True,
                close_fds=True,
                pass_fds=(lifeline[0],) if lifeline is not None else (),
            )
    except BaseException:
        if lifeline is not None:
            os.close(lifeline[1])
        raise
    finally:
        if lifeline is not None:
            os.close(lifeline[0])  # the fleet's end
    if lifeline is not None:
        # Held, never written, until `stop` or the end of this process: the kernel closes it when
        # the last thread of this process is gone, and the fleet reads end of file (tether.py).
        _lifelines[directory] = lifeline[1]
    try:
        return _wait_ready(child, paths, started, timeout)
    except BaseException:
        _release_lifeline(directory)
        raise


def _release_lifeline(directory: Path) -> None:
    fd = _lifelines.pop(directory, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _wait_ready(child: subprocess.Popen[bytes], paths: SimPaths, started: float, timeout: float) -> Launched:
    directory = paths.dir
    deadline = started + timeout
    while True:
        code = child.poll()
        if code is not None:
            line = _last_log_line(paths)
            raise SimFleetError(f"the sim fleet exited with status {code}" + (f": {line}" if line else ""))
        try:
            if paths.ready.read_text().strip() == str(child.pid):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            _terminate(child.pid, STOP_TIMEOUT)
            line = _last_log_line(paths)
            raise SimFleetError(
                f"the sim fleet was not ready within {timeout:g}s"
                + (f" (last log line: {line})" if line else "")
            )
        time.sleep(0.05)
    state = read_state(directory) or {}
    return Launched(child.pid, directory, state, time.monotonic() - started)


def _is_ours(pid: int) -> bool:
    """Whether pid is a sim fleet process (guards against a recycled pid); True where /proc
    cannot tell."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True
    # gpuops.fleet.simfleet: the module's name before it became a layer of its own; a fleet
    # started by an older gpuops, its pid file in DIR, is still stopped by `gpuops sim down`.
    return b"gpuops.simfleet" in cmdline or b"gpuops.fleet.simfleet" in cmdline


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        done, _status = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if done == pid:
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _terminate(pid: int, timeout: float) -> bool:
    """SIGTERM, wait, SIGKILL; True if it ended on SIGTERM."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not _gone(pid):
        time.sleep(0.05)
    return False


def stop(directory: Path, timeout: float = STOP_TIMEOUT) -> str:
    """Stop the fleet in `directory`; idempotent. Returns one line saying what happened."""
    directory = directory.expanduser().absolute()
    paths = SimPaths(directory)
    pid = running_pid(directory)
    if pid is None:
        _release_lifeline(directory)
        for path in (paths.ready, paths.pid):
            with contextlib.suppress(OSError):
                path.unlink()
        return f"no simulated fleet runs in {directory}"
    if pid == 0:
        # Starting: its pid is written once it listens. Wait a little for it.
        deadline = time.monotonic() + timeout
        while pid == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            pid = running_pid(directory)
        if pid is None:
            return f"no simulated fleet runs in {directory}"
        if pid == 0:
            raise SimFleetError(f"a simulated fleet is starting in {directory} but has written no pid yet")
    if not _is_ours(pid):
        raise SimFleetError(f"pid {pid} in {paths.pid} is not a sim fleet process; not stopping it")
    # A tied fleet's lifeline goes first: the fleet then stops and removes its directory itself.
    # Held until after SIGTERM, the fleet checked it while this process still lived and left the
    # directory to it, which was never removed if this process was killed right then.
    _release_lifeline(directory)
    clean = _terminate(pid, timeout)
    for path in (paths.ready, paths.pid):
        with contextlib.suppress(OSError):
            path.unlink()
    how = "stopped" if clean else f"killed (no exit within {timeout:g}s of SIGTERM)"
    return f"simulated fleet in {directory} (pid {pid}) {how}"
