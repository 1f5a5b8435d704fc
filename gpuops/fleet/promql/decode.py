"""Series as Prometheus holds them (docs/metrics.md) -> the model the SSH source gives: per node a
`Node` inventory and a `NodeSample`, so that every view model works on either source unchanged.

What the exporters do not say is marked, never invented: a figure without a series is
`NotAvailable("NO_SERIES")`; a node without per-process series (`--process-metrics` off) has
GPUs with `processes_error = "NO_PROCESS_SERIES"` (shown as n/a, as when NVML refuses the list);
a MIG GPU instance's placement is not exported, so its first memory slice is the first free one
its profile allows, in instance-id order (the slice map may differ from the node's, the figures
do not).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuops.core import metric_schema as schema
from gpuops.core.mig.catalog import GpuInstanceProfile, MigModel, find_model
from gpuops.core.model import (
    ComputeInstance,
    FloatMetric,
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    IntMetric,
    MigInstanceSample,
    MigState,
    Node,
    NodeSample,
    NotAvailable,
)
from gpuops.fleet.promql.client import Series

MIB = 1024 * 1024
NO_SERIES = NotAvailable("NO_SERIES")
NO_PROCESS_SERIES = "NO_PROCESS_SERIES"
LIMITER_SOURCE = "limiter"  # as the node's limiter tagger names where a process's tenant came from

# The live figures of a fleet, as one instant query: a handful of queries per refresh however
# many nodes there are (the answer grows with the GPUs, the number of requests does not). The
# names are the schema's (core/metric_schema.py), as the exporters write them.
NODE_METRICS = tuple(
    m.name
    for m in (
        schema.NODE_UP,
        schema.NODE_SAMPLE_TIMESTAMP,
        schema.GPU_INFO,
        schema.GPU_UTILIZATION,
        schema.GPU_MEMORY_USED,
        schema.GPU_MEMORY_TOTAL,
        schema.GPU_POWER,
        schema.GPU_TEMPERATURE,
        schema.MIG_MEMORY_USED,
        schema.MIG_UTILIZATION,
        schema.PROCESS_MEMORY_USED,
        schema.PROCESS_SERIES_LIMIT,
    )
)


def live_query(selector: str = "") -> str:
    """The instant query for every node's figures; `selector` adds matchers (`job="gpuops"`)."""
    names = "|".join(NODE_METRICS)
    extra = f", {selector}" if selector else ""
    return f'{{__name__=~"{names}"{extra}}}'


def node_of(labels: Mapping[str, str]) -> str:
    """The node a series is of: `node` (fleet.yaml's name, or the host name), else `Hostname`."""
    return labels.get("node") or labels.get("Hostname") or ""


@dataclass
class _GpuSeries:
    info: Mapping[str, str] | None = None
    values: dict[str, float] = field(default_factory=dict)
    mig: dict[int, tuple[str, float]] = field(default_factory=dict)  # GI id -> (profile, memory used)
    mig_util: dict[int, float] = field(default_factory=dict)  # GI id -> SM utilization, 0..1 (GPM)
    processes: list[Mapping[str, str]] = field(default_factory=list)
    process_memory: list[float] = field(default_factory=list)
    team: str = ""


@dataclass
class NodeSeries:
    """One node's series from one scrape target (an `instance` of a `job`)."""

    node: str
    instance: str
    job: str
    hostname: str = ""
    up: float | None = None  # gpuops_node_up (schema.NODE_UP)
    state: str = ""  # the fleet exporter's state and reason labels on gpuops_node_up
    reason: str = ""
    sampled: float | None = None  # gpuops_node_sample_timestamp_seconds: when the node sampled
    process_limit: float | None = None
    driver: str = ""
    gpus: dict[int, _GpuSeries] = field(default_factory=dict)

    def gpu(self, labels: Mapping[str, str]) -> _GpuSeries | None:
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            return None
        found = self.gpus.get(index)
        if found is None:
            found = self.gpus[index] = _GpuSeries()
        return found


