"""The metric schema (gpuops/core/metric_schema.py) is the one vocabulary of gpuops' series:

- every metric name deploy/ reads (recording rules, alerts, the rules' unit tests, the Grafana
  dashboards' panels and variables) is a row of the schema or a recording rule of deploy/;
- docs/metrics.md's table is the schema's gpuops rows, type and unit included;
- both exporters render exactly the rows they say (name, type, help, labels), and the fleet
  exporter's label values are in the row's label order;
- the PromQL readers ask only for rows and records, and the decoder reads back what the node
  exporter and the fleet exporter render (the same figures as the sample they came from).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric as PromFamily

from gpuops.core import metric_schema as schema
from gpuops.core.busy import gpu_busy
from gpuops.core.model import NodeHealth, NodeSample, NotAvailable, XidCount
from gpuops.exporter.fleet_metrics import FleetMetrics
from gpuops.fleet.promql import decode
from gpuops.fleet.promql.client import Series
from gpuops.fleet.source import FleetSnapshot, NodeView
from gpuops.node import metrics as node_metrics
from gpuops.node.metrics import Family, NodeCollector
from gpuops.node.sampler import Latest
from gpuops.simfleet.source import SimSource
from gpuops.tenancy import prometheus_history
from gpuops.tenancy.ownership import Ownership
from tests.promtest.dashboards import (
    PROMETHEUS_OWN,
    REPO,
    dashboard_files,
    dashboard_queries,
    documented_metrics,
    load_yaml,
    metric_names,
    rule_exprs,
    variable_queries,
)
from tests.unit.test_views_shared_pass import _pooled

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = sorted(p for p in PROMETHEUS_DIR.glob("*.yml") if not p.name.endswith(".test.yml"))
RULE_TEST_FILES = sorted(PROMETHEUS_DIR.glob("*.test.yml"))
EPOCH = 1_767_225_600.0
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}


def _recorded() -> set[str]:
    return {r.name for path in RULE_FILES for r in rule_exprs(path) if r.kind == "record"}


def _deploy_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every expression of deploy/: rules and alerts of every rules file, the
    dashboards' panel queries and their variables' selectors."""
    found = [(f"{path.name}: {r.kind} {r.name}", r.expr) for path in RULE_FILES for r in rule_exprs(path)]
    for path in dashboard_files():
        found += [(q.where(), q.expr) for q in dashboard_queries(path) + variable_queries(path)]
    return found


def test_the_schema_has_one_row_per_name_and_valid_rows() -> None:
    assert len(schema.BY_NAME) == len(schema.SCHEMA)
    for m in schema.SCHEMA:
        assert m.type in (schema.GAUGE, schema.COUNTER), m.name
        assert m.name.endswith("_total") == (m.type == schema.COUNTER), m.name
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", m.name), m.name
        assert m.help and m.unit, m.name
        assert len(set(m.labels)) == len(m.labels), m.name
        assert m.exporters and set(m.exporters) <= {schema.NODE, schema.FLEET}, m.name
    assert {"gpu", "UUID"} <= set(schema.GPU_LABELS) and "team" not in schema.GPU_INFO.labels_for(schema.NODE)


def test_every_metric_name_in_deploy_is_a_schema_row_or_a_recording_rule() -> None:
    exprs = _deploy_exprs()
    assert len(exprs) >= 60  # three rules files' worth and three dashboards
    known = set(schema.BY_NAME) | _recorded() | PROMETHEUS_OWN
    missing = [f"{where}: {name}" for where, expr in exprs for name in sorted(metric_names(expr) - known)]
    assert missing == []


