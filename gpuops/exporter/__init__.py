"""The fleet exporter (`gpuops exporter -f fleet.yaml`): one Prometheus scrape target for an
agentless fleet, rendered from the same view models the TUI and the CLI tables show
(docs/metrics.md).

- `fleet_metrics.py`: the metric families of one fleet snapshot (a prometheus-client collector);
- `service.py`: the running exporter: the SSH collector, the HTTP listener (fleet/), signals.

A presentation layer, beside tui/: it takes view models and renders them, as a screen does.
"""
