"""The events screen: the collector's node events and the agents' GPU health events (XID, ECC,
clock changes) in words, filtered and sorted."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuops.core.model import HealthEvent, NodeHealth
from gpuops.core.units import format_duration
from gpuops.fleet.source import LIVE, STALE, UNREACHABLE, FleetEvent, FleetSnapshot
from gpuops.views.filter import Filter

# What the common XIDs mean and who usually acts, after NVIDIA's XID catalog
# (docs.nvidia.com/deploy/xid-errors): a word for the operator, not the catalog's full text.
XID_MEANINGS = {
    13: "graphics engine exception (usually the application: illegal address or instruction)",
    31: "GPU memory page fault (usually the application: illegal memory access)",
    43: "GPU stopped processing (the application's channel was reset; others keep running)",
    45: "preemptive cleanup after an earlier error (a process was killed or reset)",
    48: "double-bit ECC error (uncorrectable memory error; the GPU may need a reset)",
    61: "internal micro-controller breakpoint/warning (reset the GPU if it persists)",
    62: "internal micro-controller halt (reset the GPU)",
    63: "ECC page retirement or row remapping recorded (reset the GPU to apply it)",
    64: "ECC page retirement or row remapping failed (the GPU needs service)",
    74: "NVLink error (check the link; reset the GPU)",
    79: "GPU has fallen off the bus (reboot the node; check power and cooling)",
    92: "high single-bit ECC error rate (watch it; the GPU may need service)",
    94: "contained ECC error (the affected application was stopped; reset the GPU when idle)",
    95: "uncontained ECC error (every application on the GPU is affected; reset it)",
    119: "GSP RPC timeout (the GPU's system processor stopped answering; reset the GPU)",
    120: "GSP error (the GPU's system processor failed; reset the GPU)",
}
HEALTH = "health"  # the kind of the events screen's rows that are GPU health events
_HEALTH_WORDS = {
    "ecc_single_bit": ("ECC single-bit", "a corrected memory error"),
    "ecc_double_bit": ("ECC double-bit", "an uncorrectable memory error"),
    "clock": ("clock event", "clocks changed or throttled"),
    "pstate": ("P-state", "performance state changed"),
    "other": ("event", "another NVML event"),
}
MAX_HEALTH_ROWS = 1000  # health events kept for the session, newest kept


@dataclass(frozen=True)
class EventRow:
    """An event as the events screen lists it: what happened, in words."""

    time: float
    node: str
    kind: str  # the collector's: live, stale, unreachable, agent-error
    what: str  # "up", "back", "stale", "unreachable", "agent error", "XID 79", "ECC double-bit"
    message: str
    gpu: int | None = None  # a health event's GPU (-1: one NVML could not name)
    severe: bool = False  # a health event that needs someone (an XID, a double-bit ECC error)


def xid_meaning(xid: int) -> str:
    return XID_MEANINGS.get(xid, "see NVIDIA's XID catalog")


def health_row(node: str, event: HealthEvent) -> EventRow:
    """One GPU health event in words: on which GPU and MIG instance, what, and what it means."""
    where = f"GPU {event.gpu}" if event.gpu >= 0 else "a GPU NVML could not name"
    if event.gpu_instance_id is not None:
        where += f" GI {event.gpu_instance_id}"
        if event.compute_instance_id is not None:
            where += f" CI {event.compute_instance_id}"
    if event.kind == "xid":
        number = event.xid if event.xid is not None else 999
        what = f"XID {number}"
        meaning = xid_meaning(number) if number != 999 else "an XID NVML could not number"
    else:
        what, meaning = _HEALTH_WORDS.get(event.kind, (event.kind, ""))
    severe = event.kind in ("xid", "ecc_double_bit")
    return EventRow(event.timestamp, node, HEALTH, what, f"{where}: {meaning}", event.gpu, severe)


class HealthLog:
    """Every health event the agents reported during the session, each once: a sample carries
    its node's latest events, numbered by the agent (a new agent numbers from 1 again, with a new
    `since`). The newest MAX_HEALTH_ROWS are kept."""

    def __init__(self, limit: int = MAX_HEALTH_ROWS) -> None:
        self.limit = limit
        self._seen: dict[tuple[str, float, int], tuple[str, HealthEvent]] = {}
        self._last: dict[str, NodeHealth] = {}  # per node, the health last read: unchanged skips
        self._rows: tuple[tuple[str, HealthEvent], ...] = ()

    def update(self, snapshot: FleetSnapshot) -> None:
        changed = False
        for view in snapshot.nodes:
            health = view.sample.health if view.sample is not None else None
            if health is None or self._last.get(view.name) is health:
                continue
            self._last[view.name] = health
            for e in health.events:
                key = (view.name, health.since, e.seq)
                if key not in self._seen:
                    self._seen[key] = (view.name, e)
                    changed = True
        if changed:
            kept = sorted(self._seen.items(), key=lambda kv: kv[1][1].timestamp)[-self.limit :]
            self._seen = dict(kept)
            self._rows = tuple(v for _k, v in kept)

    def events(self) -> tuple[tuple[str, HealthEvent], ...]:
        """(node, event), oldest first."""
        return self._rows


def xid_summary(health: NodeHealth | None, gpu: int) -> str:
    """A GPU's XID errors as the detail screen shows them: how many, which, and since when."""
    if health is None:
        return "not reported (an agent older than health events, or a source without them)"
    if health.error:
        return f"n/a ({health.error})"
    counts = [c for c in health.xid_counts if c.gpu == gpu]
    if not counts:
        return "none"
    total = sum(c.count for c in counts)
    which = ", ".join(f"XID {c.xid}: {c.count}" for c in sorted(counts, key=lambda c: -c.last_timestamp))
    return f"{total} ({which})"


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
    events: Iterable[FleetEvent],
    flt: Filter | None = None,
    sort: str = "time",
    reverse: bool = False,
    health: Iterable[tuple[str, HealthEvent]] = (),
) -> list[EventRow]:
    """Events in words, newest first (by default), filtered on node, what happened and message;
    GPU health events (node, event) among them."""
    fn, descending = EVENT_SORTS[sort]
    rows = describe_events(events) + [health_row(node, e) for node, e in health]
    kept = [e for e in rows if flt is None or flt.matches(f"{e.node} {e.what} {e.kind} {e.message}")]
    ordered = sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]
    return ordered
