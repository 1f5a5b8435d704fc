"""The PromQL fleet source: the fleet's live figures read from Prometheus, as `FleetSnapshot`s
with the same `NodeView`s the SSH collector gives, so that every screen and table (the view
models of gpuops/views/) works on it unchanged and does not know where its data came from.

Once per interval (rounds never overlap; a round is bounded by `timeout`) it asks a fixed
handful of instant queries, whatever the fleet's size:

1. every node's figures in one selector (`decode.live_query`);
2. `timestamp(gpuops_node_sample_timestamp_seconds)`: when each node was last scraped;
3. `last_over_time(gpuops_node_sample_timestamp_seconds[LOOKBACK])`: which target exports which
   node, also after its series went stale (a target that fails gets staleness markers at once);
4. `up` of those targets; and, only while some target is down, `/api/v1/targets` for the scrape
   error in the target's own words.

States, as the SSH source has them (docs/prometheus-source.md):

- `connecting`: before the first answer;
- `live`: scraped, the node's last sample succeeded and is recent;
- `stale`: scraped, but the node's sample was more than 2 intervals old when it was scraped (its
  agent's sampling is stuck), or its last sample failed (`gpuops_node_up` 0), or the fleet
  exporter says so;
- `unreachable`: its target is down (`up` 0: the scrape error is the reason), no longer scraped,
  never seen, or Prometheus itself does not answer ("source unreachable: ..."). The last good
  figures are kept, with their age.

Only failures of query 1 make the source unreachable; the others failing leave the figures with a
warning (a partial answer). Warnings Prometheus (or Thanos, Mimir) attaches to an answer are kept
on `SourceHealth.warnings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuops.core.metric_schema import NODE_SAMPLE_TIMESTAMP, NODE_UP
from gpuops.fleet.promql.client import Answer, PromClient, PromError, Target
from gpuops.fleet.promql.decode import NodeSeries, decode_node, group_series, live_query, node_of
from gpuops.fleet.source import (
    CONNECTING,
    LIVE,
    MAX_EVENTS,
    STALE,
    UNREACHABLE,
    FleetEvent,
    FleetSnapshot,
    NodeView,
    SourceHealth,
    wait_and_clear,
)

LOOKBACK = "10m"  # how far back a node's target is remembered after its series went stale
MIN_TIMEOUT = 0.5
SOURCE_NODE = "prometheus"  # the `node` of the source's own events


@dataclass(frozen=True)
class ExpectedNode:
    """A node the view should show (fleet.yaml's): its name and owner."""

    name: str
    owner: str | None = None


@dataclass
class _Round:
    """What one round of queries found."""

    data: dict[str, NodeSeries]
    scraped: dict[str, float]  # node -> scrape time (Prometheus' timestamp of the sample)
    seen: dict[str, tuple[str, str, float]]  # node -> (instance, job, last node sample time)
    up: dict[tuple[str, str], float]  # (instance, job) -> up
    warnings: list[str]


class PromSource:
    """Live fleet snapshots from Prometheus at `url`; a `FleetSource` for the TUI's feed, and what
    `status`/`discover --prometheus` read."""

    def __init__(
        self,
        url: str,
        expected: Sequence[ExpectedNode] | None = None,
        interval: float = 1.0,
        timeout: float | None = None,
        selector: str = "",
        client: PromClient | None = None,
    ) -> None:
        self._interval = interval
        self.timeout = max(MIN_TIMEOUT, interval if timeout is None else timeout)
        self.client = client or PromClient(url, self.timeout)
        self.url = self.client.url
        self.selector = selector
        self._expected = {n.name: n for n in expected} if expected is not None else None
        now = time.time()
        self._views: dict[str, NodeView] = {
            n.name: NodeView(
                n.name, "", owner=n.owner, since=now, reason="waiting for Prometheus' first answer"
            )
            for n in expected or ()
        }
        self.health = SourceHealth(
            "prometheus", self.url, CONNECTING, "waiting for the first answer", since=now
        )
        self._events: deque[FleetEvent] = deque(maxlen=MAX_EVENTS)
        self._changed = asyncio.Event()
        self._answered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._target_errors: dict[tuple[str, str], str] = {}
        self.rounds = 0  # rounds finished (for tests and benchmarks)
        self.series_received = 0  # series taken in since start (the size of the answers)

    # ---- FleetSource ---------------------------------------------------------------------------

    @property
    def label(self) -> str:
        text = f"Prometheus {self.url}"
        if self.health.state == UNREACHABLE:
            text += f" — source unreachable: {self.health.reason}"
        elif self.health.warnings:
            text += f" — partial: {self.health.warnings[0]}"
        return text

    @property
    def interval(self) -> float:
        return self._interval

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="prometheus source")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.client.close()

    def snapshot(self, now: float | None = None) -> FleetSnapshot:
        now = time.time() if now is None else now
        views = tuple(self._views[name] for name in sorted(self._views))
        return FleetSnapshot(now, self._interval, views, self.health)

    def events(self) -> Sequence[FleetEvent]:
        return tuple(self._events)

    async def wait_changed(self, timeout: float | None = None) -> bool:
        return await wait_and_clear(self._changed, timeout)

    async def discover(self, timeout: float) -> FleetSnapshot:
        """The snapshot after the first round has answered or failed (or after `timeout`)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), timeout)
        if self.health.state == CONNECTING:
            self._source_down(f"no answer within {timeout:g}s")
        return self.snapshot()

    # ---- rounds --------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.refresh()
            await asyncio.sleep(max(0.0, started + self._interval - loop.time()))

    async def refresh(self) -> None:
        """One round: ask, then update every node's view (or say the source is down)."""
        try:
            found = await self._ask()
        except PromError as exc:
            self._source_down(exc.message)
        else:
            self._apply(found, time.time())
        self.rounds += 1
        self._answered.set()
        self._changed.set()

    async def _ask(self) -> _Round:
        sel = self.selector
        inner = f"{{{sel}}}" if sel else ""
        t = self.timeout
        sampled, node_up = NODE_SAMPLE_TIMESTAMP.name, NODE_UP.name
        data_q = self.client.query(live_query(sel), timeout=t)
        scraped_q = self.client.query(f"timestamp({sampled}{inner})", timeout=t)
        seen_q = self.client.query(f"last_over_time({sampled}{inner}[{LOOKBACK}])", timeout=t)
        up_q = self.client.query(
            f"up and on (instance, job) last_over_time({node_up}{inner}[{LOOKBACK}])", timeout=t
        )
        answers = await asyncio.gather(data_q, scraped_q, seen_q, up_q, return_exceptions=True)
        data = answers[0]
        if isinstance(data, BaseException):
            if isinstance(data, PromError):
                raise data
            raise PromError("bad_response", f"{type(data).__name__}: {data}")
        warnings = list(data.warnings)
        side: list[Answer | None] = []
        for what, answer in zip(("scrape times", "targets seen", "up"), answers[1:], strict=True):
            if isinstance(answer, PromError):
                warnings.append(f"{what} unknown: {answer.message}")
                side.append(None)
            elif isinstance(answer, BaseException):
                warnings.append(f"{what} unknown: {type(answer).__name__}: {answer}")
                side.append(None)
            else:
                warnings.extend(answer.warnings)
                side.append(answer)
        scraped_a, seen_a, up_a = side
        self.series_received += len(data.series) + sum(len(a.series) for a in side if a is not None)
        found = _Round(
            data=group_series(data.series),
            scraped={node_of(s.labels): s.value for s in scraped_a.series} if scraped_a else {},
            seen={},
            up={},
            warnings=warnings,
        )
        for s in seen_a.series if seen_a else ():
            node = node_of(s.labels)
            old = found.seen.get(node)
            if node and (old is None or s.value > old[2]):
                found.seen[node] = (s.labels.get("instance", ""), s.labels.get("job", ""), s.value)
        for s in up_a.series if up_a else ():
            found.up[(s.labels.get("instance", ""), s.labels.get("job", ""))] = s.value
        if any(v == 0 for v in found.up.values()):
            try:
                self._target_errors = {
                    (t.labels.get("instance", ""), t.labels.get("job", "")): _scrape_error(t)
                    for t in await self.client.targets(timeout=t)
                }
            except PromError as exc:  # Thanos, Mimir: no targets API; `up` alone then
                self._target_errors = {}
                found.warnings.append(f"scrape errors unknown: {exc.message}")
        return found

    # ---- state ---------------------------------------------------------------------------------

    def _set_health(self, state: str, reason: str = "", warnings: Sequence[str] = ()) -> None:
        old = self.health
        since = old.since if old.state == state else time.time()
        self.health = SourceHealth(old.kind, old.where, state, reason, tuple(warnings), since)
        if old.state != state and state != CONNECTING:
            message = f"source {'live' if state == LIVE else 'unreachable: ' + reason}"
            self._events.append(FleetEvent(time.time(), SOURCE_NODE, state, message))

    def _source_down(self, reason: str) -> None:
        self._set_health(UNREACHABLE, reason)
        for name, view in list(self._views.items()):
            self._update(name, view, state=UNREACHABLE, reason=f"source unreachable: {reason}")

    def _update(self, name: str, old: NodeView, **changes: object) -> None:
        new = replace(old, **changes)  # type: ignore[arg-type]
        if new.state != old.state:
            new = replace(new, since=time.time())
            if new.state != CONNECTING:
                self._events.append(FleetEvent(time.time(), name, new.state, new.reason or new.state))
        self._views[name] = new

    def _apply(self, found: _Round, now: float) -> None:
        self._set_health(LIVE, "", found.warnings)
        if self._expected is not None:
            names = list(self._expected)
        else:
            names = sorted(set(found.data) | set(found.seen) | set(self._views))
        for name in names:
            old = self._views.get(name)
            if old is None:
                old = NodeView(name, "", since=now)
                self._views[name] = old
            self._update(name, old, **self._node_changes(name, found, now))

    def _node_changes(self, name: str, found: _Round, now: float) -> dict[str, object]:
        ns = found.data.get(name)
        seen = found.seen.get(name)
        instance, job = (ns.instance, ns.job) if ns is not None else (seen[0], seen[1]) if seen else ("", "")
        changes: dict[str, object] = {"address": instance or "-"}
        up = found.up.get((instance, job)) if instance else None
        if up == 0:
            why = self._target_errors.get((instance, job)) or "the scrape failed (up is 0)"
            return {**changes, "state": UNREACHABLE, "reason": f"scrape of {instance} failed: {why}"}
        decoded = decode_node(ns) if ns is not None else None
        if decoded is None:
            if seen is not None:
                age = max(0.0, now - seen[2])
                why = f"no current series in Prometheus (last sample {age:.0f}s ago; no longer scraped?)"
            else:
                why = "Prometheus has no series of this node (is its exporter scraped?)"
            if ns is not None and ns.state and ns.state != LIVE:  # the fleet exporter says why
                why = ns.reason or ns.state
            return {**changes, "state": UNREACHABLE, "reason": why}
        assert ns is not None and ns.sampled is not None
        inventory, sample = decoded
        changes.update(inventory=inventory, sample=sample, last_seen=ns.sampled)
        if ns.up == 0:
            state = ns.state if ns.state in (STALE, UNREACHABLE, CONNECTING) else STALE
            return {**changes, "state": state, "reason": ns.reason or "the node's last sample failed"}
        scraped = found.scraped.get(name)
        lag = (scraped - ns.sampled) if scraped is not None else 0.0
        if lag > 2 * self._interval:
            return {**changes, "state": STALE, "reason": f"its sample was {lag:.0f}s old when scraped"}
        return {**changes, "state": LIVE, "reason": ""}


def _scrape_error(target: Target) -> str:
    return target.last_error or f"target {target.health}"
