"""A saved plan is what it says: `gpuops apply --plan` shows what it will run, refuses a file edited
since `gpuops plan -o` wrote it, reads bad files as one line, and finds its fleet.yaml from any
directory. Plans and proposals are private files (0600). The real commands (child processes)
against the simulated fleet over SSH on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuops.simfleet import Launched
from gpuops.views.pool import write_fleet
from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)
from tests.integration.test_plan_apply import carve_file, discover, gpuops, mig_entry, mig_of

pytestmark = pytest.mark.timeout(300)

NODE = "sim-robotics-01"
EXIT_EDITED = 4  # docs/plan.md: a saved plan whose digest does not match its contents


def gpuops_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The gpuops command run from another working directory."""
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "TERM": "dumb"},
    )


def canonical_digest(document: dict[str, Any]) -> str:
    """The digest docs/plan.md defines: sha256 of the canonical JSON of everything but "digest"."""
    body = {k: v for k, v in document.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def gpu_entry(document: dict[str, Any], node: str, index: int) -> dict[str, Any]:
    (entry,) = [n for n in document["nodes"] if n["name"] == node]
    (gpu,) = [g for g in entry["gpus"] if g["index"] == index]
    return gpu


def two_plans(fleet: Launched) -> tuple[Path, dict[str, Any]]:
    """A saved plan for one 7g.40gb on GPU 2, and the payload of a plan for seven 1g.5gb there."""
    shown = fleet.dir / "plan.json"
    one = carve_file(fleet, mig_entry(NODE, "2", '{"7g.40gb": 1}'), "one.yaml")
    seven = carve_file(fleet, mig_entry(NODE, "2", '{"1g.5gb": 7}'), "seven.yaml")
    assert gpuops("plan", str(one), "-o", str(shown)).returncode == 2
    other = fleet.dir / "other.json"
    assert gpuops("plan", str(seven), "-o", str(other)).returncode == 2
    payload = gpu_entry(json.loads(other.read_text()), NODE, 2)["mig"]
    return shown, payload


def instances(fleet: Launched, index: int) -> list[str]:
    mig = mig_of(discover(fleet)[NODE], index)
    return sorted(gi["profile_name"] for gi in mig["gpu_instances"]) if mig["current"] else []


def test_a_plan_edited_after_it_was_saved_is_refused_and_nothing_changes(fleet: Launched) -> None:
    plan_json, payload = two_plans(fleet)
    document = json.loads(plan_json.read_text())
    gpu_entry(document, NODE, 2)["mig"] = payload  # the payload edited; the actions text is not
    plan_json.write_text(json.dumps(document, indent=2))

    result = gpuops("apply", "--plan", str(plan_json), "--yes")
    assert result.returncode == EXIT_EDITED, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {plan_json}: "), lines
    assert "changed since it was saved" in lines[0] and "nothing applied" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert instances(fleet, 2) == []  # MIG still off: neither the shown nor the edited layout


def test_what_apply_shows_is_what_it_runs(fleet: Launched) -> None:
    """Even with a digest made to match, the lines shown come from the payload that is applied."""
    plan_json, payload = two_plans(fleet)
    document = json.loads(plan_json.read_text())
    gpu_entry(document, NODE, 2)["mig"] = payload
    document["digest"] = canonical_digest(document)
    plan_json.write_text(json.dumps(document, indent=2))

    result = gpuops("apply", "--plan", str(plan_json), "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "+ instance 7g.40gb@0" not in result.stdout
    for start in range(7):
        assert f"+ instance 1g.5gb@{start}" in result.stdout
    assert instances(fleet, 2) == ["1g.5gb"] * 7


def test_plans_and_proposals_are_private_files(fleet: Launched) -> None:
    carve = carve_file(fleet, mig_entry(NODE, "2", '{"7g.40gb": 1}'))
    plan_json = fleet.dir / "plan.json"
    plan_json.write_text("an older file, readable by all\n")
    plan_json.chmod(0o644)
    old_umask = os.umask(0o022)
    try:
        assert gpuops("plan", str(carve), "-o", str(plan_json)).returncode == 2
        proposal = fleet.dir / "proposed.yaml"
        rebalance = gpuops(
            "rebalance", "-f", str(fleet.dir / "fleet.yaml"), "--window", "24h", "-o", str(proposal)
        )
        assert rebalance.returncode == 2, rebalance.stdout + rebalance.stderr
    finally:
        os.umask(old_umask)
    for path in (plan_json, proposal):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert json.loads(plan_json.read_text())["format"] == "gpuops-plan"
    assert not [p.name for p in fleet.dir.iterdir() if p.name.startswith(".") and "tmp" in p.name]


LIMITER = """\
  - select: {nodes: sim-robotics-01, gpus: "4"}
    limiter: {policy: fixed-share, tenants: {vision: {memory: 20GiB, compute: 30%}}}
"""


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_has_not_is_one_located_line(fleet: Launched, number: str) -> None:
    carve = carve_file(fleet, LIMITER)
    plan_json = fleet.dir / "plan.json"
    assert gpuops("plan", str(carve), "-o", str(plan_json)).returncode == 2
    text = plan_json.read_text()
    assert '"compute": 30.0' in text
    text = text.replace('"compute": 30.0', f'"compute": {number}', 1)
    plan_json.write_text(text)
    before = text[: text.index(f'"compute": {number}') + len('"compute": ')]
    line, column = before.count("\n") + 1, len(before) - before.rfind("\n")

    result = gpuops("apply", str(carve), "--plan", str(plan_json), "--yes")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: {plan_json}:{line}:{column}: {number} "
        + ("is out of range" if number[-1].isdigit() else "is not a JSON number")
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert "limiter tenant lines written" not in result.stdout


DEEP = '{"format": "gpuops-plan", "nodes": '


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (DEEP + "[" * 10000 + "]" * 10000 + "}", f"1:{len(DEEP) + 32}: nested deeper than 32 levels"),
        ('{"format": "gpuops-plan", "version": "[/x]"}', "plan version '[/x]'"),
        ('{"format": "gpuops-plan", "version": 2, "nodes": [{"name": "\\ud800"}]}', "lone surrogate"),
        (b'{"format": "gpuops-plan", \n "x": "\xff"}', "2:8: not UTF-8 text"),
    ],
)
def test_bad_plan_files_are_one_line_errors(
    fleet: Launched, tmp_path: Path, text: str | bytes, said: str
) -> None:
    carve = carve_file(fleet, mig_entry(NODE, "2", '{"7g.40gb": 1}'))
    path = tmp_path / "plan.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    result = gpuops("apply", str(carve), "--plan", str(path), "--yes")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), lines
    assert said in lines[0], lines
    assert "Traceback" not in result.stdout + result.stderr
    assert instances(fleet, 2) == []


def test_a_plan_made_in_one_directory_applies_from_another(fleet: Launched, tmp_path: Path) -> None:
    carve_file(fleet, mig_entry(NODE, "2", '{"7g.40gb": 1}'))
    made = gpuops_in(fleet.dir, "plan", "carve.yaml", "-o", "plan.json")
    assert made.returncode == 2, made.stdout + made.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    applied = gpuops_in(elsewhere, "apply", "--plan", str(fleet.dir / "plan.json"), "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"node {NODE}: changed" in applied.stdout
    assert instances(fleet, 2) == ["7g.40gb"]


def test_the_pool_screens_fleet_yaml_backup_is_private(tmp_path: Path) -> None:
    """The Pool screen keeps the fleet.yaml it replaces as a backup: 0600, as a saved plan; the new
    fleet.yaml keeps the operator's own mode."""
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\n")
    path.chmod(0o644)
    old_umask = os.umask(0o022)
    try:
        backup = write_fleet(path, path.read_bytes(), "version: 1\n# moved\n", 1_772_460_000.0)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text().endswith("# moved\n")
