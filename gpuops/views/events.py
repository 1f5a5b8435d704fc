"""The events screen: the collector's node events in words, filtered and sorted."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuops.core.units import format_duration
from gpuops.fleet.collector import LIVE, STALE, UNREACHABLE, FleetEvent
from gpuops.views.filter import Filter


@dataclass(frozen=True)
class EventRow:
    """An event as the events screen lists it: what happened, in words."""

    time: float
    node: str
    kind: str  # the collector's: live, stale, unreachable, agent-error
    what: str  # "up", "back", "stale", "unreachable", "agent error"
    message: str


_EVENT_WORDS = {STALE: "stale", UNREACHABLE: "unreachable", "agent-error": "agent error"}


def describe_events(events: Iterable[FleetEvent]) -> list[EventRow]:
    """Events in time order, in words: a node's first `live` is "up"; a `live` after it was stale or
    unreachable is "back", with how long it was out."""
    out: list[EventRow] = []
    down_since: dict[str, tuple[str, float]] = {}
    seen: set[str] = set()
    for e in sorted(events, key=lambda e: e.time):
        if e.kind == LIVE:
            out_since = down_since.pop(e.node, None)
            if out_since is not None:
                state, since = out_since
                message = f"{state} for {format_duration(max(0.0, e.time - since))}"
                out.append(EventRow(e.time, e.node, e.kind, "back", message))
            else:
                what = "up" if e.node not in seen else "live"
                out.append(EventRow(e.time, e.node, e.kind, what, "first sample" if what == "up" else ""))
        else:
            if e.kind in (STALE, UNREACHABLE) and e.node not in down_since:
                down_since[e.node] = (e.kind, e.time)
            out.append(EventRow(e.time, e.node, e.kind, _EVENT_WORDS.get(e.kind, e.kind), e.message))
        seen.add(e.node)
    return out


EVENT_SORTS: dict[str, tuple[Callable[[EventRow], object], bool]] = {
    "time": (lambda e: e.time, True),
    "node": (lambda e: (e.node, -e.time), False),
    "kind": (lambda e: (e.what, -e.time), False),
}


def event_rows(
    events: Iterable[FleetEvent], flt: Filter | None = None, sort: str = "time", reverse: bool = False
) -> list[EventRow]:
    """Events in words, newest first (by default), filtered on node, what happened and message."""
    fn, descending = EVENT_SORTS[sort]
    rows = describe_events(events)
    kept = [e for e in rows if flt is None or flt.matches(f"{e.node} {e.what} {e.kind} {e.message}")]
    ordered = sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]
    return ordered
