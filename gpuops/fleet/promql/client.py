"""Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`, `/api/v1/targets`) over httpx.

Why httpx and not prometheus-api-client (docs/prometheus-source.md): the live view runs on one
asyncio loop with the screens, and prometheus-api-client is synchronous (requests) and brings
pandas, numpy and matplotlib along; httpx is asynchronous, keeps connections alive, and has a
timeout per phase (connect, read, write, pool), so a Prometheus that hangs costs the view a
bounded wait, never a frozen screen.

Every failure is one `PromError` whose `kind` says what to do about it: `unreachable` (refused,
reset, DNS: nothing answered), `timeout` (connected, no answer in time), `http` (an answer that is
not the API's: a proxy's 502, a wrong path), `query` (the API refused the query: `bad_data`,
`execution`, a timeout inside Prometheus) and `bad_response` (JSON that is not what the API
documents). Warnings in an answer (Thanos' and Mimir's partial responses, a query that hit a
limit) are kept on the answer, not dropped: the view shows them.

What a Prometheus sends is not trusted more than what a node sends (a hostile or broken server,
or anything that answers at its address):

- an answer is read with a bound, `max_body_bytes()` (256 MiB unless
  `GPUOPS_PROMETHEUS_MAX_BYTES` says otherwise), streamed and dropped as soon as it grows past it:
  one `PromError` line, never the whole body in memory; a whole request (connect, send, every
  byte of the answer) is bounded by its timeout, so a server that trickles cannot hold a round;
- every string of an answer (label values, `error`, `errorType`, warnings, scrape errors) and of
  a body that is not the API's is escaped as node text is (`core/text.py`'s `printable`) before
  anything reads it, so no table, line or title writes an ESC, OSC or bidi control raw;
- the URL's password is shown as `***` (`url` is the shown form; the real one only connects).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from gpuops.core.text import may_need_escaping, printable, printable_data
from gpuops.spec.types import parse_prometheus_url, redact_url

try:
    import orjson

    def _loads(raw: bytes) -> Any:
        return orjson.loads(raw)

except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json

    def _loads(raw: bytes) -> Any:
        return json.loads(raw)


DEFAULT_TIMEOUT = 5.0  # seconds per request; a live view asks for less (its interval)
MAX_ERROR_TEXT = 300
# The largest answer read. A live round's answer is about 300 bytes a series and 6-9 series a GPU
# (docs/benchmarks.md): some 30 MB at 10k GPUs; a history query_range at most 11,000 points a
# series. 256 MiB leaves room for a site's Prometheus many times that, and bounds what a server
# can make the operator's process hold (the parsed answer takes a few times the body).
DEFAULT_MAX_BODY = 256 << 20
MAX_BODY_ENV = "GPUOPS_PROMETHEUS_MAX_BYTES"
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class PromError(Exception):
    """A request to Prometheus failed; `kind` is one of the module documentation's."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Series:
    """One series of an instant vector."""

    labels: Mapping[str, str]
    value: float
    timestamp: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: (time, value) points, oldest first."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Answer:
    series: tuple[Series, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RangeAnswer:
    series: tuple[RangeSeries, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """An active scrape target as `/api/v1/targets` lists it."""

    labels: Mapping[str, str]  # its labels after relabelling: instance, job, and any the config adds
    health: str  # "up", "down", "unknown"
    last_error: str
    scrape_url: str
    last_scrape: str


def max_body_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The bound on an answer's size: `GPUOPS_PROMETHEUS_MAX_BYTES` (bytes, or with a unit: 512MiB,
    1G; K, M and G are powers of 1024), else 256 MiB. ValueError, one line, for a bad value."""
    text = (os.environ if environ is None else environ).get(MAX_BODY_ENV)
    if text is None or not text.strip():
        return DEFAULT_MAX_BODY
    match = _SIZE_RE.match(text)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"{MAX_BODY_ENV}={printable(text[:40])!r}: not a size (give bytes, e.g. 268435456 or 256MiB)"
        )
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)[:1].lower()]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _duration(seconds: float) -> str:
    """A duration as Prometheus' parameters take it (whole milliseconds: `1.5s` is refused)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _number(text: object) -> float:
    # The API writes values as strings: "1.5", "NaN", "+Inf"; float() reads all of them.
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PromError("bad_response", f"a sample value that is not a number: {str(text)[:40]!r}") from None


def _labels(item: Mapping[str, Any]) -> dict[str, str]:
    metric = item.get("metric")
    if not isinstance(metric, dict):
        raise PromError("bad_response", "a series without its labels")
    return {str(k): str(v) for k, v in metric.items()}


class PromClient:
    """One Prometheus (or a compatible API: Thanos Query, Mimir, VictoriaMetrics) at `url`."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, max_body: int | None = None) -> None:
        self._base = parse_prometheus_url(url)  # with its credentials: only to connect
        self.url = redact_url(self._base)  # what messages, titles and documents show
        self.timeout = timeout
        self._max_body = max_body
        self._http: httpx.AsyncClient | None = None

    @property
    def max_body(self) -> int:
        """The bound on an answer (PromError `bad_response` when the environment's is bad)."""
        if self._max_body is None:
            try:
                self._max_body = max_body_bytes()
            except ValueError as exc:
                raise PromError("bad_response", str(exc)) from None
        return self._max_body

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self._base,
                timeout=httpx.Timeout(self.timeout),
                # No proxy from the environment: an operator's http_proxy must not reroute the
                # fleet's monitoring (and loopback through a proxy fails in confusing ways).
                trust_env=False,
                limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
                headers={"Accept": "application/json"},
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _call(self, path: str, form: Mapping[str, str] | None, timeout: float | None) -> Any:
        """POST (or GET without a form) `path`; the answer's `data` and `warnings`, every string
        in them escaped (`printable`)."""
        bound = self.max_body
        http = self._client()
        seconds = timeout if timeout is not None else self.timeout
        limit = httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT
        request = (
            http.build_request("GET", path, timeout=limit)
            if form is None
            else http.build_request("POST", path, data=dict(form), timeout=limit)
        )
        try:
            # The whole request, not only each phase: a server sending a byte at a time would
            # pass every read's timeout.
            async with asyncio.timeout(seconds):
                response = await http.send(request, stream=True)
                try:
                    raw = await self._read(response, bound)
                finally:
                    await response.aclose()
        except (httpx.TimeoutException, TimeoutError):
            # "timeout" first, as "connection refused" is for a server that is not there: the
            # view's "source unreachable: ..." then says which of the two it is.
            raise PromError(
                "timeout", f"Prometheus at {self.url}: timeout (no answer within {seconds:g}s)"
            ) from None
        except httpx.TransportError as exc:
            raise PromError("unreachable", f"Prometheus at {self.url}: {_reason(exc)}") from None
        try:
            doc = _loads(raw) if raw else None
        except (ValueError, RecursionError):
            doc = None
        except MemoryError:  # within the bound, but nested to take more than this machine has
            raise PromError("bad_response", f"Prometheus at {self.url}: answer too large to read") from None
        if not isinstance(doc, dict) or "status" not in doc:
            text = printable(raw[:MAX_ERROR_TEXT].decode("utf-8", "replace").strip())
            raise PromError(
                "http",
                f"{self.url}{path}: HTTP {response.status_code}, not Prometheus' API"
                + (f": {text}" if text else ""),
            )
        if may_need_escaping(raw):  # text from Prometheus is node text
            doc = printable_data(doc)
        if doc.get("status") != "success":
            what = str(doc.get("errorType") or "error")[:MAX_ERROR_TEXT]
            why = str(doc.get("error") or "no reason given")[:MAX_ERROR_TEXT]
            raise PromError("query", f"Prometheus refused the query ({what}): {why}")
        warnings = doc.get("warnings") or ()
        return doc.get("data"), tuple(str(w) for w in warnings if w)

    async def _read(self, response: httpx.Response, bound: int) -> bytes:
        """The answer's body (decoded from gzip) of at most `bound` bytes; PromError beyond."""
        too_big = PromError(
            "bad_response",
            f"Prometheus at {self.url}: answer larger than {_size(bound)}, not read "
            f"(set {MAX_BODY_ENV} to allow more)",
        )
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > bound and "Content-Encoding" not in response.headers:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > bound:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def query(self, expr: str, at: float | None = None, timeout: float | None = None) -> Answer:
        """An instant query (now, or at the Unix time `at`): an instant vector or a scalar."""
        form = {"query": expr}
        if at is not None:
            form["time"] = repr(at)
        if timeout is not None:
            form["timeout"] = _duration(timeout)  # Prometheus gives up too, not only us
        data, warnings = await self._call("/api/v1/query", form, timeout)
        if not isinstance(data, dict):
            raise PromError("bad_response", f"query {expr[:80]!r}: the answer has no data")
        kind, result = data.get("resultType"), data.get("result")
        if kind == "vector" and isinstance(result, list):
            out = []
            for item in result:
                value = item.get("value") if isinstance(item, dict) else None
                if not isinstance(value, list) or len(value) != 2:
                    raise PromError("bad_response", f"query {expr[:80]!r}: a sample without [time, value]")
                out.append(Series(_labels(item), _number(value[1]), _number(value[0])))
            return Answer(tuple(out), warnings)
        if kind == "scalar" and isinstance(result, list) and len(result) == 2:
            return Answer((Series({}, _number(result[1]), _number(result[0])),), warnings)
        raise PromError("bad_response", f"query {expr[:80]!r}: expected an instant vector, got {kind!r}")

    async def query_range(
        self, expr: str, start: float, end: float, step: float, timeout: float | None = None
    ) -> RangeAnswer:
        """A range query from `start` to `end` every `step` seconds."""
        if not (math.isfinite(step) and step > 0):
            raise PromError("query", f"query_range step {step!r}: must be a positive number of seconds")
        form = {"query": expr, "start": repr(start), "end": repr(end), "step": f"{step:g}"}
        if timeout is not None:
            form["timeout"] = _duration(timeout)
        data, warnings = await self._call("/api/v1/query_range", form, timeout)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PromError("bad_response", f"query_range {expr[:80]!r}: expected a matrix")
        out = []
        for item in data.get("result") or ():
            values = item.get("values") if isinstance(item, dict) else None
            if not isinstance(values, list):
                raise PromError("bad_response", f"query_range {expr[:80]!r}: a series without values")
            points = tuple((_number(t), _number(v)) for t, v in values)
            out.append(RangeSeries(_labels(item), points))
        return RangeAnswer(tuple(out), warnings)

    async def targets(self, timeout: float | None = None) -> list[Target]:
        """The active scrape targets with their health and last scrape error. Thanos, Mimir and
        others may not serve this endpoint: a `PromError` then, and the caller does without."""
        data, _ = await self._call("/api/v1/targets?state=active", None, timeout)
        if not isinstance(data, dict):
            raise PromError("bad_response", "/api/v1/targets: no data")
        found = []
        for item in data.get("activeTargets") or ():
            if not isinstance(item, dict):
                continue
            labels = item.get("labels")
            if not isinstance(labels, dict):
                labels = {}
            found.append(
                Target(
                    {str(k): str(v) for k, v in labels.items()},
                    str(item.get("health") or "unknown"),
                    str(item.get("lastError") or ""),
                    str(item.get("scrapeUrl") or ""),
                    str(item.get("lastScrape") or ""),
                )
            )
        return found

    async def rule_groups(self, timeout: float | None = None) -> dict[str, float]:
        """Each loaded recording-rule group's evaluation interval in seconds, by group name."""
        data, _ = await self._call("/api/v1/rules?type=record", None, timeout)
        if not isinstance(data, dict):
            raise PromError("bad_response", "/api/v1/rules: no data")
        found: dict[str, float] = {}
        for group in data.get("groups") or ():
            if isinstance(group, dict) and isinstance(group.get("name"), str):
                try:
                    found[group["name"]] = float(group.get("interval") or 0)
                except (TypeError, ValueError):
                    continue
        return found


def _reason(exc: httpx.TransportError) -> str:
    """The system's words for a failed connection ("connection refused"), without httpx's
    exception chain."""
    cause: BaseException | None = exc
    while cause is not None:
        # The errno's own words: asyncio's loop puts "Connect call failed (addr)" in strerror
        # where uvloop puts "Connection refused".
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno).lower()
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip()
    if "Connection refused" in text or "connection refused" in text:
        return "connection refused"
    return printable(text[:MAX_ERROR_TEXT]) or type(exc).__name__


def quote_label(value: str) -> str:
    """A PromQL string literal for a label matcher."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
