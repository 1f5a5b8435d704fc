"""The one pass over a node's GPUs that the node rows (the grid, the nodes table), the tenants and
the GPU history share (`node_facts`): each GPU's owner, pool and the tenant of each of its
processes, decided once per node view and ownership, not once per screen, and the figures each of
them needs summed per node (`NodeFacts`), so that what reads them afterwards works per node, not
per GPU. The per-GPU objects (`GpuPass`, `node_pass`) are made from it for the rows whose cells
are drawn.

The pass of a node is kept on the `Ownership` (its `derived` memo, by node name) while the node's
view is the same object (the collector makes a new view for every sample or state change). A new
view of the node keeps the tenants of a GPU whose processes are the same objects as before, when
attribution is by the built-in attributors only (`Ownership.stable_attribution`; a plugin, such as
the Kubernetes one re-reading its pods file, may answer differently from one update to the next).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import nan
from typing import NamedTuple

from gpuops.core.busy import is_busy
from gpuops.core.history import instance_fraction
from gpuops.core.model import Gpu, GpuProcess, MigState
from gpuops.fleet.source import LIVE, STALE, NodeView
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.common import (
    BUSY,
    FREE,
    HELD,
    HELD_MEMORY_PERCENT,
    as_float,
    as_int,
    busy_fraction,
    capacity_state,
    gpu_lost,
    mig_active,
    percent_of,
    short_model,
)


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
    """The shared per-GPU facts of `view` (made once per view object and ownership, on first use:
    the fused pass `node_facts` reads the figures without them)."""
    return node_facts(view, ownership).passes()


# ---- the fused pass: every per-GPU figure the feed needs, summed per node -----------------------


class TeamAcc:
    """What one team (or pool) adds up: over a node's GPUs in `NodeFacts`, then over the fleet's
    nodes in `views.tenants.tenant_rows`."""

    __slots__ = (
        "gpu_time",
        "held",
        "idle",
        "lent",
        "memory_owned",
        "memory_used",
        "outside",
        "owned",
        "processes",
        "silo",
        "steps",
        "unknown",
        "used",
        "waste",
    )

    def __init__(self) -> None:
        self.owned = self.silo = self.unknown = self.processes = self.memory_used = self.memory_owned = 0
        self.used = self.outside = self.lent = self.idle = self.held = self.waste = self.gpu_time = 0.0
        # A node's GPU-time, each GPU's (slice's) part in order, added to the fleet's in that
        # order (`add`): the share is not rounded, and a per-node subtotal would move its last digits.
        self.steps: list[float] = []

    def add(self, o: TeamAcc) -> None:
        self.owned += o.owned
        self.silo += o.silo
        self.unknown += o.unknown
        self.processes += o.processes
        self.memory_used += o.memory_used
        self.memory_owned += o.memory_owned
        self.used += o.used
        self.outside += o.outside
        self.lent += o.lent
        self.idle += o.idle
        self.held += o.held
        self.waste += o.waste
        time = self.gpu_time
        for step in o.steps:
            time += step
        self.gpu_time = time

    def capacity(self, state: str, amount: float) -> None:
        """`amount` GPU-equivalents of its capacity in `state` (common.capacity_state)."""
        if state != BUSY:
            self.idle += amount
            if state == HELD:
                self.held += amount

    def use(self, team: str, owner: TeamAcc, owner_name: str, pooled: bool, amount: float) -> None:
        """`amount` GPU-equivalents used by this team (`team`) on a GPU of `owner_name`. Use
        outside its silo is borrowing only beyond its pool guarantees (settled at the end, as
        `gpuops tenants` does over a window); pool GPUs are shared, not lent."""
        self.used += amount
        if team != owner_name or pooled:
            self.outside += amount
        if team != owner_name and not pooled:
            owner.lent += amount


def weights(processes: Sequence[GpuProcess], tenants: Sequence[str]) -> dict[str, float]:
    """Each tenant's share of a GPU (or slice): by the memory its processes hold, else equal."""
    held: dict[str, int] = {}
    for p, t in zip(processes, tenants, strict=True):
        held[t] = held.get(t, 0) + (as_int(p.used_memory_bytes) or 0)
    total = sum(held.values())
    if total > 0:
        return {t: m / total for t, m in held.items()}
    return {t: 1.0 / len(held) for t in held}


