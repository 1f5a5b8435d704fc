"""The live collector: one persistent agent session per node, and a snapshot of the fleet; the
SSH implementation of the fleet source protocol (`FleetSource`, gpuops/fleet/source.py).

Each node runs in its own task (connect, start the agent, take the inventory, then follow a
`watch` stream), so a slow, frozen or dead node never delays another. Per node the collector
keeps the last good data, its age and a state:

- `connecting`: no answer yet since the collector started; the reason says where the attempt
  is (the SSH handshake, the agent's start...), and after `discover` gives up, for how long;
- `live`: a sample arrived within the last 2 intervals;
- `stale`: connected, but the last sample is older than 2 intervals;
- `unreachable`: the connection failed or was dropped, with the reason; the last good data is
  kept and shown with its age. Retried with exponential backoff (1 s doubling to 30 s, jittered).

A node that stays silent for `silence_limit` (5 intervals, at least 10 s) is disconnected on
purpose: keepalives alone would take 45 s to notice a frozen host.

What it costs per sample is kept small: samples arrive by callback from the SSH channel (no
task wakes), one watchdog checks every node's silence once a second, and while many streams
are followed the loop's wake-ups are coalesced into short pauses when samples arrive (`_pause`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from gpuops.core.model import NodeSample
from gpuops.core.text import printable
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.session import NodeTarget, agent_connection
from gpuops.fleet.source import (
    CONNECTING,
    LIVE,
    MAX_EVENTS,
    STALE,
    UNREACHABLE,
    FleetEvent,
    FleetSnapshot,
    NodeView,
    wait_and_clear,
)
from gpuops.fleet.ssh import Progress, SshError

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
# While many streams are followed, the loop takes its sockets once per window: 1/20 of the
# interval, at most 50 ms (so a sample is at most that late, and other work waits at most 40 ms).
COALESCE_SHARE = 0.1
COALESCE_MAX = 0.1
PAUSE_SHARE = 0.8  # of each coalescing window spent letting the sockets fill
STARTING_SHARE = 8  # no coalescing while more than 1 node connects per 8 that stream


class _NodeRecord:
    """Mutable per-node state, owned by the collector's event loop."""

    def __init__(self, target: NodeTarget) -> None:
        self.target = target
        self.view = NodeView(target.name, target.ssh.address, owner=target.owner, since=time.time())
        self.attempts = 0  # connection attempts that have ended
        self.answered = False  # a sample came or an attempt ended: discovery waits no longer
        self.progress = Progress()  # where the current attempt is
        # While a stream is followed: when its agent last said anything (monotonic), and the
        # future the watchdog fails when it has been silent too long.
        self.last_message = 0.0
        self.silence: asyncio.Future[None] | None = None


