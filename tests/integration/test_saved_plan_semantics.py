"""A saved plan cannot carry what `gpuops validate` refuses: `gpuops apply --plan` runs fleet.yaml's
own checks on every payload (MIG, MPS, limiter, partition) of a plan whose digest was made to
match after an edit, and refuses the whole plan, one located line per problem, before anything
changes anywhere. The real commands (child processes) against the simulated fleet over SSH on
127.0.0.1 (docs/plan.md, "What is checked")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuops.simfleet import Launched, launch, stop
from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)
from tests.integration.test_plan_apply import carve_file, gpuops
from tests.integration.test_saved_plan_integrity import canonical_digest, instances

pytestmark = pytest.mark.timeout(600)

NODE = "sim-robotics-01"

# GPU 2 gets MIG (a change that is valid), 4 limiter lines, 6 an MPS daemon: one plan for three
# GPUs, so a refusal is seen to leave the valid changes undone too.
CARVE = f"""\
  - select: {{nodes: {NODE}, gpus: "2"}}
    mig: {{enabled: true, profiles: {{"3g.20gb": 2}}}}
  - select: {{nodes: {NODE}, gpus: "4"}}
    limiter: {{policy: fixed-share, tenants: {{vision: {{compute: 30%}}, robotics: {{compute: 40%}}}}}}
  - select: {{nodes: {NODE}, gpus: "6"}}
    mps:
      enabled: true
      pinned_memory_limit: 10GiB
      per_tenant: {{robotics: {{active_thread_percentage: 30}}}}
"""


@pytest.fixture
def saved(fleet: Launched) -> dict[str, Any]:
    """The plan for CARVE, as `gpuops plan -o` wrote it."""
    carve = carve_file(fleet, CARVE)
    path = fleet.dir / "plan.json"
    made = gpuops("plan", str(carve), "-o", str(path))
    assert made.returncode == 2, made.stdout + made.stderr
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _where(document: dict[str, Any], index: int) -> tuple[str, dict[str, Any]]:
    (i,) = [n for n, node in enumerate(document["nodes"]) if node["name"] == NODE]
    (j,) = [k for k, gpu in enumerate(document["nodes"][i]["gpus"]) if gpu["index"] == index]
    return f"nodes[{i}].gpus[{j}]", document["nodes"][i]["gpus"][j]


def _shares_130(gpu: dict[str, Any]) -> None:
    for line in gpu["limiter"]:
        line["compute"] = {"robotics": 70.0, "vision": 60.0}[line["name"]]


def _best_effort_share(gpu: dict[str, Any]) -> None:
    gpu["limiter"][0]["policy"] = "best-effort"


def _unknown_policy(gpu: dict[str, Any]) -> None:
    gpu["limiter"][0]["policy"] = "greedy"


def _pinned_beyond_the_gpu(gpu: dict[str, Any]) -> None:
    gpu["mps"]["pinned_memory_limit"] = 1 << 40  # 1 TiB on a 40 GB A100


def _mps_for_no_team(gpu: dict[str, Any]) -> None:
    gpu["mps"]["tenants"][0]["name"] = "ghosts"


def _overlapping_instances(gpu: dict[str, Any]) -> None:
    first, second = gpu["mig"]["layout"]["instances"]  # [profile id, start, [CI profile ids]]
    second[1] = first[1] + 1  # 3g.20gb starts at 0 or 4 only; 1 overlaps the first


def _partition_on_an_a100(gpu: dict[str, Any]) -> None:
    gpu["partition"] = {"compute": "CPX", "memory": None, "expect": "?/?", "known_pids": []}


@pytest.mark.parametrize(
    ("index", "kind", "edit", "said"),
    [
        (4, "limiter", _shares_130, "compute shares add up to 130%, over 100%"),
        (4, "limiter", _best_effort_share, "a compute share under best-effort"),
        (4, "limiter", _unknown_policy, "'greedy'"),
        (6, "mps", _pinned_beyond_the_gpu, "1TiB is more than the"),
        (6, "mps", _mps_for_no_team, "no team named 'ghosts'"),
        (2, "mig", _overlapping_instances, "3g.20gb"),
        (2, "partition", _partition_on_an_a100, "partition modes on a GPU without them"),
    ],
)
def test_a_resigned_plan_is_checked_as_fleet_yaml_is(
    fleet: Launched,
    saved: dict[str, Any],
    tmp_path: Path,
    index: int,
    kind: str,
    edit: Callable[[dict[str, Any]], None],
    said: str,
) -> None:
    document = json.loads(json.dumps(saved))
    where, gpu = _where(document, index)
    edit(gpu)
    document["digest"] = canonical_digest(document)  # signed again: the digest matches the edit
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document, indent=2))

    result = gpuops("apply", "--plan", str(path), "--yes")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: {where}.{kind}"), lines
    assert said in lines[0] and "nothing applied" in lines[0], lines
    assert "Traceback" not in result.stdout + result.stderr
    # Nothing changed anywhere, not even the GPUs whose payloads were valid.
    assert "done" not in result.stdout
    assert instances(fleet, 2) == []
    again = gpuops("plan", str(fleet.dir / "carve.yaml"))
    assert "+ limiter tenant vision" in again.stdout and "+ MPS daemon on GPU-" in again.stdout


def test_a_plan_as_saved_passes_the_checks_and_applies(fleet: Launched, saved: dict[str, Any]) -> None:
    """The checks take what fleet.yaml's plan made: MIG, limiter and MPS payloads apply."""
    result = gpuops("apply", "--plan", str(fleet.dir / "plan.json"), "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MIG layout applied" in result.stdout and "limiter tenant lines written" in result.stdout
    assert "MPS daemon on GPU-" in result.stdout
    assert instances(fleet, 2) == ["3g.20gb", "3g.20gb"]
    assert gpuops("plan", str(fleet.dir / "carve.yaml")).returncode == 0


AMD_PARTITION = """\
  - select: {nodes: sim-research-01, gpus: "0"}
    partition: {compute: CPX, memory: NPS4}
"""


def test_a_saved_partition_plan_applies_on_an_amd_gpu(tmp_path: Path) -> None:
    """Partition payloads pass the checks on a GPU that has the modes (a simulated MI300X)."""
    directory = tmp_path / "fleet"
    fleet = launch(directory, "mixed", timeout=60)
    try:
        carve = carve_file(fleet, AMD_PARTITION)
        path = fleet.dir / "plan.json"
        made = gpuops("plan", str(carve), "-o", str(path))
        assert made.returncode == 2, made.stdout + made.stderr
        result = gpuops("apply", "--plan", str(path), "--yes", "--force")  # a job on it: ended
        assert result.returncode == 0, result.stdout + result.stderr
        assert "partition modes CPX/NPS4 applied" in result.stdout
    finally:
        stop(directory)