def process_memory(processes: Sequence[GpuProcess], fallback: int | None) -> list[int]:
    """Memory per process; where NVML did not say, an equal share of what the device holds."""
    known = [as_int(p.used_memory_bytes) for p in processes]
    if all(k is not None for k in known):
        return [k or 0 for k in known]
    share = (fallback or 0) // max(1, len(processes))
    return [k if k is not None else share for k in known]


class TeamAccs(dict[str, TeamAcc]):
    """TeamAccs by team (or pool) name; a name not there yet gets a new one."""

    def __missing__(self, name: str) -> TeamAcc:
        acc = self[name] = TeamAcc()
        return acc


class _Layout:
    """A MIG layout's instances as the views read them, worked out once per layout: (id, share of
    the GPU, memory) in the layout's order (the tenants'), the order of their first slices (the
    cells'; None where it is the same), the shares' sum as the tenants add it, and how many cells
    the layout makes."""

    __slots__ = ("allocated", "cells", "instances", "mig", "model", "order")

    def __init__(self, gpu: Gpu) -> None:
        mig = gpu.mig
        assert mig is not None
        self.mig = mig
        self.model = gpu.info.mig_model
        listed = mig.gpu_instances
        self.instances = tuple((gi.id, instance_fraction(gpu, gi), gi.memory_total_bytes) for gi in listed)
        allocated = 0.0
        for _, fraction, _ in self.instances:
            allocated += fraction
        self.allocated = allocated
        order = sorted(range(len(listed)), key=lambda k: listed[k].start)
        self.order: list[int] | None = None if order == list(range(len(listed))) else order
        used = 0.0  # in the cells' order
        for k in order:
            used += self.instances[k][1]
        # a MIG GPU without instances is one EMPTY_MIG cell; free capacity over 1% one FREE cell
        self.cells = len(order) + (1 if round(1.0 - used, 6) > 0.01 else 0) if order else 1

    @staticmethod
    def kept(layout: _Layout | None, gpu: Gpu, mig: MigState) -> _Layout:
        """`layout` (the GPU's in the node's previous view) while the GPU's layout is the same,
        else the new one worked out."""
        if (
            layout is not None
            and (layout.mig is mig or layout.mig == mig)
            and layout.model == gpu.info.mig_model
        ):
            return layout
        return _Layout(gpu)


_MODELS: dict[str, str] = {}  # short_model's answers by GPU name


class NodeFigures(NamedTuple):
    """A node row's figures, summed by the fused pass (`NodeFacts.row`) in the order the full
    row adds them (`views.nodes.node_row`), so equal to its figures to the last digit."""

    models: str  # "2x A100-80GB, 6x H100-80GB": the GPUs per short model name
    owners: frozenset[str | None]  # the GPUs' owners (None: nobody's)
    processes: int
    memory_used: int  # bytes
    memory_total: int  # bytes
    cells: int  # the grid's cells: a whole or lost GPU one, a MIG GPU its slices (`_Layout.cells`)
    busy: float  # GPU-equivalents busy (0 without a sample)
    held: float  # GPU-equivalents held idle (0 without a sample)
    util_sum: float  # utilization times its weight (GPU-equivalents), over what reports one
    util_weight: float


_NO_FIGURES = NodeFigures("", frozenset(), 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)
_new_tuple = tuple.__new__