class Collector:
    """fleet.yaml's nodes over SSH (a `FleetSource`); `label` names them in titles."""

    def __init__(
        self,
        targets: Sequence[NodeTarget],
        interval: float = 1.0,
        max_handshakes: int = 64,
        on_change: Callable[[], None] | None = None,
        silence_limit: float | None = None,
        backoff_max: float = BACKOFF_MAX,
        coalesce: float | None = None,
        label: str = "",
    ) -> None:
        self.interval = interval
        self._label = label or f"{len(targets)} nodes over SSH"
        # The coalescing window in seconds (see `_pause`); 0 turns coalescing off.
        self.coalesce = min(COALESCE_MAX, COALESCE_SHARE * interval) if coalesce is None else coalesce
        self.silence_limit = silence_limit if silence_limit is not None else max(5 * interval, 10.0)
        self.backoff_max = backoff_max
        self._records = {t.name: _NodeRecord(t) for t in targets}
        # Nodes discovery still waits for, counted as they answer: checking every node on every
        # change made discovery quadratic (29% of a 4000-node discovery's CPU).
        self._unanswered = len(self._records)
        self._handshakes = asyncio.Semaphore(max_handshakes)
        self._tasks: list[asyncio.Task[None]] = []
        self._following: set[_NodeRecord] = set()
        self._starting = 0  # sessions connecting, starting their agent or taking its inventory
        # Coalescing (see `_pause`): on or off (set by the watchdog), a pause already asked
        # for, and until when (loop time) the loop runs freely after the last pause.
        self._coalescing = False
        self._pause_asked = False
        self._free_until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._on_change = on_change
        self._events: deque[FleetEvent] = deque(maxlen=MAX_EVENTS)
        self.samples_received = 0  # node-samples taken in since start (for rates and benchmarks)

    # ---- FleetSource (gpuops/fleet/source.py) --------------------------------------------------

    @property
    def label(self) -> str:
        return self._label

    def start(self) -> None:
        _allow_open_files(len(self._records) * 2 + 64)
        for record in self._records.values():
            self._tasks.append(asyncio.create_task(self._run(record), name=f"node {record.target.name}"))
        self._tasks.append(asyncio.create_task(self._watchdog(), name="silence watchdog"))
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._coalescing = False
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def snapshot(self, now: float | None = None) -> FleetSnapshot:
        now = time.time() if now is None else now
        views = []
        for record in self._records.values():
            view = record.view
            age = view.age(now)
            if view.state == LIVE and age is not None and age > 2 * self.interval:
                view = replace(view, state=STALE, reason=f"no sample for {age:.0f}s")
            elif view.state == CONNECTING and not view.reason:
                view = replace(view, reason=record.progress.phase, route=record.progress.route)
            views.append(view)
        return FleetSnapshot(now, self.interval, tuple(views))

    def events(self) -> Sequence[FleetEvent]:
        return tuple(self._events)

    async def wait_changed(self, timeout: float | None = None) -> bool:
        """Wait until some node's data or state changes; False on timeout."""
        return await wait_and_clear(self._changed, timeout)

    async def discover(self, timeout: float) -> FleetSnapshot:
        """Wait until every node has answered once or failed its first attempt (or timeout)."""
        deadline = time.monotonic() + timeout
        while self._unanswered > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.wait_changed(min(remaining, 0.5))
        for record in self._records.values():
            if record.view.state == CONNECTING:  # every end state says why
                reason = f"no answer within {timeout:g}s: {record.progress.phase}"
                self._update(record, reason=reason, route=record.progress.route)
        return self.snapshot()

    # ---- per node ----------------------------------------------------------------------------

    def _sampled(self, record: _NodeRecord, sample: NodeSample) -> None:
        """A sample arrived (called straight from the channel's data_received, once per node
        per interval): the steady path, kept to a copy of the view with two fields changed."""
        record.last_message = time.monotonic()
        self.samples_received += 1
        if self._coalescing and not self._pause_asked:
            loop = self._loop
            if loop is not None and loop.time() >= self._free_until:
                self._pause_asked = True
                loop.call_soon(self._pause)
        old = record.view
        if old.state != LIVE or old.reason:
            self._answer(record)
            self._update(record, state=LIVE, reason="", sample=sample, last_seen=time.time())
            return
        # NodeView is a frozen dataclass without __post_init__: a copy of its instance dict with
        # the two fields changed is what replace() would build, without a call per field.
        new = object.__new__(NodeView)
        fields = new.__dict__
        fields.update(old.__dict__)
        fields["sample"] = sample
        fields["last_seen"] = time.time()
        record.view = new
        self._changed.set()
        if self._on_change is not None:
            self._on_change()

    def _answer(self, record: _NodeRecord) -> None:
        if not record.answered:
            record.answered = True
            self._unanswered -= 1

    def _update(self, record: _NodeRecord, **changes: object) -> None:
        old = record.view
        new = replace(old, **changes)  # type: ignore[arg-type]
        if new.state != old.state:
            new = replace(new, since=time.time())
            if new.state != CONNECTING:
                message = new.reason or new.state
                self._events.append(FleetEvent(time.time(), record.target.name, new.state, message))
        record.view = new
        self._changed.set()
        if self._on_change is not None:
            self._on_change()

    async def _run(self, record: _NodeRecord) -> None:
        backoff = BACKOFF_FIRST
        while True:
            got_data = False
            try:
                got_data = await self._session(record)
                reason = "the agent ended its session"
            except SshError as exc:
                reason = exc.message
            except AgentError as exc:
                reason = f"agent: {exc.message}"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one node's surprise must not end its collection
                reason = printable(f"{type(exc).__name__}: {exc}")
            record.attempts += 1
            self._answer(record)
            self._update(record, state=UNREACHABLE, reason=reason, route=record.progress.route)
            backoff = BACKOFF_FIRST if got_data else min(backoff * 2, self.backoff_max)
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))

    async def _session(self, record: _NodeRecord) -> bool:
        """One connection's life; returns whether any data came. Raises why it ended."""
        self._starting += 1
        starting = True
        record.progress = progress = Progress()
        try:
            async with agent_connection(record.target, self._handshakes, progress) as (conn, client):
                progress.to("the agent answered, taking its inventory")
                try:
                    inventory = await asyncio.wait_for(client.inventory(), self.silence_limit)
                except TimeoutError:
                    raise AgentError("timeout", f"no inventory within {self.silence_limit:g}s") from None
                progress.to("waiting for the first sample")
                self._update(
                    record,
                    hello=client.hello,
                    inventory=inventory,
                    route=progress.route,
                    agent=progress.agent,
                    agent_command=progress.agent_command,
                )
                self._starting -= 1
                starting = False
                # While the stream flows, the watchdog notices a silent node within
                # `silence_limit`; SSH keepalives (3 missed at 15 s) would notice later, and
                # cost a timer cancelled and started again for every packet.
                conn.set_keepalive(0)
                await self._follow(record, client)
                return True
        finally:
            if starting:
                self._starting -= 1

    async def _follow(self, record: _NodeRecord, client: AgentClient) -> None:
        """Take samples as the agent pushes them, until the stream ends or falls silent.

        Nothing here wakes per sample or per node per second: samples arrive by callback, and
        one watchdog for the whole fleet (`_watchdog`) fails `record.silence` when a node has
        been silent for `silence_limit`."""
        name = record.target.name

        def on_error(error: AgentError) -> None:
            record.last_message = time.monotonic()
            self._events.append(FleetEvent(time.time(), name, "agent-error", error.message))

        record.last_message = time.monotonic()
        record.silence = asyncio.get_running_loop().create_future()
        self._following.add(record)
        try:
            subscription = await client.subscribe(self.interval, partial(self._sampled, record), on_error)
            try:
                await asyncio.wait({subscription.ended, record.silence}, return_when=asyncio.FIRST_COMPLETED)
                if subscription.ended.done():
                    subscription.ended.result()  # re-raise why it ended
                    return
                record.silence.result()  # raises SshError("silent", ...)
            finally:
                await subscription.cancel()
        finally:
            self._following.discard(record)
            if not record.silence.done():
                record.silence.cancel()
            record.silence = None

    async def _watchdog(self) -> None:
        """Once per interval (at most a second), fail the stream of every node silent for longer
        than `silence_limit`: one wake-up for the fleet instead of one per node. Also turns
        coalescing of wake-ups on and off as the number of streams changes."""
        period = min(self.interval, 1.0)
        while True:
            await asyncio.sleep(period)
            self._coalesce_wakeups()
            now = time.monotonic()
            for record in self._following:
                silent = now - record.last_message
                if silent > self.silence_limit and record.silence is not None and not record.silence.done():
                    record.silence.set_exception(
                        SshError("silent", f"no data for {silent:.0f}s (node frozen or network cut?)")
                    )

    def _coalesce_wakeups(self) -> None:
        """Turn coalescing (see `_pause`) on or off: on while at least one sample is due per
        window, and while few nodes are still connecting compared with those streaming (in a
        discovery, or a site coming back, every round trip of a handshake would wait for a
        pause: 1000 nodes took a third longer to discover)."""
        following = len(self._following)
        self._coalescing = (
            self.coalesce > 0
            and following * self.coalesce >= self.interval
            and self._starting * STARTING_SHARE <= following
        )

    def _pause(self) -> None:
        """Let the sockets fill for most of a window, so the loop takes them in one pass.

        Left alone, the event loop wakes for every sample: at 1000 nodes a thousand times a
        second, each wake-up paying the poll, the switch back into this process and caches
        that the processes that ran meanwhile have cooled. While coalescing is on, the first
        sample to arrive after the loop has run freely for 1/5 of a window asks for this pause
        (`_sampled`): the loop thread sleeps for 4/5 of the window, then polls once and handles
        everything that arrived meanwhile in one pass (about a quarter less CPU per sample,
        docs/benchmarks.md). Other work in the loop (a screen, a handshake) waits at most one
        pause per window; a sample is at most one window late. Nothing wakes the loop when no
        samples come: agents that sample at the same instants (the `align` watch) arrive in a
        burst once per interval, taken in one or a few pauses instead of one every window.
        """
        self._pause_asked = False
        if not self._coalescing:
            return
        time.sleep(PAUSE_SHARE * self.coalesce)  # deliberately blocking: the sockets fill up meanwhile
        loop = self._loop
        if loop is not None:
            self._free_until = loop.time() + (1 - PAUSE_SHARE) * self.coalesce


def _allow_open_files(needed: int) -> None:
    """One connection per node: lift the soft open-files limit (often 1024) toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
