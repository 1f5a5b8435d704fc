"""Each GPU over the session, for the GPU detail's sparklines: utilization, memory, power and
temperature, one point per sample the node sent, in a bounded ring per GPU; and the GPU's health
as far as the agent reports it (health events counted per kind, what it does not send named)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gpuops.core.history import instance_fraction
from gpuops.core.model import Gpu, HealthEvent
from gpuops.fleet.collector import FleetSnapshot, NodeView
from gpuops.views.common import as_float, mig_active, percent_of

RING = 600  # points per GPU: 10 minutes at 1 s, then the oldest go (a ring, not the whole day)
SERIES = ("util", "memory", "power", "temperature")

# What NVML gives and the agent's sample does not carry yet, with the call that would read it:
# shown as not reported, with this reason, instead of a blank.
NOT_SENT: tuple[tuple[str, str], ...] = (
    ("ECC counters", "nvmlDeviceGetTotalEccErrors"),
    ("throttle reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    ("fan", "nvmlDeviceGetFanSpeed"),
    ("PCIe link", "nvmlDeviceGetCurrPcieLinkGeneration/Width"),
)


def gpu_point(gpu: Gpu) -> tuple[float | None, float | None, float | None, float | None]:
    """(utilization %, memory %, watts, °C) of one sample; a MIG GPU's utilization is its slices'
    SM utilization (GPM) weighted by their share of the GPU, where reported."""
    s = gpu.sample
    if s is None:
        return (None, None, None, None)
    util = as_float(s.utilization_gpu_percent)
    if util is None and mig_active(gpu) and gpu.mig is not None:
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        total = weight = 0.0
        for gi in gpu.mig.gpu_instances:
            m = samples.get(gi.id)
            value = as_float(m.sm_utilization_percent) if m is not None else None
            if value is not None:
                share = instance_fraction(gpu, gi)
                total += value * share
                weight += share
        util = total / weight if weight > 0 else None
    return (
        util,
        percent_of(s.memory_used_bytes, s.memory_total_bytes),
        as_float(s.power_watts),
        as_float(s.temperature_celsius),
    )


class GpuHistory:
    """A ring of points per (node, GPU index). A node whose view object did not change since the
    last update (no new sample) adds nothing, so a refresh costs a walk over the nodes only."""

    def __init__(self, ring: int = RING) -> None:
        self.ring = ring
        self._points: dict[tuple[str, int], deque[tuple[float | None, ...]]] = {}
        self._views: dict[str, NodeView] = {}
        self._started: dict[tuple[str, int], float] = {}

    def update(self, snapshot: FleetSnapshot) -> None:
        for view in snapshot.nodes:
            if view.sample is None or self._views.get(view.name) is view:
                continue
            last = self._views.get(view.name)
            self._views[view.name] = view
            if last is not None and last.sample is view.sample:
                continue  # a state change only (stale, unreachable): no new sample
            for gpu in view.sample.gpus:
                key = (view.name, gpu.info.index)
                ring = self._points.get(key)
                if ring is None:
                    ring = self._points[key] = deque(maxlen=self.ring)
                    self._started[key] = view.sample.timestamp
                ring.append(gpu_point(gpu))

    def series(self, node: str, gpu: int, name: str) -> list[float]:
        """One series of a GPU, oldest first; points without the figure left out."""
        i = SERIES.index(name)
        ring = self._points.get((node, gpu), ())
        return [float(v) for p in ring if (v := p[i]) is not None]

    def points(self, node: str, gpu: int) -> int:
        return len(self._points.get((node, gpu), ()))


@dataclass(frozen=True)
class HealthCounts:
    """A GPU's health events this session, per kind."""

    xid: int = 0
    ecc_single_bit: int = 0
    ecc_double_bit: int = 0
    clock: int = 0  # clock-change events (throttling shows as these)
    pstate: int = 0


def health_counts(events: Sequence[tuple[str, HealthEvent]], node: str, gpu: int) -> HealthCounts:
    counts = {k: 0 for k in ("xid", "ecc_single_bit", "ecc_double_bit", "clock", "pstate")}
    for name, e in events:
        if name == node and e.gpu == gpu and e.kind in counts:
            counts[e.kind] += 1
    return HealthCounts(**counts)