class NodeFacts:
    """One pass over a node view's GPUs for one ownership, summed per node: the node row's figures
    (`row`: what `views.nodes.lazy_node_row` needs, in the order the full row adds them), each
    team's and pool's share of the tenants' figures (`teams`, `pools`: `TeamAcc`s that
    `tenant_rows` adds up per node), and what is needed to remake the per-GPU pass (`passes`)
    for the rows whose cells are drawn. Kept on the ownership's `derived` memo by node name while
    the view is the same object; a new view of the node reuses the owners and pools of GPUs with
    the same identity, the tenants of GPUs whose processes are the same objects (built-in
    attribution only) and the MIG layouts that are equal."""

    __slots__ = (
        "_pass",
        "gpus",
        "indexes",
        "layouts",
        "placed",
        "places",
        "points",
        "pools",
        "row",
        "teams",
        "tenants",
        "view",
    )

    def __init__(
        self,
        view: NodeView,
        gpus: Sequence[Gpu],
        places: dict[tuple[object, ...], tuple[str | None, str | None]],
        layouts: dict[int, _Layout],
    ) -> None:
        self.view = view
        self.gpus = gpus
        self.placed: list[tuple[str | None, str | None]] = []  # each GPU's (owner, pool)
        self.tenants: list[tuple[str, ...]] = []
        self.places = places  # (owner, pool) by (index, uuid, name, the GPU's owner)
        self.layouts = layouts  # the MIG GPUs' by index
        self.teams = TeamAccs()
        self.pools = TeamAccs()
        self.row = _NO_FIGURES
        self._pass: NodePass | None = None
        # each GPU's point for its history (views.gpu_history.gpu_point, NaN for None), flat
        self.points: list[float] = []
        self.indexes: tuple[int, ...] = ()  # the GPUs' indexes, in their order

    @property
    def history(self) -> tuple[tuple[int, ...], list[float]]:
        """The GPUs' indexes and points, for `views.gpu_history.GpuHistory.update`."""
        return self.indexes, self.points

    def passes(self) -> NodePass:
        """The per-GPU pass (`GpuPass`es) of the node, made on first use (cells to draw)."""
        made = self._pass
        if made is None:
            view = self.view
            made = self._pass = NodePass(
                view,
                [
                    GpuPass(gpu, owner, pool, tenants, gpu_lost(gpu))
                    for gpu, (owner, pool), tenants in zip(self.gpus, self.placed, self.tenants, strict=True)
                ],
            )
        return made


def node_facts(view: NodeView, ownership: Ownership) -> NodeFacts:
    """The fused pass over `view`'s GPUs (made once per view object and ownership)."""
    memo = ownership.derived
    old = memo.get(view.name)
    if isinstance(old, NodeFacts):
        if old.view is view:
            return old
    else:
        old = None
    facts = _node_facts(view, ownership, old)
    memo[view.name] = facts
    return facts


class _Sums:
    """The node row's figures that the pass adds GPU by GPU and slice by slice, in the order the
    full row adds them (`row` makes them a `NodeFigures`)."""

    __slots__ = ("busy", "held", "memory_used", "util_sum", "util_weight")

    def __init__(self) -> None:
        self.memory_used = 0
        self.busy = self.held = self.util_sum = self.util_weight = 0.0

    def row(
        self,
        models: str,
        owners: set[str | None],
        processes: int,
        memory_total: int,
        cells: int,
        sampled: bool,
    ) -> NodeFigures:
        # NodeFigures(...) without its Python-level __new__ (as namedtuple's _make): every node,
        # every update
        return _new_tuple(
            NodeFigures,
            (
                models,
                frozenset(owners),
                processes,
                self.memory_used,
                memory_total,
                cells,
                round(self.busy, 6) if sampled else 0.0,
                round(self.held, 6) if sampled else 0.0,
                self.util_sum,
                self.util_weight,
            ),
        )


