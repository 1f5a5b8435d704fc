"""MIG: the profile catalog of every MIG-capable model, and the placement solver. Pure, Python 3.8."""

from __future__ import annotations

from gpuops.core.mig.catalog import (
    MODELS,
    ComputeProfile,
    Engines,
    GpuInstanceProfile,
    MigModel,
    UnknownProfileError,
    find_model,
    model_for_gpu,
    model_for_pci_device_id,
)

__all__ = [
    "MODELS",
    "ComputeProfile",
    "Engines",
    "GpuInstanceProfile",
    "MigModel",
    "UnknownProfileError",
    "find_model",
    "model_for_gpu",
    "model_for_pci_device_id",
]
