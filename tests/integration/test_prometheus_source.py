"""The PromQL fleet source (issue 16) through the CLI, against a real Prometheus scraping the
simulated fleet's exporters: the same figures as the SSH source, "source unreachable" when
Prometheus stops and recovery when it returns, scrape errors and stale nodes with their reason.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import scrape
from tests.promtest.exposition import ExpositionServer
from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
    PrometheusFactory,
    prometheus_factory_fixture,
)
from tests.promtest.prometheus import ScrapeJob

pytestmark = pytest.mark.slow

# Tenant figures that do not move with each sample's utilization (gpu_time, share and waste do).
TENANT_FIELDS = (
    "team",
    "owned",
    "silo",
    "unknown",
    "used",
    "guaranteed",
    "borrowed",
    "lent",
    "idle",
    "processes",
)


def _gpuops(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


@pytest.fixture(name="sim", scope="module")
def sim_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("promsource") / "sim"
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "8")
    assert up.returncode == 0, up.stderr
    try:
        status = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
        yield status
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr


def _targets(status: dict[str, Any]) -> list[str]:
    return [n["metrics_url"].split("//", 1)[1].split("/", 1)[0] for n in status["nodes"]]


def _figures(doc: dict[str, Any]) -> dict[str, Any]:
    gpus = sum(len(n["sample"]["gpus"]) for n in doc["nodes"] if n["sample"])
    teams = {
        t["team"]: (t["gpus_owned"], t["gpus_busy"], t["gpus_idle"], t["processes"]) for t in doc["teams"]
    }
    tenants = [tuple(t[k] for k in TENANT_FIELDS) for t in doc["tenants"]]
    return {
        "gpus": gpus,
        "states": sorted(n["state"] for n in doc["nodes"]),
        "teams": teams,
        "tenants": tenants,
    }


def test_both_sources_show_the_same_fleet(sim: dict[str, Any], prometheus_factory: PrometheusFactory) -> None:
    prom = prometheus_factory([ScrapeJob("gpuops-node", _targets(sim))])
    prom.wait_targets_up()
    prom.wait_for("count(gpuops_process_series_limit) == 8")
    fleet = sim["fleet"]
    mismatches = []
    # Both read at the same moment; the simulated work moves every second, so a pair that
    # straddles a change is asked again (each must agree within one sample interval).
    for _ in range(6):
        ssh = _spawn("discover", "-f", fleet, "--json")
        promql = _spawn("discover", "-f", fleet, "--prometheus", prom.url, "--json")
        out_ssh, err_ssh = ssh.communicate(timeout=120)
        out_prom, err_prom = promql.communicate(timeout=120)
        assert ssh.returncode == 0, err_ssh
        assert promql.returncode == 0, err_prom
        doc_ssh, doc_prom = json.loads(out_ssh), json.loads(out_prom)
        assert doc_ssh["source"] == {"kind": "ssh", "state": "live"}
        assert doc_prom["source"]["kind"] == "prometheus" and doc_prom["source"]["state"] == "live"
        assert doc_prom["source"]["url"] == prom.url
        a, b = _figures(doc_ssh), _figures(doc_prom)
        assert a["gpus"] == b["gpus"] == sum(n["gpus"] for n in sim["nodes"])
        assert a["states"] == b["states"] == ["live"] * 8
        if a == b:
            return
        mismatches.append((a, b))
        time.sleep(0.3)
    raise AssertionError(f"the sources never agreed: {mismatches[-1]}")


def _read_lines(proc: subprocess.Popen[str], until: float) -> Iterator[tuple[float, dict[str, Any]]]:
    """JSON lines of `status --json` as they come, with the time each arrived."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    buffer = ""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            if proc.poll() is not None:
                return
            continue
        chunk = os.read(fd, 1 << 20).decode()
        if not chunk:
            return
        buffer += chunk
        while "\n" in buffer:
            line, buffer = buffer.split("\n", 1)
            if line.strip():
                yield time.monotonic(), json.loads(line)


