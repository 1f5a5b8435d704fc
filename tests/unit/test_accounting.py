"""Per-tenant accounting from history buckets, against figures computed by hand."""

from __future__ import annotations

import pytest

from gpuops.core.history import HOUR, MINUTE, Bucket, GpuUsage, History, UserUsage
from gpuops.spec import parse_fleet
from gpuops.tenancy.accounting import WindowError, gather_evidence, p95, parse_window, tenant_usage

FLEET = """\
version: 1
teams:
  vision: {users: [alice]}
  speech: {users: [heidi]}
nodes:
  - {name: a, host: 127.0.0.1, owner: vision}
  - {name: b, host: 127.0.0.2}
pools:
  shared: {gpus: [{nodes: b}], guarantees: {speech: 50%}}
"""
T0 = 1_800_000_000.0 - 1_800_000_000.0 % HOUR  # an hour boundary
NOW = T0 + 2 * HOUR - 1


def user(name: str, busy: float, memory_gib: int = 1) -> UserUsage:
    gib = memory_gib << 30
    return UserUsage(name, (), None, "", None, HOUR, HOUR, busy * HOUR, float(gib) * HOUR, gib, gib, 1)


def gpu(index: int, *users: UserUsage) -> GpuUsage:
    busy = sum(u.busy for u in users)
    return GpuUsage(
        index, f"GPU-{index}", "NVIDIA A100-SXM4-80GB", 80 << 30, None, False, HOUR, busy, 0.0, 0, users
    )


def history(*buckets: tuple[GpuUsage, ...]) -> History:
    return History(
        "hour", T0, NOW, True, T0, tuple(Bucket(T0 + i * HOUR, HOUR, g) for i, g in enumerate(buckets))
    )


def test_tenant_figures_by_hand() -> None:
    fleet = parse_fleet(FLEET, "f.yaml")
    histories: dict[str, History | str] = {
        "a": history(
            (gpu(0, user("alice", 0.5)), gpu(1, user("heidi", 0.25, 10))),
            (gpu(0, user("alice", 1.0)), gpu(1)),
        ),
        "b": history((gpu(0, user("eve", 0.4)),), (gpu(0, user("heidi", 0.8, 30)),)),
        "c": "connection refused",
    }
    evidence = gather_evidence(fleet, histories, parse_window("2h"), NOW)
    assert evidence.missing == {"c": "connection refused"}
    assert len(evidence.starts) == 3  # the window overlaps 3 hour buckets; the first has no data
    rows = {r.team: r for r in tenant_usage(evidence, fleet)}
    assert set(rows) == {"vision", "speech", "-"}  # eve is in no team, on nobody's GPU: kept, as "-"
    v, s, u = rows["vision"], rows["speech"], rows["-"]
    assert (v.owned, v.silo, v.guaranteed) == (2, 2, 2.0)
    assert (v.used, v.p95, v.peak) == (0.75, 1.0, 1.0)
    assert (v.borrowed, v.lent, v.idle_owned) == (0.0, 0.125, 1.125)
    assert (s.owned, s.guaranteed) == (0, 0.5)  # 50% of a 1-GPU pool
    assert s.used == pytest.approx(0.525) and s.peak == 0.8
    assert s.borrowed == pytest.approx(0.15)  # 0.8 - 0.5 in the second hour, nothing in the first
    assert s.process_p95 == 30 << 30
    assert u.used == pytest.approx(0.2) and u.owned == 0
    assert v.share + s.share + u.share == pytest.approx(1.0)
    assert v.share == pytest.approx(0.75 / 1.475)


def test_p95_is_nearest_rank() -> None:
    assert p95([]) == 0.0
    assert p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([1.0, 2.0]) == 2.0


@pytest.mark.parametrize("text", ["", "0h", "soon", "5y", "91d", "-1h", "1.5h"])
def test_bad_windows(text: str) -> None:
    with pytest.raises(WindowError):
        parse_window(text)


def test_window_resolution() -> None:
    assert parse_window("1m").resolution == "minute" and parse_window("1h").span == MINUTE
    assert parse_window("24h").resolution == "hour" and parse_window("7d").seconds == 7 * 86400
    assert len(parse_window("7d").starts(T0 + 0.5 * HOUR)) == 169


