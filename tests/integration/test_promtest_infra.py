"""The Prometheus test fixture proven: a real prometheus scrapes a test's own exposition.

The exposition is written by prometheus-client (a registry with one gauge), served by a tiny HTTP
server on loopback; the query through the HTTP API returns the gauge's value, and follows it when
it changes. ``promtool check metrics`` is clean on that exposition and is not on a bad one.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from tests.promtest.exposition import ExpositionServer
from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
    PrometheusFactory,
    prometheus_factory_fixture,
    promtool_path_fixture,
)
from tests.promtest.prometheus import PrometheusError, ScrapeJob, live_servers, scalar
from tests.promtest.promtool import check_metrics


def _registry() -> tuple[CollectorRegistry, Gauge]:
    registry = CollectorRegistry()
    gauge = Gauge("gpuops_selftest_temperature_celsius", "A test gauge.", ["node", "gpu"], registry=registry)
    return registry, gauge


def test_prometheus_scrapes_a_prometheus_client_exposition(prometheus_factory: PrometheusFactory) -> None:
    registry, gauge = _registry()
    gauge.labels(node="n1", gpu="0").set(61.5)
    with ExpositionServer(lambda: generate_latest(registry)) as target:
        prom = prometheus_factory([ScrapeJob("selftest", [target.target])])
        targets = prom.wait_targets_up()
        assert [t["labels"]["job"] for t in targets] == ["selftest"]

        samples = prom.wait_for('gpuops_selftest_temperature_celsius{node="n1"}')
        assert scalar(samples) == 61.5
        labels = samples[0].labels
        assert (labels["gpu"], labels["job"], labels["instance"]) == ("0", "selftest", target.target)

        # Prometheus follows the exporter: the next scrapes see the new value.
        gauge.labels(node="n1", gpu="0").set(70.0)
        prom.wait_for(
            'gpuops_selftest_temperature_celsius{node="n1"}', until=lambda s: bool(s) and s[0].value == 70.0
        )
        assert target.scrapes >= 2
    prom.stop()
    assert not prom.running
    assert prom not in live_servers()


def test_query_errors_carry_prometheus_reason(prometheus_factory: PrometheusFactory) -> None:
    prom = prometheus_factory()
    with pytest.raises(PrometheusError, match="bad_data"):
        prom.query("sum by (")
    # A query that matches nothing is no error: empty, and wait_for gives up within its bound.
    assert prom.query("gpuops_nothing_here") == []
    with pytest.raises(PrometheusError, match=r"did not return the expected series in 0\.5s"):
        prom.wait_for("gpuops_nothing_here", timeout=0.5)


def test_a_target_that_refuses_is_reported_down(prometheus_factory: PrometheusFactory) -> None:
    with ExpositionServer(lambda: b"") as gone:
        address = gone.target
    prom = prometheus_factory([ScrapeJob("gone", [address])])
    samples = prom.wait_for(f'up{{instance="{address}"}}')
    assert scalar(samples) == 0.0
    with pytest.raises(PrometheusError, match="not all up"):
        prom.wait_targets_up(timeout=1.5)


def test_scrape_targets_must_be_on_loopback() -> None:
    with pytest.raises(PrometheusError, match="not on loopback"):
        ScrapeJob("far", ["10.0.0.1:9835"]).config()


def test_promtool_check_metrics_is_clean_on_the_exposition(promtool_path: str) -> None:
    registry, gauge = _registry()
    gauge.labels(node="n1", gpu="0").set(61.5)
    result = check_metrics(generate_latest(registry))
    assert result.returncode == 0, result.stdout + result.stderr
    # ... and it can fail: a metric without HELP and a counter without _total are lint problems.
    bad = check_metrics("# TYPE gpuops_bad counter\ngpuops_bad 1\n")
    assert bad.returncode != 0
    assert "gpuops_bad" in bad.stdout + bad.stderr
