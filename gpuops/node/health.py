"""The agent's health thread: waits on the backend's event source (NVML's event set: XID
critical errors, single/double-bit ECC errors, clock changes) and keeps what it saw for the
samples to carry (core/model.py NodeHealth).

It runs on a thread of its own, not the backend worker thread that takes samples: a wait blocks
in NVML for up to WAIT_SECONDS, and NVML allows calls on an event set while other calls run on
device handles. Stopping is bounded: the thread checks its flag between waits, so `stop` returns
within one wait (and leaves a thread stuck in the driver behind, a daemon, rather than hang the
agent's exit).

A source that never blocks (the simulator's, simfleet/faults.py) is taken with `poll` instead of
`start`: no thread, each `attach` drains it, so a thousand simulated nodes cost no thread each and
an injected event travels the path an NVML event does (record, count, carry in the sample).

Standard library and gpuops.core only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Callable, Deque, Dict, Optional, Tuple

from gpuops.core.model import MAX_HEALTH_EVENTS, HealthEvent, NodeHealth, NodeSample, XidCount
from gpuops.node.backends.base import Backend, BackendError, EventSource, RawEvent

log = logging.getLogger("gpuops.agent")

WAIT_SECONDS = 0.5  # one wait in NVML: how long a stop may take
MAX_FAILURES = 10  # waits failing in a row before the thread gives up (a broken event set)
MAX_DRAINED = 1024  # events one `attach` takes from a polled source: a sample must not wait long


class HealthMonitor:
    """Numbers events from 1, keeps the latest MAX_HEALTH_EVENTS and the XID counts per GPU."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._events: Deque[HealthEvent] = collections.deque(maxlen=MAX_HEALTH_EVENTS)
        self._xids: Dict[Tuple[int, int], XidCount] = {}
        self._seq = 0
        self._since = clock()
        self._error = ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._snapshot: Optional[NodeHealth] = None
        self._polled: Optional[EventSource] = None
        self._drain_lock = threading.Lock()

    # ---- the thread ------------------------------------------------------------------------

    def start(self, backend: Backend) -> None:
        """Ask the backend for its event source (call this where backend calls belong) and
        listen on a thread of its own; a backend without events is recorded as the reason."""
        try:
            source = backend.event_source()
        except BackendError as exc:
            self._set_error(exc.code)
            log.info("no health events: %s", exc)
            return
        self._since = self._clock()
        thread = threading.Thread(target=self._run, args=(source,), name="gpuops-health", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self, source: EventSource) -> None:
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    raw = source.wait(WAIT_SECONDS)
                except BackendError as exc:
                    failures += 1
                    if failures >= MAX_FAILURES:
                        log.warning("health events stopped: %s", exc)
                        self._set_error(exc.code)
                        return
                    self._stop.wait(WAIT_SECONDS)  # a GPU lost now and then must not spin
                    continue
                failures = 0
                if raw is not None:
                    self.record(raw)
        finally:
            try:
                source.close()
            except BackendError as exc:
                log.warning("closing the event source: %s", exc)

    def poll(self, backend: Backend) -> None:
        """Take the backend's event source without a thread: each `attach` drains it. Only for
        sources whose `wait(0)` returns at once (the simulator's)."""
        try:
            source = backend.event_source()
        except BackendError as exc:
            self._set_error(exc.code)
            return
        self.poll_source(source)

    def poll_source(self, source: EventSource) -> None:
        """`poll` with the source in hand (an in-process simulation's)."""
        self._since = self._clock()
        self._polled = source

    def drain(self) -> None:
        """Record what a polled source holds now (at most MAX_DRAINED events)."""
        with self._drain_lock:
            source = self._polled
            if source is None:
                return
            for _ in range(MAX_DRAINED):
                try:
                    raw = source.wait(0)
                except BackendError as exc:
                    log.warning("health events stopped: %s", exc)
                    self._set_error(exc.code)
                    self._polled = None
                    return
                if raw is None:
                    return
                self.record(raw)

    def stop(self, timeout: float = 2 * WAIT_SECONDS) -> bool:
        """Stop listening; True when the thread ended within `timeout` seconds."""
        self._stop.set()
        with self._drain_lock:
            polled, self._polled = self._polled, None
        if polled is not None:
            try:
                polled.close()
            except BackendError as exc:
                log.warning("closing the event source: %s", exc)
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    # ---- what it keeps ---------------------------------------------------------------------

    def _set_error(self, code: str) -> None:
        with self._lock:
            self._error = code or "UNKNOWN"
            self._snapshot = None

    def record(self, raw: RawEvent) -> HealthEvent:
        """Keep one event (from the thread, or `drain`)."""
        now = self._clock()
        with self._lock:
            self._seq += 1
            event = HealthEvent(
                seq=self._seq,
                timestamp=now,
                gpu=raw.gpu,
                kind=raw.kind,
                xid=raw.xid,
                gpu_instance_id=raw.gpu_instance_id,
                compute_instance_id=raw.compute_instance_id,
                uuid=raw.uuid,
            )
            self._events.append(event)
            if raw.kind == "xid" and raw.xid is not None:
                key = (raw.gpu, raw.xid)
                old = self._xids.get(key)
                self._xids[key] = XidCount(raw.gpu, raw.xid, (old.count if old else 0) + 1, now)
            self._snapshot = None
        return event

    def snapshot(self) -> NodeHealth:
        """What was seen so far; the same object until something changes (cheap per sample, and
        the watch's delta sees no change)."""
        with self._lock:
            if self._snapshot is None:
                self._snapshot = NodeHealth(
                    since=self._since,
                    error=self._error,
                    events=tuple(self._events),
                    xid_counts=tuple(self._xids[k] for k in sorted(self._xids)),
                )
            return self._snapshot

    def attach(self, sample: NodeSample) -> NodeSample:
        """`sample` with the health seen so far (a polled source drained first)."""
        if self._polled is not None:
            self.drain()
        return dataclasses.replace(sample, health=self.snapshot())
