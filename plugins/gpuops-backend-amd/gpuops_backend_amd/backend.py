"""AMD Instinct GPUs through AMD's `amdsmi` package (a ctypes binding of ROCm's libamd_smi.so).

On the node side's rules: the standard library, the vendor's binding and gpuops' core and node
packages; valid Python 3.8. Figures map onto gpuops' model as docs/backends.md tells; a figure the
library cannot give is `NotAvailable` with amdsmi's status name (NOT_SUPPORTED, NO_PERM, ...),
so one missing sensor never hides the others. Calls come from one thread at a time (the agent's
backend worker), as for NVML.

What the library says is not taken on trust (docs/backends.md, "What the library says"): its text
(names, serials, the driver version) is read from its structures and decoded with replacement
characters, not by the binding, which fails on bytes that are not UTF-8; amdsmi's "no figure"
sentinels (the integer types' maxima, "N/A") are NotAvailable("NOT_SUPPORTED"), and a figure no
GPU can have (a percentage past 100, a negative power read as 4294966984 W, more memory used than
the GPU has) NotAvailable("UNEXPECTED_DATA"), never a figure.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union

from gpuops.core.model import (
    Gpu,
    GpuInfo,
    GpuProcess,
    GpuSample,
    Node,
    NodeSample,
    NotAvailable,
    PartitionState,
)
from gpuops.core.partition_catalog import by_device_id
from gpuops.node.backends.base import Backend, BackendError, BackendUnavailable, unix_user_name

T = TypeVar("T")

AMD_VENDOR_ID = 0x1002
MiB = 1 << 20
MAX_PROCESSES = 1024  # entries asked for, as amdsmi's binding does (MAX_NUM_PROCESSES)
UUID_SIZE = 38  # AMDSMI_GPU_UUID_SIZE

# amdsmi's "no figure" values: the maxima of the integer types its structures hold (the binding's
# MaxUIntegerTypes, which its _validate_if_max_uint turns into "N/A"; 0xFFFF where the library
# copies a field of the SMU's 16-bit gpu_metrics into a wider one) and of the signed types.
SENTINELS = frozenset((0xFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x7FFF, 0x7FFFFFFF, 0x7FFFFFFFFFFFFFFF))
# What a GPU's figures can be; beyond, a reading is UNEXPECTED_DATA (docs/backends.md).
MAX_MEMORY = 1 << 50  # bytes: 1 PiB, thousands of times today's largest GPU
MAX_POWER_W = 10000.0  # a socket (an OAM module) draws at most a few kW
TEMPERATURE_C = (-50.0, 200.0)  # a GPU shuts down far below 200 degrees C
MAX_CLOCK_MHZ = 20000
MAX_COMPUTE_UNITS = 16384

# gfx target -> architecture, as gpuops names NVIDIA's ("ampere", "hopper").
_ARCHITECTURES = {0x942: "cdna3", 0x941: "cdna3", 0x940: "cdna3", 0x90A: "cdna2", 0x908: "cdna"}

# amdsmi's statuses as the NVML names the layers above act on (base.ERROR_CODES); the message
# keeps amdsmi's own name.
_BACKEND_CODES = {
    "BUSY": "IN_USE",
    "NOT_SUPPORTED": "NOT_SUPPORTED",
    "SETTING_UNAVAILABLE": "NOT_SUPPORTED",
    "NO_PERM": "NO_PERMISSION",
    "INVAL": "INVALID_ARGUMENT",
    "NOT_FOUND": "NOT_FOUND",
    "DRIVER_NOT_LOADED": "DRIVER_NOT_LOADED",
    "NOT_INIT": "UNINITIALIZED",
    "OUT_OF_RESOURCES": "INSUFFICIENT_RESOURCES",
}


class _Lib:
    """The amdsmi package, imported when the backend starts (its import loads libamd_smi.so)."""

    def __init__(self) -> None:
        try:
            import amdsmi  # type: ignore[import-untyped, import-not-found, unused-ignore]
            from amdsmi import amdsmi_wrapper  # type: ignore[import-untyped, import-not-found, unused-ignore]
        except ImportError as exc:
            raise BackendUnavailable(
                "the amdsmi package is not installed (pip install amdsmi): %s" % exc
            ) from None
        except (OSError, KeyError, AttributeError) as exc:
            # amdsmi binds every function at import: a missing or foreign library fails there.
            raise BackendUnavailable(
                "libamd_smi.so cannot be loaded (ROCm's amd-smi-lib; ROCM_PATH=%s): %s: %s"
                % (os.environ.get("ROCM_PATH", ""), type(exc).__name__, exc)
            ) from None
        self.api: Any = amdsmi
        self.wrapper: Any = amdsmi_wrapper
        self.names: Dict[int, str] = dict(getattr(amdsmi_wrapper, "amdsmi_status_t__enumvalues", {}))

    def status(self, exc: BaseException) -> str:
        """amdsmi's name of a failure, without its AMDSMI_STATUS_ prefix."""
        code = getattr(exc, "err_code", None)
        if code is None:
            return "UNKNOWN_ERROR"
        name = self.names.get(int(code), "")
        return name[len("AMDSMI_STATUS_") :] if name.startswith("AMDSMI_STATUS_") else "STATUS_%d" % int(code)


