"""Per-team figures of the CLI's fleet tables (`discover`, `fleet`): owned, pooled, busy, idle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuops.core.model import Gpu
from gpuops.fleet.source import FleetSnapshot
from gpuops.tenancy.ownership import UNOWNED
from gpuops.views.common import as_int, gpu_busy


@dataclass(frozen=True)
class TeamSummary:
    """A team as the CLI's per-team table prints it. A GPU counts as *busy* when it is at least 5%
    utilized or has a process on it; a MIG GPU when one of its slices is busy (by its SMs' GPM
    utilization where reported, else while it holds a process: `common.capacity_state`)."""

    team: str
    nodes: int  # nodes the team owns
    gpus_owned: int
    gpus_busy: int  # of those it owns
    gpus_idle: int  # owned, in its silo and not busy: the silo capacity that could be pooled
    gpus_unknown: int  # owned, in its silo, but on nodes without data
    memory_used_bytes: int
    memory_total_bytes: int
    processes: int
    gpus_pooled: int = 0  # owned and in a pool of fleet.yaml: shared, neither busy nor idle here
    # (memory and processes count every GPU it owns: what its cards hold, whoever runs there)


def team_summaries(
    snapshot: FleetSnapshot,
    gpu_owner: Callable[[str, int], str | None],
    teams: list[str],
    pool_of: Callable[[str, Gpu], str | None] | None = None,
) -> list[TeamSummary]:
    """One row per team of fleet.yaml (and one for unowned GPUs, if any), by team name. A GPU in
    a pool (`pool_of`) counts as its owner's, pooled: not busy or idle silo capacity."""
    acc: dict[str, dict[str, int]] = {t: {} for t in teams}
    node_owners: dict[str, set[str]] = {}
    for view in snapshot.nodes:
        if view.owner:
            node_owners.setdefault(view.owner, set()).add(view.name)
        gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
        for gpu in gpus:
            team = gpu_owner(view.name, gpu.info.index) or UNOWNED
            row = acc.setdefault(team, {})
            row["owned"] = row.get("owned", 0) + 1
            pooled = pool_of is not None and pool_of(view.name, gpu) is not None
            if pooled:
                row["pooled"] = row.get("pooled", 0) + 1
            if view.sample is None or view.state not in ("live", "stale"):
                if not pooled:
                    row["unknown"] = row.get("unknown", 0) + 1
                continue
            if not pooled:  # a pooled GPU is shared: its work is no sign of its owner's use
                busy = gpu_busy(gpu)
                row["busy"] = row.get("busy", 0) + int(busy)
                row["idle"] = row.get("idle", 0) + int(not busy)
            row["processes"] = row.get("processes", 0) + len(gpu.processes)
            if gpu.sample is not None:
                row["mem_used"] = row.get("mem_used", 0) + (as_int(gpu.sample.memory_used_bytes) or 0)
                row["mem_total"] = row.get("mem_total", 0) + (as_int(gpu.sample.memory_total_bytes) or 0)
    return [
        TeamSummary(
            team=team,
            nodes=len(node_owners.get(team, ())),
            gpus_owned=row.get("owned", 0),
            gpus_busy=row.get("busy", 0),
            gpus_idle=row.get("idle", 0),
            gpus_unknown=row.get("unknown", 0),
            memory_used_bytes=row.get("mem_used", 0),
            memory_total_bytes=row.get("mem_total", 0),
            processes=row.get("processes", 0),
            gpus_pooled=row.get("pooled", 0),
        )
        for team, row in sorted(acc.items())
    ]
