"""The fleet grid's groups: a team's nodes (or all nodes) with the totals its header shows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuops.tenancy.ownership import UNOWNED
from gpuops.views.cells import GPU, LOST, SLICE, Cell, weighted_util
from gpuops.views.common import percent_of
from gpuops.views.filter import Filter
from gpuops.views.nodes import NodeRow, filter_rows, sort_rows

BY_TEAM, BY_NODE = "team", "node"


@dataclass(frozen=True)
class Totals:
    nodes: int = 0
    gpus: int = 0  # whole GPUs
    busy: float = 0.0  # GPU-equivalents doing work (common.capacity_state)
    idle: float = 0.0  # GPU-equivalents with data not doing work, `held` included
    held: float = 0.0  # of `idle`, what holds processes or memory at under 5% utilization
    unknown: int = 0  # GPUs without current data
    util: float | None = None  # mean of reporting GPUs and MIG slices, each by its share of a GPU
    memory_used: int = 0
    memory_total: int = 0
    processes: int = 0

    @property
    def memory(self) -> float | None:
        return percent_of(self.memory_used, self.memory_total)


def totals(rows: Sequence[NodeRow]) -> Totals:
    util_sum = util_weight = busy = idle = held = 0.0
    gpus = unknown = used = total = procs = 0
    for r in rows:
        gpus += r.gpus
        if r.has_data:
            busy += r.busy
            idle += r.idle
            held += r.held
            if r.made:  # its cells at hand
                for c in r.cells:
                    if c.util is not None:
                        util_sum += c.util * c.fraction
                        util_weight += c.fraction
            elif r.util is not None:  # the row's mean over its cells, by their share of a GPU
                util_sum += r.util * r.util_weight
                util_weight += r.util_weight
        else:
            unknown += r.gpus
        used += r.memory_used
        total += r.memory_total
        procs += r.processes
    return Totals(
        nodes=len(rows),
        gpus=gpus,
        busy=round(busy, 6),
        idle=round(idle, 6),
        held=round(held, 6),
        unknown=unknown,
        util=util_sum / util_weight if util_weight > 0 else None,
        memory_used=used,
        memory_total=total,
        processes=procs,
    )


@dataclass(frozen=True)
class Group:
    """A team's nodes (grouped by team) or all nodes (grouped by node; `team` is '')."""

    team: str
    totals: Totals
    rows: tuple[NodeRow, ...]


def _subset(row: NodeRow, cells: tuple[Cell, ...]) -> NodeRow:
    """A node row with only some of its GPUs (a node whose GPUs belong to several teams)."""
    gpus = len({c.gpu for c in cells})
    busy = round(sum(c.fraction for c in cells if c.busy), 6)
    held = round(sum(c.fraction for c in cells if c.held), 6)
    return NodeRow(
        name=row.name,
        address=row.address,
        state=row.state,
        reason=row.reason,
        since=row.since,
        last_seen=row.last_seen,
        owner=row.owner,
        models=row.models,
        cells=cells,
        gpus=gpus,
        busy=busy if row.has_data else 0.0,
        held=held if row.has_data else 0.0,
        util=weighted_util(cells),
        memory_used=sum(c.memory_used or 0 for c in cells if c.kind != SLICE),
        memory_total=sum(c.memory_total or 0 for c in cells if c.kind in (GPU, LOST)),
        processes=sum(c.processes for c in cells),
        search=row.search,
    )


def group_rows(
    rows: Iterable[NodeRow],
    by: str = BY_TEAM,
    sort: str = "name",
    reverse: bool = False,
    flt: Filter | None = None,
    now: float = 0.0,
) -> tuple[Group, ...]:
    """The grid's groups: by team (a node's GPUs under their owners, teams by name, unowned last)
    or one group of every node; rows filtered and sorted inside each group."""
    if by == BY_NODE:
        kept = sort_rows(filter_rows(rows, flt), sort, now, reverse)
        return (Group("", totals(kept), tuple(kept)),)
    teams: dict[str, list[NodeRow]] = {}
    for row in rows:
        owners = row.owners or {row.owner}  # the owners of its cells, known without making them
        if len(owners) == 1:
            teams.setdefault(next(iter(owners)) or UNOWNED, []).append(row)
            continue
        for owner in sorted(owners, key=lambda o: o or "~"):
            part = _subset(row, tuple(c for c in row.cells if c.owner == owner))
            teams.setdefault(owner or UNOWNED, []).append(part)
    groups = []
    for team in sorted(teams, key=lambda t: (t == UNOWNED, t)):
        members = teams[team]
        kept = [r for r in members if flt is None or flt.matches(f"{team} {r.search}")]
        if not kept:
            continue
        kept = sort_rows(kept, sort, now, reverse)
        groups.append(Group(team, totals(kept), tuple(kept)))
    return tuple(groups)
