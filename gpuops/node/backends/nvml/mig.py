"""A MIG-enabled GPU as NVML shows it: its profile tables (read once per GPU), its GPU and
compute instances, the MIG devices that carry their UUIDs and memory, and each GPU instance's
figures at a sample (memory from its MIG devices, SM utilization from GPM: gpm.py).

Profile names are the catalog's (gpuops.core.mig.catalog) where the GPU is known, else NVML's.

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

from gpuops.core.model import ComputeInstance, GpuInstance, MigInstanceSample, MigState, NotAvailable
from gpuops.node.backends.nvml import gpm
from gpuops.node.backends.nvml.devices import CiProfile, Device, GiProfile, MemoryInfo
from gpuops.node.backends.nvml.library import Call, MiB, call, pynvml, text

# Fallbacks where pynvml is older than the constants we use.
_GI_PROFILE_COUNT_DEFAULT = 0x12
_CI_PROFILE_COUNT_DEFAULT = 0x9


class MigDevice:
    """A MIG device (one compute instance's handle): its ids, UUID and, when asked, memory."""

    __slots__ = ("compute_instance_id", "gpu_instance_id", "handle", "memory", "uuid")

    def __init__(self, handle: Any, gpu_instance_id: int, compute_instance_id: int, uuid: str) -> None:
        self.handle = handle
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.uuid = uuid
        self.memory: Optional[Call] = None


MigDevices = Dict[Tuple[int, int], MigDevice]  # by (GPU instance id, compute instance id)


def gi_profiles(dev: Device) -> Dict[int, GiProfile]:
    """The GPU's GPU instance profiles by id, read once (again while the GPU is lost)."""
    if dev.gi_profiles is not None:
        return dev.gi_profiles
    profiles: Dict[int, GiProfile] = {}
    lost = False
    count = getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_PROFILE_COUNT_DEFAULT)
    versioned = True
    for enum in range(count):
        got = call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev.handle, enum, 2 if versioned else 1)
        if got.error == "FUNCTION_NOT_FOUND" and versioned:
            versioned = False  # driver before the V call: v1 has no name
            got = call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev.handle, enum, 1)
        if got.error == "GPU_IS_LOST":
            lost = True
        if not got.ok:
            continue  # NOT_SUPPORTED / INVALID_ARGUMENT: no such profile on this GPU
        info = got.value
        pid = int(info.id)
        name = text(getattr(info, "name", b"")).strip()
        if name.upper().startswith("MIG "):
            name = name[4:].strip()
        if dev.model is not None:
            known = dev.model.find_profile(pid)
            if known is not None:
                name = known.name
        if not name:
            name = "%dg.%dgb" % (int(info.sliceCount), round(int(info.memorySizeMB) / 1024.0))
        profiles[pid] = GiProfile(
            enum=enum,
            id=pid,
            name=name,
            compute_slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            sms=int(info.multiprocessorCount),
            memory_mib=int(info.memorySizeMB),
        )
    if not lost:
        dev.gi_profiles = profiles
    return profiles


def ci_profiles(dev: Device, gi_handle: Any, gi_profile: GiProfile) -> List[CiProfile]:
    """The compute instance profiles of a GPU instance of `gi_profile`, each read once."""
    out: List[CiProfile] = []
    count = getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT_DEFAULT)
    shared = getattr(pynvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    for enum in range(count):
        key = (gi_profile.id, enum)
        if key not in dev.ci_profiles:
            got = call(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi_handle, enum, shared, 1)
            if got.error == "GPU_IS_LOST":
                continue  # not cached: ask again next time
            profile = None
            if got.ok:
                v = got.value
                profile = CiProfile(
                    int(v.id), int(v.sliceCount), int(v.instanceCount), int(v.multiprocessorCount)
                )
            dev.ci_profiles[key] = profile
        cached = dev.ci_profiles[key]
        if cached is not None:
            out.append(cached)
    return out


def mig_devices(dev: Device, memory: Optional[MemoryInfo]) -> MigDevices:
    """MIG device handles by (GPU instance id, compute instance id), with UUID (and memory, read
    with `memory` when given)."""
    out: MigDevices = {}
    count = call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev.handle)
    if not count.ok:
        return out
    for i in range(int(count.value)):
        got = call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev.handle, i)
        if not got.ok:
            continue  # NOT_FOUND: no MIG device at this index
        gi = call(pynvml.nvmlDeviceGetGpuInstanceId, got.value)
        ci = call(pynvml.nvmlDeviceGetComputeInstanceId, got.value)
        if not (gi.ok and ci.ok):
            continue
        uuid = call(pynvml.nvmlDeviceGetUUID, got.value)
        mig = MigDevice(got.value, int(gi.value), int(ci.value), text(uuid.value) if uuid.ok else "")
        if memory is not None:
            mig.memory = memory(got.value)
        out[(mig.gpu_instance_id, mig.compute_instance_id)] = mig
    return out


