"""The tenants screen now: per team what it owns, uses, borrows, lends and wastes; one row per pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpuops.core.history import instance_fraction
from gpuops.core.model import Gpu, GpuProcess
from gpuops.fleet.collector import LIVE, STALE, FleetSnapshot
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.common import (
    BUSY,
    BUSY_PERCENT,
    HELD,
    as_float,
    as_int,
    capacity_state,
    percent_of,
)
from gpuops.views.filter import Filter
from gpuops.views.gpus import node_pass


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


class _Acc:
    __slots__ = (
        "gpu_time",
        "held",
        "idle",
        "lent",
        "memory_owned",
        "memory_used",
        "outside",
        "owned",
        "processes",
        "silo",
        "unknown",
        "used",
        "waste",
    )

    def __init__(self) -> None:
        self.owned = self.silo = self.unknown = self.processes = self.memory_used = self.memory_owned = 0
        self.used = self.outside = self.lent = self.idle = self.held = self.waste = self.gpu_time = 0.0

    def capacity(self, state: str, amount: float) -> None:
        """`amount` GPU-equivalents of its capacity in `state` (common.capacity_state)."""
        if state != BUSY:
            self.idle += amount
            if state == HELD:
                self.held += amount

    def use(self, team: str, owner: _Acc, owner_name: str, pooled: bool, amount: float) -> None:
        """`amount` GPU-equivalents used by this team (`team`) on a GPU of `owner_name`. Use
        outside its silo is borrowing only beyond its pool guarantees (settled at the end, as
        `gpuops tenants` does over a window); pool GPUs are shared, not lent."""
        self.used += amount
        if team != owner_name or pooled:
            self.outside += amount
        if team != owner_name and not pooled:
            owner.lent += amount


def _weights(processes: Sequence[GpuProcess], tenants: Sequence[str]) -> dict[str, float]:
    """Each tenant's share of a GPU (or slice): by the memory its processes hold, else equal."""
    held: dict[str, int] = {}
    for p, t in zip(processes, tenants, strict=True):
        held[t] = held.get(t, 0) + (as_int(p.used_memory_bytes) or 0)
    total = sum(held.values())
    if total > 0:
        return {t: m / total for t, m in held.items()}
    return {t: 1.0 / len(held) for t in held}


def _process_memory(processes: Sequence[GpuProcess], fallback: int | None) -> list[int]:
    """Memory per process; where NVML did not say, an equal share of what the device holds."""
    known = [as_int(p.used_memory_bytes) for p in processes]
    if all(k is not None for k in known):
        return [k or 0 for k in known]
    share = (fallback or 0) // max(1, len(processes))
    return [k if k is not None else share for k in known]


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
        current = view.sample is not None and view.state in (LIVE, STALE)
        for g in node_pass(view, ownership).gpus:  # shared with the node rows (views.gpus)
            gpu = g.gpu
            owner = g.owner or UNOWNED
            pool = g.pool
            o = acc.get(owner) or get(owner)
            o.owned += 1
            memory = gpu.info.memory_total_bytes
            memory = (memory if type(memory) is int else as_int(memory)) or 0
            o.memory_owned += memory
            # Who answers for this GPU's capacity (idle, waste, no data): its silo's team, or its pool.
            if pool is None:
                c = o
            else:
                c = pools.setdefault(pool, _Acc())
                c.owned += 1
                c.memory_owned += memory
            c.silo += 1
            if not current:
                c.unknown += 1
                continue
            if g.lost:
                c.idle += 1.0
                c.waste += 1.0
                continue
            tenants = g.tenants
            if g.mig:
                _mig_usage(gpu, owner, pool is not None, c, tenants, get)
                continue
            c.capacity(g.state, 1.0)  # common.whole_gpu_state
            util = g.util  # as_float(sample.utilization_gpu_percent); None without a sample
            if len(tenants) == 1:  # the usual GPU: one process, all its use (_weights: 1.0)
                (t,) = tenants
                a = acc.get(t) or get(t)
                m = as_int(gpu.processes[0].used_memory_bytes)
                a.memory_used += (g.memory_used or 0) if m is None else m  # _process_memory
                a.processes += 1
                busy_time = util / 100.0 if util is not None else 1.0
                a.use(t, o, owner, pool is not None, 1.0)
                a.gpu_time += busy_time * 1.0
                c.waste += 1.0 - min(1.0, busy_time)
                continue
            memories = _process_memory(gpu.processes, g.memory_used)
            for t, m in zip(tenants, memories, strict=True):
                get(t).memory_used += m
                get(t).processes += 1
            if tenants:
                weights = _weights(gpu.processes, tenants)
                busy_time = util / 100.0 if util is not None else 1.0
                for t, w in weights.items():
                    a = get(t)
                    a.use(t, o, owner, pool is not None, w)
                    a.gpu_time += busy_time * w
                c.waste += 1.0 - min(1.0, busy_time)
            elif util is not None and util >= BUSY_PERCENT:
                # Busy with processes we cannot see (no permission to list them): the owner's.
                o.used += 1.0
                o.gpu_time += util / 100.0
                c.waste += 1.0 - min(1.0, util / 100.0)
            else:
                c.waste += 1.0 - min(1.0, (util or 0.0) / 100.0)
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


def _mig_usage(
    gpu: Gpu, owner: str, pooled: bool, capacity: _Acc, tenants: Sequence[str], get: Callable[[str], _Acc]
) -> None:
    """A MIG GPU's instances: their users' use, and free or unused slices as `capacity`'s idle."""
    assert gpu.mig is not None
    o = get(owner)
    samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
    allocated = 0.0
    for gi in gpu.mig.gpu_instances:
        fraction = instance_fraction(gpu, gi)
        allocated += fraction
        procs = [(p, t) for p, t in zip(gpu.processes, tenants, strict=True) if p.gpu_instance_id == gi.id]
        sample = samples.get(gi.id)
        util = as_float(sample.sm_utilization_percent) if sample else None
        memory = percent_of(sample.memory_used_bytes, sample.memory_total_bytes) if sample else None
        capacity.capacity(capacity_state(util, len(procs), memory), fraction)
        if not procs:
            capacity.waste += fraction
            continue
        # GPU-time: the slice's SM utilization where GPM gives it, else all of it (a process
        # holds it and NVML says nothing more).
        busy_time = min(1.0, util / 100.0) if util is not None else 1.0
        capacity.waste += fraction * (1.0 - busy_time)
        memories = _process_memory(
            [p for p, _ in procs], as_int(sample.memory_used_bytes) if sample else None
        )
        for (_, t), m in zip(procs, memories, strict=True):
            get(t).memory_used += m
            get(t).processes += 1
        for t, w in _weights([p for p, _ in procs], [t for _, t in procs]).items():
            a = get(t)
            a.use(t, o, owner, pooled, fraction * w)
            a.gpu_time += fraction * w * busy_time
    free = max(0.0, 1.0 - allocated)
    capacity.idle += free
    capacity.waste += free


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
