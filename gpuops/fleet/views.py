"""What the live screens show, computed from a fleet snapshot: pure functions, no I/O, no widgets.

The TUI's widgets only draw what these functions return, so every figure can be tested without a
terminal and the CLI can reuse them. Definitions (also in docs/tui.md):

- **owner**: the team a GPU belongs to (fleet.yaml's per-GPU owner, else the node's owner, else the
  owner the node itself reports).
- **tenant** of a process: what the attribution chain says (`gpuops.tenancy`, docs/tenancy.md):
  by default the limiter region's tenant label, else the team of its unix user, else of one of
  its unix groups in fleet.yaml, else the GPU's owner (source ``owner``); a process nobody claims
  is unattributed: tenant ``-``, source ``none`` (shown and counted, never dropped).
- **GPU-equivalents**: a whole GPU counts 1; a MIG GPU instance counts its compute slices over the
  GPU's (a 3g slice of an H100 is 3/7).
- **busy**: a GPU at least 5% utilized or with a process on it (`summary.gpu_busy`); a MIG slice
  with a process on it. **idle**: owned capacity that is not busy, free MIG slices included.
- **GPU-time**: utilization-weighted GPU-equivalents (a GPU at 50% is 0.5). NVML gives no
  utilization per MIG device, so a MIG slice counts fully while it holds a process. A GPU's time is
  split between the tenants on it by the memory their processes hold (equally when unknown).
- **waste**: owned capacity minus the GPU-time delivered on it, by anyone: an idle silo of 8 cards
  wastes 8, a notebook node at 10% wastes most of its cards, a saturated team almost nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from gpuops.core.history import instance_fraction
from gpuops.core.mig.catalog import find_model
from gpuops.core.model import Gpu, GpuProcess, NotAvailable
from gpuops.core.units import format_duration
from gpuops.fleet.collector import CONNECTING, LIVE, STALE, UNREACHABLE, FleetEvent, FleetSnapshot, NodeView
from gpuops.fleet.summary import BUSY_PERCENT, UNOWNED, gpu_busy, short_model
from gpuops.tenancy.attribution import AttributionChain, AttributionContext, default_chain

if TYPE_CHECKING:
    from gpuops.spec import Fleet

# ---- ownership and tenants -----------------------------------------------------------------------


@dataclass(frozen=True)
class Ownership:
    """Who owns which GPU, which team a unix user or group works for (fleet.yaml, when there is
    one), and the attribution chain that decides the tenant of each process (None: the built-in
    attributors in the default order)."""

    teams: tuple[str, ...] = ()
    gpu_owner_of: Callable[[str, int], str | None] | None = None
    team_of_user: Callable[[str], str | None] | None = None
    team_of_group: Callable[[str], str | None] | None = None
    chain: AttributionChain | None = None
    fleet: Fleet | None = field(default=None, compare=False)
    # Pool membership per (node, index, uuid, model): selectors are matched once per GPU seen.
    _pools: dict[tuple[str, int, str | None, str | None], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_fleet(cls, fleet: Fleet) -> Ownership:
        names = frozenset(n.name for n in fleet.nodes)

        def gpu_owner(node: str, index: int) -> str | None:
            return fleet.gpu_owner(node, index) if node in names else None

        def team_of_user(user: str) -> str | None:
            return fleet.team_of_user(user)

        options = fleet.attribution
        chain = AttributionChain.from_config(options.order, options.settings)
        return cls(tuple(sorted(fleet.teams)), gpu_owner, team_of_user, fleet.team_of_group, chain, fleet)

    def owner(self, view: NodeView, gpu: Gpu) -> str | None:
        if self.gpu_owner_of is not None:
            owner = self.gpu_owner_of(view.name, gpu.info.index)
            if owner:
                return owner
        return view.owner or gpu.owner

    def pool(self, view: NodeView, gpu: Gpu) -> str | None:
        """The pool fleet.yaml puts the GPU in (None: in its owner's silo, or no fleet.yaml)."""
        fleet = self.fleet
        if fleet is None or not fleet.pools:
            return None
        info = gpu.info
        key = (view.name, info.index, info.uuid, info.name)
        cache = self._pools
        if key not in cache:
            try:
                cache[key] = fleet.pool_of(*key)
            except KeyError:  # a node fleet.yaml does not list (a local view): in no pool
                cache[key] = None
        return cache[key]

    def tenant(
        self, process: GpuProcess, owner: str | None, node: str = "", gpu: Gpu | None = None
    ) -> tuple[str, str]:
        """(team, where it came from) of a process on a GPU owned by `owner`: the attribution
        chain's answer; ("-", "none") when nobody claims it. Never raises."""
        context = AttributionContext(
            node,
            gpu,
            None if owner == UNOWNED else owner,
            self.fleet,
            self.teams,
            self.team_of_user,
            self.team_of_group,
        )
        found = (self.chain or default_chain()).attribute(process, context)
        return found.team, found.source


# ---- small helpers ---------------------------------------------------------------------------------


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: object) -> float | None:
    if value is None or isinstance(value, bool | NotAvailable):
        return None
    return float(value) if isinstance(value, int | float) else None


