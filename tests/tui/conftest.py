"""Shared set-up of the TUI tests: simulated fleets on a fixed clock, apps that publish once.

Times are fixed (Monday 2 March 2026, 14:00 UTC, a working day: the inference team is busy) and
the time zone is UTC, so screens and snapshots are the same on every machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from gpuops.simfleet.source import SimSource
from gpuops.tui.app import GpuopsApp
from gpuops.views.feed import Feed

EPOCH = 1772409600.0  # 2026-03-02 00:00 UTC
NOON = EPOCH + 14 * 3600


class Clock:
    def __init__(self, t: float = NOON) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def silos(clock: Clock, nodes: int | None = None) -> SimSource:
    label = "simulated silos fleet (test)"
    source = SimSource.scenario("silos", nodes, epoch=EPOCH, clock=clock, label=label)
    source.sample()
    return source


@pytest.fixture
def source(clock: Clock) -> SimSource:
    return silos(clock)


AppFactory = Callable[..., GpuopsApp]


@pytest.fixture
def make_app(source: SimSource, clock: Clock) -> AppFactory:
    """An app over the silos fleet; its feed publishes once at start (period one hour) unless the
    test asks for more with `app.publish(app.feed.build())`."""

    def make(period: float = 3600.0, feed: Feed | None = None, **kwargs: object) -> GpuopsApp:
        return GpuopsApp(feed or Feed(source, source.ownership(), clock, period), **kwargs)  # type: ignore[arg-type]

    return make
