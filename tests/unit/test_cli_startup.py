"""What a command's start leaves out must not change what it does (docs/benchmarks.md, "Command
start-up"): field descriptions read only for the JSON Schema, validators built on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuops.spec import Fleet, fleet_json_schema, parse_fleet

REPO = Path(__file__).resolve().parents[2]
FLEET = """\
version: 1
ssh: {user: ops}
teams: {vision: {description: Vision team}}
nodes:
  - {name: gpu-a-01, host: 10.0.0.1, gpus: {"0-3": vision}}
carve:
  - select: {nodes: gpu-a-01, gpus: {indices: "0"}}
    mig: {enabled: true, profiles: {3g.40gb: 2}}
"""


def test_the_schema_is_the_same_after_models_were_built_for_validation() -> None:
    fleet = parse_fleet(FLEET, "f.yaml")  # builds the validators (without descriptions)
    fleet.model_dump()
    in_process = fleet_json_schema()
    fresh = subprocess.run(
        [sys.executable, "-m", "gpuops", "schema"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout) == in_process
    assert json.dumps(in_process, indent=2) == fresh.stdout.rstrip("\n")
    # Descriptions come from the attribute docstrings, inherited ones included.
    defs = in_process["$defs"]
    assert defs["SshOptions"]["properties"]["user"]["description"]
    assert defs["SshDefaults"]["properties"]["user"] == defs["SshOptions"]["properties"]["user"]
    assert Fleet.model_fields["carve"].description and "Desired state" in Fleet.model_fields["carve"].description
    assert parse_fleet(FLEET, "f.yaml") == fleet
