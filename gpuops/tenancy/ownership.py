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
from gpuops.tenancy.builtin import GroupAttributor, LimiterAttributor, OwnerAttributor, UserAttributor

if TYPE_CHECKING:  # annotations only: the collector (and SSH) load with the live views
    from gpuops.fleet.source import NodeView
    from gpuops.spec import Fleet

UNOWNED = "(unowned)"  # the team of GPUs nobody owns, in every per-team table

# Attributors whose answer depends only on the process's tenant label, user and groups and on the
# GPU's owner (and fleet.yaml's lookups, fixed for an Ownership): their answers can be remembered.
_PURE = (LimiterAttributor, UserAttributor, GroupAttributor, OwnerAttributor)
_MEMO_LIMIT = 65536  # remembered answers (distinct users, groups and owners) before starting afresh


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
    # Tenants already decided, by (tenant label, its source, user, groups, owner): only while every
    # attributor of the chain is a built-in one (a plugin may answer differently later: the
    # Kubernetes one re-reads its pods file), so a fleet's thousands of processes cost a lookup each.
    _tenants: dict[tuple[object, ...], tuple[str, str]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # What the views derive from each node's view with this ownership (`gpuops.views.gpus`): by
    # node name, kept while the node's view is the same object and reused in part when it is not.
    derived: dict[str, object] = field(default_factory=dict, compare=False, repr=False)
    _pure: bool | None = field(default=None, init=False, compare=False, repr=False)

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

    @property
    def stable_attribution(self) -> bool:
        """Whether a process's tenant depends only on its tenant label, user and groups and on the
        GPU's owner: every attributor of the chain is a built-in one (decided on first use, when
        the default chain is found)."""
        pure = self._pure
        if pure is None:
            chain = self.chain or default_chain()
            pure = all(type(a) in _PURE for _, a in chain.attributors)
            object.__setattr__(self, "_pure", pure)
        return pure

    def tenant(
        self, process: GpuProcess, owner: str | None, node: str = "", gpu: Gpu | None = None
    ) -> tuple[str, str]:
        """(team, where it came from) of a process on a GPU owned by `owner`: the attribution
        chain's answer; ("-", "none") when nobody claims it. Never raises."""
        if self.stable_attribution:  # the answer depends on these only
            key = (process.tenant, process.tenant_source, process.user, process.groups, owner)
            try:
                return self._tenants[key]
            except KeyError:
                pass
            except TypeError:  # something unhashable in the process: ask the chain
                return self._attribute(process, owner, node, gpu)
            found = self._attribute(process, owner, node, gpu)
            if len(self._tenants) >= _MEMO_LIMIT:
                self._tenants.clear()
            self._tenants[key] = found
            return found
        return self._attribute(process, owner, node, gpu)

    def _attribute(
        self, process: GpuProcess, owner: str | None, node: str, gpu: Gpu | None
    ) -> tuple[str, str]:
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
