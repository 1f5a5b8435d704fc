"""Tenants now and over the session (gpuops.views.tenants, tenant_history) on the simulated silos fleet."""

from __future__ import annotations

import pytest

from gpuops.core.model import GpuProcess
from gpuops.fleet.source import UNREACHABLE
from gpuops.simfleet.source import SimSource
from gpuops.tenancy.ownership import Ownership
from gpuops.tui.widgets import TeamHeader
from gpuops.views.tenant_history import TenantHistory
from gpuops.views.tenants import TenantRow, sort_tenants, tenant_rows
from tests.tui.conftest import Clock


def _tenants(source: SimSource, now: float) -> dict[str, TenantRow]:
    return {r.team: r for r in tenant_rows(source.snapshot(now), source.ownership())}


def test_tenants_own_use_borrow_and_waste(source: SimSource, clock: Clock) -> None:
    rows = _tenants(source, clock())
    assert set(rows) == {"analytics", "chat", "platform", "research", "robotics", "speech", "vision"}
    robotics = rows["robotics"]  # an idle silo: all of it is waste
    assert (robotics.owned, robotics.used, robotics.idle, robotics.waste) == (8, 0, 8, 8)
    assert robotics.processes == 0
    speech = rows["speech"]  # saturated: nothing idle, almost no waste
    assert speech.owned == 4 and speech.idle == 0 and speech.waste < 0.2
    platform = rows["platform"]  # MIG node serving other teams: lends, uses nothing itself
    assert platform.used == 0 and platform.lent > 1.5 and platform.idle > 0
    assert rows["chat"].borrowed > 0 and rows["research"].borrowed > 0
    borrowed = sum(r.borrowed for r in rows.values())
    assert borrowed == pytest.approx(sum(r.lent for r in rows.values()))
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    assert sum(r.owned for r in rows.values()) == 48
    # Sorted by waste: the idle silos first, the saturated team last.
    order = [r.team for r in sort_tenants(rows.values())]
    assert order[0] == "robotics" and order[-1] == "speech"
    assert [r.team for r in sort_tenants(rows.values(), "name")] == sorted(rows)
    assert [r.team for r in sort_tenants(rows.values(), "waste", reverse=True)] == order[::-1]


def test_unreachable_nodes_count_as_unknown_not_idle(source: SimSource, clock: Clock) -> None:
    source.set_state("sim-robotics-01", UNREACHABLE, "connection refused")
    robotics = _tenants(source, clock())["robotics"]
    assert robotics.owned == 8 and robotics.unknown == 8 and robotics.idle == 0 and robotics.waste == 0


def test_tenant_attribution() -> None:
    own = Ownership(("a", "b"), lambda n, i: "a", {"bob": "b"}.get)
    limited = GpuProcess(1, 0, user="x", tenant="c", tenant_source="limiter")
    assert own.tenant(limited, "a") == ("c", "limiter")
    assert own.tenant(GpuProcess(1, 0, user="bob"), "a") == ("b", "user")
    assert own.tenant(GpuProcess(1, 0, user="eve"), "a") == ("a", "owner")


def test_history_over_the_session_stays_bounded(source: SimSource, clock: Clock) -> None:
    history = TenantHistory(limit=16)
    ownership = source.ownership()
    for _ in range(100):  # 14:00 to 22:20
        clock.advance(300)
        source.sample()
        history = history.record(clock(), tenant_rows(source.snapshot(clock()), ownership))
    assert 8 <= history.points <= 16 and history.step > 1
    assert all(v == 8 for v in history.values("robotics", "owned"))
    assert all(v == 0 for v in history.values("robotics", "share"))
    assert history.session_share("vision") > 0.3
    assert history.values("nobody", "owned") == ()
    # The inference team follows the working day: its GPU-time share moves over the session.
    chat = history.values("chat", "share")
    assert max(chat) - min(chat) > 5


def test_pool_guarantees_are_not_borrowed_and_pool_gpus_not_lent(source: SimSource, clock: Clock) -> None:
    """A team's use of pool GPUs up to its guarantee is its own, not borrowed (as `gpuops tenants`
    counts it over a window); a pool GPU is shared, not lent by the team that bought it."""
    from pathlib import Path

    from gpuops.simfleet.runner import SimPaths, fleet_document
    from gpuops.spec.loader import fleet_from_data

    plan = source.plan
    ports = {n.name: 2200 + i for i, n in enumerate(plan.nodes)}
    document = fleet_document(plan, ports, SimPaths(Path("/nonexistent")), "op")
    snapshot = source.snapshot(clock())
    silos = {r.team: r for r in tenant_rows(snapshot, Ownership.from_fleet(fleet_from_data(document)))}
    assert silos["platform"].lent > 1.5 and silos["chat"].borrowed > 0 and silos["research"].borrowed > 0
    assert silos["chat"].guaranteed == silos["chat"].owned  # silos only: its own GPUs

    # The platform team's MIG node (4 GPUs) pooled: chat guaranteed half of it, research a quarter.
    document["pools"] = {
        "shared": {
            "gpus": [{"nodes": "sim-platform-01"}],
            "policy": "burst-share",
            "borrowing": True,
            "carving": "mig",
            "guarantees": {"chat": "50%", "research": "25%"},
        }
    }
    pooled = {r.team: r for r in tenant_rows(snapshot, Ownership.from_fleet(fleet_from_data(document)))}
    assert pooled["platform"].lent == 0 and pooled["platform"].owned == 4
    assert pooled["platform"].guaranteed == 0  # all of its GPUs are in the pool
    assert pooled["chat"].guaranteed == pytest.approx(silos["chat"].owned + 2.0)
    assert pooled["research"].guaranteed == pytest.approx(silos["research"].owned + 1.0)
    for team, guarantee in (("chat", 2.0), ("research", 1.0)):
        assert pooled[team].used == silos[team].used  # the same processes, counted the same
        assert pooled[team].borrowed == pytest.approx(max(0.0, silos[team].borrowed - guarantee))
    assert pooled["chat"].borrowed < silos["chat"].borrowed
    # The pool's capacity is the pool's: its row has the idle MIG slices platform's silo had.
    pool, platform = pooled["pool shared"], pooled["platform"]
    assert (pool.pool, pool.owned, pool.silo, pool.guaranteed) == ("shared", 4, 4, 3.0)
    before = silos["platform"]
    assert (pool.idle, pool.waste) == (pytest.approx(before.idle), pytest.approx(before.waste))
    assert (platform.silo, platform.pooled, platform.idle, platform.waste) == (0, 4, 0, 0)
    assert pool.used == pool.gpu_time == pool.share == 0  # the use is the teams'
    assert sum(r.share for r in pooled.values()) == pytest.approx(1.0)
    order = list(pooled)  # teams by name, then the pools, then the unowned
    assert order.index("pool shared") == len([t for t in order if t != "(unowned)"]) - 1
    # The grid's chips: a team's silo and what it put in pools; the pool's own busy and idle.
    assert TeamHeader._chip(platform).plain == "platform 4 in pools"
    # Busy: the slices whose SMs work (GPM); a slice holding a process at 0% is held idle.
    assert TeamHeader._chip(pool).plain.startswith("pool shared 1.9/4 busy 2.1 idle (0.1 held)")
    assert TeamHeader._chip(silos["platform"]).plain.startswith("platform 1.9/4 busy 2.1 idle (0.1 held)")
