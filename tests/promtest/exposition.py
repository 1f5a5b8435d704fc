"""A scrape target of the test's own: an HTTP server on 127.0.0.1 that serves an exposition.

``render`` is called on every scrape, so a test can change what the next scrape sees. The server
runs on a daemon thread; :meth:`ExpositionServer.stop` shuts it down (bounded by the socket's
timeout). Used to prove the Prometheus fixture, and by rule and dashboard tests that need series
before the real exporters exist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST


class ExpositionServer:
    def __init__(self, render: Callable[[], bytes], path: str = "/metrics") -> None:
        self.render = render
        self.path = path
        self.scrapes = 0
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != server_self.path:
                    self.send_error(404)
                    return
                body = server_self.render()
                server_self.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                # Prometheus scrapes every second; the test's output is no place for that.
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1})
        self._thread.daemon = True

    @property
    def target(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> ExpositionServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> ExpositionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