def percent_of(used: object, total: object) -> float | None:
    u, t = _int(used), _int(total)
    if u is None or t is None or t <= 0:
        return None
    return 100.0 * u / t


def mig_active(gpu: Gpu) -> bool:
    return gpu.mig is not None and gpu.mig.current


def gpu_lost(gpu: Gpu) -> bool:
    s = gpu.sample
    return (
        s is not None
        and isinstance(s.memory_total_bytes, NotAvailable)
        and (s.memory_total_bytes.reason == "GPU_IS_LOST")
    )


def _weights(processes: Sequence[GpuProcess], tenants: Sequence[str]) -> dict[str, float]:
    """Each tenant's share of a GPU (or slice): by the memory its processes hold, else equal."""
    held: dict[str, int] = {}
    for p, t in zip(processes, tenants, strict=True):
        held[t] = held.get(t, 0) + (_int(p.used_memory_bytes) or 0)
    total = sum(held.values())
    if total > 0:
        return {t: m / total for t, m in held.items()}
    return {t: 1.0 / len(held) for t in held}


# ---- the grid: one cell per GPU or MIG slice -----------------------------------------------------

# Cell kinds
GPU, SLICE, FREE, LOST, EMPTY_MIG = "gpu", "slice", "free", "lost", "mig"


class Cell(NamedTuple):
    """One GPU, or one MIG GPU instance, or the free capacity of a MIG GPU. (A named tuple: a
    thousand are made per update, several times faster than a frozen dataclass.)"""

    node: str
    gpu: int  # GPU index on the node
    kind: str  # gpu | slice | free | lost | mig (MIG mode with no instance)
    owner: str | None
    model: str  # short model name
    instance: int | None = None  # MIG GPU instance id
    profile: str = ""  # MIG profile ("3g.40gb"); "" for a whole GPU
    util: float | None = None  # percent; None where not reported (MIG devices) or no data
    memory: float | None = None  # percent of the GPU's (or slice's) memory in use
    memory_used: int | None = None
    memory_total: int | None = None
    busy: bool = False
    fraction: float = 1.0  # GPU-equivalents
    processes: int = 0
    tenants: tuple[str, ...] = ()  # teams with processes on it
    users: tuple[str, ...] = ()


@lru_cache(maxsize=256)
def _short(name: str) -> str:
    return short_model(name)


def gpu_cells(view: NodeView, gpu: Gpu, ownership: Ownership) -> list[Cell]:
    owner = ownership.owner(view, gpu)
    model = _short(gpu.info.name)
    node, index = view.name, gpu.info.index
    if gpu_lost(gpu):
        return [Cell(node, index, LOST, owner, model)]
    tenant_of = [ownership.tenant(p, owner)[0] for p in gpu.processes]
    if mig_active(gpu):
        assert gpu.mig is not None
        cells: list[Cell] = []
        used = 0.0
        samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
        for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
            procs = [
                (p, t) for p, t in zip(gpu.processes, tenant_of, strict=True) if p.gpu_instance_id == gi.id
            ]
            fraction = instance_fraction(gpu, gi)
            used += fraction
            sample = samples.get(gi.id)
            mem_used = _int(sample.memory_used_bytes) if sample else None
            mem_total = (_int(sample.memory_total_bytes) if sample else None) or gi.memory_total_bytes
            cells.append(
                Cell(
                    node,
                    index,
                    SLICE,
                    owner,
                    model,
                    instance=gi.id,
                    profile=gi.profile_name,
                    memory=percent_of(mem_used, mem_total),
                    memory_used=mem_used,
                    memory_total=mem_total,
                    busy=bool(procs),
                    fraction=fraction,
                    processes=len(procs),
                    tenants=tuple(sorted({t for _, t in procs})),
                    users=tuple(sorted({p.user for p, _ in procs if p.user})),
                )
            )
        if not cells:
            return [Cell(node, index, EMPTY_MIG, owner, model)]
        free = round(1.0 - used, 6)
        if free > 0.01:
            cells.append(Cell(node, index, FREE, owner, model, profile="free", fraction=free))
        return cells
    s = gpu.sample
    if s is None:
        return [Cell(node, index, GPU, owner, model, memory_total=_int(gpu.info.memory_total_bytes))]
    used_bytes, total_bytes = _int(s.memory_used_bytes), _int(s.memory_total_bytes)
    gpu_procs = gpu.processes
    return [
        Cell(
            node,
            index,
            GPU,
            owner,
            model,
            util=_num(s.utilization_gpu_percent),
            memory=percent_of(used_bytes, total_bytes),
            memory_used=used_bytes,
            memory_total=total_bytes,
            busy=gpu_busy(gpu),
            processes=len(gpu_procs),
            tenants=tuple(sorted(set(tenant_of))) if gpu_procs else (),
            users=tuple(sorted({p.user for p in gpu_procs if p.user})) if gpu_procs else (),
        )
    ]


