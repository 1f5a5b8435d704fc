"""The live views' feed: it turns a fleet source's snapshots into immutable `FleetState`s, the
view model every live screen draws.

A source (`gpuops.fleet.source.FleetSource`: the SSH collector, Prometheus, this host's agent or
the in-process simulator) collects in the background and answers `snapshot()` at any time. The
`Feed` wakes when the source reports a change, at most once per period (the refresh interval),
and at least once per period so that ages and stale states move on. Each time it builds one
`FleetState`: the snapshot, the tenants now and over the session, the events and the status line's
figures. Node rows for the grid and the tables are derived lazily, on first use by a visible
screen. Screens only ever receive a finished, immutable state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from gpuops.core.model import HealthEvent
from gpuops.fleet.source import CONNECTING, LIVE, STALE, FleetEvent, FleetSnapshot, FleetSource, NodeView
from gpuops.tenancy.attribution import UNATTRIBUTED, default_chain
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.events import HealthLog
from gpuops.views.gpu_history import GpuHistory
from gpuops.views.gpus import node_facts
from gpuops.views.nodes import NodeRow, RowCache
from gpuops.views.processes import FirstSeen, FleetProcess, fleet_processes
from gpuops.views.status import FleetStatus, fleet_status
from gpuops.views.tenant_history import TenantHistory
from gpuops.views.tenants import TenantRow, tenant_rows

if TYPE_CHECKING:
    from gpuops.spec import Fleet

MIN_PERIOD = 0.25  # the screens redraw at most 4 times a second, whatever the sampling interval
ATTRIBUTION = "attribution"  # the kind of the events that are attribution warnings
FLEET_WIDE = "-"  # the node of a warning about no node in particular (a plugin, fleet.yaml)
MAX_WARNINGS = 100  # distinct warnings listed; a fleet of strangers must not bury the events
RESCAN_EVERY = 30  # builds between looks for unclaimed processes while their number stays put


@dataclass(frozen=True)
class FleetState:
    """Everything the screens show at one moment. Immutable; node rows are derived on first use."""

    version: int
    time: float
    snapshot: FleetSnapshot
    ownership: Ownership
    tenants: tuple[TenantRow, ...]
    history: TenantHistory
    events: tuple[FleetEvent, ...]
    status: FleetStatus
    source: str
    _rows: Callable[[], tuple[NodeRow, ...]] = field(repr=False, compare=False, default=lambda: ())
    # Attribution warnings, each distinct one once, oldest first (`AttributionWarnings`).
    warnings: tuple[FleetEvent, ...] = ()
    # GPU health events (XID, ECC, clocks) the agents reported this session, (node, event), oldest
    # first (views.events.HealthLog).
    health: tuple[tuple[str, HealthEvent], ...] = ()
    _processes: Callable[[], tuple[FleetProcess, ...]] = field(repr=False, compare=False, default=lambda: ())
    # Each GPU over the session (the detail's sparklines); the feed's ring, read by the detail only.
    gpu_history: GpuHistory | None = field(default=None, repr=False, compare=False)

    @cached_property
    def rows(self) -> tuple[NodeRow, ...]:
        return self._rows()

    @cached_property
    def processes(self) -> tuple[FleetProcess, ...]:
        """Every GPU process of the fleet (`:processes`), made on first use."""
        return self._processes()

    def node(self, name: str) -> NodeView | None:
        return next((v for v in self.snapshot.nodes if v.name == name), None)


class AttributionWarnings:
    """What attribution warns about, each distinct warning once with the time it was first seen:
    the chain's problems (a plugin that cannot be loaded, raises or answers nonsense; it keeps
    them once each) and processes nobody claims (tenant `-`), once per unix user, since one
    stranger's hundred processes are one thing to fix in fleet.yaml."""

    def __init__(self, limit: int = MAX_WARNINGS) -> None:
        self.limit = limit
        self._seen: dict[str, FleetEvent] = {}
        self._over: set[str] = set()  # keys past the limit, counted once each
        self._unattributed = -1  # the '-' row's process count at the last scan
        self._since_scan = 0

    def update(
        self, now: float, snapshot: FleetSnapshot, ownership: Ownership, tenants: tuple[TenantRow, ...]
    ) -> None:
        chain = ownership.chain or default_chain()
        for problem in chain.problems:
            self._add(f"chain\0{problem}", FleetEvent(now, FLEET_WIDE, ATTRIBUTION, problem))
        row = next((t for t in tenants if t.team == UNATTRIBUTED), None)
        count = row.processes if row is not None else 0
        # Asking the chain again for every process costs time at 1000 GPUs; the tenants already
        # count the unclaimed ones, so look only while there are some: when their number moves,
        # and now and then in case one stranger replaced another.
        self._since_scan += 1
        if count and (count != self._unattributed or self._since_scan >= RESCAN_EVERY):
            self._strangers(now, snapshot, ownership)
            self._since_scan = 0
        self._unattributed = count

    def _strangers(self, now: float, snapshot: FleetSnapshot, ownership: Ownership) -> None:
        for view in snapshot.nodes:
            if view.sample is None or view.state not in (LIVE, STALE):
                continue
            for gpu in view.sample.gpus:
                owner = ownership.owner(view, gpu) or UNOWNED
                for p in gpu.processes:
                    # as tenant_rows asks, so that the warning and the '-' row agree
                    if ownership.tenant(p, owner)[0] != UNATTRIBUTED:
                        continue
                    who = f"user {p.user}" if p.user else "no known user (another PID namespace?)"
                    where = f"GPU {gpu.info.index}" + ("" if owner == UNOWNED else f" (owner {owner})")
                    message = (
                        f"a process of {who} belongs to no team: unattributed (-); "
                        f"first seen: pid {p.pid} on {where}"
                    )
                    self._add(f"user\0{p.user}", FleetEvent(now, view.name, ATTRIBUTION, message))

    def _add(self, key: str, event: FleetEvent) -> None:
        if key in self._seen:
            return
        if len(self._seen) < self.limit:
            self._seen[key] = event
            return
        if key in self._over or len(self._over) >= 100 * self.limit:
            return
        self._over.add(key)
        self._seen["\0more"] = FleetEvent(
            event.time,
            FLEET_WIDE,
            ATTRIBUTION,
            f"{len(self._over)} more distinct attribution warning(s) not listed (the first {self.limit} are)",
        )

    def events(self) -> tuple[FleetEvent, ...]:
        return tuple(self._seen.values())


