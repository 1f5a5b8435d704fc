"""Simulated nodes sampled in this process: a FleetSource without SSH or child processes.

Built from a sim fleet scenario (`gpuops.simfleet.build_fleet`): one `SimBackend` per node,
all on one injectable clock, so a test can show "Monday 14:00" twice and get the same screen, and a
benchmark can feed 1000 GPUs without a thousand SSH sessions. `set_state` plays a node going stale
or unreachable (with the collector's events); `sample` takes the next sample of every live node;
`inject_event` makes a GPU report an XID or ECC event, which the node's next sample carries as an
agent's would (node/health.py). `ownership()` gives the owners and teams the plan's fleet.yaml
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuops.fleet.source import (
    CONNECTING,
    LIVE,
    MAX_EVENTS,
    FleetEvent,
    FleetSnapshot,
    NodeView,
    wait_and_clear,
)
from gpuops.node.backends.base import RawEvent
from gpuops.node.backends.sim import SimBackend
from gpuops.node.health import HealthMonitor
from gpuops.simfleet import SimFleetPlan, build_fleet
from gpuops.simfleet.faults import QueuedEventSource
from gpuops.tenancy.ownership import Ownership


class SimSource:
    """A FleetSource over in-process simulated nodes."""

    def __init__(
        self,
        plan: SimFleetPlan,
        clock: Callable[[], float] = time.time,
        interval: float = 1.0,
        label: str | None = None,
        auto: bool = False,
    ) -> None:
        self.plan = plan
        self.clock = clock
        self._interval = interval
        self._label = label or f"simulated {plan.scenario} fleet ({len(plan.nodes)} nodes, in-process)"
        self.auto = auto
        self.backends = {n.name: SimBackend(spec=n.spec, clock=clock) for n in plan.nodes}
        self._event_sources = {n.name: QueuedEventSource() for n in plan.nodes}
        self.health = {n.name: HealthMonitor(clock) for n in plan.nodes}
        for name, monitor in self.health.items():
            monitor.poll_source(self._event_sources[name])
        now = clock()
        self.views: dict[str, NodeView] = {
            n.name: NodeView(n.name, f"sim:{n.name}", owner=n.owner, since=now) for n in plan.nodes
        }
        self._events: deque[FleetEvent] = deque(maxlen=MAX_EVENTS)
        self._changed = asyncio.Event() if _has_loop() else None
        self._task: asyncio.Task[None] | None = None
        self.down: dict[str, tuple[str, str]] = {}  # node -> (state, reason) while played down

    @classmethod
    def scenario(
        cls,
        scenario: str = "silos",
        nodes: int | None = None,
        seed: int = 0,
        epoch: float = 0.0,
        clock: Callable[[], float] = time.time,
        **kwargs: object,
    ) -> SimSource:
        return cls(build_fleet(scenario, nodes, seed, epoch), clock, **kwargs)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        return self._label

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def gpu_count(self) -> int:
        return sum(n.gpu_count for n in self.plan.nodes)

    def ownership(self) -> Ownership:
        """Owners and teams as the simulated fleet's fleet.yaml would give them (a new one each
        call: an Ownership remembers attributions)."""
        return plan_ownership(self.plan)

    # ---- FleetSource ---------------------------------------------------------------------------

    def start(self) -> None:
        self._changed = asyncio.Event()  # of this loop (a source may serve one app after another)
        if self.auto:
            self._task = asyncio.create_task(self._run(), name="sim source")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def snapshot(self, now: float | None = None) -> FleetSnapshot:
        now = self.clock() if now is None else now
        return FleetSnapshot(now, self._interval, tuple(self.views.values()))

    def events(self) -> Sequence[FleetEvent]:
        return tuple(self._events)

    async def wait_changed(self, timeout: float | None = None) -> bool:
        if self._changed is None:
            self._changed = asyncio.Event()
        return await wait_and_clear(self._changed, timeout)

    async def discover(self, timeout: float) -> FleetSnapshot:
        """Every node answers at once in this process: the nodes not sampled yet (and not played
        down) are sampled now."""
        self.sample([name for name, view in self.views.items() if view.state == CONNECTING])
        return self.snapshot()

    # ---- playing the fleet ---------------------------------------------------------------------

    def sample(self, names: Sequence[str] | None = None) -> None:
        """Take a sample of every node (or the named ones) that is not played down."""
        now = self.clock()
        for name in names if names is not None else list(self.views):
            if name in self.down:
                continue
            backend = self.backends[name]
            view = self.views[name]
            if view.inventory is None:
                view = replace(view, inventory=backend.inventory())
            sample = self.health[name].attach(backend.sample())
            self._set(name, replace(view, state=LIVE, reason="", sample=sample, last_seen=now))

    def inject_event(
        self,
        name: str,
        kind: str,
        gpu: int,
        xid: int | None = None,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Make a GPU of node `name` report a health event; its next `sample` carries it."""
        gpus = self.backends[name].inventory().gpus
        uuid = next((g.info.uuid for g in gpus if g.info.index == gpu), "")
        event = RawEvent(gpu, kind, xid, gpu_instance_id, compute_instance_id, uuid)
        self._event_sources[name].put(event)

    def set_state(self, name: str, state: str, reason: str = "") -> None:
        """Play a node going stale or unreachable (kept until `recover`), keeping its last data."""
        self.down[name] = (state, reason)
        self._set(name, replace(self.views[name], state=state, reason=reason))

    def recover(self, name: str) -> None:
        self.down.pop(name, None)
        self.sample([name])

    def agent_error(self, name: str, message: str) -> None:
        self._events.append(FleetEvent(self.clock(), name, "agent-error", message))
        self._notify()

    def _set(self, name: str, view: NodeView) -> None:
        old = self.views[name]
        if view.state != old.state:
            view = replace(view, since=self.clock())
            if view.state != CONNECTING:
                self._events.append(FleetEvent(self.clock(), name, view.state, view.reason or view.state))
        self.views[name] = view
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self._interval)


def plan_ownership(plan: SimFleetPlan) -> Ownership:
    """Owners and teams as a simulated fleet's fleet.yaml would give them."""
    owners = {n.name: n.owner for n in plan.nodes}
    users = {u: team for team, members in plan.teams.items() for u in members}
    teams = tuple(sorted(plan.teams))
    return Ownership(teams, lambda node, index: owners.get(node), users.get)


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
