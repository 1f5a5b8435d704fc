"""`:tenants`: per team, now and over the session — what it owns, is guaranteed, uses, borrows, leaves idle,
its share of the fleet's GPU-time and memory — sorted by waste, the silo capacity worth pooling."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from gpuops.tui import render, theme
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.table import Cell, Column, LiveTable, Row
from gpuops.tui.widgets import flow_parts
from gpuops.views.feed import FLEET_WIDE, FleetState
from gpuops.views.tenant_history import TenantHistory
from gpuops.views.tenants import TenantRow, sort_tenants, team_label

COLUMNS = (
    Column("Team", "team"),
    Column("Owned", "owned", "right"),
    Column("Guaranteed", "guaranteed", "right"),
    Column("Used", "used", "right"),
    Column("Borrowed", "borrowed", "right"),
    Column("Idle", "idle", "right"),
    Column("Held", "held", "right"),
    Column("Waste", "waste", "right"),
    Column("GPU-time", "gpu-time", "right"),
    Column("Share", "share", "right"),
    Column("Session", "session", "right"),
    Column("Memory", "memory", "right"),
    Column("Procs", "procs", "right"),
    Column("Share over the session", "share-trend"),
    Column("Idle over the session", "idle-trend"),
)
TREND = 22

# Sparklines of the detail panel: series, title, how to print a value, fixed top (None: the max)
PANEL: tuple[tuple[str, str, str, float | None], ...] = (
    ("share", "GPU-time share", "percent", 100.0),
    ("memory", "memory held", "bytes", None),
    ("owned", "GPUs owned", "gpus", None),  # a pool's row: its GPUs
    ("used", "GPUs used", "gpus", None),
    ("idle", "idle capacity", "gpus", None),
    ("waste", "waste", "gpus", None),
)

POOL_SERIES = ("owned", "idle", "waste")


def _fmt(kind: str, value: float) -> str:
    if kind == "percent":
        return f"{value:.0f}%"
    if kind == "bytes":
        return render.size(int(value))
    return render.gpus(value)


class TenantsScreen(ViewScreen):
    VIEW = "tenants"
    TITLE = "tenants (teams)"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("enter", "Enter", "the team's processes across the fleet (:processes of the team)"),
        Key("g", "g", "the team's GPUs in the fleet grid (filtered by the team)", "team_grid"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "W": ("waste", "waste: owned capacity not doing work (the default)"),
        "N": ("name", "team name"),
        "O": ("owned", "GPUs owned"),
        "U": ("used", "GPUs used"),
        "I": ("idle", "idle capacity of its silo (a pool: of the pool)"),
        "H": ("held", "held idle: idle capacity holding processes or memory"),
        "B": ("borrowed", "GPUs borrowed: used outside its silo beyond its pool guarantees"),
        "S": ("share", "share of the fleet's GPU-time now"),
        "M": ("memory", "memory held"),
    }
    DEFAULT_SORT = "waste"
    FILTER_HINT = "matches team names; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("Team", "a team of fleet.yaml (or an owner or tenant seen); 'pool NAME': a pool's row"),
        ("Owned", "GPUs it bought, in its silo or in pools; '8 (2?)': 2 on nodes without current data"),
        ("Guaranteed", "its silo GPUs plus its pool guarantees (share x the pool's GPUs)"),
        ("Used", "GPU-equivalents holding its processes, on any team's GPUs, busy or not"),
        ("Borrowed", "of Used, what is outside its silo beyond its pool guarantees"),
        (
            "Idle",
            "its silo's (a pool's row: the pool's) GPU-equivalents not busy, free MIG capacity included",
        ),
        (
            "Held",
            "of Idle, what holds processes or memory at under 5% utilization: looks taken, does nothing",
        ),
        (
            "Waste",
            "its silo's capacity minus the GPU-time delivered on it, by anyone: what pooling would free",
        ),
        ("GPU-time", "utilization-weighted GPU-equivalents it uses now (a GPU at 50% is 0.5)"),
        ("Share", "its part of the fleet's GPU-time now"),
        ("Session", "its part of the fleet's GPU-time integrated since the view started"),
        ("Memory", "GPU memory its processes hold"),
        ("Procs", "its processes"),
        ("Share over the session", "sparkline of Share, one point per refresh (oldest left)"),
        ("Idle over the session", "sparkline of Idle, on the scale of its silo"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)

    def __init__(self) -> None:
        super().__init__()
        self.selected: str | None = None

    DEFAULT_CSS = f"""
    #tenants-notice {{ height: auto; max-height: 2; padding: 0 1; display: none; color: {theme.NOTICE}; }}
    #tenants-notice.shown {{ display: block; }}
    """

    def compose_body(self) -> ComposeResult:
        yield Static(id="tenants-notice")
        yield LiveTable(COLUMNS, id="tenants-table")
        yield Static(id="tenant-panel")

    def main_widget(self) -> Widget | None:
        return self.query_one(LiveTable)

    def draw(self, state: FleetState) -> None:
        rows = sort_tenants(state.tenants, self.sort, self.reverse, self.filter)
        history = state.history
        out: list[Row] = [(r.team, self._cells(r, history)) for r in rows]
        self.query_one(LiveTable).set_rows(out)
        if out and self.selected not in {k for k, _ in out}:
            self.selected = out[0][0]
        self._panel(state)
        self._notice(state)

    def _notice(self, state: FleetState) -> None:
        """The figures above depend on attribution: say when it warned, once, pointing at :events
        for the list (which has each distinct warning once)."""
        notice = self.query_one("#tenants-notice", Static)
        warnings = state.warnings
        notice.set_class(bool(warnings), "shown")
        if not warnings:
            return
        latest = warnings[-1]  # the newest distinct one: the list is in the order first seen
        text = Text()
        text.append(f"⚠ {render.count(len(warnings), 'attribution warning')}", style="bold")
        text.append(" (:events lists them) · latest: ", style="dim")
        text.append(latest.message if latest.node == FLEET_WIDE else f"{latest.node}: {latest.message}")
        notice.update(text)

    @staticmethod
    def _cells(r: TenantRow, history: TenantHistory) -> tuple[Cell, ...]:
        def num(value: float, style: str = "") -> Text:
            return Text(render.gpus(value), style=style if value >= 0.05 else "")

        idle_style = f"bold {theme.IDLE}"
        name = team_label(r.team)
        return (
            Text(name, style=f"bold {theme.POOL}" if r.pool is not None else "bold"),
            str(r.owned) + (f" ({r.unknown}?)" if r.unknown else ""),
            num(r.guaranteed),
            num(r.used),
            num(r.borrowed, theme.BORROWED),
            num(r.idle, idle_style),
            num(r.held, render.HELD_TEXT),
            num(r.waste, idle_style),
            render.gpus(r.gpu_time),
            f"{100 * r.share:.0f}%",
            f"{100 * history.session_share(r.team):.0f}%",
            render.size(r.memory_used),
            str(r.processes),
            Text(
                render.sparkline(history.values(r.team, "share"), TREND, 100.0, history.points),
                style=theme.USED,
            ),
            Text(
                render.sparkline(
                    history.values(r.team, "idle"), TREND, max(1.0, float(r.silo)), history.points
                ),
                style=theme.IDLE,
            ),
        )

    def _panel(self, state: FleetState) -> None:
        panel = self.query_one("#tenant-panel", Static)
        team = self.selected
        row = next((r for r in state.tenants if r.team == team), None)
        if row is None:
            panel.update(Text("no team matches", style="dim"))
            return
        history = state.history
        if row.pool is not None:
            first = Text()
            first.append(row.team, style=f"bold {theme.POOL}")
            first.append(f"  {render.count(row.owned, 'GPU')} ({render.size(row.memory_owned)})")
            words = [
                f"guarantees {render.gpus(row.guaranteed)} to teams",
                f"idle {render.gpus(row.idle)}",
                f"waste {render.gpus(row.waste)}",
                "its teams' use is on their rows",
                "Enter: the Pool screen",
            ]
        else:
            pooled = f", {row.pooled} of them in pools" if row.pooled else ""
            first = Text()
            first.append(row.team, style=f"bold {theme.TEAM}")
            first.append(f"  owns {row.owned} GPUs ({render.size(row.memory_owned)}{pooled})")
            words = [
                f"guaranteed {render.gpus(row.guaranteed)}",
                f"uses {render.gpus(row.used)}",
                f"borrows {render.gpus(row.borrowed)}",
                f"lends {render.gpus(row.lent)}",
                f"idle {render.gpus(row.idle)}"
                + (f" ({render.gpus(row.held)} held)" if row.held >= 0.05 else ""),
                f"waste {render.gpus(row.waste)}",
                f"{row.processes} process{'es' if row.processes != 1 else ''}",
            ]
        # On a narrow terminal the line breaks between its parts, never inside one ('idle⏎8').
        head = flow_parts([first, *map(Text, words)], max(40, self.size.width - 4))
        lines = [head]
        full = self.size.width - 4 >= 16 + 20 + 40
        width = max(10, self.size.width - 4 - 16 - (40 if full else 13))
        points = history.points
        # A pool uses nothing itself (its teams do, on their rows): its capacity only.
        panel_rows = [p for p in PANEL if row.pool is None or p[0] in POOL_SERIES]
        for series, title, kind, top in panel_rows:
            values = history.values(row.team, series)
            # Figures on the scale of what the team owns: a flat line is not always a full bar.
            scale = float(row.memory_owned) if series == "memory" else float(row.owned)
            peak = top if top is not None else max(scale, max(values, default=0.0))
            now = values[-1] if values else 0.0
            low, high = min(values, default=0.0), max(values, default=0.0)
            line = Text(f"{title:>15} ", style="bold")
            line.append(
                render.sparkline(values, width, peak if peak > 0 else None, points), style=theme.TREND
            )
            line.append(f"  now {_fmt(kind, now):>7}")
            if full:
                line.append(f"  min {_fmt(kind, low):>7}  max {_fmt(kind, high):>7}", style="dim")
            lines.append(line)
        span = render.age((history.last or 0) - (history.started or 0)) if points > 1 else "now"
        lines.append(Text(f"{'':>15} over the session: {span}, {points} points", style="dim"))
        panel.update(Text("\n").join(lines))

    @on(LiveTable.RowHighlighted)
    def _highlighted(self, event: LiveTable.RowHighlighted) -> None:
        if event.key != self.selected:
            self.selected = event.key
            if self.state is not None:
                self._panel(self.state)

    @on(LiveTable.RowSelected)
    def _selected(self, event: LiveTable.RowSelected) -> None:
        row = next((r for r in self.state.tenants if r.team == event.key), None) if self.state else None
        if row is not None and row.pool is not None:
            self.gapp.go("pool")
            return
        self.gapp.team_processes(event.key)

    def action_team_grid(self) -> None:
        if self.selected is not None:
            self.gapp.go("gpus", filter_text=self.selected)