def _first_answers_in(snapshot: FleetSnapshot) -> bool:
    """Whether the fleet's first answers are in: some node has data and none is still on its
    first connection (connecting, never sampled). Unreachable nodes have answered (with why)."""
    nodes = snapshot.nodes
    return any(n.sample is not None for n in nodes) and not any(
        n.state == CONNECTING and n.sample is None for n in nodes
    )


class Feed:
    """Builds a FleetState from its source once per period (or when told) and hands it on."""

    def __init__(
        self,
        source: FleetSource,
        ownership: Ownership | None = None,
        clock: Callable[[], float] = time.time,
        period: float | None = None,
    ) -> None:
        self.source = source
        self.ownership = ownership or Ownership()
        self.clock = clock
        self.period = max(MIN_PERIOD, source.interval if period is None else period)
        self.history = TenantHistory()
        self.version = 0
        self.state: FleetState | None = None
        self._cache = RowCache(lazy=True)  # cells made for the lines a screen draws
        self.builds = 0
        self.warnings = AttributionWarnings()
        self.health = HealthLog()
        self.first_seen = FirstSeen()
        self.gpu_history = GpuHistory()
        self._recording = False  # the teams' history: from the first state with every node's answer

    def use_fleet(self, fleet: Fleet) -> None:
        """Owners, teams, pools and attribution from this fleet.yaml from the next build on (the
        Pool screen rewrote the file)."""
        self.ownership = Ownership.from_fleet(fleet)

    def build(self) -> FleetState:
        now = self.clock()
        snapshot = self.source.snapshot(now)
        tenants = tenant_rows(snapshot, self.ownership)
        if self._recording or _first_answers_in(snapshot):
            # Not before: a team's figures before its nodes answered are not zeros, and a
            # sparkline starting from them would draw a value that never changed as a rise.
            self._recording = True
            self.history = self.history.record(now, tenants)
        self.warnings.update(now, snapshot, self.ownership, tenants)
        self.health.update(snapshot)
        self.first_seen.update(snapshot, now)
        ownership = self.ownership
        # the points were read by the pass the tenants made (views.gpus.node_facts)
        self.gpu_history.update(snapshot, lambda view: node_facts(view, ownership).history)
        self.version += 1
        self.builds += 1
        cache, first_seen = self._cache, self.first_seen
        state = FleetState(
            version=self.version,
            time=now,
            snapshot=snapshot,
            ownership=ownership,
            tenants=tenants,
            history=self.history,
            events=tuple(self.source.events()),
            status=fleet_status(snapshot, now),
            source=self.source.label,
            _rows=lambda: cache.rows(snapshot, ownership),
            warnings=self.warnings.events(),
            health=self.health.events(),
            _processes=lambda: fleet_processes(snapshot, ownership, first_seen),
            gpu_history=self.gpu_history,
        )
        self.state = state
        return state

    async def run(self, publish: Callable[[FleetState], None]) -> None:
        """Publish a state now, then after every change (at most once per period) and at least once
        per period. Runs until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            publish(self.build())
            await self.source.wait_changed(self.period)
            delay = started + self.period - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
