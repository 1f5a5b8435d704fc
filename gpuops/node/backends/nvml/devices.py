"""The GPUs of the machine: each one's handle and what is read once (identity, PCI ids, memory
total, power limit, MIG profile tables), and the readings of a whole GPU at each sample.

Handles and what does not change are read once per GPU and cached (`DeviceTable`); a GPU whose
handle cannot be had still appears, as a `GpuInfo` whose figures are n/a, and is asked again
next time. A GPU that fell off the bus while being read is not cached either.

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

from gpuops.core.mig.catalog import MigModel, model_for_gpu
from gpuops.core.model import GpuInfo, GpuSample, IntMetric, NotAvailable
from gpuops.node.backends.base import BackendError
from gpuops.node.backends.nvml.library import Call, call, pynvml, text

_ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}


class GiProfile:
    """A GPU instance profile as NVML reports it (nvmlDeviceGetGpuInstanceProfileInfo)."""

    __slots__ = (
        "compute_slices",
        "enum",
        "id",
        "instance_count",
        "memory_mib",
        "multiprocessor_count",
        "name",
    )

    def __init__(
        self,
        enum: int,
        id: int,
        name: str,
        compute_slices: int,
        instance_count: int,
        sms: int,
        memory_mib: int,
    ) -> None:
        self.enum = enum
        self.id = id
        self.name = name
        self.compute_slices = compute_slices
        self.instance_count = instance_count
        self.multiprocessor_count = sms
        self.memory_mib = memory_mib


class CiProfile:
    """A compute instance profile as NVML reports it (nvmlGpuInstanceGetComputeInstanceProfileInfo)."""

    __slots__ = ("id", "instance_count", "multiprocessor_count", "slices")

    def __init__(self, id: int, slices: int, instance_count: int, sms: int) -> None:
        self.id = id
        self.slices = slices
        self.instance_count = instance_count
        self.multiprocessor_count = sms


class GpmState:
    """A GPU instance's previous GPM sample (a buffer NVML filled), when it was taken, and the
    utilization last computed from two samples (gpm.py)."""

    __slots__ = ("buffer", "taken", "value")

    def __init__(self, buffer: Any, taken: float) -> None:
        self.buffer = buffer
        self.taken = taken
        self.value: Union[float, NotAvailable] = NotAvailable("NO_DATA")


class Device:
    """One GPU: its handle, what is read once, and what its readers keep between samples."""

    def __init__(self, index: int, handle: Any, info: GpuInfo, model: Optional[MigModel]) -> None:
        self.index = index
        self.handle = handle
        self.info = info
        self.model = model
        self.gi_profiles: Optional[Dict[int, GiProfile]] = None  # by info.id (mig.py)
        self.ci_profiles: Dict[Tuple[int, int], Optional[CiProfile]] = {}  # (GI profile id, CI enum)
        self.gpm_error: Optional[str] = None  # "" where GPM works, else why not; None: not asked yet
        self.gpm: Dict[int, GpmState] = {}  # by GPU instance id (gpm.py)


class MemoryInfo:
    """nvmlDeviceGetMemoryInfo of a GPU or MIG device handle: the v2 call until the driver says
    it has none (before R510), then v1."""

    def __init__(self) -> None:
        self.v2 = True

    def __call__(self, handle: Any) -> Call:
        if self.v2:
            got = call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
            if got.error not in ("FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH"):
                return got
            self.v2 = False  # driver before R510: only the v1 call
        return call(pynvml.nvmlDeviceGetMemoryInfo, handle)


def lost_info(index: int, code: str) -> GpuInfo:
    """The stand-in of a GPU whose handle cannot be had: its index, its figures n/a (`code`)."""
    na = NotAvailable(code)
    return GpuInfo(
        index=index,
        uuid="",
        name="",
        pci_bus_id="",
        pci_device_id=0,
        memory_total_bytes=na,
        mig_capable=False,
        multiprocessor_count=na,
        power_limit_watts=na,
    )


def lost_code(info: GpuInfo) -> str:
    """Why a stand-in GpuInfo (`lost_info`) has no figures."""
    reason = info.memory_total_bytes
    return reason.reason if isinstance(reason, NotAvailable) else "UNKNOWN"


def na_sample(timestamp: float, code: str) -> GpuSample:
    na = NotAvailable(code)
    return GpuSample(timestamp, na, na, na, na, na, na, na, na)


def read_versions() -> Tuple[str, str]:
    """(driver version, CUDA driver version as "12.4"), "" where NVML does not say."""
    driver_version = cuda_version = ""
    driver = call(pynvml.nvmlSystemGetDriverVersion)
    if driver.ok:
        driver_version = text(driver.value)
    cuda = call(pynvml.nvmlSystemGetCudaDriverVersion)
    if cuda.ok and isinstance(cuda.value, int) and cuda.value > 0:
        cuda_version = "%d.%d" % (cuda.value // 1000, (cuda.value % 1000) // 10)
    return driver_version, cuda_version


def read_static(index: int, handle: Any, memory: MemoryInfo) -> Tuple[Device, bool]:
    """A GPU's facts read once, and whether it fell off the bus meanwhile (GPU_IS_LOST)."""
    name = call(pynvml.nvmlDeviceGetName, handle)
    uuid = call(pynvml.nvmlDeviceGetUUID, handle)
    pci = call(pynvml.nvmlDeviceGetPciInfo_v3, handle)
    total = memory(handle)
    mig = call(pynvml.nvmlDeviceGetMigMode, handle)
    power_limit = call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    attributes = call(pynvml.nvmlDeviceGetAttributes_v2, handle)
    arch = call(pynvml.nvmlDeviceGetArchitecture, handle)
    calls = (name, uuid, pci, total, mig, power_limit, attributes, arch)
    lost = any(c.error == "GPU_IS_LOST" for c in calls)

    gpu_name = text(name.value) if name.ok else ""
    bus_id = ""
    device_id = 0
    if pci.ok:
        bus_id = text(pci.value.busId)
        device_id = int(pci.value.pciDeviceId)
    model = model_for_gpu(gpu_name, device_id or None) if gpu_name or device_id else None
    architecture = model.architecture if model is not None else ""
    if not architecture and arch.ok:
        architecture = _ARCHITECTURES.get(int(arch.value), "")
    sms: IntMetric = attributes.metric(lambda a: int(a.multiprocessorCount))
    if isinstance(sms, NotAvailable) and model is not None:
        sms = model.multiprocessor_count  # NVML answers attributes for MIG devices only
    info = GpuInfo(
        index=index,
        uuid=text(uuid.value) if uuid.ok else "",
        name=gpu_name,
        pci_bus_id=bus_id,
        pci_device_id=device_id,
        memory_total_bytes=total.metric(lambda m: int(m.total)),
        mig_capable=mig.ok,
        mig_model=model.key if (model is not None and mig.ok) else None,
        architecture=architecture,
        multiprocessor_count=sms,
        power_limit_watts=power_limit.metric(lambda mw: int(mw) / 1000.0),
    )
    return Device(index, handle, info, model), lost