_GPU_VALUES = {
    schema.GPU_UTILIZATION.name: "util",
    schema.GPU_MEMORY_USED.name: "used",
    schema.GPU_MEMORY_TOTAL.name: "total",
    schema.GPU_POWER.name: "power",
    schema.GPU_TEMPERATURE.name: "temp",
}
_UP = schema.NODE_UP.name
_SAMPLED = schema.NODE_SAMPLE_TIMESTAMP.name
_PROCESS_LIMIT = schema.PROCESS_SERIES_LIMIT.name
_INFO = schema.GPU_INFO.name
_MIG_USED = schema.MIG_MEMORY_USED.name
_MIG_UTIL = schema.MIG_UTILIZATION.name
_PROCESS_MEMORY = schema.PROCESS_MEMORY_USED.name


def group_series(series: Iterable[Series]) -> dict[str, NodeSeries]:
    """The live query's answer by node. A node exported by two targets (its own exporter and the
    fleet exporter) is taken from the one whose sample is newest, never mixed."""
    by_target: dict[tuple[str, str, str], NodeSeries] = {}
    for s in series:
        labels = s.labels
        node = node_of(labels)
        if not node:
            continue
        key = (node, labels.get("instance", ""), labels.get("job", ""))
        ns = by_target.get(key)
        if ns is None:
            ns = by_target[key] = NodeSeries(node, key[1], key[2])
        name = labels.get("__name__", "")
        if labels.get("Hostname"):
            ns.hostname = labels["Hostname"]
        if name == _UP:
            ns.up = s.value
            ns.state, ns.reason = labels.get("state", ""), labels.get("reason", "")
        elif name == _SAMPLED:
            ns.sampled = s.value
        elif name == _PROCESS_LIMIT:
            ns.process_limit = s.value
        else:
            gpu = ns.gpu(labels)
            if gpu is None:
                continue
            if labels.get("team"):
                gpu.team = labels["team"]
            if name == _INFO:
                gpu.info = labels
                ns.driver = labels.get("driver_version", "") or ns.driver
            elif name in _GPU_VALUES:
                gpu.values[_GPU_VALUES[name]] = s.value
            elif name == _MIG_USED:
                try:
                    gpu.mig[int(labels.get("GPU_I_ID", ""))] = (labels.get("GPU_I_PROFILE", ""), s.value)
                except ValueError:
                    continue
            elif name == _MIG_UTIL:
                try:
                    gpu.mig_util[int(labels.get("GPU_I_ID", ""))] = s.value
                except ValueError:
                    continue
            elif name == _PROCESS_MEMORY:
                gpu.processes.append(labels)
                gpu.process_memory.append(s.value)
    chosen: dict[str, NodeSeries] = {}
    for ns in by_target.values():
        best = chosen.get(ns.node)
        if best is None or (ns.sampled or 0.0) > (best.sampled or 0.0):
            chosen[ns.node] = ns
    return chosen


def _int_metric(value: float | None) -> IntMetric:
    return NO_SERIES if value is None else round(value)


def _float_metric(value: float | None, scale: float = 1.0) -> FloatMetric:
    return NO_SERIES if value is None else round(value * scale, 6)


def _place(model: MigModel | None, instances: list[tuple[int, GpuInstanceProfile]]) -> dict[int, int]:
    """GI id -> first memory slice: the first allowed placement not yet taken, by GI id."""
    taken: set[int] = set()
    starts: dict[int, int] = {}
    for gi_id, profile in sorted(instances):
        for start in profile.placements:
            cover = set(profile.covers(start))
            if not cover & taken:
                taken |= cover
                starts[gi_id] = start
                break
        else:
            starts[gi_id] = 0
    return starts


