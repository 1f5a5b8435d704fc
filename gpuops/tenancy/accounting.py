"""Per-tenant accounting over time, from the nodes' history rollups (docs/pools.md#accounting).

The nodes keep minute and hour buckets of who used each GPU (`gpuops/core/history.py`, recorded
by the agent's service mode); this module turns them into evidence per GPU (`Evidence`) and into
the per-team table of `gpuops tenants` (`tenant_usage`): owned, guaranteed, used (mean, p95,
peak), borrowed, lent, idle owned capacity, memory — and the same figures split between a team's
silo and its part of a pool (`team_sides`, the Pool screen's table; `repool` re-reads which GPU is
in which pool from another fleet.yaml, e.g. a proposal). Attribution happens here, on the operator's
side, with fleet.yaml's chain (a bucket keeps the unix user, groups and limiter label of each
key, not a team), so a change of teams re-attributes the past too.

Every figure is in GPU-equivalents (one whole GPU busy = 1.0) or bytes. A bucket counts with the
seconds its GPU was actually sampled (a partial bucket weighs less; a gap is no data, not idle).
A bucket a node could not read (a corrupt history file: `History.unreadable`) is unknown, neither
idle nor busy: the fleet-wide figures leave that bucket out for every team (`Evidence.observed`),
so they are computed over the time readable on every node, and `Evidence.incomplete` says which
node has how many such buckets (docs/history.md#unreadable-history).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuops.core.history import HOUR, MINUTE, Bucket, GpuUsage, History, UserUsage
from gpuops.core.mig.catalog import find_model
from gpuops.core.model import GpuProcess
from gpuops.core.units import format_duration
from gpuops.spec.model import Fleet
from gpuops.tenancy.ownership import UNOWNED, Ownership

# ---- windows ----------------------------------------------------------------------------------------

MINUTE_BUCKETS_KEPT = 120  # what a node keeps at minute resolution (docs/history.md)
_WINDOW_RE = re.compile(r"\s*(\d+)\s*([mhd])\s*\Z")
_UNIT = {"m": 60.0, "h": 3600.0, "d": 86400.0}
WINDOWS = ("1m", "1h", "24h", "7d")


class WindowError(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    """A look-back window: its text, its length in seconds and the bucket resolution read for it
    (minutes up to 2 hours, hours beyond)."""

    text: str
    seconds: float
    resolution: str

    @property
    def span(self) -> float:
        return MINUTE if self.resolution == "minute" else HOUR

    def starts(self, now: float) -> tuple[float, ...]:
        """Starts of the buckets that overlap [now - seconds, now], oldest first."""
        span = self.span
        last = math.floor(now / span) * span
        first = math.floor((now - self.seconds) / span) * span
        count = round((last - first) / span) + 1
        return tuple(first + k * span for k in range(count))


def parse_window(text: str) -> Window:
    """'1m', '90m', '24h', '7d' (at most 90 days)."""
    m = _WINDOW_RE.match(text)
    if m is None or int(m.group(1)) == 0:
        raise WindowError(f"window {text!r}: expected a duration such as 1m, 1h, 24h or 7d")
    seconds = int(m.group(1)) * _UNIT[m.group(2)]
    if seconds > 90 * 86400:
        raise WindowError(f"window {text!r}: at most 90d (nodes keep 35 days of hourly history)")
    resolution = "minute" if seconds <= MINUTE_BUCKETS_KEPT * MINUTE - MINUTE else "hour"
    return Window(text.strip(), seconds, resolution)


# ---- evidence per GPU -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuEvidence:
    """One GPU over a window. Series have one value per window bucket (`Evidence.starts`);
    `observed[i]` is how many seconds of bucket i were sampled (0: no data)."""

    node: str
    index: int
    uuid: str
    name: str
    memory_total: int
    owner: str | None  # fleet.yaml's owner, else the node's
    pool: str | None
    observed: tuple[float, ...]
    busy: tuple[float, ...]  # fraction of the GPU busy (GPU-time), 0 where no data
    teams: Mapping[str, tuple[float, ...]]  # GPU-equivalents of GPU-time each team used
    held: Mapping[str, float]  # mean GPU-equivalents each team's processes held (present)
    memory: Mapping[str, float]  # mean bytes each team's processes held
    process_p95: Mapping[str, int]  # p95 over buckets of the team's largest process, bytes
    memory_used: float = 0.0  # mean device memory used, bytes
    mig: bool = False  # MIG mode on in its latest bucket
    # Bytes each team's processes held in its latest observed bucket (mean over it): memory that
    # is still taken, busy or not (a forgotten notebook at 0% holds it as much as a job does).
    memory_now: Mapping[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(self.observed)

    @property
    def mig_model(self) -> str | None:
        model = find_model(self.name) if self.name else None
        return model.key if model is not None else None

    def mean_busy(self) -> float:
        return weighted_mean(self.busy, self.observed)

    def p95_busy(self) -> float:
        return p95([b for b, o in zip(self.busy, self.observed, strict=True) if o > 0])

    def coverage(self) -> float:
        """The share of the window's buckets with data (0: no history)."""
        return sum(1 for o in self.observed if o > 0) / max(1, len(self.observed))

    def label(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True)