def test_every_series_the_rules_tests_feed_is_a_schema_row_with_its_labels() -> None:
    series_re = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
    checked = 0
    problems = []
    for path in RULE_TEST_FILES:
        for test in load_yaml(path).get("tests", []):
            for item in test.get("input_series", []):
                match = series_re.match(item["series"].strip())
                assert match is not None, item["series"]
                if match.group("name") in PROMETHEUS_OWN:
                    continue
                row = schema.BY_NAME.get(match.group("name"))
                if row is None:
                    problems.append(f"{path.name}: {match.group('name')} is not in the schema")
                    continue
                labels = set(label_re.findall(match.group("labels") or ""))
                extra = labels - set(row.labels) - TARGET_LABELS
                if extra:
                    problems.append(
                        f"{path.name}: {item['series']}: {sorted(extra)} not labels of {row.name}"
                    )
                checked += 1
    assert checked >= 20
    assert problems == []


def test_a_name_outside_the_schema_in_deploy_is_caught() -> None:
    known = set(schema.BY_NAME) | _recorded() | PROMETHEUS_OWN
    assert metric_names("sum(gpuops_gpu_utilisation_ratio) + gpuops_gpu_utilization_ratio") - known == {
        "gpuops_gpu_utilisation_ratio"
    }


def _doc_table(path: Path = REPO / "docs" / "metrics.md") -> dict[str, tuple[str, str]]:
    """docs/metrics.md's metric table: name -> (type, unit)."""
    out: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "metric":
            in_table = True
        elif in_table and cells[0].startswith("`"):
            out[cells[0].strip("`")] = (cells[1], cells[2])
    return out


def test_the_docs_table_is_the_schema() -> None:
    table = _doc_table()
    assert set(table) == documented_metrics()
    rows = {m.name: (m.type, m.unit) for m in schema.SCHEMA if m.name.startswith("gpuops_")}
    assert table == rows


# ---- the exporters render the rows -------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet() -> tuple[FleetSnapshot, Ownership]:
    clock = [EPOCH]
    source = SimSource.scenario("large", 40, epoch=EPOCH - 86400, clock=lambda: clock[0])
    source.sample()
    clock[0] += 1.0
    source.sample()
    snapshot = source.snapshot(clock[0])
    # A host name that is not the node's name, and XID counts: every label has its own value.
    views = []
    for view in snapshot.nodes:
        if view.sample is not None:
            health = NodeHealth(since=EPOCH, xid_counts=(XidCount(0, 79, 2, EPOCH),))
            view = replace(view, sample=replace(view.sample, hostname=f"host-{view.name}", health=health))
        views.append(view)
    return replace(snapshot, nodes=tuple(views)), _pooled(source)  # fleet.yaml's teams and a pool


def _mps() -> list[dict[str, Any]]:
    return [
        {
            "running": True,
            "gpu": 0,
            "pipe_directory": "/run/mps0",
            "active_thread_percentage": 50,
            "servers": [{"user": "alice", "active_thread_percentage": 25}],
        }
    ]


def _regions(sample: NodeSample) -> list[tuple[Path, Any, None]]:
    """Limiter regions as node/limiter.py reads them, one per GPU, two tenants each."""
    tenants = (
        SimpleNamespace(
            name="a",
            memory_capped=True,
            memory_limit=1 << 30,
            memory_used=1 << 20,
            compute_percent=30.0,
            policy="cap",
        ),
        SimpleNamespace(
            name="b", memory_capped=False, memory_limit=0, memory_used=0, compute_percent=0.0, policy=""
        ),
    )
    return [
        (Path(f"/regions/{g.info.uuid}"), SimpleNamespace(gpu_uuid=g.info.uuid, tenants=tenants), None)
        for g in sample.gpus
    ]


def _node_families(sample: NodeSample, monkeypatch: pytest.MonkeyPatch) -> list[Family]:
    monkeypatch.setattr(node_metrics, "read_regions", lambda _dir: _regions(sample))
    monkeypatch.setattr(node_metrics, "gpu_shares", lambda before, after: {"a": 0.25, "b": 0.5})
    collector = NodeCollector(
        lambda: Latest(sample, EPOCH, ""),
        driver_version="550.54",
        limiter_dir="/regions",
        mps=_mps,
        process_top=1000,
        dcgm_compat=True,
    )
    collector.families()  # the achieved shares are measured between two scrapes
    return collector.families()


