"""The real node backend: NVIDIA's NVML through pynvml (the `nvidia-ml-py` package).

Every NVML query can fail on its own (NOT_SUPPORTED on a MIG-enabled GPU, GPU_IS_LOST,
FUNCTION_NOT_FOUND on an older driver, NO_PERMISSION, ...). Each call is made separately and a
failure becomes `NotAvailable(<code>)` in that one field; the rest of the sample survives, and a
GPU whose handle cannot be had still appears, with its figures n/a.

Costs: handles and what does not change (name, UUID, PCI ids, memory total, power limit, MIG
profile tables) are read once per GPU and cached; a sample then makes about ten NVML calls per
GPU, plus the MIG layout walk on MIG-enabled GPUs.

Library: pynvml opens ``libnvidia-ml.so.1`` through the dynamic linker. ``NvmlBackend(library=...)``
or ``$GPUOPS_NVML_LIBRARY`` names another file: it is loaded first, so the dynamic linker finds
it by its soname when pynvml asks (and it is handed to pynvml directly when pynvml has not loaded
a library yet). This is how the tests run the real pynvml ctypes path against a fake library.

By concern (docs/nvml.md):

- `library.py`: loading NVML, one call's outcome (`call`), NVML's error names;
- `devices.py`: each GPU's handle and what is read once, a whole GPU's sample;
- `mig.py`: the MIG layout (profiles, GPU and compute instances, MIG devices) and its samples;
- `gpm.py`: the SM utilization of MIG GPU instances (GPM);
- `processes.py`: the processes on a GPU and what /proc says of them;
- `events.py`: the health event set (XID, ECC, clocks);
- `mig_control.py`: MIG changes;
- `backend.py`: `NvmlBackend`, which puts them together.

`NvmlBackend` is importable from here: the entry point `gpuops.node.backends.nvml:NvmlBackend`
names it so (pyproject.toml, node/backends/registry.py).

Standard library, pynvml and gpuops.core only; valid Python 3.8.
"""

from gpuops.node.backends.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