class Incomplete:
    """A node's history over the window has buckets it could not read."""

    buckets: int  # window buckets unreadable there (no bucket for them, inside an unreadable time)
    reasons: tuple[str, ...]  # the files and their faults, as the node said

    def line(self, node: str) -> str:
        why = f" ({self.reasons[0]}{'; …' if len(self.reasons) > 1 else ''})" if self.reasons else ""
        unit = "bucket" if self.buckets == 1 else "buckets"
        return f"history incomplete: {self.buckets} {unit} unreadable on {node}{why}"


@dataclass(frozen=True)
class Evidence:
    """The fleet over one window: every GPU the nodes' histories show, the nodes whose
    history could not be read (with why), and those whose history has unreadable buckets."""

    window: Window
    now: float
    starts: tuple[float, ...]
    gpus: tuple[GpuEvidence, ...]
    missing: Mapping[str, str] = field(default_factory=dict)
    incomplete: Mapping[str, Incomplete] = field(default_factory=dict)
    # Per window bucket: unreadable on some node. Such a bucket is left out of every fleet-wide
    # figure: a team's use summed over GPUs, or a silo's idle capacity, is unknown there.
    holes: tuple[bool, ...] = ()

    def readable(self) -> int:
        """Window buckets readable on every node."""
        return len(self.starts) - sum(1 for h in self.holes if h)

    def incomplete_lines(self) -> list[str]:
        """One warning per node with unreadable buckets, then what the figures are over."""
        if not self.incomplete:
            return []
        lines = [self.incomplete[node].line(node) for node in sorted(self.incomplete)]
        lines.append(
            f"figures are over the {self.readable()} of {len(self.starts)} {self.window.resolution} buckets "
            "readable on every node (unreadable ones are unknown, counted neither idle nor busy)"
        )
        return lines

    def coverage_line(self) -> str:
        """A warning when the history starts later in the window than its first bucket (a 30d
        window over 7 days recorded): what the figures are over; '' when it covers the window."""
        seen = self.observed()
        first = next((i for i, s in enumerate(seen) if s), None)
        if first is None:
            return f"no history recorded in the {self.window.text} window: every figure is 0"
        if first == 0:
            return ""
        since = datetime.fromtimestamp(self.starts[first], UTC).strftime("%Y-%m-%d %H:%M UTC")
        return (
            f"history covers {format_duration(self.now - self.starts[first])} of the {self.window.text} "
            f"window (recorded since {since}): the figures are over that time"
        )

    def team_series(self, team: str, gpus: Iterable[GpuEvidence] | None = None) -> list[float]:
        """The team's GPU-time per bucket (GPU-equivalents), summed over `gpus` (default: all)."""
        out = [0.0] * len(self.starts)
        for g in self.gpus if gpus is None else gpus:
            series = g.teams.get(team)
            if series is not None:
                for i, v in enumerate(series):
                    out[i] += v
        return out

    def observed(self) -> list[bool]:
        """Buckets for which any GPU has data and no node's history is unreadable, less the
        newest ones fewer GPUs have data for than the bucket before: nodes record on their own
        clocks, so when the figures are gathered the newest bucket may not be recorded
        everywhere yet, and a GPU without data there is unknown, not idle."""
        seen = [False] * len(self.starts)
        counts = [0] * len(self.starts)
        for g in self.gpus:
            for i, o in enumerate(g.observed):
                if o > 0:
                    seen[i] = True
                    counts[i] += 1
        for i, hole in enumerate(self.holes):
            if hole:
                seen[i] = False
        last = max((i for i, s in enumerate(seen) if s), default=-1)
        while last > 0 and seen[last - 1] and counts[last] < counts[last - 1]:
            seen[last] = False
            last -= 1
        return seen

    def teams(self) -> list[str]:
        names = {t for g in self.gpus for t in g.teams}
        names |= {g.owner for g in self.gpus if g.owner}
        return sorted(names, key=lambda t: (t == UNOWNED, t))


