"""The one pass over a node's GPUs that the node rows (the grid, the nodes table) and the tenants
share: each GPU's owner, pool and the tenant of each of its processes, decided once per node view
and ownership, not once per screen.

The pass of a node is kept on the `Ownership` (its `derived` memo, by node name) while the node's
view is the same object (the collector makes a new view for every sample or state change). A new
view of the node keeps the tenants of a GPU whose processes are the same objects as before, when
attribution is by the built-in attributors only (`Ownership.stable_attribution`; a plugin, such as
the Kubernetes one re-reading its pods file, may answer differently from one update to the next).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuops.core.model import Gpu
from gpuops.fleet.collector import NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.common import FREE, as_float, as_int, capacity_state, gpu_lost, mig_active


class GpuPass:
    """One GPU of a node view, as the node rows and the tenants both read it: its owner (None:
    nobody's), its pool (None: its owner's silo), the tenant of each of its processes in their
    order (none for a lost GPU), and for a GPU not in MIG mode, the figures of its sample read as
    numbers (`common.as_float`, `as_int`, `percent_of`) and its capacity state
    (`common.whole_gpu_state`)."""

    __slots__ = (
        "gpu",
        "lost",
        "memory",
        "memory_total",
        "memory_used",
        "mig",
        "owner",
        "pool",
        "state",
        "tenants",
        "util",
    )

    def __init__(
        self, gpu: Gpu, owner: str | None, pool: str | None, tenants: tuple[str, ...], lost: bool
    ) -> None:
        self.gpu = gpu
        self.owner = owner
        self.pool = pool
        self.tenants = tenants
        self.lost = lost
        self.mig = mig_active(gpu)
        s = gpu.sample
        if s is None or self.mig:
            self.util = self.memory = None
            self.memory_used = self.memory_total = None
            self.state = FREE
            return
        # common.as_float / as_int / percent_of, without the calls for the usual types
        util = s.utilization_gpu_percent
        self.util = util if type(util) is float else as_float(util)
        raw = s.memory_used_bytes
        used: int | None = raw if type(raw) is int else as_int(raw)
        raw = s.memory_total_bytes
        total: int | None = raw if type(raw) is int else as_int(raw)
        self.memory_used = used
        self.memory_total = total
        self.memory = None if used is None or total is None or total <= 0 else 100.0 * used / total
        # common.whole_gpu_state
        self.state = FREE if lost else capacity_state(self.util, len(gpu.processes), self.memory)


class NodePass:
    """A node view's GPUs as `GpuPass`es, for one ownership."""

    __slots__ = ("gpus", "view")

    def __init__(self, view: NodeView, gpus: list[GpuPass]) -> None:
        self.view = view
        self.gpus = gpus


def view_gpus(view: NodeView) -> Sequence[Gpu]:
    """The GPUs a node view shows: the last sample's, else the inventory's, else none."""
    if view.sample is not None:
        return view.sample.gpus
    return view.inventory.gpus if view.inventory is not None else ()


def node_pass(view: NodeView, ownership: Ownership) -> NodePass:
    """The shared per-GPU facts of `view` (made once per view object and ownership)."""
    memo = ownership.derived
    old = memo.get(view.name)
    if isinstance(old, NodePass) and old.view is view:
        return old
    before: dict[int, GpuPass] = {}
    if isinstance(old, NodePass) and ownership.stable_attribution:  # a plugin may change its mind
        before = {g.gpu.info.index: g for g in old.gpus}
    tenant = ownership.tenant
    out: list[GpuPass] = []
    for gpu in view_gpus(view):
        owner = ownership.owner(view, gpu)
        pool = ownership.pool(view, gpu)
        processes = gpu.processes
        lost = gpu_lost(gpu)
        if not processes or lost:
            tenants: tuple[str, ...] = ()
        else:
            prev = before.get(gpu.info.index)
            if prev is not None and prev.gpu.processes is processes and prev.owner == owner:
                tenants = prev.tenants
            else:
                tenants = tuple([tenant(p, owner)[0] for p in processes])
        out.append(GpuPass(gpu, owner, pool, tenants, lost))
    made = NodePass(view, out)
    memo[view.name] = made
    return made
