"""The model of a GPU node, the same whether the node is real (NVML) or simulated.

Everything is a frozen dataclass so snapshots can be shared between threads and screens
without copying. Any measured figure may be `NotAvailable` (NVML returns NOT_SUPPORTED,
GPU_IS_LOST, FUNCTION_NOT_FOUND per field): one missing field never hides the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from gpuops.core.driver_memory import DriverMemory


@dataclass(frozen=True)
class NotAvailable:
    """A figure the node could not provide; `reason` is the NVML-style code (e.g. NOT_SUPPORTED)."""

    reason: str

    def __str__(self) -> str:
        return "n/a"


IntMetric = Union[int, NotAvailable]
FloatMetric = Union[float, NotAvailable]


def available(value: object) -> bool:
    return not isinstance(value, NotAvailable)


@dataclass(frozen=True)
class ComputeInstance:
    """A MIG compute instance inside a GPU instance; each is one MIG device with its own UUID."""

    id: int
    profile_id: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (1c=0, 2c=1, 3c=2, 4c=3, 7c=4)
    name: str  # e.g. "1c.3g.20gb", or the GI name when it is the GI's default full CI
    start: int  # compute-slice placement inside the GI
    size: int
    multiprocessor_count: int
    uuid: str = ""


@dataclass(frozen=True)
class GpuInstance:
    """A MIG GPU instance: a placement of memory slices, plus its compute instances."""

    id: int
    profile_id: int  # the profile's info.id (what nvidia-smi shows and create calls take)
    profile_name: str  # e.g. "3g.20gb"
    start: int  # first memory slice
    size: int  # number of memory slices
    memory_total_bytes: int
    multiprocessor_count: int
    compute_instances: Tuple[ComputeInstance, ...] = ()


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while a node runs (except MIG mode, which a reset may change)."""

    index: int
    uuid: str
    name: str  # as NVML reports it, e.g. "NVIDIA A100-SXM4-40GB"
    pci_bus_id: str
    pci_device_id: int  # (device << 16) | vendor, e.g. 0x20B010DE
    memory_total_bytes: IntMetric
    mig_capable: bool
    mig_model: Optional[str] = None  # catalog model key when the GPU supports MIG
    architecture: str = ""  # "ampere", "hopper", ...
    multiprocessor_count: IntMetric = NotAvailable("NOT_SUPPORTED")
    power_limit_watts: FloatMetric = NotAvailable("NOT_SUPPORTED")
    # What the driver keeps of the GPU's memory, as the node observed it (the limiter's
    # measurements, put on by the agent: node/limiter_tags.py; the simulator's own figures);
    # None where nothing was observed. Left out of JSON when None (older readers never saw it).
    driver_memory: Optional[DriverMemory] = field(default=None, metadata={"omit_default": True})


@dataclass(frozen=True)
class MigState:
    current: bool
    pending: bool
    gpu_instances: Tuple[GpuInstance, ...] = ()


