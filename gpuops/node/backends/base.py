"""The one small protocol every node backend implements.

A backend answers two questions — what is on this node (`inventory`) and what is it doing now
(`sample`) — and may carry out MIG changes. Errors carry NVML's names (IN_USE,
INSUFFICIENT_RESOURCES, NOT_SUPPORTED, ...) so the layers above handle a simulated node and a
real one the same way.
"""

from __future__ import annotations

import abc
import os
import signal
import time
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

from gpuops.core.model import ComputeInstance, GpuInstance, Node, NodeSample, PartitionState
from gpuops.node.mps import MpsControl, pid_alive

try:
    import pwd
except ImportError:  # pragma: no cover - not on Unix
    pwd = None  # type: ignore[assignment]

# NVML return codes by name, as the layers above see them.
ERROR_CODES = (
    "UNINITIALIZED",
    "INVALID_ARGUMENT",
    "NOT_SUPPORTED",
    "NO_PERMISSION",
    "NOT_FOUND",
    "INSUFFICIENT_SIZE",
    "DRIVER_NOT_LOADED",
    "GPU_IS_LOST",
    "RESET_REQUIRED",
    "IN_USE",
    "INSUFFICIENT_RESOURCES",
    "FUNCTION_NOT_FOUND",
    "LIBRARY_NOT_FOUND",
    "UNKNOWN",
)


class BackendError(Exception):
    """A backend call failed; `code` is one of ERROR_CODES, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code if code in ERROR_CODES else "UNKNOWN"
        self.message = message


class BackendUnavailable(Exception):
    """The backend cannot start on this machine (no driver, no library, bad sim spec)."""


@dataclass(frozen=True)
class MigModeChange:
    """The outcome of a MIG mode change: Ampere leaves it pending until a GPU reset."""

    current: bool
    pending: bool

    @property
    def reset_required(self) -> bool:
        return self.current != self.pending


class RawEvent(NamedTuple):
    """One event as a backend's event source hands it over (node/health.py numbers and keeps it)."""

    gpu: int  # GPU index; -1 where the backend cannot tell which
    kind: str  # one of core.model.HEALTH_KINDS
    xid: Optional[int] = None
    gpu_instance_id: Optional[int] = None
    compute_instance_id: Optional[int] = None
    uuid: str = ""


class EventSource(abc.ABC):
    """A backend's health events, waited for on a thread of their own (node/health.py).

    Only `wait` and `close` are called, from that one thread; `close` after the last `wait`."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> Optional[RawEvent]:
        """The next event, or None when none came within `timeout` seconds (or a wait was cut
        short, as NVML's may be). Raises BackendError when the source is broken for good."""

    def close(self) -> None:
        """Release what the source holds (NVML's event set)."""


class Backend(abc.ABC):
    """A source of GPU facts for one node."""

    name = "abstract"

    @abc.abstractmethod
    def inventory(self) -> Node:
        """Identity of the node and its GPUs, with MIG layout; no samples or processes."""

    @abc.abstractmethod
    def sample(self) -> NodeSample:
        """Every GPU now: sample, MIG layout, per-instance memory and processes."""

    def capabilities(self) -> Tuple[str, ...]:
        return ("inventory", "sample")

    def close(self) -> None:
        """Release the library or simulator; the backend is unusable afterwards."""

    def event_source(self) -> EventSource:
        """A source of this node's health events (XID errors, ECC errors, clock changes), made on
        the backend's thread and then used on a thread of its own. Raises BackendError
        (NOT_SUPPORTED where the node has none)."""
        raise BackendError("NOT_SUPPORTED", "this backend has no health events")

    # MIG control. Backends that cannot change MIG keep these defaults.
    def set_mig_mode(self, gpu: int, enabled: bool) -> MigModeChange:
        raise BackendError("NOT_SUPPORTED", "this backend cannot change MIG mode")

    def reset_gpu(self, gpu: int) -> None:
        raise BackendError("NOT_SUPPORTED", "this backend cannot reset GPUs")

    def create_gpu_instance(self, gpu: int, profile_id: int, start: Optional[int] = None) -> GpuInstance:
        raise BackendError("NOT_SUPPORTED", "this backend cannot create GPU instances")

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        raise BackendError("NOT_SUPPORTED", "this backend cannot destroy GPU instances")

    def create_compute_instance(
        self, gpu: int, gpu_instance_id: int, profile_id: int, start: Optional[int] = None
    ) -> ComputeInstance:
        raise BackendError("NOT_SUPPORTED", "this backend cannot create compute instances")

    def destroy_compute_instance(self, gpu: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        raise BackendError("NOT_SUPPORTED", "this backend cannot destroy compute instances")

    # Mode partitions (AMD Instinct): an optional capability, like MIG control.
    def set_partition(
        self, gpu: int, compute_mode: Optional[str] = None, memory_mode: Optional[str] = None
    ) -> PartitionState:
        """Take GPU `gpu` to these partition modes (None: keep) as one change: the old modes or
        the new ones afterwards, never a mix; returns the modes now. IN_USE while processes run."""
        raise BackendError("NOT_SUPPORTED", "this backend cannot change partition modes")

    def stop_processes(self, gpu: int, pids: Sequence[int], grace: float = 10.0) -> List[int]:
        """End processes in the way of a forced change: SIGTERM, then SIGKILL after `grace`
        seconds. Returns the pids still alive (none, normally)."""
        alive = list(pids)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                except PermissionError as exc:
                    raise BackendError("NO_PERMISSION", "cannot signal pid %d: %s" % (pid, exc)) from None
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
            while alive and time.monotonic() < deadline:
                alive = [pid for pid in alive if _exists(pid)]
                if alive:
                    time.sleep(0.1)
            if not alive:
                break
        return alive

    # MPS control and the users it runs servers for.
    def mps_control(self) -> MpsControl:
        """The MPS control of this node's daemons (node/mps.py)."""
        raise BackendError("NOT_SUPPORTED", "this backend has no MPS control")

    def user_id(self, name: str) -> Optional[int]:
        """The uid of a user of this node, None when there is no such user."""
        return unix_user_id(name)

    def user_name(self, uid: int) -> str:
        """The name of a uid of this node (the uid as text when it has none)."""
        return unix_user_name(uid)


def unix_user_id(name: str) -> Optional[int]:
    if pwd is None:  # pragma: no cover
        return None
    try:
        return int(pwd.getpwnam(name).pw_uid)
    except (KeyError, ValueError, TypeError):
        return None


def unix_user_name(uid: int) -> str:
    if pwd is not None:
        try:
            return str(pwd.getpwuid(uid).pw_name)
        except (KeyError, ValueError, TypeError, OverflowError):
            pass
    return str(uid)


def _exists(pid: int) -> bool:
    """A process that exists and has not ended (a zombie has ended: it only waits for its
    parent to collect its status)."""
    return pid_alive(pid)
