"""Faults injected into a simulated node's GPUs, to rehearse what apply does when hardware or the
agent fails half-way (docs/simulator.md, "Faults").

A fault is a small JSON file, `DIR/state/<node>/faults.json`, read by the node's backend on each
MIG call (never on the sampling path):

    {"op": "create_gpu_instance", "at": 3, "effect": "nvml_error", "code": "INSUFFICIENT_RESOURCES"}

`at`: the how-manieth call of `op` from now fires (1 = the next one). Effects:
- `nvml_error`: the call fails as NVML would, with `code` (one of backends.base.ERROR_CODES);
- `kill`: the agent serving the call dies there, as if SIGKILLed: its SSH session drops and
  nothing after that point runs (no rollback); the GPU keeps whatever was done so far, as real
  hardware does, and the node's MIG journal says what was under way.
A fault fires once, then its file is removed.

Health events (an XID, an ECC error, a clock change) are injected as files in
`DIR/state/<node>/events/`, one event each, named so that they sort in the order they were
written. The node's backend offers them as its event source (`FaultyBackend.event_source`); the
fleet takes it with `HealthMonitor.poll`, which drains it whenever the node is sampled (by an SSH
agent or its exporter), so the event reaches samples, `gpuops_xid_errors_total` and the operator
exactly as an event from NVML's event set does — with no thread per simulated node.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuops.core.atomic_file import atomic_write
from gpuops.core.model import HEALTH_KINDS
from gpuops.node.backends.base import ERROR_CODES, BackendError, EventSource, RawEvent

log = logging.getLogger("gpuops.simfleet")

FAULTS_FILE = "faults.json"
OPS = ("create_gpu_instance", "create_compute_instance", "destroy_gpu_instance", "set_mig_mode")
EFFECTS = ("nvml_error", "kill")
EVENTS_DIR = "events"
_SEQUENCE = itertools.count()


class AgentKilled(BaseException):
    """The simulated agent dies here; nothing in the agent catches a BaseException."""


def inject(node_state_dir: Path, op: str, at: int, effect: str, code: str = "UNKNOWN") -> None:
    """Arm a fault for one simulated node (its state directory: DIR/state/<node>)."""
    if op not in OPS or effect not in EFFECTS or at < 1 or code not in ERROR_CODES:
        raise ValueError(f"bad fault: op {op!r}, at {at}, effect {effect!r}, code {code!r}")
    node_state_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"op": op, "at": at, "effect": effect, "code": code})
    atomic_write(node_state_dir / FAULTS_FILE, text, 0o666, umask=True, durable=False)


def inject_event(
    node_state_dir: Path,
    kind: str,
    gpu: int,
    xid: int | None = None,
    gpu_instance_id: int | None = None,
    compute_instance_id: int | None = None,
) -> Path:
    """Queue one health event for a simulated node; its next sample carries it. Returns the file."""
    problem = event_problem(kind, gpu, xid, gpu_instance_id, compute_instance_id)
    if problem:
        raise ValueError(problem)
    directory = node_state_dir / EVENTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    # Nanoseconds, then this process and a counter: names sort in the order events were written.
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_SEQUENCE):06d}.json"
    text = json.dumps(
        {
            "kind": kind,
            "gpu": gpu,
            "xid": xid,
            "gpu_instance_id": gpu_instance_id,
            "compute_instance_id": compute_instance_id,
        }
    )
    atomic_write(directory / name, text, 0o666, umask=True, durable=False)
    return directory / name


def event_problem(
    kind: str, gpu: int, xid: int | None, gpu_instance_id: int | None, compute_instance_id: int | None
) -> str:
    """Why these are not an event NVML could give ("" when they are)."""
    if kind not in HEALTH_KINDS:
        return f"unknown event kind {kind!r} (one of {', '.join(HEALTH_KINDS)})"
    if gpu < 0:
        return f"GPU index {gpu} is negative"
    if kind == "xid" and (xid is None or xid < 1):
        return "an xid event needs its XID number (a positive integer)"
    if kind != "xid" and xid is not None:
        return f"only xid events carry an XID number, not {kind}"
    if compute_instance_id is not None and gpu_instance_id is None:
        return "a compute instance needs its GPU instance"
    if any(i is not None and i < 0 for i in (gpu_instance_id, compute_instance_id)):
        return "MIG instance ids are not negative"
    return ""


def clear_events(node_state_dir: Path) -> None:
    """Forget events queued for an earlier run of the fleet (a start is a new past)."""
    directory = node_state_dir / EVENTS_DIR
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()


class SpoolEventSource(EventSource):
    """The injected events of one simulated node, oldest first. `wait` never blocks when nothing is
    queued and `timeout` is 0 (HealthMonitor.poll); a thread's wait sleeps out its timeout."""

    def __init__(self, node_state_dir: Path, uuid_of: Callable[[int], str]) -> None:
        self._dir = node_state_dir / EVENTS_DIR
        self._uuid_of = uuid_of

    def wait(self, timeout: float) -> RawEvent | None:
        try:
            # atomic_write's temporary files are hidden: never half-written events
            names = sorted(n for n in os.listdir(self._dir) if not n.startswith("."))
        except OSError:
            names = []
        for name in names:
            path = self._dir / name
            try:
                text = path.read_text()
                path.unlink()
            except OSError:
                continue
            event = self._parse(name, text)
            if event is not None:
                return event
        if timeout > 0:
            time.sleep(timeout)
        return None

    def _parse(self, name: str, text: str) -> RawEvent | None:
        try:
            data = json.loads(text)
            kind, gpu = data["kind"], data["gpu"]
            xid, gi, ci = data.get("xid"), data.get("gpu_instance_id"), data.get("compute_instance_id")
            ints = all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (gpu, xid, gi, ci)
            )
            problem = (
                event_problem(kind, gpu, xid, gi, ci) if ints and isinstance(kind, str) else "not an event"
            )
        except (ValueError, KeyError, TypeError) as exc:
            problem = str(exc)
        if problem:
            log.warning("ignored injected event %s: %s", name, problem)
            return None
        return RawEvent(gpu, kind, xid, gi, ci, self._uuid_of(gpu))


