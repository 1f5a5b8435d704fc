"""Property tests of the rebalance planner (issue 7): from random fleets and histories,

- no team's guarantee (silo GPUs kept + pool guarantee) falls below the p95 of its use of its
  silo and the pool, computed here from the raw figures, independently of the planner;
- no GPU is guaranteed more than 100%; every MIG carving is placeable (the placement solver,
  through fleet.yaml's own desired-state checks); the memory caps of a pool GPU fit into what
  the processes still there leave free (burst-share and fixed-share pools);
- the proposal is a valid fleet.yaml;
- planning again on the proposal, with the same evidence, proposes nothing;
- (issue 18) no team has a share on a card whose memory is less than the team's memory need;
  every team that gives GPUs to the pool is guaranteed at least its p95 use of the pool unless
  the notes say the pool's cards that hold its need have no room; every share written is a
  0.1% step, what the limiter enforces (it keeps a share in permille), and they add up to 100%
  at most.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuops.core.history import HOUR, Bucket, GpuUsage, History, UserUsage
from gpuops.spec import dump_fleet, fleet_from_data, parse_fleet
from gpuops.spec.model import Fleet
from gpuops.tenancy.accounting import gather_evidence, p95, parse_window
from gpuops.tenancy.rebalance import Options, propose, proposed_fleet
from tests.hypothesis_budget import examples

GIB = 1 << 30
TEAMS = ("vision", "speech", "nlp", "robotics")
MODELS = {"NVIDIA A100-SXM4-80GB": 80 * GIB, "NVIDIA L40S": 48 * GIB, "NVIDIA H100 80GB HBM3": 80 * GIB}
BUCKETS = 8
NOW = 1_800_000_000.0 + 0.5 * HOUR
LEVELS = (0.0, 0.02, 0.05, 0.3, 0.6, 0.97, 1.0)


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    teams = draw(st.lists(st.sampled_from(TEAMS), min_size=1, max_size=4, unique=True))
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        gpus = draw(st.integers(1, 4))
        model = draw(st.sampled_from(sorted(MODELS)))
        owner = draw(st.one_of(st.none(), st.sampled_from(teams)))
        # usage[g][b] = list of (team, busy, process GiB)
        usage = [
            [
                draw(
                    st.lists(
                        st.tuples(st.sampled_from(teams), st.sampled_from(LEVELS), st.integers(1, 70)),
                        max_size=2,
                        unique_by=lambda x: x[0],
                    )
                )
                for _ in range(BUCKETS)
            ]
            for _ in range(gpus)
        ]
        nodes.append({"name": f"n{n}", "model": model, "owner": owner, "usage": usage})
    pooled = draw(st.lists(st.sampled_from([n["name"] for n in nodes]), max_size=2, unique=True))
    guarantees: dict[str, float] = {}
    if pooled:
        left = 100.0
        for team in draw(st.lists(st.sampled_from(teams), max_size=3, unique=True)):
            share = draw(st.sampled_from((5.0, 12.5, 25.0, 40.0)))
            if share <= left:
                guarantees[team] = share
                left -= share
    carving = draw(st.sampled_from(("limiter", "mig")))
    policy = draw(st.sampled_from(("burst-share", "fixed-share")))
    return {
        "teams": teams,
        "nodes": nodes,
        "pooled": pooled,
        "guarantees": guarantees,
        "carving": carving,
        "policy": policy,
    }


def _fleet(s: dict[str, Any]) -> Fleet:
    data: dict[str, Any] = {
        "version": 1,
        "teams": {t: {"users": [f"u-{t}"]} for t in s["teams"]},
        "nodes": [
            {"name": n["name"], "host": f"127.0.0.{i + 1}", **({"owner": n["owner"]} if n["owner"] else {})}
            for i, n in enumerate(s["nodes"])
        ],
    }
    if s["pooled"]:
        data["pools"] = {
            "shared": {
                "gpus": [{"nodes": name} for name in s["pooled"]],
                "carving": s["carving"],
                "policy": s.get("policy", "burst-share"),
                "guarantees": {t: f"{v}%" for t, v in s["guarantees"].items()},
            }
        }
    return fleet_from_data(data)


def _busy(users: list[tuple[str, float, int]]) -> float:
    return min(1.0, sum(b for _, b, _ in users))


def _histories(s: dict[str, Any]) -> dict[str, History | str]:
    out: dict[str, History | str] = {}
    first = math.floor(NOW / HOUR) * HOUR - (BUCKETS - 1) * HOUR
    for n in s["nodes"]:
        buckets = []
        for b in range(BUCKETS):
            gpus = []
            for g, per_bucket in enumerate(n["usage"]):
                users = per_bucket[b]
                scale = min(1.0, 1.0 / max(1e-9, sum(x[1] for x in users))) if users else 1.0
                gpus.append(
                    GpuUsage(
                        index=g,
                        uuid=f"GPU-{n['name']}-{g}",
                        name=n["model"],
                        memory_total=MODELS[n["model"]],
                        owner=None,
                        mig=False,
                        seconds=HOUR,
                        busy=_busy(users) * HOUR,
                        memory=0.0,
                        memory_max=0,
                        users=tuple(
                            UserUsage(
                                user=f"u-{team}",
                                groups=(),
                                tenant=None,
                                tenant_source="",
                                gpu_instance_id=None,
                                seconds=HOUR,
                                held=HOUR / len(users),
                                busy=busy * scale * HOUR,
                                memory=float(gib * GIB) * HOUR,
                                memory_max=gib * GIB,
                                process_max=gib * GIB,
                                processes=1,
                            )
                            for team, busy, gib in users
                        ),
                    )
                )
            buckets.append(Bucket(first + b * HOUR, HOUR, tuple(gpus)))
        out[n["name"]] = History("hour", first, NOW, True, first, tuple(buckets))
    return out


def _use(s: dict[str, Any], team: str, gpus: set[tuple[str, int]]) -> float:
    """p95 over buckets of the team's GPU-time on `gpus`, from the raw scenario."""
    series = []
    for b in range(BUCKETS):
        total = 0.0
        for n in s["nodes"]:
            for g, per_bucket in enumerate(n["usage"]):
                if (n["name"], g) not in gpus:
                    continue
                users = per_bucket[b]
                scale = min(1.0, 1.0 / max(1e-9, sum(x[1] for x in users))) if users else 1.0
                total += sum(busy * scale for t, busy, _ in users if t == team)
        series.append(total)
    return p95(series)