def p95(values: Sequence[float]) -> float:
    """The 95th percentile, nearest-rank (a value that was observed; 0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(0.95 * len(ordered)))
    return ordered[rank - 1]


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """The mean of `values` weighted by `weights` (seconds observed, or 1/0 per bucket); 0 when
    nothing weighs."""
    total = sum(weights)
    if total <= 0:
        return 0.0
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


class _Attributor:
    """Keys of history buckets -> teams, through fleet.yaml's attribution chain (cached: keys
    repeat in every bucket)."""

    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership
        self._cache: dict[tuple[object, ...], str] = {}

    def team(self, node: str, owner: str | None, u: UserUsage) -> str:
        key = (node, owner, u.user, u.groups, u.tenant, u.tenant_source, u.gpu_instance_id)
        found = self._cache.get(key)
        if found is None:
            process = GpuProcess(
                pid=0,
                used_memory_bytes=0,
                user=u.user,
                groups=u.groups,
                tenant=u.tenant,
                tenant_source=u.tenant_source,
                gpu_instance_id=u.gpu_instance_id,
            )
            found = self.ownership.tenant(process, owner or UNOWNED, node)[0]
            self._cache[key] = found
        return found


def gather_evidence(
    fleet: Fleet | None,
    histories: Mapping[str, History | str],
    window: Window,
    now: float,
    ownership: Ownership | None = None,
) -> Evidence:
    """Evidence from each node's history (a History, or the reason it could not be read)."""
    ownership = ownership or (Ownership.from_fleet(fleet) if fleet is not None else Ownership())
    attributor = _Attributor(ownership)
    starts = window.starts(now)
    position = {s: i for i, s in enumerate(starts)}
    n = len(starts)
    gpus: list[GpuEvidence] = []
    missing: dict[str, str] = {}
    incomplete: dict[str, Incomplete] = {}
    holes = [False] * n
    for node, history in histories.items():
        if isinstance(history, str):
            missing[node] = history
            continue
        unreadable = _unreadable(history, starts, window.span)
        if unreadable:
            incomplete[node] = Incomplete(
                len(unreadable), tuple(dict.fromkeys(u.reason for u in history.unreadable))
            )
            for hole in unreadable:
                holes[hole] = True
        per_gpu: dict[int, list[tuple[int, GpuUsage]]] = {}
        for bucket in history.buckets:
            i = position.get(_aligned(bucket, window.span))
            if i is None:
                continue
            for g in bucket.gpus:
                per_gpu.setdefault(g.index, []).append((i, g))
        for index in sorted(per_gpu):
            gpus.append(_gpu_evidence(fleet, node, index, per_gpu[index], n, attributor))
    return Evidence(window, now, starts, tuple(gpus), missing, incomplete, tuple(holes))


def _unreadable(history: History, starts: Sequence[float], span: float) -> list[int]:
    """Positions of the window's buckets the node could not read: inside an unreadable time and
    with no bucket of its own (a file rewritten since may hold some of that time again)."""
    if not history.unreadable:
        return []
    have = {_aligned(b, span) for b in history.buckets}
    return [
        i
        for i, s in enumerate(starts)
        if s not in have and any(u.covers(s, span) for u in history.unreadable)
    ]


