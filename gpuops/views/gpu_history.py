"""Each GPU over the session, for the GPU detail's sparklines: utilization, memory, power and
temperature, one point per sample the node sent, in a bounded ring per GPU; and the GPU's health
as far as the agent reports it (health events counted per kind, what it does not send named)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
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


_NAN = math.nan


def _fast_point(gpu: Gpu) -> list[float]:
    """`gpu_point` with NaN for None, reading the usual types (float figures, int bytes) without
    the conversion calls: one update touches every GPU of the fleet."""
    s = gpu.sample
    if s is None:
        return [_NAN, _NAN, _NAN, _NAN]
    util = s.utilization_gpu_percent
    used = s.memory_used_bytes
    total = s.memory_total_bytes
    power = s.power_watts
    temp = s.temperature_celsius
    if (
        type(util) is float
        and type(used) is int
        and type(total) is int
        and total > 0
        and type(power) is float
        and type(temp) is float
    ):
        return [util, 100.0 * used / total, power, temp]
    return [_NAN if v is None else v for v in gpu_point(gpu)]


# A point is stored as four 32-bit floats (NaN: not reported), 16 bytes against ~180 for a tuple
# of Python floats; a ring grows to its size as points come, so 10k GPUs x 600 points is ~96 MB
# only after 10 minutes at 1 s, and a short session costs what it recorded.
_WIDTH = len(SERIES)


class _Ring:
    """The last `size` points of one GPU, oldest overwritten first."""

    __slots__ = ("data", "next", "size")

    def __init__(self, size: int) -> None:
        self.data = array("f")
        self.size = size
        self.next = 0  # the slot the next point goes to once the ring is full

    @property
    def count(self) -> int:
        return len(self.data) // _WIDTH

    def append(self, point: tuple[float | None, ...]) -> None:
        self.put([math.nan if v is None else v for v in point])

    def put(self, values: list[float]) -> None:
        """Append a point of `_WIDTH` numbers (NaN: not reported)."""
        if len(self.data) < self.size * _WIDTH:
            self.data.extend(values)
            return
        base = self.next * _WIDTH
        self.data[base : base + _WIDTH] = array("f", values)
        self.next = (self.next + 1) % self.size

    def column(self, i: int) -> list[float]:
        n = self.count
        start = self.next if n == self.size else 0
        out = []
        for k in range(n):
            v = self.data[((start + k) % n) * _WIDTH + i]
            if not math.isnan(v):
                out.append(v)
        return out


class GpuHistory:
    """A ring of points per (node, GPU index). A node whose view object did not change since the
    last update (no new sample) adds nothing, so a refresh costs a walk over the nodes only."""

    def __init__(self, ring: int = RING) -> None:
        self.ring = ring
        self._points: dict[tuple[str, int], _Ring] = {}
        self._views: dict[str, NodeView] = {}
        self._slots: dict[str, list[tuple[int, _Ring]]] = {}  # each node's (index, ring), GPU order

    def update(
        self, snapshot: FleetSnapshot, node_points: Callable[[NodeView], list[float]] | None = None
    ) -> None:
        """Add each node's new sample. `node_points`, where given, answers a view's points already
        read (`views.gpus.NodeFacts.points`: four figures per GPU in its order, as `gpu_point`
        reads them, NaN for None), so the feed's one pass over the GPUs serves the history too."""
        points = self._points
        slots = self._slots
        full = self.ring * _WIDTH
        nan = _NAN
        for view in snapshot.nodes:
            if view.sample is None or self._views.get(view.name) is view:
                continue
            last = self._views.get(view.name)
            self._views[view.name] = view
            if last is not None and last.sample is view.sample:
                continue  # a state change only (stale, unreachable): no new sample
            name = view.name
            # the node's rings in its GPUs' order, found again by position while the GPUs are the
            # same, so that a point costs no lookup by (node, index)
            rings = slots.get(name)
            if rings is None:
                rings = slots[name] = []
            known = len(rings)
            read = node_points(view) if node_points is not None else None
            for k, gpu in enumerate(view.sample.gpus):
                index = gpu.info.index
                if k < known and rings[k][0] == index:
                    ring = rings[k][1]
                else:
                    key = (name, index)
                    found = points.get(key)
                    if found is None:
                        found = points[key] = _Ring(self.ring)
                    ring = found
                    if k < known:
                        rings[k] = (index, ring)
                    else:
                        rings.append((index, ring))
                        known += 1
                # _fast_point, inline: every GPU of the fleet, every update
                s = gpu.sample
                if read is not None:
                    values = read[4 * k : 4 * k + 4]
                elif s is None:
                    values = [nan, nan, nan, nan]
                else:
                    util = s.utilization_gpu_percent
                    used = s.memory_used_bytes
                    total = s.memory_total_bytes
                    power = s.power_watts
                    temp = s.temperature_celsius
                    if (
                        type(util) is float
                        and type(used) is int
                        and type(total) is int
                        and total > 0
                        and type(power) is float
                        and type(temp) is float
                    ):
                        values = [util, 100.0 * used / total, power, temp]
                    else:
                        values = [nan if v is None else v for v in gpu_point(gpu)]
                data = ring.data
                if len(data) < full:
                    data.extend(values)
                else:
                    ring.put(values)

    def series(self, node: str, gpu: int, name: str) -> list[float]:
        """One series of a GPU, oldest first; points without the figure left out."""
        ring = self._points.get((node, gpu))
        return ring.column(SERIES.index(name)) if ring is not None else []

    def points(self, node: str, gpu: int) -> int:
        ring = self._points.get((node, gpu))
        return ring.count if ring is not None else 0

    def nbytes(self) -> int:
        """The rings' storage, for the memory budget (docs/tui.md)."""
        return sum(r.data.itemsize * len(r.data) for r in self._points.values())


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
