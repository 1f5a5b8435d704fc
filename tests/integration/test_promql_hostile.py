"""A hostile Prometheus (security issue, item 6): the CLI (`discover`, `status`) pointed at an HTTP
server on 127.0.0.1 started here, which answers what a malicious or broken server could.

(a) an endless `200 OK` body must be read with a bound, not whole; (b) text in an answer (`error`,
`errorType`, a body that is not the API's) is node text: escaped, never written raw to the
terminal; (c) a URL's password is never echoed."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.agent_helpers import REPO

EXIT_PARTIAL = 3  # discover: the source (or some node) could not be read
MIB = 1 << 20
BOUND = 1 * MIB  # the bound the CLI runs with here (GPUOPS_PROMETHEUS_MAX_BYTES)
SERVED = 96 * MIB  # what the endless body serves at most: never gigabytes
CHUNK = 64 * 1024
OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = f"{OSC_TITLE}{CLEAR}bad\u202eevil"
SECRET = "s3cr3t-pa55"


class _Server:
    """A ThreadingHTTPServer whose every request is answered by `answer(handler)`."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.sent: list[int] = []  # body bytes the endless answer got out, per request
        self.authorization: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.authorization.append(self.headers.get("Authorization", ""))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                answer(self)

            do_GET = do_POST = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def _serving(answer: Callable[[_Server, BaseHTTPRequestHandler], None]) -> Iterator[_Server]:
    holder: list[_Server] = []
    server = _Server(lambda h: answer(holder[0], h))
    holder.append(server)
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        server.thread.join(timeout=10)


