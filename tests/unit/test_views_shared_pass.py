"""The per-GPU pass the node rows and the tenants share (gpuops.views.gpus), its attribution
memo (Ownership.tenant) and the reuse of a node's tenants between snapshots give exactly the rows
the code before them gave: the old functions are kept here, verbatim, as the reference, and both
are run on a large simulated fleet over consecutive snapshots, with the odd cases added (lost
GPUs, nodes without data or only an inventory, processes without a memory figure or a user,
several tenants on one GPU, pools), and with an attribution plugin that changes its mind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuops.core.history import instance_fraction
from gpuops.core.model import Gpu, GpuProcess, NotAvailable
from gpuops.fleet.source import LIVE, STALE, UNREACHABLE, FleetSnapshot, NodeView
from gpuops.simfleet.source import SimSource
from gpuops.tenancy.attribution import Attribution, AttributionChain, AttributionContext
from gpuops.tenancy.builtin import OwnerAttributor, UserAttributor
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.cells import (
    EMPTY_MIG,
    FREE,
    GPU,
    LOST,
    SLICE,
    Cell,
    gpu_cells,
    weighted_util,
)
from gpuops.views.common import (
    BUSY,
    BUSY_PERCENT,
    HELD,
    as_float,
    as_int,
    capacity_state,
    gpu_lost,
    mig_active,
    percent_of,
    short_model,
    whole_gpu_state,
)
from gpuops.views.nodes import NodeRow, RowCache, node_rows
from gpuops.views.partition import partition_label
from gpuops.views.tenants import TenantRow, _Acc, _process_memory, _weights, pool_row_name, tenant_rows

EPOCH = 1772409600.0 + 14 * 3600  # a Monday, 14:00 UTC (as bench/tui_refresh.py)

# ---- the reference: the view models as they were before the shared pass (commit d1acc47) ----------


def old_gpu_cells(view: NodeView, gpu: Gpu, ownership: Ownership) -> list[Cell]:
    owner = ownership.owner(view, gpu)
    model = short_model(gpu.info.name)
    node, index = view.name, gpu.info.index
    if gpu_lost(gpu):
        return [Cell(node, index, LOST, owner, model)]
    tenant_of = [ownership.tenant(p, owner)[0] for p in gpu.processes]
    if mig_active(gpu):
        assert gpu.mig is not None
        cells: list[Cell] = []
        used = 0.0
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
            procs = [
                (p, t) for p, t in zip(gpu.processes, tenant_of, strict=True) if p.gpu_instance_id == gi.id
            ]
            fraction = instance_fraction(gpu, gi)
            used += fraction
            sample = samples.get(gi.id)
            mem_used = as_int(sample.memory_used_bytes) if sample else None
            mem_total = (as_int(sample.memory_total_bytes) if sample else None) or gi.memory_total_bytes
            util = as_float(sample.sm_utilization_percent) if sample else None
            memory = percent_of(mem_used, mem_total)
            state = capacity_state(util, len(procs), memory)
            cells.append(
                Cell(
                    node,
                    index,
                    SLICE,
                    owner,
                    model,
                    instance=gi.id,
                    profile=gi.profile_name,
                    util=util,
                    memory=memory,
                    memory_used=mem_used,
                    memory_total=mem_total,
                    busy=state == BUSY,
                    held=state == HELD,
                    fraction=fraction,
                    processes=len(procs),
                    tenants=tuple(sorted({t for _, t in procs})),
                    users=tuple(sorted({p.user for p, _ in procs if p.user})),
                )
            )
        if not cells:
            return [Cell(node, index, EMPTY_MIG, owner, model)]
        free = round(1.0 - used, 6)
        if free > 0.01:
            cells.append(Cell(node, index, FREE, owner, model, profile="free", fraction=free))
        return cells
    s = gpu.sample
    modes = partition_label(gpu)
    if s is None:
        total = as_int(gpu.info.memory_total_bytes)
        return [Cell(node, index, GPU, owner, model, profile=modes, memory_total=total)]
    used_bytes, total_bytes = as_int(s.memory_used_bytes), as_int(s.memory_total_bytes)
    gpu_procs = gpu.processes
    state = whole_gpu_state(gpu)
    return [
        Cell(
            node,
            index,
            GPU,
            owner,
            model,
            profile=modes,
            util=as_float(s.utilization_gpu_percent),
            memory=percent_of(used_bytes, total_bytes),
            memory_used=used_bytes,
            memory_total=total_bytes,
            busy=state == BUSY,
            held=state == HELD,
            processes=len(gpu_procs),
            tenants=tuple(sorted(set(tenant_of))) if gpu_procs else (),
            users=tuple(sorted({p.user for p in gpu_procs if p.user})) if gpu_procs else (),
        )
    ]


def old_node_row(view: NodeView, ownership: Ownership) -> NodeRow:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    cells: list[Cell] = []
    models: dict[str, int] = {}
    processes = mem_used = mem_total = 0
    for gpu in gpus:
        cells.extend(old_gpu_cells(view, gpu, ownership))
        name = short_model(gpu.info.name)
        models[name] = models.get(name, 0) + 1
        s = gpu.sample
        if s is not None:
            mem_used += as_int(s.memory_used_bytes) or 0
        mem_total += as_int(gpu.info.memory_total_bytes) or 0
        processes += len(gpu.processes)
    model_text = ", ".join(f"{n}x {m}" for m, n in sorted(models.items()))
    sampled = view.sample is not None
    busy = round(sum(c.fraction for c in cells if c.busy), 6) if sampled else 0.0
    held = round(sum(c.fraction for c in cells if c.held), 6) if sampled else 0.0
    words = [view.name, view.owner or "", model_text, view.state, view.address]
    for c in cells:
        words.extend(c.tenants)
        words.extend(c.users)
        if c.owner:
            words.append(c.owner)
        if c.profile:
            words.append(c.profile)
    return NodeRow(
        name=view.name,
        address=view.address,
        state=view.state,
        reason=view.reason,
        since=view.since,
        last_seen=view.last_seen,
        owner=view.owner,
        models=model_text,
        cells=tuple(cells),
        gpus=len(gpus),
        busy=busy,
        util=weighted_util(cells),
        memory_used=mem_used,
        memory_total=mem_total,
        processes=processes,
        search=" ".join(dict.fromkeys(w for w in words if w)),
        held=held,
    )


def old_tenant_rows(snapshot: FleetSnapshot, ownership: Ownership) -> tuple[TenantRow, ...]:
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
        gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
        for gpu in gpus:
            owner = ownership.owner(view, gpu) or UNOWNED
            pool = ownership.pool(view, gpu)
            o = get(owner)
            o.owned += 1
            o.memory_owned += as_int(gpu.info.memory_total_bytes) or 0
            # Who answers for this GPU's capacity (idle, waste, no data): its silo's team, or its pool.
            if pool is None:
                c = o
            else:
                c = pools.setdefault(pool, _Acc())
                c.owned += 1
                c.memory_owned += as_int(gpu.info.memory_total_bytes) or 0
            c.silo += 1
            if not current:
                c.unknown += 1
                continue
            if gpu_lost(gpu):
                c.idle += 1.0
                c.waste += 1.0
                continue
            tenants = [ownership.tenant(p, owner)[0] for p in gpu.processes]
            if mig_active(gpu):
                _old_mig_usage(gpu, owner, pool is not None, c, tenants, get)
                continue
            s = gpu.sample
            c.capacity(whole_gpu_state(gpu), 1.0)
            util = as_float(s.utilization_gpu_percent) if s else None
            memories = _process_memory(gpu.processes, as_int(s.memory_used_bytes) if s else None)
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


def _old_mig_usage(
    gpu: Gpu, owner: str, pooled: bool, capacity: _Acc, tenants: list[str], get: Callable[[str], _Acc]
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


# ---- the fleet ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[SimSource, list[float]]]:
    clock = [EPOCH]
    source = SimSource.scenario("large", 160, epoch=EPOCH - 86400, clock=lambda: clock[0])
    source.sample()
    yield source, clock


def _lost(gpu: Gpu) -> Gpu:
    assert gpu.sample is not None
    return replace(gpu, sample=replace(gpu.sample, memory_total_bytes=NotAvailable("GPU_IS_LOST")))


def _odd(snapshot: FleetSnapshot, step: int) -> FleetSnapshot:
    """The snapshot with the cases a simulated fleet rarely has, on different nodes at each step."""
    views = list(snapshot.nodes)
    n = len(views)
    for k, view in enumerate(views):
        if view.sample is None:
            continue
        pick = (k + step) % 9
        gpus = list(view.sample.gpus)
        if pick == 0:  # a lost GPU
            gpus[0] = _lost(gpus[0])
        elif pick == 1 and gpus[0].processes:  # no memory figure, no user, a stranger, two teams
            p = gpus[0].processes[0]
            gpus[0] = replace(
                gpus[0],
                processes=(
                    replace(p, used_memory_bytes=NotAvailable("NOT_SUPPORTED")),
                    replace(p, pid=p.pid + 1, user="", used_memory_bytes=NotAvailable("NOT_SUPPORTED")),
                    replace(p, pid=p.pid + 2, user="stranger", groups=("nobody",)),
                    replace(p, pid=p.pid + 3, tenant="limited", tenant_source="limiter"),
                ),
            )
        elif pick == 2:  # an idle GPU without processes but busy (processes we may not list)
            g = gpus[-1]
            if g.sample is not None and not mig_active(g):
                gpus[-1] = replace(g, processes=(), sample=replace(g.sample, utilization_gpu_percent=80.0))
        views[k] = replace(view, sample=replace(view.sample, gpus=tuple(gpus)))
    first = views[step % n]
    views[step % n] = replace(first, state=UNREACHABLE, reason="connection refused")  # old data
    second = views[(step + 7) % n]
    views[(step + 7) % n] = replace(second, state=STALE)
    third = views[(step + 13) % n]
    views[(step + 13) % n] = replace(third, sample=None, state=LIVE)  # only its inventory (or none)
    return replace(snapshot, nodes=tuple(views))


def _snapshots(fleet: tuple[SimSource, list[float]], count: int) -> list[FleetSnapshot]:
    source, clock = fleet
    out = []
    for step in range(count):
        clock[0] += 1.0
        source.sample()
        snapshot = source.snapshot(clock[0])
        out.append(_odd(snapshot, step) if step % 2 else snapshot)
    return out


def _pooled(source: SimSource) -> Ownership:
    from gpuops.simfleet.runner import SimPaths, fleet_document
    from gpuops.spec.loader import fleet_from_data

    plan = source.plan
    ports = {n.name: 2200 + i for i, n in enumerate(plan.nodes)}
    document = fleet_document(plan, ports, SimPaths(Path("/nonexistent")), "op")
    nodes = [n.name for n in plan.nodes]
    document["pools"] = {
        "shared": {
            "gpus": [{"nodes": nodes[0]}, {"nodes": nodes[5]}],
            "policy": "burst-share",
            "borrowing": True,
            "guarantees": {sorted(plan.teams)[0]: "50%"},
        }
    }
    return Ownership.from_fleet(fleet_from_data(document))


def _same(snapshots: list[FleetSnapshot], make: Callable[[], Ownership]) -> None:
    shared, reference = make(), make()
    cache = RowCache()
    for snapshot in snapshots:
        # as the feed asks: the tenants first, then the node rows (lazily, through the RowCache)
        assert tenant_rows(snapshot, shared) == old_tenant_rows(snapshot, reference)
        want = tuple(old_node_row(v, reference) for v in snapshot.nodes)
        assert cache.rows(snapshot, shared) == want
        assert node_rows(snapshot, make()) == want  # a fresh ownership: nothing remembered
        for view in snapshot.nodes[:20]:
            gpus = view.sample.gpus if view.sample else ()
            for gpu in gpus:
                assert gpu_cells(view, gpu, shared) == old_gpu_cells(view, gpu, reference)


def test_shared_pass_gives_the_rows_of_before(fleet: tuple[SimSource, list[float]]) -> None:
    source, _ = fleet
    snapshots = _snapshots(fleet, 6)
    assert sum(len(v.sample.gpus) for v in snapshots[0].nodes if v.sample) >= 1000
    kinds = {c.kind for v in snapshots[1].nodes for c in old_node_row(v, Ownership()).cells}
    assert {GPU, SLICE, LOST} <= kinds  # the cases are there
    _same(snapshots, lambda: source.ownership())
    _same(snapshots, Ownership)  # no fleet.yaml: owners the nodes report, the default chain
    _same(snapshots, lambda: _pooled(source))


class Fickle:
    """A plugin whose answer changes between updates (as the Kubernetes one's does when its pods
    file changes): its answers must not be remembered."""

    name = "fickle"

    def __init__(self) -> None:
        self.team = "first"

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        return Attribution(self.team, "fickle") if process.user else None


def test_a_plugin_is_asked_again_at_every_update(fleet: tuple[SimSource, list[float]]) -> None:
    source, _ = fleet
    fickle = Fickle()
    chain = AttributionChain([("fickle", fickle), ("user", UserAttributor()), ("owner", OwnerAttributor())])
    base = source.ownership()
    own = Ownership(base.teams, base.gpu_owner_of, base.team_of_user, chain=chain)
    assert not own.stable_attribution and base.stable_attribution
    snapshot = _snapshots(fleet, 1)[0]
    first = {r.team: r for r in tenant_rows(snapshot, own)}
    assert first["first"].processes > 0 and "second" not in first
    fickle.team = "second"
    again = {r.team: r for r in tenant_rows(_snapshots(fleet, 1)[0], own)}  # a new snapshot
    assert again["second"].processes == first["first"].processes and "first" not in again
    rows = node_rows(snapshot, own)
    assert any("second" in c.tenants for r in rows for c in r.cells)
