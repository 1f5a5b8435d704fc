"""GPM (GPU Performance Monitoring, Hopper and newer): the SM utilization of each MIG GPU
instance, which NVML's utilization rates do not give with MIG on.

Each sample takes `nvmlGpmMigSampleGet` of every GPU instance into a buffer and compares it with
the instance's previous one (`nvmlGpmMetricsGet`, NVML_GPM_METRIC_SM_UTIL). The buffers are kept
on the device (`Device.gpm`) and freed when their instance is gone, MIG goes off, or the backend
closes (`forget`).

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Set, Union

from gpuops.core.model import NotAvailable
from gpuops.node.backends.nvml.devices import Device, GpmState
from gpuops.node.backends.nvml.library import ERROR_NAMES, call, pynvml

GPM_MIN_INTERVAL = 0.1  # seconds between two GPM samples of one instance (nvml.h: "> 100ms")


def support(dev: Device) -> str:
    """ "" where NVML's GPM works on this GPU (Hopper and newer), else NVML's reason."""
    if dev.gpm_error is None:
        if not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):  # a pynvml older than GPM
            dev.gpm_error = "FUNCTION_NOT_FOUND"
            return dev.gpm_error
        got = call(pynvml.nvmlGpmQueryDeviceSupport, dev.handle)
        if got.error == "GPU_IS_LOST":
            return got.error  # ask again once it is back
        dev.gpm_error = got.error or ("" if int(got.value.isSupportedDevice) else "NOT_SUPPORTED")
    return dev.gpm_error


def utilization(dev: Device, gi_ids: List[int]) -> Dict[int, Union[float, NotAvailable]]:
    """Each GPU instance's SM utilization (percent) between its previous GPM sample and one
    taken now: NVML's utilization rates are NOT_SUPPORTED with MIG on, GPM's are not. The
    first sample of an instance has nothing to compare with (NO_DATA). Samples closer than
    GPM_MIN_INTERVAL keep the previous figure: NVML refreshes its counters at that rate."""
    why_not = support(dev)
    if why_not:
        return {gi: NotAvailable(why_not) for gi in gi_ids}
    forget(dev, set(gi_ids))
    out: Dict[int, Union[float, NotAvailable]] = {}
    now = time.monotonic()
    for gi in gi_ids:
        state = dev.gpm.get(gi)
        if state is not None and now - state.taken < GPM_MIN_INTERVAL:
            out[gi] = state.value
            continue
        buffer = call(pynvml.nvmlGpmSampleAlloc)
        if not buffer.ok:
            out[gi] = NotAvailable(buffer.error)
            continue
        got = call(pynvml.nvmlGpmMigSampleGet, dev.handle, gi, buffer.value)
        if not got.ok:
            call(pynvml.nvmlGpmSampleFree, buffer.value)
            out[gi] = NotAvailable(got.error)
            continue
        fresh = GpmState(buffer.value, now)
        if state is not None:
            fresh.value = _sm_util(state.buffer, fresh.buffer)
            call(pynvml.nvmlGpmSampleFree, state.buffer)
        dev.gpm[gi] = fresh
        out[gi] = fresh.value
    return out


def _sm_util(before: Any, after: Any) -> Union[float, NotAvailable]:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1 = before
    request.sample2 = after
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    got = call(pynvml.nvmlGpmMetricsGet, request)
    if not got.ok:
        return NotAvailable(got.error)
    metric = request.metrics[0]
    if int(metric.nvmlReturn) != 0:
        return NotAvailable(ERROR_NAMES.get(int(metric.nvmlReturn), "UNKNOWN"))
    return round(min(max(float(metric.value), 0.0), 100.0), 2)


def forget(dev: Device, keep: Set[int]) -> None:
    """Free the GPM buffers of GPU instances that are gone (or of all: MIG off, closing)."""
    for gi in [g for g in dev.gpm if g not in keep]:
        call(pynvml.nvmlGpmSampleFree, dev.gpm.pop(gi).buffer)
