"""The fleet source protocol and its snapshot types: what every live view reads, whichever source
gives it.

A *source* collects in the background (asyncio tasks on the caller's event loop) and answers
`snapshot()` at any time without waiting. Four implement `FleetSource`:

- `gpuops.fleet.collector.Collector`: fleet.yaml's nodes over SSH, one session per node;
- `gpuops.fleet.promql.source.PromSource`: the nodes' figures read from Prometheus (PromQL);
- `gpuops.fleet.local.LocalSource`: this host's agent as a child process;
- `gpuops.simfleet.source.SimSource`: simulated nodes in this process (tests, benchmarks).

Each gives the same immutable `FleetSnapshot`s of `NodeView`s with the same node states, so the
view models (gpuops/views) and every screen and table built on them do not know which one it is.
The TUI (through `gpuops.views.feed.Feed`) and the live commands of the CLI only consume sources.

Node states:

- `connecting`: no answer yet since the source started (the reason says where it is);
- `live`: a sample arrived within the last 2 intervals;
- `stale`: reachable, but the last sample is older than 2 intervals;
- `unreachable`: the node (or the source itself) cannot be read, with the reason; the last good
  data is kept and shown with its age.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuops.core.model import Node, NodeSample

if TYPE_CHECKING:  # the greeting's type only: the snapshot types load without the agent client
    from gpuops.fleet.agent_client import Hello

CONNECTING, LIVE, STALE, UNREACHABLE = "connecting", "live", "stale", "unreachable"

MAX_EVENTS = 1000  # events a source keeps (the oldest go first)


@dataclass(frozen=True)
class NodeView:
    """What is known of one node at one moment. Immutable: screens may keep it."""

    name: str
    address: str
    state: str = CONNECTING
    reason: str = ""
    since: float = 0.0  # wall time when `state` began
    last_seen: float | None = None  # wall time the last sample arrived
    hello: Hello | None = None
    inventory: Node | None = None
    sample: NodeSample | None = None
    owner: str | None = None
    route: str = ""  # the way the last attempt took: "direct", "via bastion (ProxyJump in ...)"
    agent: str = ""  # the agent the last session ran: bootstrapped, installed or pushed
    agent_command: str = ""

    def age(self, now: float) -> float | None:
        return None if self.last_seen is None else max(0.0, now - self.last_seen)


@dataclass(frozen=True)
class FleetEvent:
    time: float
    node: str
    kind: str  # "live", "stale", "unreachable", "agent-error"
    message: str


@dataclass(frozen=True)
class SourceHealth:
    """How a fleet source that stands between gpuops and the nodes is doing (the PromQL source:
    is Prometheus answering, with which warnings). The SSH source has none: its health is its
    nodes'."""

    kind: str  # "prometheus"
    where: str  # its URL
    state: str  # CONNECTING, LIVE or UNREACHABLE
    reason: str = ""
    warnings: tuple[str, ...] = ()  # partial answers, failed side queries: the figures may be short
    since: float = 0.0  # wall time when `state` began


@dataclass(frozen=True)
class FleetSnapshot:
    time: float
    interval: float
    nodes: tuple[NodeView, ...]
    source: SourceHealth | None = None

    def count(self, state: str) -> int:
        return sum(1 for n in self.nodes if n.state == state)


class FleetSource(Protocol):
    """Where snapshots come from. `start` and `stop` run on the caller's event loop."""

    @property
    def label(self) -> str: ...  # what a title says the view is of

    @property
    def interval(self) -> float: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def snapshot(self, now: float | None = None) -> FleetSnapshot: ...

    def events(self) -> Sequence[FleetEvent]: ...

    async def wait_changed(self, timeout: float | None = None) -> bool:
        """Until some node's data or state changes; False on timeout."""
        ...

    async def discover(self, timeout: float) -> FleetSnapshot:
        """Until every node has answered once or failed its first attempt (or `timeout`): the
        snapshot then, in which every node still connecting says why."""
        ...


async def wait_and_clear(event: asyncio.Event, timeout: float | None) -> bool:
    """A fleet source's `wait_changed`: until `event` is set (then cleared for the next change);
    False on timeout."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    event.clear()
    return True
