"""The pure computations behind the screens (gpuops.fleet.views) on the simulated silos fleet."""

from __future__ import annotations

import pytest

from gpuops.core.model import GpuProcess
from gpuops.fleet.collector import LIVE, STALE, UNREACHABLE, FleetEvent
from gpuops.fleet.simsource import SimSource
from gpuops.fleet.views import (
    BY_NODE,
    BY_TEAM,
    FREE,
    SLICE,
    FilterError,
    Ownership,
    TenantHistory,
    TenantRow,
    event_rows,
    find_gpu,
    fleet_status,
    group_rows,
    mig_layout,
    node_rows,
    parse_filter,
    process_rows,
    sort_rows,
    sort_tenants,
    tenant_rows,
)
from gpuops.tui import render
from gpuops.tui.feed import Feed
from gpuops.tui.widgets import TeamHeader
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


def test_rows_and_cells(source: SimSource, clock: Clock) -> None:
    rows = {r.name: r for r in node_rows(source.snapshot(clock()), source.ownership())}
    platform = rows["sim-platform-01"]
    assert platform.gpus == 4 and all(c.kind in (SLICE, FREE) for c in platform.cells)
    # Two GPUs with 3g+2g+1g+1g and two with seven 1g slices: 22 cells.
    assert len(platform.cells) == 22
    assert {c.profile for c in platform.cells} == {"3g.40gb", "2g.20gb", "1g.10gb"}
    used = [c for c in platform.cells if c.busy]
    assert used and all(c.tenants and c.util is None for c in used)
    robotics = rows["sim-robotics-01"]
    assert robotics.busy == 0 and robotics.idle == 8 and all(c.util == 0 for c in robotics.cells)
    assert "judy" not in robotics.search and "robotics" in robotics.search


def test_groups_filters_and_sorting(source: SimSource, clock: Clock) -> None:
    rows = node_rows(source.snapshot(clock()), source.ownership())
    groups = group_rows(rows, BY_TEAM, now=clock())
    assert [g.team for g in groups] == sorted(g.team for g in groups)
    vision = next(g for g in groups if g.team == "vision")
    assert [r.name for r in vision.rows] == ["sim-vision-01", "sim-vision-02"]
    assert vision.totals.gpus == 16 and vision.totals.busy == 16
    (flat,) = group_rows(rows, BY_NODE, "util", now=clock())
    assert flat.team == "" and len(flat.rows) == 8
    utils = [r.util for r in flat.rows if r.util is not None]
    assert utils == sorted(utils, reverse=True)
    # A filter matches names, owners, tenants and users; "!" inverts it.
    only = group_rows(rows, BY_TEAM, flt=parse_filter("vision"), now=clock())
    assert {g.team for g in only} >= {"vision"}
    assert all(g.team == "vision" or "vision" in " ".join(r.search for r in g.rows) for g in only)
    hidden = group_rows(rows, BY_TEAM, flt=parse_filter("!vision|platform"), now=clock())
    assert {g.team for g in hidden}.isdisjoint({"vision", "platform"})
    assert [g.team for g in group_rows(rows, BY_TEAM, flt=parse_filter("JUDY|robotics"), now=clock())] == [
        "robotics"
    ]
    # Unreachable first when sorting by state.
    source.set_state("sim-speech-01", UNREACHABLE, "connection refused")
    rows = node_rows(source.snapshot(clock()), source.ownership())
    assert sort_rows(rows, "state", clock())[0].name == "sim-speech-01"
    assert sort_rows(rows, "state", clock(), reverse=True)[-1].name == "sim-speech-01"


def test_a_node_split_between_teams_appears_under_each(source: SimSource, clock: Clock) -> None:
    base = source.ownership()
    assert base.gpu_owner_of is not None
    owner_of = base.gpu_owner_of

    def owner(node: str, index: int) -> str | None:
        return "speech" if node == "sim-vision-01" and index >= 6 else owner_of(node, index)

    split = Ownership(base.teams, owner, base.team_of_user)
    groups = {g.team: g for g in group_rows(node_rows(source.snapshot(clock()), split), BY_TEAM, now=clock())}
    in_speech = next(r for r in groups["speech"].rows if r.name == "sim-vision-01")
    in_vision = next(r for r in groups["vision"].rows if r.name == "sim-vision-01")
    assert (in_speech.gpus, in_vision.gpus) == (2, 6)
    assert {c.gpu for c in in_speech.cells} == {6, 7}


def test_filter_parsing() -> None:
    assert parse_filter("") is None and parse_filter("!") is None
    flt = parse_filter("!Vis")
    assert flt is not None and flt.inverse and not flt.matches("vision") and flt.matches("speech")
    with pytest.raises(FilterError, match="not a regular expression"):
        parse_filter("vision(")


def test_tenant_attribution() -> None:
    own = Ownership(("a", "b"), lambda n, i: "a", {"bob": "b"}.get)
    limited = GpuProcess(1, 0, user="x", tenant="c", tenant_source="limiter")
    assert own.tenant(limited, "a") == ("c", "limiter")
    assert own.tenant(GpuProcess(1, 0, user="bob"), "a") == ("b", "user")
    assert own.tenant(GpuProcess(1, 0, user="eve"), "a") == ("a", "owner")


