"""Events in words (gpuops.views.events)."""

from __future__ import annotations

from gpuops.fleet.collector import LIVE, STALE, UNREACHABLE, FleetEvent
from gpuops.views.events import event_rows
from gpuops.views.filter import parse_filter


def test_events_in_words_newest_first_and_filtered() -> None:
    events = [
        FleetEvent(1.0, "a", LIVE, "live"),
        FleetEvent(2.0, "b", LIVE, "live"),
        FleetEvent(10.0, "a", STALE, "no sample for 3s"),
        FleetEvent(20.0, "a", UNREACHABLE, "refused"),
        FleetEvent(95.0, "a", LIVE, "live"),
    ]
    rows = event_rows(events)
    assert [(e.node, e.what) for e in rows] == [
        ("a", "back"),
        ("a", "unreachable"),
        ("a", "stale"),
        ("b", "up"),
        ("a", "up"),
    ]
    assert rows[0].message == "stale for 1m25s" and rows[-1].message == "first sample"
    assert [e.what for e in event_rows(events, parse_filter("refused"))] == ["unreachable"]
    assert [e.node for e in event_rows(events, sort="node")] == ["a", "a", "a", "a", "b"]
