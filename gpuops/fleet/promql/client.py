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
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from gpuops.spec.types import parse_prometheus_url

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

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = parse_prometheus_url(url)
        self.timeout = timeout
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self.url,
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
        """POST (or GET without a form) `path`; the answer's `data` and `warnings`."""
        http = self._client()
        limit = httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT
        try:
            if form is None:
                response = await http.get(path, timeout=limit)
            else:
                response = await http.post(path, data=dict(form), timeout=limit)
        except httpx.TimeoutException:
            seconds = timeout if timeout is not None else self.timeout
            # "timeout" first, as "connection refused" is for a server that is not there: the
            # view's "source unreachable: ..." then says which of the two it is.
            raise PromError(
                "timeout", f"Prometheus at {self.url}: timeout (no answer within {seconds:g}s)"
            ) from None
        except httpx.TransportError as exc:
            raise PromError("unreachable", f"Prometheus at {self.url}: {_reason(exc)}") from None
        raw = response.content
        try:
            doc = _loads(raw) if raw else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or "status" not in doc:
            text = raw[:MAX_ERROR_TEXT].decode("utf-8", "replace").strip()
            raise PromError(
                "http",
                f"{self.url}{path}: HTTP {response.status_code}, not Prometheus' API"
                + (f": {text}" if text else ""),
            )
        if doc.get("status") != "success":
            what = str(doc.get("errorType") or "error")
            why = str(doc.get("error") or "no reason given")[:MAX_ERROR_TEXT]
            raise PromError("query", f"Prometheus refused the query ({what}): {why}")
        warnings = doc.get("warnings") or ()
        return doc.get("data"), tuple(str(w) for w in warnings if w)

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
    return text[:MAX_ERROR_TEXT] or type(exc).__name__


def quote_label(value: str) -> str:
    """A PromQL string literal for a label matcher."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
