"""deploy/prometheus/gpuops.rules.yml checked by promtool and run by a real Prometheus.

* ``promtool check rules`` is clean, and rejects a broken copy;
* ``promtool test rules`` (deploy/prometheus/gpuops.rules.test.yml) passes, and fails on copies
  of the rules with one thing changed: its expectations are real;
* every recording rule and alert is exercised by that unit test file;
* a real Prometheus scraping an exposition of the documented vocabulary (a small fleet written
  with prometheus-client) loads the rules healthy, records the team and pool figures the fleet
  implies, and answers every dashboard query with series.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.promtest.dashboards import (
    RULES_FILE,
    RULES_TESTS_FILES,
    concrete,
    dashboard_files,
    dashboard_queries,
    load_yaml,
    recording_rules,
    rule_exprs,
)
from tests.promtest.exposition import ExpositionServer
from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
    PrometheusFactory,
    prometheus_factory_fixture,
    promtool_path_fixture,
)
from tests.promtest.prometheus import Sample, ScrapeJob
from tests.promtest.promtool import check_rules, lint_problems, test_rules


def _copy_with(tmp_path: Path, old: str, new: str) -> list[Path]:
    """The rules and their unit tests in ``tmp_path``, ``old`` replaced once in the rules."""
    text = RULES_FILE.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} must occur once in {RULES_FILE.name}"
    (tmp_path / RULES_FILE.name).write_text(text.replace(old, new), encoding="utf-8")
    for tests in RULES_TESTS_FILES:
        shutil.copy(tests, tmp_path / tests.name)
    return [tmp_path / tests.name for tests in RULES_TESTS_FILES]


def test_promtool_check_rules_is_clean(promtool_path: str) -> None:
    result = check_rules(RULES_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in result.stdout


def test_promtool_check_rules_rejects_a_broken_expression(promtool_path: str, tmp_path: Path) -> None:
    _copy_with(tmp_path, "expr: max by (pool) (gpuops_pool_gpus)", "expr: max by (pool) (gpuops_pool_gpus")
    result = check_rules(tmp_path / RULES_FILE.name)
    assert result.returncode != 0
    assert "pool:gpuops_pool_gpus:max" in result.stdout + result.stderr or "parse error" in result.stderr


def test_promtool_unit_tests_pass(promtool_path: str) -> None:
    result = test_rules(*RULES_TESTS_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULES_TESTS_FILES), result.stdout


@pytest.mark.parametrize(
    ("old", "new", "caught_by"),
    [
        # The threshold of the hot-GPU alert.
        ("(gpuops_gpu_temperature_celsius) > 85", "(gpuops_gpu_temperature_celsius) > 95", "GpuopsGpuTooHot"),
        # Counting GPU-a once though three exporters report it.
        (
            'sum by (team) (max by (team, UUID) (gpuops_gpu_memory_used_bytes{team!=""}))',
            'sum by (team) (gpuops_gpu_memory_used_bytes{team!=""})',
            "team:gpuops_gpu_memory_used_bytes:sum",
        ),
        # Pooled GPUs are not a team's busy silo GPUs.
        (
            'sum by (team) (gpu:gpuops_gpu_busy:bool{team!="", pool=""})',
            'sum by (team) (gpu:gpuops_gpu_busy:bool{team!=""})',
            "team:gpuops_gpus_busy:sum",
        ),
        # A team guaranteed nothing borrows all it uses.
        (
            "clamp_min(team:gpuops_tenant_gpu_used:sum - team:gpuops_tenant_guaranteed_gpus:sum, 0)\n"
            "          or\n          team:gpuops_tenant_gpu_used:sum",
            "clamp_min(team:gpuops_tenant_gpu_used:sum - team:gpuops_tenant_guaranteed_gpus:sum, 0)",
            "team:gpuops_gpus_borrowed:sum",
        ),
        # The first XID of a GPU, on a counter that appears at 1.
        (
            "(gpuops_xid_errors_total > 0 unless gpuops_xid_errors_total offset 10m)",
            "(gpuops_xid_errors_total > 0 unless gpuops_xid_errors_total)",
            "GpuopsXidErrors",
        ),
        # A reason that changes must not restart the node-down wait.
        ("expr: max by (node) (gpuops_node_up) == 0", "expr: gpuops_node_up == 0", "GpuopsNodeDown"),
        ("for: 3d", "for: 1d", "GpuopsIdleSilo"),
        # A pool's guarantees are not the teams' silos (pool="").
        (
            '(gpuops_tenant_guaranteed_gpus{pool!=""})',
            "(gpuops_tenant_guaranteed_gpus)",
            "pool:gpuops_tenant_guaranteed_gpus:sum",
        ),
        ("for: 1h", "for: 30m", "GpuopsTeamAboveGuarantee"),
    ],
    ids=[
        "hot",
        "dedupe",
        "silo-busy",
        "borrowed-unguaranteed",
        "first-xid",
        "node-reason",
        "idle-3d",
        "above-1h",
        "pool-silo",
    ],
)
def test_promtool_unit_tests_catch_a_changed_rule(
    promtool_path: str, tmp_path: Path, old: str, new: str, caught_by: str
) -> None:
    tests_files = _copy_with(tmp_path, old, new)
    assert check_rules(tmp_path / RULES_FILE.name).returncode == 0  # still valid, only wrong
    result = test_rules(*tests_files)
    assert result.returncode != 0, result.stdout
    assert caught_by in result.stdout + result.stderr


def test_every_rule_is_unit_tested() -> None:
    tests = [group for path in RULES_TESTS_FILES for group in load_yaml(path)["tests"]]
    tested_exprs = " ".join(t["expr"] for group in tests for t in group.get("promql_expr_test", []))
    fired = {
        t["alertname"] for group in tests for t in group.get("alert_rule_test", []) if t.get("exp_alerts")
    }
    for rule in rule_exprs():
        if rule.kind == "record":
            assert rule.name in tested_exprs, f"{rule.where()}: no promql_expr_test reads it"
        else:
            assert rule.name in fired, f"{rule.where()}: no alert_rule_test expects it to fire"


# --------------------------------------------------------------------------- a real Prometheus

GPU_LABELS = ["node", "gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname", "team", "pool"]
LIMITER_LABELS = ["node", "gpu", "UUID", "Hostname", "tenant"]
MIG_LABELS = ["node", "gpu", "UUID", "Hostname", "GPU_I_PROFILE", "GPU_I_ID", "team", "pool"]


def _fleet_exposition() -> CollectorRegistry:
    """Two nodes in the documented vocabulary: vision owns n1 (GPU 1 pooled), nlp owns n2
    (GPU 0 in MIG mode with two slices, GPU 1 pooled); n3 is unreachable."""
    reg = CollectorRegistry()

    def gauge(name: str, labels: list[str]) -> Gauge:
        return Gauge(name, f"test {name}", labels, registry=reg)

    info = gauge("gpuops_gpu_info", [*GPU_LABELS, "driver_version", "mig_mode"])
    util = gauge("gpuops_gpu_utilization_ratio", GPU_LABELS)
    used = gauge("gpuops_gpu_memory_used_bytes", GPU_LABELS)
    total = gauge("gpuops_gpu_memory_total_bytes", GPU_LABELS)
    power = gauge("gpuops_gpu_power_watts", GPU_LABELS)
    temp = gauge("gpuops_gpu_temperature_celsius", GPU_LABELS)
    # node, gpu, team, pool, utilization (None: MIG on), memory used
    gpus = [
        ("n1", "0", "vision", "", 0.625, 20e9),
        ("n1", "1", "vision", "shared", 0.25, 1e9),
        ("n1", "2", "vision", "", 0.0, 0.0),
        ("n2", "0", "nlp", "", None, 16e9),
        ("n2", "1", "nlp", "shared", 0.75, 40e9),
    ]
    for node, gpu, team, pool, ratio, memory in gpus:
        labels = [
            node,
            gpu,
            f"GPU-{node}-{gpu}",
            f"nvidia{gpu}",
            "NVIDIA H100 80GB HBM3",
            f"0000:{gpu}1:00.0",
        ]
        labels += [node, team, pool]
        info.labels(*labels, "550.54.15", "enabled" if ratio is None else "disabled").set(1)
        if ratio is not None:
            util.labels(*labels).set(ratio)
        used.labels(*labels).set(memory)
        total.labels(*labels).set(80e9)
        power.labels(*labels).set(300)
        temp.labels(*labels).set(60)
    mig_used = gauge("gpuops_mig_instance_memory_used_bytes", MIG_LABELS)
    mig_util = gauge("gpuops_mig_instance_utilization_ratio", MIG_LABELS)
    for gi, activity in (("1", 0.5), ("2", 0.0)):
        labels = ["n2", "0", "GPU-n2-0", "n2", "3g.40gb", gi, "nlp", ""]
        mig_used.labels(*labels).set(8e9 * activity)
        mig_util.labels(*labels).set(activity)
    Counter("gpuops_xid_errors", "test", ["node", "gpu", "UUID", "Hostname", "xid"], registry=reg).labels(
        "n1", "0", "GPU-n1-0", "n1", "79"
    ).inc()
    tenant_used = gauge("gpuops_tenant_gpu_used", ["tenant", "node"])
    tenant_mem = gauge("gpuops_tenant_memory_used_bytes", ["tenant", "node"])
    for tenant, node, gpus_used, memory in (("vision", "n1", 0.875, 21e9), ("nlp", "n2", 1.5, 56e9)):
        tenant_used.labels(tenant, node).set(gpus_used)
        tenant_mem.labels(tenant, node).set(memory)
    owned = gauge("gpuops_tenant_owned_gpus", ["tenant"])
    owned.labels("vision").set(3)
    owned.labels("nlp").set(2)
    guaranteed = gauge("gpuops_tenant_guaranteed_gpus", ["tenant", "pool"])
    guaranteed.labels("vision", "").set(2)  # the silo, as the fleet exporter writes it
    guaranteed.labels("nlp", "").set(1)
    guaranteed.labels("vision", "shared").set(0.5)
    guaranteed.labels("nlp", "shared").set(0.5)
    gauge("gpuops_pool_gpus", ["pool"]).labels("shared").set(2)
    limit = gauge("gpuops_limiter_memory_limit_bytes", LIMITER_LABELS)
    held = gauge("gpuops_limiter_memory_used_bytes", LIMITER_LABELS)
    share = gauge("gpuops_limiter_compute_share_ratio", LIMITER_LABELS)
    target = gauge("gpuops_limiter_compute_share_target_ratio", [*LIMITER_LABELS, "policy"])
    for tenant, fraction in (("a", 0.25), ("b", 0.75)):
        labels = ["n1", "1", "GPU-n1-1", "n1", tenant]
        limit.labels(*labels).set(40e9)
        held.labels(*labels).set(10e9)
        share.labels(*labels).set(fraction)
        target.labels(*labels, "burst-share").set(fraction)
    gauge("gpuops_mps_active_thread_percentage", ["node", "Hostname", "user"]).labels(
        "n2", "n2", "alice"
    ).set(50)
    up = gauge("gpuops_node_up", ["node", "state", "reason"])
    up.labels("n1", "live", "").set(1)
    up.labels("n2", "live", "").set(1)
    up.labels("n3", "unreachable", "connect timeout").set(0)
    sampled = gauge("gpuops_node_sample_timestamp_seconds", ["node", "Hostname"])
    for node in ("n1", "n2"):
        sampled.labels(node, node).set(time.time())
    return reg


def _by(samples: list[Sample], label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples}


def test_rules_and_dashboards_in_a_real_prometheus(
    prometheus_factory: PrometheusFactory, promtool_path: str
) -> None:
    registry = _fleet_exposition()
    assert lint_problems(generate_latest(registry)) == []
    with ExpositionServer(lambda: generate_latest(registry)) as fleet:
        prom = prometheus_factory([ScrapeJob("gpuops-fleet", [fleet.target])], rule_files=[RULES_FILE])
        # Groups run on timers of their own: wait until each has recorded (team reads gpu's).
        for name in sorted(recording_rules()):
            prom.wait_for(name, timeout=30)
        for group in prom.rules():
            for rule in group["rules"]:
                assert rule["health"] in ("ok", "unknown"), f"{rule['name']}: {rule.get('lastError')}"

        # What the fleet above implies: n1/0 busy by utilization, n2/0 (MIG) by its slice at 50%, n1/2 idle;
        # pooled GPUs are the pool's.
        assert _by(prom.query("team:gpuops_gpus_busy:sum"), "team") == {"vision": 1, "nlp": 1}
        assert _by(prom.query("team:gpuops_gpus_idle:sum"), "team") == {"vision": 1, "nlp": 0}
        guaranteed = _by(prom.query("team:gpuops_tenant_guaranteed_gpus:sum"), "team")
        assert guaranteed == {"vision": 2.5, "nlp": 1.5}
        assert _by(prom.query("team:gpuops_gpus_borrowed:sum"), "team") == {"vision": 0, "nlp": 0}
        assert _by(prom.query("pool:gpuops_gpus_busy:sum"), "pool") == {"shared": 2}
        assert _by(prom.query("pool:gpuops_gpu_used:sum"), "pool") == {"shared": 1.0}
        assert _by(prom.query("team:gpuops_gpu_memory_used_bytes:sum"), "team") == {
            "vision": 21e9,
            "nlp": 56e9,
        }

        # Every panel query parses and returns series (rules evaluate every second; give the
        # range queries of the XID panels a second scrape).
        prom.wait_for("count_over_time(gpuops_xid_errors_total[1m]) >= 2", timeout=15)
        empty: list[str] = []
        for path in dashboard_files():
            for query in dashboard_queries(path):
                if not prom.query(concrete(query.expr)):
                    empty.append(f"{query.where()}: {query.expr}")
        assert empty == []