def test_team_sides_split_silo_and_pool_and_follow_a_new_fleet() -> None:
    """The Pool screen's per-team figures (silo and pool side by side) are accounting: computed
    here from evidence, and again after `repool` reads the members from another fleet.yaml."""
    from gpuops.tenancy.accounting import TeamSide, pool_usage, repool, team_sides, weighted_mean

    fleet = parse_fleet(FLEET, "f.yaml")
    histories: dict[str, History | str] = {
        "a": history(
            (gpu(0, user("alice", 0.5)), gpu(1, user("heidi", 0.25, 10))),
            (gpu(0, user("alice", 1.0)), gpu(1)),
        ),
        "b": history((gpu(0, user("heidi", 0.4)),), (gpu(0, user("heidi", 0.8)),)),
    }
    evidence = gather_evidence(fleet, histories, parse_window("2h"), NOW)
    sides = {s.team: s for s in team_sides(evidence, fleet, "shared")}
    v, s = sides["vision"], sides["speech"]
    assert isinstance(v, TeamSide)
    assert (v.silo_gpus, v.pool_gpus, v.guaranteed) == (2, 0, 0.0)
    assert v.silo_used == pytest.approx(0.75) and v.silo_idle == pytest.approx(1.125)
    assert (s.silo_gpus, s.guaranteed) == (0, 0.5) and s.pool_used == pytest.approx(0.6)
    assert s.pool_idle == 0.0 and s.borrowed == pytest.approx((0.15 + 0.3) / 2)

    # vision's GPU 1 joins the pool: it leaves vision's silo, speech's work there is pool use
    moved = parse_fleet(FLEET.replace("{nodes: b}]", "{nodes: b}, {nodes: a, gpus: '1'}]"), "f.yaml")
    again = repool(evidence, moved)
    assert [(g.node, g.index, g.pool) for g in again.gpus] == [
        ("a", 0, None),
        ("a", 1, "shared"),
        ("b", 0, "shared"),
    ]
    sides = {s.team: s for s in team_sides(again, moved, "shared")}
    assert (sides["vision"].silo_gpus, sides["vision"].pool_gpus) == (1, 1)
    assert sides["speech"].guaranteed == 1.0  # 50% of a 2-GPU pool
    assert sides["speech"].pool_used == pytest.approx(0.725)
    # the pool as a whole: a:1 and b:0, heidi (speech) the only one working there
    (shared,) = pool_usage(again, moved)
    assert (shared.pool, shared.gpus, shared.guaranteed) == ("shared", 2, 1.0)
    assert shared.used == pytest.approx(0.725) and shared.p95 == pytest.approx(0.8)
    assert shared.idle == pytest.approx(2 - 0.725) and shared.teams == {"speech": pytest.approx(0.725)}
    (before,) = pool_usage(evidence, fleet)  # b:0 alone
    assert (before.gpus, before.guaranteed) == (1, 0.5) and before.used == pytest.approx(0.6)
    assert weighted_mean([1.0, 3.0], [3.0, 1.0]) == 1.5 and weighted_mean([1.0], [0.0]) == 0.0


def test_memory_held_now_is_the_latest_bucket() -> None:
    """What each team's processes hold in the GPU's latest bucket, busy or not: what a GPU moved
    into a pool still has taken."""
    fleet = parse_fleet(FLEET, "f.yaml")
    idle = UserUsage(
        "alice", (), None, "", None, HOUR, HOUR, 0.0, float(12 << 30) * HOUR, 12 << 30, 12 << 30, 1
    )
    histories: dict[str, History | str] = {
        "a": history((gpu(0, user("heidi", 0.5, 30)), gpu(1)), (gpu(0, idle), gpu(1))),
    }
    evidence = gather_evidence(fleet, histories, parse_window("2h"), NOW)
    a0, a1 = evidence.gpus
    assert a0.memory_now == {"vision": 12 << 30}  # heidi's 30 GiB went with her job
    assert a1.memory_now == {}


def test_a_newest_bucket_not_yet_recorded_everywhere_is_left_out() -> None:
    # Nodes record on their own clocks: when the figures are gathered, the newest bucket may be
    # recorded by some nodes and not yet by others. A GPU without data there is unknown, not
    # idle: counting that bucket would halve speech's use (b's GPU adds 0 to it).
    fleet = parse_fleet(FLEET, "f.yaml")
    histories: dict[str, History | str] = {
        "a": history((gpu(0, user("alice", 1.0)),), (gpu(0, user("alice", 1.0)),)),
        "b": history((gpu(0, user("heidi", 1.0)),)),  # its second hour is not recorded yet
    }
    evidence = gather_evidence(fleet, histories, parse_window("2h"), NOW)
    rows = {r.team: r for r in tenant_usage(evidence, fleet)}
    assert rows["speech"].used == pytest.approx(1.0) and rows["vision"].used == pytest.approx(1.0)
    assert evidence.observed() == [False, True, False]