def _models(gpus: Sequence[Gpu], old: NodeFacts | None) -> str:
    """'2x A100-80GB, 6x H100-80GB': the GPUs by short model name; the previous view's text while
    the GPUs are the same objects (a new sample keeps what did not change: core.codec.from_delta)."""
    if old is not None and len(old.gpus) == len(gpus):
        for before, now in zip(old.gpus, gpus, strict=True):
            if before.info is not now.info:
                break
        else:
            return old.row.models
    names: dict[str, int] = {}  # GPUs by model name
    for gpu in gpus:
        gpu_name = gpu.info.name
        names[gpu_name] = names.get(gpu_name, 0) + 1
    models: dict[str, int] = {}
    for gpu_name, n in names.items():
        model = _MODELS.get(gpu_name)
        if model is None:
            model = _MODELS[gpu_name] = short_model(gpu_name)
        models[model] = models.get(model, 0) + n
    return ", ".join(f"{n}x {m}" for m, n in sorted(models.items()))


def _node_facts(view: NodeView, ownership: Ownership, old: NodeFacts | None) -> NodeFacts:
    """The pass itself, GPU by GPU in the node's order: where the GPU is (owner, pool) and whose
    its processes are (reusing `old`'s where they cannot have changed), what its owner and its
    pool count of it, then its figures: `_mig_gpu` slice by slice, or `_whole_gpu`. The per-GPU
    steps stay inline here (not functions) because they run for every GPU of every update."""
    gpus = view_gpus(view)
    sampled = view.sample is not None
    current = sampled and view.state in (LIVE, STALE)
    # What a new view of the node may reuse: where each GPU's owner and pool came from (they
    # depend on the GPU's identity and the node's owner only), the tenants of the same process
    # objects, MIG layouts.
    reuse = old is not None and old.view.owner == view.owner
    places = old.places if old is not None and reuse else {}
    layouts = old.layouts if old is not None else {}
    old_gpus: Sequence[Gpu] = old.gpus if old is not None and ownership.stable_attribution else ()
    old_placed = old.placed if old is not None else []
    same_place: Sequence[Gpu] = old.gpus if old is not None and reuse else ()  # places to reuse
    old_tenants = old.tenants if old is not None else []
    new_layouts: dict[int, _Layout] = {}
    facts = NodeFacts(view, gpus, places, new_layouts)
    placed = facts.placed
    tenants_list = facts.tenants
    teams = facts.teams
    pools = facts.pools
    tenant = ownership.tenant
    sums = _Sums()
    points = facts.points
    owners: set[str | None] = set()
    processes_n = mem_total = cells = 0
    index_list: list[int] = []
    for i, gpu in enumerate(gpus):
        info = gpu.info
        index = info.index
        index_list.append(index)
        # where it is: its owner and pool
        if i < len(same_place) and same_place[i].info is info and same_place[i].owner == gpu.owner:
            place = old_placed[i]  # the same GPU as at the last sample, the node's owner unchanged
        else:
            key = (index, info.uuid, info.name, gpu.owner)
            known = places.get(key)
            if known is None:
                known = places[key] = (ownership.owner(view, gpu), ownership.pool(view, gpu))
            place = known
        owner, pool = place
        placed.append(place)
        owners.add(owner)
        # whose its processes are
        processes = gpu.processes
        nproc = len(processes)
        s = gpu.sample
        lost = s is not None and type(s.memory_total_bytes) is not int and gpu_lost(gpu)
        if not processes or lost:
            tenants: tuple[str, ...] = ()
        elif (
            i < len(old_gpus)
            and old_gpus[i].processes is processes
            and old_placed[i][0] == owner
            and old_gpus[i].info.index == index
        ):
            tenants = old_tenants[i]
        elif nproc == 1:
            tenants = (tenant(processes[0], owner)[0],)
        else:
            tenants = tuple([tenant(p, owner)[0] for p in processes])
        tenants_list.append(tenants)
        raw = info.memory_total_bytes
        total = (raw if type(raw) is int else as_int(raw)) or 0
        mem_total += total
        processes_n += nproc
        # the tenants' side: whose GPU it is and who answers for its capacity
        owner_name = owner or UNOWNED
        o = teams[owner_name]
        o.owned += 1
        o.memory_owned += total
        if pool is None:
            c = o
        else:
            c = pools[pool]
            c.owned += 1
            c.memory_owned += total
        c.silo += 1
        if not current:
            c.unknown += 1
        elif lost:
            c.idle += 1.0
            c.waste += 1.0
        mig = gpu.mig
        if mig is not None and mig.current:
            layout = new_layouts[index] = _Layout.kept(layouts.get(index), gpu, mig)
            cells += 1 if lost else layout.cells  # a lost GPU is one LOST cell (cells_of)
            usage = current and not lost
            _mig_gpu(
                gpu, layout, tenants, lost, usage, o, owner_name, pool is not None, c, teams, sums, points
            )
        else:
            cells += 1
            _whole_gpu(gpu, tenants, lost, current, o, owner_name, pool, c, teams, sums, points)
    facts.indexes = tuple(index_list)
    facts.row = sums.row(_models(gpus, old), owners, processes_n, mem_total, cells, sampled)
    return facts