def _aligned(bucket: Bucket, span: float) -> float:
    return math.floor(bucket.start / span) * span


def _gpu_evidence(
    fleet: Fleet | None,
    node: str,
    index: int,
    rows: list[tuple[int, GpuUsage]],
    n: int,
    attributor: _Attributor,
) -> GpuEvidence:
    last = rows[-1][1]
    in_fleet = fleet is not None and any(x.name == node for x in fleet.nodes)
    owner = (fleet.gpu_owner(node, index) if in_fleet and fleet is not None else None) or last.owner
    pool = fleet.pool_of(node, index, last.uuid, last.name) if in_fleet and fleet is not None else None
    observed = [0.0] * n
    busy = [0.0] * n
    teams: dict[str, list[float]] = {}
    held: dict[str, float] = {}
    memory: dict[str, float] = {}
    largest: dict[str, list[float]] = {}
    memory_used = 0.0
    # This GPU's keys -> teams: its owner is the same in every row, so a key's team is too (a
    # week of hours asks for the same few keys 168 times).
    team_of: dict[tuple[object, ...], str] = {}
    latest: GpuUsage | None = None  # the newest row with time in it: what its teams hold now
    for i, g in rows:
        seconds = g.seconds
        if seconds <= 0:
            continue
        latest = g
        observed[i] += seconds
        share = g.busy / seconds
        busy[i] = share if share < 1.0 else 1.0
        memory_used += g.memory
        if not g.users:
            continue
        row_largest: dict[str, int] = {}
        for u in g.users:
            key = (u.user, u.groups, u.tenant, u.tenant_source, u.gpu_instance_id)
            team = team_of.get(key)
            if team is None:
                team = team_of[key] = attributor.team(node, owner, u)
            series = teams.get(team)
            if series is None:
                series = teams[team] = [0.0] * n
            series[i] += u.busy / seconds
            held[team] = held.get(team, 0.0) + u.held
            memory[team] = memory.get(team, 0.0) + u.memory
            if u.process_max > row_largest.get(team, -1):
                row_largest[team] = u.process_max
        for team, value in row_largest.items():
            largest.setdefault(team, []).append(float(value))
    memory_now: dict[str, float] = {}
    if latest is not None:
        for u in latest.users:
            team = team_of[(u.user, u.groups, u.tenant, u.tenant_source, u.gpu_instance_id)]
            memory_now[team] = memory_now.get(team, 0.0) + u.memory / latest.seconds
    seconds = sum(observed)
    return GpuEvidence(
        node=node,
        index=index,
        uuid=last.uuid,
        name=last.name,
        memory_total=last.memory_total,
        owner=owner,
        pool=pool,
        observed=tuple(observed),
        busy=tuple(busy),
        teams={t: tuple(v) for t, v in teams.items()},
        held={t: v / seconds for t, v in held.items()} if seconds else {},
        memory={t: v / seconds for t, v in memory.items()} if seconds else {},
        process_p95={t: int(p95(v)) for t, v in largest.items()},
        memory_used=memory_used / seconds if seconds else 0.0,
        mig=last.mig,
        memory_now={t: int(v) for t, v in memory_now.items() if v >= 1},
    )


# ---- the tenants table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantUsage:
    """A team over a window. GPU figures in GPU-equivalents; means over the window's observed
    buckets; p95 and peak of the team's fleet-wide GPU-time per bucket."""

    team: str
    owned: int  # GPUs it owns
    silo: int  # of those, not in a pool
    guaranteed: float  # its silo GPUs + its pool guarantees (share x pool size)
    used: float  # mean GPU-time
    p95: float
    peak: float
    held: float  # mean GPU-equivalents its processes sat on (busy or not)
    borrowed: float  # mean GPU-time beyond its guarantees, outside its silo
    lent: float  # mean GPU-time other teams used on its silo GPUs
    idle_owned: float  # mean idle capacity of its silo GPUs
    memory: float  # mean bytes its processes held
    process_p95: int  # p95 of its largest process (the largest over GPUs), bytes
    share: float  # of the fleet's GPU-time in the window, 0..1


