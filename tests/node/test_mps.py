"""MPS control and the per-device MPS apply, against real processes.

`BinaryMpsControl` runs tests/node/fake_nvidia_cuda_mps_control, which speaks the command
language of `nvidia-cuda-mps-control` and starts a real background daemon (pid file in the pipe
directory) with one real process per MPS server; clients are real `sleep` processes connected
with the fake's `--fake-client`. The forced paths (which end clients) run on the simulated
backend, whose MPS lives in memory and whose processes are the simulated workloads.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuops.core import protocol as proto
from gpuops.core.codec import decode_args
from gpuops.node.backends.sim import SimBackend
from gpuops.node.mps import (
    FAILED,
    NOT_FOUND,
    NOT_RUNNING,
    PID_FILE,
    BinaryMpsControl,
    GiB,
    InMemoryMpsControl,
    MiB,
    MpsError,
    format_mem_limit,
    parse_mem_limit,
    pid_alive,
)
from gpuops.node.mps_apply import MpsApplyError, MpsRecord, apply_mps, live_config

FAKE = str(Path(__file__).with_name("fake_nvidia_cuda_mps_control"))
ME = pwd.getpwuid(os.getuid()).pw_name
MY_UID = os.getuid()


def _spec(workloads: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "hostname": "n1",
        "users": {"alice": 1001, "bob": 1002},
        "tenants": {"vision": ["alice"], "nlp": ["bob"]},
        "gpus": [
            {"model": "H100-80GB"},
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": ["3g.20gb:4", "2g.10gb:0"]}},
        ],
        "workloads": workloads or [],
    }


def _kill_daemon(pipe: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int((pipe / PID_FILE).read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[Callable[[str], tuple[str, str]]]:
    """Pipe and log directories per name; every daemon left in them is ended afterwards."""
    made: list[Path] = []

    def make(name: str) -> tuple[str, str]:
        pipe = tmp_path / "pipe" / name
        made.append(pipe)
        return str(pipe), str(tmp_path / "log" / name)

    yield make
    for pipe in made:
        _kill_daemon(pipe)


@pytest.fixture
def client() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """A real process connected to the daemon of a pipe directory as an MPS client."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(pipe: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sleep", "600"])
        procs.append(proc)
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped the moment it ends
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe)
        subprocess.run([FAKE, "--fake-client", str(proc.pid)], env=env, check=True, timeout=30)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()


def _change(device: str, pipe: str, log: str | None, **kw: Any) -> proto.MpsChange:
    """One change as the protocol validates it."""
    item: dict[str, Any] = {"gpu": 0, "device": device, "enabled": True, "pipe_directory": pipe}
    if log is not None:
        item["log_directory"] = log
    item.update(kw)
    return decode_args(proto.MpsApplyRequest, "mps_apply", {"changes": [item]}).changes[0]


# --------------------------------------------------------------------------- values


def test_memory_limits_are_written_and_read_as_mps_does() -> None:
    assert format_mem_limit(2 * GiB) == "2G"
    assert format_mem_limit(512 * MiB) == "512M"
    assert format_mem_limit(1536 * MiB) == "1536M"
    assert format_mem_limit(500_000_000) == "476M"  # whole MiB, rounded down
    with pytest.raises(ValueError):
        format_mem_limit(1000)
    assert parse_mem_limit("2G\n") == 2 * GiB
    assert parse_mem_limit("2048M") == 2 * GiB
    assert parse_mem_limit("512MB") == 512 * MiB
    assert parse_mem_limit("") is None
    assert parse_mem_limit("0") is None
    with pytest.raises(MpsError):
        parse_mem_limit("lots")


# --------------------------------------------------------------------------- the binary


