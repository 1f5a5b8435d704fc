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
