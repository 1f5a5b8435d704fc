"""The rebalance planner on hand-made evidence: moves by hand only (`Options(moves=False)`, the
CLI's `--no-moves`, the Pool screen's moves), GPUs given back to their silos, and what `gpuops
plan` makes of the result against a node's live limiter table."""

from __future__ import annotations

import dataclasses

from gpuops.core.tenant_table import TenantSpec
from gpuops.node.backends.sim import SimBackend
from gpuops.plan.diff import make_plan
from gpuops.plan.live import NodeLive
from gpuops.spec import dump_fleet, fleet_from_data, parse_fleet
from gpuops.spec.model import Fleet
from gpuops.tenancy.accounting import Evidence
from gpuops.tenancy.rebalance import Options, Proposal, propose, proposed_fleet
from tests.tenancy_helpers import GIB, NOW, steady_evidence

A100 = "NVIDIA A100-SXM4-40GB"
MIB = 1 << 20
# robotics' silo (n1) idle, vision's (n2) a third busy
FLEET = """\
version: 1
teams: {vision: {users: [alice]}, robotics: {users: [judy]}}
nodes: [{name: n1, host: 127.0.0.1, owner: robotics}, {name: n2, host: 127.0.0.2, owner: vision}]
"""


def evidence(fleet: Fleet, use: dict[tuple[str, int], dict[str, float]]) -> Evidence:
    return steady_evidence(fleet, use, A100, 40 * GIB)


USE = {("n1", 0): {}, ("n1", 1): {}, ("n2", 0): {"vision": 0.3}, ("n2", 1): {}}


def plan_again(fleet: Fleet, options: Options) -> tuple[Proposal, Fleet, str]:
    proposal = propose(fleet, evidence(fleet, USE), options)
    assert not proposal.infeasible, proposal.infeasible
    new = fleet_from_data(proposed_fleet(fleet, proposal))
    return proposal, new, dump_fleet(new)


def test_no_moves_recarves_the_pool_and_says_so() -> None:
    fleet = parse_fleet(FLEET + "pools:\n  shared: {gpus: [{nodes: n2}]}\n")
    proposal, new, _ = plan_again(fleet, Options(moves=False))
    assert not proposal.moves and not proposal.automatic  # n1's idle GPUs stay in robotics' silo
    assert [new.pool_of("n1", i) for i in range(2)] == [None, None]
    assert proposal.explain()[0] == (
        "no moves (none asked for): guarantees and carving of pool shared's 2 GPUs recomputed "
        "from the evidence"
    )
    assert proposal.guarantee("vision") is not None  # vision's use of the pool is guaranteed
    # the planner on its own moves them; by hand, only the GPU given
    assert {(m.node, m.index) for m in plan_again(fleet, Options())[0].moves} == {("n1", 0), ("n1", 1)}
    by_hand, _, _ = plan_again(fleet, Options(moves=False, join=(("n1", 1),)))
    assert [(m.node, m.index, m.by_hand) for m in by_hand.moves] == [("n1", 1, True)]
    assert by_hand.explain()[:2] == [
        "n1:1 (robotics's silo) joins pool shared, moved by hand: GPU-time p95 0%, mean 0%",
        "no other moves (none asked for): pool shared has 3 GPUs",
    ]


def node_with(lines: tuple[TenantSpec, ...]) -> NodeLive:
    """Node n1 (two A100s, simulated) with this limiter table."""
    backend = SimBackend(
        {
            "hostname": "n1",
            "users": {"alice": 1001, "judy": 1002},
            "tenants": {"vision": ["alice"], "robotics": ["judy"]},
            "gpus": [{"model": "A100-SXM4-40GB"}, {"model": "A100-SXM4-40GB"}],
            "workloads": [],
        },
        clock=lambda: NOW,
    )
    return NodeLive("n1", backend.inventory(), backend.sample(), (), lines, 7)


