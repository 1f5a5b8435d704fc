"""The exporter's HTTP side: GET /metrics on an asyncio server, the body rendered by
prometheus-client from a collector (node/metrics.py).

asyncio rather than prometheus-client's threaded server: the simulated fleet serves an exporter
per node from one event loop (a thousand nodes, not a thousand threads), and the agent already
runs on asyncio. The exposition format, its content negotiation and gzip are prometheus-client's
(`choose_encoder`, as its own server does); this module only carries bytes.

Every response closes its connection. Requests are bounded: a request head of at most
`MAX_HEAD` bytes read within `READ_TIMEOUT` seconds, at most `MAX_CONNECTIONS` open at once.
At the cap a new connection makes room instead of being refused: the oldest connection that has
sent nothing for `HEAD_GRACE` seconds is closed, else the oldest that has sent part of its request
head, else the oldest that has sent nothing (however young); only when every open connection is
being answered is the new one answered 503. So connections opened and left idle (a local user
hiding the node from monitoring) cannot keep a scrape out: Prometheus sends its request as soon as
it connects, and the youngest connection is the last one closed.

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
READ_TIMEOUT = 3.0  # for the request head: Prometheus sends it at once, in one segment
MAX_CONNECTIONS = 64
HEAD_GRACE = 0.5  # seconds a new connection may take to send its first byte before it is "idle"

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


class _Connection:
    """An open connection: how much of its request it has sent, whether it is being answered."""

    __slots__ = ("answering", "opened", "received", "writer")

    def __init__(self, writer: asyncio.StreamWriter, opened: float) -> None:
        self.writer = writer
        self.opened = opened
        self.received = 0
        self.answering = False


class MetricsServer:
    """Serves `render` at /metrics on (host, port) until `close()`.

    `offload(fn)`: where a render runs (a thread, when rendering may block); None: on the loop.
    `head_timeout`, `max_connections`: the bounds of the module's documentation.
    """

    def __init__(
        self,
        render: Render,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        offload: Optional[Callable[[Callable[[], Tuple[bytes, str]]], Awaitable[Tuple[bytes, str]]]] = None,
        head_timeout: float = READ_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.render = render
        self.host = host
        self.port = port
        self.offload = offload
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self._server: Optional[asyncio.AbstractServer] = None
        # Open connections, oldest first (dicts keep insertion order).
        self._open: Dict[int, _Connection] = {}
        self._next = 0
        self.scrapes = 0
        self.evicted = 0  # connections closed to make room (for tests and logs)

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
        key = self._next
        self._next += 1
        conn = _Connection(writer, asyncio.get_event_loop().time())
        try:
            if len(self._open) >= self.max_connections and not self._make_room():
                await self._reply(writer, 503, b"too many connections\n", "text/plain")
                return
            self._open[key] = conn
            try:
                head = await asyncio.wait_for(self._read_head(reader, conn), self.head_timeout)
            except asyncio.LimitOverrunError:
                await self._reply(writer, 431, b"request head too large\n", "text/plain")
                return
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                return
            conn.answering = True
            await self._answer(writer, head)
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.pop(key, None)
            writer.close()

    def _make_room(self) -> bool:
        """Close one connection not being answered (the module's documentation says which);
        False when every open one is being answered."""
        idle_since = asyncio.get_event_loop().time() - HEAD_GRACE
        tiers: Tuple[Callable[[_Connection], bool], ...] = (
            lambda c: c.received == 0 and c.opened <= idle_since,
            lambda c: c.received > 0,
            lambda c: True,
        )
        for tier in tiers:
            for key, conn in self._open.items():
                if not conn.answering and tier(conn):
                    del self._open[key]
                    self.evicted += 1
                    # abort: at once, without a FIN handshake; its handler wakes to an EOF.
                    transport = conn.writer.transport
                    if transport is not None:
                        transport.abort()
                    return True
        return False

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader, conn: _Connection) -> bytes:
        """The request head up to its blank line, counting what arrives on `conn`.
        LimitOverrunError beyond MAX_HEAD bytes; IncompleteReadError when the peer stops."""
        head = bytearray()
        while True:
            chunk = await reader.read(MAX_HEAD + 4 - len(head))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(head), None)
            conn.received += len(chunk)
            head += chunk
            # the blank line may straddle two reads: look from 3 bytes before this chunk
            end = head.find(b"\r\n\r\n", max(0, len(head) - len(chunk) - 3))
            if end >= 0:
                return bytes(head[: end + 4])
            if len(head) >= MAX_HEAD:
                raise asyncio.LimitOverrunError("request head too large", len(head))

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
