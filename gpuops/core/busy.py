"""Busy: the one rule for whether GPU capacity works, and how much of it (docs/metrics.md, "Busy").

- **Busy** (`is_busy`): capacity — a whole GPU, or one GPU instance of a MIG-enabled GPU — is busy
  while it is at least BUSY_PERCENT utilized, whatever memory or processes it holds (a GPU holding
  memory at 0% is held idle, not busy). Where no utilization is reported (a MIG slice of an Ampere
  GPU, or GPM's first sample on Hopper) a process on it is the only evidence: busy while it holds
  one. A GPU counted whole (`gpu_busy`: the CLI's tables, the Prometheus rules'
  `gpu:gpuops_gpu_busy:bool`) is busy while it is, or in MIG mode while one of its GPU instances
  is; a lost GPU works for nobody.
- **GPU-time** (`busy_fraction`): the part of a GPU (or slice) that works, its utilization as a
  fraction, bounded to 0..1; what the node's history records (core/history.py `gpu_shares`) and
  the live views add up as GPU-equivalents used.

Every surface asks these: the view models (gpuops/views/common.py and the fused pass of
gpuops/views/gpus.py), the node's history, and the Prometheus rules, whose threshold
(`>= bool 0.05` on the utilization ratios, BUSY_RATIO) tests/unit/test_busy.py holds to
BUSY_PERCENT.

Pure; valid Python 3.8 (the node's history recorder uses it).
"""

from __future__ import annotations

import math
from typing import Optional

from gpuops.core.model import Gpu, NotAvailable

BUSY_PERCENT = 5.0  # utilization (%) from which capacity counts as busy
BUSY_RATIO = BUSY_PERCENT / 100.0  # the same as the exporters' ratios (0..1) give it: the rules'


def is_busy(util: Optional[float], processes: int) -> bool:
    """Whether capacity with utilization `util` (%; None where none is reported) and `processes`
    processes on it works: at least BUSY_PERCENT utilized, else, with no utilization to go by,
    while it holds a process. A utilization that is not a number is not busy (as Prometheus
    compares it)."""
    if util is not None:
        return util >= BUSY_PERCENT
    return processes > 0


def busy_fraction(util: Optional[float]) -> Optional[float]:
    """The part of a GPU (or MIG slice) that works by `util` %, 0..1; None where none is reported
    or the figure is not a number. One rule for GPU-time, in the node's history and in the live
    views (gpuops/views): a reading past 100% never counts more than the whole GPU, one below 0
    never less than none."""
    if util is None or not math.isfinite(util):
        return None
    return min(1.0, max(0.0, util / 100.0))


def gpu_lost(gpu: Gpu) -> bool:
    """Whether the GPU fell off the bus (NVML's GPU_IS_LOST for its memory)."""
    s = gpu.sample
    return (
        s is not None
        and isinstance(s.memory_total_bytes, NotAvailable)
        and (s.memory_total_bytes.reason == "GPU_IS_LOST")
    )


def _figure(value: object) -> Optional[float]:
    if value is None or isinstance(value, (bool, NotAvailable)):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def gpu_busy(gpu: Gpu) -> bool:
    """Whether the GPU counts as busy, whole: `is_busy` of the GPU, or in MIG mode of any of its
    GPU instances (by its SMs' utilization where NVML's GPM gives it, else by a process on it); a
    lost GPU, or one without a sample, is not."""
    if gpu_lost(gpu):
        return False
    mig = gpu.mig
    if mig is not None and mig.current:
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        for gi in mig.gpu_instances:
            m = samples.get(gi.id)
            util = _figure(m.sm_utilization_percent) if m is not None else None
            if is_busy(util, sum(1 for p in gpu.processes if p.gpu_instance_id == gi.id)):
                return True
        return False
    s = gpu.sample
    return s is not None and is_busy(_figure(s.utilization_gpu_percent), len(gpu.processes))