def _mig_gpu(
    gpu: Gpu,
    layout: _Layout,
    tenants: tuple[str, ...],
    lost: bool,
    usage: bool,
    o: TeamAcc,
    owner_name: str,
    pooled: bool,
    c: TeamAcc,
    teams: TeamAccs,
    sums: _Sums,
    points: list[float],
) -> None:
    """A GPU in MIG mode, slice by slice in its layout's order: each slice's state and
    utilization added to the node's row in the cells' order (by first slice), its capacity and
    use to the teams (`usage`: the node is current and the GPU not lost), and the GPU's history
    point (its utilization: the slices' where NVML gives none for the whole GPU)."""
    s = gpu.sample
    processes = gpu.processes
    if s is not None:
        sums.memory_used += as_int(s.memory_used_bytes) or 0
    samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
    on: dict[int | None, list[int]] = {}  # processes by GPU instance, by position
    for k, p in enumerate(processes):
        gi_id = p.gpu_instance_id
        found = on.get(gi_id)
        if found is None:
            on[gi_id] = [k]
        else:
            found.append(k)
    order = layout.order
    figures: list[tuple[float, str, float | None]] = []  # the cells' figures, layout order
    slices_util = slices_weight = 0.0  # the GPU's utilization for its history, as gpu_point
    for gi_id, fraction, gi_memory in layout.instances:
        sample = samples.get(gi_id)
        procs: Sequence[int] = on.get(gi_id, ())
        on_it = len(procs)
        # as_int, as_float, percent_of and capacity_state (busy: core's is_busy), inline:
        # every MIG slice
        if sample is None:
            util = memory = memory_t = None
            used_b = None
        else:
            raw_used = sample.memory_used_bytes
            used_b = raw_used if type(raw_used) is int else as_int(raw_used)
            raw_total = sample.memory_total_bytes
            total_b = raw_total if type(raw_total) is int else as_int(raw_total)
            raw_util = sample.sm_utilization_percent
            util = raw_util if type(raw_util) is float else as_float(raw_util)
            size: int | None = total_b or gi_memory
            if type(size) is not int:
                size = as_int(size)
            memory = None if used_b is None or size is None or size <= 0 else 100.0 * used_b / size
            memory_t = memory if total_b else None  # the tenants read the sample's alone
        if util is not None:
            slices_util += util * fraction
            slices_weight += fraction
        if is_busy(util, on_it):
            state = BUSY
        elif on_it or (memory is not None and memory >= HELD_MEMORY_PERCENT):
            state = HELD
        else:
            state = FREE
        if lost:
            pass  # its LOST cell: not busy, not held, no utilization
        elif order is None:  # the cells' order: add the row's figures now
            if state == BUSY:
                sums.busy += fraction
            elif state == HELD:
                sums.held += fraction
            if util is not None:
                sums.util_sum += util * fraction
                sums.util_weight += fraction
        else:
            figures.append((fraction, state, util))
        if not usage:
            continue
        if memory_t is not memory:
            state = capacity_state(util, on_it, memory_t)
        if state != BUSY:
            c.idle += fraction
            if state == HELD:
                c.held += fraction
        if not on_it:
            c.waste += fraction
            continue
        _slice_usage(processes, procs, tenants, util, used_b, fraction, o, owner_name, pooled, c, teams)
    if order is not None and not lost:
        for k in order:
            fraction, state, util = figures[k]
            if state == BUSY:
                sums.busy += fraction
            elif state == HELD:
                sums.held += fraction
            if util is not None:
                sums.util_sum += util * fraction
                sums.util_weight += fraction
    if usage:
        free = max(0.0, 1.0 - layout.allocated)
        c.idle += free
        c.waste += free
    if s is None:
        points += (nan, nan, nan, nan)
        return
    whole = as_float(s.utilization_gpu_percent)
    if whole is None and slices_weight > 0:
        whole = slices_util / slices_weight
    memory = percent_of(s.memory_used_bytes, s.memory_total_bytes)
    power = as_float(s.power_watts)
    temperature = as_float(s.temperature_celsius)
    points += (
        nan if whole is None else whole,
        nan if memory is None else memory,
        nan if power is None else power,
        nan if temperature is None else temperature,
    )


