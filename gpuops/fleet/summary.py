"""Per-team and per-node figures of a fleet snapshot: what each team owns and what it uses.

Pure functions over the collector's snapshot and fleet.yaml's ownership; the CLI and the TUI
only print them. A GPU counts as *busy* when it is at least 5% utilized or has a process on it
(on MIG GPUs NVML gives no utilization, so processes decide).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuops.core.model import Gpu, NotAvailable
from gpuops.fleet.collector import FleetSnapshot, NodeView

BUSY_PERCENT = 5.0
UNOWNED = "(unowned)"


def short_model(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-80GB': enough to tell cards apart in a dense table."""
    short = name.removeprefix("NVIDIA ")
    for form in ("-SXM4", "-SXM5", "-SXM2", "-PCIE", " PCIe", " NVL"):
        short = short.replace(form, "")
    return short


def gpu_busy(gpu: Gpu) -> bool:
    if gpu.processes:
        return True
    util = gpu.sample.utilization_gpu_percent if gpu.sample else None
    return isinstance(util, float | int) and util >= BUSY_PERCENT


@dataclass(frozen=True)
class TeamSummary:
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


@dataclass(frozen=True)
class NodeSummary:
    name: str
    state: str
    reason: str
    age: float | None
    owner: str | None
    gpus: int
    models: str
    busy: int
    utilization_percent: float | None  # mean over GPUs that report it
    memory_used_bytes: int
    memory_total_bytes: int
    processes: int


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def node_summary(view: NodeView, now: float) -> NodeSummary:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    models: dict[str, int] = {}
    for gpu in gpus:
        models[gpu.info.name] = models.get(gpu.info.name, 0) + 1
    utils = [
        float(g.sample.utilization_gpu_percent)
        for g in gpus
        if g.sample is not None and not isinstance(g.sample.utilization_gpu_percent, NotAvailable)
    ]
    return NodeSummary(
        name=view.name,
        state=view.state,
        reason=view.reason,
        age=view.age(now),
        owner=view.owner,
        gpus=len(gpus),
        models=", ".join(f"{n}x {short_model(m)}" for m, n in sorted(models.items())),
        busy=sum(1 for g in gpus if gpu_busy(g)) if view.sample else 0,
        utilization_percent=sum(utils) / len(utils) if utils else None,
        memory_used_bytes=sum(_int(g.sample.memory_used_bytes) for g in gpus if g.sample),
        memory_total_bytes=sum(_int(g.info.memory_total_bytes) for g in gpus),
        processes=sum(len(g.processes) for g in gpus),
    )


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
                row["mem_used"] = row.get("mem_used", 0) + _int(gpu.sample.memory_used_bytes)
                row["mem_total"] = row.get("mem_total", 0) + _int(gpu.sample.memory_total_bytes)
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
