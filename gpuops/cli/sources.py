"""Which fleet source a live command reads: the nodes over SSH (the collector), or Prometheus
(`--prometheus URL`, else fleet.yaml's `source: {prometheus: URL}`). Both are a `FleetSource`
(gpuops/fleet/source.py) with the same snapshots, so the tables and screens built on them do not
know which one it is (docs/prometheus-source.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuops.cli.errors import fail
from gpuops.spec import Fleet, fleet_from_data
from gpuops.spec.types import parse_prometheus_url

if TYPE_CHECKING:  # the sources themselves are loaded when a command reads (not for --help)
    from gpuops.fleet.promql.source import PromSource
    from gpuops.fleet.source import FleetSource

PROMETHEUS_HELP = (
    "Read the fleet from this Prometheus (its HTTP API's base URL) instead of over SSH "
    "(default: fleet.yaml's source.prometheus, if any)."
)


def no_fleet() -> Fleet:
    """The fleet of a view without fleet.yaml (`--prometheus` alone): no nodes, teams or owners."""
    return fleet_from_data({"version": 1, "nodes": []}, "<no fleet.yaml>")


def prometheus_url(option: str | None, fleet: Fleet | None) -> str | None:
    """The Prometheus to read, or None for SSH; a bad --prometheus is one line, exit 2."""
    if option is not None:
        try:
            return parse_prometheus_url(option)
        except ValueError as exc:
            fail(f"--prometheus: {exc}", code=2)
    return fleet.live_source.prometheus if fleet is not None else None


def require_fleet_or_prometheus(fleet_file: Path | None, prometheus: str | None) -> None:
    if fleet_file is None and prometheus is None:
        fail("say which fleet: -f fleet.yaml (over SSH, or its source:) or --prometheus URL", code=2)


def prometheus_source(url: str, fleet: Fleet | None, interval: float) -> PromSource:
    """fleet.yaml's nodes (all nodes Prometheus has, without one) read from `url`."""
    from gpuops.fleet.promql.source import ExpectedNode, PromSource

    options = fleet.live_source if fleet is not None else None
    expected = (
        [ExpectedNode(n.name, n.owner) for n in fleet.nodes] if fleet is not None and fleet.nodes else None
    )
    return PromSource(
        url,
        expected,
        interval=interval,
        timeout=options.timeout if options is not None else None,
        selector=options.selector if options is not None else "",
    )


def live_fleet(fleet: Fleet, url: str | None, interval: float, has_file: bool = True) -> FleetSource:
    """The source a live command reads: Prometheus at `url`, else the fleet's nodes over SSH."""
    if url is not None:
        return prometheus_source(url, fleet if has_file else None, interval)
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.targets import node_targets

    return Collector(node_targets(fleet), interval=interval, max_handshakes=fleet.max_handshakes)