def _shares(
    fleet: Fleet, node: str, index: int, uuid: str, model: str
) -> tuple[dict[str, float], dict[str, int]]:
    """The limiter shares and memory caps carve: gives the GPU's teams (not `*`)."""
    desired = fleet.desired_for(node, index, uuid, model, mig_mode=False, memory_total=MODELS[model])
    assert not desired.problems, [str(p) for p in desired.problems]
    if desired.mig is not None and desired.mig.enabled:
        assert desired.solved_layout is not None and desired.solved_layout.ok, desired.solved_layout
    if desired.limiter is None or not desired.limiter.enabled:
        return {}, {}
    specs = [t for t in desired.limiter.tenant_specs() if t.name != "*"]
    return {t.name: t.compute or 0.0 for t in specs}, {t.name: t.memory for t in specs if t.memory}


def _held_now(s: dict[str, Any], node: str, index: int) -> dict[str, int]:
    """Bytes each team holds on the GPU in the latest bucket, from the raw scenario."""
    n = next(x for x in s["nodes"] if x["name"] == node)
    return {team: gib * GIB for team, _, gib in n["usage"][index][BUCKETS - 1]}


IDLE = [[] for _ in range(BUCKETS)]
# Found by hypothesis: a saturated team granted a whole GPU was granted another one when planning
# again on the proposal (the grant cap did not count what the pool already guaranteed it).
REGRANT = {
    "teams": ["vision"],
    "nodes": [
        {"name": "n0", "model": "NVIDIA A100-SXM4-80GB", "owner": None, "usage": [IDLE]},
        {"name": "n1", "model": "NVIDIA A100-SXM4-80GB", "owner": None, "usage": [IDLE]},
        {
            "name": "n2",
            "model": "NVIDIA A100-SXM4-80GB",
            "owner": "vision",
            "usage": [[*IDLE[1:], [("vision", 0.97, 1)]]],
        },
    ],
    "pooled": [],
    "guarantees": {},
    "carving": "limiter",
}


