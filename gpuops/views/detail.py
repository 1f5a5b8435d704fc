"""The node and GPU detail screens: MIG slices drawn over memory, processes with their tenant."""

from __future__ import annotations

from dataclasses import dataclass

from gpuops.core.mig.catalog import find_model
from gpuops.core.model import Gpu
from gpuops.fleet.source import NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.common import as_int, percent_of


@dataclass(frozen=True)
class SliceSpan:
    """A MIG GPU instance drawn over the GPU's memory slices."""

    start: int
    size: int
    profile: str
    instance: int | None  # None: free slices
    compute: tuple[str, ...] = ()  # compute instance names
    memory: float | None = None  # percent used
    processes: int = 0
    tenants: tuple[str, ...] = ()


def mig_layout(gpu: Gpu, ownership: Ownership, view: NodeView) -> tuple[int, tuple[SliceSpan, ...]]:
    """(memory slices of the GPU, spans in slice order, free ranges included)."""
    if gpu.mig is None:
        return 0, ()
    model = find_model(gpu.info.mig_model) if gpu.info.mig_model else None
    count = model.memory_slice_count if model is not None else 8
    owner = ownership.owner(view, gpu)
    samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
    spans: list[SliceSpan] = []
    taken = [False] * count
    for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
        procs = [p for p in gpu.processes if p.gpu_instance_id == gi.id]
        sample = samples.get(gi.id)
        spans.append(
            SliceSpan(
                start=gi.start,
                size=gi.size,
                profile=gi.profile_name,
                instance=gi.id,
                compute=tuple(ci.name for ci in gi.compute_instances),
                memory=percent_of(sample.memory_used_bytes, sample.memory_total_bytes) if sample else None,
                processes=len(procs),
                tenants=tuple(sorted({ownership.tenant(p, owner)[0] for p in procs})),
            )
        )
        for s in range(gi.start, min(count, gi.start + gi.size)):
            taken[s] = True
    start = None
    for s in range(count + 1):
        free = s < count and not taken[s]
        if free and start is None:
            start = s
        elif not free and start is not None:
            spans.append(SliceSpan(start, s - start, "free", None))
            start = None
    return count, tuple(sorted(spans, key=lambda sp: sp.start))


@dataclass(frozen=True)
class ProcessRow:
    gpu: int
    pid: int
    user: str
    tenant: str
    tenant_source: str
    memory: int | None
    instance: int | None
    compute_instance: int | None
    command: str


def process_rows(
    view: NodeView, ownership: Ownership, gpu_index: int | None = None
) -> tuple[ProcessRow, ...]:
    """Processes of a node (or of one of its GPUs), with their tenant and where it came from."""
    out = []
    gpus = view.sample.gpus if view.sample else ()
    for gpu in gpus:
        if gpu_index is not None and gpu.info.index != gpu_index:
            continue
        owner = ownership.owner(view, gpu)
        for p in gpu.processes:
            tenant, source = ownership.tenant(p, owner)
            out.append(
                ProcessRow(
                    gpu=gpu.info.index,
                    pid=p.pid,
                    user=p.user,
                    tenant=tenant,
                    tenant_source=source,
                    memory=as_int(p.used_memory_bytes),
                    instance=p.gpu_instance_id,
                    compute_instance=p.compute_instance_id,
                    command=p.command,
                )
            )
    return tuple(out)


def find_gpu(view: NodeView, index: int) -> Gpu | None:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    return next((g for g in gpus if g.info.index == index), None)
