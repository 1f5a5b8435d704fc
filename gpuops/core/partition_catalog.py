"""The partition modes of the GPUs split by modes rather than by MIG instances (AMD Instinct
MI300 class), per model: one table for the node (which modes a GPU accepts, by PCI device id) and
for fleet.yaml's `carve: partition:` checks (by model name), as the MIG catalog is for MIG.

From AMD's MI300 partitioning guide: the compute partition makes 1 (SPX), 2 (DPX), 3 (TPX,
MI300A), 4 (QPX), 6 or 8 (CPX) logical GPUs; the memory partition 1 (NPS1) or 4 (NPS4) NUMA
memory pools. Valid Python 3.8: the node side reads it.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

COMPUTE_MODE_NAMES = ("SPX", "DPX", "TPX", "QPX", "CPX")
MEMORY_MODE_NAMES = ("NPS1", "NPS2", "NPS4", "NPS8")


class PartitionModel:
    """One GPU model's modes: compute mode -> logical GPUs it makes, and the memory modes."""

    def __init__(
        self,
        key: str,
        device_ids: Tuple[int, ...],
        compute: Dict[str, int],
        memory: Tuple[str, ...],
    ) -> None:
        self.key = key
        self.device_ids = device_ids
        self.compute = compute
        self.memory = memory

    def describe(self) -> str:
        return "%s takes compute %s and memory %s" % (
            self.key,
            "/".join(self.compute),
            "/".join(self.memory),
        )


_MI300X = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
PARTITION_MODELS: Dict[str, PartitionModel] = {
    m.key: m
    for m in (
        PartitionModel("MI300X", (0x74A1,), _MI300X, ("NPS1", "NPS4")),
        PartitionModel("MI325X", (0x74A5,), _MI300X, ("NPS1", "NPS4")),
        PartitionModel("MI308X", (0x74A2,), _MI300X, ("NPS1", "NPS4")),
        PartitionModel("MI300A", (0x74A0,), {"SPX": 1, "TPX": 3, "CPX": 6}, ("NPS1",)),
    )
}

_BY_DEVICE = {d: m for m in PARTITION_MODELS.values() for d in m.device_ids}
_NAME_RE = re.compile(r"\bMI3\d\d[A-Z]?\b")


def by_device_id(device_id: int) -> Optional[PartitionModel]:
    return _BY_DEVICE.get(device_id)


def find_partition_model(name: str) -> Optional[PartitionModel]:
    """The model of a name as fleet.yaml, a label or the driver writes it: "MI300X",
    "AMD Instinct MI300X", "amd-instinct-mi300x"; None for a GPU without partition modes."""
    text = name.upper().replace("_", " ").replace("-", " ")
    for word in _NAME_RE.findall(text):
        found = PARTITION_MODELS.get(word)
        if found is not None:
            return found
    return None


__all__ = [
    "COMPUTE_MODE_NAMES",
    "MEMORY_MODE_NAMES",
    "PARTITION_MODELS",
    "PartitionModel",
    "by_device_id",
    "find_partition_model",
]
