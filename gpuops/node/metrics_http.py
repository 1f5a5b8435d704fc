"""The exporter's HTTP side: GET /metrics on an asyncio server, the body rendered by
prometheus-client from a collector (node/metrics.py).

asyncio rather than prometheus-client's threaded server: the simulated fleet serves an exporter
per node from one event loop (a thousand nodes, not a thousand threads), and the agent already
runs on asyncio. The exposition format, its content negotiation and gzip are prometheus-client's
(`choose_encoder`, as its own server does); this module only carries bytes.

Every response closes its connection. Requests are bounded: a request head of at most
`MAX_HEAD` bytes read within `READ_TIMEOUT` seconds, at most `MAX_CONNECTIONS` open at once.

The address is read by `core/listen.py` (`parse_listen`, shared with the fleet exporter).

Standard library only at module level; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from gpuops.core.listen import DEFAULT_HOST

log = logging.getLogger("gpuops.agent")

DEFAULT_PORT = 9835  # 9400 is dcgm-exporter's: a node may run both
MAX_HEAD = 8192
READ_TIMEOUT = 10.0
MAX_CONNECTIONS = 64

Render = Callable[[str], Tuple[bytes, str]]  # Accept header -> (body, content type)


def prometheus_render(collector: Any) -> Render:
    """A Render for one collector, through prometheus-client (imported here, not before)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def render(accept: str) -> Tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    return render


class MetricsServer:
    """Serves `render` at /metrics on (host, port) until `close()`.

    `offload(fn)`: where a render runs (a thread, when rendering may block); None: on the loop.
    """

    def __init__(
        self,
        render: Render,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        offload: Optional[Callable[[Callable[[], Tuple[bytes, str]]], Awaitable[Tuple[bytes, str]]]] = None,
    ) -> None:
        self.render = render
        self.host = host
        self.port = port
        self.offload = offload
        self._server: Optional[asyncio.AbstractServer] = None
        self._open = 0
        self.scrapes = 0

    async def start(self) -> int:
        """Bind and listen; returns the port (the one chosen when asked for port 0). OSError when
        the address cannot be bound."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True, limit=MAX_HEAD
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "http://%s:%d/metrics" % (host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS:
                await self._reply(writer, 503, b"too many connections\n", "text/plain")
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            except asyncio.LimitOverrunError:
                await self._reply(writer, 431, b"request head too large\n", "text/plain")
                return
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                return
            await self._answer(writer, head)
        except (ConnectionError, OSError):
            pass
        finally:
            self._open -= 1
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await self._reply(writer, 400, b"bad request\n", "text/plain")
            return
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})
            return
        if path == "/":
            body = b"gpuops node exporter: see /metrics\n"
            await self._reply(writer, 200, body, "text/plain", head_only=method == "HEAD")
            return
        if path != "/metrics":
            await self._reply(writer, 404, b"not found: try /metrics\n", "text/plain")
            return
        accept = headers.get("accept", "")
        try:
            if self.offload is not None:
                body, content_type = await self.offload(lambda: self.render(accept))
            else:
                body, content_type = self.render(accept)
        except Exception as exc:  # a scrape fails; the exporter keeps serving
            log.exception("rendering /metrics failed")
            await self._reply(writer, 500, ("%s: %s\n" % (type(exc).__name__, exc)).encode(), "text/plain")
            return
        self.scrapes += 1
        extra: Dict[str, str] = {}
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=5)
            extra["Content-Encoding"] = "gzip"
        await self._reply(writer, 200, body, content_type, extra, head_only=method == "HEAD")

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str,
        extra: Optional[Dict[str, str]] = None,
        head_only: bool = False,
    ) -> None:
        reasons = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }
        fields = [
            "HTTP/1.1 %d %s" % (status, reasons[status]),
            "Content-Type: %s" % content_type,
            "Content-Length: %d" % len(body),
            "Connection: close",
        ]
        fields += ["%s: %s" % kv for kv in (extra or {}).items()]
        writer.write(("\r\n".join(fields) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        await writer.drain()