def _mig_node(snapshot: FleetSnapshot) -> NodeView:
    """A node with MIG-enabled GPUs, processes and a whole GPU or two."""
    for view in snapshot.nodes:
        gpus = view.sample.gpus if view.sample is not None else ()
        if any(g.mig is not None and g.mig.current and g.processes for g in gpus) and any(
            g.processes for g in gpus
        ):
            return view
    raise AssertionError("the scenario has no node with busy MIG GPUs")


def test_the_node_exporter_renders_its_rows(
    fleet: tuple[FleetSnapshot, Ownership], monkeypatch: pytest.MonkeyPatch
) -> None:
    view = _mig_node(fleet[0])
    assert view.sample is not None
    families = _node_families(view.sample, monkeypatch)
    names = [f.name for f in families]
    assert sorted(names) == sorted(m.name for m in schema.SCHEMA if schema.NODE in m.exporters)
    for fam in families:
        row = schema.BY_NAME[fam.name]
        assert (fam.kind, fam.help, fam.labels) == (row.type, row.help, row.labels_for(schema.NODE))
        assert not {"team", "pool", "state", "reason"} & set(fam.labels)
        assert fam.samples or fam.name in ("gpuops_gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL"), fam.name
        for values, _ in fam.samples:
            assert len(values) == len(fam.labels), fam.name
    up = next(f for f in families if f.name == "gpuops_node_up")
    assert up.samples == [((f"host-{view.name}", f"host-{view.name}"), 1.0)]  # `node`: the host name


def _fleet_families(fleet: tuple[FleetSnapshot, Ownership]) -> list[PromFamily]:
    snapshot, ownership = fleet
    return FleetMetrics(lambda: snapshot, ownership, dcgm_compat=True).families(snapshot)


def test_the_fleet_exporter_renders_its_rows(fleet: tuple[FleetSnapshot, Ownership]) -> None:
    snapshot, _ = fleet
    families = _fleet_families(fleet)
    by_name = {(f.name + "_total" if f.type == "counter" else f.name): f for f in families}
    assert sorted(by_name) == sorted(m.name for m in schema.SCHEMA if schema.FLEET in m.exporters)
    for name, fam in by_name.items():
        row = schema.BY_NAME[name]
        assert (fam.type, fam.documentation) == (row.type, row.help), name
        assert fam.samples, name
        for s in fam.samples:
            assert s.name == name  # a counter's samples carry _total
            assert list(s.labels) == list(row.labels_for(schema.FLEET)), name
    # Values in the row's order: `node` is fleet.yaml's name, `Hostname` the node's own.
    views = {v.name: v for v in snapshot.nodes}
    for family in (
        "gpuops_node_up",
        "gpuops_gpu_info",
        "gpuops_xid_errors_total",
        "gpuops_node_sample_timestamp_seconds",
    ):
        for s in by_name[family].samples:
            view = views[s.labels["node"]]
            if view.sample is not None:
                assert s.labels["Hostname"] == f"host-{view.name}", (family, s.labels)


# ---- the readers ask for rows and read them back -----------------------------------------------


def test_the_promql_readers_ask_for_schema_rows_and_recording_rules() -> None:
    assert set(decode.NODE_METRICS) <= set(schema.BY_NAME)
    queries = [q for _, q in prometheus_history.GPU_QUERIES + prometheus_history.KEY_QUERIES]
    queries += [prometheus_history.INFO_QUERY, prometheus_history.TOTAL_QUERY]
    asked: set[str] = set()
    for q in queries:
        asked |= metric_names(q.format(S="1m", W="1h"))
    assert asked - set(schema.BY_NAME) - _recorded() == set()
    assert asked & set(schema.BY_NAME) == {
        "gpuops_gpu_info",
        "gpuops_gpu_memory_used_bytes",
        "gpuops_gpu_memory_total_bytes",
    }


def _scraped(name: str, labels: dict[str, str], value: float, instance: str) -> Series:
    """A series as Prometheus answers it: empty labels are no labels; the target's are added."""
    kept = {k: v for k, v in labels.items() if v != ""}
    return Series({"__name__": name, **kept, "instance": instance, "job": "gpuops"}, value, EPOCH)