@dataclass(frozen=True)
class PartitionState:
    """A GPU split by modes rather than by instances (AMD Instinct MI300-class: the compute
    partition SPX/DPX/QPX/CPX and the memory partition NPS1/NPS4), the vendor-neutral sibling
    of `MigState`. Modes are the vendor's names; "" where the node could not read one."""

    compute_mode: str  # e.g. "SPX", "CPX"
    memory_mode: str  # e.g. "NPS1", "NPS4"
    compute_modes: Tuple[str, ...] = ()  # the modes this GPU accepts, () where unknown
    memory_modes: Tuple[str, ...] = ()
    partitions: int = 1  # logical GPUs the compute mode makes of this one (SPX 1, CPX 8 on MI300X)


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU (or on a MIG instance of it)."""

    pid: int
    used_memory_bytes: IntMetric
    user: str = ""  # unix user name, "" when unknown
    command: str = ""
    gpu_instance_id: Optional[int] = None  # None when not on a MIG instance
    compute_instance_id: Optional[int] = None
    tenant: Optional[str] = None  # team, when known
    tenant_source: str = ""  # where the tenant came from ("limiter", "user", "group", "owner", ...)
    # Unix groups of the process, primary first (names; a number where the node has no name for
    # it); () where unknown. Optional so that agents that do not send them still decode.
    groups: Tuple[str, ...] = ()
    # The process's cgroup path (/proc/<pid>/cgroup: the unified one, else the first v1 path that
    # is not the root), "" where unknown: e.g. a Kubernetes pod's UID is in it.
    cgroup: str = ""


@dataclass(frozen=True)
class GpuSample:
    """One timestamped reading of a whole GPU."""

    timestamp: float  # seconds since the epoch on the node
    utilization_gpu_percent: FloatMetric
    utilization_memory_percent: FloatMetric
    memory_used_bytes: IntMetric
    memory_total_bytes: IntMetric
    power_watts: FloatMetric
    temperature_celsius: FloatMetric
    sm_clock_mhz: IntMetric
    memory_clock_mhz: IntMetric


@dataclass(frozen=True)
class MigInstanceSample:
    """Per-GPU-instance memory, and SM activity where NVML's GPM gives it: NVML's utilization
    rates are NOT_SUPPORTED for MIG devices."""

    gpu_instance_id: int
    memory_used_bytes: IntMetric
    memory_total_bytes: IntMetric
    # Percent of the instance's SMs busy over the last sampling interval (NVML's GPM SM_UTIL,
    # Hopper and newer); NotAvailable with NVML's reason elsewhere. Agents send it only to
    # operators that ask (core/protocol.py, "extras"): older operators reject unknown fields.
    sm_utilization_percent: FloatMetric = NotAvailable("NOT_SUPPORTED")


@dataclass(frozen=True)
class Gpu:
    """A GPU as seen at one moment: identity, MIG layout, sample and processes."""

    info: GpuInfo
    mig: Optional[MigState] = None  # None when the GPU is not MIG-capable
    sample: Optional[GpuSample] = None
    mig_samples: Tuple[MigInstanceSample, ...] = ()
    processes: Tuple[GpuProcess, ...] = ()
    # "" when `processes` is the complete list; else the NVML code saying why it could not be read
    # (an empty list then means "unknown", not "idle").
    processes_error: str = ""
    owner: Optional[str] = None  # owning team (silo), when the node knows it
    # Mode partitions (AMD); None on GPUs without them, and then left out of the JSON, so the
    # messages of NVIDIA nodes are what they were before the field existed.
    partition: Optional[PartitionState] = None


@dataclass(frozen=True)
class Node:
    """A node's inventory: identity and GPUs without samples (cheap to ask, changes rarely)."""

    hostname: str
    backend: str  # "nvml", "sim", ...
    driver_version: str = ""
    cuda_driver_version: str = ""
    gpus: Tuple[Gpu, ...] = ()


@dataclass(frozen=True)
class HealthEvent:
    """One event from the node's NVML event set (XID critical error, ECC error, clock change)."""

    seq: int  # numbered by the agent from 1 as they come: the operator keeps each once
    timestamp: float  # when the agent received it (seconds since the epoch, the node's clock)
    gpu: int  # GPU index; -1 where NVML named a device the agent does not know
    kind: str  # one of HEALTH_KINDS
    xid: Optional[int] = None  # the XID number of an "xid" event (999: NVML's unknown XID)
    gpu_instance_id: Optional[int] = None  # the MIG GPU instance it is attributable to
    compute_instance_id: Optional[int] = None
    uuid: str = ""  # the GPU's UUID


# NVML event types the agent listens to, by name (nvmlEventType*).
HEALTH_KINDS = ("xid", "ecc_single_bit", "ecc_double_bit", "clock", "pstate", "other")


@dataclass(frozen=True)
class XidCount:
    """How many XID errors of one number a GPU had since the agent started listening."""

    gpu: int
    xid: int
    count: int
    last_timestamp: float


@dataclass(frozen=True)
class NodeHealth:
    """What the agent's event thread saw: the latest events and the XID counts since it started.
    `error` is "" while it listens, else why it cannot (NVML's code, e.g. NOT_SUPPORTED)."""

    since: float  # when the agent started listening
    error: str = ""
    events: Tuple[HealthEvent, ...] = ()  # the latest, oldest first (at most MAX_HEALTH_EVENTS)
    xid_counts: Tuple[XidCount, ...] = ()  # by GPU, then XID


MAX_HEALTH_EVENTS = 64


@dataclass(frozen=True)
class NodeSample:
    """A node's live readings: every GPU with its sample, MIG layout and processes."""

    hostname: str
    timestamp: float
    gpus: Tuple[Gpu, ...] = field(default_factory=tuple)
    # The agent's health events; None from agents without an event thread or to operators that
    # did not ask for them (core/protocol.py, "extras").
    health: Optional[NodeHealth] = None