def read_sample(dev: Device, timestamp: float, memory: MemoryInfo) -> GpuSample:
    """A whole GPU's figures now (utilization NOT_SUPPORTED with MIG on: see mig.py, gpm.py)."""
    h = dev.handle
    util = call(pynvml.nvmlDeviceGetUtilizationRates, h)
    used = memory(h)
    power = call(pynvml.nvmlDeviceGetPowerUsage, h)
    temperature = call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    sm_clock = call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    mem_clock = call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
    return GpuSample(
        timestamp=timestamp,
        utilization_gpu_percent=util.metric(lambda u: float(u.gpu)),
        utilization_memory_percent=util.metric(lambda u: float(u.memory)),
        memory_used_bytes=used.metric(lambda m: int(m.used)),
        memory_total_bytes=used.metric(lambda m: int(m.total)),
        power_watts=power.metric(lambda mw: int(mw) / 1000.0),
        temperature_celsius=temperature.metric(float),
        sm_clock_mhz=sm_clock.metric(int),
        memory_clock_mhz=mem_clock.metric(int),
    )


class DeviceTable:
    """The machine's GPUs by index: each read once (`Device`), or a stand-in `GpuInfo` (figures
    n/a) while its handle cannot be had."""

    def __init__(self, count: int, hostname: str, memory: MemoryInfo) -> None:
        self.count = count
        self.hostname = hostname
        self.memory = memory
        self.devices: Dict[int, Device] = {}

    def get(self, index: int) -> Union[Device, GpuInfo]:
        """The cached device, or a stand-in GpuInfo (figures n/a) while its handle cannot be had."""
        dev = self.devices.get(index)
        if dev is not None:
            return dev
        got = call(pynvml.nvmlDeviceGetHandleByIndex, index)
        if not got.ok:
            return lost_info(index, got.error)
        dev, lost = read_static(index, got.value, self.memory)
        if not lost:  # read again next time if the GPU fell off the bus meanwhile
            self.devices[index] = dev
        return dev

    def all(self) -> List[Union[Device, GpuInfo]]:
        return [self.get(i) for i in range(self.count)]

    def reachable(self, gpu: int) -> Device:
        """GPU `gpu`, or BackendError: no such GPU (INVALID_ARGUMENT), or why it cannot be reached."""
        if not isinstance(gpu, int) or not 0 <= gpu < self.count:
            raise BackendError(
                "INVALID_ARGUMENT", "no GPU %r on %s (%d GPUs)" % (gpu, self.hostname, self.count)
            )
        dev = self.get(gpu)
        if isinstance(dev, GpuInfo):
            code = lost_code(dev)
            raise BackendError(code, "GPU %d cannot be reached (%s)" % (gpu, code))
        return dev
