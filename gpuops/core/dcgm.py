"""dcgm-exporter's vocabulary for `--dcgm-compat` (docs/metrics.md): its names, units and labels
(rows of core/metric_schema.py) computed from a node sample, so that dashboards written for it
(Grafana's 12239) work unchanged.

gpuops' own series use base units (bytes, ratios); dcgm-exporter's use its field units: percent,
MiB, watts, °C, and the last XID number as a gauge. On a MIG-enabled GPU dcgm-exporter reports
memory and utilization per GPU instance (`GPU_I_PROFILE`, `GPU_I_ID`), so these do too, and not
for the whole GPU (a dashboard's sum then counts each byte once); utilization per instance comes
from NVML's GPM where the node has it. A figure the node cannot give has no series, never a 0.

Pure: no I/O; valid Python 3.8 (the node exporter uses it, and the fleet exporter).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from gpuops.core import metric_schema as schema
from gpuops.core.model import Gpu, NodeHealth, NodeSample, NotAvailable

MiB = 1 << 20
# dcgm-exporter's labels for a GPU, and its MIG instance labels ("" on a whole GPU).
LABELS = schema.DCGM_LABELS


class DcgmFamily(NamedTuple):
    """One of dcgm-exporter's families: its schema row (name, help, labels) and its samples."""

    metric: schema.Metric
    samples: List[Tuple[Tuple[str, ...], float]]


def _number(value: object) -> Optional[float]:
    if isinstance(value, NotAvailable) or value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def last_xids(health: Optional[NodeHealth]) -> Dict[int, int]:
    """Each GPU's last XID number (the XID count seen latest), as DCGM_FI_DEV_XID_ERRORS says it."""
    out: Dict[int, Tuple[float, int]] = {}
    if health is None:
        return {}
    for count in health.xid_counts:
        seen = out.get(count.gpu)
        if seen is None or count.last_timestamp >= seen[0]:
            out[count.gpu] = (count.last_timestamp, count.xid)
    return {gpu: xid for gpu, (_, xid) in out.items()}


def dcgm_families(sample: NodeSample, hostname: str = "") -> List[DcgmFamily]:
    """The DCGM_FI_* families of one node's sample; `hostname` overrides the sample's."""
    host = hostname or sample.hostname
    util = DcgmFamily(schema.DCGM_GPU_UTIL, [])
    used = DcgmFamily(schema.DCGM_FB_USED, [])
    free = DcgmFamily(schema.DCGM_FB_FREE, [])
    power = DcgmFamily(schema.DCGM_POWER_USAGE, [])
    temp = DcgmFamily(schema.DCGM_GPU_TEMP, [])
    xid = DcgmFamily(schema.DCGM_XID_ERRORS, [])
    last = last_xids(sample.health)
    for gpu in sample.gpus:
        head = _head(gpu, host)
        whole = (*head, "", "")
        s = gpu.sample
        if s is not None:
            for fam, value in ((power, s.power_watts), (temp, s.temperature_celsius)):
                number = _number(value)
                if number is not None:
                    fam.samples.append((whole, number))
        if sample.health is not None and not sample.health.error:
            xid.samples.append((whole, float(last.get(gpu.info.index, 0))))
        if gpu.mig is not None and gpu.mig.current:
            profiles = {gi.id: gi.profile_name for gi in gpu.mig.gpu_instances}
            for mig in gpu.mig_samples:
                labels = (*head, profiles.get(mig.gpu_instance_id, ""), str(mig.gpu_instance_id))
                _memory(used, free, labels, mig.memory_used_bytes, mig.memory_total_bytes)
                number = _number(mig.sm_utilization_percent)
                if number is not None:
                    util.samples.append((labels, round(number)))
            continue
        if s is not None:
            _memory(used, free, whole, s.memory_used_bytes, s.memory_total_bytes)
            number = _number(s.utilization_gpu_percent)
            if number is not None:
                util.samples.append((whole, round(number)))
    return [util, used, free, power, temp, xid]


def _head(gpu: Gpu, hostname: str) -> Tuple[str, ...]:
    info = gpu.info
    return (str(info.index), info.uuid, "nvidia%d" % info.index, info.name, hostname)


def _memory(
    used: DcgmFamily, free: DcgmFamily, labels: Tuple[str, ...], used_bytes: object, total_bytes: object
) -> None:
    u, t = _number(used_bytes), _number(total_bytes)
    if u is not None:
        used.samples.append((labels, float(int(u) // MiB)))
        if t is not None:
            free.samples.append((labels, float(max(int(t) - int(u), 0) // MiB)))
