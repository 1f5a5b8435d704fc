"""One row per node: the grid's rows and the nodes table (TUI), and the per-node summary of the
CLI's tables; their sort keys and filter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields

from gpuops.core.model import NotAvailable
from gpuops.fleet.source import CONNECTING, LIVE, STALE, UNREACHABLE, FleetSnapshot, NodeView
from gpuops.tenancy.ownership import Ownership
from gpuops.views.cells import Cell, cells_of
from gpuops.views.common import (
    as_int,
    gpu_busy,
    percent_of,
    short_model,
)
from gpuops.views.filter import Filter
from gpuops.views.gpus import GpuPass, node_facts, node_pass


@dataclass(frozen=True, eq=False)
class NodeRow:
    """One node as the fleet grid and the nodes table show it. A row of the TUI's feed is a
    `LazyNodeRow`: the same figures, its cells and filter text made on first use."""

    name: str
    address: str
    state: str
    reason: str
    since: float
    last_seen: float | None
    owner: str | None
    models: str  # "8x A100-80GB"
    cells: tuple[Cell, ...]
    gpus: int
    busy: float  # GPU-equivalents doing work (common.capacity_state): MIG slices by their share
    util: float | None  # mean over GPUs and MIG slices that report it (cells.weighted_util)
    memory_used: int
    memory_total: int
    processes: int
    search: str = field(repr=False, default="")  # what a filter matches: name, owner, models, ...
    held: float = 0.0  # of the idle GPU-equivalents, those holding processes or memory
    # Known without the cells (the grid's layout and totals): how many cells, whose, and the
    # GPU-equivalents `util` is the mean of.
    cell_count: int = field(init=False, repr=False, compare=False, default=0)
    owners: frozenset[str | None] = field(init=False, repr=False, compare=False, default=frozenset())
    util_weight: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        cells = self.cells
        weight = 0.0
        for c in cells:
            if c.util is not None:
                weight += c.fraction
        object.__setattr__(self, "cell_count", len(cells))
        object.__setattr__(self, "owners", frozenset(c.owner for c in cells))
        object.__setattr__(self, "util_weight", weight)

    @property
    def made(self) -> bool:
        """Whether its cells exist (a `LazyNodeRow`'s are made on first use)."""
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeRow):
            return NotImplemented
        return self is other or all(getattr(self, f) == getattr(other, f) for f in _COMPARED)

    def __hash__(self) -> int:
        return hash((self.name, self.state, self.last_seen, self.gpus))

    @property
    def idle(self) -> float:
        return round(self.gpus - self.busy, 6) if self.has_data else 0.0

    @property
    def has_data(self) -> bool:
        return self.state in (LIVE, STALE) and self.last_seen is not None

    def age(self, now: float) -> float | None:
        return None if self.last_seen is None else max(0.0, now - self.last_seen)

    @property
    def memory(self) -> float | None:
        return percent_of(self.memory_used, self.memory_total)


_COMPARED = tuple(f.name for f in fields(NodeRow) if f.compare)


class LazyNodeRow(NodeRow):
    """A node row whose figures were read in a light pass (`lazy_node_row`) and whose cells and
    filter text are made on first use: the grid asks for them for the lines on screen only, a
    filter for every row."""

    def __init__(self, **values: object) -> None:  # dataclasses.replace: a full row's fields
        super().__init__(**values)  # type: ignore[arg-type]

    @property
    def cells(self) -> tuple[Cell, ...]:
        d = self.__dict__
        if "cells" not in d:
            self._make()
        return d["cells"]  # type: ignore[no-any-return]

    @cells.setter
    def cells(self, value: tuple[Cell, ...]) -> None:
        self.__dict__["cells"] = value

    @property
    def search(self) -> str:
        d = self.__dict__
        if "search" not in d:
            self._make()
        return d["search"]  # type: ignore[no-any-return]

    @search.setter
    def search(self, value: str) -> None:
        self.__dict__["search"] = value

    @property
    def made(self) -> bool:
        return "cells" in self.__dict__

    def _make(self) -> None:
        d = self.__dict__
        d["cells"], d["search"] = d.pop("_fill")()


