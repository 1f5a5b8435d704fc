"""`:processes`: every GPU process of the fleet, nvitop's list across nodes: where it runs, whose
it is, what it holds, how long it has been seen; sortable, filterable, scoped to one team."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuops.fleet.source import LIVE, STALE, FleetSnapshot, NodeView
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.common import (
    HELD,
    as_float,
    as_int,
    capacity_state,
    mig_active,
    percent_of,
    whole_gpu_state,
)
from gpuops.views.filter import Filter

# What the agent does not send per process (it lists NVML's compute processes: pid, user, groups,
# cgroup, GPU memory, command line), shown as n/a with this reason rather than left out.
NOT_SENT = (
    "per-process SM%, CPU%, host memory and start time: not sent by the agent "
    "(it lists NVML's compute processes: pid, user, GPU memory, command)"
)


@dataclass(frozen=True)
class FleetProcess:
    node: str
    gpu: int
    instance: int | None  # MIG GPU instance
    compute_instance: int | None
    profile: str  # the MIG instance's profile, "" on a whole GPU
    pid: int
    user: str
    team: str  # the tenant it counts for
    source: str  # where the tenant came from (limiter, user, group, owner, none)
    memory: int | None  # GPU memory it holds, bytes
    device_util: float | None  # its GPU's (MIG slice's: SMs', GPM) utilization, shared by all on it
    held: bool  # its GPU or slice is held idle: memory held at under 5% utilization
    command: str
    seen: float  # when this view first saw it (the agent does not send start times)
    search: str = ""

    @property
    def where(self) -> str:
        slot = f"{self.node}:{self.gpu}"
        return slot if self.instance is None else f"{slot} GI{self.instance} {self.profile}"


class FirstSeen:
    """When each process (node, pid, command) was first seen, kept while it runs: its elapsed time
    as far as this view knows. A node whose view object did not change is not walked again."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[tuple[int, str], float]] = {}
        self._views: dict[str, NodeView] = {}
        self._keys: dict[str, list[tuple[int, str]]] = {}  # each node's processes at its last sample

    def update(self, snapshot: FleetSnapshot, now: float) -> None:
        names = set()
        for view in snapshot.nodes:
            names.add(view.name)
            if self._views.get(view.name) is view or view.sample is None:
                continue
            self._views[view.name] = view
            keys = [(p.pid, p.command) for gpu in view.sample.gpus for p in gpu.processes]
            if keys == self._keys.get(view.name):
                continue  # the same processes as at the last sample: the usual update
            self._keys[view.name] = keys
            old = self._seen.get(view.name, {})
            fresh: dict[tuple[int, str], float] = {}
            for key in keys:
                fresh[key] = old.get(key, fresh.get(key, now))
            self._seen[view.name] = fresh
        for gone in set(self._seen) - names:
            del self._seen[gone]
            self._views.pop(gone, None)
            self._keys.pop(gone, None)

    def since(self, node: str, pid: int, command: str, default: float) -> float:
        return self._seen.get(node, {}).get((pid, command), default)


def fleet_processes(
    snapshot: FleetSnapshot, ownership: Ownership, first_seen: FirstSeen | None = None
) -> tuple[FleetProcess, ...]:
    """Every process on the GPUs of live and stale nodes (an unreachable node's list is old)."""
    out: list[FleetProcess] = []
    now = snapshot.time
    for view in snapshot.nodes:
        if view.sample is None or view.state not in (LIVE, STALE):
            continue
        for gpu in view.sample.gpus:
            if not gpu.processes:
                continue
            owner = ownership.owner(view, gpu)
            mig = mig_active(gpu)
            instances = {gi.id: gi for gi in gpu.mig.gpu_instances} if mig and gpu.mig else {}
            samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
            whole_util = as_float(gpu.sample.utilization_gpu_percent) if gpu.sample else None
            whole_held = not mig and whole_gpu_state(gpu) == HELD
            for p in gpu.processes:
                team, source = ownership.tenant(p, owner)
                profile, util, held = "", whole_util, whole_held
                if mig and p.gpu_instance_id is not None:
                    gi = instances.get(p.gpu_instance_id)
                    profile = gi.profile_name if gi is not None else ""
                    m = samples.get(p.gpu_instance_id)
                    util = as_float(m.sm_utilization_percent) if m is not None else None
                    memory = percent_of(m.memory_used_bytes, m.memory_total_bytes) if m is not None else None
                    on_slice = sum(1 for q in gpu.processes if q.gpu_instance_id == p.gpu_instance_id)
                    held = capacity_state(util, on_slice, memory) == HELD
                seen = first_seen.since(view.name, p.pid, p.command, now) if first_seen else now
                team = team or UNOWNED
                out.append(
                    FleetProcess(
                        node=view.name,
                        gpu=gpu.info.index,
                        instance=p.gpu_instance_id,
                        compute_instance=p.compute_instance_id,
                        profile=profile,
                        pid=p.pid,
                        user=p.user,
                        team=team,
                        source=source,
                        memory=as_int(p.used_memory_bytes),
                        device_util=util,
                        held=held,
                        command=p.command,
                        seen=seen,
                        search=f"{view.name} gpu{gpu.info.index} {profile} {p.pid} {p.user} {team} "
                        + p.command,
                    )
                )
    return tuple(out)


PROCESS_SORTS: dict[str, tuple[Callable[[FleetProcess], object], bool]] = {
    "memory": (lambda p: p.memory if p.memory is not None else -1, True),
    "pid": (lambda p: p.pid, False),
    "user": (lambda p: p.user, False),
    "team": (lambda p: p.team, False),
    "node": (lambda p: (p.node, p.gpu, p.instance or -1), False),
    "util": (lambda p: p.device_util if p.device_util is not None else -1.0, True),
    "seen": (lambda p: -p.seen, True),  # longest running first
    "command": (lambda p: p.command, False),
}


def sort_processes(
    rows: Iterable[FleetProcess],
    key: str = "memory",
    reverse: bool = False,
    flt: Filter | None = None,
    team: str | None = None,
) -> list[FleetProcess]:
    """Processes sorted (GPU memory held first by default, as nvitop), filtered by the `/` filter
    and scoped to one team (the drill-down from `:tenants`). Ties keep node, GPU, pid order."""
    fn, descending = PROCESS_SORTS[key]
    kept = [p for p in rows if (team is None or p.team == team) and (flt is None or flt.matches(p.search))]
    kept.sort(key=lambda p: (p.node, p.gpu, p.pid))
    return sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]