def pool_sizes(evidence: Evidence) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for g in evidence.gpus:
        if g.pool is not None:
            sizes[g.pool] = sizes.get(g.pool, 0) + 1
    return sizes


def pool_guarantees(fleet: Fleet | None, sizes: Mapping[str, int]) -> dict[str, float]:
    """GPU-equivalents each team is guaranteed in pools: share x the pool's GPUs."""
    return fleet.pool_guarantees(sizes) if fleet is not None else {}


def tenant_usage(evidence: Evidence, fleet: Fleet | None = None) -> tuple[TenantUsage, ...]:
    """One row per team: fleet.yaml's teams, owners and every team seen in the window."""
    teams = set(evidence.teams()) | (set(fleet.teams) if fleet is not None else set())
    guaranteed_in_pools = pool_guarantees(fleet, pool_sizes(evidence))
    seen = evidence.observed()
    weights = [1.0 if s else 0.0 for s in seen]
    totals = [0.0] * len(evidence.starts)
    series: dict[str, list[float]] = {}
    for team in teams:
        series[team] = evidence.team_series(team)
        for i, v in enumerate(series[team]):
            totals[i] += v
    total_used = weighted_mean(totals, weights)
    rows = []
    for team in sorted(teams, key=lambda t: (t == UNOWNED or t == "-", t)):
        own = [g for g in evidence.gpus if g.owner == team]
        silo = [g for g in own if g.pool is None]
        outside = [g for g in evidence.gpus if not (g.owner == team and g.pool is None)]
        s = series[team]
        pool_g = guaranteed_in_pools.get(team, 0.0)
        out_series = evidence.team_series(team, outside)
        borrowed = [max(0.0, v - pool_g) for v in out_series]
        lent = [0.0] * len(s)
        idle = [0.0] * len(s)
        for g in silo:
            for i in range(len(s)):
                if g.observed[i] > 0:
                    idle[i] += 1.0 - g.busy[i]
                    lent[i] += sum(v[i] for t, v in g.teams.items() if t != team)
        observed_values = [v for v, w in zip(s, weights, strict=True) if w]
        used = weighted_mean(s, weights)
        rows.append(
            TenantUsage(
                team=team,
                owned=len(own),
                silo=len(silo),
                guaranteed=round(len(silo) + pool_g, 6),
                used=round(used, 6),
                p95=round(p95(observed_values), 6),
                peak=round(max(observed_values, default=0.0), 6),
                held=round(sum(g.held.get(team, 0.0) for g in evidence.gpus), 6),
                borrowed=round(weighted_mean(borrowed, weights), 6),
                lent=round(weighted_mean(lent, weights), 6),
                idle_owned=round(weighted_mean(idle, weights), 6),
                memory=sum(g.memory.get(team, 0.0) for g in evidence.gpus),
                process_p95=max((g.process_p95.get(team, 0) for g in evidence.gpus), default=0),
                share=used / total_used if total_used > 0 else 0.0,
            )
        )
    return tuple(rows)


# ---- a pool and the silos, per team ----------------------------------------------------------------


@dataclass(frozen=True)
class TeamSide:
    """A team's silo and its part of the pool, side by side (GPU-equivalents; means over the
    window's observed buckets)."""

    team: str
    silo_gpus: int  # GPUs it owns outside any pool
    silo_used: float  # its GPU-time on them
    silo_idle: float  # their idle capacity
    pool_gpus: int  # GPUs it owns in the pool (contributed)
    guaranteed: float  # its guarantee in the pool: share x the pool's GPUs
    pool_used: float  # its GPU-time on the pool's GPUs
    pool_idle: float  # guarantee it did not use: guaranteed - pool_used, at least 0
    borrowed: float  # GPU-time beyond its guarantees, outside its silo
    p95: float  # p95 of its GPU-time, fleet-wide


def repool(evidence: Evidence, fleet: Fleet) -> Evidence:
    """The evidence with each GPU's pool as `fleet` says (evidence keeps the pools of the fleet it
    was gathered with)."""
    names = {n.name for n in fleet.nodes}
    gpus = tuple(
        dataclasses.replace(
            g,
            pool=fleet.pool_of(g.node, g.index, g.uuid or None, g.name or None) if g.node in names else None,
        )
        for g in evidence.gpus
    )
    return dataclasses.replace(evidence, gpus=gpus)