def node_row(view: NodeView, ownership: Ownership) -> NodeRow:
    """The node's row, from the per-GPU pass it shares with the tenants (`views.gpus`)."""
    return _full_row(view, node_pass(view, ownership).gpus)


def _full_row(view: NodeView, passes: list[GpuPass]) -> NodeRow:
    name = view.name
    sampled = view.sample is not None
    cells: list[Cell] = []
    models: dict[str, int] = {}
    processes = mem_used = mem_total = 0
    words: list[str] = []  # what the cells add to the filter's text
    busy: float = 0  # in cell order from 0, as sum() adds them
    held: float = 0
    util_sum = util_weight = 0.0  # weighted_util, in cell order
    for g in passes:
        gpu = g.gpu
        own = cells_of(name, g)
        cells.extend(own)
        model = own[0].model  # short_model(gpu.info.name): every GPU has a first cell
        models[model] = models.get(model, 0) + 1
        s = gpu.sample
        if s is not None:  # the pass read a whole GPU's figures already
            mem_used += (as_int(s.memory_used_bytes) if g.mig else g.memory_used) or 0
        total = gpu.info.memory_total_bytes
        mem_total += (total if type(total) is int else as_int(total)) or 0
        processes += len(gpu.processes)
        for c in own:
            if c.busy:
                busy += c.fraction
            if c.held:
                held += c.fraction
            if c.util is not None:
                util_sum += c.util * c.fraction
                util_weight += c.fraction
            words.extend(c.tenants)
            words.extend(c.users)
            if c.owner:
                words.append(c.owner)
            if c.profile:
                words.append(c.profile)
    model_text = ", ".join(f"{n}x {m}" for m, n in sorted(models.items()))
    head = [name, view.owner or "", model_text, view.state, view.address]
    return NodeRow(
        name=name,
        address=view.address,
        state=view.state,
        reason=view.reason,
        since=view.since,
        last_seen=view.last_seen,
        owner=view.owner,
        models=model_text,
        cells=tuple(cells),
        gpus=len(passes),
        busy=round(busy, 6) if sampled else 0.0,
        util=util_sum / util_weight if util_weight > 0 else None,
        memory_used=mem_used,
        memory_total=mem_total,
        processes=processes,
        search=" ".join(dict.fromkeys(w for w in (*head, *words) if w)),
        held=round(held, 6) if sampled else 0.0,
    )


def lazy_node_row(view: NodeView, ownership: Ownership) -> NodeRow:
    """The node's row with the same figures as `node_row`, its cells and filter text made on first
    use (`NodeRow.cells`, `search`). The figures come from the fused pass (`views.gpus.node_facts`,
    shared with the tenants), which adds them in the order `node_row` does, so they are equal to
    the full row's; a MIG GPU's slices are read there without making cells."""
    facts = node_facts(view, ownership)
    figures = facts.row

    def fill() -> tuple[tuple[Cell, ...], str]:
        full = _full_row(view, facts.passes().gpus)
        return full.cells, full.search

    row = LazyNodeRow.__new__(LazyNodeRow)
    row.__dict__.update(
        name=view.name,
        address=view.address,
        state=view.state,
        reason=view.reason,
        since=view.since,
        last_seen=view.last_seen,
        owner=view.owner,
        models=figures.models,
        gpus=len(facts.gpus),
        busy=figures.busy,
        held=figures.held,
        util=figures.util_sum / figures.util_weight if figures.util_weight > 0 else None,
        util_weight=figures.util_weight,
        memory_used=figures.memory_used,
        memory_total=figures.memory_total,
        processes=figures.processes,
        cell_count=figures.cells,
        owners=figures.owners,
        _fill=fill,
    )
    return row