class _Call:
    """One library call's value, or the status name it failed with."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: str = "") -> None:
        self.value = value
        self.error = error

    def metric(self, convert: Callable[[Any], T], low: float, high: float) -> Union[T, NotAvailable]:
        """The value as a figure when it is one a GPU can have (low..high), else NotAvailable."""
        if self.error:
            return NotAvailable(self.error)
        found = reading(self.value, low, high)
        return found if isinstance(found, NotAvailable) else convert(found)


def reading(value: Any, low: float, high: float) -> Union[int, float, NotAvailable]:
    """A figure from the library, if it is one: the binding's "N/A" and amdsmi's sentinels are
    NOT_SUPPORTED (no figure), anything else outside low..high UNEXPECTED_DATA (no GPU has it)."""
    if value is None or value == "N/A":
        return NotAvailable("NOT_SUPPORTED")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NotAvailable("UNEXPECTED_DATA")
    if low <= value <= high:
        return value
    return NotAvailable("NOT_SUPPORTED" if value in SENTINELS else "UNEXPECTED_DATA")


def text(raw: bytes) -> str:
    """Text from a library structure (up to its NUL): not UTF-8 is decoded with U+FFFD."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()


class _Device:
    """What does not change of one GPU while the backend runs."""

    def __init__(self, index: int, handle: Any, info: GpuInfo, device_id: int) -> None:
        self.index = index
        self.handle = handle
        self.info = info
        self.device_id = device_id