def team_sides(evidence: Evidence, fleet: Fleet, pool: str) -> tuple[TeamSide, ...]:
    """Per team: silo and pool figures (teams with nothing in either are left out)."""
    weights = [1.0 if s else 0.0 for s in evidence.observed()]
    members = [g for g in evidence.gpus if g.pool == pool]
    entry = fleet.pools.get(pool)
    guarantees = entry.guarantees if entry is not None else {}
    rows = []
    for u in tenant_usage(evidence, fleet):
        own = [g for g in evidence.gpus if g.owner == u.team]
        silo = [g for g in own if g.pool is None]
        mine = [g for g in own if g.pool == pool]
        g = guarantees.get(u.team)
        guaranteed = g.share / 100.0 * len(members) if g is not None else 0.0
        pool_used = weighted_mean(evidence.team_series(u.team, members), weights)
        side = TeamSide(
            team=u.team,
            silo_gpus=len(silo),
            silo_used=weighted_mean(evidence.team_series(u.team, silo), weights),
            silo_idle=u.idle_owned,
            pool_gpus=len(mine),
            guaranteed=guaranteed,
            pool_used=pool_used,
            pool_idle=max(0.0, guaranteed - pool_used),
            borrowed=u.borrowed,
            p95=u.p95,
        )
        if own or guaranteed or u.used >= 0.005:
            rows.append(side)
    return tuple(rows)


@dataclass(frozen=True)
class PoolUsage:
    """A pool over a window, as a whole (GPU-equivalents; means over the window's observed
    buckets): what `gpuops tenants` prints under the teams."""

    pool: str
    gpus: int  # its GPUs seen in the evidence
    policy: str
    borrowing: bool
    guaranteed: float  # to all teams: the sum of the shares x its GPUs
    used: float  # mean GPU-time on its GPUs, whoever ran there
    p95: float  # of that, per bucket
    idle: float  # mean idle capacity of its GPUs
    teams: dict[str, float]  # mean GPU-time per team on its GPUs (teams with any)


def pool_usage(evidence: Evidence, fleet: Fleet) -> tuple[PoolUsage, ...]:
    """One row per pool of `fleet`, in file order (membership as the evidence says: `repool`
    first for another fleet.yaml)."""
    seen = evidence.observed()
    weights = [1.0 if s else 0.0 for s in seen]
    rows = []
    for name, entry in fleet.pools.items():
        members = [g for g in evidence.gpus if g.pool == name]
        used = [0.0] * len(evidence.starts)
        idle = [0.0] * len(evidence.starts)
        for g in members:
            for i, (busy, observed) in enumerate(zip(g.busy, g.observed, strict=True)):
                if observed > 0:
                    used[i] += busy
                    idle[i] += 1.0 - busy
        teams = sorted({t for g in members for t in g.teams})
        per_team = {t: round(weighted_mean(evidence.team_series(t, members), weights), 6) for t in teams}
        rows.append(
            PoolUsage(
                pool=name,
                gpus=len(members),
                policy=entry.policy,
                borrowing=entry.borrowing,
                guaranteed=round(sum(g.share for g in entry.guarantees.values()) / 100.0 * len(members), 6),
                used=round(weighted_mean(used, weights), 6),
                p95=round(p95([u for u, s in zip(used, seen, strict=True) if s]), 6),
                idle=round(weighted_mean(idle, weights), 6),
                teams={t: v for t, v in per_team.items() if v > 0},
            )
        )
    return tuple(rows)


__all__ = [
    "WINDOWS",
    "Evidence",
    "GpuEvidence",
    "Incomplete",
    "PoolUsage",
    "TeamSide",
    "TenantUsage",
    "Window",
    "WindowError",
    "gather_evidence",
    "p95",
    "parse_window",
    "pool_guarantees",
    "pool_sizes",
    "pool_usage",
    "repool",
    "team_sides",
    "tenant_usage",
    "weighted_mean",
]