@dataclass(frozen=True)
class NodeRow:
    """One node as the fleet grid and the nodes table show it."""

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
    busy: int
    util: float | None  # mean over GPUs that report it
    memory_used: int
    memory_total: int
    processes: int
    search: str = field(repr=False, default="")  # what a filter matches: name, owner, models, ...

    @property
    def idle(self) -> int:
        return self.gpus - self.busy if self.has_data else 0

    @property
    def has_data(self) -> bool:
        return self.state in (LIVE, STALE) and self.last_seen is not None

    def age(self, now: float) -> float | None:
        return None if self.last_seen is None else max(0.0, now - self.last_seen)

    @property
    def memory(self) -> float | None:
        return percent_of(self.memory_used, self.memory_total)


def node_row(view: NodeView, ownership: Ownership) -> NodeRow:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    cells: list[Cell] = []
    models: dict[str, int] = {}
    utils: list[float] = []
    busy = processes = mem_used = mem_total = 0
    for gpu in gpus:
        cells.extend(gpu_cells(view, gpu, ownership))
        name = _short(gpu.info.name)
        models[name] = models.get(name, 0) + 1
        s = gpu.sample
        if s is not None:
            util = _num(s.utilization_gpu_percent)
            if util is not None:
                utils.append(util)
            mem_used += _int(s.memory_used_bytes) or 0
        mem_total += _int(gpu.info.memory_total_bytes) or 0
        if view.sample is not None and gpu_busy(gpu):
            busy += 1
        processes += len(gpu.processes)
    model_text = ", ".join(f"{n}x {m}" for m, n in sorted(models.items()))
    words = [view.name, view.owner or "", model_text, view.state, view.address]
    for c in cells:
        words.extend(c.tenants)
        words.extend(c.users)
        if c.owner:
            words.append(c.owner)
        if c.profile:
            words.append(c.profile)
    return NodeRow(
        name=view.name,
        address=view.address,
        state=view.state,
        reason=view.reason,
        since=view.since,
        last_seen=view.last_seen,
        owner=view.owner,
        models=model_text,
        cells=tuple(cells),
        gpus=len(gpus),
        busy=busy,
        util=sum(utils) / len(utils) if utils else None,
        memory_used=mem_used,
        memory_total=mem_total,
        processes=processes,
        search=" ".join(dict.fromkeys(w for w in words if w)),
    )


class RowCache:
    """Node rows by node, reused while a node's view object is unchanged (the collector makes a new
    view for every sample or state change, so identity is enough)."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[NodeView, Ownership, NodeRow]] = {}

    def rows(self, snapshot: FleetSnapshot, ownership: Ownership) -> tuple[NodeRow, ...]:
        out = []
        fresh: dict[str, tuple[NodeView, Ownership, NodeRow]] = {}
        for view in snapshot.nodes:
            hit = self._rows.get(view.name)
            if hit is not None and hit[0] is view and hit[1] is ownership:
                row = hit[2]
            else:
                row = node_row(view, ownership)
            fresh[view.name] = (view, ownership, row)
            out.append(row)
        self._rows = fresh
        return tuple(out)


def node_rows(snapshot: FleetSnapshot, ownership: Ownership) -> tuple[NodeRow, ...]:
    return tuple(node_row(v, ownership) for v in snapshot.nodes)


# ---- filtering and sorting -----------------------------------------------------------------------


class FilterError(ValueError):
    """A filter that is not a valid regular expression; the message says why."""


@dataclass(frozen=True)
class Filter:
    """k9s' `/` filter: a case-insensitive regular expression; `!` in front inverts it."""

    text: str
    pattern: re.Pattern[str]
    inverse: bool = False

    def matches(self, text: str) -> bool:
        return (self.pattern.search(text) is not None) != self.inverse


def parse_filter(text: str) -> Filter | None:
    """'' -> no filter; 'vision|chat' -> rows matching; '!idle' -> rows not matching."""
    raw = text.strip()
    inverse = raw.startswith("!")
    body = raw[1:] if inverse else raw
    if not body:
        return None
    try:
        pattern = re.compile(body, re.IGNORECASE)
    except re.error as exc:
        raise FilterError(f"not a regular expression: {exc}") from None
    return Filter(raw, pattern, inverse)


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


# ---- groups ----------------------------------------------------------------------------------------

BY_TEAM, BY_NODE = "team", "node"