def test_binary_control_against_the_fake(dirs: Callable[[str], tuple[str, str]], tmp_path: Path) -> None:
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    assert control.daemon_pid(pipe) is None
    assert control.read(pipe) is None
    with pytest.raises(MpsError) as info:
        control.server_list(pipe)
    assert info.value.code == NOT_RUNNING

    pid = control.start_daemon(pipe, log, "GPU-test-0")
    assert (Path(pipe) / PID_FILE).read_text().strip() == str(pid)
    assert control.daemon_pid(pipe) == pid and pid_alive(pid)
    with pytest.raises(MpsError) as info:
        control.start_daemon(pipe, log, "GPU-test-0")
    assert info.value.code == FAILED and "already running" in info.value.message

    daemon = control.read(pipe)
    assert daemon is not None
    assert (daemon.default_active_thread_percentage, daemon.default_pinned_memory_limit) == (100.0, None)
    assert daemon.servers == ()

    control.set_default_active_thread_percentage(pipe, 40)
    control.set_default_pinned_mem_limit(pipe, 2 * GiB)
    # The device is ordinal 0 inside the daemon, or its UUID (CUDA_VISIBLE_DEVICES reached it).
    assert control.default_pinned_mem_limit(pipe, "GPU-test-0") == 2 * GiB
    server = control.start_server(pipe, MY_UID)
    assert server is not None and pid_alive(server)
    assert control.server_list(pipe) == [server]
    assert control.server_uid(pipe, server) == MY_UID
    # A server takes the defaults it starts with; later defaults are for later servers only.
    control.set_default_active_thread_percentage(pipe, 60)
    assert control.active_thread_percentage(pipe, server) == 40.0
    assert control.pinned_mem_limit(pipe, server) == 2 * GiB
    control.set_active_thread_percentage(pipe, server, 25)
    control.set_pinned_mem_limit(pipe, server, 512 * MiB)
    daemon = control.read(pipe)
    assert daemon is not None
    assert daemon.default_active_thread_percentage == 60.0
    (only,) = daemon.servers
    assert (only.pid, only.uid, only.active_thread_percentage, only.pinned_memory_limit, only.clients) == (
        server,
        MY_UID,
        25.0,
        512 * MiB,
        (),
    )
    assert f"Starting new server {server}" in (Path(log) / "control.log").read_text()

    for bad in (
        "set_default_active_thread_percentage 0",
        "set_default_active_thread_percentage lots",
        "set_default_device_pinned_mem_limit 0 2X",
        "set_default_device_pinned_mem_limit 7 2G",
        "set_active_thread_percentage 1 50",
        "no_such_command",
    ):
        with pytest.raises(MpsError) as info:
            control.command(pipe, bad)
        assert info.value.code == FAILED, bad

    control.quit(pipe)
    assert control.daemon_pid(pipe) is None
    assert not (Path(pipe) / PID_FILE).exists()
    assert not pid_alive(server)
    with pytest.raises(MpsError) as info:
        control.command(pipe, "get_server_list")
    assert info.value.code == NOT_RUNNING


