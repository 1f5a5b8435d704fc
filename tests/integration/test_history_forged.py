"""History figures that cannot be true are unreadable, not counted: one hour bucket of a node's day
file given a busy time of 1e15 s and a key 1e30 byte-seconds of memory (finite, well-formed JSON),
then the real `gpuops tenants` and `gpuops rebalance` (child processes) over SSH on 127.0.0.1
against the simulated `silos` fleet. The bucket is flagged with the node and the hour, as a
corrupt file is (docs/history.md, "Figures that cannot be true"): `tenants` exits 3, `rebalance`
refuses; before, `tenants` showed 1,643,655,489 GPUs used and exited 0."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuops.simfleet import Launched, launch, stop
from tests.integration.test_plan_apply import gpuops

pytestmark = pytest.mark.timeout(300)

NODE = "sim-vision-01"


def _forge(path: Path) -> float:
    """The first hour bucket of the day file with a GPU that has keys: that GPU's and its first
    key's busy time set to 1e15 s, the key's memory to 1e30 byte-seconds. Returns its start."""
    lines = path.read_text().split("\n")
    for n, line in enumerate(lines[1:], start=1):
        body = line.rstrip(",")
        if not body.startswith('{"start"'):
            continue
        bucket: dict[str, Any] = json.loads(body)
        gpu = next((g for g in bucket["gpus"] if g["users"]), None)
        if gpu is None:
            continue
        gpu["busy"] = gpu["users"][0]["busy"] = 1e15
        gpu["users"][0]["memory"] = 1e30
        lines[n] = json.dumps(bucket, separators=(",", ":")) + line[len(body) :]
        path.write_text("\n".join(lines))
        return float(bucket["start"])
    raise AssertionError(f"{path}: no bucket with keys")


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Launched, Path, float]]:
    directory = tmp_path_factory.mktemp("forged") / "fleet"
    started = launch(directory, "silos", timeout=60)
    try:
        first = gpuops("tenants", "-f", str(directory / "fleet.yaml"), "--window", "7d", "--json")
        assert first.returncode == 0, first.stderr  # every node's past recorded, complete
        days = sorted((directory / "state" / NODE / "history").glob("hours-*.json"))
        day = days[-3]  # two days back: inside the window, a file the recorder no longer writes
        yield started, day, _forge(day)
    finally:
        stop(directory)


def test_tenants_flags_the_forged_hour_as_unreadable(forged: tuple[Launched, Path, float]) -> None:
    fleet, day, start = forged
    hour = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    result = gpuops("tenants", "-f", str(fleet.dir / "fleet.yaml"), "--window", "7d", "--json")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert set(doc["incomplete"]) == {NODE}
    assert doc["incomplete"][NODE]["buckets"] == 1
    (reason,) = doc["incomplete"][NODE]["reasons"]
    assert day.name in reason and hour in reason and "busy" in reason, reason
    assert doc["readable_buckets"] == doc["buckets"] - 1
    assert doc["warnings"][0].startswith(f"history incomplete: 1 bucket unreadable on {NODE} (")
    gpus = len(doc["gpus"])
    for row in doc["tenants"]:  # the figures are the readable hours' only: none past the fleet
        assert row["used"] <= gpus and row["peak"] <= gpus and row["held"] <= gpus, row
        assert row["memory"] < 1e15, row

    table = gpuops("tenants", "-f", str(fleet.dir / "fleet.yaml"), "--window", "7d")
    assert table.returncode == 3, table.stdout + table.stderr
    assert f"history incomplete: 1 bucket unreadable on {NODE}" in table.stdout
    assert hour in table.stdout


def test_rebalance_refuses_the_forged_evidence(forged: tuple[Launched, Path, float], tmp_path: Path) -> None:
    fleet, _day, _start = forged
    out = tmp_path / "proposed.yaml"
    refused = gpuops("rebalance", "-f", str(fleet.dir / "fleet.yaml"), "--window", "7d", "-o", str(out))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"1 bucket unreadable on {NODE}" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists()
