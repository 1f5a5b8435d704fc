"""What the view models share: when a GPU counts as busy, lost or MIG, short model names,
measured figures read as numbers (a NotAvailable reads as None)."""

from __future__ import annotations

from functools import lru_cache

from gpuops.core.model import Gpu, NotAvailable

BUSY_PERCENT = 5.0


@lru_cache(maxsize=256)
def short_model(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100-80GB': enough to tell cards apart in a dense table."""
    short = name.removeprefix("NVIDIA ")
    for form in ("-SXM4", "-SXM5", "-SXM2", "-PCIE", " PCIe", " NVL"):
        short = short.replace(form, "")
    return short


def gpu_busy(gpu: Gpu) -> bool:
    if gpu.processes:
        return True
    util = gpu.sample.utilization_gpu_percent if gpu.sample else None
    return isinstance(util, float | int) and util >= BUSY_PERCENT


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
