"""The real node backend: NVIDIA's NVML through pynvml (the `nvidia-ml-py` package).

Every NVML query can fail on its own (NOT_SUPPORTED on a MIG-enabled GPU, GPU_IS_LOST,
FUNCTION_NOT_FOUND on an older driver, NO_PERMISSION, ...). Each call is made separately and a
failure becomes `NotAvailable(<code>)` in that one field; the rest of the sample survives, and a
GPU whose handle cannot be had still appears, with its figures n/a.

Costs: handles and what does not change (name, UUID, PCI ids, memory total, power limit, MIG
profile tables) are read once per GPU and cached; a sample then makes about ten NVML calls per
GPU, plus the MIG layout walk on MIG-enabled GPUs.

Threads: NVML itself is thread-safe, but this class keeps caches without locks. Call one backend
from one thread at a time (the agent does all backend calls from one worker thread). pynvml and
the loaded library are process-global: use one NvmlBackend per process.

Library: pynvml opens ``libnvidia-ml.so.1`` through the dynamic linker. ``NvmlBackend(library=...)``
or ``$GPUOPS_NVML_LIBRARY`` names another file: it is loaded first, so the dynamic linker finds
it by its soname when pynvml asks (and it is handed to pynvml directly when pynvml has not loaded
a library yet). This is how the tests run the real pynvml ctypes path against a fake library.

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import os
import pwd
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type, TypeVar, Union

from gpuops.core.mig.catalog import MigModel, model_for_gpu
from gpuops.core.model import (
    ComputeInstance,
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    IntMetric,
    MigInstanceSample,
    MigState,
    Node,
    NodeSample,
    NotAvailable,
)
from gpuops.node.backends.base import (
    ERROR_CODES,
    Backend,
    BackendError,
    BackendUnavailable,
    EventSource,
    MigModeChange,
    RawEvent,
)
from gpuops.node.mps import BinaryMpsControl, MpsControl

try:  # pragma: no cover - exercised by the "no pynvml" path only
    import pynvml
except ImportError:  # pragma: no cover
    pynvml = None

T = TypeVar("T")

LIBRARY_ENV = "GPUOPS_NVML_LIBRARY"
SONAME = "libnvidia-ml.so.1"
MiB = 1 << 20
NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process that is not on a MIG device

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

GPM_MIN_INTERVAL = 0.1  # seconds between two GPM samples of one instance (nvml.h: "> 100ms")

# Fallbacks where pynvml is older than the constants we use.
_GI_PROFILE_COUNT_DEFAULT = 0x12
_CI_PROFILE_COUNT_DEFAULT = 0x9


def _error_names() -> Dict[int, str]:
    names: Dict[int, str] = {}
    if pynvml is None:  # pragma: no cover
        return names
    for attr in dir(pynvml):
        if attr.startswith("NVML_ERROR_"):
            value = getattr(pynvml, attr)
            if isinstance(value, int):
                names.setdefault(value, attr[len("NVML_ERROR_") :])
    return names


_ERROR_NAMES = _error_names()


def error_code(exc: BaseException) -> str:
    """The NVML code name of an exception from pynvml ("NOT_SUPPORTED", "GPU_IS_LOST", ...)."""
    if pynvml is not None and isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return "FUNCTION_NOT_FOUND"
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return _ERROR_NAMES.get(value, "UNKNOWN")
    return "UNKNOWN"


def _nvml_errors() -> Tuple[Type[BaseException], ...]:
    if pynvml is None:  # pragma: no cover
        return ()
    return (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)


_NVML_ERRORS = _nvml_errors()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ calls into the library  # pragma: no cover
        return error_code(exc)


class _Call:
    """The outcome of one NVML call: `value`, or `error` (an NVML code name)."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: str = "") -> None:
        self.value = value
        self.error = error

    @property
    def ok(self) -> bool:
        return not self.error

    def metric(self, convert: Callable[[Any], T]) -> Union[T, NotAvailable]:
        if self.error:
            return NotAvailable(self.error)
        return convert(self.value)


def _call(fn: Callable[..., Any], *args: Any) -> _Call:
    try:
        return _Call(fn(*args))
    except _NVML_ERRORS as exc:
        return _Call(error=error_code(exc))


def _raise(what: str, exc: BaseException) -> BackendError:
    code = error_code(exc)
    message = "%s: %s" % (what, _message(exc))
    if code == "IN_USE":
        message += " (stop the processes using it first)"
    elif code == "NO_PERMISSION":
        message += " (MIG changes need root)"
    return BackendError(code if code in ERROR_CODES else "UNKNOWN", message)


def _unavailable_message(exc: BaseException, library: Optional[str]) -> str:
    code = error_code(exc)
    if code == "LIBRARY_NOT_FOUND":
        if library:
            return "NVML is unavailable: %s could not be loaded" % library
        return "NVML is unavailable: %s not found (no NVIDIA driver on this machine?)" % SONAME
    if code == "DRIVER_NOT_LOADED":
        return "NVML is unavailable: the NVIDIA kernel driver is not loaded (is nvidia.ko loaded?)"
    if code == "NO_PERMISSION":
        return "NVML is unavailable: no permission to open the NVIDIA device files (/dev/nvidia*)"
    if code == "LIB_RM_VERSION_MISMATCH":
        return "NVML is unavailable: the NVML library and the kernel driver versions differ (reboot?)"
    if code == "FUNCTION_NOT_FOUND":
        return "NVML is unavailable: the NVML library is too old for this pynvml (nvmlInit missing)"
    return "NVML is unavailable: nvmlInit failed: %s (%s)" % (_message(exc), code)


