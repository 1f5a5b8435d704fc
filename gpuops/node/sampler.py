"""One sampling loop per node process, whose latest sample everyone reads.

The exporter (node/exporter.py) never asks the backend itself: it reads the latest sample taken
here, so NVML's cost is paid once per interval however often Prometheus scrapes and however many
servers scrape. History (`--record` with `--metrics`) is fed from the same samples.

Two ways to drive it:
- `run()`: a steady cadence on an executor (the real agent: NVML calls on one worker thread);
- `fresh(max_age)`: take a sample only when the latest is older than `max_age` (the simulated
  fleet, whose backends are cheap and never block: a thousand idle nodes cost nothing until
  scraped).

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, List, Optional

from gpuops.core.model import NodeSample
from gpuops.node.backends.base import BackendError

log = logging.getLogger("gpuops.agent")


class Latest:
    """The latest sample (None before the first one succeeded), when it was taken (seconds since
    the epoch, the node's clock), and why the last attempt failed ("" when it did not)."""

    __slots__ = ("error", "sample", "taken")

    def __init__(self, sample: Optional[NodeSample], taken: float, error: str) -> None:
        self.sample = sample
        self.taken = taken
        self.error = error


class Sampler:
    """Takes samples with `take` and keeps the latest; `listeners` get every new sample."""

    def __init__(
        self,
        take: Callable[[], NodeSample],
        interval: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.take = take
        self.interval = float(interval)
        self.clock = clock
        self.monotonic = monotonic
        self.listeners: List[Callable[[NodeSample], None]] = []
        # One object replaced whole: readers on other threads see an old one or a new one.
        self._latest = Latest(None, 0.0, "no sample taken yet")
        self._at: Optional[float] = None  # monotonic time of the last attempt
        self.samples = 0  # how many were taken (tests and benchmarks count backend calls)
        self._failures = 0

    def latest(self) -> Latest:
        return self._latest

    def refresh(self) -> Latest:
        """Take one sample now; a failure keeps the previous sample and says why."""
        self._at = self.monotonic()
        try:
            sample = self.take()
        except BackendError as exc:
            self._failures += 1
            if self._failures == 1 or self._failures % 60 == 0:
                log.warning("sample failed (%d in a row): %s", self._failures, exc)
            old = self._latest
            self._latest = Latest(old.sample, old.taken, str(exc) or "sample failed")
            return self._latest
        self._failures = 0
        self.samples += 1
        self._latest = Latest(sample, self.clock(), "")
        for listener in self.listeners:
            try:
                listener(sample)
            except Exception:  # history's trouble must not stop the metrics
                log.exception("a sample listener failed")
        return self._latest

    def fresh(self, max_age: Optional[float] = None) -> Latest:
        """The latest sample, taken now when the last attempt is older than `max_age` (default:
        the interval)."""
        limit = self.interval if max_age is None else max_age
        if self._at is None or self.monotonic() - self._at >= limit:
            return self.refresh()
        return self._latest

    async def run(self, call: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        """Sample every interval until cancelled; `call(fn)` runs fn where backend calls belong
        (the agent's worker thread). A sample that overruns skips ticks rather than bursting."""
        loop = asyncio.get_event_loop()
        next_tick = loop.time()
        while True:
            await call(self.refresh)
            next_tick += self.interval
            now = loop.time()
            if next_tick < now:
                next_tick = now + self.interval - ((now - next_tick) % self.interval)
            await asyncio.sleep(next_tick - now)