def test_a_gpu_given_back_leaves_the_pool_and_plan_clears_its_lines() -> None:
    fleet = parse_fleet(FLEET)
    _, pooled, _ = plan_again(fleet, Options())  # n1's two idle GPUs join the pool, carved
    assert [pooled.pool_of("n1", i) for i in range(2)] == ["shared", "shared"]
    # the node as the pool's carving left it: the borrowers' line on both GPUs
    live = node_with((TenantSpec("*", None, None, "best-effort", "offline"),))

    proposal, back, text = plan_again(pooled, Options(moves=False, leave=(("n1", 1),)))
    assert [(r.node, r.index, r.owner, r.cleared) for r in proposal.returns] == [("n1", 1, "robotics", True)]
    assert not proposal.moves and proposal.capacity == 2  # n1:0 and n2:1 stay
    assert proposal.explain()[0] == (
        "n1:1 leaves pool shared for robotics's silo, moved by hand; the pool's limiter lines are removed"
    )
    assert [back.pool_of("n1", i) for i in range(2)] == ["shared", None]
    assert back.gpu_owner("n1", 1) == "robotics"
    assert back.carve[0].pool == "shared" and back.carve[0].limiter is not None
    assert not back.carve[0].limiter.enabled  # the reset comes first: a silo entry would win
    desired = back.desired_for("n1", 1)
    assert desired.limiter is not None and not desired.limiter.enabled

    plan = make_plan(back, [live])
    gpus = {g.index: g for g in plan.nodes[0].gpus}
    assert [(a.marker, a.text) for a in gpus[1].actions] == [
        ("-", "limiter tenant *: memory uncapped, no compute share, best-effort, offline")
    ]
    assert gpus[1].limiter == ()  # the GPU's table emptied, as a silo GPU's
    assert not gpus[0].actions  # still the pool's, as it was

    # planning again (same evidence) keeps the entry and changes nothing: the idle GPU given back
    # by hand is not moved into the pool again on the planner's own
    again, _, text_again = plan_again(back, Options())
    assert not again.moves and not again.returns and text_again == text
    assert any(n.startswith("n1:1 stays: it was given back to its silo by hand") for n in again.notes)
    # ... until the GPU joins the pool again: then the pool's lines are its lines
    _, rejoined, _ = plan_again(back, Options(moves=False, join=(("n1", 1),)))
    assert rejoined.pool_of("n1", 1) == "shared"
    assert not any(e.limiter is not None and not e.limiter.enabled for e in rejoined.carve)
    assert rejoined.desired_for("n1", 1).limiter.enabled  # type: ignore[union-attr]


def test_a_gpu_given_back_to_an_owner_that_carves_it_gets_the_owners_lines() -> None:
    own = FLEET + "carve:\n  - select: {nodes: n1}\n    limiter: {tenants: {robotics: {compute: 100%}}}\n"
    _, pooled, _ = plan_again(parse_fleet(own), Options())
    proposal, back, _ = plan_again(pooled, Options(moves=False, leave=(("n1", 0),)))
    assert [(r.index, r.cleared) for r in proposal.returns] == [(0, False)]
    assert not any(e.pool == "shared" and e.limiter is not None and not e.limiter.enabled for e in back.carve)
    limiter = back.desired_for("n1", 0).limiter
    assert limiter is not None and [t.name for t in limiter.tenant_specs()] == ["robotics"]