@dataclass(frozen=True)
class Totals:
    nodes: int = 0
    gpus: int = 0  # whole GPUs
    busy: int = 0
    idle: int = 0
    unknown: int = 0  # GPUs without current data
    slices_idle: float = 0.0  # GPU-equivalents of idle MIG slices (and free capacity) on busy GPUs
    util: float | None = None  # mean of reporting GPUs
    memory_used: int = 0
    memory_total: int = 0
    processes: int = 0

    @property
    def memory(self) -> float | None:
        return percent_of(self.memory_used, self.memory_total)


def totals(rows: Sequence[NodeRow]) -> Totals:
    util_sum = slices_idle = 0.0
    util_n = gpus = busy = idle = unknown = used = total = procs = 0
    for r in rows:
        gpus += r.gpus
        if r.has_data:
            busy += r.busy
            idle += r.idle
            slices_idle += _idle_slices_on_busy_gpus(r.cells)
            for c in r.cells:
                if c.util is not None:
                    util_sum += c.util
                    util_n += 1
        else:
            unknown += r.gpus
        used += r.memory_used
        total += r.memory_total
        procs += r.processes
    return Totals(
        nodes=len(rows),
        gpus=gpus,
        busy=busy,
        idle=idle,
        unknown=unknown,
        slices_idle=round(slices_idle, 6),
        util=util_sum / util_n if util_n else None,
        memory_used=used,
        memory_total=total,
        processes=procs,
    )


def _idle_slices_on_busy_gpus(cells: Sequence[Cell]) -> float:
    """A MIG GPU with one busy slice counts as busy; what its idle slices and free capacity are
    worth still is (the team chips count it idle, in GPU-equivalents)."""
    idle: dict[int, float] = {}
    busy: set[int] = set()
    for c in cells:
        if c.kind in (SLICE, FREE):
            if c.busy:
                busy.add(c.gpu)
            else:
                idle[c.gpu] = idle.get(c.gpu, 0.0) + c.fraction
    return sum(v for gpu, v in idle.items() if gpu in busy)


@dataclass(frozen=True)
class Group:
    """A team's nodes (grouped by team) or all nodes (grouped by node; `team` is '')."""

    team: str
    totals: Totals
    rows: tuple[NodeRow, ...]


def _subset(row: NodeRow, cells: tuple[Cell, ...]) -> NodeRow:
    """A node row with only some of its GPUs (a node whose GPUs belong to several teams)."""
    whole = [c for c in cells if c.kind in (GPU, LOST)]
    gpus = len({c.gpu for c in cells})
    busy = len({c.gpu for c in cells if c.busy})
    utils = [c.util for c in whole if c.util is not None]
    return replace(
        row,
        cells=cells,
        gpus=gpus,
        busy=busy if row.has_data else 0,
        util=sum(utils) / len(utils) if utils else None,
        memory_used=sum(c.memory_used or 0 for c in cells if c.kind != SLICE),
        memory_total=sum(c.memory_total or 0 for c in cells if c.kind in (GPU, LOST)),
        processes=sum(c.processes for c in cells),
    )


def group_rows(
    rows: Iterable[NodeRow],
    by: str = BY_TEAM,
    sort: str = "name",
    reverse: bool = False,
    flt: Filter | None = None,
    now: float = 0.0,
) -> tuple[Group, ...]:
    """The grid's groups: by team (a node's GPUs under their owners, teams by name, unowned last)
    or one group of every node; rows filtered and sorted inside each group."""
    if by == BY_NODE:
        kept = sort_rows(filter_rows(rows, flt), sort, now, reverse)
        return (Group("", totals(kept), tuple(kept)),)
    teams: dict[str, list[NodeRow]] = {}
    for row in rows:
        owners = {c.owner for c in row.cells} or {row.owner}
        if len(owners) == 1:
            teams.setdefault(next(iter(owners)) or UNOWNED, []).append(row)
            continue
        for owner in sorted(owners, key=lambda o: o or "~"):
            part = _subset(row, tuple(c for c in row.cells if c.owner == owner))
            teams.setdefault(owner or UNOWNED, []).append(part)
    groups = []
    for team in sorted(teams, key=lambda t: (t == UNOWNED, t)):
        members = teams[team]
        kept = [r for r in members if flt is None or flt.matches(f"{team} {r.search}")]
        if not kept:
            continue
        kept = sort_rows(kept, sort, now, reverse)
        groups.append(Group(team, totals(kept), tuple(kept)))
    return tuple(groups)