def _number(value: object) -> float | None:
    return None if isinstance(value, NotAvailable) else float(value)  # type: ignore[arg-type]


def _same_gpus(decoded: NodeSample, sample: NodeSample, owners: dict[int, str | None] | None = None) -> None:
    """The decoded GPUs' figures are the sample's; with `owners` (the fleet exporter: no
    per-process series), their owners are those and their processes are not known."""
    assert [g.info.index for g in decoded.gpus] == [g.info.index for g in sample.gpus]
    for got, want in zip(decoded.gpus, sample.gpus, strict=True):
        where = f"GPU {want.info.index}"
        assert (got.info.uuid, got.info.name, got.info.pci_bus_id) == (
            want.info.uuid,
            want.info.name,
            want.info.pci_bus_id,
        ), where
        g, w = got.sample, want.sample
        assert g is not None and w is not None
        for field in ("utilization_gpu_percent", "memory_used_bytes", "memory_total_bytes", "power_watts"):
            assert _number(getattr(g, field)) == _number(getattr(w, field)), (where, field)
        assert _number(g.temperature_celsius) == _number(w.temperature_celsius), where
        assert (got.mig is not None and got.mig.current) == (want.mig is not None and want.mig.current), where
        mine = {m.gpu_instance_id: m for m in got.mig_samples}
        for m in want.mig_samples:
            assert _number(mine[m.gpu_instance_id].memory_used_bytes) == _number(m.memory_used_bytes), where
            util = _number(m.sm_utilization_percent)
            back = mine[m.gpu_instance_id].sm_utilization_percent
            assert (None if isinstance(back, NotAvailable) else back) == util, where
        if owners is not None:
            assert got.owner == (owners[want.info.index] or None), where
            assert (got.processes, got.processes_error) == ((), decode.NO_PROCESS_SERIES), where
            continue
        assert [(p.pid, p.used_memory_bytes, p.user, p.gpu_instance_id) for p in got.processes] == sorted(
            (p.pid, p.used_memory_bytes, p.user, p.gpu_instance_id) for p in want.processes
        ), where
        assert gpu_busy(got) == gpu_busy(want), where  # busy over Prometheus as over SSH


def test_the_decoder_reads_back_what_the_node_exporter_renders(
    fleet: tuple[FleetSnapshot, Ownership], monkeypatch: pytest.MonkeyPatch
) -> None:
    view = _mig_node(fleet[0])
    sample = view.sample
    assert sample is not None
    series = [
        _scraped(fam.name, dict(zip(fam.labels, values, strict=True)), value, "n1:9835")
        for fam in _node_families(sample, monkeypatch)
        for values, value in fam.samples
    ]
    grouped = decode.group_series(series)
    assert list(grouped) == [sample.hostname]
    decoded = decode.decode_node(grouped[sample.hostname])
    assert decoded is not None
    inventory, got = decoded
    assert got.timestamp == sample.timestamp and inventory.driver_version == "550.54"
    assert grouped[sample.hostname].up == 1.0
    _same_gpus(got, sample)


def test_the_decoder_reads_back_what_the_fleet_exporter_renders(
    fleet: tuple[FleetSnapshot, Ownership],
) -> None:
    snapshot, ownership = fleet
    series = [
        _scraped(s.name, dict(s.labels), s.value, "operator:9836")
        for fam in _fleet_families(fleet)
        for s in fam.samples
    ]
    grouped = decode.group_series(series)
    current = [v for v in snapshot.nodes if v.sample is not None and v.state in ("live", "stale")]
    assert len(current) >= 10
    for view in current:
        assert view.sample is not None
        ns = grouped[view.name]
        assert (ns.hostname, ns.state, ns.up) == (
            f"host-{view.name}",
            view.state,
            1.0 if view.state == "live" else 0.0,
        )
        decoded = decode.decode_node(ns)
        assert decoded is not None
        owners = {g.info.index: ownership.owner(view, g) for g in view.sample.gpus}
        _same_gpus(decoded[1], view.sample, owners)
