"""gpuops node backend for AMD Instinct GPUs (docs/backends.md, the worked example)."""

from gpuops_backend_amd.backend import AmdSmiBackend

__all__ = ["AmdSmiBackend"]