# ---- tenants ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantRow:
    """A team now: what it owns, what it uses (anywhere) and what of its own lies idle. A pool of
    fleet.yaml has a row too (`pool` set, team `pool NAME`): its GPUs' idle capacity and waste are
    the pool's, no longer the silo figures of the teams that bought them."""

    team: str
    owned: int = 0  # GPUs it owns (bought), in its silo or in pools; a pool's row: its GPUs
    unknown: int = 0  # of its silo's GPUs (a pool's: of its GPUs), those without current data
    used: float = 0.0  # GPU-equivalents holding its processes, on any team's GPUs
    guaranteed: float = 0.0  # its silo GPUs + its pool guarantees; a pool's row: all it guarantees
    borrowed: float = 0.0  # of `used`, outside its silo and beyond its pool guarantees
    lent: float = 0.0  # its silo GPUs in use by other teams
    idle: float = 0.0  # silo (a pool's row: pool) GPU-equivalents not busy, free MIG slices included
    waste: float = 0.0  # silo (a pool's row: pool) capacity minus the GPU-time delivered on it
    gpu_time: float = 0.0  # utilization-weighted GPU-equivalents it uses now
    share: float = 0.0  # of the fleet's GPU-time now, 0..1
    memory_used: int = 0  # bytes its processes hold
    memory_owned: int = 0  # memory of the GPUs it owns
    processes: int = 0
    silo: int = 0  # of `owned`, GPUs in no pool (a pool's row: its GPUs)
    pool: str | None = None  # the pool's name, on a pool's row

    @property
    def pooled(self) -> int:
        """GPUs it bought that are in pools now."""
        return 0 if self.pool is not None else self.owned - self.silo


POOL_ROW = "pool "  # a pool's row is team "pool NAME": no team name has a space


def pool_row_name(pool: str) -> str:
    return POOL_ROW + pool


class _Acc:
    __slots__ = (
        "gpu_time",
        "idle",
        "lent",
        "memory_owned",
        "memory_used",
        "outside",
        "owned",
        "processes",
        "silo",
        "unknown",
        "used",
        "waste",
    )

    def __init__(self) -> None:
        self.owned = self.silo = self.unknown = self.processes = self.memory_used = self.memory_owned = 0
        self.used = self.outside = self.lent = self.idle = self.waste = self.gpu_time = 0.0

    def use(self, team: str, owner: _Acc, owner_name: str, pooled: bool, amount: float) -> None:
        """`amount` GPU-equivalents used by this team (`team`) on a GPU of `owner_name`. Use
        outside its silo is borrowing only beyond its pool guarantees (settled at the end, as
        `gpuops tenants` does over a window); pool GPUs are shared, not lent."""
        self.used += amount
        if team != owner_name or pooled:
            self.outside += amount
        if team != owner_name and not pooled:
            owner.lent += amount


def _process_memory(processes: Sequence[GpuProcess], fallback: int | None) -> list[int]:
    """Memory per process; where NVML did not say, an equal share of what the device holds."""
    known = [_int(p.used_memory_bytes) for p in processes]
    if all(k is not None for k in known):
        return [k or 0 for k in known]
    share = (fallback or 0) // max(1, len(processes))
    return [k if k is not None else share for k in known]


