"""End to end without a GPU: an XID injected into a simulated node (`gpuops sim event`) reaches a real
Prometheus through both exporters — every node's `gpuops agent --metrics` exporter of `gpuops sim
up` and `gpuops exporter -f fleet.yaml` over SSH — where `gpuops_xid_errors_total`, gpuops' rules
and the GpuopsXidErrors alert see it through the HTTP API; the MIG GPUs' slices have
`gpuops_mig_instance_utilization_ratio` from both."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from tests.integration.test_fleet_exporter import _gpuops, fleet_exporter
from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
    PrometheusFactory,
    prometheus_factory_fixture,
)
from tests.promtest.prometheus import ScrapeJob

RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus/gpuops.rules.yml"
NODES = 5  # vision, speech, robotics, chat (8x H100), platform (4x H100 carved into 22 slices)
NODE, GPU, XID = "sim-chat-01", "3", "79"


def test_an_injected_xid_through_both_exporters_rules_and_alert(
    prometheus_factory: PrometheusFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "sim"
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", str(NODES))
    assert up.returncode == 0, up.stderr
    try:
        status = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
        nodes = [urlsplit(n["metrics_url"]).netloc for n in status["nodes"]]
        with fleet_exporter(Path(status["fleet"]), "--interval", "1s") as (url, _proc):
            prom = prometheus_factory(
                [ScrapeJob("gpuops-node", nodes), ScrapeJob("gpuops-fleet", [urlsplit(url).netloc])],
                rule_files=[RULES],
            )
            prom.wait_for(f"count(gpuops_node_up{{job='gpuops-fleet'}} == 1) == {NODES}", timeout=60)
            assert not prom.query("gpuops_xid_errors_total"), "an XID before any was injected"
            assert not prom.query("ALERTS{alertname='GpuopsXidErrors'}")

            injected = _gpuops("sim", "event", NODE, "xid", XID, "--gpu", GPU, "--dir", str(directory))
            assert injected.returncode == 0, injected.stderr

            # Both exporters count it once, on that GPU with its UUID.
            where = f"node='{NODE}', gpu='{GPU}', xid='{XID}'"
            counted = prom.wait_for(
                f"gpuops_xid_errors_total{{{where}}} == 1",
                timeout=30,
                until=lambda s: {x.labels["job"] for x in s} == {"gpuops-node", "gpuops-fleet"},
            )
            uuids = {s.labels["UUID"] for s in counted}
            assert len(uuids) == 1 and next(iter(uuids)).startswith("GPU-"), counted
            assert {(s.labels["node"], s.labels["gpu"]) for s in prom.query("gpuops_xid_errors_total")} == {
                (NODE, GPU)
            }
            # The alert fires, once per GPU and XID whichever exporters said it.
            alerts = prom.wait_for(
                "ALERTS{alertname='GpuopsXidErrors', alertstate='firing'}",
                timeout=30,
            )
            assert [(a.labels["node"], a.labels["gpu"], a.labels["xid"]) for a in alerts] == [
                (NODE, GPU, XID)
            ], "\n".join(str(sorted(a.labels.items())) for a in alerts)
            assert alerts[0].labels["UUID"] in uuids and alerts[0].labels["severity"] == "warning"
            # Every rule evaluates cleanly with both exporters scraped, and the team records answer.
            rules = [r for g in prom.rules() for r in g["rules"]]
            assert rules and all(r["health"] == "ok" for r in rules), [
                (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
            ]
            assert prom.wait_for("team:gpuops_gpus_busy:sum{team='chat'}", timeout=30)
            # Every silo GPU counts once, busy or idle, the platform's MIG GPUs too (a MIG GPU is
            # busy by its slices: utilization, else a process); the idle silo is idle.
            busy = {s.labels["team"]: s.value for s in prom.query("team:gpuops_gpus_busy:sum")}
            idle = {s.labels["team"]: s.value for s in prom.query("team:gpuops_gpus_idle:sum")}
            silos = {"vision": 8, "speech": 4, "robotics": 8, "chat": 8, "platform": 4}
            assert {t: busy[t] + idle[t] for t in busy} == silos, (busy, idle)
            assert busy["robotics"] == 0, busy

            # MIG slices' utilization (GPM on the simulated H100s): every GPU instance of the
            # platform node, from each exporter.
            slices = prom.query(
                "count by (job) (gpuops_mig_instance_utilization_ratio{node='sim-platform-01'})"
            )
            assert {s.labels["job"]: s.value for s in slices} == {"gpuops-node": 22.0, "gpuops-fleet": 22.0}
            ratios = prom.query("gpuops_mig_instance_utilization_ratio{job='gpuops-node'}")
            assert all(0.0 <= s.value <= 1.0 for s in ratios), ratios
            # Eight slices serve inference (2 embedding servers, 6 small ones): never idle, though
            # at night and in their first two minutes (warm-up) they run at a few percent.
            assert sum(s.value > 0.0 for s in ratios) >= 8, sorted(s.value for s in ratios)
            assert all(s.labels["GPU_I_ID"] and s.labels["GPU_I_PROFILE"] for s in ratios)
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