class AmdSmiBackend(Backend):
    """A node's AMD GPUs through amdsmi (`--backend amd`)."""

    name = "amd"

    def __init__(self, **_options: Any) -> None:
        self._lib = _Lib()
        api = self._lib.api
        try:
            api.amdsmi_init(api.AmdSmiInitFlags.INIT_AMD_GPUS)
        except api.AmdSmiException as exc:
            raise BackendUnavailable("amdsmi_init failed: %s" % self._lib.status(exc)) from None
        self._open = True
        try:
            handles = api.amdsmi_get_processor_handles()
            driver = _Call(error="NOT_FOUND")
            if handles:
                driver = self._call(self._filled, "amdsmi_get_gpu_driver_info", handles[0])
            self._driver_version = "" if driver.error else text(driver.value.driver_version)
            rocm = self._call(api.amdsmi_get_rocm_version)
            ok = not rocm.error and isinstance(rocm.value, tuple) and len(rocm.value) == 2 and rocm.value[0]
            self._rocm_version = str(rocm.value[1]) if ok else ""
            self._devices = [self._read_static(i, h) for i, h in enumerate(handles)]
        except api.AmdSmiException as exc:
            self._shutdown()
            raise BackendUnavailable("amdsmi cannot list GPUs: %s" % self._lib.status(exc)) from None
        self._hostname = socket.gethostname()
        self._users: Dict[int, str] = {}

    # ---- library calls -----------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> _Call:
        """One call's value, or the status it failed with; what the binding cannot make sense of
        (text that is not UTF-8, a value it cannot convert) is UNEXPECTED_DATA, one figure lost."""
        try:
            return _Call(fn(*args))
        except self._lib.api.AmdSmiException as exc:
            return _Call(error=self._lib.status(exc))
        except (ValueError, TypeError, KeyError, OverflowError):
            return _Call(error="UNEXPECTED_DATA")

    def _filled(self, name: str, handle: Any) -> Any:
        """The structure a library function fills, read by gpuops rather than by the binding (its
        text decoded with replacement, not refused: `text`); failures raise as the binding's do."""
        w = self._lib.wrapper
        struct = {
            "amdsmi_get_gpu_driver_info": w.amdsmi_driver_info_t,
            "amdsmi_get_gpu_asic_info": w.amdsmi_asic_info_t,
        }[name]()
        self._check(getattr(w, name)(handle, ctypes.byref(struct)))
        return struct

    def _check(self, status: int) -> None:
        if status != 0:
            raise self._lib.api.AmdSmiLibraryException(status)

    def _uuid(self, handle: Any) -> str:
        buffer = ctypes.create_string_buffer(UUID_SIZE)
        size = ctypes.c_uint32(UUID_SIZE)
        self._check(self._lib.wrapper.amdsmi_get_gpu_device_uuid(handle, ctypes.byref(size), buffer))
        return text(buffer.raw)

    def _process_list(self, handle: Any) -> List[Tuple[int, Any, str]]:
        """(pid, VRAM bytes, name) of the GPU's processes."""
        w = self._lib.wrapper
        count = ctypes.c_uint32(MAX_PROCESSES)
        found = (w.amdsmi_proc_info_t * MAX_PROCESSES)()
        self._check(w.amdsmi_get_gpu_process_list(handle, ctypes.byref(count), found))
        return [
            (int(p.pid), int(p.memory_usage.vram_mem), text(p.name))
            for p in found[: min(count.value, MAX_PROCESSES)]
        ]

    def _raise(self, what: str, exc: BaseException) -> BackendError:
        status = self._lib.status(exc)
        return BackendError(_BACKEND_CODES.get(status, "UNKNOWN"), "%s: AMDSMI_STATUS_%s" % (what, status))

    def _shutdown(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(self._lib.api.AmdSmiException):
                self._lib.api.amdsmi_shut_down()

    def close(self) -> None:
        self._shutdown()

    def _check_open(self) -> None:
        if not self._open:
            raise BackendError("UNINITIALIZED", "the amd backend is closed")

    def _device(self, gpu: int) -> _Device:
        self._check_open()
        if not 0 <= gpu < len(self._devices):
            raise BackendError("INVALID_ARGUMENT", "no GPU %d on this node" % gpu)
        return self._devices[gpu]

    # ---- inventory ---------------------------------------------------------------------------
    def _read_static(self, index: int, handle: Any) -> _Device:
        api = self._lib.api
        asic = self._call(self._filled, "amdsmi_get_gpu_asic_info", handle)
        fields = asic.value if not asic.error else None
        device_id = int(fields.device_id) & 0xFFFF if fields is not None else 0
        vendor_id = (int(fields.vendor_id) & 0xFFFF if fields is not None else 0) or AMD_VENDOR_ID
        uuid = self._call(self._uuid, handle)
        serial = text(fields.asic_serial) if fields is not None else ""
        bdf = self._call(api.amdsmi_get_gpu_device_bdf, handle)
        total = self._call(api.amdsmi_get_gpu_memory_total, handle, api.AmdSmiMemoryType.VRAM)
        units = _Call(fields.num_of_compute_units) if fields is not None else _Call(error=asic.error)
        info = GpuInfo(
            index=index,
            # amdsmi's UUID where the driver gives one, else the ASIC serial, else the PCI address:
            # gpuops keys GPUs by it, so it must be stable and unique on the node.
            uuid=str(uuid.value) if not uuid.error and uuid.value else serial or str(bdf.value or index),
            name=(text(fields.market_name) if fields is not None else "") or "AMD GPU",
            pci_bus_id=str(bdf.value) if not bdf.error else "",
            pci_device_id=(device_id << 16) | vendor_id,
            memory_total_bytes=total.metric(int, 0, MAX_MEMORY),
            mig_capable=False,
            architecture=(
                _ARCHITECTURES.get(int(fields.target_graphics_version), "") if fields is not None else ""
            ),
            # Compute units, AMD's counterpart of SMs (not the same amount of work: docs/backends.md).
            multiprocessor_count=units.metric(int, 1, MAX_COMPUTE_UNITS),
        )
        return _Device(index, handle, info, device_id)

    def _partition(self, dev: _Device) -> Optional[PartitionState]:
        """The GPU's partition modes; None where the GPU has none (NOT_SUPPORTED)."""
        api = self._lib.api
        compute = self._call(api.amdsmi_get_gpu_compute_partition, dev.handle)
        memory = self._call(api.amdsmi_get_gpu_memory_partition, dev.handle)
        if compute.error == "NOT_SUPPORTED" and memory.error == "NOT_SUPPORTED":
            return None
        # amdsmi reads the current modes but not, in one call, the set a GPU accepts: those come
        # from gpuops' catalog by PCI device id, as MIG profiles do.
        model = by_device_id(dev.device_id)
        modes = model.compute if model is not None else {}
        compute_mode = "" if compute.error else str(compute.value)
        return PartitionState(
            compute_mode=compute_mode,
            memory_mode="" if memory.error else str(memory.value),
            compute_modes=tuple(modes),
            memory_modes=model.memory if model is not None else (),
            partitions=modes.get(compute_mode, 1),
        )

    def inventory(self) -> Node:
        self._check_open()
        gpus = tuple(Gpu(info=dev.info, partition=self._partition(dev)) for dev in self._devices)
        return Node(
            hostname=self._hostname,
            backend=self.name,
            driver_version=self._driver_version,
            # The ROCm release stands where NVIDIA nodes give the CUDA driver version.
            cuda_driver_version=self._rocm_version,
            gpus=gpus,
        )

    # ---- samples -----------------------------------------------------------------------------
    def _sample(self, dev: _Device, timestamp: float) -> GpuSample:
        api = self._lib.api
        h = dev.handle
        activity = self._call(api.amdsmi_get_gpu_activity, h)
        power = self._call(api.amdsmi_get_power_info, h)
        used = self._call(api.amdsmi_get_gpu_memory_usage, h, api.AmdSmiMemoryType.VRAM)
        # Hotspot (junction): MI300-class boards have no edge sensor, and it is the one the
        # driver throttles on.
        temp = self._call(
            api.amdsmi_get_temp_metric,
            h,
            api.AmdSmiTemperatureType.HOTSPOT,
            api.AmdSmiTemperatureMetric.CURRENT,
        )
        gfx = self._call(api.amdsmi_get_clock_info, h, api.AmdSmiClkType.GFX)
        mem = self._call(api.amdsmi_get_clock_info, h, api.AmdSmiClkType.MEM)
        low, high = TEMPERATURE_C
        return GpuSample(
            timestamp=timestamp,
            utilization_gpu_percent=_field(activity, "gfx_activity").metric(float, 0, 100),
            utilization_memory_percent=_field(activity, "umc_activity").metric(float, 0, 100),
            memory_used_bytes=used.metric(int, 0, _memory_bound(dev)),
            memory_total_bytes=dev.info.memory_total_bytes,
            power_watts=_power(power).metric(float, 0, MAX_POWER_W),
            temperature_celsius=temp.metric(float, low, high),
            sm_clock_mhz=_field(gfx, "clk").metric(int, 0, MAX_CLOCK_MHZ),
            memory_clock_mhz=_field(mem, "clk").metric(int, 0, MAX_CLOCK_MHZ),
        )

    def _processes(self, dev: _Device) -> Tuple[Tuple[GpuProcess, ...], str]:
        found = self._call(self._process_list, dev.handle)
        if found.error:
            return (), found.error
        out: List[GpuProcess] = []
        for pid, vram, name in found.value:
            user, command = self._proc_owner(pid)
            out.append(
                GpuProcess(
                    pid=pid,
                    used_memory_bytes=_Call(vram).metric(int, 0, _memory_bound(dev)),
                    user=user,
                    command=command or name,
                )
            )
        return tuple(out), ""

    def sample(self) -> NodeSample:
        self._check_open()
        now = time.time()
        gpus: List[Gpu] = []
        for dev in self._devices:
            processes, error = self._processes(dev)
            gpus.append(
                Gpu(
                    info=dev.info,
                    sample=self._sample(dev, now),
                    processes=processes,
                    processes_error=error,
                    partition=self._partition(dev),
                )
            )
        return NodeSample(hostname=self._hostname, timestamp=now, gpus=tuple(gpus))

    # ---- partitions (the carving of AMD GPUs) ------------------------------------------------
    def set_partition(
        self, gpu: int, compute_mode: Optional[str] = None, memory_mode: Optional[str] = None
    ) -> PartitionState:
        """Take GPU `gpu` to the partition modes given (None: keep), as one change: refused while
        processes run on it (the driver answers BUSY anyway; refusing first names them), the
        memory mode first (it reloads the driver's memory layout), then the compute mode; read
        back and compared; on any failure the modes already changed are set back, so the GPU
        ends in its old modes or its new ones. Returns the modes now."""
        api = self._lib.api
        dev = self._device(gpu)
        before = self._partition(dev)
        if before is None:
            raise BackendError(
                "NOT_SUPPORTED", "GPU %d has no partition modes: AMDSMI_STATUS_NOT_SUPPORTED" % gpu
            )
        steps = []
        if memory_mode is not None and memory_mode != before.memory_mode:
            if memory_mode not in before.memory_modes:
                raise BackendError(
                    "INVALID_ARGUMENT",
                    "GPU %d takes memory modes %s, not %r"
                    % (gpu, "/".join(before.memory_modes), memory_mode),
                )
            steps.append(("memory", before.memory_mode, memory_mode))
        if compute_mode is not None and compute_mode != before.compute_mode:
            if compute_mode not in before.compute_modes:
                raise BackendError(
                    "INVALID_ARGUMENT",
                    "GPU %d takes compute modes %s, not %r"
                    % (gpu, "/".join(before.compute_modes), compute_mode),
                )
            steps.append(("compute", before.compute_mode, compute_mode))
        if not steps:
            return before
        processes, error = self._processes(dev)
        if error:
            raise BackendError(
                "IN_USE",
                "GPU %d: its processes cannot be read (AMDSMI_STATUS_%s), so it is not known to be idle"
                % (gpu, error),
            )
        if processes:
            pids = ", ".join("%d (%s)" % (p.pid, p.user or "?") for p in processes)
            raise BackendError(
                "IN_USE", "GPU %d is in use by pid %s: a partition change needs it idle" % (gpu, pids)
            )
        done: List[Tuple[str, str, str]] = []
        try:
            for step in steps:
                self._set_mode(dev, step[0], step[2])
                done.append(step)
            after = self._partition(dev)
            want = (compute_mode or before.compute_mode, memory_mode or before.memory_mode)
            if after is None or (after.compute_mode, after.memory_mode) != want:
                got = (after.compute_mode, after.memory_mode) if after else ("?", "?")
                raise BackendError(
                    "UNKNOWN", "GPU %d reads %s/%s after the change, not %s/%s" % ((gpu, *got, *want))
                )
            return after
        except (BackendError, api.AmdSmiException) as exc:
            problem = exc if isinstance(exc, BackendError) else self._raise("partition change", exc)
            undone = self._roll_back(dev, done)
            raise BackendError(problem.code, "%s; %s" % (problem.message, undone)) from None

    def _set_mode(self, dev: _Device, kind: str, mode: str) -> None:
        api = self._lib.api
        try:
            if kind == "memory":
                api.amdsmi_set_gpu_memory_partition(dev.handle, api.AmdSmiMemoryPartitionType[mode])
            else:
                api.amdsmi_set_gpu_compute_partition(dev.handle, api.AmdSmiComputePartitionType[mode])
        except api.AmdSmiLibraryException as exc:
            raise self._raise("setting GPU %d's %s partition to %s" % (dev.index, kind, mode), exc) from None

    def _roll_back(self, dev: _Device, done: List[Tuple[str, str, str]]) -> str:
        """Set back the modes changed, last first; says what became of the GPU."""
        for kind, old, _new in reversed(done):
            try:
                self._set_mode(dev, kind, old)
            except BackendError as exc:
                return "rolling back failed too (%s): GPU %d is between its old and new modes" % (
                    exc.message,
                    dev.index,
                )
        return "GPU %d is back in its old modes" % dev.index if done else "nothing was changed"

    def _proc_owner(self, pid: int) -> Tuple[str, str]:
        """(unix user, command line) of a process; "" where /proc cannot tell."""
        user = command = ""
        try:
            uid = os.stat("/proc/%d" % pid).st_uid
            user = self._users.get(uid) or self._users.setdefault(uid, unix_user_name(uid))
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                command = f.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            pass
        return user, command


def _memory_bound(dev: _Device) -> float:
    """The most memory a GPU's reading can be: its total, where the library gives one."""
    total = dev.info.memory_total_bytes
    return total if isinstance(total, int) else MAX_MEMORY


def _field(call: _Call, key: str) -> _Call:
    return call if call.error else _Call(call.value.get(key, "N/A"))


def _power(call: _Call) -> _Call:
    """Socket power now (MI300-class), else the average older boards give (watts)."""
    if call.error:
        return call
    current = call.value.get("current_socket_power", "N/A")
    return _Call(current if current != "N/A" else call.value.get("average_socket_power", "N/A"))
