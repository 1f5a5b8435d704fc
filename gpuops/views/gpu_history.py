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
from gpuops.fleet.source import FleetSnapshot, NodeView
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
    """The last `size` points of one GPU (`width` 4) or of all a node's GPUs side by side (`width`
    4 per GPU), oldest overwritten first."""

    __slots__ = ("data", "next", "size", "width")

    def __init__(self, size: int, width: int = _WIDTH) -> None:
        self.data = array("f")
        self.size = size
        self.width = width
        self.next = 0  # the slot the next point goes to once the ring is full

    @property
    def count(self) -> int:
        return len(self.data) // self.width if self.width else 0

    def append(self, point: tuple[float | None, ...]) -> None:
        self.put([math.nan if v is None else v for v in point])

    def put(self, values: list[float]) -> None:
        """Append a point of `width` numbers (NaN: not reported)."""
        width = self.width
        if len(self.data) < self.size * width:
            self.data.extend(values)
            return
        base = self.next * width
        self.data[base : base + width] = array("f", values)
        self.next = (self.next + 1) % self.size

    def raw(self, offset: int) -> list[float]:
        """The numbers at `offset` in each point, oldest first, NaN included."""
        n = self.count
        start = self.next if n == self.size else 0
        data, width = self.data, self.width
        return [data[((start + k) % n) * width + offset] for k in range(n)]

    def column(self, i: int) -> list[float]:
        return [v for v in self.raw(i) if not math.isnan(v)]


class GpuHistory:
    """The last `ring` points of each (node, GPU index). A node's GPUs share one ring (a point per
    sample holds all of them side by side, so an update adds one run of numbers per node); when
    the node's GPUs change (one is gone, another came), their points so far move to a ring per GPU
    and the node starts a new shared ring. A node whose view object did not change since the last
    update (no new sample) adds nothing, so a refresh costs a walk over the nodes only."""

    def __init__(self, ring: int = RING) -> None:
        self.ring = ring
        self._nodes: dict[str, tuple[tuple[int, ...], _Ring]] = {}  # GPU indexes, their ring
        self._points: dict[tuple[str, int], _Ring] = {}  # earlier points, of earlier GPU sets
        self._views: dict[str, NodeView] = {}

    def update(
        self,
        snapshot: FleetSnapshot,
        node_points: Callable[[NodeView], tuple[tuple[int, ...], list[float]]] | None = None,
    ) -> None:
        """Add each node's new sample. `node_points`, where given, answers a view's GPU indexes and
        points already read (`views.gpus.NodeFacts.indexes`, `points`: four figures per GPU in its
        order, as `gpu_point` reads them, NaN for None), so the feed's one pass over the GPUs
        serves the history too."""
        nodes = self._nodes
        for view in snapshot.nodes:
            if view.sample is None or self._views.get(view.name) is view:
                continue
            last = self._views.get(view.name)
            self._views[view.name] = view
            if last is not None and last.sample is view.sample:
                continue  # a state change only (stale, unreachable): no new sample
            name = view.name
            gpus = view.sample.gpus
            if node_points is not None:
                indexes, values = node_points(view)
            else:
                indexes = tuple([gpu.info.index for gpu in gpus])
                values = []
                for gpu in gpus:
                    values += _fast_point(gpu)
            held = nodes.get(name)
            if held is None or held[0] != indexes:
                if held is not None:
                    self._retire(name, *held)
                held = nodes[name] = (indexes, _Ring(self.ring, _WIDTH * len(indexes)))
            if indexes:
                held[1].put(values)

    def _retire(self, node: str, indexes: tuple[int, ...], ring: _Ring) -> None:
        """Move a node ring's points to a ring per GPU (the node's GPUs changed)."""
        for position, index in enumerate(indexes):
            key = (node, index)
            alone = self._points.get(key)
            if alone is None:
                alone = self._points[key] = _Ring(self.ring)
            columns = [ring.raw(position * _WIDTH + i) for i in range(_WIDTH)]
            for point in zip(*columns, strict=True):
                alone.put(list(point))

    def _raw(self, node: str, gpu: int, i: int) -> list[float]:
        alone = self._points.get((node, gpu))
        out = alone.raw(i) if alone is not None else []
        held = self._nodes.get(node)
        if held is not None and gpu in held[0]:
            out += held[1].raw(held[0].index(gpu) * _WIDTH + i)
        return out[-self.ring :]

    def series(self, node: str, gpu: int, name: str) -> list[float]:
        """One series of a GPU, oldest first; points without the figure left out."""
        return [v for v in self._raw(node, gpu, SERIES.index(name)) if not math.isnan(v)]

    def points(self, node: str, gpu: int) -> int:
        return len(self._raw(node, gpu, 0))

    def nbytes(self) -> int:
        """The rings' storage, for the memory budget (docs/tui.md)."""
        rings = [r for _, r in self._nodes.values()] + list(self._points.values())
        return sum(r.data.itemsize * len(r.data) for r in rings)


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
