"""What the fleet exporter says about one fleet snapshot (docs/metrics.md), as a prometheus-client
custom collector (`FleetMetrics.collect`).

Names, types, help and labels are the rows of core/metric_schema.py (`_family`): the node
exporter's, with `team`, `pool`, `state` and `reason` as well. The figures are the ones the
operator already sees: the snapshot is the SSH collector's (as `gpuops status`, `discover` and
the TUI take it); each GPU's `team` and `pool` are what
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

from gpuops.core import metric_schema as schema
from gpuops.core.dcgm import dcgm_families
from gpuops.core.model import Gpu
from gpuops.fleet.source import LIVE, STALE, FleetSnapshot, NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.common import as_float, as_int
from gpuops.views.tenants import TenantRow, tenant_rows

# The collector words a stale node's reason with its age ("no sample for 12s"): as a label value
# that would be a new series every second, so the exporter says it once; the age is
# time() - gpuops_node_sample_timestamp_seconds.
STALE_REASON = "no sample within 2 intervals"


_Family = GaugeMetricFamily | CounterMetricFamily


def _family(metric: schema.Metric) -> _Family:
    """An empty family of a schema row, with every label of the row (the fleet exporter's)."""
    kind = CounterMetricFamily if metric.type == schema.COUNTER else GaugeMetricFamily
    return kind(metric.name, metric.help, labels=list(metric.labels_for(schema.FLEET)))


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
        fam = _family(schema.XID_ERRORS)
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
        out: dict[str, _Family] = {}
        for view in snapshot.nodes:
            if not _current(view) or view.sample is None:
                continue
            for fam in dcgm_families(view.sample):
                metric = out.get(fam.metric.name)
                if metric is None:
                    metric = out[fam.metric.name] = _family(fam.metric)
                for labels, value in fam.samples:
                    metric.add_metric(list(labels), value)
        return list(out.values())

    # ---- nodes ---------------------------------------------------------------------------------

    def _node_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        up = _family(schema.NODE_UP)
        taken = _family(schema.NODE_SAMPLE_TIMESTAMP)  # while the node's data is current
        for view in snapshot.nodes:
            reason = STALE_REASON if view.state == STALE else view.reason
            host = _hostname(view)
            up.add_metric([host, view.name, view.state, reason], 1.0 if view.state == LIVE else 0.0)
            if _current(view):
                assert view.sample is not None
                taken.add_metric([host, view.name], view.sample.timestamp)
        return [up, taken]

    # ---- GPUs ----------------------------------------------------------------------------------

    def _gpu_families(self, snapshot: FleetSnapshot) -> list[Metric]:
        info_f = _family(schema.GPU_INFO)
        util = _family(schema.GPU_UTILIZATION)
        used = _family(schema.GPU_MEMORY_USED)
        total = _family(schema.GPU_MEMORY_TOTAL)
        power = _family(schema.GPU_POWER)
        temp = _family(schema.GPU_TEMPERATURE)
        mig_used = _family(schema.MIG_MEMORY_USED)
        mig_util = _family(schema.MIG_UTILIZATION)
        mig_procs = _family(schema.MIG_PROCESSES)
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
        gpu_used = _family(schema.TENANT_GPU_USED)
        memory = _family(schema.TENANT_MEMORY_USED)
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
        owned = _family(schema.TENANT_OWNED_GPUS)
        guaranteed = _family(schema.TENANT_GUARANTEED_GPUS)
        pool_gpus = _family(schema.POOL_GPUS)
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
