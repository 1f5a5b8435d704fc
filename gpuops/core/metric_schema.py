"""The metric schema: every series gpuops exports, one row each (docs/metrics.md).

A row is the series' name (as a query names it: a counter's ends in `_total`), its type, its
unit (as docs/metrics.md's table gives it), its labels in the order an exposition writes them,
its help text and which exporters say it. Both exporters render their families from these rows
(`gpuops/node/metrics.py`, `gpuops/exporter/fleet_metrics.py`, and `core/dcgm.py` for
dcgm-exporter's names), and the readers of Prometheus (the PromQL fleet source,
`gpuops/fleet/promql/`, and the history over PromQL, `gpuops/tenancy/prometheus_history.py`) ask
for the rows' names; `tests/unit/test_metric_schema.py` checks that every name in deploy/
(rules, alerts, dashboards) is a row or a recording rule, and that docs/metrics.md's table is
this one.

`team`, `pool` (fleet.yaml's knowledge) and `state`, `reason` (the SSH collector's) are the fleet
exporter's alone: the node exporter writes a row's labels without them (`Metric.labels_for`).

Pure data; valid Python 3.8 (the node exporter renders from it on GPU nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

GAUGE = "gauge"
COUNTER = "counter"

NODE = "node"  # the node exporter (`gpuops agent --metrics`)
FLEET = "fleet"  # the fleet exporter (`gpuops exporter`)
BOTH = (NODE, FLEET)

# Labels only the fleet exporter knows: a GPU's owner and pool (fleet.yaml), a node's state and
# the reason for it (the collector's).
FLEET_ONLY_LABELS = ("team", "pool", "state", "reason")


@dataclass(frozen=True)
class Metric:
    """One series of the schema."""

    name: str  # as queried: a counter's ends in _total (prometheus-client writes HELP/TYPE without)
    type: str  # GAUGE or COUNTER
    unit: str  # as docs/metrics.md's table says it ("bytes", "ratio", "GPUs", "1", ...)
    labels: Tuple[str, ...]  # every label, in the order an exposition writes them
    help: str
    exporters: Tuple[str, ...] = BOTH  # NODE and/or FLEET

    def labels_for(self, exporter: str) -> Tuple[str, ...]:
        """The labels `exporter` writes: all of them for the fleet exporter; the node exporter
        leaves out FLEET_ONLY_LABELS."""
        if exporter == FLEET:
            return self.labels
        return tuple(name for name in self.labels if name not in FLEET_ONLY_LABELS)


# ---- label sets ------------------------------------------------------------------------------

# dcgm-exporter's labels of a GPU (its dashboards and joins keep working), then gpuops' own.
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
NODE_LABELS = ("Hostname", "node")
XID_LABELS = ("gpu", "UUID", "Hostname", "node", "team", "pool", "xid")
LIMITER_LABELS = ("gpu", "UUID", "Hostname", "node", "tenant")
MPS_LABELS = ("gpu", "UUID", "Hostname", "node", "pipe_directory", "user")
# GPU_I_ID: the MIG GPU instance the process runs in ("" when none), so that a reader of the
# series (the PromQL fleet source) can put MIG use on its slice, as the agent protocol does.
PROCESS_LABELS = ("gpu", "UUID", "Hostname", "node", "pid", "user", "tenant", "GPU_I_ID")
# dcgm-exporter's labels for a GPU, and its MIG instance labels ("" on a whole GPU).
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID")

# ---- nodes -----------------------------------------------------------------------------------

NODE_UP = Metric(
    "gpuops_node_up",
    GAUGE,
    "1",
    (*NODE_LABELS, "state", "reason"),
    "1 when the node's agent samples it and its last sample succeeded, 0 when not (the fleet "
    "exporter's state and reason say why)",
)
NODE_SAMPLE_TIMESTAMP = Metric(
    "gpuops_node_sample_timestamp_seconds",
    GAUGE,
    "seconds",
    NODE_LABELS,
    "When the node took the sample these figures come from (seconds since the epoch)",
)

# ---- GPUs and MIG GPU instances --------------------------------------------------------------

GPU_INFO = Metric(
    "gpuops_gpu_info",
    GAUGE,
    "1",
    (*GPU_LABELS, "driver_version", "mig_mode"),
    "One per GPU, value 1: driver version and MIG mode as labels",
)
GPU_UTILIZATION = Metric(
    "gpuops_gpu_utilization_ratio", GAUGE, "ratio", GPU_LABELS, "GPU utilization as NVML reports it (0..1)"
)
GPU_MEMORY_USED = Metric("gpuops_gpu_memory_used_bytes", GAUGE, "bytes", GPU_LABELS, "GPU memory in use")
GPU_MEMORY_TOTAL = Metric("gpuops_gpu_memory_total_bytes", GAUGE, "bytes", GPU_LABELS, "GPU memory in all")
GPU_POWER = Metric("gpuops_gpu_power_watts", GAUGE, "watts", GPU_LABELS, "Power draw")
GPU_TEMPERATURE = Metric("gpuops_gpu_temperature_celsius", GAUGE, "°C", GPU_LABELS, "GPU temperature")
MIG_MEMORY_USED = Metric(
    "gpuops_mig_instance_memory_used_bytes", GAUGE, "bytes", MIG_LABELS, "Memory in use in a MIG GPU instance"
)
MIG_UTILIZATION = Metric(
    "gpuops_mig_instance_utilization_ratio",
    GAUGE,
    "ratio",
    MIG_LABELS,
    "SM utilization of a MIG GPU instance from NVML's GPM (0..1; Hopper and newer)",
)
MIG_PROCESSES = Metric(
    "gpuops_mig_instance_processes",
    GAUGE,
    "1",
    MIG_LABELS,
    "Processes on a MIG GPU instance (a slice's busy evidence where NVML has no utilization)",
)
XID_ERRORS = Metric(
    "gpuops_xid_errors_total",
    COUNTER,
    "1",
    XID_LABELS,
    "XID critical errors NVML reported for a GPU since the agent started listening",
)

# ---- teams and pools (the fleet exporter: fleet.yaml's knowledge) ----------------------------

TENANT_GPU_USED = Metric(
    "gpuops_tenant_gpu_used",
    GAUGE,
    "GPUs",
    ("tenant", "node"),
    "GPUs' worth of GPU time a team uses now on the node (utilization-weighted GPU-equivalents, as "
    "`gpuops tenants` counts used)",
    (FLEET,),
)
TENANT_MEMORY_USED = Metric(
    "gpuops_tenant_memory_used_bytes",
    GAUGE,
    "bytes",
    ("tenant", "node"),
    "GPU memory a team's processes hold on the node",
    (FLEET,),
)
TENANT_OWNED_GPUS = Metric(
    "gpuops_tenant_owned_gpus",
    GAUGE,
    "GPUs",
    ("tenant",),
    "GPUs a team owns (fleet.yaml), in its silo or in pools, among the GPUs seen",
    (FLEET,),
)
TENANT_GUARANTEED_GPUS = Metric(
    "gpuops_tenant_guaranteed_gpus",
    GAUGE,
    "GPUs",
    ("tenant", "pool"),
    "GPUs a team is guaranteed: its silo (pool empty) and its share of each pool's GPUs",
    (FLEET,),
)
POOL_GPUS = Metric(
    "gpuops_pool_gpus",
    GAUGE,
    "GPUs",
    ("pool",),
    "GPUs in each pool of fleet.yaml, among the GPUs seen",
    (FLEET,),
)

# ---- the node's limiter, MPS and processes (the node exporter) -------------------------------

LIMITER_MEMORY_LIMIT = Metric(
    "gpuops_limiter_memory_limit_bytes",
    GAUGE,
    "bytes",
    LIMITER_LABELS,
    "A tenant's memory cap on a GPU, from the limiter's region (absent when uncapped)",
    (NODE,),
)
LIMITER_MEMORY_USED = Metric(
    "gpuops_limiter_memory_used_bytes",
    GAUGE,
    "bytes",
    LIMITER_LABELS,
    "GPU memory a tenant's live processes hold under the limiter",
    (NODE,),
)
LIMITER_SHARE_TARGET = Metric(
    "gpuops_limiter_compute_share_target_ratio",
    GAUGE,
    "ratio",
    (*LIMITER_LABELS, "policy"),
    "A tenant's compute share of a GPU as the tenant table sets it (0..1)",
    (NODE,),
)
LIMITER_SHARE = Metric(
    "gpuops_limiter_compute_share_ratio",
    GAUGE,
    "ratio",
    LIMITER_LABELS,
    "The share of the GPU's time a tenant got since the previous scrape (0..1)",
    (NODE,),
)
MPS_ACTIVE_THREAD_PERCENTAGE = Metric(
    "gpuops_mps_active_thread_percentage",
    GAUGE,
    "percent",
    MPS_LABELS,
    "An MPS daemon's default active thread percentage (user empty), and each of its servers' (by user)",
    (NODE,),
)
PROCESS_MEMORY_USED = Metric(
    "gpuops_process_gpu_memory_used_bytes",
    GAUGE,
    "bytes",
    PROCESS_LABELS,
    "GPU memory of the processes holding the most (only with --process-metrics top:N)",
    (NODE,),
)
PROCESS_SERIES_LIMIT = Metric(
    "gpuops_process_series_limit",
    GAUGE,
    "series",
    NODE_LABELS,
    "The most per-process series this node exports (--process-metrics top:N); absent when off",
    (NODE,),
)

# ---- dcgm-exporter's names, in its units (--dcgm-compat; core/dcgm.py) -----------------------

DCGM_GPU_UTIL = Metric("DCGM_FI_DEV_GPU_UTIL", GAUGE, "percent", DCGM_LABELS, "GPU utilization (in %).")
DCGM_FB_USED = Metric("DCGM_FI_DEV_FB_USED", GAUGE, "MiB", DCGM_LABELS, "Framebuffer memory used (in MiB).")
DCGM_FB_FREE = Metric("DCGM_FI_DEV_FB_FREE", GAUGE, "MiB", DCGM_LABELS, "Framebuffer memory free (in MiB).")
DCGM_POWER_USAGE = Metric("DCGM_FI_DEV_POWER_USAGE", GAUGE, "watts", DCGM_LABELS, "Power draw (in W).")
DCGM_GPU_TEMP = Metric("DCGM_FI_DEV_GPU_TEMP", GAUGE, "°C", DCGM_LABELS, "GPU temperature (in C).")
DCGM_XID_ERRORS = Metric(
    "DCGM_FI_DEV_XID_ERRORS", GAUGE, "1", DCGM_LABELS, "Value of the last XID error encountered."
)

# ---- the table -------------------------------------------------------------------------------

SCHEMA = (
    NODE_UP,
    NODE_SAMPLE_TIMESTAMP,
    GPU_INFO,
    GPU_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_POWER,
    GPU_TEMPERATURE,
    MIG_MEMORY_USED,
    MIG_UTILIZATION,
    MIG_PROCESSES,
    XID_ERRORS,
    TENANT_GPU_USED,
    TENANT_MEMORY_USED,
    TENANT_OWNED_GPUS,
    TENANT_GUARANTEED_GPUS,
    POOL_GPUS,
    LIMITER_MEMORY_LIMIT,
    LIMITER_MEMORY_USED,
    LIMITER_SHARE_TARGET,
    LIMITER_SHARE,
    MPS_ACTIVE_THREAD_PERCENTAGE,
    PROCESS_MEMORY_USED,
    PROCESS_SERIES_LIMIT,
    DCGM_GPU_UTIL,
    DCGM_FB_USED,
    DCGM_FB_FREE,
    DCGM_POWER_USAGE,
    DCGM_GPU_TEMP,
    DCGM_XID_ERRORS,
)
BY_NAME: Dict[str, Metric] = {m.name: m for m in SCHEMA}
