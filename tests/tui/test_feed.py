"""The feed: immutable fleet states built once per update, their parts on first use."""

from __future__ import annotations

from gpuops.simfleet.source import SimSource
from gpuops.views.feed import Feed
from gpuops.views.status import fleet_status
from tests.tui.conftest import Clock


def test_feed_builds_immutable_states_lazily(source: SimSource, clock: Clock) -> None:
    feed = Feed(source, source.ownership(), clock)
    first = feed.build()
    clock.advance(1)
    source.sample()
    second = feed.build()
    assert second.version == first.version + 1 and second.snapshot is not first.snapshot
    assert first.rows and first.rows is first.rows  # computed once, on first use
    status = fleet_status(second.snapshot, clock())
    assert (status.live, status.stale, status.unreachable, status.nodes) == (8, 0, 0, 8)
