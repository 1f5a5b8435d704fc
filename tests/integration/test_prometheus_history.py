"""`gpuops tenants --window` and `gpuops rebalance` with the history read from Prometheus' recording
rules (deploy/prometheus/gpuops-history.rules.yml) against the same commands reading every node's
history over SSH, on one simulated fleet scraped by its own Prometheus (`sim up --prometheus`).

Prometheus holds only what it scraped since the fleet started, and the sim nodes' history before
the start is a simulated past, so the window is a minute (two minute buckets) and the tests wait
until both buckets are after the start (at most 2 minutes): both paths then see the same work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent_helpers import REPO
from tests.promtest.prometheus import prometheus_unavailable_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        prometheus_unavailable_reason() is not None, reason=str(prometheus_unavailable_reason())
    ),
]

EXACT = ("team", "owned", "silo", "guaranteed")
# GPU-equivalents: the simulated work moves every second, and the two paths sample it at
# different moments (the node's recorder, Prometheus' scrapes).
CLOSE = ("used", "p95", "peak", "idle_owned", "held", "borrowed", "lent")
TOLERANCE = 0.15


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=5) as response:
        return list(json.loads(response.read())["data"]["result"])


@pytest.fixture(name="sim", scope="module")
def sim_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("promhistory") / "sim"
    started = time.time()
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "8", "--prometheus")
    assert up.returncode == 0, up.stderr
    try:
        status = json.loads(_gpuops("sim", "status", "--dir", str(directory), "--json").stdout)
        url = status["prometheus_url"]
        # A 1m window's first bucket is the previous whole minute: wait until it began after the
        # first scrape, then check that every GPU was recorded in it.
        first_whole_minute = (int(started) // 60 + 1) * 60 + 2
        time.sleep(max(0.0, first_whole_minute + 60 - time.time()))
        found = _query(url, "min(count_over_time(gpu:gpuops_gpu_time:ratio[1m]))")
        assert found and float(found[0]["value"][1]) >= 50, found
        yield status
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr


def _differences(ssh: dict[str, Any], prom: dict[str, Any]) -> list[str]:
    out = []
    rows_ssh = {t["team"]: t for t in ssh["tenants"]}
    rows_prom = {t["team"]: t for t in prom["tenants"]}
    if set(rows_ssh) != set(rows_prom):
        return [f"teams {sorted(rows_ssh)} != {sorted(rows_prom)}"]
    for team, a in rows_ssh.items():
        b = rows_prom[team]
        out += [f"{team}.{k}: {a[k]} != {b[k]}" for k in EXACT if a[k] != b[k]]
        out += [f"{team}.{k}: {a[k]} vs {b[k]}" for k in CLOSE if abs(a[k] - b[k]) > TOLERANCE]
    gpus_ssh = {(g["node"], g["index"], g["owner"], g["pool"]) for g in ssh["gpus"]}
    gpus_prom = {(g["node"], g["index"], g["owner"], g["pool"]) for g in prom["gpus"]}
    if gpus_ssh != gpus_prom:
        out.append(f"GPUs differ: {sorted(gpus_ssh ^ gpus_prom)}")
    return out


def test_tenants_from_prometheus_match_the_nodes_history(sim: dict[str, Any]) -> None:
    fleet, url = sim["fleet"], sim["prometheus_url"]
    differences: list[str] = []
    for _ in range(3):
        ssh = _gpuops("tenants", "-f", fleet, "--window", "1m", "--json")
        prom = _gpuops("tenants", "-f", fleet, "--window", "1m", "--json", "--prometheus", url)
        assert ssh.returncode == 0, ssh.stderr
        assert prom.returncode == 0, prom.stderr
        doc_ssh, doc_prom = json.loads(ssh.stdout), json.loads(prom.stdout)
        assert doc_ssh["source"] == {"kind": "ssh"}
        assert doc_prom["source"] == {"kind": "prometheus", "url": url}
        assert doc_prom["missing"] == {}
        assert len(doc_prom["gpus"]) == sum(n["gpus"] for n in sim["nodes"])
        assert sum(t["used"] for t in doc_prom["tenants"]) > 1  # the fleet is busy: not all zeros
        differences = _differences(doc_ssh, doc_prom)
        if not differences:
            return
        time.sleep(2)
    raise AssertionError("the two paths disagree: " + "; ".join(differences))


# `rebalance --idle`: the default first. The simulated inference GPUs idle at about 10% at night,
# on the default threshold itself, where the two paths' samples (the recorder's, the scrapes') put
# a GPU on either side; the proposals are then compared at a threshold no GPU sits on.
IDLE_THRESHOLDS = (10, 8, 12, 6)
AT_THRESHOLD = 0.01  # a GPU whose p95 is this close to the threshold may move on one path only


def test_rebalance_from_prometheus_proposes_what_the_nodes_history_does(sim: dict[str, Any]) -> None:
    fleet, url = sim["fleet"], sim["prometheus_url"]
    for idle in IDLE_THRESHOLDS:
        common = ("rebalance", "-f", fleet, "--window", "1m", "--json", "--idle", f"{idle}%")
        ssh = _gpuops(*common)
        prom = _gpuops(*common, "--prometheus", url)
        assert ssh.returncode == prom.returncode == 2, ssh.stderr + prom.stderr  # changes proposed
        a, b = json.loads(ssh.stdout), json.loads(prom.stdout)
        moved = [{(m["node"], m["index"], m["owner"]) for m in doc["moves"]} for doc in (a, b)]
        p95 = {(m["node"], m["index"]): m["p95_busy"] for doc in (a, b) for m in doc["moves"]}
        differ = moved[0] ^ moved[1]
        # Only GPUs on the threshold may differ; any other is a disagreement of the two paths.
        assert all(abs(p95[node, index] - idle / 100) <= AT_THRESHOLD for node, index, _ in differ), (
            idle,
            differ,
            p95,
        )
        if not differ:
            break
    else:
        raise AssertionError(f"a GPU sat on every threshold of {IDLE_THRESHOLDS}")
    assert moved[0] == moved[1] and moved[0], moved
    assert a["capacity"] == b["capacity"]
    assert [c["node"] for c in a["carvings"]] == [c["node"] for c in b["carvings"]]


def test_prometheus_without_the_history_rules_is_one_line(sim: dict[str, Any], tmp_path: Any) -> None:
    from tests.promtest.prometheus import Prometheus, ScrapeJob

    targets = [n["metrics_url"].split("//", 1)[1].split("/", 1)[0] for n in sim["nodes"]]
    with Prometheus(tmp_path / "bare", [ScrapeJob("gpuops-node", targets)]).start() as bare:
        result = _gpuops("tenants", "-f", sim["fleet"], "--window", "1m", "--prometheus", bare.url)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: --prometheus: Prometheus at {bare.url} has no gpuops.history recording rules: load "
        "deploy/prometheus/gpuops-history.rules.yml (docs/prometheus-source.md#history)"
    ]
