"""The grid's cells: one per GPU, per MIG GPU instance, and per MIG GPU's free capacity."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from gpuops.core.history import instance_fraction
from gpuops.core.model import Gpu, GpuProcess
from gpuops.fleet.source import NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.common import (
    BUSY,
    HELD,
    as_float,
    as_int,
    capacity_state,
    gpu_lost,
    percent_of,
    short_model,
)
from gpuops.views.gpus import GpuPass
from gpuops.views.partition import partition_label

# Cell kinds
GPU, SLICE, FREE, LOST, EMPTY_MIG = "gpu", "slice", "free", "lost", "mig"


class Cell(NamedTuple):
    """One GPU, or one MIG GPU instance, or the free capacity of a MIG GPU. (A named tuple: a
    thousand are made per update, several times faster than a frozen dataclass.)"""

    node: str
    gpu: int  # GPU index on the node
    kind: str  # gpu | slice | free | lost | mig (MIG mode with no instance)
    owner: str | None
    model: str  # short model name
    instance: int | None = None  # MIG GPU instance id
    profile: str = ""  # MIG profile ("3g.40gb"), an AMD GPU's partition modes ("CPX/NPS4"); else ""
    util: float | None = None  # percent (a slice's: its SMs, NVML's GPM); None where not reported
    memory: float | None = None  # percent of the GPU's (or slice's) memory in use
    memory_used: int | None = None
    memory_total: int | None = None
    busy: bool = False  # doing work (common.capacity_state)
    held: bool = False  # idle but holding processes or memory: looks taken, delivers nothing
    fraction: float = 1.0  # GPU-equivalents
    processes: int = 0
    tenants: tuple[str, ...] = ()  # teams with processes on it
    users: tuple[str, ...] = ()


def weighted_util(cells: Iterable[Cell]) -> float | None:
    """Mean utilization of the cells that report one, each counted by the share of a GPU it is: a
    3g slice at 90% and a 1g slice at 10% of a 7-slice GPU are 3/7 and 1/7 of it, so they make
    (3*90 + 1*10) / 4 = 70%, not the cells' plain mean of 50%. Free MIG capacity reports nothing
    (no instance, so no SM activity figure) and is not counted."""
    total = weight = 0.0
    for c in cells:
        if c.util is not None:
            total += c.util * c.fraction
            weight += c.fraction
    return total / weight if weight > 0 else None


def gpu_cells(view: NodeView, gpu: Gpu, ownership: Ownership) -> list[Cell]:
    """The cells of one GPU of a node view (the node rows take them from the shared pass:
    `views.gpus.node_pass`, `cells_of`)."""
    owner = ownership.owner(view, gpu)
    lost = gpu_lost(gpu)
    tenants = () if lost else tuple(ownership.tenant(p, owner)[0] for p in gpu.processes)
    return cells_of(view.name, GpuPass(gpu, owner, None, tenants, lost))


_tuple_new = tuple.__new__  # a Cell from all its fields at once: faster than Cell(...) with keywords


def cells_of(node: str, g: GpuPass) -> list[Cell]:
    """The cells of a GPU of `node`, as the shared pass saw it (owner, tenants, figures)."""
    gpu = g.gpu
    owner = g.owner
    model = short_model(gpu.info.name)
    index = gpu.info.index
    if g.lost:
        return [Cell(node, index, LOST, owner, model)]
    if g.mig:
        assert gpu.mig is not None
        cells: list[Cell] = []
        used = 0.0
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        on: dict[int | None, list[tuple[GpuProcess, str]]] = {}  # processes by GPU instance, in order
        for p, t in zip(gpu.processes, g.tenants, strict=True):
            on.setdefault(p.gpu_instance_id, []).append((p, t))
        for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
            procs = on.get(gi.id, ())
            fraction = instance_fraction(gpu, gi)
            used += fraction
            sample = samples.get(gi.id)
            mem_used = as_int(sample.memory_used_bytes) if sample else None
            mem_total = (as_int(sample.memory_total_bytes) if sample else None) or gi.memory_total_bytes
            util = as_float(sample.sm_utilization_percent) if sample else None
            memory = percent_of(mem_used, mem_total)
            state = capacity_state(util, len(procs), memory)
            fields: tuple[object, ...] = (
                node,
                index,
                SLICE,
                owner,
                model,
                gi.id,
                gi.profile_name,
                util,
                memory,
                mem_used,
                mem_total,
                state == BUSY,
                state == HELD,
                fraction,
                len(procs),
                tuple(sorted({t for _, t in procs})),
                tuple(sorted({p.user for p, _ in procs if p.user})),
            )
            cells.append(_tuple_new(Cell, fields))
        if not cells:
            return [Cell(node, index, EMPTY_MIG, owner, model)]
        free = round(1.0 - used, 6)
        if free > 0.01:
            cells.append(Cell(node, index, FREE, owner, model, profile="free", fraction=free))
        return cells
    s = gpu.sample
    modes = "" if gpu.partition is None else partition_label(gpu)
    if s is None:
        total = as_int(gpu.info.memory_total_bytes)
        return [Cell(node, index, GPU, owner, model, profile=modes, memory_total=total)]
    gpu_procs = gpu.processes
    count = len(gpu_procs)
    if count == 0:
        tenants: tuple[str, ...] = ()
        users: tuple[str, ...] = ()
    elif count == 1:
        tenants = g.tenants
        user = gpu_procs[0].user
        users = (user,) if user else ()
    else:
        tenants = tuple(sorted(set(g.tenants)))
        users = tuple(sorted({p.user for p in gpu_procs if p.user}))
    state = g.state
    # The fields in Cell's order: node, gpu, kind, owner, model, instance, profile, util, memory,
    # memory_used, memory_total, busy, held, fraction, processes, tenants, users.
    fields = (
        node,
        index,
        GPU,
        owner,
        model,
        None,
        modes,
        g.util,
        g.memory,
        g.memory_used,
        g.memory_total,
        state == BUSY,
        state == HELD,
        1.0,
        count,
        tenants,
        users,
    )
    return [_tuple_new(Cell, fields)]
