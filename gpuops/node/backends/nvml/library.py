"""The NVML library through pynvml: loading it, one call's outcome, NVML's error names.

Every NVML query can fail on its own (NOT_SUPPORTED on a MIG-enabled GPU, GPU_IS_LOST,
FUNCTION_NOT_FOUND on an older driver, NO_PERMISSION, ...): `call` makes one call and keeps
either its value or NVML's code name (`Call`), which a reader turns into `NotAvailable(<code>)`
in that one field (`Call.metric`); `failure` turns a refused change into a `BackendError`.

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar, Union

from gpuops.core.model import NotAvailable
from gpuops.node.backends.base import ERROR_CODES, BackendError, BackendUnavailable

try:  # pragma: no cover - exercised by the "no pynvml" path only
    import pynvml as pynvml  # the package's modules take it from here (None: not installed)
except ImportError:  # pragma: no cover
    pynvml = None

T = TypeVar("T")

LIBRARY_ENV = "GPUOPS_NVML_LIBRARY"
SONAME = "libnvidia-ml.so.1"
MiB = 1 << 20
NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process that is not on a MIG device


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


ERROR_NAMES = _error_names()


def error_code(exc: BaseException) -> str:
    """The NVML code name of an exception from pynvml ("NOT_SUPPORTED", "GPU_IS_LOST", ...)."""
    if pynvml is not None and isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return "FUNCTION_NOT_FOUND"
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return ERROR_NAMES.get(value, "UNKNOWN")
    return "UNKNOWN"


def _nvml_errors() -> Tuple[Type[BaseException], ...]:
    if pynvml is None:  # pragma: no cover
        return ()
    return (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)


NVML_ERRORS = _nvml_errors()


def text(value: Any) -> str:
    """A string NVML gave (bytes in older pynvml versions)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ calls into the library  # pragma: no cover
        return error_code(exc)


class Call:
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


def call(fn: Callable[..., Any], *args: Any) -> Call:
    try:
        return Call(fn(*args))
    except NVML_ERRORS as exc:
        return Call(error=error_code(exc))


def failure(what: str, exc: BaseException) -> BackendError:
    """The BackendError of a change NVML refused, `what` saying which."""
    code = error_code(exc)
    said = "%s: %s" % (what, message(exc))
    if code == "IN_USE":
        said += " (stop the processes using it first)"
    elif code == "NO_PERMISSION":
        said += " (MIG changes need root)"
    return BackendError(code if code in ERROR_CODES else "UNKNOWN", said)


def unavailable_message(exc: BaseException, library: Optional[str]) -> str:
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
    return "NVML is unavailable: nvmlInit failed: %s (%s)" % (message(exc), code)


def preload(path: str) -> None:
    """Load `path` so that pynvml's dlopen of the soname finds it; raise BackendUnavailable."""
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 2))
    except OSError as exc:
        raise BackendUnavailable("NVML is unavailable: cannot load %s (%s)" % (path, exc)) from None
    # If pynvml has not opened a library yet, give it this one: this also works for a file
    # whose soname is not libnvidia-ml.so.1.
    if getattr(pynvml, "nvmlLib", None) is None:
        pynvml.nvmlLib = lib
