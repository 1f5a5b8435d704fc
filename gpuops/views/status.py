"""The status line: how many nodes in which state, and how old the live data is."""

from __future__ import annotations

from dataclasses import dataclass

from gpuops.fleet.source import CONNECTING, LIVE, STALE, UNREACHABLE, FleetSnapshot


@dataclass(frozen=True)
class FleetStatus:
    """The status line: how many nodes in which state, and how old the live data is."""

    nodes: int
    live: int
    stale: int
    unreachable: int
    connecting: int
    data_age: float | None  # age of the oldest sample among live nodes
    stale_names: tuple[str, ...]


def fleet_status(snapshot: FleetSnapshot, now: float) -> FleetStatus:
    ages = [v.age(now) for v in snapshot.nodes if v.state == LIVE]
    known = [a for a in ages if a is not None]
    return FleetStatus(
        nodes=len(snapshot.nodes),
        live=snapshot.count(LIVE),
        stale=snapshot.count(STALE),
        unreachable=snapshot.count(UNREACHABLE),
        connecting=snapshot.count(CONNECTING),
        data_age=max(known) if known else None,
        stale_names=tuple(v.name for v in snapshot.nodes if v.state in (STALE, UNREACHABLE)),
    )