def _slice_usage(
    processes: Sequence[GpuProcess],
    procs: Sequence[int],
    tenants: tuple[str, ...],
    util: float | None,
    used: int | None,
    fraction: float,
    o: TeamAcc,
    owner_name: str,
    pooled: bool,
    c: TeamAcc,
    teams: TeamAccs,
) -> None:
    """A MIG slice's use by the tenants of its processes (`procs`: their positions in the GPU's
    list): its memory, its share of the GPU (`fraction`) and its GPU-time: the slice's SM
    utilization where GPM gives it, else all of it (a process holds it and NVML says nothing
    more); `c` answers for the time not used."""
    fraction_busy = busy_fraction(util)
    busy_time = 1.0 if fraction_busy is None else fraction_busy
    c.waste += fraction * (1.0 - busy_time)
    if len(procs) == 1:  # one process: all the slice's use (process_memory, weights: 1.0)
        k = procs[0]
        t = tenants[k]
        a = teams[t]
        raw_m = processes[k].used_memory_bytes
        m = raw_m if type(raw_m) is int else as_int(raw_m)
        a.memory_used += (used or 0) if m is None else m
        a.processes += 1
        a.use(t, o, owner_name, pooled, fraction)
        a.steps.append(fraction * busy_time)
        return
    on_slice = [processes[k] for k in procs]
    slice_tenants = [tenants[k] for k in procs]
    for t, m in zip(slice_tenants, process_memory(on_slice, used), strict=True):
        a = teams[t]
        a.memory_used += m
        a.processes += 1
    for t, w in weights(on_slice, slice_tenants).items():
        a = teams[t]
        a.use(t, o, owner_name, pooled, fraction * w)
        a.steps.append(fraction * w * busy_time)


