"""Health events: an NVML event set with each GPU's XID, ECC and clock events (those it
supports), waited on from the agent's health thread (node/health.py).

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpuops.node.backends.base import BackendError, EventSource, RawEvent
from gpuops.node.backends.nvml.devices import Device
from gpuops.node.backends.nvml.library import NO_ID, NVML_ERRORS, call, error_code, failure, message, pynvml

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


class NvmlEvents(EventSource):
    """An NVML event set, waited on from the agent's health thread (node/health.py).

    NVML allows these calls while the backend's thread makes others on device handles; this
    object touches nothing of the backend's but the handles' addresses read at its making."""

    def __init__(self, event_set: Any, devices: Dict[Optional[int], Tuple[int, str]]) -> None:
        self._set = event_set
        self._devices = devices

    def wait(self, timeout: float) -> Optional[RawEvent]:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, max(1, int(timeout * 1000)))
        except NVML_ERRORS as exc:
            code = error_code(exc)
            if code == "TIMEOUT":  # nothing came (or a signal cut the wait short)
                return None
            raise BackendError(code, "waiting for NVML events: %s" % message(exc)) from None
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
            with contextlib.suppress(*NVML_ERRORS):
                pynvml.nvmlEventSetFree(event_set)


def open_events(devices: Sequence[Device]) -> NvmlEvents:
    """An event set with each of `devices` registered for the events it supports; BackendError
    where none gives any."""
    try:
        event_set = pynvml.nvmlEventSetCreate()
    except NVML_ERRORS as exc:
        raise failure("cannot create an NVML event set", exc) from None
    registered: Dict[Optional[int], Tuple[int, str]] = {}
    codes: List[str] = []
    for dev in devices:
        supported = call(pynvml.nvmlDeviceGetSupportedEventTypes, dev.handle)
        if not supported.ok:
            codes.append(supported.error)
            continue
        wanted = int(supported.value) & _EVENT_MASK
        if not wanted:
            codes.append("NOT_SUPPORTED")
            continue
        got = call(pynvml.nvmlDeviceRegisterEvents, dev.handle, wanted, event_set)
        if not got.ok:  # NOT_SUPPORTED: none of these registered, the set is still usable
            codes.append(got.error)
            continue
        registered[_address(dev.handle)] = (dev.index, dev.info.uuid)
    if not registered:
        with contextlib.suppress(*NVML_ERRORS):
            pynvml.nvmlEventSetFree(event_set)
        code = codes[0] if codes else "NOT_FOUND"
        raise BackendError(code, "no GPU gives health events (%s)" % code)
    return NvmlEvents(event_set, registered)
