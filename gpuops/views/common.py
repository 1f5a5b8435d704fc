"""What the view models share: when capacity counts as busy, held idle or free (the one
definition every screen uses), when a GPU is lost or MIG, short model names, measured figures
read as numbers (a NotAvailable reads as None)."""

from __future__ import annotations

from functools import lru_cache

# GPU-time's one rule, the node's history's too (re-exported for the views)
from gpuops.core.history import busy_fraction as busy_fraction
from gpuops.core.model import Gpu, NotAvailable

BUSY_PERCENT = 5.0
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
    works, at least BUSY_PERCENT utilized; where no utilization is reported (a MIG slice of an
    Ampere GPU: NVML has no per-instance figure) a process on it is the only evidence, so it is
    busy while it holds one. Capacity that does not work but holds processes or memory is
    **held idle** (it looks taken and delivers nothing); the rest is **free**. Idle = held + free."""
    if util is not None:
        if util >= BUSY_PERCENT:
            return BUSY
    elif processes:
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


def gpu_busy(gpu: Gpu) -> bool:
    """Whether any of the GPU's capacity is busy (the CLI's whole-GPU tables; a MIG GPU with one
    busy slice counts)."""
    if mig_active(gpu):
        assert gpu.mig is not None
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        for gi in gpu.mig.gpu_instances:
            m = samples.get(gi.id)
            util = as_float(m.sm_utilization_percent) if m is not None else None
            procs = sum(1 for p in gpu.processes if p.gpu_instance_id == gi.id)
            if capacity_state(util, procs, None) == BUSY:
                return True
        return False
    return whole_gpu_state(gpu) == BUSY


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


def gpu_lost(gpu: Gpu) -> bool:
    s = gpu.sample
    return (
        s is not None
        and isinstance(s.memory_total_bytes, NotAvailable)
        and (s.memory_total_bytes.reason == "GPU_IS_LOST")
    )
