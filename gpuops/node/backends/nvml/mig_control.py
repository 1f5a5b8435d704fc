"""MIG changes through NVML (root needed): the MIG mode, GPU and compute instances made and
destroyed. A change NVML refuses is a BackendError with NVML's code (IN_USE, NO_PERMISSION,
INSUFFICIENT_RESOURCES, ...); what was made is read back as the inventory shows it (mig.py).

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from gpuops.core.model import ComputeInstance, GpuInstance
from gpuops.node.backends.base import BackendError, MigModeChange
from gpuops.node.backends.nvml import mig
from gpuops.node.backends.nvml.devices import CiProfile, Device, GiProfile
from gpuops.node.backends.nvml.library import NVML_ERRORS, failure, pynvml


def set_mig_mode(dev: Device, enabled: bool) -> MigModeChange:
    gpu = dev.index
    if not dev.info.mig_capable:
        raise BackendError("NOT_SUPPORTED", "GPU %d (%s) does not support MIG" % (gpu, dev.info.name))
    mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    what = "cannot %s MIG on GPU %d" % ("enable" if enabled else "disable", gpu)
    try:
        pynvml.nvmlDeviceSetMigMode(dev.handle, mode)
        current, pending = pynvml.nvmlDeviceGetMigMode(dev.handle)
    except NVML_ERRORS as exc:
        raise failure(what, exc) from None
    return MigModeChange(current=bool(current), pending=bool(pending))


def reset_gpu(dev: Device) -> None:
    raise BackendError(
        "NOT_SUPPORTED",
        "NVML cannot reset a GPU; as root run: nvidia-smi -r -i %s" % (dev.info.pci_bus_id or str(dev.index)),
    )


def _profile(dev: Device, profile_id: int) -> GiProfile:
    profiles = mig.gi_profiles(dev)
    profile = profiles.get(profile_id)
    if profile is None:
        valid = ", ".join("%s (%d)" % (p.name, p.id) for p in sorted(profiles.values(), key=lambda p: p.id))
        raise BackendError(
            "INVALID_ARGUMENT",
            "GPU %d has no GPU instance profile %r (valid: %s)" % (dev.index, profile_id, valid or "none"),
        )
    return profile


def _placement_size(dev: Device, profile: GiProfile, start: int) -> int:
    count = ctypes.c_uint(0)
    try:
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(dev.handle, profile.id, None, ctypes.byref(count))
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * max(int(count.value), 1))()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            dev.handle, profile.id, placements, ctypes.byref(count)
        )
    except NVML_ERRORS as exc:
        raise failure("cannot list placements of %s on GPU %d" % (profile.name, dev.index), exc) from None
    starts = [int(placements[i].start) for i in range(int(count.value))]
    for i in range(int(count.value)):
        if int(placements[i].start) == start:
            return int(placements[i].size)
    raise BackendError(
        "INVALID_ARGUMENT",
        "%s cannot start at memory slice %d on GPU %d (valid starts: %s)"
        % (profile.name, start, dev.index, ", ".join(str(s) for s in starts) or "none"),
    )


def _gi_handle(dev: Device, gpu_instance_id: int) -> Any:
    try:
        return pynvml.nvmlDeviceGetGpuInstanceById(dev.handle, gpu_instance_id)
    except NVML_ERRORS as exc:
        raise failure("no GPU instance %d on GPU %d" % (gpu_instance_id, dev.index), exc) from None


def create_gpu_instance(dev: Device, profile_id: int, start: Optional[int] = None) -> GpuInstance:
    gpu = dev.index
    profile = _profile(dev, profile_id)
    what = "cannot create a %s GPU instance on GPU %d" % (profile.name, gpu)
    try:
        if start is None:
            handle = pynvml.nvmlDeviceCreateGpuInstance(dev.handle, profile.id)
        else:
            size = _placement_size(dev, profile, start)
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
            handle = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                dev.handle, profile.id, ctypes.byref(placement)
            )
    except NVML_ERRORS as exc:
        raise failure(what, exc) from None
    gi = mig.gpu_instance(dev, handle, profile, {})
    if gi is None:
        raise BackendError("UNKNOWN", "GPU instance created on GPU %d but it cannot be read back" % gpu)
    return gi


def destroy_gpu_instance(dev: Device, gpu_instance_id: int) -> None:
    handle = _gi_handle(dev, gpu_instance_id)
    try:
        pynvml.nvmlGpuInstanceDestroy(handle)
    except NVML_ERRORS as exc:
        raise failure(
            "cannot destroy GPU instance %d on GPU %d" % (gpu_instance_id, dev.index), exc
        ) from None


def create_compute_instance(
    dev: Device, gpu_instance_id: int, profile_id: int, start: Optional[int] = None
) -> ComputeInstance:
    gi_handle = _gi_handle(dev, gpu_instance_id)
    what = "cannot create compute instance profile %d in GPU instance %d on GPU %d" % (
        profile_id,
        gpu_instance_id,
        dev.index,
    )
    shared = getattr(pynvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    try:
        gi_info = pynvml.nvmlGpuInstanceGetInfo(gi_handle)
        profile = _profile(dev, int(gi_info.profileId))
        cp_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, profile_id, shared, 1)
        cp = CiProfile(
            int(cp_info.id),
            int(cp_info.sliceCount),
            int(cp_info.instanceCount),
            int(cp_info.multiprocessorCount),
        )
        if start is None:
            handle = pynvml.nvmlGpuInstanceCreateComputeInstance(gi_handle, cp.id)
        else:
            placement = pynvml.c_nvmlComputeInstancePlacement_t(start, cp.slices)
            handle = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
                gi_handle, cp.id, ctypes.byref(placement)
            )
        info = pynvml.nvmlComputeInstanceGetInfo(handle)
    except NVML_ERRORS as exc:
        raise failure(what, exc) from None
    devices = mig.mig_devices(dev, None)
    return mig.compute_instance(info, gpu_instance_id, profile, cp, devices)


def destroy_compute_instance(dev: Device, gpu_instance_id: int, compute_instance_id: int) -> None:
    gi_handle = _gi_handle(dev, gpu_instance_id)
    what = "cannot destroy compute instance %d of GPU instance %d on GPU %d" % (
        compute_instance_id,
        gpu_instance_id,
        dev.index,
    )
    try:
        handle = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi_handle, compute_instance_id)
        pynvml.nvmlComputeInstanceDestroy(handle)
    except NVML_ERRORS as exc:
        raise failure(what, exc) from None