def tenant_rows(snapshot: FleetSnapshot, ownership: Ownership) -> tuple[TenantRow, ...]:
    """One row per team (fleet.yaml's teams, owners and tenants seen), by team name, then one
    per pool with GPUs seen, then the unowned."""
    acc: dict[str, _Acc] = {t: _Acc() for t in ownership.teams}
    pools: dict[str, _Acc] = {}

    def get(team: str) -> _Acc:
        a = acc.get(team)
        if a is None:
            a = acc[team] = _Acc()
        return a

    for view in snapshot.nodes:
        current = view.sample is not None and view.state in (LIVE, STALE)
        gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
        for gpu in gpus:
            owner = ownership.owner(view, gpu) or UNOWNED
            pool = ownership.pool(view, gpu)
            o = get(owner)
            o.owned += 1
            o.memory_owned += _int(gpu.info.memory_total_bytes) or 0
            # Who answers for this GPU's capacity (idle, waste, no data): its silo's team, or its pool.
            if pool is None:
                c = o
            else:
                c = pools.setdefault(pool, _Acc())
                c.owned += 1
                c.memory_owned += _int(gpu.info.memory_total_bytes) or 0
            c.silo += 1
            if not current:
                c.unknown += 1
                continue
            if gpu_lost(gpu):
                c.idle += 1.0
                c.waste += 1.0
                continue
            tenants = [ownership.tenant(p, owner)[0] for p in gpu.processes]
            if mig_active(gpu):
                _mig_usage(gpu, owner, pool is not None, c, tenants, get)
                continue
            s = gpu.sample
            util = _num(s.utilization_gpu_percent) if s else None
            memories = _process_memory(gpu.processes, _int(s.memory_used_bytes) if s else None)
            for t, m in zip(tenants, memories, strict=True):
                get(t).memory_used += m
                get(t).processes += 1
            if tenants:
                weights = _weights(gpu.processes, tenants)
                busy_time = util / 100.0 if util is not None else 1.0
                for t, w in weights.items():
                    a = get(t)
                    a.use(t, o, owner, pool is not None, w)
                    a.gpu_time += busy_time * w
                c.waste += 1.0 - min(1.0, busy_time)
            elif util is not None and util >= BUSY_PERCENT:
                # Busy with processes we cannot see (no permission to list them): the owner's.
                o.used += 1.0
                o.gpu_time += util / 100.0
                c.waste += 1.0 - min(1.0, util / 100.0)
            else:
                c.idle += 1.0
                c.waste += 1.0 - min(1.0, (util or 0.0) / 100.0)
    total_time = sum(a.gpu_time for a in acc.values())
    fleet = ownership.fleet
    sizes = {name: p.owned for name, p in pools.items()}
    in_pools = fleet.pool_guarantees(sizes) if fleet is not None else {}
    teams = [
        TenantRow(
            team=team,
            owned=a.owned,
            unknown=a.unknown,
            used=round(a.used, 6),
            guaranteed=round(a.silo + in_pools.get(team, 0.0), 6),
            borrowed=round(max(0.0, a.outside - in_pools.get(team, 0.0)), 6),
            lent=round(a.lent, 6),
            idle=round(a.idle, 6),
            waste=round(a.waste, 6),
            gpu_time=round(a.gpu_time, 6),
            share=a.gpu_time / total_time if total_time > 0 else 0.0,
            memory_used=a.memory_used,
            memory_owned=a.memory_owned,
            processes=a.processes,
            silo=a.silo,
        )
        for team, a in sorted(acc.items())
    ]
    for name, p in sorted(pools.items()):
        guarantees = fleet.pools[name].guarantees if fleet is not None and name in fleet.pools else {}
        promised = sum(g.share for g in guarantees.values()) / 100.0 * p.owned
        teams.append(
            TenantRow(
                team=pool_row_name(name),
                owned=p.owned,
                unknown=p.unknown,
                guaranteed=round(promised, 6),
                idle=round(p.idle, 6),
                waste=round(p.waste, 6),
                memory_owned=p.memory_owned,
                silo=p.silo,
                pool=name,
            )
        )
    return tuple(sorted(teams, key=lambda r: (r.team == UNOWNED, r.pool is not None, r.team)))


def _mig_usage(
    gpu: Gpu, owner: str, pooled: bool, capacity: _Acc, tenants: list[str], get: Callable[[str], _Acc]
) -> None:
    """A MIG GPU's instances: their users' use, and free or unused slices as `capacity`'s idle."""
    assert gpu.mig is not None
    o = get(owner)
    samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
    allocated = 0.0
    for gi in gpu.mig.gpu_instances:
        fraction = instance_fraction(gpu, gi)
        allocated += fraction
        procs = [(p, t) for p, t in zip(gpu.processes, tenants, strict=True) if p.gpu_instance_id == gi.id]
        if not procs:
            capacity.idle += fraction
            capacity.waste += fraction
            continue
        sample = samples.get(gi.id)
        memories = _process_memory([p for p, _ in procs], _int(sample.memory_used_bytes) if sample else None)
        for (_, t), m in zip(procs, memories, strict=True):
            get(t).memory_used += m
            get(t).processes += 1
        for t, w in _weights([p for p, _ in procs], [t for _, t in procs]).items():
            a = get(t)
            a.use(t, o, owner, pooled, fraction * w)
            a.gpu_time += fraction * w
    free = max(0.0, 1.0 - allocated)
    capacity.idle += free
    capacity.waste += free


TENANT_SORTS: dict[str, tuple[Callable[[TenantRow], object], bool]] = {
    "waste": (lambda r: r.waste, True),
    "name": (lambda r: r.team, False),
    "owned": (lambda r: r.owned, True),
    "used": (lambda r: r.used, True),
    "idle": (lambda r: r.idle, True),
    "share": (lambda r: r.share, True),
    "memory": (lambda r: r.memory_used, True),
    "borrowed": (lambda r: r.borrowed, True),
    "processes": (lambda r: r.processes, True),
}


def sort_tenants(
    rows: Iterable[TenantRow], key: str = "waste", reverse: bool = False, flt: Filter | None = None
) -> list[TenantRow]:
    """Tenants sorted (waste first by default), optionally filtered by team name."""
    fn, descending = TENANT_SORTS[key]
    kept = sorted((r for r in rows if flt is None or flt.matches(r.team)), key=lambda r: r.team)
    return sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]


# ---- tenant history over the session ----------------------------------------------------------------

SERIES = ("share", "memory", "owned", "used", "idle", "waste")
HISTORY_POINTS = 720


def _value(row: TenantRow, name: str) -> float:
    if name == "share":
        return 100.0 * row.share
    if name == "memory":
        return float(row.memory_used)
    return float(getattr(row, name))


