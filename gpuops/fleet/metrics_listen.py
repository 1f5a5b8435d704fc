"""The fleet exporter's HTTP listener: prometheus-client's own server (its exposition format,
content negotiation and gzip) on the address the operator names, 127.0.0.1 by default.

Here, in fleet/, because fleet/ owns every socket of the operator's side. prometheus-client's
threaded server rather than an asyncio one: a scrape renders a whole fleet (tens of milliseconds
at a thousand nodes, docs/benchmarks.md) and must not hold up the collector's event loop, which
takes every node's samples; the renders run on the server's threads and take the collector's
snapshot from the loop (exporter/service.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class MetricsListener:
    """A serving listener; `close()` stops it and frees the port."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def listen(registry: Any, host: str, port: int) -> MetricsListener:
    """Serve `registry` (a prometheus-client registry) at http://HOST:PORT/metrics; port 0 takes a
    free one. OSError when the address cannot be bound (in use, not this machine's, no rights)."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsListener(host, int(server.server_port), server, thread)
