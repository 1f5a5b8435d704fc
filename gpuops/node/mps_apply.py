"""Bringing one device's MPS daemon to what a plan wants, on the node (docs/mps.md).

One control daemon per device — a GPU (`GPU-...`), or a MIG device (`MIG-...`) when MIG is on —
each with its own pipe and log directory. `apply_mps` per device:

1. checks the device belongs to the GPU, resolves tenant users to uids (unknown: `unknown_user`);
2. reads the daemon as it is (defaults, servers, their values and clients);
3. works out what must change. MPS applies values when a server or client starts: defaults go
   to servers started later, a server's values to its clients connecting later. So changing
   what a server with clients runs under (or clearing a limit, or stopping the daemon) would
   leave those clients on the old values or kill them: that is disruptive and refused with
   `in_use` (pids and users) unless forced; forced, the clients are ended first and the daemon
   restarted with the wanted values;
4. sets defaults, per-server values, pre-starts the server of a tenant's user; verifies; on a
   failure puts the old values back (`rolled_back`, or `stuck` when that fails too);
5. records what gpuops manages in `mps.json` in the node state directory, for `config`.

Nothing to change: `changed` false, no action.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpuops.core import protocol as proto
from gpuops.core.atomic_file import atomic_write
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.mps import (
    DEFAULT_PERCENTAGE,
    DEFAULT_PIPE_DIRECTORY,
    MpsControl,
    MpsDaemon,
    MpsError,
    round_mem_limit,
)

RECORD_FILE = "mps.json"
RECORD_VERSION = 1


class MpsApplyError(Exception):
    """The device was not changed (or was put back); `code` says why."""

    def __init__(self, code: str, message: str, clients: Tuple[proto.MpsClient, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.clients = clients


@dataclass(frozen=True)
class Want:
    percentage: float
    pinned: Optional[int]  # bytes, whole MiB; None: no limit


# --------------------------------------------------------------------------- the record


class MpsRecord:
    """`mps.json`: the devices whose daemons gpuops manages, and what it set on them."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, RECORD_FILE)

    def load(self) -> Dict[str, Dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        devices = data.get("devices") if isinstance(data, dict) else None
        if not isinstance(devices, dict):
            return {}
        return {k: v for k, v in devices.items() if isinstance(k, str) and isinstance(v, dict)}

    def save(self, devices: Dict[str, Dict[str, Any]]) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        text = json.dumps({"version": RECORD_VERSION, "devices": devices}, indent=1, sort_keys=True)
        atomic_write(self.path, text, 0o666, umask=True)

    def put(self, device: str, entry: Optional[Dict[str, Any]]) -> bool:
        """Record (or, with None, forget) a device; True when the record changed."""
        devices = self.load()
        if devices.get(device) == entry:
            return False
        if entry is None:
            devices.pop(device, None)
        else:
            devices[device] = entry
        self.save(devices)
        return True


def record_entry(change: proto.MpsChange) -> Dict[str, Any]:
    return {
        "gpu": change.gpu,
        "device": change.device,
        "pipe_directory": change.pipe_directory,
        "log_directory": change.log_directory or "",
        "active_thread_percentage": change.active_thread_percentage,
        "pinned_memory_limit": change.pinned_memory_limit,
        "tenants": {
            t.name: {
                "users": list(t.users),
                "active_thread_percentage": t.active_thread_percentage,
                "pinned_memory_limit": t.pinned_memory_limit,
            }
            for t in change.tenants
        },
    }


# --------------------------------------------------------------------------- apply


def _mps_error(exc: MpsError) -> MpsApplyError:
    return MpsApplyError(exc.code, exc.message)


def _check_device(backend: Backend, change: proto.MpsChange) -> None:
    for gpu in backend.inventory().gpus:
        if gpu.info.index != change.gpu:
            continue
        mig_on = gpu.mig is not None and gpu.mig.current
        if change.device == gpu.info.uuid:
            if mig_on and change.enabled:
                raise MpsApplyError(
                    "invalid_device",
                    "GPU %d has MIG on: MPS runs one daemon per MIG device (MIG-...), not per GPU"
                    % change.gpu,
                )
            return
        mig_devices = [
            ci.uuid
            for gi in (gpu.mig.gpu_instances if gpu.mig is not None else ())
            for ci in gi.compute_instances
        ]
        if change.device in mig_devices:
            return
        raise MpsApplyError(
            "no_such_device",
            "%s is neither GPU %d (%s) nor one of its MIG devices"
            % (change.device, change.gpu, gpu.info.uuid),
        )
    raise MpsApplyError("no_such_gpu", "GPU %d is not on this node" % change.gpu)


def wants(backend: Backend, change: proto.MpsChange) -> Tuple[Want, Dict[int, Tuple[str, Want]]]:
    """The device's defaults, and per uid of a tenant's user (tenant name, values)."""
    default = Want(
        float(change.active_thread_percentage or DEFAULT_PERCENTAGE),
        round_mem_limit(change.pinned_memory_limit),
    )
    per_uid: Dict[int, Tuple[str, Want]] = {}
    unknown = []
    for tenant in change.tenants:
        want = Want(
            float(
                tenant.active_thread_percentage
                if tenant.active_thread_percentage is not None
                else default.percentage
            ),
            round_mem_limit(tenant.pinned_memory_limit)
            if tenant.pinned_memory_limit is not None
            else default.pinned,
        )
        for user in tenant.users:
            uid = backend.user_id(user)
            if uid is None:
                unknown.append("%s (tenant %s)" % (user, tenant.name))
            else:
                per_uid[uid] = (tenant.name, want)
    if unknown:
        raise MpsApplyError("unknown_user", "no such user on this node: %s" % ", ".join(unknown))
    return default, per_uid


def _who(backend: Backend, daemon: MpsDaemon, servers: Optional[List[int]] = None) -> List[proto.MpsClient]:
    out = []
    for server in daemon.servers:
        if servers is not None and server.pid not in servers:
            continue
        user = backend.user_name(server.uid) if server.uid is not None else "?"
        for client in server.clients:
            out.append(proto.MpsClient(pid=client, user=user, server=server.pid))
    return out


def _plan(
    daemon: MpsDaemon, default: Want, per_uid: Dict[int, Tuple[str, Want]]
) -> Tuple[List[Tuple[Any, ...]], bool, List[int]]:
    """(in-place settings, whether only a fresh daemon gets there, servers with clients whose
    values would change)."""
    ops: List[Tuple[Any, ...]] = []
    restart = False
    disrupted: List[int] = []
    if daemon.default_active_thread_percentage != default.percentage:
        ops.append(("default_percentage", default.percentage))
    if daemon.default_pinned_memory_limit != default.pinned:
        if default.pinned is None:
            restart = True  # MPS has no command that removes a limit
        else:
            ops.append(("default_pinned", default.pinned))
    for server in daemon.servers:
        want = per_uid[server.uid][1] if server.uid in per_uid else default
        if (server.active_thread_percentage, server.pinned_memory_limit) == (want.percentage, want.pinned):
            continue
        if server.clients:
            disrupted.append(server.pid)
            continue
        if server.active_thread_percentage != want.percentage:
            ops.append(("percentage", server.pid, want.percentage))
        if server.pinned_memory_limit != want.pinned:
            if want.pinned is None:
                restart = True
            else:
                ops.append(("pinned", server.pid, want.pinned))
    if restart:
        disrupted = [s.pid for s in daemon.servers if s.clients]
    return ops, restart, disrupted


def _run_op(control: MpsControl, pipe: str, op: Tuple[Any, ...]) -> str:
    kind = op[0]
    if kind == "default_percentage":
        control.set_default_active_thread_percentage(pipe, op[1])
        return "set the default active thread percentage to %g" % op[1]
    if kind == "default_pinned":
        control.set_default_pinned_mem_limit(pipe, op[1])
        return "set the default pinned memory limit to %s" % _mib(op[1])
    if kind == "percentage":
        control.set_active_thread_percentage(pipe, op[1], op[2])
        return "set the active thread percentage of server %d to %g" % (op[1], op[2])
    control.set_pinned_mem_limit(pipe, op[1], op[2])
    return "set the pinned memory limit of server %d to %s" % (op[1], _mib(op[2]))


def _mib(value: int) -> str:
    return "%d MiB" % (value >> 20)


class _Applier:
    def __init__(self, backend: Backend, control: MpsControl, change: proto.MpsChange, force: bool) -> None:
        self.backend = backend
        self.control = control
        self.change = change
        self.force = force
        self.pipe = change.pipe_directory
        self.actions: List[str] = []
        self.notes: List[str] = []
        self.stopped: List[int] = []

    def stop_clients(self, daemon: MpsDaemon, why: str) -> None:
        """Refuse (in_use) unless forced; forced, end every client of the daemon."""
        clients = _who(self.backend, daemon)
        if not clients:
            return
        if not self.force:
            listed = ", ".join("pid %d (%s)" % (c.pid, c.user) for c in clients)
            raise MpsApplyError(
                "in_use",
                "%s (GPU %d): %s would disrupt MPS clients %s; --force ends them"
                % (self.change.device, self.change.gpu, why, listed),
                tuple(clients),
            )
        pids = [c.pid for c in clients]
        try:
            left = self.backend.stop_processes(self.change.gpu, pids)
        except BackendError as exc:
            raise MpsApplyError("in_use", "cannot end MPS clients %s: %s" % (pids, exc)) from None
        deadline = time.monotonic() + 10.0
        while not left:  # ended: wait for the daemon to see them go
            now = self.control.read(self.pipe)
            remaining = [c for c, _uid in now.clients() if c in pids] if now is not None else []
            if not remaining or time.monotonic() >= deadline:
                left = remaining
                break
            time.sleep(0.05)
        if left:
            raise MpsApplyError(
                "in_use", "MPS clients %s did not end" % ", ".join(str(p) for p in sorted(set(left)))
            )
        self.stopped.extend(pids)
        self.actions.append("ended MPS clients %s" % ", ".join(str(p) for p in pids))

    def quit(self, daemon: MpsDaemon) -> None:
        self.control.quit(self.pipe)
        self.actions.append("stopped the MPS daemon (pid %d)" % daemon.pid)

    def start(self, default: Want, per_uid: Dict[int, Tuple[str, Want]]) -> None:
        pid = self.control.start_daemon(self.pipe, self.change.log_directory or "", self.change.device)
        self.actions.append("started the MPS daemon (pid %d) for %s" % (pid, self.change.device))
        if default.percentage != DEFAULT_PERCENTAGE:
            self.actions.append(_run_op(self.control, self.pipe, ("default_percentage", default.percentage)))
        if default.pinned is not None:
            self.actions.append(_run_op(self.control, self.pipe, ("default_pinned", default.pinned)))

    def prestart(self, default: Want, per_uid: Dict[int, Tuple[str, Want]]) -> None:
        """Start the server of a tenant's user ahead of its clients, with the tenant's values.
        MPS runs one user's server at a time: with more users than one there is nothing to
        pre-start (their servers start on demand, with the defaults)."""
        if len(per_uid) > 1:
            self.notes.append(
                "%d users of tenants share %s: MPS runs one user's server at a time, and a server "
                "started on demand gets the defaults; tenant values reach a user's server at the "
                "next apply while it has no clients" % (len(per_uid), self.change.device)
            )
            return
        if not per_uid:
            return
        uid, (tenant, want) = next(iter(per_uid.items()))
        servers = self.control.server_list(self.pipe)
        if any(self.control.server_uid(self.pipe, pid) == uid for pid in servers):
            return
        busy = [pid for pid in servers if self.control.client_list(self.pipe, pid)]
        if busy:
            other = self.control.server_uid(self.pipe, busy[0])
            self.notes.append(
                "the server of tenant %s (uid %d) is not pre-started: the server of %s still has "
                "clients (MPS runs one user's server at a time)"
                % (tenant, uid, self.backend.user_name(other) if other is not None else "?")
            )
            return
        server = self.control.start_server(self.pipe, uid)
        if server is None:
            raise MpsError("mps_failed", "the server for uid %d did not start" % uid)
        self.actions.append(
            "started the MPS server (pid %d) of %s for tenant %s"
            % (server, self.backend.user_name(uid), tenant)
        )
        if want.percentage != default.percentage:
            self.actions.append(_run_op(self.control, self.pipe, ("percentage", server, want.percentage)))
        if want.pinned != default.pinned and want.pinned is not None:
            self.actions.append(_run_op(self.control, self.pipe, ("pinned", server, want.pinned)))

    def verify(self, default: Want, per_uid: Dict[int, Tuple[str, Want]]) -> None:
        daemon = self.control.read(self.pipe)
        if daemon is None:
            raise MpsError("verify", "the MPS daemon is not running after the change")
        wrong = []
        if (daemon.default_active_thread_percentage, daemon.default_pinned_memory_limit) != (
            default.percentage,
            default.pinned,
        ):
            wrong.append(
                "defaults %g%%/%s"
                % (daemon.default_active_thread_percentage, daemon.default_pinned_memory_limit)
            )
        for server in daemon.servers:
            want = per_uid[server.uid][1] if server.uid in per_uid else default
            got = (server.active_thread_percentage, server.pinned_memory_limit)
            if got != (want.percentage, want.pinned) and not server.clients:
                wrong.append("server %d %g%%/%s" % (server.pid, got[0], got[1]))
        if wrong:
            raise MpsError("verify", "after the change the daemon has %s" % ", ".join(wrong))


def apply_mps(
    backend: Backend, control: MpsControl, record: MpsRecord, change: proto.MpsChange, force: bool = False
) -> proto.MpsResult:
    """Make one device's MPS what `change` wants; returns what was done. Raises MpsApplyError."""
    recorded_devices = record.load()
    if change.enabled or change.device not in recorded_devices:
        # (A daemon gpuops started for a MIG device that is gone since can still be stopped.)
        _check_device(backend, change)
    if change.enabled:
        default, per_uid = wants(backend, change)
    else:
        default, per_uid = Want(DEFAULT_PERCENTAGE, None), {}
    for device, entry in recorded_devices.items():
        if device != change.device and entry.get("pipe_directory") == change.pipe_directory:
            raise MpsApplyError(
                "conflict", "pipe directory %s belongs to %s already" % (change.pipe_directory, device)
            )
    applier = _Applier(backend, control, change, force)
    try:
        _move_away(applier, record)
        before = control.read(change.pipe_directory)
    except MpsError as exc:
        raise _mps_error(exc) from None
    try:
        if not change.enabled:
            if before is not None:
                applier.stop_clients(before, "stopping MPS")
                applier.quit(before)
        elif before is None:
            applier.start(default, per_uid)
            applier.prestart(default, per_uid)
            applier.verify(default, per_uid)
        else:
            ops, restart, disrupted = _plan(before, default, per_uid)
            if disrupted:
                applier.stop_clients(before, "changing the values its servers run under")
            if disrupted or restart:
                applier.quit(before)
                applier.start(default, per_uid)
            else:
                for op in ops:
                    applier.actions.append(_run_op(control, change.pipe_directory, op))
            applier.prestart(default, per_uid)
            if applier.actions:
                applier.verify(default, per_uid)
    except MpsError as exc:
        if not applier.actions:
            raise _mps_error(exc) from None
        _undo(applier, before, exc)
    recorded = record.put(change.device, record_entry(change) if change.enabled else None)
    if recorded and not applier.actions:
        applier.actions.append("updated gpuops' record of %s" % change.device)
    return proto.MpsResult(
        device=change.device,
        gpu=change.gpu,
        changed=bool(applier.actions),
        actions=tuple(applier.actions),
        notes=tuple(applier.notes),
        stopped=tuple(applier.stopped),
    )


def refused(change: proto.MpsChange, error: MpsApplyError) -> proto.MpsResult:
    """One device's entry in an mps_apply reply when its change was not made."""
    return proto.MpsResult(
        device=change.device,
        gpu=change.gpu,
        ok=False,
        code=error.code,
        message=error.message,
        clients=error.clients,
    )


def _move_away(applier: _Applier, record: MpsRecord) -> None:
    """A device whose daemon moves to another pipe directory: the old daemon ends first."""
    entry = record.load().get(applier.change.device)
    old = entry.get("pipe_directory") if entry else None
    if not isinstance(old, str) or old == applier.change.pipe_directory:
        return
    daemon = applier.control.read(old)
    if daemon is not None:
        pipe, applier.pipe = applier.pipe, old
        try:
            applier.stop_clients(daemon, "moving MPS to %s" % applier.change.pipe_directory)
            applier.quit(daemon)
        finally:
            applier.pipe = pipe


def _undo(applier: _Applier, before: Optional[MpsDaemon], error: MpsError) -> None:
    """Put the daemon back as it was (as far as MPS allows); always raises."""
    control, pipe = applier.control, applier.pipe
    reason = error.message
    try:
        now = control.read(pipe)
        if before is None:
            if now is not None:
                control.quit(pipe, timeout=10.0)
        else:
            if now is None:
                control.start_daemon(pipe, applier.change.log_directory or "", applier.change.device)
            if control.default_active_thread_percentage(pipe) != before.default_active_thread_percentage:
                control.set_default_active_thread_percentage(pipe, before.default_active_thread_percentage)
            if before.default_pinned_memory_limit is not None:
                control.set_default_pinned_mem_limit(pipe, before.default_pinned_memory_limit)
            live = {s.pid for s in (control.read(pipe) or before).servers}
            for server in before.servers:
                if server.pid in live:
                    control.set_active_thread_percentage(pipe, server.pid, server.active_thread_percentage)
                    if server.pinned_memory_limit is not None:
                        control.set_pinned_mem_limit(pipe, server.pid, server.pinned_memory_limit)
    except MpsError as undo:
        raise MpsApplyError(
            "stuck",
            "%s: %s; putting the old MPS settings back failed too (%s)"
            % (applier.change.device, reason, undo.message),
        ) from None
    raise MpsApplyError(
        "rolled_back", "%s: %s; the old MPS settings are back" % (applier.change.device, reason)
    )


# --------------------------------------------------------------------------- live settings


def _number(value: float) -> Any:
    return int(value) if value == int(value) else value


def _daemon_json(user_name: Callable[[int], str], daemon: Optional[MpsDaemon]) -> Dict[str, Any]:
    if daemon is None:
        return {
            "running": False,
            "pid": None,
            "active_thread_percentage": None,
            "pinned_memory_limit": None,
            "servers": [],
        }
    return {
        "running": True,
        "pid": daemon.pid,
        "active_thread_percentage": _number(daemon.default_active_thread_percentage),
        "pinned_memory_limit": daemon.default_pinned_memory_limit,
        "servers": [
            {
                "pid": s.pid,
                "uid": s.uid,
                "user": user_name(s.uid) if s.uid is not None else None,
                "active_thread_percentage": _number(s.active_thread_percentage),
                "pinned_memory_limit": s.pinned_memory_limit,
                "clients": list(s.clients),
            }
            for s in daemon.servers
        ],
    }


def live_config(
    user_name: Callable[[int], str], control: Optional[MpsControl], record: MpsRecord, why: str = ""
) -> List[Dict[str, Any]]:
    """Every daemon gpuops manages (and one at MPS's default pipe directory, if it runs), live."""
    out = []
    entries = record.load()
    pipes: List[Tuple[Any, Optional[str], Optional[Dict[str, Any]]]] = [
        (e.get("pipe_directory"), device, e) for device, e in sorted(entries.items())
    ]
    if all(p != DEFAULT_PIPE_DIRECTORY for p, _d, _e in pipes):
        pipes.append((DEFAULT_PIPE_DIRECTORY, None, None))
    for pipe, device, entry in pipes:
        if not isinstance(pipe, str):
            continue
        item: Dict[str, Any] = {
            "device": device,
            "gpu": entry.get("gpu") if entry else None,
            "managed": entry is not None,
            "pipe_directory": pipe,
            "log_directory": entry.get("log_directory") if entry else None,
            "tenants": entry.get("tenants", {}) if entry else {},
            "recorded": {
                "active_thread_percentage": entry.get("active_thread_percentage") if entry else None,
                "pinned_memory_limit": entry.get("pinned_memory_limit") if entry else None,
            },
        }
        if control is None:
            if entry is None:
                continue
            item.update(_daemon_json(user_name, None), running=None)
            item["error"] = why or "no MPS control on this node"
        else:
            try:
                daemon = control.read(pipe)
            except MpsError as exc:
                if entry is None:
                    continue
                item.update(_daemon_json(user_name, None), running=None)
                item["error"] = exc.message
            else:
                if daemon is None and entry is None:
                    continue
                item.update(_daemon_json(user_name, daemon))
        out.append(item)
    return out