class RowCache:
    """Node rows by node, reused while a node's view object is unchanged (the collector makes a new
    view for every sample or state change, so identity is enough)."""

    def __init__(self, lazy: bool = False) -> None:
        self._rows: dict[str, tuple[NodeView, Ownership, NodeRow]] = {}
        self._make = lazy_node_row if lazy else node_row  # lazy: cells made on first use

    def rows(self, snapshot: FleetSnapshot, ownership: Ownership) -> tuple[NodeRow, ...]:
        out = []
        fresh: dict[str, tuple[NodeView, Ownership, NodeRow]] = {}
        for view in snapshot.nodes:
            hit = self._rows.get(view.name)
            if hit is not None and hit[0] is view and hit[1] is ownership:
                row = hit[2]
            else:
                row = self._make(view, ownership)
            fresh[view.name] = (view, ownership, row)
            out.append(row)
        self._rows = fresh
        return tuple(out)


def node_rows(snapshot: FleetSnapshot, ownership: Ownership) -> tuple[NodeRow, ...]:
    return tuple(node_row(v, ownership) for v in snapshot.nodes)


_STATE_RANK = {UNREACHABLE: 0, STALE: 1, CONNECTING: 2, LIVE: 3}


def _none_last(value: float | None) -> float:
    return float("-inf") if value is None else value


# Fleet and nodes sort keys: name -> (key function, descending by default)
NODE_SORTS: dict[str, tuple[Callable[[NodeRow, float], object], bool]] = {
    "name": (lambda r, now: r.name, False),
    "state": (lambda r, now: (_STATE_RANK.get(r.state, 9), r.name), False),
    "age": (lambda r, now: _none_last(r.age(now)) if r.state != CONNECTING else float("-inf"), True),
    "owner": (lambda r, now: (r.owner or "~", r.name), False),
    "gpus": (lambda r, now: r.gpus, True),
    "util": (lambda r, now: _none_last(r.util), True),
    "memory": (lambda r, now: _none_last(r.memory), True),
    "idle": (lambda r, now: r.idle, True),
    "processes": (lambda r, now: r.processes, True),
}


def sort_rows(rows: Iterable[NodeRow], key: str, now: float, reverse: bool = False) -> list[NodeRow]:
    """Rows by a NODE_SORTS key in its natural direction (figures largest first), `reverse` flips it.
    Ties keep name order."""
    fn, descending = NODE_SORTS[key]
    ordered = sorted(rows, key=lambda r: r.name)
    return sorted(ordered, key=lambda r: fn(r, now), reverse=descending != reverse)  # type: ignore[arg-type,return-value]


def filter_rows(rows: Iterable[NodeRow], flt: Filter | None) -> list[NodeRow]:
    return [r for r in rows if flt is None or flt.matches(r.search)]


# ---- the CLI's per-node summary -----------------------------------------------------------------


@dataclass(frozen=True)
class NodeSummary:
    """One node as `gpuops fleet` and the status lines print it."""

    name: str
    state: str
    reason: str
    age: float | None
    owner: str | None
    gpus: int
    models: str
    busy: int
    utilization_percent: float | None  # mean over GPUs that report it
    memory_used_bytes: int
    memory_total_bytes: int
    processes: int


def node_summary(view: NodeView, now: float) -> NodeSummary:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    models: dict[str, int] = {}
    for gpu in gpus:
        models[gpu.info.name] = models.get(gpu.info.name, 0) + 1
    utils = [
        float(g.sample.utilization_gpu_percent)
        for g in gpus
        if g.sample is not None and not isinstance(g.sample.utilization_gpu_percent, NotAvailable)
    ]
    return NodeSummary(
        name=view.name,
        state=view.state,
        reason=view.reason,
        age=view.age(now),
        owner=view.owner,
        gpus=len(gpus),
        models=", ".join(f"{n}x {short_model(m)}" for m, n in sorted(models.items())),
        busy=sum(1 for g in gpus if gpu_busy(g)) if view.sample else 0,
        utilization_percent=sum(utils) / len(utils) if utils else None,
        memory_used_bytes=sum(as_int(g.sample.memory_used_bytes) or 0 for g in gpus if g.sample),
        memory_total_bytes=sum(as_int(g.info.memory_total_bytes) or 0 for g in gpus),
        processes=sum(len(g.processes) for g in gpus),
    )
