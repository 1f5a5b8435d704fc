"""`NvmlBackend`: the node backend of a machine with NVIDIA GPUs, put together from this
package's readers (devices, MIG, GPM, processes, events) and MIG changes (mig_control).

Threads: NVML itself is thread-safe, but the readers keep caches without locks. Call one backend
from one thread at a time (the agent does all backend calls from one worker thread). pynvml and
the loaded library are process-global: use one NvmlBackend per process.

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import List, Optional, Tuple, Union

from gpuops.core.model import ComputeInstance, Gpu, GpuInfo, GpuInstance, Node, NodeSample
from gpuops.node.backends.base import Backend, BackendError, BackendUnavailable, EventSource, MigModeChange
from gpuops.node.backends.nvml import gpm, mig, mig_control
from gpuops.node.backends.nvml.devices import (
    Device,
    DeviceTable,
    MemoryInfo,
    lost_code,
    na_sample,
    read_sample,
    read_versions,
)
from gpuops.node.backends.nvml.events import open_events
from gpuops.node.backends.nvml.library import (
    LIBRARY_ENV,
    NVML_ERRORS,
    message,
    preload,
    pynvml,
    unavailable_message,
)
from gpuops.node.backends.nvml.processes import ProcessReader
from gpuops.node.mps import BinaryMpsControl, MpsControl


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
            preload(path)
        try:
            pynvml.nvmlInit()
        except NVML_ERRORS as exc:
            raise BackendUnavailable(unavailable_message(exc, path)) from None
        self._open = True
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except NVML_ERRORS as exc:
            self._shutdown()
            raise BackendUnavailable("NVML is unavailable: cannot count GPUs: %s" % message(exc)) from None
        self._hostname = socket.gethostname()
        self._memory = MemoryInfo()
        self._devices = DeviceTable(count, self._hostname, self._memory)
        self._processes = ProcessReader()
        self._driver_version, self._cuda_driver_version = read_versions()

    # ---- life cycle ------------------------------------------------------------------------
    def capabilities(self) -> Tuple[str, ...]:
        return ("inventory", "sample", "mig-control")

    def mps_control(self) -> MpsControl:
        """The real `nvidia-cuda-mps-control` (from PATH)."""
        return BinaryMpsControl()

    def event_source(self) -> EventSource:
        """An NVML event set with each GPU's XID, ECC and clock events, those it supports."""
        return open_events([d for d in self._devices_now() if isinstance(d, Device)])

    def close(self) -> None:
        if self._open:
            self._open = False
            for dev in self._devices.devices.values():
                gpm.forget(dev, set())
            self._devices.devices.clear()
            self._shutdown()

    def _shutdown(self) -> None:
        with contextlib.suppress(*NVML_ERRORS):
            pynvml.nvmlShutdown()

    def _check_open(self) -> None:
        if not self._open:
            raise BackendError("UNINITIALIZED", "the NVML backend was closed")

    def _devices_now(self) -> List[Union[Device, GpuInfo]]:
        self._check_open()
        return self._devices.all()

    def _handle(self, gpu: int) -> Device:
        self._check_open()
        return self._devices.reachable(gpu)

    def user_name(self, uid: int) -> str:
        return self._processes.user(uid)

    # ---- Backend: inventory and sample -------------------------------------------------------
    def inventory(self) -> Node:
        gpus: List[Gpu] = []
        for dev in self._devices_now():
            if isinstance(dev, GpuInfo):
                gpus.append(Gpu(info=dev))
                continue
            state, _ = mig.mig_state(dev, None)
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
                code = lost_code(dev)
                gpus.append(Gpu(info=dev, sample=na_sample(now, code), processes_error=code))
                continue
            sample = read_sample(dev, now, self._memory)
            state, mig_devices = mig.mig_state(dev, self._memory)
            processes, processes_error = self._processes.processes(dev, mig_devices)
            gpus.append(
                Gpu(
                    info=dev.info,
                    mig=state,
                    sample=sample,
                    mig_samples=mig.mig_samples(dev, state, mig_devices),
                    processes=processes,
                    processes_error=processes_error,
                )
            )
        return NodeSample(hostname=self._hostname, timestamp=started, gpus=tuple(gpus))

    # ---- Backend: MIG control (mig_control.py) -----------------------------------------------
    def set_mig_mode(self, gpu: int, enabled: bool) -> MigModeChange:
        return mig_control.set_mig_mode(self._handle(gpu), enabled)

    def reset_gpu(self, gpu: int) -> None:
        mig_control.reset_gpu(self._handle(gpu))

    def create_gpu_instance(self, gpu: int, profile_id: int, start: Optional[int] = None) -> GpuInstance:
        return mig_control.create_gpu_instance(self._handle(gpu), profile_id, start)

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        mig_control.destroy_gpu_instance(self._handle(gpu), gpu_instance_id)

    def create_compute_instance(
        self, gpu: int, gpu_instance_id: int, profile_id: int, start: Optional[int] = None
    ) -> ComputeInstance:
        return mig_control.create_compute_instance(self._handle(gpu), gpu_instance_id, profile_id, start)

    def destroy_compute_instance(self, gpu: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        mig_control.destroy_compute_instance(self._handle(gpu), gpu_instance_id, compute_instance_id)