def _preload(path: str) -> None:
    """Load `path` so that pynvml's dlopen of the soname finds it; raise BackendUnavailable."""
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 2))
    except OSError as exc:
        raise BackendUnavailable("NVML is unavailable: cannot load %s (%s)" % (path, exc)) from None
    # If pynvml has not opened a library yet, give it this one: this also works for a file
    # whose soname is not libnvidia-ml.so.1.
    if getattr(pynvml, "nvmlLib", None) is None:
        pynvml.nvmlLib = lib


class _GiProfile:
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


class _CiProfile:
    __slots__ = ("id", "instance_count", "multiprocessor_count", "slices")

    def __init__(self, id: int, slices: int, instance_count: int, sms: int) -> None:
        self.id = id
        self.slices = slices
        self.instance_count = instance_count
        self.multiprocessor_count = sms


class _MigDevice:
    __slots__ = ("compute_instance_id", "gpu_instance_id", "handle", "memory", "uuid")

    def __init__(self, handle: Any, gpu_instance_id: int, compute_instance_id: int, uuid: str) -> None:
        self.handle = handle
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.uuid = uuid
        self.memory: Optional[_Call] = None


class _Device:
    """One GPU: its handle and what is read once."""

    def __init__(self, index: int, handle: Any, info: GpuInfo, model: Optional[MigModel]) -> None:
        self.index = index
        self.handle = handle
        self.info = info
        self.model = model
        self.gi_profiles: Optional[Dict[int, _GiProfile]] = None  # by info.id
        self.ci_profiles: Dict[Tuple[int, int], Optional[_CiProfile]] = {}  # (GI profile id, CI enum)
        self.gpm_error: Optional[str] = None  # "" where GPM works, else why not; None: not asked yet
        self.gpm: Dict[int, _GpmState] = {}  # by GPU instance id


class _GpmState:
    """A GPU instance's previous GPM sample (a buffer NVML filled), when it was taken, and the
    utilization last computed from two samples."""

    __slots__ = ("buffer", "taken", "value")

    def __init__(self, buffer: Any, taken: float) -> None:
        self.buffer = buffer
        self.taken = taken
        self.value: Union[float, NotAvailable] = NotAvailable("NO_DATA")


def _lost_info(index: int, code: str) -> GpuInfo:
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


def _na_sample(timestamp: float, code: str) -> GpuSample:
    na = NotAvailable(code)
    return GpuSample(timestamp, na, na, na, na, na, na, na, na)


MAX_PROCESS_GROUPS = 32  # groups reported per process (a sample must stay small)
MAX_CGROUP = 1024  # characters of a cgroup path reported


def read_gids(status_path: str) -> List[int]:
    """The group ids of a process from its /proc/<pid>/status: the real gid (the primary group)
    first, then the supplementary groups in the kernel's order, each once; [] where unreadable."""
    gids: List[int] = []
    try:
        with open(status_path, "rb") as f:
            for line in f:
                if line.startswith(b"Gid:"):
                    gids.insert(0, int(line.split()[1]))
                elif line.startswith(b"Groups:"):
                    gids.extend(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError, IndexError):
        return []
    unique: List[int] = []
    for gid in gids:
        if gid not in unique:
            unique.append(gid)
            if len(unique) == MAX_PROCESS_GROUPS:
                break
    return unique


def read_cgroup(cgroup_path: str) -> str:
    """The cgroup of a process from its /proc/<pid>/cgroup: the unified (v2) path, else the
    first v1 path that is not the root; "" where unreadable."""
    try:
        with open(cgroup_path, "rb") as f:
            raw = f.read(65536)
    except OSError:
        return ""
    unified = first = ""
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            unified = parts[2]
        elif not first and parts[2] not in ("", "/"):
            first = parts[2]
    chosen = unified if unified not in ("", "/") else (first or unified)
    return chosen[:MAX_CGROUP]


# The NVML event types the agent listens to, by the kind it calls them (core/model.py).
_EVENT_KINDS = (
    (0x0000000000000008, "xid"),  # nvmlEventTypeXidCriticalError
    (0x0000000000000002, "ecc_double_bit"),  # nvmlEventTypeDoubleBitEccError
    (0x0000000000000001, "ecc_single_bit"),  # nvmlEventTypeSingleBitEccError
    (0x0000000000000010, "clock"),  # nvmlEventTypeClock
)
_EVENT_MASK = 0
for _bit, _kind in _EVENT_KINDS:
    _EVENT_MASK |= _bit