def test_quit_waits_for_the_clients(
    dirs: Callable[[str], tuple[str, str]], client: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    control.start_daemon(pipe, log, "GPU-test-0")
    proc = client(pipe)
    daemon = control.read(pipe)
    assert daemon is not None
    (server,) = daemon.servers
    assert server.clients == (proc.pid,) and server.uid == MY_UID
    assert daemon.clients() == [(proc.pid, MY_UID)]
    with pytest.raises(MpsError) as info:
        control.quit(pipe, timeout=0.5)
    assert info.value.code == FAILED and "did not end" in info.value.message
    assert control.daemon_pid(pipe) is not None
    proc.kill()
    assert control.wait_stopped(pipe, 10)


def test_a_missing_binary_is_mps_unavailable(dirs: Callable[[str], tuple[str, str]]) -> None:
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl("/nonexistent/nvidia-cuda-mps-control")
    with pytest.raises(MpsError) as info:
        control.start_daemon(pipe, log, "GPU-x")
    assert info.value.code == NOT_FOUND


# --------------------------------------------------------------------------- the in-memory one


def test_in_memory_control_has_the_same_semantics() -> None:
    control = InMemoryMpsControl()
    pipe = "/run/mps/GPU-a"
    with pytest.raises(MpsError) as info:
        control.command(pipe, "get_server_list")
    assert info.value.code == NOT_RUNNING
    pid = control.start_daemon(pipe, "/var/log/mps", "GPU-a")
    assert control.daemon_pid(pipe) == pid
    control.set_default_active_thread_percentage(pipe, 50)
    control.connect(pipe, 4242, 1001)  # a client of user 1001: its server starts on demand
    (first,) = control.server_list(pipe)
    assert control.server_uid(pipe, first) == 1001
    assert control.active_thread_percentage(pipe, first) == 50.0
    control.set_default_active_thread_percentage(pipe, 20)  # next server only
    assert control.active_thread_percentage(pipe, first) == 50.0
    # One user's server at a time: user 1002's client waits until 1001's clients are done.
    control.connect(pipe, 4343, 1002)
    assert control.server_list(pipe) == [first]
    control.disconnect(pipe, 4242)
    (second,) = control.server_list(pipe)
    assert second != first and control.server_uid(pipe, second) == 1002
    assert control.client_list(pipe, second) == [4343]
    assert control.active_thread_percentage(pipe, second) == 20.0
    control.set_default_pinned_mem_limit(pipe, 3 * GiB, device="GPU-a")
    assert control.default_pinned_mem_limit(pipe) == 3 * GiB
    for bad in ("bogus", "set_default_active_thread_percentage 101", "get_client_list 1"):
        with pytest.raises(MpsError):
            control.command(pipe, bad)
    control.command(pipe, "quit")
    assert control.daemon_pid(pipe) == pid  # still has a client
    control.disconnect(pipe, 4343)
    assert control.daemon_pid(pipe) is None


# --------------------------------------------------------------------------- apply


def test_apply_starts_sets_defaults_and_tenant_servers_then_is_a_no_op(
    dirs: Callable[[str], tuple[str, str]], tmp_path: Path
) -> None:
    backend = SimBackend(_spec())
    uuid = backend.inventory().gpus[0].info.uuid
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    record = MpsRecord(str(tmp_path / "state"))
    change = _change(
        uuid,
        pipe,
        log,
        active_thread_percentage=50,
        pinned_memory_limit=2 * GiB,
        tenants=[{"name": "vision", "users": [ME], "active_thread_percentage": 30}],
    )
    done = apply_mps(backend, control, record, change)
    assert done.changed is True
    assert [a.split(" (")[0] for a in done.actions] == [
        "started the MPS daemon",
        "set the default active thread percentage to 50",
        "set the default pinned memory limit to 2048 MiB",
        "started the MPS server",
        f"set the active thread percentage of server {control.server_list(pipe)[0]} to 30",
    ]
    daemon = control.read(pipe)
    assert daemon is not None
    assert (daemon.default_active_thread_percentage, daemon.default_pinned_memory_limit) == (50.0, 2 * GiB)
    (server,) = daemon.servers
    assert (server.uid, server.active_thread_percentage, server.pinned_memory_limit) == (
        MY_UID,
        30.0,
        2 * GiB,
    )

    again = apply_mps(backend, control, record, change)
    assert (again.changed, again.actions) == (False, ())

    (entry,) = live_config(backend.user_name, control, record)
    assert entry["device"] == uuid and entry["gpu"] == 0 and entry["managed"] is True
    assert entry["running"] is True and entry["pid"] == daemon.pid
    assert (entry["active_thread_percentage"], entry["pinned_memory_limit"]) == (50, 2 * GiB)
    assert entry["tenants"] == {
        "vision": {"users": [ME], "active_thread_percentage": 30, "pinned_memory_limit": None}
    }
    assert entry["servers"] == [
        {
            "pid": server.pid,
            "uid": MY_UID,
            "user": ME,
            "active_thread_percentage": 30,
            "pinned_memory_limit": 2 * GiB,
            "clients": [],
        }
    ]


def test_refusals_before_anything_changes(dirs: Callable[[str], tuple[str, str]], tmp_path: Path) -> None:
    backend = SimBackend(_spec())
    gpus = backend.inventory().gpus
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    record = MpsRecord(str(tmp_path / "state"))
    mig_device = gpus[1].mig.gpu_instances[0].compute_instances[0].uuid  # type: ignore[union-attr]
    cases = [
        (
            _change(gpus[0].info.uuid, pipe, log, tenants=[{"name": "t", "users": ["nosuchuser"]}]),
            "unknown_user",
        ),
        (_change(gpus[0].info.uuid, pipe, log, gpu=7), "no_such_gpu"),
        (_change(gpus[1].info.uuid, pipe, log), "no_such_device"),  # GPU 1's UUID given for GPU 0
        (_change(gpus[1].info.uuid, pipe, log, gpu=1), "invalid_device"),  # MIG on: per MIG device
        (_change(mig_device, pipe, log), "no_such_device"),  # GPU 1's MIG device, not GPU 0's
    ]
    for change, code in cases:
        with pytest.raises(MpsApplyError) as info:
            apply_mps(backend, control, record, change)
        assert info.value.code == code, (code, info.value.message)
    assert "nosuchuser" in str(cases[0][0])
    assert control.daemon_pid(pipe) is None and record.load() == {}
    # A missing control binary is said as such.
    with pytest.raises(MpsApplyError) as info:
        apply_mps(
            backend, BinaryMpsControl("/nonexistent/mps"), record, _change(gpus[0].info.uuid, pipe, log)
        )
    assert info.value.code == "mps_unavailable"


def test_mig_devices_get_a_daemon_each(dirs: Callable[[str], tuple[str, str]], tmp_path: Path) -> None:
    backend = SimBackend(_spec())
    gpu = backend.inventory().gpus[1]
    assert gpu.mig is not None
    devices = [ci.uuid for gi in gpu.mig.gpu_instances for ci in gi.compute_instances]
    control = InMemoryMpsControl()
    record = MpsRecord(str(tmp_path / "state"))
    for n, device in enumerate(devices):
        pipe, log = dirs(device)
        done = apply_mps(
            backend, control, record, _change(device, pipe, log, gpu=1, active_thread_percentage=40 + n)
        )
        assert done.changed is True
    assert sorted(control.devices().values()) == sorted(devices)
    assert set(record.load()) == set(devices)
    # Two devices cannot share a pipe directory.
    pipe0 = record.load()[devices[0]]["pipe_directory"]
    with pytest.raises(MpsApplyError) as info:
        apply_mps(backend, control, record, _change(gpu.info.uuid, pipe0, "/tmp/log", gpu=1, enabled=False))
    assert info.value.code == "conflict"


@pytest.mark.slow
def test_changes_that_would_disrupt_clients_are_refused_with_pids_and_users(
    dirs: Callable[[str], tuple[str, str]],
    client: Callable[[str], subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    backend = SimBackend(_spec())
    uuid = backend.inventory().gpus[0].info.uuid
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    record = MpsRecord(str(tmp_path / "state"))
    tenant = {"name": "vision", "users": [ME], "active_thread_percentage": 30}
    apply_mps(
        backend, control, record, _change(uuid, pipe, log, active_thread_percentage=50, tenants=[tenant])
    )
    proc = client(pipe)  # connects to the pre-started server of its user
    before = control.read(pipe)
    assert before is not None and before.clients() == [(proc.pid, MY_UID)]

    # The tenant's server runs with clients: a new value would reach new clients only.
    wanted = _change(
        uuid, pipe, log, active_thread_percentage=50, tenants=[dict(tenant, active_thread_percentage=20)]
    )
    with pytest.raises(MpsApplyError) as info:
        apply_mps(backend, control, record, wanted)
    assert info.value.code == "in_use"
    assert f"pid {proc.pid} ({ME})" in info.value.message and "--force" in info.value.message
    assert info.value.clients == (proto.MpsClient(pid=proc.pid, user=ME, server=before.servers[0].pid),)
    # Stopping MPS would end them too.
    with pytest.raises(MpsApplyError) as info:
        apply_mps(backend, control, record, _change(uuid, pipe, None, enabled=False))
    assert info.value.code == "in_use"
    assert control.read(pipe) == before  # nothing changed
    assert proc.poll() is None

    # A new default reaches later servers only and leaves the tenant's server alone: allowed.
    done = apply_mps(
        backend, control, record, _change(uuid, pipe, log, active_thread_percentage=70, tenants=[tenant])
    )
    assert done.changed is True and list(done.actions) == ["set the default active thread percentage to 70"]
    after = control.read(pipe)
    assert after is not None and after.servers == before.servers

    # Once the client is gone the change is plain.
    proc.kill()
    deadline = time.monotonic() + 10
    while control.read(pipe).clients() and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    done = apply_mps(backend, control, record, wanted)
    assert done.changed is True
    assert list(done.actions) == [
        "set the default active thread percentage to 50",
        f"set the active thread percentage of server {before.servers[0].pid} to 20",
    ]
    # Disabled: the daemon ends and gpuops forgets the device.
    done = apply_mps(backend, control, record, _change(uuid, pipe, None, enabled=False))
    assert done.changed is True and list(done.actions) == [f"stopped the MPS daemon (pid {before.pid})"]
    assert control.daemon_pid(pipe) is None and record.load() == {}
    assert apply_mps(backend, control, record, _change(uuid, pipe, None, enabled=False)).changed is False


def test_a_removed_limit_restarts_an_idle_daemon(
    dirs: Callable[[str], tuple[str, str]], tmp_path: Path
) -> None:
    backend = SimBackend(_spec())
    uuid = backend.inventory().gpus[0].info.uuid
    pipe, log = dirs("gpu0")
    control = BinaryMpsControl(FAKE)
    record = MpsRecord(str(tmp_path / "state"))
    apply_mps(backend, control, record, _change(uuid, pipe, log, pinned_memory_limit=GiB))
    first = control.daemon_pid(pipe)
    done = apply_mps(backend, control, record, _change(uuid, pipe, log))
    # MPS has no command that removes a limit: a fresh daemon has none.
    assert done.changed is True and [a.split(" (")[0] for a in done.actions] == [
        "stopped the MPS daemon",
        "started the MPS daemon",
    ]
    daemon = control.read(pipe)
    assert daemon is not None and daemon.pid != first and daemon.default_pinned_memory_limit is None


def _sim_with_late_workload(clock: list[float]) -> SimBackend:
    """alice's training starts an hour after the epoch, on GPU 0."""
    spec = _spec([{"name": "train", "kind": "training", "user": "alice", "gpu": 0, "start": "1h"}])
    spec["epoch"] = 1_700_000_000
    return SimBackend(spec, clock=lambda: clock[0])


def test_forced_changes_end_the_clients_and_restart_the_daemon(tmp_path: Path) -> None:
    clock = [1_700_000_000.0]
    backend = _sim_with_late_workload(clock)
    uuid = backend.inventory().gpus[0].info.uuid
    control = backend.mps_control()
    assert isinstance(control, InMemoryMpsControl) and backend.mps_control() is control
    record = MpsRecord(str(tmp_path / "state"))
    pipe, log = "/run/gpuops-test/mps/" + uuid, "/run/gpuops-test/log/" + uuid
    vision = {"name": "vision", "users": ["alice"], "active_thread_percentage": 30}
    apply_mps(backend, control, record, _change(uuid, pipe, log, tenants=[vision]))
    clock[0] += 3600 + 60  # the workload starts: a client of alice's server
    (proc,) = backend.sample().gpus[0].processes
    daemon = control.read(pipe)
    assert daemon is not None and daemon.clients() == [(proc.pid, 1001)]
    assert daemon.servers[0].active_thread_percentage == 30.0

    wanted = _change(uuid, pipe, log, tenants=[dict(vision, active_thread_percentage=10)])
    with pytest.raises(MpsApplyError) as info:
        apply_mps(backend, control, record, wanted)
    assert info.value.code == "in_use" and f"pid {proc.pid} (alice)" in info.value.message

    done = apply_mps(backend, control, record, wanted, force=True)
    assert done.changed is True and done.stopped == (proc.pid,)
    assert [a.split(" (")[0] for a in done.actions] == [
        f"ended MPS clients {proc.pid}",
        "stopped the MPS daemon",
        "started the MPS daemon",
        "started the MPS server",
        f"set the active thread percentage of server {control.server_list(pipe)[0]} to 10",
    ]
    assert backend.sample().gpus[0].processes == ()
    (server,) = control.read(pipe).servers  # type: ignore[union-attr]
    assert (server.uid, server.active_thread_percentage, server.clients) == (1001, 10.0, ())
    assert apply_mps(backend, control, record, wanted, force=True).changed is False


def test_several_tenant_users_on_one_device_are_explained(tmp_path: Path) -> None:
    backend = SimBackend(_spec())
    uuid = backend.inventory().gpus[0].info.uuid
    control = backend.mps_control()
    record = MpsRecord(str(tmp_path / "state"))
    change = _change(
        uuid,
        "/run/mps/" + uuid,
        "/var/log/mps/" + uuid,
        tenants=[
            {"name": "vision", "users": ["alice"], "active_thread_percentage": 30},
            {"name": "nlp", "users": ["bob"], "pinned_memory_limit": GiB},
        ],
    )
    done = apply_mps(backend, control, record, change)
    assert done.changed is True and control.server_list(change.pipe_directory) == []
    (note,) = done.notes
    assert "one user's server at a time" in note
    # bob's server starts on demand with the defaults; the next apply gives it nlp's values.
    assert isinstance(control, InMemoryMpsControl)
    control.connect(change.pipe_directory, 5151, 1002)
    control.disconnect(change.pipe_directory, 5151)
    (server,) = control.server_list(change.pipe_directory)
    assert control.pinned_mem_limit(change.pipe_directory, server) is None
    done = apply_mps(backend, control, record, change)
    assert list(done.actions) == [f"set the pinned memory limit of server {server} to 1024 MiB"]