def _json(handler: BaseHTTPRequestHandler, status: int, body: bytes, kind: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _empty(server: _Server, handler: BaseHTTPRequestHandler) -> None:
    _json(handler, 200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')


def _endless(declared: bool) -> Callable[[_Server, BaseHTTPRequestHandler], None]:
    """`200 OK` and a JSON answer that does not end (up to SERVED bytes), sent in chunks: with
    its length declared, or chunked (the length known only by reading)."""

    def answer(server: _Server, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if declared:
            handler.send_header("Content-Length", str(SERVED))
        else:
            handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        head = b'{"status":"success","data":{"resultType":"vector","result":['
        item = b'{"metric":{"__name__":"gpuops_node_up","node":"n"},"value":[1,"1"]},'
        chunk = item * (CHUNK // len(item))
        chunk += b" " * (CHUNK - len(chunk))
        first = head + b" " * (CHUNK - len(head))
        server.sent.append(0)
        mine = len(server.sent) - 1
        try:
            for data in (first, *[chunk] * (SERVED // CHUNK - 1)):
                if declared:
                    handler.wfile.write(data)
                else:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                server.sent[mine] += len(data)
        except OSError:  # the client stopped reading: what the bound is for
            pass

    return answer


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`gpuops ARGS` as a process: (exit code, stdout, stderr)."""
    code, out, err, _ = _run(list(args), env or {})
    return code, out, err


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str, int]:
    """`gpuops ARGS` as a process, reaped with wait4: (exit code, stdout, stderr, the child's peak
    resident set in KiB). Killed after 60 s."""
    command = [sys.executable, "-m", "gpuops", *args]
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env}
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(
            command,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=full_env,
        )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for r in readers:
        r.start()
    deadline = time.monotonic() + 60
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join(timeout=10)
    return (
        proc.returncode,
        b"".join(out).decode("utf-8", "replace"),
        b"".join(err).decode("utf-8", "replace"),
        int(usage.ru_maxrss),
    )


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "MemoryError" not in err, err


def _raw_controls(text: str) -> list[str]:
    """The terminal controls written raw: ESC, BEL, C1 controls, bidi overrides."""
    return re.findall("[\x07\x1b\x9b\x9d\u202e]", text)


# ---- (a) a body without end ------------------------------------------------------------------


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_endless_answer_is_read_with_a_bound(declared: bool) -> None:
    with _serving(_empty) as server:  # the same command against a 60-byte answer
        code, out, err, baseline_kib = _run(["discover", "--prometheus", server.url], {})
    assert code == 0, (code, out, err)
    with _serving(_endless(declared)) as server:
        code, out, err, peak_kib = _run(
            ["discover", "--prometheus", server.url], {"GPUOPS_PROMETHEUS_MAX_BYTES": str(BOUND)}
        )
        sent = list(server.sent)
    print(
        f"served {[round(n / MIB, 1) for n in sent]} MiB of {SERVED / MIB:.0f} a request; the CLI's peak RSS "
        f"{peak_kib / 1024:.0f} MiB ({baseline_kib / 1024:.0f} MiB against a small answer)"
    )
    _no_traceback(err)
    assert code == EXIT_PARTIAL, (code, out, err)
    # One line says why, with the bound and how to raise it.
    assert "answer larger than 1 MiB" in out + err, out + err
    assert "GPUOPS_PROMETHEUS_MAX_BYTES" in out + err
    # The client stopped reading near the bound (what got out of the server: the bound and the
    # kernel's socket buffers, which grow to several MiB on loopback), and held no more than that.
    assert sent and max(sent) < SERVED / 3, sent
    # Its resident set grew by less than one whole answer (it was over 1 GiB for these four).
    assert (peak_kib - baseline_kib) * 1024 < 2 * SERVED / 3, (peak_kib, baseline_kib)


def test_a_bad_bound_is_one_line() -> None:
    with _serving(_empty) as server:
        code, out, err = _cli(
            "discover", "--prometheus", server.url, env={"GPUOPS_PROMETHEUS_MAX_BYTES": "lots"}
        )
    _no_traceback(err)
    assert code == EXIT_PARTIAL, (code, out, err)
    assert "GPUOPS_PROMETHEUS_MAX_BYTES='lots': not a size" in out, out


# ---- (b) escape sequences in what Prometheus says --------------------------------------------


def _refuses(server: _Server, handler: BaseHTTPRequestHandler) -> None:
    """The API's error answer, its `errorType` and `error` holding ESC, OSC and bidi text (as
    JSON escapes, the only way a JSON string holds them)."""
    _json(handler, 422, json.dumps({"status": "error", "errorType": HOSTILE, "error": HOSTILE}).encode())


def _not_the_api(server: _Server, handler: BaseHTTPRequestHandler) -> None:
    _json(handler, 502, HOSTILE.encode(), "text/html")


@pytest.mark.parametrize("answer", [_refuses, _not_the_api], ids=["error-fields", "not-the-api"])
@pytest.mark.parametrize(
    "command",
    [("discover",), ("discover", "--json"), ("status", "--count", "1")],
    ids=["discover", "discover-json", "status"],
)
def test_escape_sequences_from_prometheus_are_escaped(
    answer: Callable[[_Server, BaseHTTPRequestHandler], None], command: tuple[str, ...]
) -> None:
    with _serving(answer) as server:
        code, out, err = _cli(*command, "--prometheus", server.url)
    _no_traceback(err)
    assert code in (0, EXIT_PARTIAL), (code, out, err)
    assert _raw_controls(out + err) == [], (out + err)[:2000]
    # Escaped, not dropped: the operator sees what the server sent. (JSON doubles the backslash.)
    assert re.search(r"\\+x1b\]0;pwned\\+x07", out + err), (out + err)[:2000]


# ---- (c) a password in the URL ---------------------------------------------------------------


@pytest.mark.parametrize("answer", [_empty, _not_the_api], ids=["answers", "not-the-api"])
@pytest.mark.parametrize(
    "command",
    [("discover",), ("discover", "--json"), ("status", "--count", "1")],
    ids=["discover", "discover-json", "status"],
)
def test_the_password_in_the_url_is_never_shown(
    answer: Callable[[_Server, BaseHTTPRequestHandler], None], command: tuple[str, ...]
) -> None:
    with _serving(answer) as server:
        url = server.url.replace("http://", f"http://ops:{SECRET}@")
        code, out, err = _cli(*command, "--prometheus", url)
        sent = list(server.authorization)
    _no_traceback(err)
    assert SECRET not in out + err, out + err
    assert "ops:***@127.0.0.1" in out + err, out + err  # which URL it is, still
    # The credentials still go to the server (basic authentication).
    assert f"Basic {base64.b64encode(f'ops:{SECRET}'.encode()).decode()}" in sent, sent
    assert code in (0, EXIT_PARTIAL)


def test_the_password_of_a_bad_url_is_never_shown() -> None:
    code, out, err = _cli("discover", "--prometheus", f"http://ops:{SECRET}@127.0.0.1:99999")
    _no_traceback(err)
    assert code == 2, (code, out, err)
    assert SECRET not in out + err, err
    assert err.strip().count("\n") == 0, err
