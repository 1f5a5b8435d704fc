"""A team seen first after the session began (a node of a new owner answering late, a new
tenant's first process) has no history before it appeared: its series starts there, not with
zeros that read as an idle, empty team (views.tenant_history.TenantHistory), and it stays beside
the other teams' points of the same time when the session is halved to fit."""

from __future__ import annotations

from gpuops.tui import render
from gpuops.tui.screens.tenants import TREND
from gpuops.views.tenant_history import TenantHistory
from gpuops.views.tenants import TenantRow


def _rows(update: int, appears: int) -> list[TenantRow]:
    """Update `update`'s rows: `steady` all along; `late` from update `appears` on; `twin`, there
    from the start, owning and using nothing until then and then what `late` does."""
    rows = [TenantRow(team="steady", owned=4, used=3.0, gpu_time=2.0, share=0.5)]
    now = update >= appears
    twin = TenantRow(
        team="twin", owned=2 if now else 0, used=1.5 if now else 0.0, gpu_time=2.0 if now else 0.0
    )
    rows.append(twin)
    if now:
        rows.append(TenantRow(team="late", owned=2, used=1.5, gpu_time=2.0, share=0.5))
    return rows


def _session(updates: int, appears: int, limit: int = 720) -> TenantHistory:
    history = TenantHistory(limit=limit)
    for update in range(updates):
        history = history.record(1000.0 + 10 * update, _rows(update, appears))
    return history


def test_a_late_team_s_series_starts_where_it_appeared() -> None:
    history = _session(10, appears=3)
    assert history.points == 10
    assert history.values("late", "owned") == (2.0,) * 7  # not (0, 0, 0, 2, ...)
    assert history.values("late", "used") == (1.5,) * 7
    assert min(history.values("late", "owned")) == 2.0  # the panel's min: never owned nothing
    assert history.start("late") == 3 and history.start("steady") == 0
    assert history.start("nobody") == 10 and history.values("nobody", "owned") == ()
    # The tenants screen's sparkline of it: blank where it was not there, not the lowest bar.
    assert render.sparkline(history.values("late", "share"), TREND, 100.0) == " " * (TREND - 7) + "▅" * 7
    assert render.sparkline(history.values("twin", "share"), TREND, 100.0) == " " * (TREND - 10) + "▁" * 10


def test_a_late_team_stays_aligned_when_the_session_is_halved() -> None:
    # 8 points at most: halved at 8, 8 again (16 updates), ...; appearing at an odd point, its
    # first point's pair in the session is a point before it appeared.
    for appears in (3, 5, 6, 11):
        history = _session(40, appears=appears, limit=8)
        assert history.step > 1
        late = history.values("late", "owned")
        twin = history.values("twin", "owned")
        assert late and all(v == 2.0 for v in late), (appears, late)  # never averaged with zeros
        # it starts at the first point where its twin owned anything, and ends with the others
        first = next(i for i, v in enumerate(twin) if v > 0)
        assert history.start("late") == first, (appears, twin, late)
        assert len(late) == history.points - first
        assert twin[first + 1 :] == late[1:]
    assert history.session_share("late") == history.session_share("twin")


def test_a_late_team_s_sparkline_takes_its_share_of_a_long_session() -> None:
    """Past as many points as the sparkline is wide, the session is averaged into the width; a
    late team's shorter series takes the columns of its time (blank before), not all of them."""
    history = _session(60, appears=30)
    assert history.points == 60 and len(history.values("late", "share")) == 30
    points = history.points
    late = render.sparkline(history.values("late", "used"), TREND, 2.0, points)
    twin = render.sparkline(history.values("twin", "used"), TREND, 2.0, points)
    bar = render.sparkline((1.5,), 1, 2.0)
    assert late == " " * (TREND - 11) + bar * 11  # 30 of 60 points: half of 22 columns
    assert twin == "▁" * 11 + bar * 11  # there all along, using nothing in its first half
    # Without the session's length, the late team's 30 points were stretched over all 22.
    assert render.sparkline(history.values("late", "used"), TREND, 2.0) == bar * TREND