# Found by hypothesis under the ci profile (issue 18, shrunk by hand): the pool's two H100s hold the
# memory need of speech (52 GiB), nlp (61 GiB) and robotics (69 GiB), its L40Ss (48 GiB) nobody's.
# robotics, using nothing but promised 40% (1.6 GPUs) before, was laid first (the largest guarantee
# went first) and took most of the H100s, so nlp's use was left out; planning again read robotics'
# cut guarantee back as its promise, ranked nlp first and moved robotics' limiter lines to nlp. The
# teams are now ranked by their use, which the proposal does not change.
SCARCE_CARDS = {
    "teams": ["speech", "robotics", "nlp"],
    "nodes": [
        {"name": "n1", "model": "NVIDIA H100 80GB HBM3", "owner": None, "usage": [IDLE, IDLE]},
        {
            "name": "n2",
            "model": "NVIDIA L40S",
            "owner": None,
            "usage": [
                [*IDLE[:5], [("speech", 1.0, 52)], *IDLE[6:]],
                [
                    [],
                    [],
                    [],
                    [],
                    [("nlp", 0.0, 61)],
                    [("speech", 0.6, 1)],
                    [("robotics", 0.0, 69)],
                    [("nlp", 1.0, 1)],
                ],
            ],
        },
    ],
    "pooled": ["n2", "n1"],
    "guarantees": {"robotics": 40.0},
    "carving": "limiter",
}
# Found by hypothesis (shrunk by hand): on a pool of 3 GPUs a 0.1% step is 0.3 of a unit (1% of a
# GPU), so 37.6% and 37.4% give back the same 1.12 GPUs; the planner wrote the first (vision's
# promise cut to fit 100%) and planning again wrote the second. A share is now written as the
# fewest steps that give back its units.
SAME_UNITS = {
    "teams": ["speech", "vision", "robotics", "nlp"],
    "nodes": [
        {"name": "n1", "model": "NVIDIA H100 80GB HBM3", "owner": None, "usage": [IDLE]},
        {
            "name": "n2",
            "model": "NVIDIA A100-SXM4-80GB",
            "owner": None,
            "usage": [
                [[], [], [("robotics", 0.97, 1)], [], [], [], [], []],
                [[], [], [], [("speech", 0.6, 1), ("nlp", 0.3, 1)], [], [], [], []],
            ],
        },
    ],
    "pooled": ["n1", "n2"],
    "guarantees": {"vision": 40.0},
    "carving": "limiter",
}
# Written by hand (the draw did not find it): nlp's promised 1.2 GPUs need 70 GiB, which only the
# pool's one H100 holds, so 0.2 of it is left out; the spare was counted before that cut, so
# saturated vision got 1 GPU and, planning again, another. Spare is now counted after the cut.
GRANT_AFTER_CUT = {
    "teams": ["vision", "nlp"],
    "nodes": [
        {
            "name": "n0",
            "model": "NVIDIA A100-SXM4-80GB",
            "owner": "vision",
            "usage": [[[("vision", 1.0, 1)]] * BUCKETS] * 2,
        },
        {
            "name": "n1",
            "model": "NVIDIA H100 80GB HBM3",
            "owner": None,
            "usage": [[[("nlp", 0.0, 70)], *IDLE[1:]]],
        },
        {"name": "n2", "model": "NVIDIA L40S", "owner": None, "usage": [IDLE, IDLE]},
    ],
    "pooled": ["n1", "n2"],
    "guarantees": {"nlp": 40.0},
    "carving": "limiter",
}


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
@example(REGRANT)
@example(SCARCE_CARDS)
@example(SAME_UNITS)
@example(GRANT_AFTER_CUT)
def test_planner_properties(s: dict[str, Any]) -> None:
    fleet = _fleet(s)
    histories = _histories(s)
    window = parse_window("8h")
    evidence = gather_evidence(fleet, histories, window, NOW)
    proposal = propose(fleet, evidence, Options(pool="shared"))
    all_gpus = {(n["name"], g) for n in s["nodes"] for g in range(len(n["usage"]))}
    if proposal.infeasible:
        pool_gpus = {(g.node, g.index) for g in evidence.gpus if g.pool == "shared"}
        pool_gpus |= {(m.node, m.index) for m in proposal.moves}
        need = sum(math.ceil(_use(s, t, pool_gpus) * 100 - 1e-9) for t in s["teams"])
        assert need > 100 * len(pool_gpus)
        return
    text = dump_fleet(fleet_from_data(proposed_fleet(fleet, proposal)))
    new = parse_fleet(text, "proposed.yaml")  # raises SpecError if the proposal is not valid

    def pool_of(node: str, index: int) -> str | None:
        return new.pool_of(node, index)

    pool_gpus = {k for k in all_gpus if pool_of(*k) == "shared"}
    size = len(pool_gpus)
    pool = new.pools.get("shared")
    need = {g.team: g.memory for g in proposal.guarantees if g.memory}
    left_out = {
        t for t in s["teams"] if any(n.startswith(f"{t}: ") and "left out" in n for n in proposal.notes)
    }
    stepped_under = {
        t for t in s["teams"] if any(n.startswith(f"{t}'s share is written") for n in proposal.notes)
    }
    for team in s["teams"]:
        silo = {k for k in all_gpus if k not in pool_gpus and new.gpu_owner(k[0], k[1]) == team}
        share = pool.guarantees[team].share if pool is not None and team in pool.guarantees else 0.0
        guaranteed = len(silo) + share / 100.0 * size
        # a share one 0.1% step under the floor (floors filling the pool, said in the notes)
        slack = size / 1000.0 if team in stepped_under else 0.0
        if team not in left_out:
            assert guaranteed + slack + 1e-6 >= _use(s, team, silo | pool_gpus), team
        donor = any(new.gpu_owner(*k) == team for k in pool_gpus)
        if donor and team not in left_out:
            assert share / 100.0 * size + slack + 1e-6 >= _use(s, team, pool_gpus), team
    if pool is not None:
        written = [g.share for g in pool.guarantees.values()]
        assert all(abs(v * 10 - round(v * 10)) < 1e-9 for v in written), written
        assert sum(written) <= 100.0 + 1e-9, written
    for c in proposal.carvings:
        for team, u in c.units.items():
            assert u <= 0 or not c.memory_total or need.get(team, 0) <= c.memory_total, (c, need)
    for n in s["nodes"]:
        for g in range(len(n["usage"])):
            shares, caps = _shares(new, n["name"], g, f"GPU-{n['name']}-{g}", n["model"])
            assert sum(shares.values()) <= 100.0 + 1e-9, (n["name"], g, shares)
            if (n["name"], g) in pool_gpus and sum(_held_now(s, n["name"], g).values()) <= MODELS[n["model"]]:
                # memory caps fit into what processes of teams without a share there leave free
                # (a scenario whose processes hold more than the card is not a real one)
                held = _held_now(s, n["name"], g)
                others = sum(v for t, v in held.items() if t not in shares)
                assert not caps or sum(caps.values()) + others <= MODELS[n["model"]], (
                    n["name"],
                    g,
                    caps,
                    held,
                )

    again = propose(new, gather_evidence(new, histories, window, NOW), Options(pool="shared"))
    assert not again.moves
    assert not again.infeasible
    assert dump_fleet(fleet_from_data(proposed_fleet(new, again))) == text
