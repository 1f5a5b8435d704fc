"""Who owns which GPU and which team each process on it works for, as the live figures see it.

**owner**: the team a GPU belongs to (fleet.yaml's per-GPU owner, else the node's owner, else the
owner the node itself reports). **tenant** of a process: what the attribution chain says
(`gpuops.tenancy.attribution`, docs/tenancy.md); a process nobody claims is unattributed: tenant
``-``, source ``none`` (shown and counted, never dropped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuops.core.model import Gpu, GpuProcess
from gpuops.tenancy.attribution import AttributionChain, AttributionContext, default_chain

if TYPE_CHECKING:  # annotations only: the collector (and SSH) load with the live views
    from gpuops.fleet.collector import NodeView
    from gpuops.fleet.simfleet import SimFleetPlan
    from gpuops.spec import Fleet

UNOWNED = "(unowned)"  # the team of GPUs nobody owns, in every per-team table


@dataclass(frozen=True)
class Ownership:
    """Who owns which GPU, which team a unix user or group works for (fleet.yaml, when there is
    one), and the attribution chain that decides the tenant of each process (None: the built-in
    attributors in the default order)."""

    teams: tuple[str, ...] = ()
    gpu_owner_of: Callable[[str, int], str | None] | None = None
    team_of_user: Callable[[str], str | None] | None = None
    team_of_group: Callable[[str], str | None] | None = None
    chain: AttributionChain | None = None
    fleet: Fleet | None = field(default=None, compare=False)
    # Pool membership per (node, index, uuid, model): selectors are matched once per GPU seen.
    _pools: dict[tuple[str, int, str | None, str | None], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_fleet(cls, fleet: Fleet) -> Ownership:
        names = frozenset(n.name for n in fleet.nodes)

        def gpu_owner(node: str, index: int) -> str | None:
            return fleet.gpu_owner(node, index) if node in names else None

        def team_of_user(user: str) -> str | None:
            return fleet.team_of_user(user)

        options = fleet.attribution
        chain = AttributionChain.from_config(options.order, options.settings)
        return cls(tuple(sorted(fleet.teams)), gpu_owner, team_of_user, fleet.team_of_group, chain, fleet)

    @classmethod
    def from_sim_plan(cls, plan: SimFleetPlan) -> Ownership:
        """Owners and teams as a simulated fleet's fleet.yaml would give them (the simulated
        source of tests and benchmarks: `gpuops.fleet.simsource`)."""
        owners = {n.name: n.owner for n in plan.nodes}
        users = {u: team for team, members in plan.teams.items() for u in members}
        teams = tuple(sorted(plan.teams))
        return cls(teams, lambda node, index: owners.get(node), users.get)

    def owner(self, view: NodeView, gpu: Gpu) -> str | None:
        if self.gpu_owner_of is not None:
            owner = self.gpu_owner_of(view.name, gpu.info.index)
            if owner:
                return owner
        return view.owner or gpu.owner

    def pool(self, view: NodeView, gpu: Gpu) -> str | None:
        """The pool fleet.yaml puts the GPU in (None: in its owner's silo, or no fleet.yaml)."""
        fleet = self.fleet
        if fleet is None or not fleet.pools:
            return None
        info = gpu.info
        key = (view.name, info.index, info.uuid, info.name)
        cache = self._pools
        if key not in cache:
            try:
                cache[key] = fleet.pool_of(*key)
            except KeyError:  # a node fleet.yaml does not list (a local view): in no pool
                cache[key] = None
        return cache[key]

    def tenant(
        self, process: GpuProcess, owner: str | None, node: str = "", gpu: Gpu | None = None
    ) -> tuple[str, str]:
        """(team, where it came from) of a process on a GPU owned by `owner`: the attribution
        chain's answer; ("-", "none") when nobody claims it. Never raises."""
        context = AttributionContext(
            node,
            gpu,
            None if owner == UNOWNED else owner,
            self.fleet,
            self.teams,
            self.team_of_user,
            self.team_of_group,
        )
        found = (self.chain or default_chain()).attribute(process, context)
        return found.team, found.source
