"""What one node's exporter says (docs/metrics.md): families built from the sampler's latest
sample, the limiter's regions and the node's MPS daemons, handed to prometheus-client through a
custom collector (`NodeCollector.collect`).

Nothing here asks NVML: the sample is the one the agent's sampling loop took (node/sampler.py).
Names, types, help and labels are the rows of core/metric_schema.py (`Family.of`). The families
are plain data (`Family`) so they can be built and checked without prometheus-client; the client
is imported only inside `collect`, which runs only when the exporter serves (`gpuops agent
--metrics`), so the zipapp pushed for agentless monitoring keeps working without it.

Standard library only at module level; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from gpuops.core import metric_schema as schema
from gpuops.core.dcgm import dcgm_families
from gpuops.core.model import Gpu, NodeSample, NotAvailable
from gpuops.node.limiter import RegionSnapshot, gpu_shares, read_regions
from gpuops.node.sampler import Latest

log = logging.getLogger("gpuops.agent")

MAX_PROCESS_SERIES = 10000  # `--process-metrics top:N`: N at most this


@dataclass
class Family:
    """One metric family: name, type (gauge or counter), help, label names, and its samples."""

    name: str
    kind: str
    help: str
    labels: Tuple[str, ...]
    samples: List[Tuple[Tuple[str, ...], float]] = field(default_factory=list)

    @classmethod
    def of(cls, metric: schema.Metric) -> "Family":
        """An empty family of a schema row, with the labels the node exporter writes (no `team`,
        `pool`, `state` or `reason`: the fleet exporter's knowledge)."""
        return cls(metric.name, metric.type, metric.help, metric.labels_for(schema.NODE))

    def add(self, values: Sequence[str], value: float) -> None:
        self.samples.append((tuple(values), float(value)))


def parse_process_metrics(text: str) -> int:
    """`top:N` -> N; ValueError with a message a person can act on."""
    kind, sep, count = text.partition(":")
    if kind != "top" or not sep or not count.isdigit() or not 1 <= int(count) <= MAX_PROCESS_SERIES:
        raise ValueError(
            "--process-metrics %r: give top:N, N from 1 to %d (the N processes holding the most "
            "GPU memory)" % (text[:64], MAX_PROCESS_SERIES)
        )
    return int(count)


def _number(value: object) -> Optional[float]:
    if isinstance(value, NotAvailable) or value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


class NodeCollector:
    """The node's families at each scrape.

    `latest`: the sampler's latest sample. `node`: the `node` label (the host name unless told).
    `limiter_dir`: where the limiter's regions are (None: no limiter series). `mps`: the node's
    MPS daemons as the agent's `config` request lists them (None: no MPS series).
    `process_top`: per-process series for the N processes holding the most GPU memory (0: none).
    `dcgm_compat`: dcgm-exporter's names and units as well (core/dcgm.py).
    """

    def __init__(
        self,
        latest: Callable[[], Latest],
        node: str = "",
        driver_version: str = "",
        limiter_dir: Optional[str] = None,
        mps: Optional[Callable[[], List[Dict[str, Any]]]] = None,
        process_top: int = 0,
        dcgm_compat: bool = False,
    ) -> None:
        self.latest = latest
        self.dcgm_compat = dcgm_compat
        self.node = node
        self.driver_version = driver_version
        self.limiter_dir = limiter_dir
        self.mps = mps
        self.process_top = process_top
        # Each region's reading at the previous scrape: the achieved share is measured between
        # two scrapes, so it covers exactly the interval Prometheus stores it for.
        self._regions_before: Dict[str, RegionSnapshot] = {}

    # ---- prometheus-client's side --------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for fam in self.families():
            kinds = {schema.GAUGE: GaugeMetricFamily, schema.COUNTER: CounterMetricFamily}
            metric = kinds[fam.kind](fam.name, fam.help, labels=list(fam.labels))
            for values, value in fam.samples:
                metric.add_metric(list(values), value)
            yield metric

    # ---- the families --------------------------------------------------------------------------

    def families(self) -> List[Family]:
        latest = self.latest()
        sample = latest.sample
        hostname = sample.hostname if sample is not None else ""
        node = self.node or hostname
        up = Family.of(schema.NODE_UP)
        up.add((hostname, node), 0.0 if latest.error or sample is None else 1.0)
        out = [up]
        if sample is None:
            return out
        taken = Family.of(schema.NODE_SAMPLE_TIMESTAMP)
        taken.add((hostname, node), sample.timestamp)
        out.append(taken)
        out += self._gpu_families(sample, node)
        out.append(self._xid_family(sample, node))
        if self.dcgm_compat:
            out += self._dcgm_families(sample)
        if self.limiter_dir is not None:
            out += self._limiter_families(sample, node)
        if self.mps is not None:
            out += self._mps_families(sample, node)
        if self.process_top:
            out += self._process_families(sample, node)
        return out

    def _gpu_values(self, gpu: Gpu, hostname: str, node: str) -> Tuple[str, ...]:
        info = gpu.info
        return (
            str(info.index),
            info.uuid,
            "nvidia%d" % info.index,
            info.name,
            info.pci_bus_id,
            hostname,
            node,
        )

    def _gpu_families(self, sample: NodeSample, node: str) -> List[Family]:
        info_f = Family.of(schema.GPU_INFO)
        util = Family.of(schema.GPU_UTILIZATION)
        used = Family.of(schema.GPU_MEMORY_USED)
        total = Family.of(schema.GPU_MEMORY_TOTAL)
        power = Family.of(schema.GPU_POWER)
        temp = Family.of(schema.GPU_TEMPERATURE)
        mig_used = Family.of(schema.MIG_MEMORY_USED)
        mig_util = Family.of(schema.MIG_UTILIZATION)
        mig_procs = Family.of(schema.MIG_PROCESSES)
        for gpu in sample.gpus:
            values = self._gpu_values(gpu, sample.hostname, node)
            mode = "" if gpu.mig is None else "enabled" if gpu.mig.current else "disabled"
            info_f.add((*values, self.driver_version, mode), 1.0)
            s = gpu.sample
            if s is not None:
                for fam, value, scale in (
                    (util, s.utilization_gpu_percent, 0.01),
                    (used, s.memory_used_bytes, 1.0),
                    (total, s.memory_total_bytes, 1.0),
                    (power, s.power_watts, 1.0),
                    (temp, s.temperature_celsius, 1.0),
                ):
                    number = _number(value)
                    if number is not None:  # NOT_SUPPORTED and friends: no series, never a 0
                        fam.add(values, round(number * scale, 9) if scale != 1.0 else number)
            profiles = {gi.id: gi.profile_name for gi in gpu.mig.gpu_instances} if gpu.mig else {}
            for mig in gpu.mig_samples:
                mig_values = (
                    *values[:4],
                    profiles.get(mig.gpu_instance_id, ""),
                    str(mig.gpu_instance_id),
                    sample.hostname,
                    node,
                )
                number = _number(mig.memory_used_bytes)
                if number is not None:
                    mig_used.add(mig_values, number)
                number = _number(mig.sm_utilization_percent)
                if number is not None:  # NOT_SUPPORTED (Ampere), NO_DATA (first sample): none
                    mig_util.add(mig_values, round(number / 100.0, 9))
            if gpu.mig is not None and gpu.mig.current:
                on = Counter(p.gpu_instance_id for p in gpu.processes)
                for gi in gpu.mig.gpu_instances:
                    where = (*values[:4], gi.profile_name, str(gi.id), sample.hostname, node)
                    mig_procs.add(where, float(on.get(gi.id, 0)))
        return [info_f, util, used, total, power, temp, mig_used, mig_util, mig_procs]

    def _xid_family(self, sample: NodeSample, node: str) -> Family:
        fam = Family.of(schema.XID_ERRORS)
        health = sample.health
        if health is None:
            return fam
        uuids = {gpu.info.index: gpu.info.uuid for gpu in sample.gpus}
        for count in health.xid_counts:
            values = (str(count.gpu), uuids.get(count.gpu, ""), sample.hostname, node, str(count.xid))
            fam.add(values, count.count)
        return fam

    def _dcgm_families(self, sample: NodeSample) -> List[Family]:
        out = []
        for fam in dcgm_families(sample):
            kept = Family.of(fam.metric)
            kept.samples = fam.samples
            out.append(kept)
        return out

    def _limiter_families(self, sample: NodeSample, node: str) -> List[Family]:
        limit = Family.of(schema.LIMITER_MEMORY_LIMIT)
        used = Family.of(schema.LIMITER_MEMORY_USED)
        target = Family.of(schema.LIMITER_SHARE_TARGET)
        achieved = Family.of(schema.LIMITER_SHARE)
        index = {gpu.info.uuid: str(gpu.info.index) for gpu in sample.gpus}
        seen: Dict[str, RegionSnapshot] = {}
        for path, snap, error in read_regions(self.limiter_dir or ""):
            if snap is None:
                log.warning("limiter region %s: %s", path, error)
                continue
            seen[str(path)] = snap
            before = self._regions_before.get(str(path))
            shares = gpu_shares(before, snap) if before is not None else {}
            for t in snap.tenants:
                values = (index.get(snap.gpu_uuid, ""), snap.gpu_uuid, sample.hostname, node, t.name)
                if t.memory_capped or t.memory_limit > 0:
                    limit.add(values, t.memory_limit)
                used.add(values, t.memory_used)
                if t.compute_percent > 0:
                    target.add((*values, t.policy), t.compute_percent / 100.0)
                if t.name in shares:
                    achieved.add(values, shares[t.name])
        self._regions_before = seen  # a region that went away is forgotten with it
        return [limit, used, target, achieved]

    def _mps_families(self, sample: NodeSample, node: str) -> List[Family]:
        fam = Family.of(schema.MPS_ACTIVE_THREAD_PERCENTAGE)
        assert self.mps is not None
        uuids = {gpu.info.index: gpu.info.uuid for gpu in sample.gpus}
        try:
            daemons = self.mps()
        except Exception as exc:  # one failing MPS control must not cost the GPU series
            log.warning("MPS state unreadable: %s", exc)
            return [fam]
        for d in daemons:
            if not d.get("running"):
                continue
            gpu = d.get("gpu")
            head = (
                "" if gpu is None else str(gpu),
                uuids.get(gpu, "") if isinstance(gpu, int) else "",
                sample.hostname,
                node,
                str(d.get("pipe_directory") or ""),
            )
            default = _number(d.get("active_thread_percentage"))
            if default is not None:
                fam.add((*head, ""), default)
            for server in d.get("servers") or []:
                value = _number(server.get("active_thread_percentage"))
                if value is not None:
                    fam.add((*head, str(server.get("user") or server.get("uid") or "")), value)
        return [fam]

    def _process_families(self, sample: NodeSample, node: str) -> List[Family]:
        # The bound says the per-process series are on: a reader then knows that a GPU without
        # any has no process (none, not "not exported"), and when the list may be cut.
        limit = Family.of(schema.PROCESS_SERIES_LIMIT)
        limit.add((sample.hostname, node), self.process_top)
        fam = Family.of(schema.PROCESS_MEMORY_USED)
        rows = []
        for gpu in sample.gpus:
            for p in gpu.processes:
                number = _number(p.used_memory_bytes)
                if number is not None:
                    rows.append((number, gpu, p))
        # Largest first, pid breaking ties: the same N series from one scrape to the next.
        rows.sort(key=lambda r: (-r[0], r[2].pid, r[1].info.index))
        for number, gpu, p in rows[: self.process_top]:
            values = (
                str(gpu.info.index),
                gpu.info.uuid,
                sample.hostname,
                node,
                str(p.pid),
                p.user,
                p.tenant or "",
                "" if p.gpu_instance_id is None else str(p.gpu_instance_id),
            )
            fam.add(values, number)
        return [limit, fam]
