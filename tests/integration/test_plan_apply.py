"""`gpuops plan / apply / assert / export` end to end: the real command (a child process) against a
simulated fleet reached over SSH on 127.0.0.1, as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuops.node.state import NodeState
from gpuops.simfleet import Launched
from gpuops.simfleet.faults import inject
from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)

pytestmark = pytest.mark.timeout(300)


def gpuops(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The gpuops command, as a user runs it (no terminal: confirmation needs --yes)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={
            "COLUMNS": "200",
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
            "TERM": "dumb",
            **(env or {}),
        },
    )


def carve_file(fleet: Launched, carve: str, name: str = "carve.yaml", extra_nodes: str = "") -> Path:
    """The fleet's own fleet.yaml with a carve: section (and more nodes) added."""
    text = (fleet.dir / "fleet.yaml").read_text()
    if extra_nodes:
        text = text.replace("\nnodes:\n", "\nnodes:\n" + extra_nodes, 1)
    path = fleet.dir / name
    path.write_text(text + "carve:\n" + carve)
    return path


def mig_entry(node: str, gpus: str, profiles: str) -> str:
    return (
        f'  - select: {{nodes: {node}, gpus: "{gpus}"}}\n    mig: {{enabled: true, profiles: {profiles}}}\n'
    )


def discover(fleet: Launched) -> dict[str, Any]:
    result = gpuops("discover", "-f", str(fleet.dir / "fleet.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    return {n["name"]: n for n in json.loads(result.stdout)["nodes"]}


def mig_of(node: dict[str, Any], index: int) -> Any:
    gpu = node["sample"]["gpus"][index]
    return gpu["mig"]


ROBOTICS = """\
  - select: {nodes: sim-robotics-01, gpus: "0-3"}
    mig: {enabled: true, profiles: {"1g.5gb": 2, "3g.20gb": 1}}
"""


def test_plan_apply_assert_plan_converges(fleet: Launched) -> None:
    carve = carve_file(fleet, ROBOTICS)
    plan_json = fleet.dir / "plan.json"

    assert gpuops("assert", str(carve)).returncode == 1

    plan = gpuops("plan", str(carve), "-o", str(plan_json))
    assert plan.returncode == 2, plan.stdout + plan.stderr
    out = plan.stdout
    assert "node sim-robotics-01" in out and "GPU 3" in out and "GPU 4" not in out
    assert "~ MIG mode off -> on  ! disruptive" in out
    assert "+ instance 3g.20gb@0" in out and "+ instance 1g.5gb@4" in out and "+ instance 1g.5gb@5" in out
    assert "Plan: 12 to add, 4 to change, 0 to remove on 4 GPU(s) of 1 node(s)" in out
    saved = json.loads(plan_json.read_text())
    assert saved["format"] == "gpuops-plan" and saved["summary"]["gpus"] == 4
    gpu0 = saved["nodes"][[n["name"] for n in saved["nodes"]].index("sim-robotics-01")]["gpus"][0]
    assert gpu0["fingerprint"] and gpu0["live"]["mig"] == "MIG off"

    applied = gpuops("apply", "--plan", str(plan_json), "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "node sim-robotics-01: changed" in applied.stdout
    assert applied.stdout.count("MIG layout applied") == 4

    check = gpuops("assert", str(carve))
    assert check.returncode == 0, check.stdout
    again = gpuops("plan", str(carve))
    assert again.returncode == 0 and "No changes" in again.stdout
    second = gpuops("apply", str(carve), "--yes")
    assert second.returncode == 0 and "No changes" in second.stdout

    # What the nodes report, seen by another command: the layout is there, on those GPUs only.
    nodes = discover(fleet)
    for index in range(4):
        mig = mig_of(nodes["sim-robotics-01"], index)
        assert mig["current"] is True
        assert sorted((gi["profile_name"], gi["start"]) for gi in mig["gpu_instances"]) == [
            ("1g.5gb", 4),
            ("1g.5gb", 5),
            ("3g.20gb", 0),
        ]
    assert mig_of(nodes["sim-robotics-01"], 4)["current"] is False


def test_running_processes_are_refused_with_pids_and_users_then_forced(fleet: Launched) -> None:
    node = discover(fleet)["sim-platform-01"]
    procs = node["sample"]["gpus"][0]["processes"]
    assert procs, "the silos scenario runs work on sim-platform-01 GPU 0"
    carve = carve_file(
        fleet,
        mig_entry("sim-platform-01", "0", '{"7g.80gb": 1}'),
    )

    plan = gpuops("plan", str(carve))
    assert plan.returncode == 2
    for p in procs:
        assert f"pid {p['pid']} ({p['user']}" in plan.stdout
    assert "needs --force" in plan.stdout

    refused = gpuops("apply", str(carve), "--yes")
    assert refused.returncode == 1
    assert "node sim-platform-01: refused" in refused.stdout and "in_use" in refused.stdout
    for p in procs:
        assert f"pid {p['pid']} ({p['user']})" in refused.stdout
    assert gpuops("assert", str(carve)).returncode == 1  # nothing changed

    forced = gpuops("apply", str(carve), "--yes", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "MIG layout applied (stopped" in forced.stdout
    assert gpuops("assert", str(carve)).returncode == 0
    after = discover(fleet)["sim-platform-01"]["sample"]["gpus"][0]
    assert [gi["profile_name"] for gi in after["mig"]["gpu_instances"]] == ["7g.80gb"]
    assert {p["pid"] for p in after["processes"]}.isdisjoint({p["pid"] for p in procs})


def test_a_saved_plan_is_refused_when_the_live_state_changed(fleet: Launched) -> None:
    carve = carve_file(fleet, ROBOTICS)
    plan_json = fleet.dir / "plan.json"
    assert gpuops("plan", str(carve), "-o", str(plan_json)).returncode == 2

    other = carve_file(
        fleet,
        mig_entry("sim-robotics-01", "2", '{"7g.40gb": 1}'),
        "other.yaml",
    )
    assert gpuops("apply", str(other), "--yes").returncode == 0

    stale = gpuops("apply", "--plan", str(plan_json), "--yes")
    assert stale.returncode == 1
    assert "sim-robotics-01 GPU 2: MIG layout: was MIG off, now 7g.40gb@0" in stale.stdout
    assert "nothing applied" in stale.stderr
    nodes = discover(fleet)
    assert mig_of(nodes["sim-robotics-01"], 0)["current"] is False  # not even the unchanged GPUs
    assert [gi["profile_name"] for gi in mig_of(nodes["sim-robotics-01"], 2)["gpu_instances"]] == ["7g.40gb"]


def test_an_unreachable_node_does_not_stop_the_others(fleet: Launched) -> None:
    dead = "  - name: sim-gone-01\n    host: 127.0.0.1\n    port: 1\n    owner: robotics\n"
    carve = carve_file(
        fleet, ROBOTICS + "  - select: {nodes: sim-gone-01}\n    mig: {enabled: false}\n", extra_nodes=dead
    )

    plan = gpuops("plan", str(carve))
    assert plan.returncode == 1  # an error: one node could not be planned
    assert "node sim-gone-01: cannot plan:" in plan.stdout and "node sim-robotics-01" in plan.stdout

    applied = gpuops("apply", str(carve), "--yes")
    assert applied.returncode == 1
    assert "node sim-robotics-01: changed" in applied.stdout
    assert "node sim-gone-01: failed" in applied.stdout
    assert "Traceback" not in applied.stdout + applied.stderr

    # Re-running converges on the nodes that can be reached.
    again = gpuops("apply", str(carve), "--yes")
    assert "MIG layout applied" not in again.stdout


def test_export_writes_what_assert_accepts(fleet: Launched) -> None:
    carve = carve_file(fleet, ROBOTICS)
    assert gpuops("apply", str(carve), "--yes").returncode == 0
    exported = fleet.dir / "live.yaml"
    result = gpuops("export", "-f", str(carve), "-o", str(exported))
    assert result.returncode == 0, result.stderr
    text = exported.read_text()
    assert "placements: [3g.20gb@0, 1g.5gb@4, 1g.5gb@5]" in text
    assert "select: {nodes: sim-robotics-01, gpus: 0-3}" in text
    assert gpuops("validate", str(exported)).returncode == 0
    assert gpuops("assert", str(exported)).returncode == 0


def test_export_without_a_fleet_reads_this_host() -> None:
    """Without -f, this host's agent: its entries are named by the hostname the agent reports
    (the simulated node's), and a backend that cannot reach the GPUs is one error, no document
    and exit 1 (docs/cli.md)."""
    result = gpuops("export", "--backend", "sim")
    assert result.returncode == 0, result.stderr
    assert "select: {nodes: gpu-demo-01, gpus: '6'}" in result.stdout
    assert "placements: [1g.10gb@0, 1g.10gb@1, 2g.20gb@2, 3g.40gb@4]" in result.stdout
    failed = gpuops("export", env={"GPUOPS_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"})
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("error: localhost: not exported (NVML is unavailable")
    assert failed.stderr.count("\n") == 1
    assert "Traceback" not in failed.stderr


def test_bad_inputs_are_one_line_errors(fleet: Launched, tmp_path: Path) -> None:
    impossible = carve_file(
        fleet,
        mig_entry("sim-robotics-01", "0", '{"3g.20gb": 3}'),
    )
    result = gpuops("plan", str(impossible))
    assert result.returncode == 1
    assert "carve.yaml:" in result.stdout + result.stderr and "Traceback" not in result.stdout + result.stderr

    garbage = tmp_path / "plan.json"
    for text, said in (
        ("{", "not JSON"),
        ('{"format": "other"}', "not a gpuops plan"),
        ('{"format": "gpuops-plan", "version": 2, "nodes": [{"name": 3}]}', "nodes[0].name: wrong type"),
    ):
        garbage.write_text(text)
        result = gpuops("apply", str(impossible), "--plan", str(garbage), "--yes")
        assert result.returncode == 1, result.stdout
        assert said in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1

    assert gpuops("apply", "--yes").returncode == 2
    no_tty = gpuops("apply", str(impossible))
    assert no_tty.returncode == 1


CARVE_SHARING = """\
  - select: {nodes: sim-robotics-01, gpus: "4-5"}
    limiter:
      policy: fixed-share
      tenants: {vision: {memory: 20GiB, compute: 30%}, robotics: {compute: 70%, class: offline}}
  - select: {nodes: sim-robotics-01, gpus: "6"}
    mps:
      enabled: true
      active_thread_percentage: ATP
      pinned_memory_limit: 10GiB
      per_tenant: {robotics: {active_thread_percentage: 30}}
"""


@pytest.mark.slow
def test_limiter_lines_and_mps_daemons_end_to_end(fleet: Launched) -> None:
    carve = carve_file(fleet, CARVE_SHARING.replace("ATP", "50"))
    plan = gpuops("plan", str(carve))
    assert plan.returncode == 2, plan.stdout + plan.stderr
    out = plan.stdout
    assert "+ limiter tenant vision: memory 20GiB, compute 30%, fixed-share, online" in out
    assert "+ limiter tenant robotics: memory uncapped, compute 70%, fixed-share, offline" in out
    assert "+ MPS daemon on GPU-" in out and "threads 50%, pinned 10GiB" in out
    assert "disruptive" not in out

    applied = gpuops("apply", str(carve), "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "limiter tenant lines written" in applied.stdout and "MPS daemon on GPU-" in applied.stdout
    assert gpuops("assert", str(carve)).returncode == 0
    assert gpuops("plan", str(carve)).returncode == 0

    # A new default thread percentage: the daemon has no clients, so it is not disruptive.
    changed = carve_file(fleet, CARVE_SHARING.replace("ATP", "40"), "changed.yaml")
    plan = gpuops("plan", str(changed))
    assert plan.returncode == 2 and "~ MPS daemon on GPU-" in plan.stdout and "threads 50%" in plan.stdout
    assert gpuops("apply", str(changed), "--yes").returncode == 0
    assert gpuops("assert", str(changed)).returncode == 0

    exported = fleet.dir / "live.yaml"
    assert gpuops("export", "-f", str(changed), "-o", str(exported)).returncode == 0
    text = exported.read_text()
    assert "active_thread_percentage: 40" in text and "pinned_memory_limit: 10GiB" in text
    assert "robotics: {compute: 70%, policy: fixed-share, class: offline}" in text
    assert gpuops("assert", str(exported)).returncode == 0


FIVE_INSTANCES = mig_entry("sim-robotics-01", "0", '{"1g.5gb": 4, "3g.20gb": 1}')


def test_nvml_failing_on_the_third_create_restores_the_old_layout(fleet: Launched) -> None:
    carve = carve_file(fleet, FIVE_INSTANCES)
    inject(fleet.dir / "state" / "sim-robotics-01", "create_gpu_instance", 3, "nvml_error", "UNKNOWN")

    failed = gpuops("apply", str(carve), "--yes")
    assert failed.returncode == 1
    assert "MIG rolled_back" in failed.stdout and "injected fault on create_gpu_instance" in failed.stdout
    assert mig_of(discover(fleet)["sim-robotics-01"], 0) == {
        "current": False,
        "pending": False,
        "gpu_instances": [],
    }

    again = gpuops("apply", str(carve), "--yes")
    assert again.returncode == 0, again.stdout
    assert gpuops("assert", str(carve)).returncode == 0


def test_an_agent_killed_between_two_creates_is_undone_and_apply_converges(fleet: Launched) -> None:
    carve = carve_file(fleet, FIVE_INSTANCES)
    state = fleet.dir / "state" / "sim-robotics-01"
    inject(state, "create_gpu_instance", 2, "kill")

    killed = gpuops("apply", str(carve), "--yes")
    assert killed.returncode == 1
    assert (
        "node sim-robotics-01: failed" in killed.stdout and "Traceback" not in killed.stdout + killed.stderr
    )
    # The GPU is left half-made, as hardware would be, and the journal says what was under way.
    assert len(NodeState(str(state)).pending()) == 1

    # A read-only session (here: discover) changes nothing: it says an apply was interrupted.
    node = discover(fleet)["sim-robotics-01"]
    mig = mig_of(node, 0)
    assert mig["current"] is True and len(mig["gpu_instances"]) == 1
    (line,) = node["interrupted"]
    assert line.startswith("interrupted apply on GPU 0 (") and "run `gpuops apply`" in line
    assert len(NodeState(str(state)).pending()) == 1

    # The next apply checks the journal against the catalog and the GPU, puts the old layout back,
    # then makes the change it was planned from the half-made state.
    again = gpuops("apply", str(carve), "--yes")
    assert again.returncode == 0, again.stdout
    assert "recovered: GPU 0: an interrupted change was undone (old layout restored)" in again.stdout
    assert NodeState(str(state)).pending() == []
    assert gpuops("assert", str(carve)).returncode == 0


BASE = """\
version: 1
teams:
  vision: {users: [alice]}
  nlp: {users: [bob]}
nodes:
  - {name: gpu-a-01, host: 127.0.0.1, port: 1, labels: {gpu-model: A100-SXM4-40GB}}
carve:
"""
SEL = "  - select: {nodes: gpu-a-01}\n"


@pytest.mark.parametrize(
    ("carve", "said"),
    [
        (SEL + '    mig: {enabled: true, profiles: {"5g.20gb": 1}}\n', "unknown MIG profile '5g.20gb'"),
        (
            SEL + '    mig: {enabled: true, profiles: {"4g.20gb": 2}}\n',
            "4g.20gb: at most 1 per GPU (asked for 2)",
        ),
        (
            SEL + "    mps: {enabled: true, active_thread_percentage: 0}\n",
            "must be between 1 and 100 (got 0)",
        ),
        (
            SEL + "    mps: {enabled: true, active_thread_percentage: 150}\n",
            "must be between 1 and 100 (got 150)",
        ),
        (
            SEL
            + "    limiter: {policy: fixed-share, tenants: {vision: {compute: 60%}, nlp: {compute: 50%}}}\n",
            "110%",
        ),
        (
            "  - select: {nodes: gpu-a-01}\n    mig: {enabled: false}\n"
            "  - select: {nodes: gpu-a-01}\n    mig: {enabled: true}\n",
            "duplicate selector",
        ),
    ],
)
def test_bad_carve_settings_are_one_located_line(tmp_path: Path, carve: str, said: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(BASE + carve)
    for command in ("plan", "apply", "assert"):
        result = gpuops(command, str(path), "--yes") if command == "apply" else gpuops(command, str(path))
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), lines
        assert said in lines[0] and "Traceback" not in result.stderr
        assert result.stdout == ""