def _address(handle: Any) -> Optional[int]:
    """A device handle's address: how an event's `device` is matched to a GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _instance_id(value: int) -> Optional[int]:
    return None if int(value) == NO_ID else int(value)


class _NvmlEvents(EventSource):
    """An NVML event set, waited on from the agent's health thread (node/health.py).

    NVML allows these calls while the backend's thread makes others on device handles; this
    object touches nothing of the backend's but the handles' addresses read at its making."""

    def __init__(self, event_set: Any, devices: Dict[Optional[int], Tuple[int, str]]) -> None:
        self._set = event_set
        self._devices = devices

    def wait(self, timeout: float) -> Optional[RawEvent]:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, max(1, int(timeout * 1000)))
        except _NVML_ERRORS as exc:
            code = error_code(exc)
            if code == "TIMEOUT":  # nothing came (or a signal cut the wait short)
                return None
            raise BackendError(code, "waiting for NVML events: %s" % _message(exc)) from None
        index, uuid = self._devices.get(_address(data.device), (-1, ""))
        kind = next((k for bit, k in _EVENT_KINDS if int(data.eventType) & bit), "other")
        return RawEvent(
            gpu=index,
            kind=kind,
            xid=int(data.eventData) if kind == "xid" else None,
            gpu_instance_id=_instance_id(data.gpuInstanceId),
            compute_instance_id=_instance_id(data.computeInstanceId),
            uuid=uuid,
        )

    def close(self) -> None:
        if self._set is not None:
            event_set, self._set = self._set, None
            with contextlib.suppress(*_NVML_ERRORS):
                pynvml.nvmlEventSetFree(event_set)


class NvmlBackend(Backend):
    """GPU facts from NVML; MIG control through NVML (root needed for changes)."""

    name = "nvml"

    def __init__(self, library: Optional[str] = None) -> None:
        if pynvml is None:  # pragma: no cover
            raise BackendUnavailable(
                "NVML is unavailable: pynvml is not installed (pip install nvidia-ml-py)"
            )
        path = library or os.environ.get(LIBRARY_ENV) or None
        if path:
            _preload(path)
        try:
            pynvml.nvmlInit()
        except _NVML_ERRORS as exc:
            raise BackendUnavailable(_unavailable_message(exc, path)) from None
        self._open = True
        try:
            self._count = int(pynvml.nvmlDeviceGetCount())
        except _NVML_ERRORS as exc:
            self._shutdown()
            raise BackendUnavailable("NVML is unavailable: cannot count GPUs: %s" % _message(exc)) from None
        self._hostname = socket.gethostname()
        self._driver_version = ""
        self._cuda_driver_version = ""
        self._devices: Dict[int, _Device] = {}
        self._memory_v2 = True  # nvmlDeviceGetMemoryInfo_v2 until the driver says otherwise
        self._users: Dict[int, str] = {}
        self._group_names: Dict[int, str] = {}
        self._read_versions()

    # ---- life cycle ------------------------------------------------------------------------
    def capabilities(self) -> Tuple[str, ...]:
        return ("inventory", "sample", "mig-control")

    def mps_control(self) -> MpsControl:
        """The real `nvidia-cuda-mps-control` (from PATH)."""
        return BinaryMpsControl()

    def event_source(self) -> EventSource:
        """An NVML event set with each GPU's XID, ECC and clock events, those it supports."""
        devices = [d for d in self._devices_now() if isinstance(d, _Device)]
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except _NVML_ERRORS as exc:
            raise _raise("cannot create an NVML event set", exc) from None
        registered: Dict[Optional[int], Tuple[int, str]] = {}
        codes: List[str] = []
        for dev in devices:
            supported = _call(pynvml.nvmlDeviceGetSupportedEventTypes, dev.handle)
            if not supported.ok:
                codes.append(supported.error)
                continue
            wanted = int(supported.value) & _EVENT_MASK
            if not wanted:
                codes.append("NOT_SUPPORTED")
                continue
            got = _call(pynvml.nvmlDeviceRegisterEvents, dev.handle, wanted, event_set)
            if not got.ok:  # NOT_SUPPORTED: none of these registered, the set is still usable
                codes.append(got.error)
                continue
            registered[_address(dev.handle)] = (dev.index, dev.info.uuid)
        if not registered:
            with contextlib.suppress(*_NVML_ERRORS):
                pynvml.nvmlEventSetFree(event_set)
            code = codes[0] if codes else "NOT_FOUND"
            raise BackendError(code, "no GPU gives health events (%s)" % code)
        return _NvmlEvents(event_set, registered)

    def close(self) -> None:
        if self._open:
            self._open = False
            for dev in self._devices.values():
                self._gpm_forget(dev, set())
            self._devices.clear()
            self._shutdown()

    def _shutdown(self) -> None:
        with contextlib.suppress(*_NVML_ERRORS):
            pynvml.nvmlShutdown()

    def _check_open(self) -> None:
        if not self._open:
            raise BackendError("UNINITIALIZED", "the NVML backend was closed")

    def _read_versions(self) -> None:
        driver = _call(pynvml.nvmlSystemGetDriverVersion)
        if driver.ok:
            self._driver_version = _text(driver.value)
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion)
        if cuda.ok and isinstance(cuda.value, int) and cuda.value > 0:
            self._cuda_driver_version = "%d.%d" % (cuda.value // 1000, (cuda.value % 1000) // 10)

    # ---- devices -----------------------------------------------------------------------------
    def _device(self, index: int) -> Union[_Device, GpuInfo]:
        """The cached device, or a stand-in GpuInfo (figures n/a) while its handle cannot be had."""
        dev = self._devices.get(index)
        if dev is not None:
            return dev
        got = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
        if not got.ok:
            return _lost_info(index, got.error)
        dev, lost = self._read_static(index, got.value)
        if not lost:  # read again next time if the GPU fell off the bus meanwhile
            self._devices[index] = dev
        return dev

    def _read_static(self, index: int, handle: Any) -> Tuple[_Device, bool]:
        name = _call(pynvml.nvmlDeviceGetName, handle)
        uuid = _call(pynvml.nvmlDeviceGetUUID, handle)
        pci = _call(pynvml.nvmlDeviceGetPciInfo_v3, handle)
        memory = self._memory(handle)
        mig = _call(pynvml.nvmlDeviceGetMigMode, handle)
        power_limit = _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        attributes = _call(pynvml.nvmlDeviceGetAttributes_v2, handle)
        arch = _call(pynvml.nvmlDeviceGetArchitecture, handle)
        calls = (name, uuid, pci, memory, mig, power_limit, attributes, arch)
        lost = any(c.error == "GPU_IS_LOST" for c in calls)

        gpu_name = _text(name.value) if name.ok else ""
        bus_id = ""
        device_id = 0
        if pci.ok:
            bus_id = _text(pci.value.busId)
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
            uuid=_text(uuid.value) if uuid.ok else "",
            name=gpu_name,
            pci_bus_id=bus_id,
            pci_device_id=device_id,
            memory_total_bytes=memory.metric(lambda m: int(m.total)),
            mig_capable=mig.ok,
            mig_model=model.key if (model is not None and mig.ok) else None,
            architecture=architecture,
            multiprocessor_count=sms,
            power_limit_watts=power_limit.metric(lambda mw: int(mw) / 1000.0),
        )
        return _Device(index, handle, info, model), lost

    def _devices_now(self) -> List[Union[_Device, GpuInfo]]:
        self._check_open()
        return [self._device(i) for i in range(self._count)]

    def _handle(self, gpu: int) -> _Device:
        self._check_open()
        if not isinstance(gpu, int) or not 0 <= gpu < self._count:
            raise BackendError(
                "INVALID_ARGUMENT", "no GPU %r on %s (%d GPUs)" % (gpu, self._hostname, self._count)
            )
        dev = self._device(gpu)
        if isinstance(dev, GpuInfo):
            code = (
                dev.memory_total_bytes.reason
                if isinstance(dev.memory_total_bytes, NotAvailable)
                else "UNKNOWN"
            )
            raise BackendError(code, "GPU %d cannot be reached (%s)" % (gpu, code))
        return dev

    # ---- readings ----------------------------------------------------------------------------
    def _memory(self, handle: Any) -> _Call:
        if self._memory_v2:
            got = _call(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
            if got.error not in ("FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH"):
                return got
            self._memory_v2 = False  # driver before R510: only the v1 call
        return _call(pynvml.nvmlDeviceGetMemoryInfo, handle)

    def _sample(self, dev: _Device, timestamp: float) -> GpuSample:
        h = dev.handle
        util = _call(pynvml.nvmlDeviceGetUtilizationRates, h)
        memory = self._memory(h)
        power = _call(pynvml.nvmlDeviceGetPowerUsage, h)
        temperature = _call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        sm_clock = _call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem_clock = _call(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        return GpuSample(
            timestamp=timestamp,
            utilization_gpu_percent=util.metric(lambda u: float(u.gpu)),
            utilization_memory_percent=util.metric(lambda u: float(u.memory)),
            memory_used_bytes=memory.metric(lambda m: int(m.used)),
            memory_total_bytes=memory.metric(lambda m: int(m.total)),
            power_watts=power.metric(lambda mw: int(mw) / 1000.0),
            temperature_celsius=temperature.metric(float),
            sm_clock_mhz=sm_clock.metric(int),
            memory_clock_mhz=mem_clock.metric(int),
        )

    # ---- MIG layout --------------------------------------------------------------------------
    def _gi_profiles(self, dev: _Device) -> Dict[int, _GiProfile]:
        if dev.gi_profiles is not None:
            return dev.gi_profiles
        profiles: Dict[int, _GiProfile] = {}
        lost = False
        count = getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_PROFILE_COUNT_DEFAULT)
        versioned = True
        for enum in range(count):
            got = _call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev.handle, enum, 2 if versioned else 1)
            if got.error == "FUNCTION_NOT_FOUND" and versioned:
                versioned = False  # driver before the V call: v1 has no name
                got = _call(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, dev.handle, enum, 1)
            if got.error == "GPU_IS_LOST":
                lost = True
            if not got.ok:
                continue  # NOT_SUPPORTED / INVALID_ARGUMENT: no such profile on this GPU
            info = got.value
            pid = int(info.id)
            name = _text(getattr(info, "name", b"")).strip()
            if name.upper().startswith("MIG "):
                name = name[4:].strip()
            if dev.model is not None:
                known = dev.model.find_profile(pid)
                if known is not None:
                    name = known.name
            if not name:
                name = "%dg.%dgb" % (int(info.sliceCount), round(int(info.memorySizeMB) / 1024.0))
            profiles[pid] = _GiProfile(
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

    def _ci_profiles(self, dev: _Device, gi_handle: Any, gi_profile: _GiProfile) -> List[_CiProfile]:
        out: List[_CiProfile] = []
        count = getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_PROFILE_COUNT_DEFAULT)
        shared = getattr(pynvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        for enum in range(count):
            key = (gi_profile.id, enum)
            if key not in dev.ci_profiles:
                got = _call(pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi_handle, enum, shared, 1)
                if got.error == "GPU_IS_LOST":
                    continue  # not cached: ask again next time
                profile = None
                if got.ok:
                    v = got.value
                    profile = _CiProfile(
                        int(v.id), int(v.sliceCount), int(v.instanceCount), int(v.multiprocessorCount)
                    )
                dev.ci_profiles[key] = profile
            cached = dev.ci_profiles[key]
            if cached is not None:
                out.append(cached)
        return out

    def _mig_devices(self, dev: _Device, with_memory: bool) -> Dict[Tuple[int, int], _MigDevice]:
        """MIG device handles by (GPU instance id, compute instance id), with UUID (and memory)."""
        out: Dict[Tuple[int, int], _MigDevice] = {}
        count = _call(pynvml.nvmlDeviceGetMaxMigDeviceCount, dev.handle)
        if not count.ok:
            return out
        for i in range(int(count.value)):
            got = _call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, dev.handle, i)
            if not got.ok:
                continue  # NOT_FOUND: no MIG device at this index
            gi = _call(pynvml.nvmlDeviceGetGpuInstanceId, got.value)
            ci = _call(pynvml.nvmlDeviceGetComputeInstanceId, got.value)
            if not (gi.ok and ci.ok):
                continue
            uuid = _call(pynvml.nvmlDeviceGetUUID, got.value)
            mig = _MigDevice(got.value, int(gi.value), int(ci.value), _text(uuid.value) if uuid.ok else "")
            if with_memory:
                mig.memory = self._memory(got.value)
            out[(mig.gpu_instance_id, mig.compute_instance_id)] = mig
        return out

    def _gpu_instances(
        self, dev: _Device, mig_devices: Dict[Tuple[int, int], _MigDevice]
    ) -> Tuple[GpuInstance, ...]:
        instances: List[GpuInstance] = []
        for profile in self._gi_profiles(dev).values():
            if profile.instance_count <= 0:
                continue
            handles = (pynvml.c_nvmlGpuInstance_t * profile.instance_count)()
            n = ctypes.c_uint(0)
            got = _call(pynvml.nvmlDeviceGetGpuInstances, dev.handle, profile.id, handles, ctypes.byref(n))
            if not got.ok:
                continue
            for k in range(min(int(n.value), profile.instance_count)):
                gi = self._gpu_instance(dev, handles[k], profile, mig_devices)
                if gi is not None:
                    instances.append(gi)
        instances.sort(key=lambda g: (g.start, g.id))
        return tuple(instances)

    def _gpu_instance(
        self, dev: _Device, handle: Any, profile: _GiProfile, mig_devices: Dict[Tuple[int, int], _MigDevice]
    ) -> Optional[GpuInstance]:
        info = _call(pynvml.nvmlGpuInstanceGetInfo, handle)
        if not info.ok:
            return None
        gi_id = int(info.value.id)
        cis: List[ComputeInstance] = []
        for cp in self._ci_profiles(dev, handle, profile):
            if cp.instance_count <= 0:
                continue
            handles = (pynvml.c_nvmlComputeInstance_t * cp.instance_count)()
            n = ctypes.c_uint(0)
            got = _call(pynvml.nvmlGpuInstanceGetComputeInstances, handle, cp.id, handles, ctypes.byref(n))
            if not got.ok:
                continue
            for k in range(min(int(n.value), cp.instance_count)):
                ci_info = _call(pynvml.nvmlComputeInstanceGetInfo, handles[k])
                if ci_info.ok:
                    cis.append(self._compute_instance(ci_info.value, gi_id, profile, cp, mig_devices))
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

    @staticmethod
    def _compute_instance(
        info: Any,
        gi_id: int,
        profile: _GiProfile,
        cp: _CiProfile,
        mig_devices: Dict[Tuple[int, int], _MigDevice],
    ) -> ComputeInstance:
        ci_id = int(info.id)
        slices = int(info.placement.size) or cp.slices
        name = profile.name if slices >= profile.compute_slices else "%dc.%s" % (slices, profile.name)
        mig = mig_devices.get((gi_id, ci_id))
        return ComputeInstance(
            id=ci_id,
            profile_id=int(info.profileId),
            name=name,
            start=int(info.placement.start),
            size=slices,
            multiprocessor_count=cp.multiprocessor_count,
            uuid=mig.uuid if mig is not None else "",
        )

    def _mig_state(
        self, dev: _Device, with_memory: bool
    ) -> Tuple[Optional[MigState], Dict[Tuple[int, int], _MigDevice]]:
        if not dev.info.mig_capable:
            return None, {}
        mode = _call(pynvml.nvmlDeviceGetMigMode, dev.handle)
        if not mode.ok:
            return None, {}  # MIG mode cannot be read now (e.g. GPU_IS_LOST)
        current, pending = bool(mode.value[0]), bool(mode.value[1])
        if not current:
            return MigState(current=False, pending=pending), {}
        mig_devices = self._mig_devices(dev, with_memory)
        return MigState(True, pending, self._gpu_instances(dev, mig_devices)), mig_devices

    def _mig_samples(
        self, dev: _Device, state: Optional[MigState], mig_devices: Dict[Tuple[int, int], _MigDevice]
    ) -> Tuple[MigInstanceSample, ...]:
        if state is None or not state.current:
            self._gpm_forget(dev, set())
            return ()
        utilization = self._gpm_utilization(dev, [gi.id for gi in state.gpu_instances])
        by_gi: Dict[int, _MigDevice] = {}
        for (gi_id, _ci_id), mig in sorted(mig_devices.items()):
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

    # ---- GPM: utilization of MIG GPU instances -----------------------------------------------
    def _gpm_support(self, dev: _Device) -> str:
        """ "" where NVML's GPM works on this GPU (Hopper and newer), else NVML's reason."""
        if dev.gpm_error is None:
            if not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):  # a pynvml older than GPM
                dev.gpm_error = "FUNCTION_NOT_FOUND"
                return dev.gpm_error
            got = _call(pynvml.nvmlGpmQueryDeviceSupport, dev.handle)
            if got.error == "GPU_IS_LOST":
                return got.error  # ask again once it is back
            dev.gpm_error = got.error or ("" if int(got.value.isSupportedDevice) else "NOT_SUPPORTED")
        return dev.gpm_error

    def _gpm_utilization(self, dev: _Device, gi_ids: List[int]) -> Dict[int, Union[float, NotAvailable]]:
        """Each GPU instance's SM utilization (percent) between its previous GPM sample and one
        taken now: NVML's utilization rates are NOT_SUPPORTED with MIG on, GPM's are not. The
        first sample of an instance has nothing to compare with (NO_DATA). Samples closer than
        GPM_MIN_INTERVAL keep the previous figure: NVML refreshes its counters at that rate."""
        support = self._gpm_support(dev)
        if support:
            return {gi: NotAvailable(support) for gi in gi_ids}
        self._gpm_forget(dev, set(gi_ids))
        out: Dict[int, Union[float, NotAvailable]] = {}
        now = time.monotonic()
        for gi in gi_ids:
            state = dev.gpm.get(gi)
            if state is not None and now - state.taken < GPM_MIN_INTERVAL:
                out[gi] = state.value
                continue
            buffer = _call(pynvml.nvmlGpmSampleAlloc)
            if not buffer.ok:
                out[gi] = NotAvailable(buffer.error)
                continue
            got = _call(pynvml.nvmlGpmMigSampleGet, dev.handle, gi, buffer.value)
            if not got.ok:
                _call(pynvml.nvmlGpmSampleFree, buffer.value)
                out[gi] = NotAvailable(got.error)
                continue
            fresh = _GpmState(buffer.value, now)
            if state is not None:
                fresh.value = self._gpm_sm_util(state.buffer, fresh.buffer)
                _call(pynvml.nvmlGpmSampleFree, state.buffer)
            dev.gpm[gi] = fresh
            out[gi] = fresh.value
        return out

    @staticmethod
    def _gpm_sm_util(before: Any, after: Any) -> Union[float, NotAvailable]:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = before
        request.sample2 = after
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        got = _call(pynvml.nvmlGpmMetricsGet, request)
        if not got.ok:
            return NotAvailable(got.error)
        metric = request.metrics[0]
        if int(metric.nvmlReturn) != 0:
            return NotAvailable(_ERROR_NAMES.get(int(metric.nvmlReturn), "UNKNOWN"))
        return round(min(max(float(metric.value), 0.0), 100.0), 2)

    @staticmethod
    def _gpm_forget(dev: _Device, keep: Set[int]) -> None:
        """Free the GPM buffers of GPU instances that are gone (or of all: MIG off, closing)."""
        for gi in [g for g in dev.gpm if g not in keep]:
            _call(pynvml.nvmlGpmSampleFree, dev.gpm.pop(gi).buffer)

    # ---- processes ---------------------------------------------------------------------------
    @staticmethod
    def _process_lists(handle: Any, found: Dict[Tuple[int, int, int], Any], ids: Tuple[int, int]) -> str:
        """Add the compute and graphics processes of `handle` to `found`.

        Returns "" if at least one list came, else the NVML code of the failure.
        """
        any_ok = False
        failure = "UNKNOWN"
        for names in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
            ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
        ):
            got = _Call(error="FUNCTION_NOT_FOUND")
            for fn_name in names:  # _v3 since R510, _v2 before (same structure)
                fn = getattr(pynvml, fn_name, None)
                if fn is None:
                    continue
                got = _call(fn, handle)
                if got.error != "FUNCTION_NOT_FOUND":
                    break
            if not got.ok:
                failure = got.error
                continue  # this list cannot be had (e.g. NO_PERMISSION): keep what the other gave
            any_ok = True
            for p in got.value:
                gi, ci = int(p.gpuInstanceId), int(p.computeInstanceId)
                if gi == NO_ID and ids[0] != NO_ID:  # listed on a MIG device handle
                    gi, ci = ids
                key = (int(p.pid), gi, ci)
                used = p.usedGpuMemory  # None where the driver cannot tell
                prev = found.get(key)
                if prev is None or (used is not None and used > prev):
                    found[key] = used  # a C+G process is in both lists: keep the larger figure
        return "" if any_ok else failure

    def _processes(
        self, dev: _Device, mig_devices: Dict[Tuple[int, int], _MigDevice]
    ) -> Tuple[Tuple[GpuProcess, ...], str]:
        """The GPU's processes, and "" or the NVML code saying why the list is incomplete."""
        found: Dict[Tuple[int, int, int], Any] = {}
        error = self._process_lists(dev.handle, found, (NO_ID, NO_ID))
        if error and mig_devices:
            # The parent GPU would not list them (e.g. NO_PERMISSION with MIG on): ask each MIG device.
            errors = [self._process_lists(mig.handle, found, ids) for ids, mig in sorted(mig_devices.items())]
            error = next((e for e in errors if e), "")
        out: List[GpuProcess] = []
        for (pid, gi, ci), used in sorted(found.items()):
            user, command = self._proc_owner(pid)
            out.append(
                GpuProcess(
                    pid=pid,
                    used_memory_bytes=NotAvailable("NOT_SUPPORTED") if used is None else int(used),
                    user=user,
                    command=command,
                    gpu_instance_id=None if gi == NO_ID else gi,
                    compute_instance_id=None if ci == NO_ID else ci,
                    groups=self._proc_groups(pid),
                    cgroup=read_cgroup("/proc/%d/cgroup" % pid),
                )
            )
        return tuple(out), error

    def _proc_groups(self, pid: int) -> Tuple[str, ...]:
        """Unix group names of a process, primary first; a number where the group has no name."""
        names = []
        for gid in read_gids("/proc/%d/status" % pid):
            name = self._group_names.get(gid)
            if name is None:
                try:
                    name = grp.getgrgid(gid).gr_name
                except KeyError:
                    name = str(gid)
                self._group_names[gid] = name
            names.append(name)
        return tuple(names)

    def _proc_owner(self, pid: int) -> Tuple[str, str]:
        """(unix user, command line) of a process; "" where /proc cannot tell (other PID namespace)."""
        user = ""
        try:
            with open("/proc/%d/status" % pid, "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        uid = int(line.split()[1])
                        user = self._user(uid)
                        break
        except (OSError, ValueError, IndexError):
            pass
        command = ""
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                raw = f.read(4096)
            command = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
            if not command:
                with open("/proc/%d/comm" % pid, "rb") as f:
                    command = f.read(256).decode("utf-8", "replace").strip()
        except OSError:
            pass
        return user, command

    def user_name(self, uid: int) -> str:
        return self._user(uid)

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    # ---- Backend: inventory and sample -------------------------------------------------------
    def inventory(self) -> Node:
        gpus: List[Gpu] = []
        for dev in self._devices_now():
            if isinstance(dev, GpuInfo):
                gpus.append(Gpu(info=dev))
                continue
            state, _ = self._mig_state(dev, with_memory=False)
            gpus.append(Gpu(info=dev.info, mig=state))
        return Node(
            hostname=self._hostname,
            backend=self.name,
            driver_version=self._driver_version,
            cuda_driver_version=self._cuda_driver_version,
            gpus=tuple(gpus),
        )

    def sample(self) -> NodeSample:
        started = time.time()
        gpus: List[Gpu] = []
        for dev in self._devices_now():
            now = time.time()
            if isinstance(dev, GpuInfo):
                reason = dev.memory_total_bytes
                code = reason.reason if isinstance(reason, NotAvailable) else "UNKNOWN"
                gpus.append(Gpu(info=dev, sample=_na_sample(now, code), processes_error=code))
                continue
            sample = self._sample(dev, now)
            state, mig_devices = self._mig_state(dev, with_memory=True)
            processes, processes_error = self._processes(dev, mig_devices)
            gpus.append(
                Gpu(
                    info=dev.info,
                    mig=state,
                    sample=sample,
                    mig_samples=self._mig_samples(dev, state, mig_devices),
                    processes=processes,
                    processes_error=processes_error,
                )
            )
        return NodeSample(hostname=self._hostname, timestamp=started, gpus=tuple(gpus))

    # ---- Backend: MIG control ----------------------------------------------------------------
    def set_mig_mode(self, gpu: int, enabled: bool) -> MigModeChange:
        dev = self._handle(gpu)
        if not dev.info.mig_capable:
            raise BackendError("NOT_SUPPORTED", "GPU %d (%s) does not support MIG" % (gpu, dev.info.name))
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        what = "cannot %s MIG on GPU %d" % ("enable" if enabled else "disable", gpu)
        try:
            pynvml.nvmlDeviceSetMigMode(dev.handle, mode)
            current, pending = pynvml.nvmlDeviceGetMigMode(dev.handle)
        except _NVML_ERRORS as exc:
            raise _raise(what, exc) from None
        return MigModeChange(current=bool(current), pending=bool(pending))

    def reset_gpu(self, gpu: int) -> None:
        dev = self._handle(gpu)
        raise BackendError(
            "NOT_SUPPORTED",
            "NVML cannot reset a GPU; as root run: nvidia-smi -r -i %s" % (dev.info.pci_bus_id or str(gpu)),
        )

    def _profile(self, dev: _Device, profile_id: int) -> _GiProfile:
        profiles = self._gi_profiles(dev)
        profile = profiles.get(profile_id)
        if profile is None:
            valid = ", ".join(
                "%s (%d)" % (p.name, p.id) for p in sorted(profiles.values(), key=lambda p: p.id)
            )
            raise BackendError(
                "INVALID_ARGUMENT",
                "GPU %d has no GPU instance profile %r (valid: %s)"
                % (dev.index, profile_id, valid or "none"),
            )
        return profile

    def _placement_size(self, dev: _Device, profile: _GiProfile, start: int) -> int:
        count = ctypes.c_uint(0)
        try:
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                dev.handle, profile.id, None, ctypes.byref(count)
            )
            placements = (pynvml.c_nvmlGpuInstancePlacement_t * max(int(count.value), 1))()
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                dev.handle, profile.id, placements, ctypes.byref(count)
            )
        except _NVML_ERRORS as exc:
            raise _raise("cannot list placements of %s on GPU %d" % (profile.name, dev.index), exc) from None
        starts = [int(placements[i].start) for i in range(int(count.value))]
        for i in range(int(count.value)):
            if int(placements[i].start) == start:
                return int(placements[i].size)
        raise BackendError(
            "INVALID_ARGUMENT",
            "%s cannot start at memory slice %d on GPU %d (valid starts: %s)"
            % (profile.name, start, dev.index, ", ".join(str(s) for s in starts) or "none"),
        )

    def _gi_handle(self, dev: _Device, gpu_instance_id: int) -> Any:
        try:
            return pynvml.nvmlDeviceGetGpuInstanceById(dev.handle, gpu_instance_id)
        except _NVML_ERRORS as exc:
            raise _raise("no GPU instance %d on GPU %d" % (gpu_instance_id, dev.index), exc) from None

    def create_gpu_instance(self, gpu: int, profile_id: int, start: Optional[int] = None) -> GpuInstance:
        dev = self._handle(gpu)
        profile = self._profile(dev, profile_id)
        what = "cannot create a %s GPU instance on GPU %d" % (profile.name, gpu)
        try:
            if start is None:
                handle = pynvml.nvmlDeviceCreateGpuInstance(dev.handle, profile.id)
            else:
                size = self._placement_size(dev, profile, start)
                placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
                handle = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    dev.handle, profile.id, ctypes.byref(placement)
                )
        except _NVML_ERRORS as exc:
            raise _raise(what, exc) from None
        gi = self._gpu_instance(dev, handle, profile, {})
        if gi is None:
            raise BackendError("UNKNOWN", "GPU instance created on GPU %d but it cannot be read back" % gpu)
        return gi

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        dev = self._handle(gpu)
        handle = self._gi_handle(dev, gpu_instance_id)
        try:
            pynvml.nvmlGpuInstanceDestroy(handle)
        except _NVML_ERRORS as exc:
            raise _raise("cannot destroy GPU instance %d on GPU %d" % (gpu_instance_id, gpu), exc) from None

    def create_compute_instance(
        self, gpu: int, gpu_instance_id: int, profile_id: int, start: Optional[int] = None
    ) -> ComputeInstance:
        dev = self._handle(gpu)
        gi_handle = self._gi_handle(dev, gpu_instance_id)
        what = "cannot create compute instance profile %d in GPU instance %d on GPU %d" % (
            profile_id,
            gpu_instance_id,
            gpu,
        )
        shared = getattr(pynvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        try:
            gi_info = pynvml.nvmlGpuInstanceGetInfo(gi_handle)
            profile = self._profile(dev, int(gi_info.profileId))
            cp_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, profile_id, shared, 1)
            cp = _CiProfile(
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
        except _NVML_ERRORS as exc:
            raise _raise(what, exc) from None
        mig_devices = self._mig_devices(dev, with_memory=False)
        return self._compute_instance(info, gpu_instance_id, profile, cp, mig_devices)

    def destroy_compute_instance(self, gpu: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        dev = self._handle(gpu)
        gi_handle = self._gi_handle(dev, gpu_instance_id)
        what = "cannot destroy compute instance %d of GPU instance %d on GPU %d" % (
            compute_instance_id,
            gpu_instance_id,
            gpu,
        )
        try:
            handle = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi_handle, compute_instance_id)
            pynvml.nvmlComputeInstanceDestroy(handle)
        except _NVML_ERRORS as exc:
            raise _raise(what, exc) from None