def test_prometheus_stopped_during_a_live_view(
    sim: dict[str, Any], prometheus_factory: PrometheusFactory
) -> None:
    prom = prometheus_factory([ScrapeJob("gpuops-node", _targets(sim))])
    prom.wait_targets_up()
    interval = 1.0
    view = _spawn("status", "-f", sim["fleet"], "--prometheus", prom.url, "--json", "--interval", "1s")
    stopped_at = restarted_at = down_seen = back_seen = None
    try:
        for when, doc in _read_lines(view, time.monotonic() + 90):
            state = doc["source"]["state"]
            if stopped_at is None:
                if state == "live" and all(n["state"] == "live" for n in doc["nodes"]):
                    prom.stop()
                    stopped_at = time.monotonic()
                continue
            if down_seen is None:
                if state == "unreachable":
                    down_seen = when
                    assert "connection refused" in doc["source"]["reason"], doc["source"]
                    # Every node says why it has no current figures, and keeps its last ones.
                    for node in doc["nodes"]:
                        assert node["state"] == "unreachable"
                        assert node["reason"].startswith("source unreachable: "), node["reason"]
                        assert node["sample"] is not None
                    prom.restart()
                    restarted_at = time.monotonic()
                continue
            if state == "live" and all(n["state"] == "live" for n in doc["nodes"]):
                back_seen = when
                break
    finally:
        view.terminate()
        view.communicate(timeout=20)
    assert stopped_at is not None, "the view never showed the fleet live"
    assert down_seen is not None, "the view never said the source is unreachable"
    # Within 2 intervals (and the line's printing, a beat of the same interval).
    assert down_seen - stopped_at <= 2 * interval + 0.5, down_seen - stopped_at
    assert restarted_at is not None and back_seen is not None, "the view did not recover"
    assert back_seen - restarted_at <= 2 * interval + 0.5, back_seen - restarted_at


def test_scrape_errors_and_stale_nodes_have_their_reason(
    sim: dict[str, Any], prometheus_factory: PrometheusFactory
) -> None:
    # Two extra targets exporting a node each, copied from a simulated node's exposition: one
    # that goes away (its scrape then fails), one whose agent's sample stops moving (stale).
    text = scrape(sim["nodes"][0]["metrics_url"])
    name = sim["nodes"][0]["name"]

    def node_text(node: str, sampled: float) -> bytes:
        lines = []
        for line in text.splitlines():
            line = line.replace(f'node="{name}"', f'node="{node}"')
            if line.startswith("gpuops_node_sample_timestamp_seconds{"):
                line = line.rsplit(" ", 1)[0] + f" {sampled}"
            lines.append(line)
        return ("\n".join(lines) + "\n").encode()

    stuck_since = time.time() - 30
    going = ExpositionServer(lambda: node_text("going-01", time.time())).start()
    stuck = ExpositionServer(lambda: node_text("stuck-01", stuck_since)).start()
    try:
        prom = prometheus_factory([ScrapeJob("gpuops-node", [going.target, stuck.target])])
        prom.wait_targets_up()
        prom.wait_for('gpuops_node_up{node="going-01"}')
        going.stop()
        prom.wait_for(f'up{{instance="{going.target}"}} == 0')
        result = _gpuops("discover", "--prometheus", prom.url, "--json")
    finally:
        stuck.stop()
    assert result.returncode == 3, result.stderr  # some node has no current figures: partial
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert set(nodes) == {"going-01", "stuck-01"}
    going_view, stuck_view = nodes["going-01"], nodes["stuck-01"]
    assert going_view["state"] == "unreachable"
    assert going_view["reason"].startswith(f"scrape of {going.target} failed: "), going_view["reason"]
    assert "connection refused" in going_view["reason"], going_view["reason"]
    assert stuck_view["state"] == "stale"
    assert "old when scraped" in stuck_view["reason"], stuck_view["reason"]
    assert stuck_view["age"] >= 29


def test_a_bad_prometheus_url_is_one_line() -> None:
    result = _gpuops("status", "--prometheus", "ftp://example", "--once")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --prometheus: 'ftp://example': give an http:// or https:// URL, e.g. http://127.0.0.1:9090"
    ]
    assert "Traceback" not in result.stderr