def test_memory_still_held_on_a_moved_gpu_is_left_to_its_holder() -> None:
    """A forgotten notebook at 0% holds 15% of n1:0: the GPU still moves (it is idle), the
    explanation says who holds what, and the caps written for it fit into the rest, less what the
    driver reserves of the card (the H100's documented 480 MiB: no node observed it here)."""
    fleet = parse_fleet(FLEET)
    use = {("n1", 0): {}, ("n1", 1): {}, ("n2", 0): {"vision": 0.97}, ("n2", 1): {"vision": 0.97}}
    plain = steady_evidence(fleet, use)
    notebook = 12 * GIB  # 15% of an 80 GiB card
    gpus = tuple(
        dataclasses.replace(
            g,
            memory_now={"robotics": notebook} if (g.node, g.index) == ("n1", 0) else {},
            process_p95={"vision": 40 * GIB} if g.node == "n2" else {},
        )
        for g in plain.gpus
    )
    evidence = dataclasses.replace(plain, gpus=gpus)
    proposal = propose(fleet, evidence, Options())
    moves = {(m.node, m.index): m for m in proposal.moves}
    assert set(moves) == {("n1", 0), ("n1", 1)}
    assert moves[("n1", 0)].explain() == (
        "n1:0 (robotics's silo) joins the pool: GPU-time p95 0%, mean 0% over 100% of the window; "
        "memory still held there by robotics 12GiB (15%): the memory caps on it fit into the rest"
    )
    assert "held" not in moves[("n1", 1)].explain()
    # vision (saturated) is granted both GPUs: on n1:0 its cap is what the notebook leaves
    vision = proposal.guarantee("vision")
    assert vision is not None and vision.units == 200 and vision.memory == 40 * GIB
    carving = {(c.node, c.index): c for c in proposal.carvings}
    reserved = 480 * MIB
    cap = 68 * GIB - reserved
    assert dict(carving[("n1", 0)].memory) == {"vision": cap} and carving[("n1", 0)].held == notebook
    assert dict(carving[("n1", 1)].memory) == {}  # nothing held: the whole card, no cap line
    assert "12GiB held there, memory caps vision 67.5GiB fit into the rest" in carving[("n1", 0)].describe()
    assert any(
        line.startswith("driver overhead on n1:0, n1:1") and "480MiB of each card reserved" in line
        for line in proposal.explain()
    ), proposal.explain()
    new = fleet_from_data(proposed_fleet(fleet, proposal))
    lines = {t.name: t for t in new.desired_for("n1", 0).limiter.tenant_specs()}  # type: ignore[union-attr]
    assert lines["vision"].memory == cap
    assert lines["vision"].memory + notebook + reserved <= 80 * GIB


def test_fixed_share_spreads_guarantees_burst_share_packs_them() -> None:
    """Under fixed-share a share is a cap even on an idle GPU: no pool GPU is one team's alone
    while another team is guaranteed; under burst-share whole GPUs are laid team by team."""
    text = FLEET.replace(
        "n2, host: 127.0.0.2, owner: vision}",
        "n2, host: 127.0.0.2, owner: vision}, {name: n3, host: 127.0.0.3}",
    )
    use = {(n, i): {} for n in ("n1", "n3") for i in range(2)}
    for policy in ("fixed-share", "burst-share"):
        pooled = parse_fleet(
            text + f"pools:\n  shared:\n    gpus: [{{nodes: n1}}, {{nodes: n3}}]\n    policy: {policy}\n"
            "    guarantees: {vision: 50%, robotics: 25%}\n"
        )
        proposal = propose(pooled, steady_evidence(pooled, use), Options(moves=False))
        shares = [dict(c.units) for c in proposal.carvings]
        assert (
            sum(s.get("vision", 0) for s in shares) == 200
            and sum(s.get("robotics", 0) for s in shares) == 100
        )
        if policy == "fixed-share":
            assert shares == [{"vision": 50, "robotics": 25}] * 4
        else:
            assert shares == [{"vision": 100}, {"vision": 100}, {"robotics": 100}, {}]


def _big_need(fleet: Fleet, use: dict[tuple[str, int], dict[str, float]], big: set[str]) -> Evidence:
    """vision's processes need 76 GiB; nodes in `big` have 80 GiB cards, the others 40 GiB."""
    plain = steady_evidence(fleet, use)
    gpus = tuple(
        dataclasses.replace(
            g,
            name=g.name if g.node in big else A100,
            memory_total=80 * GIB if g.node in big else 40 * GIB,
            process_p95={"vision": 76 * GIB} if g.node == "n2" else {},
        )
        for g in plain.gpus
    )
    return dataclasses.replace(plain, gpus=gpus)


