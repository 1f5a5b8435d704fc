"""The running fleet exporter: the SSH collector on this thread's event loop, the HTTP listener
on its own threads, until SIGTERM or SIGINT.

A scrape (on a listener thread) takes the collector's snapshot itself and renders it there, so
the loop keeps taking samples while a large fleet is rendered. That read needs no hop onto the
loop: the collector's node records are fixed when it is built, and each record's view is an
immutable object the loop replaces by one reference store, so the scrape sees every node's view
whole, as it was at one moment or the next. A hop would wait for the loop, which sleeps up to
80 ms at a time while it coalesces a large fleet's samples (fleet/collector.py, `_pause`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gpuops.core.listen import bind_error
from gpuops.exporter.fleet_metrics import FleetMetrics
from gpuops.fleet.collector import Collector
from gpuops.fleet.metrics_listen import listen
from gpuops.fleet.targets import node_targets
from gpuops.spec import Fleet
from gpuops.tenancy.ownership import Ownership


class ListenFailed(Exception):
    """The address could not be bound; the message is one line for a person."""


async def serve(
    fleet: Fleet,
    host: str,
    port: int,
    interval: float,
    ready: Callable[[str], None],
    dcgm_compat: bool = False,
) -> None:
    """Collect the fleet and serve its metrics until SIGTERM or SIGINT. `ready(url)` is called once
    the listener is bound. ListenFailed before any node is contacted when the address cannot be
    bound. `dcgm_compat`: dcgm-exporter's names and units as well."""
    loop = asyncio.get_running_loop()
    collector = Collector(node_targets(fleet), interval=interval, max_handshakes=fleet.max_handshakes)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetMetrics(collector.snapshot, Ownership.from_fleet(fleet), dcgm_compat))
    try:
        listener = listen(registry, host, port)
    except OSError as exc:
        raise ListenFailed(bind_error(host, port, exc, "--listen")) from None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        collector.start()
        ready(listener.url)
        await stop.wait()
    finally:
        await asyncio.to_thread(listener.close)
        await collector.stop()
