"""Which vendor made a GPU, from the PCI vendor id in the low 16 bits of `GpuInfo.pci_device_id`
(NVML and amdsmi both give it): screens label figures per vendor (SMs or CUs, CUDA or ROCm)
instead of asking which backend read them. Valid Python 3.8: the node side reads it."""

from __future__ import annotations

from typing import Iterable

from gpuops.core.model import GpuInfo

NVIDIA_VENDOR_ID = 0x10DE
AMD_VENDOR_ID = 0x1002
NVIDIA, AMD = "nvidia", "amd"


def vendor(info: GpuInfo) -> str:
    """ "nvidia", "amd", or "" for a vendor gpuops does not know."""
    low = info.pci_device_id & 0xFFFF
    return NVIDIA if low == NVIDIA_VENDOR_ID else AMD if low == AMD_VENDOR_ID else ""


def node_vendor(infos: Iterable[GpuInfo]) -> str:
    """The one vendor of a node's GPUs; "" when they are mixed or unknown."""
    found = {vendor(i) for i in infos}
    return found.pop() if len(found) == 1 else ""


def unit_name(info: GpuInfo) -> str:
    """What `multiprocessor_count` counts on this GPU: NVIDIA's SMs or AMD's compute units."""
    return "CUs" if vendor(info) == AMD else "SMs"


def runtime_name(infos: Iterable[GpuInfo], backend: str = "") -> str:
    """The name of `Node.cuda_driver_version` on a node: AMD nodes give their ROCm release there."""
    return "ROCm" if backend == "amd" or node_vendor(infos) == AMD else "CUDA"


__all__ = [
    "AMD",
    "AMD_VENDOR_ID",
    "NVIDIA",
    "NVIDIA_VENDOR_ID",
    "node_vendor",
    "runtime_name",
    "unit_name",
    "vendor",
]
