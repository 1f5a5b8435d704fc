"""The tenants screen now: per team what it owns, uses, borrows, lends and wastes; one row per pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuops.fleet.source import FleetSnapshot
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.filter import Filter
from gpuops.views.gpus import TeamAcc, node_facts, process_memory, weights


def team_label(team: str) -> str:
    """A team as the tables name it: the row of GPUs nobody owns reads `unowned`."""
    return "unowned" if team == UNOWNED else team


@dataclass(frozen=True)
class TenantRow:
    """A team now: what it owns, what it uses (anywhere) and what of its own lies idle. A pool of
    fleet.yaml has a row too (`pool` set, team `pool NAME`): its GPUs' idle capacity and waste are
    the pool's, no longer the silo figures of the teams that bought them."""

    team: str
    owned: int = 0  # GPUs it owns (bought), in its silo or in pools; a pool's row: its GPUs
    unknown: int = 0  # of its silo's GPUs (a pool's: of its GPUs), those without current data
    used: float = 0.0  # GPU-equivalents holding its processes, on any team's GPUs
    guaranteed: float = 0.0  # its silo GPUs + its pool guarantees; a pool's row: all it guarantees
    borrowed: float = 0.0  # of `used`, outside its silo and beyond its pool guarantees
    lent: float = 0.0  # its silo GPUs in use by other teams
    idle: float = 0.0  # silo (a pool's row: pool) GPU-equivalents not busy, free MIG slices included
    held: float = 0.0  # of `idle`, what holds processes or memory at under 5% utilization
    waste: float = 0.0  # silo (a pool's row: pool) capacity minus the GPU-time delivered on it
    gpu_time: float = 0.0  # utilization-weighted GPU-equivalents it uses now
    share: float = 0.0  # of the fleet's GPU-time now, 0..1
    memory_used: int = 0  # bytes its processes hold
    memory_owned: int = 0  # memory of the GPUs it owns
    processes: int = 0
    silo: int = 0  # of `owned`, GPUs in no pool (a pool's row: its GPUs)
    pool: str | None = None  # the pool's name, on a pool's row

    @property
    def pooled(self) -> int:
        """GPUs it bought that are in pools now."""
        return 0 if self.pool is not None else self.owned - self.silo


POOL_ROW = "pool "  # a pool's row is team "pool NAME": no team name has a space


def pool_row_name(pool: str) -> str:
    return POOL_ROW + pool


# The names the per-GPU accounting had here before it moved into the fused pass (views.gpus).
_Acc = TeamAcc
_weights = weights
_process_memory = process_memory


def tenant_rows(snapshot: FleetSnapshot, ownership: Ownership) -> tuple[TenantRow, ...]:
    """One row per team (fleet.yaml's teams, owners and tenants seen), by team name, then one
    per pool with GPUs seen, then the unowned."""
    acc: dict[str, _Acc] = {t: _Acc() for t in ownership.teams}
    pools: dict[str, _Acc] = {}

    def get(team: str) -> _Acc:
        a = acc.get(team)
        if a is None:
            a = acc[team] = _Acc()
        return a

    for view in snapshot.nodes:
        # Each node's GPUs summed once per view (views.gpus.node_facts, shared with the node
        # rows), so an update adds a few figures per node here, not per GPU.
        facts = node_facts(view, ownership)
        for team, part in facts.teams.items():
            a = acc.get(team) or get(team)
            a.add(part)
        for name, part in facts.pools.items():
            p = pools.get(name)
            if p is None:
                p = pools[name] = _Acc()
            p.add(part)
    total_time = sum(a.gpu_time for a in acc.values())
    fleet = ownership.fleet
    sizes = {name: p.owned for name, p in pools.items()}
    in_pools = fleet.pool_guarantees(sizes) if fleet is not None else {}
    teams = [
        TenantRow(
            team=team,
            owned=a.owned,
            unknown=a.unknown,
            used=round(a.used, 6),
            guaranteed=round(a.silo + in_pools.get(team, 0.0), 6),
            borrowed=round(max(0.0, a.outside - in_pools.get(team, 0.0)), 6),
            lent=round(a.lent, 6),
            idle=round(a.idle, 6),
            held=round(a.held, 6),
            waste=round(a.waste, 6),
            gpu_time=round(a.gpu_time, 6),
            share=a.gpu_time / total_time if total_time > 0 else 0.0,
            memory_used=a.memory_used,
            memory_owned=a.memory_owned,
            processes=a.processes,
            silo=a.silo,
        )
        for team, a in sorted(acc.items())
    ]
    for name, p in sorted(pools.items()):
        guarantees = fleet.pools[name].guarantees if fleet is not None and name in fleet.pools else {}
        promised = sum(g.share for g in guarantees.values()) / 100.0 * p.owned
        teams.append(
            TenantRow(
                team=pool_row_name(name),
                owned=p.owned,
                unknown=p.unknown,
                guaranteed=round(promised, 6),
                idle=round(p.idle, 6),
                held=round(p.held, 6),
                waste=round(p.waste, 6),
                memory_owned=p.memory_owned,
                silo=p.silo,
                pool=name,
            )
        )
    return tuple(sorted(teams, key=lambda r: (r.team == UNOWNED, r.pool is not None, r.team)))


TENANT_SORTS: dict[str, tuple[Callable[[TenantRow], object], bool]] = {
    "waste": (lambda r: r.waste, True),
    "name": (lambda r: r.team, False),
    "owned": (lambda r: r.owned, True),
    "used": (lambda r: r.used, True),
    "idle": (lambda r: r.idle, True),
    "held": (lambda r: r.held, True),
    "share": (lambda r: r.share, True),
    "memory": (lambda r: r.memory_used, True),
    "borrowed": (lambda r: r.borrowed, True),
    "processes": (lambda r: r.processes, True),
}


def sort_tenants(
    rows: Iterable[TenantRow], key: str = "waste", reverse: bool = False, flt: Filter | None = None
) -> list[TenantRow]:
    """Tenants sorted (waste first by default), optionally filtered by team name."""
    fn, descending = TENANT_SORTS[key]
    kept = sorted((r for r in rows if flt is None or flt.matches(r.team)), key=lambda r: r.team)
    return sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]
