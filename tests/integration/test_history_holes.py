"""Unreadable history reaches the operator: five corrupt day files on one node of the simulated
`silos` fleet (over SSH on 127.0.0.1), then the real `gpuops tenants` and `gpuops rebalance`
(child processes). Unreadable buckets are unknown, not idle: the figures leave them out and say
so, `tenants` exits 3, `rebalance` refuses unless --allow-incomplete-history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.simfleet import Launched, launch, stop
from tests.integration.test_plan_apply import gpuops

pytestmark = pytest.mark.timeout(300)

NODE = "sim-robotics-01"


@pytest.fixture(scope="module")
def holed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """The fleet with 5 whole days of robotics' hourly history (inside a 7-day window; today left
    alone, its recorder rewrites it, and yesterday, which a 12-hour window reaches in the first
    half of a UTC day) turned to garbage, after the node recorded them."""
    directory = tmp_path_factory.mktemp("holes") / "fleet"
    started = launch(directory, "silos", timeout=60)
    try:
        first = gpuops("tenants", "-f", str(directory / "fleet.yaml"), "--window", "7d", "--json")
        assert first.returncode == 0, first.stderr  # every node's past recorded and complete
        days = sorted((directory / "state" / NODE / "history").glob("hours-*.json"))
        assert len(days) >= 8  # 7 days back from a time of day: the oldest day is partly there
        for day in days[-7:-2]:
            day.write_text("{garbage")
        yield started
    finally:
        stop(directory)


def _fleet(fleet: Launched) -> str:
    return str(fleet.dir / "fleet.yaml")


def test_tenants_counts_unreadable_buckets_as_unknown_and_says_so(holed: Launched) -> None:
    result = gpuops("tenants", "-f", _fleet(holed), "--window", "7d", "--json")
    assert result.returncode == 3, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    # The idle silo stays idle over the time that can be read (before: 5 days counted as 0 idle).
    robotics = next(r for r in doc["tenants"] if r["team"] == "robotics")
    assert robotics["owned"] == 8 and robotics["idle_owned"] > 7.9, robotics
    assert doc["incomplete"][NODE]["buckets"] == 120
    assert "not JSON" in doc["incomplete"][NODE]["reasons"][0]
    assert doc["readable_buckets"] == doc["buckets"] - 120
    assert doc["warnings"][0].startswith(f"history incomplete: 120 buckets unreadable on {NODE} (")
    assert set(doc["incomplete"]) == {NODE}

    table = gpuops("tenants", "-f", _fleet(holed), "--window", "7d")
    assert table.returncode == 3, table.stdout + table.stderr
    assert f"history incomplete: 120 buckets unreadable on {NODE}" in table.stdout
    assert "readable on every node" in table.stdout

    # A window the corrupt days do not reach is complete.
    day = gpuops("tenants", "-f", _fleet(holed), "--window", "12h", "--json")
    assert day.returncode == 0, day.stdout + day.stderr
    assert json.loads(day.stdout)["incomplete"] == {}


def test_rebalance_refuses_evidence_with_holes_unless_allowed(holed: Launched, tmp_path: Path) -> None:
    refused = gpuops("rebalance", "-f", _fleet(holed), "--window", "7d", "-o", str(tmp_path / "p.yaml"))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"120 buckets unreadable on {NODE}" in refused.stderr
    assert "--allow-incomplete-history" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "p.yaml").exists()

    as_json = gpuops("rebalance", "-f", _fleet(holed), "--window", "7d", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["incomplete"][NODE]["buckets"] == 120

    allowed = gpuops(
        "rebalance", "-f", _fleet(holed), "--window", "7d", "--allow-incomplete-history", "--json"
    )
    assert allowed.returncode == 2, allowed.stdout + allowed.stderr
    doc = json.loads(allowed.stdout)
    assert doc["incomplete"][NODE]["buckets"] == 120
    assert any(
        line.startswith(f"history incomplete: 120 buckets unreadable on {NODE}")
        for line in doc["explanation"]
    )
    # Its GPUs are not left out in silence: 2 readable days of 7 are too few to move them.
    moved = {(m["node"], m["index"]) for m in doc["moves"]}
    assert not any(node == NODE for node, _ in moved)
    stays = [line for line in doc["explanation"] if line.startswith(f"{NODE}:0 stays")]
    assert stays and "covers" in stays[0], doc["explanation"]
