"""Journals of interrupted MIG applies, end to end: the real `gpuops discover` / `apply` (child
processes) against the simulated `silos` fleet over SSH on 127.0.0.1. A read-only session never
resolves a journal, it reports it; an apply resolves only a journal it can trust (the catalog and
the live GPU agree with it) and leaves the GPU alone otherwise, saying why and where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuops.node.state import NodeState
from gpuops.simfleet import Launched
from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)
from tests.integration.test_plan_apply import carve_file, gpuops, mig_entry

pytestmark = pytest.mark.timeout(300)

NODE = "sim-platform-01"
GPU = 2  # an H100 cut into seven 1g.10gb instances, some of them running processes


def _discover(fleet: Launched) -> dict[str, Any]:
    result = gpuops("discover", "-f", str(fleet.dir / "fleet.yaml"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return {n["name"]: n for n in json.loads(result.stdout)["nodes"]}


def _gpu(nodes: dict[str, Any]) -> dict[str, Any]:
    gpu: dict[str, Any] = nodes[NODE]["sample"]["gpus"][GPU]
    return gpu


def _instances(gpu: dict[str, Any]) -> list[list[Any]]:
    return sorted(
        [gi["profile_id"], gi["start"], [ci["profile_id"] for ci in gi["compute_instances"]]]
        for gi in gpu["mig"]["gpu_instances"]
    )


def _forge(fleet: Launched, gpu: dict[str, Any]) -> Path:
    """A journal whose old layout cannot exist on an H100 (a 1g.10gb instance at memory slice 7,
    past the last one) and that keeps only the instances with processes: recovering "back" to it
    would destroy the idle instances, then fail to create the impossible one."""
    busy = {p["gpu_instance_id"] for p in gpu["processes"]}
    kept = [
        [gi["profile_id"], gi["start"], [ci["profile_id"] for ci in gi["compute_instances"]]]
        for gi in gpu["mig"]["gpu_instances"]
        if gi["id"] in busy
    ]
    assert 0 < len(kept) < len(gpu["mig"]["gpu_instances"])
    state = NodeState(str(fleet.dir / "state" / NODE))
    uuid = gpu["info"]["uuid"]
    old = {"enabled": True, "instances": [*kept, [19, 7, [0]]]}
    state.begin(uuid, GPU, old, {"enabled": True, "instances": []})
    return _journal(fleet, uuid)


def _journal(fleet: Launched, uuid: str) -> Path:
    path = fleet.dir / "state" / NODE / f"mig-{uuid}.json"  # where the node keeps it (state.py)
    assert path.exists()
    return path


def test_a_forged_journal_is_reported_not_acted_on(fleet: Launched) -> None:
    before = _gpu(_discover(fleet))
    journal = _forge(fleet, before)

    # Read-only: discover leaves the GPU as it is and says what was found, and where.
    nodes = _discover(fleet)
    assert _instances(_gpu(nodes)) == _instances(before)
    (line,) = nodes[NODE]["interrupted"]
    assert f"interrupted apply on GPU {GPU}" in line and str(journal) in line and "gpuops apply" in line
    table = gpuops("discover", "-f", str(fleet.dir / "fleet.yaml"))
    assert table.returncode == 0, table.stdout + table.stderr
    assert f"{NODE}: interrupted apply on GPU {GPU}" in table.stdout
    assert journal.exists()

    # An apply does not trust it: the GPU is left alone, even forced, with a located one-line reason.
    carve = carve_file(fleet, mig_entry(NODE, str(GPU), '{"7g.80gb": 1}'))
    applied = gpuops("apply", str(carve), "--yes", "--force")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    said = [x for x in applied.stdout.splitlines() if "interrupted-apply journal" in x]
    assert said and str(journal) in said[0], applied.stdout
    assert "old layout is impossible on H100-80GB: 1g.10gb cannot start at memory slice 7" in said[0]
    assert "Traceback" not in applied.stdout + applied.stderr
    after = _gpu(_discover(fleet))
    assert _instances(after) == _instances(before)
    assert [p["pid"] for p in after["processes"]] == [p["pid"] for p in before["processes"]]
    assert journal.exists()


def test_a_journal_naming_another_layout_than_the_live_one_is_left_alone(fleet: Launched) -> None:
    """Both layouts possible, but the GPU holds neither nor a state between them: not what an
    interrupted change leaves, so not undone."""
    before = _gpu(_discover(fleet))
    state = NodeState(str(fleet.dir / "state" / NODE))
    uuid = before["info"]["uuid"]
    state.begin(uuid, GPU, {"enabled": False, "instances": []}, {"enabled": True, "instances": [[0, 0, [4]]]})
    carve = carve_file(fleet, mig_entry(NODE, str(GPU), '{"7g.80gb": 1}'))
    applied = gpuops("apply", str(carve), "--yes", "--force")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert "nor a state between them" in applied.stdout, applied.stdout
    assert _instances(_gpu(_discover(fleet))) == _instances(before)
    assert _journal(fleet, uuid).exists()