def gpu_instances(dev: Device, devices: MigDevices) -> Tuple[GpuInstance, ...]:
    """The GPU's GPU instances (with their compute instances), by start slice."""
    instances: List[GpuInstance] = []
    for profile in gi_profiles(dev).values():
        if profile.instance_count <= 0:
            continue
        handles = (pynvml.c_nvmlGpuInstance_t * profile.instance_count)()
        n = ctypes.c_uint(0)
        got = call(pynvml.nvmlDeviceGetGpuInstances, dev.handle, profile.id, handles, ctypes.byref(n))
        if not got.ok:
            continue
        for k in range(min(int(n.value), profile.instance_count)):
            gi = gpu_instance(dev, handles[k], profile, devices)
            if gi is not None:
                instances.append(gi)
    instances.sort(key=lambda g: (g.start, g.id))
    return tuple(instances)


def gpu_instance(dev: Device, handle: Any, profile: GiProfile, devices: MigDevices) -> Optional[GpuInstance]:
    """One GPU instance of `profile` (None where NVML cannot say what it is)."""
    info = call(pynvml.nvmlGpuInstanceGetInfo, handle)
    if not info.ok:
        return None
    gi_id = int(info.value.id)
    cis: List[ComputeInstance] = []
    for cp in ci_profiles(dev, handle, profile):
        if cp.instance_count <= 0:
            continue
        handles = (pynvml.c_nvmlComputeInstance_t * cp.instance_count)()
        n = ctypes.c_uint(0)
        got = call(pynvml.nvmlGpuInstanceGetComputeInstances, handle, cp.id, handles, ctypes.byref(n))
        if not got.ok:
            continue
        for k in range(min(int(n.value), cp.instance_count)):
            ci_info = call(pynvml.nvmlComputeInstanceGetInfo, handles[k])
            if ci_info.ok:
                cis.append(compute_instance(ci_info.value, gi_id, profile, cp, devices))
    cis.sort(key=lambda c: (c.start, c.id))
    return GpuInstance(
        id=gi_id,
        profile_id=int(info.value.profileId),
        profile_name=profile.name,
        start=int(info.value.placement.start),
        size=int(info.value.placement.size),
        memory_total_bytes=profile.memory_mib * MiB,
        multiprocessor_count=profile.multiprocessor_count,
        compute_instances=tuple(cis),
    )


def compute_instance(
    info: Any, gi_id: int, profile: GiProfile, cp: CiProfile, devices: MigDevices
) -> ComputeInstance:
    """A compute instance from NVML's info of it; named as its GPU instance where it takes all
    of its slices, else "<slices>c.<GI profile>"."""
    ci_id = int(info.id)
    slices = int(info.placement.size) or cp.slices
    name = profile.name if slices >= profile.compute_slices else "%dc.%s" % (slices, profile.name)
    mig = devices.get((gi_id, ci_id))
    return ComputeInstance(
        id=ci_id,
        profile_id=int(info.profileId),
        name=name,
        start=int(info.placement.start),
        size=slices,
        multiprocessor_count=cp.multiprocessor_count,
        uuid=mig.uuid if mig is not None else "",
    )


def mig_state(dev: Device, memory: Optional[MemoryInfo]) -> Tuple[Optional[MigState], MigDevices]:
    """The GPU's MIG mode and layout (None: not MIG-capable, or the mode cannot be read now),
    and its MIG devices (with their memory when `memory` is given)."""
    if not dev.info.mig_capable:
        return None, {}
    mode = call(pynvml.nvmlDeviceGetMigMode, dev.handle)
    if not mode.ok:
        return None, {}  # MIG mode cannot be read now (e.g. GPU_IS_LOST)
    current, pending = bool(mode.value[0]), bool(mode.value[1])
    if not current:
        return MigState(current=False, pending=pending), {}
    devices = mig_devices(dev, memory)
    return MigState(True, pending, gpu_instances(dev, devices)), devices


def mig_samples(dev: Device, state: Optional[MigState], devices: MigDevices) -> Tuple[MigInstanceSample, ...]:
    """Each GPU instance's memory (from its first MIG device) and SM utilization (GPM)."""
    if state is None or not state.current:
        gpm.forget(dev, set())
        return ()
    utilization = gpm.utilization(dev, [gi.id for gi in state.gpu_instances])
    by_gi: Dict[int, MigDevice] = {}
    for (gi_id, _ci_id), mig in sorted(devices.items()):
        by_gi.setdefault(gi_id, mig)  # every MIG device of a GI reports the GI's memory
    out: List[MigInstanceSample] = []
    for gi in state.gpu_instances:
        first = by_gi.get(gi.id)
        if first is None or first.memory is None:
            na = NotAvailable("NOT_FOUND")  # a GI without compute instances has no MIG device
            out.append(MigInstanceSample(gi.id, na, gi.memory_total_bytes, utilization[gi.id]))
            continue
        out.append(
            MigInstanceSample(
                gpu_instance_id=gi.id,
                memory_used_bytes=first.memory.metric(lambda m: int(m.used)),
                memory_total_bytes=first.memory.metric(lambda m: int(m.total)),
                sm_utilization_percent=utilization[gi.id],
            )
        )
    return tuple(out)
