"""The Grafana dashboards in deploy/grafana: valid, portable, and reading only documented names.

Every metric name a panel, a variable or a rule reads must be in docs/metrics.md's table or be a
recording rule of deploy/prometheus/gpuops.rules.yml, so the vocabulary, the rules and the
dashboards cannot drift apart. The queries themselves run against a real Prometheus in
tests/integration/test_prometheus_rules.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.promtest.dashboards import (
    PROMETHEUS_OWN,
    concrete,
    dashboard_files,
    dashboard_queries,
    documented_metrics,
    load_dashboard,
    metric_names,
    panels,
    recording_rules,
    rule_exprs,
    undefined_names,
    variable_queries,
    variables,
)

DASHBOARDS = dashboard_files()
DS_VAR = "${DS_PROMETHEUS}"
# Documented series no panel needs to show, and why.
NOT_ON_A_DASHBOARD = {
    "gpuops_process_gpu_memory_used_bytes": "opt-in (--process-metrics top:N), per pid: for queries by hand",
    "gpuops_process_series_limit": "tells readers (the PromQL fleet source) that process series are on",
}


def _known() -> set[str]:
    return documented_metrics() | recording_rules() | PROMETHEUS_OWN


def test_the_three_dashboards_are_there() -> None:
    names = {path.name for path in DASHBOARDS}
    assert names == {"gpuops-fleet.json", "gpuops-tenants-pools.json", "gpuops-node-gpu.json"}
    uids = [load_dashboard(path)["uid"] for path in DASHBOARDS]
    assert len(set(uids)) == len(uids)


def _datasources(node: Any) -> list[Any]:
    """Every value of a ``datasource`` key, anywhere in the document."""
    found: list[Any] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                found.append(value)
            found.extend(_datasources(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_datasources(item))
    return found


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_uses_a_datasource_variable_never_a_fixed_uid(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    by_name = {var["name"]: var for var in variables(doc)}
    assert by_name["DS_PROMETHEUS"]["type"] == "datasource"
    assert by_name["DS_PROMETHEUS"]["query"] == "prometheus"
    for ds in _datasources(doc):
        if isinstance(ds, dict) and ds.get("type") == "grafana":
            continue  # Grafana's own annotations source, in every dashboard
        uid = ds.get("uid") if isinstance(ds, dict) else ds
        assert uid == DS_VAR, f"{path.name}: datasource {ds!r} is not {DS_VAR}"
    assert "__inputs" not in doc  # the variable picks the datasource at view time, not at import


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_has_node_and_team_variables_that_its_queries_use(path: Path) -> None:
    doc = load_dashboard(path)
    names = {var["name"] for var in variables(doc)}
    assert {"node", "team"} <= names
    queries = dashboard_queries(path)
    assert any("$node" in q.expr for q in queries)
    assert any("$team" in q.expr for q in queries)
    for var in variables(doc):
        if var["type"] == "query":
            # "All" must select every value in a =~ matcher, the empty (unowned) one included.
            assert var["includeAll"] and var["allValue"] == ".*", var["name"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_has_a_query_and_an_id_of_its_own(path: Path) -> None:
    doc = load_dashboard(path)
    ids = [panel["id"] for panel in panels(doc)]
    assert len(ids) == len(set(ids))
    for panel in panels(doc):
        if panel["type"] == "row":
            continue
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        assert exprs and all(e.strip() for e in exprs), f"{path.name}: panel {panel['title']!r} has no query"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_reads_only_documented_or_recorded_names(path: Path) -> None:
    queries = dashboard_queries(path) + variable_queries(path)
    assert len(queries) >= 10
    assert undefined_names([(q.where(), q.expr) for q in queries], _known()) == []


def test_the_dashboards_cover_the_vocabulary() -> None:
    """Every documented series is on some dashboard or feeds a rule that is, or says why not."""
    used: set[str] = set()
    for path in DASHBOARDS:
        for query in dashboard_queries(path):
            used |= metric_names(query.expr)
    rules = rule_exprs()
    grown = True
    while grown:  # through rules that feed rules (gpu:… feeds team:…, which a panel reads)
        before = len(used)
        for rule in rules:
            if rule.name in used:
                used |= metric_names(rule.expr)
        grown = len(used) > before
    assert documented_metrics() - used - set(NOT_ON_A_DASHBOARD) == set()


def test_rules_read_only_documented_or_recorded_names() -> None:
    rules = rule_exprs()
    assert len(rules) >= 20
    assert undefined_names([(r.where(), r.expr) for r in rules], _known()) == []


def test_a_misspelt_name_in_a_dashboard_is_caught(tmp_path: Path) -> None:
    doc = load_dashboard(DASHBOARDS[0])
    panel = next(p for p in panels(doc) if p.get("targets"))
    panel["targets"][0]["expr"] = 'avg(gpuops_gpu_utilisation_ratio{node=~"$node"})'
    path = tmp_path / "drifted.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    missing = undefined_names([(q.where(), q.expr) for q in dashboard_queries(path)], _known())
    assert missing == [f"drifted.json: panel {panel['title']!r} query A: gpuops_gpu_utilisation_ratio"]


def test_documented_metrics_come_from_the_metric_table_only() -> None:
    names = documented_metrics()
    assert {"gpuops_gpu_utilization_ratio", "gpuops_node_up", "gpuops_xid_errors_total"} <= names
    # The label table's first column and names only mentioned in prose are not metrics of the table.
    assert not names & {"gpu", "UUID", "node", "team", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}
    assert all(name.startswith("gpuops_") for name in names)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (team) (gpuops_gpu_info{team!="", pool=""})', {"gpuops_gpu_info"}),
        (
            "(a_ratio >= bool 0.05) + (b_bytes / c_bytes > bool 5e-2) > bool 0 or d_bytes offset 5m",
            {"a_ratio", "b_bytes", "c_bytes", "d_bytes"},
        ),
        ('increase(x_total{node=~"$node"}[$__rate_interval]) > 0 unless x_total offset 10m', {"x_total"}),
        ('label_replace(max by (tenant, node) (u), "team", "$1", "tenant", "(.+)")', {"u"}),
        ("a - on (pool) group_left (team) b * ignoring(x) c", {"a", "b", "c"}),
        ('team:gpuops_gpus_busy:sum{team=~"${team}"} or vector(0)', {"team:gpuops_gpus_busy:sum"}),
        ("sum(rate(m[5m])) without (instance, job)", {"m"}),
    ],
)
def test_metric_names_reads_selectors_not_functions_keywords_or_labels(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_concrete_replaces_grafana_variables() -> None:
    expr = 'increase(x{node=~"$node", gpu=~"${gpu}"}[$__rate_interval])'
    assert concrete(expr) == 'increase(x{node=~".*", gpu=~".*"}[1m])'
    assert concrete(expr, {"node": "n1"}) == 'increase(x{node=~"n1", gpu=~".*"}[1m])'
