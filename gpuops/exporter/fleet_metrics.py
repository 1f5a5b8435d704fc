"""What the fleet exporter says about one fleet snapshot (docs/metrics.md), as a prometheus-client
custom collector (`FleetMetrics.collect`).

The figures are the ones the operator already sees: the snapshot is the SSH collector's (as
`gpuops status`, `discover` and the TUI take it); each GPU's `team` and `pool` are what
tenancy/ownership.py answers for the grid; the tenant figures are views/tenants.py's rows (the
TUI's tenants screen): per node by giving it that node alone, fleet-wide for what each team owns
and is guaranteed and what each pool holds. GPU figures are the node's sample as
`discover --json` prints it.

A node's GPU and tenant series are present while its data is current (live or stale, as the
views count it); an unreachable node keeps only `gpuops_node_up 0` with its reason, so no
dashboard shows an old figure as a current one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuops.core.dcgm import LABELS as DCGM_LABELS
from gpuops.core.dcgm import dcgm_families
from gpuops.core.model import Gpu
from gpuops.fleet.collector import LIVE, STALE, FleetSnapshot, NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.common import as_float, as_int
from gpuops.views.tenants import TenantRow, tenant_rows

# dcgm-exporter's labels (its dashboards and joins keep working), then gpuops' own.
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname", "node", "team", "pool")
MIG_LABELS = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "node",
    "team",
    "pool",
)
NODE_LABELS = ("node", "Hostname")
# The collector words a stale node's reason with its age ("no sample for 12s"): as a label value
# that would be a new series every second, so the exporter says it once; the age is
# time() - gpuops_node_sample_timestamp_seconds.
STALE_REASON = "no sample within 2 intervals"


def _gauge(name: str, what: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, what, labels=list(labels))


def _current(view: NodeView) -> bool:
    """As the views count it (views/tenants.py): data from a live or stale node."""
    return view.sample is not None and view.state in (LIVE, STALE)


def _hostname(view: NodeView) -> str:
    if view.sample is not None:
        return view.sample.hostname
    return view.inventory.hostname if view.inventory is not None else ""


class FleetMetrics:
    """The fleet's families at each scrape. `snapshot`: the collector's snapshot now (called once
    per scrape); `ownership`: fleet.yaml's teams, owners, pools and attribution chain."""

    def __init__(
        self, snapshot: Callable[[], FleetSnapshot], ownership: Ownership, dcgm_compat: bool = False
    ) -> None:
        self.snapshot = snapshot
        self.ownership = ownership
        self.dcgm_compat = dcgm_compat  # dcgm-exporter's names and units as well (core/dcgm.py)

    def collect(self) -> Iterator[Metric]:
        yield from self.families(self.snapshot())

    def families(self, snapshot: FleetSnapshot) -> list[Metric]:
        out: list[Metric] = [*self._node_families(snapshot)]
        out += self._gpu_families(snapshot)
        out.append(self._xid_family(snapshot))
        if self.dcgm_compat:
            out += self._dcgm_families(snapshot)
        out += self._tenant_families(snapshot)
        return out

    def _xid_family(self, snapshot: FleetSnapshot) -> Metric:
        """The XID counts each node's agent keeps (since it started listening), while the node's
        data is current."""
        fam = CounterMetricFamily(
            "gpuops_xid_errors",
            "XID critical errors NVML reported for a GPU since the node's agent started listening",
            labels=["gpu", "UUID", "Hostname", "node", "team", "pool", "xid"],
        )
        for view in snapshot.nodes:
            if not _current(view) or view.sample is None or view.sample.health is None:
                continue
            gpus = {gpu.info.index: gpu for gpu in view.sample.gpus}
            for count in view.sample.health.xid_counts:
                gpu = gpus.get(count.gpu)
                owner = (self.ownership.owner(view, gpu) or "") if gpu is not None else ""
                pool = (self.ownership.pool(view, gpu) or "") if gpu is not None else ""
                uuid = gpu.info.uuid if gpu is not None else ""
                labels = [str(count.gpu), uuid, view.sample.hostname, view.name, owner, pool, str(count.xid)]
                fam.add_metric(labels, float(count.count))
        return fam

    def _dcgm_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        out: dict[str, GaugeMetricFamily] = {}
        for view in snapshot.nodes:
            if not _current(view) or view.sample is None:
                continue
            for fam in dcgm_families(view.sample):
                metric = out.get(fam.name)
                if metric is None:
                    metric = out[fam.name] = _gauge(fam.name, fam.help, DCGM_LABELS)
                for labels, value in fam.samples:
                    metric.add_metric(list(labels), value)
        return list(out.values())

    # ---- nodes ---------------------------------------------------------------------------------

    def _node_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        up = _gauge(
            "gpuops_node_up",
            "1 when the node's agent streams samples, 0 when not; state and reason say why",
            (*NODE_LABELS, "state", "reason"),
        )
        taken = _gauge(
            "gpuops_node_sample_timestamp_seconds",
            "When the node took its latest sample (seconds since the epoch), while it is current",
            NODE_LABELS,
        )
        for view in snapshot.nodes:
            reason = STALE_REASON if view.state == STALE else view.reason
            host = _hostname(view)
            up.add_metric([view.name, host, view.state, reason], 1.0 if view.state == LIVE else 0.0)
            if _current(view):
                assert view.sample is not None
                taken.add_metric([view.name, host], view.sample.timestamp)
        return [up, taken]

    # ---- GPUs ----------------------------------------------------------------------------------

    def _gpu_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        info_f = _gauge(
            "gpuops_gpu_info",
            "One per GPU, value 1: driver version and MIG mode as labels",
            (*GPU_LABELS, "driver_version", "mig_mode"),
        )
        util = _gauge("gpuops_gpu_utilization_ratio", "GPU utilization as NVML reports it (0..1)", GPU_LABELS)
        used = _gauge("gpuops_gpu_memory_used_bytes", "GPU memory in use", GPU_LABELS)
        total = _gauge("gpuops_gpu_memory_total_bytes", "GPU memory in all", GPU_LABELS)
        power = _gauge("gpuops_gpu_power_watts", "Power draw", GPU_LABELS)
        temp = _gauge("gpuops_gpu_temperature_celsius", "GPU temperature", GPU_LABELS)
        mig_used = _gauge(
            "gpuops_mig_instance_memory_used_bytes", "Memory in use in a MIG GPU instance", MIG_LABELS
        )
        mig_util = _gauge(
            "gpuops_mig_instance_utilization_ratio",
            "SM utilization of a MIG GPU instance from NVML's GPM (0..1; Hopper and newer)",
            MIG_LABELS,
        )
        mig_procs = _gauge(
            "gpuops_mig_instance_processes",
            "Processes on a MIG GPU instance (a slice's busy evidence where NVML has no utilization)",
            MIG_LABELS,
        )
        for view in snapshot.nodes:
            if not _current(view):
                continue
            assert view.sample is not None
            host = view.sample.hostname
            driver = view.inventory.driver_version if view.inventory is not None else ""
            for gpu in view.sample.gpus:
                values = self._gpu_values(view, gpu, host)
                mode = "" if gpu.mig is None else "enabled" if gpu.mig.current else "disabled"
                info_f.add_metric([*values, driver, mode], 1.0)
                s = gpu.sample
                if s is not None:
                    ratio = as_float(s.utilization_gpu_percent)
                    if ratio is not None:  # NOT_SUPPORTED (MIG on) and friends: no series, never a 0
                        util.add_metric(values, round(ratio / 100.0, 9))
                    for fam, figure in (
                        (used, as_int(s.memory_used_bytes)),
                        (total, as_int(s.memory_total_bytes)),
                        (power, as_float(s.power_watts)),
                        (temp, as_float(s.temperature_celsius)),
                    ):
                        if figure is not None:
                            fam.add_metric(values, float(figure))
                profiles = {gi.id: gi.profile_name for gi in gpu.mig.gpu_instances} if gpu.mig else {}
                for mig in gpu.mig_samples:
                    mig_values = [
                        *values[:4],
                        profiles.get(mig.gpu_instance_id, ""),
                        str(mig.gpu_instance_id),
                        *values[5:],
                    ]
                    figure = as_int(mig.memory_used_bytes)
                    if figure is not None:
                        mig_used.add_metric(mig_values, float(figure))
                    ratio = as_float(mig.sm_utilization_percent)
                    if ratio is not None:  # NOT_SUPPORTED (Ampere), NO_DATA: no series
                        mig_util.add_metric(mig_values, round(ratio / 100.0, 9))
                if gpu.mig is not None and gpu.mig.current:
                    on = Counter(p.gpu_instance_id for p in gpu.processes)
                    for gi in gpu.mig.gpu_instances:
                        where = [*values[:4], gi.profile_name, str(gi.id), *values[5:]]
                        mig_procs.add_metric(where, float(on.get(gi.id, 0)))
        return [info_f, util, used, total, power, temp, mig_used, mig_util, mig_procs]

    def _gpu_values(self, view: NodeView, gpu: Gpu, host: str) -> list[str]:
        info = gpu.info
        return [
            str(info.index),
            info.uuid,
            f"nvidia{info.index}",
            info.name,
            info.pci_bus_id,
            host,
            view.name,
            self.ownership.owner(view, gpu) or "",
            self.ownership.pool(view, gpu) or "",
        ]

    # ---- tenants and pools ---------------------------------------------------------------------

    def _tenant_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        gpu_used = _gauge(
            "gpuops_tenant_gpu_used",
            "GPUs' worth of GPU time a team uses now on the node (utilization-weighted "
            "GPU-equivalents, as `gpuops tenants` counts used)",
            ("tenant", "node"),
        )
        memory = _gauge(
            "gpuops_tenant_memory_used_bytes",
            "GPU memory a team's processes hold on the node",
            ("tenant", "node"),
        )
        for view in snapshot.nodes:
            if not _current(view):
                continue
            alone = FleetSnapshot(snapshot.time, snapshot.interval, (view,))
            for row in tenant_rows(alone, self.ownership):
                if row.pool is None and (row.processes or row.gpu_time > 0 or row.memory_used):
                    gpu_used.add_metric([row.team, view.name], row.gpu_time)
                    memory.add_metric([row.team, view.name], float(row.memory_used))
        return [gpu_used, memory, *self._ownership_families(tenant_rows(snapshot, self.ownership))]

    def _ownership_families(self, rows: tuple[TenantRow, ...]) -> list[Metric]:
        owned = _gauge(
            "gpuops_tenant_owned_gpus",
            "GPUs a team owns (fleet.yaml), in its silo or in pools, among the GPUs seen",
            ("tenant",),
        )
        guaranteed = _gauge(
            "gpuops_tenant_guaranteed_gpus",
            "GPUs a team is guaranteed: its silo (pool empty) and its share of each pool's GPUs",
            ("tenant", "pool"),
        )
        pool_gpus = _gauge(
            "gpuops_pool_gpus", "GPUs in each pool of fleet.yaml, among the GPUs seen", ("pool",)
        )
        fleet = self.ownership.fleet
        declared = fleet.pools if fleet is not None else {}
        sizes = {r.pool: r.owned for r in rows if r.pool is not None}
        for name in sorted(set(declared) | set(sizes)):
            pool_gpus.add_metric([name], float(sizes.get(name, 0)))
        for row in rows:
            if row.pool is not None:
                continue
            owned.add_metric([row.team], float(row.owned))
            guaranteed.add_metric([row.team, ""], float(row.silo))
            for name, pool in declared.items():
                g = pool.guarantees.get(row.team)
                if g is not None:
                    guaranteed.add_metric([row.team, name], round(g.share / 100.0 * sizes.get(name, 0), 6))
        return [owned, guaranteed, pool_gpus]
