"""AMD Instinct GPUs through AMD's `amdsmi` package (a ctypes binding of ROCm's libamd_smi.so).

On the node side's rules: the standard library, the vendor's binding and gpuops' core and node
packages; valid Python 3.8. Figures map onto gpuops' model as docs/backends.md tells; a figure the
library cannot give is `NotAvailable` with amdsmi's status name (NOT_SUPPORTED, NO_PERM, ...),
so one missing sensor never hides the others. Calls come from one thread at a time (the agent's
backend worker), as for NVML.
"""

from __future__ import annotations

import contextlib
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

    def metric(self, convert: Callable[[Any], T]) -> Union[T, NotAvailable]:
        if self.error:
            return NotAvailable(self.error)
        # The binding turns the library's "not supported" sentinels (0xFFFF...) into "N/A".
        if self.value == "N/A" or self.value is None:
            return NotAvailable("NOT_SUPPORTED")
        return convert(self.value)


class _Device:
    """What does not change of one GPU while the backend runs."""

    def __init__(self, index: int, handle: Any, info: GpuInfo, device_id: int) -> None:
        self.index = index
        self.handle = handle
        self.info = info
        self.device_id = device_id


def _architecture(target: str) -> str:
    try:
        return _ARCHITECTURES.get(int(target[3:], 16), "")
    except ValueError:
        return ""


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
            driver = self._call(api.amdsmi_get_gpu_driver_info, handles[0]) if handles else _Call({})
            self._driver_version = str((driver.value or {}).get("driver_version", ""))
            ok, rocm = api.amdsmi_get_rocm_version()
            self._rocm_version = str(rocm) if ok else ""
            self._devices = [self._read_static(i, h) for i, h in enumerate(handles)]
        except api.AmdSmiException as exc:
            self._shutdown()
            raise BackendUnavailable("amdsmi cannot list GPUs: %s" % self._lib.status(exc)) from None
        self._hostname = socket.gethostname()
        self._users: Dict[int, str] = {}

    # ---- library calls -----------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> _Call:
        try:
            return _Call(fn(*args))
        except self._lib.api.AmdSmiLibraryException as exc:
            return _Call(error=self._lib.status(exc))

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
        asic = self._call(api.amdsmi_get_gpu_asic_info, handle)
        fields: Dict[str, Any] = asic.value if not asic.error else {}
        device_id = _hex(fields.get("device_id"))
        vendor_id = _hex(fields.get("vendor_id")) or AMD_VENDOR_ID
        uuid = self._call(api.amdsmi_get_gpu_device_uuid, handle)
        serial = str(fields.get("asic_serial", ""))
        bdf = self._call(api.amdsmi_get_gpu_device_bdf, handle)
        total = self._call(api.amdsmi_get_gpu_memory_total, handle, api.AmdSmiMemoryType.VRAM)
        units = fields.get("num_compute_units", "N/A")
        info = GpuInfo(
            index=index,
            # amdsmi's UUID where the driver gives one, else the ASIC serial, else the PCI address:
            # gpuops keys GPUs by it, so it must be stable and unique on the node.
            uuid=str(uuid.value) if not uuid.error and uuid.value else serial or str(bdf.value or index),
            name=str(fields.get("market_name", "")) or "AMD GPU",
            pci_bus_id=str(bdf.value) if not bdf.error else "",
            pci_device_id=(device_id << 16) | vendor_id,
            memory_total_bytes=total.metric(int),
            mig_capable=False,
            architecture=_architecture(str(fields.get("target_graphics_version", ""))),
            # Compute units, AMD's counterpart of SMs (not the same amount of work: docs/backends.md).
            multiprocessor_count=int(units) if isinstance(units, int) else NotAvailable("NOT_SUPPORTED"),
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
        return GpuSample(
            timestamp=timestamp,
            utilization_gpu_percent=_field(activity, "gfx_activity").metric(float),
            utilization_memory_percent=_field(activity, "umc_activity").metric(float),
            memory_used_bytes=used.metric(int),
            memory_total_bytes=dev.info.memory_total_bytes,
            power_watts=_power(power).metric(float),
            temperature_celsius=temp.metric(float),
            sm_clock_mhz=_field(gfx, "clk").metric(int),
            memory_clock_mhz=_field(mem, "clk").metric(int),
        )

    def _processes(self, dev: _Device) -> Tuple[Tuple[GpuProcess, ...], str]:
        found = self._call(self._lib.api.amdsmi_get_gpu_process_list, dev.handle)
        if found.error:
            return (), found.error
        out: List[GpuProcess] = []
        for entry in found.value:
            pid = int(entry["pid"])
            vram = entry.get("memory_usage", {}).get("vram_mem", "N/A")
            user, command = self._proc_owner(pid)
            out.append(
                GpuProcess(
                    pid=pid,
                    used_memory_bytes=int(vram) if isinstance(vram, int) else NotAvailable("NOT_SUPPORTED"),
                    user=user,
                    command=command or str(entry.get("name", "")),
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


def _hex(value: Any) -> int:
    """The binding gives ids as hex text ("0x74a1") or "N/A"."""
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 16)
    except ValueError:
        return 0


def _field(call: _Call, key: str) -> _Call:
    return call if call.error else _Call(call.value.get(key, "N/A"))


def _power(call: _Call) -> _Call:
    """Socket power now (MI300-class), else the average older boards give (watts)."""
    if call.error:
        return call
    current = call.value.get("current_socket_power", "N/A")
    return _Call(current if current != "N/A" else call.value.get("average_socket_power", "N/A"))
