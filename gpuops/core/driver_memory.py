"""What the CUDA driver keeps of a GPU's memory for itself, and what that leaves to memory caps.

Two figures (docs/limiter.md, "What a cap bounds"):

- **reserved**, per GPU: memory the driver keeps from the start (NVML's `reserved`; what
  `cuDeviceTotalMem` leaves out of NVML's total). No process can allocate it, so the memory
  caps of a GPU's tenants can add up to at most the GPU's total less this: its *usable* memory.
- **context**, per process: the device memory a CUDA context takes (the context and what the
  driver loads into it), before the program allocates anything. The limiter measures it for
  every process and counts it against the process's tenant: a cap bounds the tenant's whole
  footprint on the GPU, its contexts included. So a cap smaller than one context admits no
  process at all, and a cap of N contexts' worth admits at most N processes that allocate
  nothing.

A node observes both (the limiter records its measurements in the GPU's region; the agent
reports them as `GpuInfo.driver_memory`); where a GPU has none yet, the planner and the checks
take the model's documented figures, else `DEFAULT`.

Pure; valid Python 3.8 (the node side reports `DriverMemory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from gpuops.core.mig.catalog import find_model

MIB = 1 << 20


@dataclass(frozen=True)
class DriverMemory:
    """What a node observed of one GPU's driver memory (`GpuInfo.driver_memory`): None where it
    has no observation of that figure yet."""

    context_bytes: Optional[int] = None  # one CUDA context: the first clean measurement
    reserved_bytes: Optional[int] = None  # NVML's total less what CUDA programs can use
    cuda_version: str = ""  # the CUDA driver version the context was measured under ("13.0")

    def check(self) -> None:
        for name in ("context_bytes", "reserved_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError("%d is negative" % value, name)


@dataclass(frozen=True)
class Overhead:
    """The driver's figures for one GPU as the planner and the checks use them, each with where
    it comes from (`observed ...` or `default ...`)."""

    context_bytes: int
    reserved_bytes: int
    context_source: str
    reserved_source: str

    def usable(self, total: int) -> int:
        """What the GPU's tenants can have between them: its memory less what the driver reserves."""
        return max(0, total - self.reserved_bytes)

    def text(self) -> str:
        """'driver overhead: 480MiB reserved (default: H100 measurement), 518MiB per process
        (observed), inside each cap'."""
        return "driver overhead: %s reserved (%s), %s per process (%s), inside each cap" % (
            mib_text(self.reserved_bytes),
            self.reserved_source,
            mib_text(self.context_bytes),
            self.context_source,
        )


def mib_text(size: int) -> str:
    """'518MiB', '1.5GiB': driver figures are MiB-sized."""
    if size >= 10 * 1024 * MIB or (size >= 1024 * MIB and size % (1024 * MIB) == 0):
        return "%gGiB" % round(size / (1024 * MIB), 1)
    return "%dMiB" % -(-size // MIB)


# Measured on a real GPU (docs/gpu-runs/2026-11-26b, NVIDIA H100 80GB HBM3, driver 580.159.04,
# CUDA 13.0): a PyTorch 2.11 process held 518 MiB before any allocation (memory-default.json:
# "this process has 518.00 MiB memory in use"), and nvidia-smi says the driver reserves 480 MiB
# of the card (nvml.json: memory.reserved). Models without a measurement of their own take
# these figures (DEFAULT): a card reserves less than an H100 rather than more, and a context on
# an older GPU is smaller, so the caps err toward what is left.
H100_CONTEXT_BYTES = 518 * MIB
H100_RESERVED_BYTES = 480 * MIB
_MEASURED = "H100 80GB, driver 580.159.04"
MODEL_FIGURES: Mapping[str, Tuple[int, int, str]] = {
    "H100-80GB": (H100_CONTEXT_BYTES, H100_RESERVED_BYTES, _MEASURED),
}
DEFAULT = Overhead(
    H100_CONTEXT_BYTES, H100_RESERVED_BYTES, "default: %s" % _MEASURED, "default: %s" % _MEASURED
)


def overhead_for(model: str, observed: Optional[DriverMemory] = None) -> Overhead:
    """The figures for a GPU of `model` (catalog key or NVML name): the context its node observed,
    the reserve it observed where that is more than documented; each figure it has not observed
    from the model's measurement, else `DEFAULT`'s."""
    found = find_model(model) if model else None
    figures = MODEL_FIGURES.get(found.key) if found is not None else None
    if figures is not None:
        context, reserved, where = figures
        base = Overhead(context, reserved, "default: %s" % where, "default: %s" % where)
    else:
        base = DEFAULT
    if observed is None:
        return base
    context, context_source = base.context_bytes, base.context_source
    if observed.context_bytes is not None:
        context = observed.context_bytes
        version = " under CUDA %s" % observed.cuda_version if observed.cuda_version else ""
        context_source = "observed%s" % version
    # The reserve is the larger of the observed and the documented figure: `validate` has no
    # observation and checks with the documented one, so caps laid on less would be refused there
    # (a card reserving less than an H100 loses that little to the caps).
    reserved, reserved_source = base.reserved_bytes, base.reserved_source
    if observed.reserved_bytes is not None and observed.reserved_bytes >= base.reserved_bytes:
        reserved, reserved_source = observed.reserved_bytes, "observed"
    return Overhead(context, reserved, context_source, reserved_source)


def cuda_version_text(version: int) -> str:
    """cuDriverGetVersion's number as CUDA writes it: 13000 -> '13.0', 12040 -> '12.4'."""
    if version <= 0:
        return ""
    return "%d.%d" % (version // 1000, (version % 1000) // 10)


__all__ = [
    "DEFAULT",
    "H100_CONTEXT_BYTES",
    "H100_RESERVED_BYTES",
    "MODEL_FIGURES",
    "DriverMemory",
    "Overhead",
    "cuda_version_text",
    "mib_text",
    "overhead_for",
]
