"""What the view models share: when capacity counts as busy, held idle or free (busy is core's one
rule, gpuops/core/busy.py), when a GPU is lost or MIG, short model names, measured figures read as
numbers (a NotAvailable reads as None)."""

from __future__ import annotations

from functools import lru_cache

# Busy and GPU-time: core's one rule, the node's history's and the Prometheus rules' too
# (re-exported for the views).
from gpuops.core.busy import BUSY_PERCENT as BUSY_PERCENT
from gpuops.core.busy import busy_fraction as busy_fraction
from gpuops.core.busy import gpu_busy as gpu_busy
from gpuops.core.busy import gpu_lost as gpu_lost
from gpuops.core.busy import is_busy
from gpuops.core.model import Gpu, NotAvailable

# Memory in use from which capacity that does no work counts as held, not free: above what a
# driver keeps on an empty GPU (a few MiB to a few hundred on 80 GB cards), below any real job.
HELD_MEMORY_PERCENT = 1.0

# What a unit of capacity (a whole GPU, a MIG slice) is doing; "busy" is the only kind that works.
BUSY, HELD, FREE = "busy", "held", "free"


@lru_cache(maxsize=256)
def short_model(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-80GB', 'AMD Instinct MI300X' -> 'MI300X': enough to tell
    cards apart in a dense table."""
    short = name.removeprefix("NVIDIA ").removeprefix("AMD Instinct ")
    for form in ("-SXM4", "-SXM5", "-SXM2", "-PCIE", " PCIe", " NVL"):
        short = short.replace(form, "")
    return short


def capacity_state(util: float | None, processes: int, memory: float | None) -> str:
    """The one meaning of busy, for every line of every screen: capacity is **busy** while it
    works (`core.busy.is_busy`: at least BUSY_PERCENT utilized; where no utilization is reported,
    a MIG slice of an Ampere GPU, while it holds a process). Capacity that does not work but holds
    processes or memory is **held idle** (it looks taken and delivers nothing); the rest is
    **free**. Idle = held + free."""
    if is_busy(util, processes):
        return BUSY
    if processes or (memory is not None and memory >= HELD_MEMORY_PERCENT):
        return HELD
    return FREE


def whole_gpu_state(gpu: Gpu) -> str:
    """`capacity_state` of a GPU that is not in MIG mode (a lost GPU works for nobody: free)."""
    s = gpu.sample
    if s is None or gpu_lost(gpu):
        return FREE
    memory = percent_of(s.memory_used_bytes, s.memory_total_bytes)
    return capacity_state(as_float(s.utilization_gpu_percent), len(gpu.processes), memory)


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: object) -> float | None:
    if value is None or isinstance(value, bool | NotAvailable):
        return None
    return float(value) if isinstance(value, int | float) else None


def percent_of(used: object, total: object) -> float | None:
    u, t = as_int(used), as_int(total)
    if u is None or t is None or t <= 0:
        return None
    return 100.0 * u / t


def mig_active(gpu: Gpu) -> bool:
    return gpu.mig is not None and gpu.mig.current