def test_a_team_is_not_placed_on_cards_too_small_for_its_memory_need() -> None:
    """vision (saturated, 76 GiB processes on its 80 GiB cards) is not granted a share of 40 GiB
    cards, where its work cannot run: the grant is left out and the notes say why (issue 18)."""
    fleet = parse_fleet(FLEET)
    use = {("n1", 0): {}, ("n1", 1): {}, ("n2", 0): {"vision": 0.97}, ("n2", 1): {"vision": 0.97}}
    proposal = propose(fleet, _big_need(fleet, use, {"n2"}), Options())
    assert {(m.node, m.index) for m in proposal.moves} == {("n1", 0), ("n1", 1)}
    assert proposal.guarantee("vision") is None
    assert all(not c.units for c in proposal.carvings), [c.describe() for c in proposal.carvings]
    assert (
        "vision: 2 GPUs of its guarantee left out: its memory need (76GiB) fits on none of the pool's "
        "2 cards; it is not placed where its work cannot run"
    ) in proposal.notes
    assert not any("more than the whole card" in n for n in proposal.notes), proposal.notes

    # with one 80 GiB card in the pool, vision gets that card and the note names it
    text = FLEET.replace(
        "n2, host: 127.0.0.2, owner: vision}",
        "n2, host: 127.0.0.2, owner: vision}, {name: n3, host: 127.0.0.3}",
    )
    fleet3 = parse_fleet(text)
    use3 = {**use, ("n3", 0): {}}
    proposal = propose(fleet3, _big_need(fleet3, use3, {"n2", "n3"}), Options())
    assert proposal.capacity == 3
    assert {(c.node, c.index): dict(c.units) for c in proposal.carvings} == {
        ("n1", 0): {},
        ("n1", 1): {},
        ("n3", 0): {"vision": 100},
    }
    (vision,) = proposal.guarantees
    assert vision.units == 100 and proposal.share("vision") == 33.4
    assert any(
        n.startswith("vision: 1 GPUs of its guarantee left out") and "n3:0" in n for n in proposal.notes
    )
    new = fleet_from_data(proposed_fleet(fleet3, proposal))
    again = propose(new, _big_need(new, use3, {"n2", "n3"}))
    assert not again.moves and [g.units for g in again.guarantees] == [100]


def test_shares_are_written_in_the_limiters_steps() -> None:
    """A pool share is a 0.1% step (the limiter keeps permille): 4 of 15 GPUs is 26.7%, not
    26.6667%; shares of a full pool add up to 100% at most, and planning again keeps them."""
    names = ", ".join(f"{{name: s{i}, host: 127.0.1.{i}}}" for i in range(15))
    fleet = parse_fleet(
        "version: 1\nteams: {vision: {users: [alice]}, speech: {users: [heidi]}}\n"
        f"nodes: [{names}]\npools:\n  shared: {{gpus: [{{nodes: 's*'}}]}}\n"
    )
    use = {(f"s{i}", 0): ({"speech": 1.0} if i < 4 else {"vision": 1.0} if i < 15 else {}) for i in range(15)}
    proposal = propose(fleet, steady_evidence(fleet, use), Options(moves=False))
    assert not proposal.infeasible, proposal.infeasible
    shares = {g.team: proposal.share(g.team) for g in proposal.guarantees}
    assert shares == {"speech": 26.7, "vision": 73.3}
    assert sum(shares.values()) <= 100.0
    assert any("speech: guaranteed 4 GPUs of the pool (26.7%)" in line for line in proposal.explain())
    data = proposed_fleet(fleet, proposal)
    assert data["pools"]["shared"]["guarantees"]["speech"]["share"] == "26.7%"
    again = propose(fleet_from_data(data), steady_evidence(fleet, use), Options(moves=False))
    assert {g.team: g.units for g in again.guarantees} == {g.team: g.units for g in proposal.guarantees}


def test_every_donor_is_told_what_it_gets_back() -> None:
    """A team that gives its GPUs is guaranteed its p95 use of the pool, and the proposal says so
    for each donor, a guarantee of none included (issue 18: robotics gave 8 and got 0, unsaid)."""
    fleet = parse_fleet(FLEET)
    use = {("n1", 0): {"robotics": 0.05}, ("n1", 1): {}, ("n2", 0): {"vision": 0.3}, ("n2", 1): {}}
    proposal = propose(fleet, evidence(fleet, use), Options())
    assert {(m.node, m.index) for m in proposal.moves} == {("n1", 0), ("n1", 1), ("n2", 1)}
    robotics = proposal.guarantee("robotics")
    assert robotics is not None and robotics.units >= 5
    lines = proposal.explain()
    assert (
        "robotics gives 2 GPUs to the pool and is guaranteed 0.05 GPUs of it "
        "(its p95 use of the pool over 24h: 0.05 GPUs)" in lines
    )
    idle = propose(fleet, evidence(fleet, USE), Options())
    assert (
        "robotics gives 2 GPUs to the pool and is guaranteed none of it: its p95 use of the pool over "
        "24h is 0; it borrows idle pool time like any team, and once it uses the pool, planning "
        "again guarantees it that use"
    ) in idle.explain()