def _whole_gpu(
    gpu: Gpu,
    tenants: tuple[str, ...],
    lost: bool,
    current: bool,
    o: TeamAcc,
    owner_name: str,
    pool: str | None,
    c: TeamAcc,
    teams: TeamAccs,
    sums: _Sums,
    points: list[float],
) -> None:
    """A GPU not in MIG mode (one cell): its figures and state added to the node's row and its
    history point, its capacity and use to the teams (the node current, the GPU not lost)."""
    s = gpu.sample
    if s is None:
        points += (nan, nan, nan, nan)
        if current and not lost:
            c.capacity(FREE, 1.0)
            _whole_usage(tenants, gpu, None, None, o, owner_name, pool is not None, c, teams)
        return
    raw = s.memory_used_bytes
    used: int | None = raw if type(raw) is int else as_int(raw)
    sums.memory_used += used or 0
    raw_util = s.utilization_gpu_percent
    util = raw_util if type(raw_util) is float else as_float(raw_util)
    raw = s.memory_total_bytes
    total_s: int | None = raw if type(raw) is int else as_int(raw)
    memory = None if used is None or total_s is None or total_s <= 0 else 100.0 * used / total_s
    raw_power = s.power_watts
    power = raw_power if type(raw_power) is float else as_float(raw_power)
    raw_temperature = s.temperature_celsius
    temperature = raw_temperature if type(raw_temperature) is float else as_float(raw_temperature)
    points += (
        nan if util is None else util,
        nan if memory is None else memory,
        nan if power is None else power,
        nan if temperature is None else temperature,
    )
    if lost:
        return  # a LOST cell: not busy, not held, no utilization
    # capacity_state (busy: core's is_busy) and TeamAcc.capacity, inline: every whole GPU,
    # every update
    nproc = len(gpu.processes)
    if is_busy(util, nproc):
        sums.busy += 1.0
    elif nproc or (memory is not None and memory >= HELD_MEMORY_PERCENT):
        sums.held += 1.0
        if current:
            c.idle += 1.0
            c.held += 1.0
    elif current:
        c.idle += 1.0
    if util is not None:
        sums.util_sum += util * 1.0
        sums.util_weight += 1.0
    if not current:
        return
    if nproc == 1 and len(tenants) == 1:  # the usual GPU: one process, all its use (weights: 1.0)
        t = tenants[0]
        a = teams[t]
        raw_m = gpu.processes[0].used_memory_bytes
        m = raw_m if type(raw_m) is int else as_int(raw_m)
        a.memory_used += (used or 0) if m is None else m  # process_memory
        a.processes += 1
        fraction_busy = busy_fraction(util)
        busy_time = 1.0 if fraction_busy is None else fraction_busy
        # TeamAcc.use, inline
        a.used += 1.0
        if t != owner_name:
            a.outside += 1.0
            if pool is None:
                o.lent += 1.0
        elif pool is not None:
            a.outside += 1.0
        a.steps.append(busy_time * 1.0)
        c.waste += 1.0 - busy_time
    else:
        _whole_usage(tenants, gpu, util, used, o, owner_name, pool is not None, c, teams)


def _whole_usage(
    tenants: tuple[str, ...],
    gpu: Gpu,
    util: float | None,
    memory_used: int | None,
    o: TeamAcc,
    owner: str,
    pooled: bool,
    c: TeamAcc,
    teams: TeamAccs,
) -> None:
    """A whole GPU's use by its processes' tenants (`c` answers for its capacity)."""
    fraction = busy_fraction(util)
    busy_time = 1.0 if fraction is None else fraction  # a process holds it, no figure says more
    if len(tenants) == 1:  # the usual GPU: one process, all its use (weights: 1.0)
        (t,) = tenants
        a = teams[t]
        m = as_int(gpu.processes[0].used_memory_bytes)
        a.memory_used += (memory_used or 0) if m is None else m  # process_memory
        a.processes += 1
        a.use(t, o, owner, pooled, 1.0)
        a.steps.append(busy_time * 1.0)
        c.waste += 1.0 - busy_time
        return
    if tenants:
        for t, m in zip(tenants, process_memory(gpu.processes, memory_used), strict=True):
            a = teams[t]
            a.memory_used += m
            a.processes += 1
        for t, w in weights(gpu.processes, tenants).items():
            a = teams[t]
            a.use(t, o, owner, pooled, w)
            a.steps.append(busy_time * w)
        c.waste += 1.0 - busy_time
    elif fraction is not None and is_busy(util, 0):
        # Busy with processes we cannot see (no permission to list them): the owner's.
        o.used += 1.0
        o.steps.append(fraction)
        c.waste += 1.0 - fraction
    else:
        c.waste += 1.0 - (fraction or 0.0)
