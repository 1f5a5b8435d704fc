"""The simulated fleet as users and the collector meet it: a real process serving real SSH on
127.0.0.1, reached with the fleet's own client code and with OpenSSH's `ssh`.

Every test that starts a fleet stops it in a finally block and checks that no process is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
import typer
from typer.testing import CliRunner

from gpuops.cli import sim as sim_cli
from gpuops.core.model import NotAvailable
from gpuops.fleet.collector import Collector
from gpuops.fleet.source import LIVE, FleetSnapshot, NodeView
from gpuops.fleet.ssh import SshError, SshTarget, connect
from gpuops.fleet.targets import node_targets
from gpuops.node.backends.sim import SimBackend
from gpuops.simfleet import Launched, SimPaths, build_fleet, launch, running_pid, stop
from gpuops.spec import load_fleet

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(
    SSH is None, reason="OpenSSH client missing: bash scripts/install-test-deps.sh"
)


# ---- helpers --------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stop_and_check(directory: Path, pid: int) -> None:
    stop(directory)
    assert not _alive(pid), f"sim fleet process {pid} still running after stop"
    assert running_pid(directory) is None
    paths = SimPaths(directory)
    assert not paths.pid.exists() and not paths.ready.exists()


@pytest.fixture(scope="module")
def silos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    directory = tmp_path_factory.mktemp("silos")
    started = launch(directory, "silos", timeout=60)
    try:
        yield started
    finally:
        _stop_and_check(directory, started.pid)


def _collect(directory: Path, timeout: float = 60.0, settle: float = 0.0) -> tuple[FleetSnapshot, float]:
    """Connect the collector to every node of the fleet.yaml in `directory`; the snapshot once all
    are live (and `settle` seconds more), and the seconds it took to get all live."""
    fleet = load_fleet(directory / "fleet.yaml")
    targets = node_targets(fleet)
    for t in targets:
        assert t.ssh.host_key_policy == "strict"
        assert t.ssh.known_hosts == str(directory / "known_hosts")

    async def run() -> tuple[FleetSnapshot, float]:
        collector = Collector(targets, interval=fleet.interval)
        started = time.monotonic()
        collector.start()
        try:
            deadline = started + timeout
            while True:
                snap = collector.snapshot()
                if all(n.state == LIVE for n in snap.nodes):
                    took = time.monotonic() - started
                    break
                if time.monotonic() > deadline:
                    bad = {n.name: (n.state, n.reason) for n in snap.nodes if n.state != LIVE}
                    raise AssertionError(f"not all nodes live within {timeout}s: {bad}")
                await collector.wait_changed(0.5)
            if settle:
                await asyncio.sleep(settle)
                snap = collector.snapshot()
            return snap, took
        finally:
            await collector.stop()

    return asyncio.run(run())


def _ssh(
    directory: Path,
    port: int,
    *command: str,
    key: Path | None = None,
    user: str | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    assert SSH is not None
    state = json.loads((directory / "simfleet.json").read_text())
    argv = [
        SSH, "-F", "/dev/null", "-T",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={directory / 'known_hosts'}",
        "-o", "IdentitiesOnly=yes",
        "-o", "ConnectTimeout=10",
        "-i", str(key or directory / "id_ed25519"),
        "-p", str(port),
        f"{user or state['user']}@127.0.0.1",
        *command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, input=stdin or "")


def _port(directory: Path, index: int = 0) -> int:
    return int(json.loads((directory / "simfleet.json").read_text())["nodes"][index]["port"])


def _utilization(view: NodeView) -> list[float | None]:
    assert view.sample is not None
    out: list[float | None] = []
    for gpu in view.sample.gpus:
        value = gpu.sample.utilization_gpu_percent if gpu.sample else None
        out.append(None if isinstance(value, NotAvailable) else value)
    return out


# ---- the files --------------------------------------------------------------------------------------


def test_files_written_and_private(silos: Launched) -> None:
    paths = SimPaths(silos.dir)
    for path in (paths.fleet, paths.known_hosts, paths.client_key, paths.client_pub, paths.state, paths.log):
        assert path.is_file(), path
    assert paths.client_key.stat().st_mode & 0o077 == 0
    assert silos.dir.stat().st_mode & 0o077 == 0
    assert paths.pid.read_text().strip() == str(silos.pid) == paths.ready.read_text().strip()
    assert running_pid(silos.dir) == silos.pid

    fleet = load_fleet(paths.fleet)
    assert len(fleet.nodes) == 8
    assert fleet.agent.mode == "installed" and fleet.agent.backend == "sim"
    state = silos.state
    assert [n.name for n in fleet.nodes] == [n["name"] for n in state["nodes"]]
    for node, entry in zip(fleet.nodes, state["nodes"], strict=True):
        assert node.host == "127.0.0.1" and node.port == entry["port"]
        assert node.owner == entry["owner"] and node.owner in fleet.teams
    # Every node's port has the fleet's host key in known_hosts.
    known = asyncssh.read_known_hosts(str(paths.known_hosts))
    for entry in state["nodes"]:
        host_keys, *_ = known.match("127.0.0.1", "127.0.0.1", entry["port"])
        assert len({k.public_data for k in host_keys}) == 1
    unused = max(n["port"] for n in state["nodes"]) + 1
    assert unused in {n["port"] for n in state["nodes"]} or not known.match("127.0.0.1", "", unused)[0]


def test_listens_on_loopback_only(silos: Launched) -> None:
    ports = {int(n["port"]) for n in silos.state["nodes"]}
    listening: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port_hex, 16) in ports:  # LISTEN
                listening[int(port_hex, 16)] = address
    assert set(listening) == ports
    assert set(listening.values()) == {"0100007F"}  # 127.0.0.1, little-endian hex


# ---- the collector ------------------------------------------------------------------------------------


def test_collector_sees_every_node_live_and_the_silos_story(silos: Launched) -> None:
    snap, took = _collect(silos.dir, timeout=60, settle=1.5)
    assert took < 30
    views = {v.name: v for v in snap.nodes}
    assert len(views) == 8
    for name, view in views.items():
        assert view.state == LIVE, (name, view.state, view.reason)
        assert view.hello is not None and view.hello.backend == "sim" and view.hello.hostname == name
        assert view.inventory is not None and view.sample is not None
        assert view.sample.gpus and len(view.sample.gpus) == len(view.inventory.gpus)
        assert all(g.owner == view.owner for g in view.sample.gpus)
        age = view.age(snap.time)
        assert age is not None and age < 3 * snap.interval

    by_owner: dict[str, list[NodeView]] = {}
    for view in views.values():
        assert view.owner is not None
        by_owner.setdefault(view.owner, []).append(view)
    # Idle silos: owned cards at 0% with nothing on them.
    idle = [u for v in by_owner["robotics"] for u in _utilization(v)]
    assert idle and all(u == 0.0 for u in idle)
    assert all(not g.processes for v in by_owner["robotics"] if v.sample for g in v.sample.gpus)
    # The saturated team: every card busy.
    busy = [u for v in by_owner["speech"] for u in _utilization(v)]
    assert busy and all(u is not None and u >= 85.0 for u in busy)
    # Training keeps its cards busy too; inference serves something; notebooks hold memory.
    assert all(u is not None and u >= 85.0 for v in by_owner["vision"] for u in _utilization(v))
    assert any(u is not None and u > 0.0 for v in by_owner["chat"] for u in _utilization(v))
    # The platform node is carved with MIG: utilization n/a, instances with memory figures.
    platform = by_owner["platform"][0]
    assert platform.inventory is not None and platform.sample is not None
    assert all(g.mig is not None and g.mig.current and g.mig.gpu_instances for g in platform.inventory.gpus)
    assert all(g.mig_samples for g in platform.sample.gpus)
    # Other teams' processes run on the platform's slices.
    users = {p.user for g in platform.sample.gpus for p in g.processes}
    assert users and users.isdisjoint(set(silos.state["teams"]["platform"]))


def test_silos_has_queued_work_for_the_saturated_team(silos: Launched) -> None:
    state = silos.state
    queued = {n["name"]: n["queued"] for n in state["nodes"]}
    speech = [n for n in state["nodes"] if n["owner"] == "speech"]
    assert speech and all(len(queued[n["name"]]) >= 2 for n in speech)
    # The same plan rebuilt (same seed, epoch) gives nodes whose backends hold pending workloads.
    plan = build_fleet("silos", len(state["nodes"]), state["seed"], epoch=state["epoch"])
    node = next(n for n in plan.nodes if n.owner == "speech")
    states = [w.state for w in SimBackend(spec=node.spec).workloads()]
    assert states.count("pending") >= 2 and "running" in states


# ---- OpenSSH's client: a real SSH server, and what it refuses ---------------------------------------


@needs_ssh
def test_openssh_client_runs_command_v_gpuops(silos: Launched) -> None:
    result = _ssh(silos.dir, _port(silos.dir), "command -v gpuops")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/usr/local/bin/gpuops"


@needs_ssh
def test_openssh_client_speaks_to_the_agent(silos: Launched) -> None:
    request = json.dumps({"v": 1, "id": 1, "op": "hello", "args": {}}) + "\n"
    result = _ssh(
        silos.dir, _port(silos.dir, 2), "gpuops", "agent", "--stdio", "--backend", "sim", stdin=request
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.splitlines()[0])
    assert reply["ok"] and reply["result"]["hostname"] == silos.state["nodes"][2]["name"]
    assert reply["result"]["backend"] == "sim" and not reply["result"]["backend_error"]


@needs_ssh
def test_the_real_agents_directory_options_start_the_agent(silos: Launched, tmp_path: Path) -> None:
    """A command line written for a real node (state, limiter, MPS control and history given)
    starts the agent; the node's directories stay the fleet's."""
    elsewhere = tmp_path / "elsewhere"
    requests = "".join(
        json.dumps({"v": 1, "id": n, "op": op, "args": {}}) + "\n" for n, op in ((1, "hello"), (2, "config"))
    )
    result = _ssh(
        silos.dir,
        _port(silos.dir, 1),
        "gpuops", "agent", "--stdio", "--backend", "sim",
        "--state-dir", str(elsewhere / "state"),
        f"--limiter-dir={elsewhere / 'limiter'}",
        "--mps-control", "/usr/bin/nvidia-cuda-mps-control",
        "--history-dir", str(elsewhere / "history"),
        stdin=requests,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    replies = {r["id"]: r for r in map(json.loads, result.stdout.splitlines())}
    hello = replies[1]["result"]
    assert hello["hostname"] == silos.state["nodes"][1]["name"] and not hello["backend_error"]
    assert replies[2]["ok"], replies[2]
    assert not replies[2]["result"]["limiter"]["directory"].startswith(str(elsewhere))
    assert not elsewhere.exists()


@needs_ssh
def test_another_backend_is_unavailable_not_a_crash(silos: Launched) -> None:
    request = json.dumps({"v": 1, "id": 1, "op": "hello", "args": {}}) + "\n"
    result = _ssh(silos.dir, _port(silos.dir), "gpuops agent --stdio --backend nvml", stdin=request)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.splitlines()[0])
    assert "not available on a simulated node" in reply["result"]["backend_error"]


@needs_ssh
@pytest.mark.parametrize(
    "command",
    ["ls /", "sh -c 'command -v gpuops'", "python3 -c 'print(1)'", "gpuops; rm -rf /", "$(id)"],
)
def test_unknown_commands_get_127_and_no_shell(silos: Launched, command: str) -> None:
    result = _ssh(silos.dir, _port(silos.dir), command)
    assert result.returncode == 127, (result.returncode, result.stderr)
    assert "command not found" in result.stderr
    assert result.stdout == ""


@needs_ssh
def test_bad_agent_options_are_usage_errors(silos: Launched) -> None:
    result = _ssh(silos.dir, _port(silos.dir), "gpuops agent --stdio --frobnicate")
    assert result.returncode == 2
    assert "No such option" in result.stderr
    result = _ssh(silos.dir, _port(silos.dir), "gpuops agent --backend sim")
    assert result.returncode == 2 and "--stdio" in result.stderr


@needs_ssh
def test_interactive_shell_refused(silos: Launched) -> None:
    result = _ssh(silos.dir, _port(silos.dir))  # no command: a shell request
    assert result.returncode != 0
    assert result.stdout == ""


@needs_ssh
def test_wrong_key_and_wrong_user_refused(silos: Launched, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    result = _ssh(silos.dir, _port(silos.dir), "command -v gpuops", key=other)
    assert result.returncode == 255
    assert "Permission denied" in result.stderr
    result = _ssh(silos.dir, _port(silos.dir), "command -v gpuops", user="mallory")
    assert result.returncode == 255
    assert "Permission denied" in result.stderr


def test_fleet_client_refuses_unknown_host_and_wrong_key(silos: Launched, tmp_path: Path) -> None:
    port = _port(silos.dir)
    user = silos.state["user"]
    good = SshTarget(
        host="127.0.0.1",
        port=port,
        user=user,
        identity_files=(str(silos.dir / "id_ed25519"),),
        known_hosts=str(silos.dir / "known_hosts"),
        use_ssh_config=False,
        connect_timeout=10,
        login_timeout=10,
    )
    other_key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "other").write_bytes(other_key.export_private_key())
    (tmp_path / "other").chmod(0o600)  # a key others can read is refused, as OpenSSH refuses it
    (tmp_path / "empty_known_hosts").write_text("")

    async def attempt(target: SshTarget) -> str:
        try:
            conn = await connect(target)
        except SshError as exc:
            return exc.kind
        conn.close()
        await conn.wait_closed()
        return "ok"

    async def run() -> list[str]:
        return [
            await attempt(good),
            await attempt(SshTarget(**{**good.__dict__, "known_hosts": str(tmp_path / "empty_known_hosts")})),
            await attempt(SshTarget(**{**good.__dict__, "identity_files": (str(tmp_path / "other"),)})),
        ]

    assert asyncio.run(run()) == ["ok", "host_key_unknown", "auth"]


def test_connections_and_sessions_are_bounded(silos: Launched) -> None:
    port = _port(silos.dir, 5)
    user = silos.state["user"]

    async def connect_one() -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            "127.0.0.1",
            port,
            username=user,
            client_keys=[str(silos.dir / "id_ed25519")],
            known_hosts=str(silos.dir / "known_hosts"),
            config=None,
        )

    async def run() -> None:
        conns = [await connect_one() for _ in range(8)]
        try:
            with pytest.raises(asyncssh.DisconnectError, match="too many connections"):
                extra = await connect_one()
                await extra.run("command -v gpuops")
            # 4 sessions per connection; a closed one frees its slot.
            procs = [await conns[0].create_process("gpuops agent --stdio --backend sim") for _ in range(4)]
            with pytest.raises(asyncssh.ChannelOpenError):
                await conns[0].create_process("command -v gpuops")
            procs[0].close()
            await procs[0].wait_closed()
            await asyncio.sleep(0.2)
            result = await conns[0].run("command -v gpuops")
            assert result.exit_status == 0
            for proc in procs[1:]:
                proc.close()
        finally:
            for conn in conns:
                conn.close()
                await conn.wait_closed()

    asyncio.run(run())


# ---- gpuops sim up / status / down --------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    sim_cli.register(app)
    return app


def test_cli_up_status_down(tmp_path: Path) -> None:
    app, runner = _app(), CliRunner()
    directory = tmp_path / "fleet"
    result = runner.invoke(app, ["sim", "up", "--nodes", "3", "--dir", str(directory), "--seed", "4"])
    assert result.exit_code == 0, result.output
    pid = running_pid(directory)
    assert pid
    try:
        out = result.output
        assert "3 nodes" in out and "sim-vision-01" in out and "sim-robotics-01" in out
        assert f"gpuops discover -f {directory / 'fleet.yaml'}" in out
        assert f"gpuops sim down --dir {directory}" in out
        assert len(load_fleet(directory / "fleet.yaml").nodes) == 3

        again = runner.invoke(app, ["sim", "up", "--dir", str(directory)])
        assert again.exit_code == 1
        assert "already runs" in again.output and str(pid) in again.output
        assert running_pid(directory) == pid

        status = runner.invoke(app, ["sim", "status", "--dir", str(directory)])
        assert status.exit_code == 0 and f"pid {pid}" in status.output
    finally:
        down = runner.invoke(app, ["sim", "down", "--dir", str(directory)])
    assert down.exit_code == 0, down.output
    assert "stopped" in down.output
    assert not _alive(pid)
    assert not (directory / "simfleet.pid").exists() and not (directory / "ready").exists()
    assert "stopping" in (directory / "simfleet.log").read_text()

    again = runner.invoke(app, ["sim", "down", "--dir", str(directory)])
    assert again.exit_code == 0 and "no simulated fleet runs" in again.output
    status = runner.invoke(app, ["sim", "status", "--dir", str(directory)])
    assert status.exit_code == 1


def test_sim_queue_after_down_is_no_queue(tmp_path: Path) -> None:
    """Issue 18 item 10: the demand.json a stopped fleet leaves behind is not its queue: exit 1, one line."""
    from tests.integration.test_plan_apply import gpuops

    directory = tmp_path / "fleet"
    up = gpuops("sim", "up", "--nodes", "3", "--dir", str(directory), "--queue-speed", "600")
    assert up.returncode == 0, up.stderr
    try:
        deadline = time.monotonic() + 20
        while not (directory / "demand.json").exists():
            assert time.monotonic() < deadline, "the scheduler wrote no demand.json"
            time.sleep(0.2)
        running = gpuops("sim", "queue", "--dir", str(directory))
        assert running.returncode == 0, running.stderr
        assert running.stdout.startswith("Queued work")
    finally:
        down = gpuops("sim", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    for extra in ((), ("--json",)):
        stale = gpuops("sim", "queue", "--dir", str(directory), *extra)
        assert stale.returncode == 1, stale.stdout
        assert stale.stdout == ""
        assert stale.stderr.strip().count("\n") == 0, stale.stderr
        assert f"no simulated fleet runs in {directory}" in stale.stderr


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    app, runner = _app(), CliRunner()
    for args, code, text in (
        (["--scenario", "huge"], 2, "unknown scenario 'huge'"),
        (["--nodes", "0"], 2, "--nodes must be between 1 and"),
        (["--base-port", "65530", "--nodes", "8"], 2, "no room for 8 consecutive ports"),
    ):
        result = runner.invoke(app, ["sim", "up", "--dir", str(tmp_path), *args])
        assert result.exit_code == code, result.output
        assert text in result.output
        assert "Traceback" not in result.output
    assert running_pid(tmp_path) is None


def test_start_failure_names_the_cause(tmp_path: Path) -> None:
    # A port that is taken: the fleet process exits and `up` shows the log's last line.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if port > 65000:
            pytest.skip("ephemeral port too high for a consecutive range")
        result = CliRunner().invoke(
            _app(), ["sim", "up", "--dir", str(tmp_path), "--nodes", "2", "--base-port", str(port)]
        )
    assert result.exit_code == 1, result.output
    assert "exited with status 1" in result.output and "in use" in result.output
    assert running_pid(tmp_path) is None


# ---- scenarios ----------------------------------------------------------------------------------------


def test_scenarios_are_deterministic_and_valid() -> None:
    for scenario, count in (("silos", None), ("silos", 19), ("large", 300)):
        a = build_fleet(scenario, count, seed=7, epoch=1_700_000_000)
        b = build_fleet(scenario, count, seed=7, epoch=1_700_000_000)
        assert a == b and [n.spec for n in a.nodes] == [n.spec for n in b.nodes]
        names = [n.name for n in a.nodes]
        assert len(set(names)) == len(names)
        assert {n.owner for n in a.nodes} <= set(a.teams)
        for node in a.nodes:
            backend = SimBackend(spec=node.spec)
            assert backend.sample().hostname == node.name
    seven, eight = build_fleet("large", 300, seed=7), build_fleet("large", 300, seed=8)
    assert [n.spec for n in seven.nodes] != [n.spec for n in eight.nodes]
    large = build_fleet("large", 1000)
    assert {n.profile for n in large.nodes} == {
        "training",
        "inference",
        "notebooks",
        "mig",
        "saturated",
        "idle",
    }
    assert len(large.teams) >= 40


# ---- large --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_large_200_nodes_start_and_all_answer(tmp_path: Path) -> None:
    started = launch(tmp_path, "large", 200, timeout=60)
    try:
        assert started.seconds < 20, f"200 nodes took {started.seconds:.1f}s to listen"
        assert len(started.state["nodes"]) == 200
        snap, took = _collect(tmp_path, timeout=90)
        assert took < 60, f"200 nodes took {took:.1f}s to be live"
        assert all(v.sample is not None and v.sample.gpus for v in snap.nodes)
        assert {v.hello.hostname for v in snap.nodes if v.hello} == {
            n["name"] for n in started.state["nodes"]
        }
    finally:
        _stop_and_check(tmp_path, started.pid)


def test_status_says_how_far_the_simulated_pasts_are(tmp_path: Path) -> None:
    """Issue 18 item 9: a first `tenants --window 7d` right after `sim up` waits for the nodes'
    simulated pasts; `sim status` says how far they are, and when every node has its week."""
    app, runner = _app(), CliRunner()
    directory = tmp_path / "fleet"
    up = runner.invoke(app, ["sim", "up", "--nodes", "3", "--dir", str(directory)])
    assert up.exit_code == 0, up.output
    try:
        assert "  history:  " in up.output  # 0 to 3 of 3 built by then: the line is there
        deadline = time.monotonic() + 60
        while True:
            status = runner.invoke(app, ["sim", "status", "--dir", str(directory)])
            assert status.exit_code == 0, status.output
            if "history:  7 days on every node" in status.output:
                break
            assert "7-day pasts being built: " in status.output and " of 3 nodes" in status.output
            assert time.monotonic() < deadline, status.output
            time.sleep(0.2)
        doc = json.loads(runner.invoke(app, ["sim", "status", "--dir", str(directory), "--json"]).output)
        assert doc["history"] == {"nodes": 3, "built": 3, "days": 7.0, "background": True}
    finally:
        runner.invoke(app, ["sim", "down", "--dir", str(directory)])
