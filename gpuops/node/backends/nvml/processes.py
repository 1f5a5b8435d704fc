"""The processes on a GPU: NVML's compute and graphics lists (on the GPU, else on each of its MIG
devices), and what /proc says of each (user, command line, groups, cgroup).

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import grp
import pwd
from typing import Any, Dict, List, Tuple

from gpuops.core.model import GpuProcess, NotAvailable
from gpuops.node.backends.nvml.devices import Device
from gpuops.node.backends.nvml.library import NO_ID, Call, call, pynvml
from gpuops.node.backends.nvml.mig import MigDevices

MAX_PROCESS_GROUPS = 32  # groups reported per process (a sample must stay small)
MAX_CGROUP = 1024  # characters of a cgroup path reported


def read_gids(status_path: str) -> List[int]:
    """The group ids of a process from its /proc/<pid>/status: the real gid (the primary group)
    first, then the supplementary groups in the kernel's order, each once; [] where unreadable."""
    gids: List[int] = []
    try:
        with open(status_path, "rb") as f:
            for line in f:
                if line.startswith(b"Gid:"):
                    gids.insert(0, int(line.split()[1]))
                elif line.startswith(b"Groups:"):
                    gids.extend(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError, IndexError):
        return []
    unique: List[int] = []
    for gid in gids:
        if gid not in unique:
            unique.append(gid)
            if len(unique) == MAX_PROCESS_GROUPS:
                break
    return unique


def read_cgroup(cgroup_path: str) -> str:
    """The cgroup of a process from its /proc/<pid>/cgroup: the unified (v2) path, else the
    first v1 path that is not the root; "" where unreadable."""
    try:
        with open(cgroup_path, "rb") as f:
            raw = f.read(65536)
    except OSError:
        return ""
    unified = first = ""
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            unified = parts[2]
        elif not first and parts[2] not in ("", "/"):
            first = parts[2]
    chosen = unified if unified not in ("", "/") else (first or unified)
    return chosen[:MAX_CGROUP]


def _process_lists(handle: Any, found: Dict[Tuple[int, int, int], Any], ids: Tuple[int, int]) -> str:
    """Add the compute and graphics processes of `handle` to `found`.

    Returns "" if at least one list came, else the NVML code of the failure.
    """
    any_ok = False
    failure = "UNKNOWN"
    for names in (
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ):
        got = Call(error="FUNCTION_NOT_FOUND")
        for fn_name in names:  # _v3 since R510, _v2 before (same structure)
            fn = getattr(pynvml, fn_name, None)
            if fn is None:
                continue
            got = call(fn, handle)
            if got.error != "FUNCTION_NOT_FOUND":
                break
        if not got.ok:
            failure = got.error
            continue  # this list cannot be had (e.g. NO_PERMISSION): keep what the other gave
        any_ok = True
        for p in got.value:
            gi, ci = int(p.gpuInstanceId), int(p.computeInstanceId)
            if gi == NO_ID and ids[0] != NO_ID:  # listed on a MIG device handle
                gi, ci = ids
            key = (int(p.pid), gi, ci)
            used = p.usedGpuMemory  # None where the driver cannot tell
            prev = found.get(key)
            if prev is None or (used is not None and used > prev):
                found[key] = used  # a C+G process is in both lists: keep the larger figure
    return "" if any_ok else failure


class ProcessReader:
    """A GPU's processes with their owners; user and group names are looked up once each."""

    def __init__(self) -> None:
        self._users: Dict[int, str] = {}
        self._group_names: Dict[int, str] = {}

    def processes(self, dev: Device, mig_devices: MigDevices) -> Tuple[Tuple[GpuProcess, ...], str]:
        """The GPU's processes, and "" or the NVML code saying why the list is incomplete."""
        found: Dict[Tuple[int, int, int], Any] = {}
        error = _process_lists(dev.handle, found, (NO_ID, NO_ID))
        if error and mig_devices:
            # The parent GPU would not list them (e.g. NO_PERMISSION with MIG on): ask each MIG device.
            errors = [_process_lists(mig.handle, found, ids) for ids, mig in sorted(mig_devices.items())]
            error = next((e for e in errors if e), "")
        out: List[GpuProcess] = []
        for (pid, gi, ci), used in sorted(found.items()):
            user, command = self._owner(pid)
            out.append(
                GpuProcess(
                    pid=pid,
                    used_memory_bytes=NotAvailable("NOT_SUPPORTED") if used is None else int(used),
                    user=user,
                    command=command,
                    gpu_instance_id=None if gi == NO_ID else gi,
                    compute_instance_id=None if ci == NO_ID else ci,
                    groups=self._groups(pid),
                    cgroup=read_cgroup("/proc/%d/cgroup" % pid),
                )
            )
        return tuple(out), error

    def _groups(self, pid: int) -> Tuple[str, ...]:
        """Unix group names of a process, primary first; a number where the group has no name."""
        names = []
        for gid in read_gids("/proc/%d/status" % pid):
            name = self._group_names.get(gid)
            if name is None:
                try:
                    name = grp.getgrgid(gid).gr_name
                except KeyError:
                    name = str(gid)
                self._group_names[gid] = name
            names.append(name)
        return tuple(names)

    def _owner(self, pid: int) -> Tuple[str, str]:
        """(unix user, command line) of a process; "" where /proc cannot tell (other PID namespace)."""
        user = ""
        try:
            with open("/proc/%d/status" % pid, "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        uid = int(line.split()[1])
                        user = self.user(uid)
                        break
        except (OSError, ValueError, IndexError):
            pass
        command = ""
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                raw = f.read(4096)
            command = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
            if not command:
                with open("/proc/%d/comm" % pid, "rb") as f:
                    command = f.read(256).decode("utf-8", "replace").strip()
        except OSError:
            pass
        return user, command

    def user(self, uid: int) -> str:
        """The user name of a uid; the number where it has none."""
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name