def test_history_over_the_session_stays_bounded(source: SimSource, clock: Clock) -> None:
    history = TenantHistory(limit=16)
    for _ in range(100):  # 14:00 to 22:20
        clock.advance(300)
        source.sample()
        history = history.record(clock(), tenant_rows(source.snapshot(clock()), source.ownership()))
    assert 8 <= history.points <= 16 and history.step > 1
    assert all(v == 8 for v in history.values("robotics", "owned"))
    assert all(v == 0 for v in history.values("robotics", "share"))
    assert history.session_share("vision") > 0.3
    assert history.values("nobody", "owned") == ()
    # The inference team follows the working day: its GPU-time share moves over the session.
    chat = history.values("chat", "share")
    assert max(chat) - min(chat) > 5


def test_feed_builds_immutable_states_lazily(source: SimSource, clock: Clock) -> None:
    feed = Feed(source, source.ownership(), clock)
    first = feed.build()
    clock.advance(1)
    source.sample()
    second = feed.build()
    assert second.version == first.version + 1 and second.snapshot is not first.snapshot
    assert first.rows and first.rows is first.rows  # computed once, on first use
    status = fleet_status(second.snapshot, clock())
    assert (status.live, status.stale, status.unreachable, status.nodes) == (8, 0, 0, 8)


def test_mig_layout_and_processes(source: SimSource, clock: Clock) -> None:
    view = source.snapshot(clock()).nodes[4]
    assert view.name == "sim-platform-01"
    gpu = find_gpu(view, 0)
    assert gpu is not None
    count, spans = mig_layout(gpu, source.ownership(), view)
    assert count == 8
    assert [(s.start, s.size, s.profile) for s in spans] == [
        (0, 1, "1g.10gb"),
        (1, 1, "1g.10gb"),
        (2, 2, "2g.20gb"),
        (4, 4, "3g.40gb"),
    ]
    procs = process_rows(view, source.ownership(), 0)
    assert procs and all(p.gpu == 0 and p.instance is not None for p in procs)
    assert {p.tenant for p in procs} <= {"chat", "research", "vision"}


def test_events_in_words_newest_first_and_filtered() -> None:
    events = [
        FleetEvent(1.0, "a", LIVE, "live"),
        FleetEvent(2.0, "b", LIVE, "live"),
        FleetEvent(10.0, "a", STALE, "no sample for 3s"),
        FleetEvent(20.0, "a", UNREACHABLE, "refused"),
        FleetEvent(95.0, "a", LIVE, "live"),
    ]
    rows = event_rows(events)
    assert [(e.node, e.what) for e in rows] == [
        ("a", "back"),
        ("a", "unreachable"),
        ("a", "stale"),
        ("b", "up"),
        ("a", "up"),
    ]
    assert rows[0].message == "stale for 1m25s" and rows[-1].message == "first sample"
    assert [e.what for e in event_rows(events, parse_filter("refused"))] == ["unreachable"]
    assert [e.node for e in event_rows(events, sort="node")] == ["a", "a", "a", "a", "b"]


def test_sparkline() -> None:
    assert render.sparkline([], 4) == "    "
    assert render.sparkline([0, 50, 100], 3, 100) == "▁▅█"
    assert render.sparkline([1.0] * 100, 10) == "█" * 10
    assert len(render.sparkline(list(range(1000)), 7)) == 7
    assert render.sparkline([5, 5], 4, 10) == "  ▅▅"


def test_pool_guarantees_are_not_borrowed_and_pool_gpus_not_lent(source: SimSource, clock: Clock) -> None:
    """A team's use of pool GPUs up to its guarantee is its own, not borrowed (as `gpuops tenants`
    counts it over a window); a pool GPU is shared, not lent by the team that bought it."""
    from pathlib import Path

    from gpuops.fleet.simfleet.runner import SimPaths, fleet_document
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
    assert TeamHeader._chip(pool).plain.startswith("pool shared 2/4 busy 2 idle")
    assert TeamHeader._chip(silos["platform"]).plain.startswith("platform 2/4 busy 2 idle")


def test_team_header_and_chip_agree_on_idle_mig_slices(source: SimSource, clock: Clock) -> None:
    """platform's 4 MIG GPUs all have a busy slice (4 busy GPUs in the group header), and idle
    slices worth what its chip counts idle: the header says so."""
    snapshot, ownership = source.snapshot(clock()), source.ownership()
    groups = {g.team: g for g in group_rows(node_rows(snapshot, ownership), BY_TEAM)}
    platform = groups["platform"].totals
    assert (platform.gpus, platform.busy, platform.idle) == (4, 4, 0)
    chip = _tenants(source, clock())["platform"]
    assert platform.slices_idle == pytest.approx(chip.idle) and chip.idle > 1
    assert groups["robotics"].totals.slices_idle == 0  # whole GPUs: their idle ones are counted idle
