"""Each simulated node's Prometheus exporter, as `gpuops agent --metrics` serves it on a real
node: the same collector (node/metrics.py) and HTTP side (node/metrics_http.py), one listener per
node on 127.0.0.1, all on the fleet's event loop.

A simulated backend never blocks and costs a few hundred microseconds a sample, so a node is
sampled when it is scraped and its latest sample is older than the interval (`Sampler.fresh`),
not on a timer: a thousand nodes nobody scrapes cost nothing, and two scrapes within one interval
(two Prometheus servers) share one sample, as they share the agent's loop on a real node.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.health import HealthMonitor
from gpuops.node.limiter_tags import LimiterTagger
from gpuops.node.metrics import NodeCollector
from gpuops.node.metrics_http import MetricsServer, prometheus_render
from gpuops.node.mps_apply import MpsRecord, live_config
from gpuops.node.sampler import Latest, Sampler

log = logging.getLogger("gpuops.simfleet")

INTERVAL = 1.0  # the sim fleet's fleet.yaml samples every second
# Per-process series on, as a site that reads tenants from Prometheus turns them on
# (`--process-metrics top:N`): the PromQL fleet source attributes processes from them. A
# simulated node runs a few dozen processes at most, so the bound never cuts.
PROCESS_TOP = 1000


class SimExporters:
    """One exporter per simulated node; `start()` binds them all, `close()` stops them."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, Backend]],
        state_dir: Path,
        host: str = "127.0.0.1",
        interval: float = INTERVAL,
        process_top: int = PROCESS_TOP,
        health: Mapping[str, HealthMonitor] | None = None,
    ) -> None:
        self.host = host
        self.interval = interval
        self.process_top = process_top
        self.servers: dict[str, MetricsServer] = {}
        self.samplers: dict[str, Sampler] = {}
        self._nodes = list(nodes)
        self._state_dir = state_dir
        self._health = dict(health or {})  # each node's events, shared with its SSH agents

    def _render(self, name: str, backend: Backend) -> Any:
        node_state = self._state_dir / name
        tagger = LimiterTagger(str(node_state / "limiter"))  # where the node's agent keeps it
        health = self._health.get(name)
        if health is None:
            sampler = Sampler(lambda: tagger.tag(backend.sample()), self.interval)
        else:
            sampler = Sampler(lambda: health.attach(tagger.tag(backend.sample())), self.interval)
        self.samplers[name] = sampler
        try:
            driver = backend.inventory().driver_version
        except BackendError:
            driver = ""
        try:
            control: Any = backend.mps_control()
            why = ""
        except BackendError as exc:
            control, why = None, str(exc)
        record = MpsRecord(str(node_state))

        def latest() -> Latest:
            return sampler.fresh()

        collector = NodeCollector(
            latest,
            node=name,
            driver_version=driver,
            limiter_dir=str(node_state / "limiter"),
            mps=lambda: live_config(backend.user_name, control, record, why),
            process_top=self.process_top,
        )
        return prometheus_render(collector)

    async def start(self) -> dict[str, int]:
        """Listen for every node on a free port; returns node -> port. On failure nothing stays
        bound."""
        try:
            for name, backend in self._nodes:
                server = MetricsServer(self._render(name, backend), self.host, 0)
                await server.start()
                self.servers[name] = server
        except BaseException:
            await self.close()
            raise
        return {name: server.port for name, server in self.servers.items()}

    async def close(self) -> None:
        for server in self.servers.values():
            with contextlib.suppress(Exception):
                await server.close()
        self.servers.clear()