@dataclass(frozen=True)
class TenantHistory:
    """Each team's figures over the session, one point per update, at most `limit` points: when
    full, neighbours are averaged pairwise and later points cover twice the time (so the whole
    session always fits). Immutable: `record` returns the next history."""

    series: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = ()  # team -> one tuple per SERIES
    step: int = 1  # updates per point
    pending: tuple[tuple[str, tuple[float, ...]], ...] = ()  # sums of the point being built
    pending_count: int = 0
    gpu_seconds: tuple[tuple[str, float], ...] = ()  # GPU-time integrated over the session
    started: float | None = None
    last: float | None = None
    limit: int = HISTORY_POINTS

    def values(self, team: str, name: str) -> tuple[float, ...]:
        for t, per_series in self.series:
            if t == team:
                return per_series[SERIES.index(name)]
        return ()

    def session_share(self, team: str) -> float:
        total = sum(s for _, s in self.gpu_seconds)
        mine = next((s for t, s in self.gpu_seconds if t == team), 0.0)
        return mine / total if total > 0 else 0.0

    @property
    def points(self) -> int:
        return max((len(per[0]) for _, per in self.series), default=0)

    def record(self, now: float, rows: Sequence[TenantRow]) -> TenantHistory:
        dt = 0.0 if self.last is None else max(0.0, now - self.last)
        seconds = dict(self.gpu_seconds)
        for r in rows:
            seconds[r.team] = seconds.get(r.team, 0.0) + r.gpu_time * dt
        sums = dict(self.pending)
        for r in rows:
            before = sums.get(r.team, (0.0,) * len(SERIES))
            sums[r.team] = tuple(b + _value(r, n) for b, n in zip(before, SERIES, strict=True))
        count = self.pending_count + 1
        series = dict(self.series)
        step = self.step
        if count >= step:
            points = self.points
            for team in set(series) | set(sums):
                old = series.get(team) or tuple(() for _ in SERIES)
                if len(old[0]) < points:  # a team that appeared late: pad with zeros
                    old = tuple((0.0,) * (points - len(s)) + s for s in old)
                mean = tuple(v / count for v in sums.get(team, (0.0,) * len(SERIES)))
                series[team] = tuple((*s, m) for s, m in zip(old, mean, strict=True))
            sums, count = {}, 0
            if self.points_of(series) >= self.limit:
                series = {t: tuple(_halve(s) for s in per) for t, per in series.items()}
                step *= 2
        return replace(
            self,
            series=tuple(sorted(series.items())),
            step=step,
            pending=tuple(sorted(sums.items())),
            pending_count=count,
            gpu_seconds=tuple(sorted(seconds.items())),
            started=self.started if self.started is not None else now,
            last=now,
        )

    @staticmethod
    def points_of(series: dict[str, tuple[tuple[float, ...], ...]]) -> int:
        return max((len(per[0]) for per in series.values()), default=0)


def _halve(values: tuple[float, ...]) -> tuple[float, ...]:
    pairs = [(values[i] + values[i + 1]) / 2 for i in range(0, len(values) - 1, 2)]
    if len(values) % 2:
        pairs.append(values[-1])
    return tuple(pairs)


# ---- events ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    """An event as the events screen lists it: what happened, in words."""

    time: float
    node: str
    kind: str  # the collector's: live, stale, unreachable, agent-error
    what: str  # "up", "back", "stale", "unreachable", "agent error"
    message: str


_EVENT_WORDS = {STALE: "stale", UNREACHABLE: "unreachable", "agent-error": "agent error"}


def describe_events(events: Iterable[FleetEvent]) -> list[EventRow]:
    """Events in time order, in words: a node's first `live` is "up"; a `live` after it was stale or
    unreachable is "back", with how long it was out."""
    out: list[EventRow] = []
    down_since: dict[str, tuple[str, float]] = {}
    seen: set[str] = set()
    for e in sorted(events, key=lambda e: e.time):
        if e.kind == LIVE:
            out_since = down_since.pop(e.node, None)
            if out_since is not None:
                state, since = out_since
                message = f"{state} for {format_duration(max(0.0, e.time - since))}"
                out.append(EventRow(e.time, e.node, e.kind, "back", message))
            else:
                what = "up" if e.node not in seen else "live"
                out.append(EventRow(e.time, e.node, e.kind, what, "first sample" if what == "up" else ""))
        else:
            if e.kind in (STALE, UNREACHABLE) and e.node not in down_since:
                down_since[e.node] = (e.kind, e.time)
            out.append(EventRow(e.time, e.node, e.kind, _EVENT_WORDS.get(e.kind, e.kind), e.message))
        seen.add(e.node)
    return out


