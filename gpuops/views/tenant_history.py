"""Each team's figures over the session, kept within a fixed number of points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuops.views.tenants import TenantRow

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
    session always fits). A team seen first after the session began has points from then on only:
    its series is shorter than `points`, its first point at `start(team)` (its values before are
    unknown, not zeros). Immutable: `record` returns the next history."""

    series: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = ()  # team -> one tuple per SERIES
    step: int = 1  # updates per point
    pending: tuple[tuple[str, tuple[float, ...]], ...] = ()  # sums of the point being built
    pending_count: int = 0
    # updates of the point being built in which each team was seen (a team seen first in them is
    # averaged over those, not over updates before it was there)
    pending_seen: tuple[tuple[str, int], ...] = ()
    gpu_seconds: tuple[tuple[str, float], ...] = ()  # GPU-time integrated over the session
    started: float | None = None
    last: float | None = None
    limit: int = HISTORY_POINTS

    def values(self, team: str, name: str) -> tuple[float, ...]:
        for t, per_series in self.series:
            if t == team:
                return per_series[SERIES.index(name)]
        return ()

    def start(self, team: str) -> int:
        """The index among the session's `points` of the team's first point (0: there from the
        start; `points` for a team never seen)."""
        return self.points - len(self.values(team, SERIES[0]))

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
        seen = dict(self.pending_seen)
        for r in rows:
            before = sums.get(r.team, (0.0,) * len(SERIES))
            sums[r.team] = tuple(b + _value(r, n) for b, n in zip(before, SERIES, strict=True))
            seen[r.team] = seen.get(r.team, 0) + 1
        count = self.pending_count + 1
        series = dict(self.series)
        step = self.step
        if count >= step:
            for team in set(series) | set(sums):
                old = series.get(team) or tuple(() for _ in SERIES)
                # a team there before and not now counts as nothing now (a tenant whose last
                # process ended), one new in this point over the updates it was seen in
                n = count if team in series else seen[team]
                mean = tuple(v / n for v in sums.get(team, (0.0,) * len(SERIES)))
                series[team] = tuple((*s, m) for s, m in zip(old, mean, strict=True))
            sums, seen, count = {}, {}, 0
            full = self.points_of(series)
            if full >= self.limit:
                series = {t: tuple(_halve(s, full - len(per[0])) for s in per) for t, per in series.items()}
                step *= 2
        return replace(
            self,
            series=tuple(sorted(series.items())),
            step=step,
            pending=tuple(sorted(sums.items())),
            pending_count=count,
            pending_seen=tuple(sorted(seen.items())),
            gpu_seconds=tuple(sorted(seconds.items())),
            started=self.started if self.started is not None else now,
            last=now,
        )

    @staticmethod
    def points_of(series: dict[str, tuple[tuple[float, ...], ...]]) -> int:
        return max((len(per[0]) for per in series.values()), default=0)


def _halve(values: tuple[float, ...], start: int = 0) -> tuple[float, ...]:
    """`values`, whose first point is the session's `start`th, on half as many points: pairs of
    the session's points (0 and 1, 2 and 3, ...) averaged, so that a late team's points stay
    beside the others' of the same time; a point whose pair is not in `values` stays alone."""
    pairs: list[float] = []
    i = 0
    if start % 2:
        pairs.append(values[0])
        i = 1
    pairs += [(values[k] + values[k + 1]) / 2 for k in range(i, len(values) - 1, 2)]
    if (len(values) - i) % 2:
        pairs.append(values[-1])
    return tuple(pairs)
