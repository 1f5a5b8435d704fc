"""`gpuops export` writes each one-line mapping whole (issue 18 item 8): a limiter with several
tenants once came out as `{..., class: ⏎ offline}}`, a value cut from its key."""

from __future__ import annotations

import re

import pytest

from gpuops.simfleet import Launched
from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)
from tests.integration.test_plan_apply import carve_file, gpuops

pytestmark = pytest.mark.timeout(300)

THREE_TENANTS = """\
  - select: {nodes: sim-robotics-01, gpus: "4-5"}
    limiter:
      policy: fixed-share
      tenants:
        vision: {memory: 20GiB, compute: 30%, class: online}
        robotics: {memory: 10GiB, compute: 40%, class: offline}
        research: {memory: 8GiB, compute: 30%, class: offline}
"""


def test_export_never_breaks_a_one_line_mapping(fleet: Launched) -> None:
    carve = carve_file(fleet, THREE_TENANTS)
    applied = gpuops("apply", str(carve), "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    result = gpuops("export", "-f", str(carve))
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        # Every line opens as many braces and brackets as it closes: no mapping goes on.
        assert line.count("{") == line.count("}") and line.count("[") == line.count("]"), result.stdout
        assert not line.rstrip().endswith(":") or "{" not in line, result.stdout
    tenants = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^ +(vision|robotics|research): \{.*\}$", result.stdout, re.M)
    }
    assert set(tenants) == {"vision", "robotics", "research"}, result.stdout
    assert "class: offline" in tenants["research"] and "memory: 8GiB" in tenants["research"]
    exported = fleet.dir / "live.yaml"
    exported.write_text(result.stdout)
    assert gpuops("assert", str(exported)).returncode == 0