EVENT_SORTS: dict[str, tuple[Callable[[EventRow], object], bool]] = {
    "time": (lambda e: e.time, True),
    "node": (lambda e: (e.node, -e.time), False),
    "kind": (lambda e: (e.what, -e.time), False),
}


def event_rows(
    events: Iterable[FleetEvent], flt: Filter | None = None, sort: str = "time", reverse: bool = False
) -> list[EventRow]:
    """Events in words, newest first (by default), filtered on node, what happened and message."""
    fn, descending = EVENT_SORTS[sort]
    rows = describe_events(events)
    kept = [e for e in rows if flt is None or flt.matches(f"{e.node} {e.what} {e.kind} {e.message}")]
    ordered = sorted(kept, key=fn, reverse=descending != reverse)  # type: ignore[arg-type]
    return ordered


# ---- fleet status ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetStatus:
    """The status line: how many nodes in which state, and how old the live data is."""

    nodes: int
    live: int
    stale: int
    unreachable: int
    connecting: int
    data_age: float | None  # age of the oldest sample among live nodes
    stale_names: tuple[str, ...]


def fleet_status(snapshot: FleetSnapshot, now: float) -> FleetStatus:
    ages = [v.age(now) for v in snapshot.nodes if v.state == LIVE]
    known = [a for a in ages if a is not None]
    return FleetStatus(
        nodes=len(snapshot.nodes),
        live=snapshot.count(LIVE),
        stale=snapshot.count(STALE),
        unreachable=snapshot.count(UNREACHABLE),
        connecting=snapshot.count(CONNECTING),
        data_age=max(known) if known else None,
        stale_names=tuple(v.name for v in snapshot.nodes if v.state in (STALE, UNREACHABLE)),
    )


# ---- node and GPU detail ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SliceSpan:
    """A MIG GPU instance drawn over the GPU's memory slices."""

    start: int
    size: int
    profile: str
    instance: int | None  # None: free slices
    compute: tuple[str, ...] = ()  # compute instance names
    memory: float | None = None  # percent used
    processes: int = 0
    tenants: tuple[str, ...] = ()


def mig_layout(gpu: Gpu, ownership: Ownership, view: NodeView) -> tuple[int, tuple[SliceSpan, ...]]:
    """(memory slices of the GPU, spans in slice order, free ranges included)."""
    if gpu.mig is None:
        return 0, ()
    model = find_model(gpu.info.mig_model) if gpu.info.mig_model else None
    count = model.memory_slice_count if model is not None else 8
    owner = ownership.owner(view, gpu)
    samples = {m.gpu_instance_id: m for m in gpu.mig_samples}
    spans: list[SliceSpan] = []
    taken = [False] * count
    for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
        procs = [p for p in gpu.processes if p.gpu_instance_id == gi.id]
        sample = samples.get(gi.id)
        spans.append(
            SliceSpan(
                start=gi.start,
                size=gi.size,
                profile=gi.profile_name,
                instance=gi.id,
                compute=tuple(ci.name for ci in gi.compute_instances),
                memory=percent_of(sample.memory_used_bytes, sample.memory_total_bytes) if sample else None,
                processes=len(procs),
                tenants=tuple(sorted({ownership.tenant(p, owner)[0] for p in procs})),
            )
        )
        for s in range(gi.start, min(count, gi.start + gi.size)):
            taken[s] = True
    start = None
    for s in range(count + 1):
        free = s < count and not taken[s]
        if free and start is None:
            start = s
        elif not free and start is not None:
            spans.append(SliceSpan(start, s - start, "free", None))
            start = None
    return count, tuple(sorted(spans, key=lambda sp: sp.start))


@dataclass(frozen=True)
class ProcessRow:
    gpu: int
    pid: int
    user: str
    tenant: str
    tenant_source: str
    memory: int | None
    instance: int | None
    compute_instance: int | None
    command: str


def process_rows(
    view: NodeView, ownership: Ownership, gpu_index: int | None = None
) -> tuple[ProcessRow, ...]:
    """Processes of a node (or of one of its GPUs), with their tenant and where it came from."""
    out = []
    gpus = view.sample.gpus if view.sample else ()
    for gpu in gpus:
        if gpu_index is not None and gpu.info.index != gpu_index:
            continue
        owner = ownership.owner(view, gpu)
        for p in gpu.processes:
            tenant, source = ownership.tenant(p, owner)
            out.append(
                ProcessRow(
                    gpu=gpu.info.index,
                    pid=p.pid,
                    user=p.user,
                    tenant=tenant,
                    tenant_source=source,
                    memory=_int(p.used_memory_bytes),
                    instance=p.gpu_instance_id,
                    compute_instance=p.compute_instance_id,
                    command=p.command,
                )
            )
    return tuple(out)


def find_gpu(view: NodeView, index: int) -> Gpu | None:
    gpus = view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())
    return next((g for g in gpus if g.info.index == index), None)
