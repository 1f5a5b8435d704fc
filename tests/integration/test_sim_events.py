"""`gpuops sim event`: a simulated node's GPU reports an XID or ECC event through the path an NVML
event takes (the backend's event source, node/health.py), so its agent over SSH, its exporter and
the operator see it — without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import one, parse, scrape

NODE = "sim-vision-01"


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("events") / "sim"
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "2")
    assert up.returncode == 0, up.stderr
    try:
        status = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
        yield directory, status
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr


def test_an_injected_xid_reaches_the_agent_the_exporter_and_the_operator(
    fleet: tuple[Path, dict[str, Any]],
) -> None:
    directory, status = fleet
    url = next(n["metrics_url"] for n in status["nodes"] if n["name"] == NODE)
    for args in (["xid", "79", "--gpu", "2"], ["xid", "79", "--gpu", "2"], ["ecc_double_bit", "--gpu", "0"]):
        result = _gpuops("sim", "event", NODE, *args, "--dir", str(directory))
        assert result.returncode == 0, result.stderr
    assert "XID 79 on GPU 2 queued" in result.stdout or "ecc_double_bit on GPU 0" in result.stdout
    series = parse(scrape(url))
    assert one(series, "gpuops_xid_errors_total", node=NODE, gpu="2", xid="79") == 2.0
    assert one(series, "gpuops_xid_errors_total", node=NODE, gpu="0") is None
    # The operator over SSH: discover's sample carries the node's events, oldest first.
    discovered = _gpuops("discover", "-f", status["fleet"], "--json")
    assert discovered.returncode == 0, discovered.stderr
    node = next(n for n in json.loads(discovered.stdout)["nodes"] if n["name"] == NODE)
    health = node["sample"]["health"]
    assert health["error"] == ""
    events = [(e["kind"], e["gpu"], e["xid"]) for e in health["events"]]
    assert events == [("xid", 2, 79), ("xid", 2, 79), ("ecc_double_bit", 0, None)]
    uuid = node["sample"]["gpus"][2]["info"]["uuid"]
    assert health["events"][0]["uuid"] == uuid
    assert [(c["gpu"], c["xid"], c["count"]) for c in health["xid_counts"]] == [(2, 79, 2)]
    # Drained once: a later scrape counts the same two, not more.
    assert one(parse(scrape(url)), "gpuops_xid_errors_total", node=NODE, gpu="2", xid="79") == 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim-nowhere-01", "xid", "79"], "no node 'sim-nowhere-01'"),
        ([NODE, "xid"], "an xid event needs its XID number"),
        ([NODE, "meltdown"], "unknown event kind 'meltdown'"),
        ([NODE, "xid", "79", "--gpu", "8"], f"--gpu 8: {NODE} has GPUs 0-7"),
        ([NODE, "clock", "13"], "only xid events carry an XID number"),
    ],
)
def test_bad_events_are_refused_in_one_line(
    fleet: tuple[Path, dict[str, Any]], args: list[str], message: str
) -> None:
    directory, _status = fleet
    result = _gpuops("sim", "event", *args, "--dir", str(directory))
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not list((directory / "state").glob("*/events/*")), "a refused event was queued"


def test_no_fleet_running(tmp_path: Path) -> None:
    result = _gpuops("sim", "event", NODE, "xid", "79", "--dir", str(tmp_path / "none"))
    assert result.returncode == 1
    assert "no simulated fleet runs in" in result.stderr and result.stderr.count("\n") == 1
