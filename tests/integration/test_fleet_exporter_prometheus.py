"""A real Prometheus scrapes `gpuops exporter` over a simulated fleet (real SSH on loopback), and
PromQL through its HTTP API agrees with `gpuops tenants --json` over the same minute."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from gpuops.simfleet import launch, running_pid, stop
from tests.integration.test_fleet_exporter import _gpuops, fleet_exporter
from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
    PrometheusFactory,
    prometheus_factory_fixture,
)
from tests.promtest.prometheus import Prometheus, ScrapeJob

NODES = 5  # vision (training), speech (saturated), robotics (idle), chat (inference), platform (MIG)
# Half of robotics' idle node pooled, with guarantees for two other teams.
POOLS = """
pools:
  shared:
    gpus: [{nodes: sim-robotics-01, gpus: "0-3"}]
    guarantees: {vision: 50%, speech: 25%}
"""


def _by_tenant(prom: Prometheus, expr: str, at: float) -> dict[str, float]:
    return {s.labels["tenant"]: s.value for s in prom.query(expr, at)}


class UsedDisagrees(AssertionError):
    """PromQL's mean GPU time of a team is not `gpuops tenants --json`'s `used`."""


@pytest.mark.slow  # waits for a whole wall-clock minute of Prometheus
def test_promql_agrees_with_tenants(prometheus_factory: PrometheusFactory, tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    launch(directory, "silos", nodes=NODES, timeout=90)
    try:
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text((directory / "fleet.yaml").read_text() + POOLS)
        with fleet_exporter(fleet, "--interval", "1s") as (url, _proc):
            prom = prometheus_factory([ScrapeJob("gpuops-fleet", [url.split("/")[2]])])
            prom.wait_for(f"count(gpuops_node_up == 1) == {NODES}", timeout=60)
            # tenants' 1m window is whole minute buckets: wait until Prometheus has watched one
            # whole, then ask both about the time from its start until now.
            start = math.ceil(time.time() / 60) * 60
            time.sleep(max(0.0, start + 62 - time.time()))
            # A node's minute is readable once its recorder has sampled past the minute's end: on
            # a loaded machine that can be seconds late (exit 3, "no whole minute buckets
            # readable"). Asked again until then; the last whole minute stays this one until +120.
            result = _gpuops("tenants", "-f", str(fleet), "--window", "1m", "--json")
            while result.returncode == 3 and time.time() < start + 100:
                time.sleep(2)
                result = _gpuops("tenants", "-f", str(fleet), "--window", "1m", "--json")
            assert result.returncode == 0, result.stderr
            document = json.loads(result.stdout)
            until = document["until"]
            assert document["since"] == start, (document["since"], start)
            span = math.floor(until - start)
            # Every team at every step: a team with no process has no use series, which is 0.
            used = _by_tenant(
                prom,
                f"avg_over_time((sum by (tenant) (gpuops_tenant_gpu_used)"
                f" or sum by (tenant) (0 * gpuops_tenant_owned_gpus))[{span}s:1s])",
                until,
            )
            owned = _by_tenant(prom, "gpuops_tenant_owned_gpus", until)
            guaranteed = _by_tenant(prom, "sum by (tenant) (gpuops_tenant_guaranteed_gpus)", until)
            pools = {s.labels["pool"]: s.value for s in prom.query("gpuops_pool_gpus", until)}
    finally:
        stop(directory)
        assert running_pid(directory) is None
    rows = {r["team"]: r for r in document["tenants"]}
    assert set(rows) <= set(owned), (rows, owned)
    for team, row in rows.items():
        assert owned[team] == row["owned"], team
        assert guaranteed[team] == pytest.approx(row["guaranteed"], abs=1e-6), team
    assert guaranteed["vision"] == 8 + 2 and guaranteed["speech"] == 4 + 1  # silo + pool share
    assert pools == {p["pool"]: p["gpus"] for p in document["pools"]} == {"shared": 4}
    assert sum(used.values()) > 5  # the silos are busy: the comparison is of real figures
    # The nodes' history and the exporter sample the same simulated GPUs, at instants apart by
    # less than one sample.
    wrong = {
        team: (used[team], row["used"])
        for team, row in rows.items()
        if used[team] != pytest.approx(row["used"], abs=0.05, rel=0.03)
    }
    if wrong:
        raise UsedDisagrees(f"PromQL, tenants --json: {wrong}")
