"""Events in words (gpuops.views.events)."""

from __future__ import annotations

from gpuops.fleet.source import LIVE, STALE, UNREACHABLE, FleetEvent
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


def test_health_events_are_kept_once_across_samples_and_agents() -> None:
    """A sample carries its node's latest events; the log keeps each (node, agent, seq) once, and a
    new agent (a new `since`, numbering from 1 again) adds its own."""
    from gpuops.core.model import HealthEvent, NodeHealth, NodeSample, XidCount
    from gpuops.fleet.source import FleetSnapshot, NodeView
    from gpuops.views.events import HEALTH, HealthLog, xid_summary

    def snapshot(health: NodeHealth) -> FleetSnapshot:
        view = NodeView("n1", "sim:n1", state=LIVE, sample=NodeSample("n1", 0.0, health=health))
        return FleetSnapshot(0.0, 1.0, (view,))

    xid = HealthEvent(1, 100.0, 2, "xid", xid=79, uuid="GPU-a")
    ecc = HealthEvent(2, 101.0, 0, "ecc_double_bit", gpu_instance_id=1, compute_instance_id=0)
    log = HealthLog()
    first = NodeHealth(since=50.0, events=(xid,), xid_counts=(XidCount(2, 79, 1, 100.0),))
    log.update(snapshot(first))
    log.update(snapshot(NodeHealth(since=50.0, events=(xid, ecc), xid_counts=first.xid_counts)))
    restarted = HealthEvent(1, 200.0, 2, "xid", xid=13)
    log.update(snapshot(NodeHealth(since=190.0, events=(restarted,))))
    assert [e for _node, e in log.events()] == [xid, ecc, restarted]
    rows = event_rows([], health=log.events())
    assert [(r.what, r.message, r.kind, r.severe) for r in rows] == [
        (
            "XID 13",
            "GPU 2: graphics engine exception (usually the application: illegal address or instruction)",
            HEALTH,
            True,
        ),
        ("ECC double-bit", "GPU 0 GI 1 CI 0: an uncorrectable memory error", HEALTH, True),
        (
            "XID 79",
            "GPU 2: GPU has fallen off the bus (reboot the node; check power and cooling)",
            HEALTH,
            True,
        ),
    ]
    assert [r.what for r in event_rows([], parse_filter("ECC"), health=log.events())] == ["ECC double-bit"]
    assert xid_summary(first, 2) == "1 (XID 79: 1)" and xid_summary(first, 0) == "none"
    assert xid_summary(NodeHealth(since=0.0, error="NOT_SUPPORTED"), 0) == "n/a (NOT_SUPPORTED)"
    assert xid_summary(None, 0).startswith("not reported")