class QueuedEventSource(EventSource):
    """Events handed over in this process (gpuops.simfleet.source, tests): `put` queues one, the
    node's HealthMonitor takes it at its next sample."""

    def __init__(self) -> None:
        self._queue: collections.deque[RawEvent] = collections.deque()

    def put(self, event: RawEvent) -> None:
        problem = event_problem(
            event.kind, event.gpu, event.xid, event.gpu_instance_id, event.compute_instance_id
        )
        if problem:
            raise ValueError(problem)
        self._queue.append(event)

    def wait(self, timeout: float) -> RawEvent | None:
        try:
            return self._queue.popleft()
        except IndexError:
            if timeout > 0:
                time.sleep(timeout)
            return None


class FaultyBackend:
    """A simulated backend that fails where faults.json says; every other call passes through."""

    def __init__(self, backend: Any, node_state_dir: Path, on_kill: Callable[[], None] | None = None) -> None:
        self._backend = backend
        self._dir = node_state_dir
        self._path = node_state_dir / FAULTS_FILE
        self.on_kill = on_kill

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def event_source(self) -> EventSource:
        """The node's injected health events (inject_event), for HealthMonitor.poll."""
        return SpoolEventSource(self._dir, self._uuid_of)

    def _uuid_of(self, gpu: int) -> str:
        try:
            gpus = self._backend.inventory().gpus
        except BackendError:
            return ""
        return next((g.info.uuid for g in gpus if g.info.index == gpu), "")

    def _check(self, op: str) -> None:
        try:
            fault = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(fault, dict) or fault.get("op") != op:
            return
        at = fault.get("at")
        if not isinstance(at, int) or at > 1:
            fault["at"] = (at if isinstance(at, int) else 2) - 1
            self._path.write_text(json.dumps(fault))
            return
        with contextlib.suppress(OSError):
            self._path.unlink()
        if fault.get("effect") == "kill":
            if self.on_kill is not None:
                self.on_kill()
            raise AgentKilled(f"injected: agent killed during {op}")
        code = fault.get("code") if fault.get("code") in ERROR_CODES else "UNKNOWN"
        raise BackendError(str(code), f"injected fault on {op}")

    def set_mig_mode(self, gpu: int, enabled: bool) -> Any:
        self._check("set_mig_mode")
        return self._backend.set_mig_mode(gpu, enabled)

    def create_gpu_instance(self, gpu: int, profile_id: int, start: int | None = None) -> Any:
        self._check("create_gpu_instance")
        return self._backend.create_gpu_instance(gpu, profile_id, start)

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        self._check("destroy_gpu_instance")
        self._backend.destroy_gpu_instance(gpu, gpu_instance_id)

    def create_compute_instance(self, gpu: int, gpu_instance_id: int, profile_id: int, *args: Any) -> Any:
        self._check("create_compute_instance")
        return self._backend.create_compute_instance(gpu, gpu_instance_id, profile_id, *args)