def _mig(
    gs: _GpuSeries, model: MigModel | None, enabled: bool
) -> tuple[MigState, tuple[MigInstanceSample, ...]]:
    known: list[tuple[int, GpuInstanceProfile]] = []
    for gi_id, (profile_name, _used) in gs.mig.items():
        profile = model.find_profile(profile_name) if model is not None else None
        if profile is not None:
            known.append((gi_id, profile))
    starts = _place(model, known)
    instances = []
    samples = []
    for gi_id, profile in sorted(known, key=lambda item: item[0]):
        memory = profile.memory_mib * MIB
        ci = profile.default_compute_profile
        instances.append(
            GpuInstance(
                id=gi_id,
                profile_id=profile.id,
                profile_name=profile.name,
                start=starts[gi_id],
                size=profile.memory_slices,
                memory_total_bytes=memory,
                multiprocessor_count=profile.multiprocessor_count,
                compute_instances=(
                    ComputeInstance(0, ci.id, ci.name, 0, ci.slices, ci.multiprocessor_count),
                ),
            )
        )
        util = gs.mig_util.get(gi_id)
        samples.append(
            MigInstanceSample(
                gi_id,
                round(gs.mig[gi_id][1]),
                memory,
                # the same slice utilization the SSH source gives (GPM); absent where unsupported
                NotAvailable("NOT_SUPPORTED") if util is None else round(util * 100.0, 6),
            )
        )
    return MigState(enabled, enabled, tuple(instances)), tuple(samples)


def _processes(gs: _GpuSeries) -> tuple[GpuProcess, ...]:
    out = []
    for labels, memory in zip(gs.processes, gs.process_memory, strict=True):
        try:
            pid = int(labels.get("pid", ""))
        except ValueError:
            continue
        gi = labels.get("GPU_I_ID", "")
        tenant = labels.get("tenant") or None
        out.append(
            GpuProcess(
                pid=pid,
                used_memory_bytes=round(memory),
                user=labels.get("user", ""),
                gpu_instance_id=int(gi) if gi.isdigit() else None,
                tenant=tenant,
                tenant_source=LIMITER_SOURCE if tenant else "",
            )
        )
    out.sort(key=lambda p: p.pid)
    return tuple(out)


def decode_node(ns: NodeSeries) -> tuple[Node, NodeSample] | None:
    """The node's inventory and sample; None when no GPU of it has its `gpuops_gpu_info`."""
    if ns.sampled is None:
        return None
    inventory_gpus = []
    sample_gpus = []
    for index, gs in sorted(ns.gpus.items()):
        labels = gs.info
        if labels is None:
            continue
        name = labels.get("modelName", "")
        mode = labels.get("mig_mode", "")
        model = find_model(name) if mode else None
        total = gs.values.get("total")
        info = GpuInfo(
            index=index,
            uuid=labels.get("UUID", ""),
            name=name,
            pci_bus_id=labels.get("pci_bus_id", ""),
            pci_device_id=model.pci_device_ids[0] if model is not None and model.pci_device_ids else 0,
            memory_total_bytes=_int_metric(total),
            mig_capable=bool(mode),
            mig_model=model.key if model is not None else None,
            architecture=model.architecture if model is not None else "",
        )
        mig: MigState | None = None
        mig_samples: tuple[MigInstanceSample, ...] = ()
        if mode:
            mig, mig_samples = _mig(gs, model, mode == "enabled")
        owner = gs.team or None
        inventory_gpus.append(Gpu(info=info, mig=mig, owner=owner))
        v = gs.values
        sample = GpuSample(
            timestamp=ns.sampled,
            utilization_gpu_percent=_float_metric(v.get("util"), 100.0),
            utilization_memory_percent=NO_SERIES,
            memory_used_bytes=_int_metric(v.get("used")),
            memory_total_bytes=_int_metric(total),
            power_watts=_float_metric(v.get("power")),
            temperature_celsius=_float_metric(v.get("temp")),
            sm_clock_mhz=NO_SERIES,
            memory_clock_mhz=NO_SERIES,
        )
        sample_gpus.append(
            Gpu(
                info=info,
                mig=mig,
                sample=sample,
                mig_samples=mig_samples,
                processes=_processes(gs),
                processes_error="" if ns.process_limit is not None else NO_PROCESS_SERIES,
                owner=owner,
            )
        )
    hostname = ns.hostname or ns.node
    node = Node(hostname=hostname, backend="", driver_version=ns.driver, gpus=tuple(inventory_gpus))
    return node, NodeSample(hostname=hostname, timestamp=ns.sampled, gpus=tuple(sample_gpus))
