"""Node rows, cells and the grid's groups (gpuops.views.nodes, cells, grid) on the simulated silos fleet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuops.fleet.source import UNREACHABLE
from gpuops.simfleet.source import SimSource
from gpuops.tenancy.ownership import Ownership
from gpuops.views.cells import FREE, SLICE
from gpuops.views.filter import parse_filter
from gpuops.views.grid import BY_NODE, BY_TEAM, group_rows, totals
from gpuops.views.nodes import node_rows, sort_rows
from gpuops.views.tenants import tenant_rows
from tests.tui.conftest import Clock


def test_rows_and_cells(source: SimSource, clock: Clock) -> None:
    rows = {r.name: r for r in node_rows(source.snapshot(clock()), source.ownership())}
    platform = rows["sim-platform-01"]
    assert platform.gpus == 4 and all(c.kind in (SLICE, FREE) for c in platform.cells)
    # Two GPUs with 3g+2g+1g+1g and two with seven 1g slices: 22 cells.
    assert len(platform.cells) == 22
    assert {c.profile for c in platform.cells} == {"3g.40gb", "2g.20gb", "1g.10gb"}
    used = [c for c in platform.cells if c.busy]
    assert used and all(c.tenants for c in used)
    # H100s: each slice's SM utilization from NVML's GPM, as the agent sampled it.
    sample = source.views["sim-platform-01"].sample
    assert sample is not None
    gpm = {
        (g.info.index, m.gpu_instance_id): m.sm_utilization_percent
        for g in sample.gpus
        for m in g.mig_samples
    }
    assert all(c.util == gpm[(c.gpu, c.instance)] for c in platform.cells if c.kind == SLICE)
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


def test_one_meaning_of_busy_on_every_line(source: SimSource, clock: Clock) -> None:
    """Busy is capacity doing work (at least 5% utilized; a MIG slice by its SMs where GPM says,
    else by holding a process), in GPU-equivalents, on every line: the fleet header is the sum of
    the team groups and of the team chips; a team's group and its chip say the same busy and idle;
    a GPU holding a process at 0% is idle, *held* idle, everywhere (issue 18 item 1)."""
    snapshot, ownership = source.snapshot(clock()), source.ownership()
    rows = node_rows(snapshot, ownership)
    fleet = totals(rows)
    groups = {g.team: g.totals for g in group_rows(rows, BY_TEAM)}
    chips = {r.team: r for r in tenant_rows(snapshot, ownership)}
    assert fleet.busy == pytest.approx(sum(g.busy for g in groups.values()))
    assert fleet.idle == pytest.approx(sum(c.idle for c in chips.values()))
    assert fleet.held == pytest.approx(sum(c.held for c in chips.values())) and fleet.held > 0
    assert fleet.busy + fleet.idle + fleet.unknown == pytest.approx(fleet.gpus)
    for team, g in groups.items():
        chip = chips[team]
        assert (g.idle, g.held) == (pytest.approx(chip.idle), pytest.approx(chip.held)), team
        assert g.busy == pytest.approx(chip.silo - chip.unknown - chip.idle), team
    # analytics: one process on GPU 0 at 0% utilization, three empty GPUs: nothing busy.
    assert (groups["analytics"].busy, groups["analytics"].held, groups["analytics"].idle) == (0, 1, 4)
    # research: GPU 0 works, GPUs 1 and 3 hold memory at 0%, GPU 2 is empty.
    assert (groups["research"].busy, groups["research"].held) == (1, 2)
    # platform's H100 slices: busy by their SMs (GPM), not by being carved or held.
    assert 0 < groups["platform"].busy < 4 and groups["platform"].held > 0


def test_totals_weigh_mig_slices_by_their_share_of_the_gpu(source: SimSource, clock: Clock) -> None:
    """GPU 0 of sim-platform-01 (H100, 7 compute slices) is carved 3g+2g+1g+1g with slices at
    different utilizations: the GPU's figure counts the 3g slice three times a 1g slice."""
    rows = {r.name: r for r in node_rows(source.snapshot(clock()), source.ownership())}
    platform = rows["sim-platform-01"]
    gpu0 = replace(platform, cells=tuple(c for c in platform.cells if c.gpu == 0), gpus=1)
    sample = source.views["sim-platform-01"].sample
    assert sample is not None
    gpm = {m.gpu_instance_id: float(m.sm_utilization_percent) for m in sample.gpus[0].mig_samples}  # type: ignore[arg-type]
    slices = {gi.id: int(gi.profile_name[0]) for gi in sample.gpus[0].mig.gpu_instances}  # type: ignore[union-attr]
    assert sorted(slices.values()) == [1, 1, 2, 3] and len(set(gpm.values())) > 1
    weighted = sum(gpm[gi] * n for gi, n in slices.items()) / 7
    plain = sum(gpm.values()) / len(gpm)
    assert abs(weighted - plain) > 1  # the slices differ enough for the two to disagree
    assert totals([gpu0]).util == pytest.approx(weighted)
    # The node row and the whole node's totals weigh the same way.
    assert totals([platform]).util == pytest.approx(platform.util)
    # Every slice of its four GPUs is carved: each GPU's shares add up to one.
    shares = [
        float(m.sm_utilization_percent) * _share(g, m.gpu_instance_id)
        for g in sample.gpus
        for m in g.mig_samples
    ]  # type: ignore[arg-type]
    assert platform.util == pytest.approx(sum(shares) / len(sample.gpus))


def _share(gpu: object, gi_id: int) -> float:
    """A GI's compute slices over the H100's 7, from its profile name ("3g.40gb": 3)."""
    mig = gpu.mig  # type: ignore[attr-defined]
    return int(next(gi for gi in mig.gpu_instances if gi.id == gi_id).profile_name[0]) / 7
