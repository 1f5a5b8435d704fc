"""`:pool`: the teams' silos and a shared pool side by side, and changing the pool: mark GPUs and
move them into the pool or back to their owners' silos, or ask the planner; review the proposal
and its plan (what `gpuops plan` prints); apply it after confirmation, then see the new layout.

The figures come from the nodes' history over a window (1h, 24h, 7d), not from the live feed;
reading histories and plans takes seconds, so every step runs in a worker and the screen says
what it is waiting for. The logic lives in `gpuops.views.pool`; this module only draws and
dispatches keys. Moving and applying are refused under --readonly; the planner's proposal and
its plan can still be looked at.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from gpuops.core.model import NotAvailable
from gpuops.tui import render, theme
from gpuops.tui.changes import APPLY, MOVE_BACK, MOVE_IN, POOL_CHANGES
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.screens.confirm import ConfirmScreen
from gpuops.tui.table import GAP, Cell, Column, LiveTable, Row, column_widths, table_width
from gpuops.tui.widgets import whole_parts
from gpuops.views.common import short_model
from gpuops.views.feed import FleetState
from gpuops.views.pool import (
    DEFAULT_WINDOW,
    WINDOWS,
    Applied,
    Draft,
    GpuKey,
    PoolError,
    PoolGpu,
    PoolSource,
    PoolView,
    Review,
    TeamSide,
    known_gpus,
    parse_key,
    team_order,
    total_side,
)
from gpuops.views.tenants import team_label

log = logging.getLogger("gpuops.tui")

TEAM_COLUMNS = (
    Column("Team", "team"),
    Column("Silo GPUs", "silo", "right"),
    Column("Silo used", "silo-used", "right"),
    Column("Silo idle", "silo-idle", "right"),
    Column("│", "sep"),
    Column("Pool GPUs", "pool", "right"),
    Column("Guaranteed", "guaranteed", "right"),
    Column("Pool used", "pool-used", "right"),
    Column("Pool idle", "pool-idle", "right"),
    Column("│", "sep2"),
    Column("Borrowed", "borrowed", "right"),
    Column("Use p95", "p95", "right"),
)
# The team table on a narrow terminal (80 columns): the Used columns are left out (a silo's used
# is its GPUs minus its idle), the long labels shortened with a '.'; a change is 'a→b'.
NARROW_TEAM_COLUMNS = (
    Column("Team", "team"),
    Column("Silo", "silo", "right"),
    Column("idle", "silo-idle", "right"),
    Column("│", "sep"),
    Column("Pool", "pool", "right"),
    Column("Guar.", "guaranteed", "right"),
    Column("idle", "pool-idle", "right"),
    Column("│", "sep2"),
    Column("Borr.", "borrowed", "right"),
    Column("p95", "p95", "right"),
)
FULL_FIELDS = (
    "silo_gpus", "silo_used", "silo_idle", "|", "pool_gpus", "guaranteed", "pool_used", "pool_idle", "|",
    "borrowed", "p95",
)  # fmt: skip
NARROW_FIELDS = (
    "silo_gpus",
    "silo_idle",
    "|",
    "pool_gpus",
    "guaranteed",
    "pool_idle",
    "|",
    "borrowed",
    "p95",
)
FIELD_STYLES = {
    "silo_idle": theme.IDLE,
    "pool_gpus": theme.POOL,
    "guaranteed": theme.POOL,
    "pool_idle": theme.IDLE,
    "borrowed": theme.BORROWED,
}
GPU_COLUMNS = (
    Column(" ", "mark"),
    Column("GPU", "gpu"),
    Column("Model", "model"),
    Column("Owner", "owner"),
    Column("In", "in"),
    Column("p95 busy", "p95", "right"),
    Column("Mean busy", "mean", "right"),
    Column("Now", "now", "right"),
    Column("Used by (window)", "users"),
    Column("Live carving", "carving"),
)
# The GPU list on a narrow terminal: model, owner and mean busy left out (the GPU's own screen
# and the team table have them); who used it and its carving cut to what the width leaves.
NARROW_GPU_KEYS = ("mark", "gpu", "in", "p95", "now", "users", "carving")
NARROW_USERS = 18  # "vision 95%, chat 3%" and the like; longer lists end in an ellipsis
MIN_CARVING = 20  # the carving cells kept before the list drops to its narrow columns
MARK = "●"
CHANGED = f"bold {theme.MARKED}"
POOL_STYLE = theme.POOL
IDLE_STYLE = theme.IDLE
NO_FLEET = "the Pool screen needs a fleet.yaml: gpuops tui -f fleet.yaml (or gpuops demo)"
MAX_MISSING = 3
ALL_TEAMS = "(all teams)"  # the key of the totals row (no team name has parentheses)

# Actions that change the fleet (app.DESTRUCTIVE_ACTIONS lists them: --readonly refuses them).
CHANGES = POOL_CHANGES


def _fitted_gpu_table(rows: list[Row], room: int) -> tuple[tuple[Column, ...], list[Row]]:
    """The GPU list's columns for `room` cells: every column while cutting the free text at the end
    (who used it, the carving) makes them fit, else the narrow set. A move under review widens the
    In column by 14 cells; cutting text first keeps the columns from jumping under the operator."""
    if not room or table_width(GPU_COLUMNS, rows) <= room:
        return GPU_COLUMNS, rows
    cut = [dataclasses.replace(c, max_width=NARROW_USERS) if c.key == "users" else c for c in GPU_COLUMNS]
    widths = column_widths(cut, rows)
    left = room - sum(widths[:-1]) - GAP * len(cut) - 1
    if left >= min(widths[-1], MIN_CARVING):
        cut[-1] = dataclasses.replace(cut[-1], max_width=left)
        return tuple(cut), rows
    return _narrow_gpu_table(rows, room)


def _narrow_gpu_table(rows: list[Row], room: int) -> tuple[tuple[Column, ...], list[Row]]:
    """The GPU list's narrow columns and rows: the last column (the carving) gets what the others
    leave of `room`, at least its label's width (the table scrolls sideways only then)."""
    keep = [i for i, c in enumerate(GPU_COLUMNS) if c.key in NARROW_GPU_KEYS]
    short = {"p95": ("p95", None), "users": ("Used by", NARROW_USERS)}
    narrow = [
        dataclasses.replace(c, label=short[c.key][0], max_width=short[c.key][1]) if c.key in short else c
        for c in (GPU_COLUMNS[i] for i in keep)
    ]
    picked: list[Row] = [(key, tuple(cells[i] for i in keep)) for key, cells in rows]
    widths = column_widths(narrow, picked)
    left = room - sum(widths[:-1]) - GAP * len(narrow) - 1
    narrow[-1] = dataclasses.replace(narrow[-1], max_width=max(len(narrow[-1].label), left))
    return tuple(narrow), picked


def _gpus(value: float) -> str:
    return render.gpus(value)


class PoolScreen(ViewScreen):
    VIEW = "pool"
    TITLE = "pool (silos and the shared pool)"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("space", "Space", "mark or unmark the GPU under the cursor", "mark"),
        Key("m", "m", "move the marked GPUs (else the one under the cursor) into the pool", MOVE_IN),
        Key(
            "b",
            "b",
            "move the marked GPUs (else the one under the cursor) back to their silos",
            MOVE_BACK,
        ),
        Key("p", "p", "ask the planner: idle silo GPUs into the pool, guarantees from evidence", "propose"),
        Key("a", "a", "apply the change under review (asks first; fleet.yaml gets a backup)", APPLY),
        Key("c", "c", "clear: unmark every GPU and drop the change under review", "clear"),
        Key("w", "w", "evidence window: 1h, 24h, 7d (reads the nodes' history again)", "window"),
        Key("o", "o", "the next pool of fleet.yaml", "next_pool"),
        Key("r", "r", "read fleet.yaml, the nodes' history and live state again", "reload"),
        Key("tab", "Tab", "move between the GPU list and the review panel (↑ ↓ scroll it)", "switch_focus"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "N": ("node", "node and GPU index (the default)"),
        "B": ("busy", "GPU-time p95 over the window"),
        "O": ("owner", "owner"),
        "I": ("in", "silo or pool"),
    }
    DEFAULT_SORT = "node"
    FILTER_HINT = "matches GPU, model, owner, silo/pool and users; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("Team", "a team of fleet.yaml; 'all teams': the totals"),
        ("Silo GPUs", "GPUs in its silo (→ after the change under review)"),
        ("Silo used", "mean GPU-equivalents in use on its silo over the window"),
        ("Silo idle", "silo GPUs minus Silo used"),
        ("Pool GPUs", "the pool's GPUs it bought"),
        ("Guaranteed", "its guarantee in the pool, in GPUs"),
        ("Pool used", "mean GPU-equivalents it used in the pool over the window"),
        ("Pool idle", "the pool's capacity it bought minus what is used there"),
        ("Borrowed", "use outside its silo beyond its pool guarantee (mean over the window)"),
        ("Use p95", "the 95th percentile of its GPU-time over the window"),
        (
            "Silo, idle, Pool, Guar., Borr., p95",
            "the same on a narrow terminal (Silo and Pool: their GPUs; the Used columns left out)",
        ),
        ("GPU", "node:index"),
        ("Model", "the GPU's model, short"),
        ("Owner", "the team that bought it"),
        ("In", "silo or pool NAME (→ after the change under review)"),
        ("p95 busy", "95th percentile of the GPU's utilization-weighted use over the window"),
        ("Mean busy", "its mean utilization-weighted use over the window"),
        ("Now", "its utilization now (the live feed)"),
        ("Used by (window)", "the teams that used it, with their share of its time"),
        ("Live carving", "its MIG layout or limiter lines as its node reports them"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)
    DEFAULT_CSS = """
    #pool-head { height: auto; max-height: 9; padding: 0 1; }
    #pool-teams { height: auto; max-height: 14; border-bottom: solid $panel; }
    #pool-gpus { height: 1fr; min-height: 8; }
    #pool-review { height: 1fr; display: none; border-top: solid $accent; padding: 0 1; }
    #pool-review.open { display: block; }
    PoolScreen.short.reviewing #pool-teams { max-height: 10; }
    PoolScreen.short.reviewing #pool-gpus { height: 4; min-height: 4; }
    PoolScreen.short.reviewing #pool-review { min-height: 5; }
    """
    # Under this many lines, while the review panel is open, the GPU list gives its place to it
    # (three rows stay, to mark more): at 24 lines the panel (the plan, an apply's result) gets
    # six, and the teams' table (before → after) stays.
    SHORT = 40

    def __init__(self) -> None:
        super().__init__()
        self.window = DEFAULT_WINDOW
        self.pool_name: str | None = None
        self.view: PoolView | None = None
        self.review: Review | None = None
        self.applied: Applied | None = None
        self.marked: set[str] = set()
        self.job = ""  # what the worker is doing, "" when idle
        self.error = ""  # the last step's failure, one line
        self.jobs = 0  # steps finished (tests wait on it)
        # While a step reads the nodes' history: (nodes read, nodes, monotonic start)
        self.reading: tuple[int, int, float] | None = None
        self._progress_drawn = 0.0
        self._token = 0

    # ---- structure -----------------------------------------------------------------------------

    @property
    def source(self) -> PoolSource | None:
        return self.gapp.pool_source

    def compose_body(self) -> ComposeResult:
        yield Static(id="pool-head")
        teams = LiveTable(TEAM_COLUMNS, id="pool-teams", zebra=False)
        teams.can_focus = False
        yield teams
        yield LiveTable(GPU_COLUMNS, id="pool-gpus")
        with VerticalScroll(id="pool-review"):
            yield Static(id="pool-review-text")

    def main_widget(self) -> Widget | None:
        return self.query_one("#pool-gpus", LiveTable)

    @property
    def draft(self) -> Draft | None:
        return self.review.draft if self.review is not None else None

    def on_resize(self) -> None:
        self.set_class(self.size.height < self.SHORT, "short")
        if self.view is not None:
            self.call_after_refresh(self._teams)  # their columns are chosen for the width
            self.call_after_refresh(self._gpu_rows)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self.view is None and not self.job and not self.error:
            self.action_reload()
        else:
            self.draw_pool()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The pool's own changes stay bound under --readonly, so that pressing them says why not.
        if action in CHANGES:
            return True
        return super().check_action(action, parameters)

    # ---- drawing ---------------------------------------------------------------------------------

    def draw(self, state: FleetState) -> None:
        self.draw_pool()

    def redraw(self) -> None:
        if self.state is not None:
            self.show(self.state)
        else:
            self.draw_pool()
            self.draw_bars()

    def draw_pool(self) -> None:
        if not self.is_mounted:
            return
        self._head()
        self._teams()
        self._gpu_rows()
        self._review()
        self.draw_status()

    def status_part(self) -> Text | None:
        """What the operator must not lose on a narrow terminal: the step under way, the marked
        GPUs, the change under review or the last apply's outcome, each with its next keys."""
        if self.source is None:
            return None
        text = Text()

        def part(words: str, style: str = "", keys: str = "") -> None:
            if text.cell_len:
                text.append(" │ ", style="dim")
            text.append(words, style=style)
            if keys:
                text.append(f" · {keys}", style="dim")

        if self.job:
            reading = self.reading
            count = f" {reading[0]}/{reading[1]}" if reading is not None else ""
            part(f"⟳ {self.job.split(' ', 1)[0].rstrip(':')}…{count}", f"bold {theme.PENDING}")
        if self.marked:
            part(
                f"{MARK} {len(self.marked)} marked",
                f"bold {theme.MARKED}",
                "" if self.job else "m in · b back",
            )
        draft = self.draft
        if draft is not None and self.review is not None:
            moved = [f"{len(draft.joined)} in"] if draft.joined else []
            moved += [f"{len(draft.left)} back"] if draft.left else []
            what = "proposal" if draft.kind == "planner" else "change"
            pending = draft.changed or bool(self.review.plan.changes)
            keys = "" if self.job else ("a apply · c drop" if pending else "c drop")
            part(f"{what}: {', '.join(moved) or ('no moves' if pending else 'nothing to do')}", CHANGED, keys)
        elif self.applied is not None and not self.job:
            bad = sum(1 for r in self.applied.results if not r.ok)
            if self.applied.ok:
                part("applied ✓", f"bold {theme.OK}", "result below")
            else:
                part(f"applied: {bad} node(s) not done", f"bold {theme.ERROR}", "result below")
        if not text.cell_len and self.view is not None:
            part("space mark", "dim", "p propose")
        return text

    def _head(self) -> None:
        text = Text()
        view = self.view
        if self.source is None:
            text.append(NO_FLEET, style=f"bold {theme.WARNING}")
            self.query_one("#pool-head", Static).update(text)
            return
        name = view.pool if view is not None else (self.pool_name or "…")
        width = max(40, self.size.width - 2)
        if view is not None:
            # The pool's line: as many whole parts as fit the width, in order (never wrapped).
            parts = [Text(f"pool {name}", style=f"bold {POOL_STYLE}")]
            entry = view.fleet.pools.get(view.pool)
            if entry is None:
                parts.append(Text("not in fleet.yaml yet (m or p makes it)", style="dim"))
            else:
                parts.append(Text(render.count(view.members, "GPU")))
                parts.append(Text(f"{entry.policy} · {entry.carving} carving"))
                parts.append(Text("borrowing" if entry.borrowing else "no borrowing"))
                if entry.guarantees:
                    shares = ", ".join(f"{t} {g.share:g}%" for t, g in entry.guarantees.items())
                    full = Text(f"guarantees {shares}")
                    used = sum(p.cell_len + 3 for p in parts)
                    # Too long for the line: how many, the Guaranteed column has each.
                    parts.append(
                        full
                        if used + full.cell_len <= width
                        else Text(f"guarantees to {render.count(len(entry.guarantees), 'team')}")
                    )
            others = [p for p in view.pools if p != view.pool]
            if others:
                parts.append(Text(f"other pools: {', '.join(others)} (o)", style="dim"))
            text.append_text(whole_parts(parts, width))
            nodes = len(view.fleet.nodes)
            age = max(0.0, time.time() - view.read_at)
            evidence = (
                f"evidence: {view.window.text} ({view.window.resolution} buckets) from "
                f"{nodes - len(view.missing)} of {render.count(nodes, 'node')}, read {render.age(age)} ago"
            )
            text.append("\n" + evidence)
            # The keys in full where they fit on the line, short where not (an 80-column terminal).
            room = self.size.width - 2 - len(evidence)
            hint = next((h for h in ("  w window · r read again", "  w · r") if len(h) <= room), "")
            text.append(hint, style="dim")
        else:
            text.append(f"pool {name}", style=f"bold {POOL_STYLE}")
            text.append(f"\nevidence: {self.window}", style="dim")
        if self.job:
            text.append(f"\n⟳ {self.job}…", style=f"bold {theme.PENDING}")
            if self.reading is not None:
                text.append("\n")
                text.append_text(self._progress_line(width))
        if self.error:
            text.append(f"\n✖ {self.error}", style=f"bold {theme.ERROR}")
        if view is not None and view.missing:
            items = sorted(view.missing.items())
            for node, reason in items[:MAX_MISSING]:
                text.append(f"\n✖ {node}: {reason}", style=theme.ERROR)
            if len(items) > MAX_MISSING:
                text.append(
                    f"\n  … and {len(items) - MAX_MISSING} more nodes without data", style=theme.ERROR
                )
        if view is not None and view.evidence.incomplete:
            # Unreadable history is unknown time: the figures above leave it out, and say so.
            lines = view.evidence.incomplete_lines()
            for line in lines[:-1][:MAX_MISSING]:
                text.append(f"\n⚠ {line}", style=f"bold {theme.WARNING}")
            if len(lines) - 1 > MAX_MISSING:
                text.append(f"\n  … and {len(lines) - 1 - MAX_MISSING} more nodes", style=theme.WARNING)
            text.append(f"\n  {lines[-1]}", style=theme.WARNING)
        if self.gapp.readonly:
            text.append(
                "\nREADONLY: moving GPUs and applying are disabled; p still shows the planner's proposal"
            )
        self.query_one("#pool-head", Static).update(text)

    def _progress_line(self, width: int) -> Text:
        """'  history ━━━━━━━━────────── 3 of 8 nodes · 2s': the nodes' history read so far."""
        assert self.reading is not None
        count, total, started = self.reading
        figures = f" {count} of {render.count(total, 'node')} · {render.age(time.monotonic() - started)}"
        bar = max(10, min(40, width - 10 - len(figures)))
        full = bar * count // total if total else bar
        text = Text("  history ", style="dim")
        text.append("━" * full, style=f"bold {theme.PENDING}")
        text.append("─" * (bar - full), style="dim")
        text.append(figures)
        return text

    def _history_read(self, count: int, total: int) -> None:
        """The PoolSource's progress while a load reads the nodes' history (on the app's loop)."""
        started = self.reading[2] if self.reading is not None and count else time.monotonic()
        self.reading = (count, total, started)
        now = time.monotonic()
        # Drawn at most ten times a second (200 nodes end within a few seconds), and at the end.
        if count in (0, total) or now - self._progress_drawn >= 0.1:
            self._progress_drawn = now
            if self.is_mounted:
                self._head()
                self.draw_status()

    def _teams(self) -> None:
        table = self.query_one("#pool-teams", LiveTable)
        view = self.view
        if view is None:
            table.set_rows([])
            return
        draft = self.draft
        before = {t.team: t for t in view.teams}
        after = {t.team: t for t in draft.teams} if draft is not None else {}
        names = sorted(set(before) | set(after), key=team_order)
        total_before = total_side(list(before.values()))
        total_after = total_side(list(after.values())) if draft is not None else None

        def rows_of(fields: tuple[str, ...], arrow: str) -> list[Row]:
            rows: list[Row] = []
            for team in names:
                cells = self._team_cells(team, before.get(team), after.get(team), fields, arrow)
                rows.append((team, cells))
            cells = self._team_cells("all teams", total_before, total_after, fields, arrow, bold=True)
            rows.append((ALL_TEAMS, cells))
            return rows

        # The full table where it fits the screen's width; else the narrow one (an 80-column
        # terminal would otherwise show the silo half only, the rest behind a scroll).
        rows = rows_of(FULL_FIELDS, " → ")
        room = table.size.width or self.size.width
        if room and table_width(TEAM_COLUMNS, rows) > room:
            table.columns = NARROW_TEAM_COLUMNS
            rows = rows_of(NARROW_FIELDS, "→")
        else:
            table.columns = TEAM_COLUMNS
        table.set_rows(rows)

    @staticmethod
    def _team_cells(
        team: str,
        before: TeamSide | None,
        after: TeamSide | None,
        fields: tuple[str, ...] = FULL_FIELDS,
        arrow: str = " → ",
        bold: bool = False,
    ) -> tuple[Cell, ...]:
        def cell(attr: str) -> Text:
            style = FIELD_STYLES.get(attr, "")
            old = getattr(before, attr) if before is not None else 0
            if after is None:
                value = float(old)
                return Text(_gpus(value), style=style if value >= 0.05 else "")
            new = getattr(after, attr)
            if _gpus(float(old)) == _gpus(float(new)):
                return Text(_gpus(float(new)), style=style if float(new) >= 0.05 else "")
            return Text(f"{_gpus(float(old))}{arrow}{_gpus(float(new))}", style=CHANGED)

        name = team_label(team)
        cells: list[Cell] = [Text(name, style="bold" if not bold else "bold italic")]
        for attr in fields:
            if attr == "|":
                cells.append(Text("│", style="dim"))
            elif attr == "p95" and bold:
                cells.append(Text(""))  # percentiles do not add up
            else:
                cells.append(cell(attr))
        return tuple(cells)

    def _sorted(self, gpus: tuple[PoolGpu, ...]) -> list[PoolGpu]:
        # By node name and GPU index, as the label says (fleet.yaml's order is not the node order).
        natural = sorted(gpus, key=lambda g: (g.node, g.index))
        where = self._where()
        keys: dict[str, Callable[[PoolGpu], object]] = {
            "busy": lambda g: -g.p95,
            "owner": lambda g: g.owner or "~",
            "in": lambda g: where.get(g.key) or "~",
        }
        key = keys.get(self.sort)
        out = sorted(natural, key=key) if key is not None else natural  # type: ignore[arg-type]
        return list(reversed(out)) if self.reverse else out

    def _where(self) -> dict[GpuKey, str | None]:
        draft = self.draft
        if draft is not None:
            return dict(draft.where)
        return {g.key: g.pool for g in self.view.gpus} if self.view is not None else {}

    def _gpu_rows(self) -> None:
        table = self.query_one("#pool-gpus", LiveTable)
        view = self.view
        if view is None:
            table.set_rows([])
            return
        draft = self.draft
        rows: list[Row] = []
        for g in self._sorted(view.gpus):
            new = draft.where.get(g.key, g.pool) if draft is not None else g.pool
            where = self._in_text(g.pool, new)
            users = ", ".join(f"{team_label(t)} {v:.0%}" for t, v in g.users[:3])
            if len(g.users) > 3:
                users += f" +{len(g.users) - 3}"
            if self.filter is not None:
                hay = f"{g.label} {g.name} {g.owner or ''} {where.plain} {users}"
                if not self.filter.matches(hay):
                    continue
            marked = g.label in self.marked
            rows.append(
                (
                    g.label,
                    (
                        Text(MARK if marked else " ", style=f"bold {theme.MARKED}"),
                        Text(g.label, style=f"bold {theme.MARKED}" if marked else "bold"),
                        short_model(g.name) + (" MIG" if g.mig else ""),
                        g.owner or "-",
                        where,
                        Text(f"{g.p95:.0%}", style=IDLE_STYLE if g.p95 < 0.1 else ""),
                        f"{g.mean:.0%}",
                        self._now(g),
                        Text(users or "nobody", style="" if users else "dim"),
                        Text(view.carving(g.key), style=theme.CARVING),
                    ),
                )
            )
        table.columns, rows = _fitted_gpu_table(rows, table.size.width or self.size.width)
        table.set_rows(rows)

    @staticmethod
    def _in_text(old: str | None, new: str | None) -> Text:
        def name(pool: str | None) -> str:
            return "silo" if pool is None else f"pool {pool}"

        if old == new:
            return Text(name(old), style=POOL_STYLE if old is not None else "dim")
        return Text(f"{name(old)} → {name(new)}", style=CHANGED)

    def _now(self, g: PoolGpu) -> str:
        state = self.state
        node = state.node(g.node) if state is not None else None
        if node is None or node.sample is None:
            return render.NA
        gpu = next((x for x in node.sample.gpus if x.info.index == g.index), None)
        util = gpu.sample.utilization_gpu_percent if gpu is not None and gpu.sample is not None else None
        if util is None or isinstance(util, NotAvailable):
            return render.NA
        return render.percent(float(util))

    def _review(self) -> None:
        panel = self.query_one("#pool-review", VerticalScroll)
        out = self.query_one("#pool-review-text", Static)
        review, applied = self.review, self.applied
        if review is None and applied is None:
            panel.set_class(False, "open")
            self.set_class(False, "reviewing")
            out.update("")
            return
        panel.set_class(True, "open")
        self.set_class(True, "reviewing")
        if review is not None:
            out.update(self._review_text(review))
        elif applied is not None:
            out.update(self._applied_text(applied))

    def _review_text(self, review: Review) -> Text:
        draft = review.draft
        view = draft.view
        text = Text()
        if draft.kind == "planner":
            text.append(f"The planner's proposal for pool {view.pool} over {view.window.text}", style="bold")
        else:
            moved = []
            if draft.joined:
                moved.append(f"{render.count(len(draft.joined), 'GPU')} into pool {view.pool}")
            if draft.left:
                moved.append(f"{render.count(len(draft.left), 'GPU')} back to their silos")
            text.append("Moved by hand: " + (" and ".join(moved) or "nothing"), style="bold")
        text.append("  (c drops it)\n", style="dim")
        for line in draft.explanation:
            text.append(f"  {line}\n")
        if not draft.changed:
            text.append(f"\nfleet.yaml does not change ({view.file}).\n", style="dim")
        else:
            how = (
                "edited in place, its comments kept"
                if review.preserved
                else "written anew (comments not kept)"
            )
            text.append(f"\nfleet.yaml: {view.file} — {how}\n", style="dim")
        text.append("Plan (what gpuops plan prints for the new fleet.yaml):\n", style="bold")
        for line in review.lines:
            text.append_text(Text.from_markup(line))
            text.append("\n")
        if self.gapp.readonly:
            text.append(
                "READONLY: applying is disabled (started with --readonly)", style=f"bold {theme.NOTICE}"
            )
        elif draft.changed or review.plan.changes:
            text.append(
                "a: apply — asks first, then writes fleet.yaml (backup kept) and applies the plan",
                style="bold",
            )
        return text

    @staticmethod
    def _applied_text(applied: Applied, after_quit: bool = False) -> Text:
        text = Text()
        view = applied.review.draft.view
        text.append("Applied", style=f"bold {theme.OK}" if applied.ok else f"bold {theme.ERROR}")
        if applied.backup is not None:
            text.append(f": {view.file} written; the previous file is {applied.backup}\n")
        else:
            text.append(": fleet.yaml unchanged\n")
        for line in applied.lines:
            text.append_text(Text.from_markup(line))
            text.append("\n")
        if not after_quit:
            then = (
                "; the window's figures follow once the nodes' history is read again"
                if applied.changed
                else ""
            )
            read = "fleet.yaml and the nodes' live state read again"
            text.append(f"The lists above show the new layout: {read}{then}.", style="dim")
        return text

    # ---- jobs ------------------------------------------------------------------------------------

    def _start(
        self,
        what: str,
        job: Callable[[], Awaitable[None]],
        *,
        restart: bool = False,
        after: Callable[[], None] | None = None,
    ) -> bool:
        """Run one step in a worker; one at a time (a new read may replace a read under way).
        `after` runs once the step has ended and been drawn, unless the app cut it off."""
        if self.source is None:
            self.flash(NO_FLEET)
            return False
        if self.job and not (restart and self.job.startswith("reading")):
            self.flash(f"busy: {self.job}; wait for it")
            return False
        self._token += 1
        token = self._token
        self.job, self.error = what, ""
        self.draw_pool()

        async def run() -> None:
            cancelled = False
            try:
                await job()
            except PoolError as exc:
                if token == self._token:
                    self.error = str(exc)
            except asyncio.CancelledError:
                cancelled = True
                raise
            except Exception as exc:  # a bug must not take the screen down: one line, logged
                log.exception("pool screen: %s", what)
                if token == self._token:
                    self.error = (
                        f"{what} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    )
            finally:
                if token == self._token:
                    self.job = ""
                    self.jobs += 1
                    self.redraw()
                if after is not None and not cancelled:
                    after()

        self.run_worker(run(), name=f"pool: {what}", group="pool", exclusive=True, exit_on_error=False)
        return True

    def _load(self, what: str, keep_histories: bool = False) -> None:
        source = self.source
        view = self.view
        window, pool = self.window, self.pool_name

        async def job() -> None:
            assert source is not None
            if keep_histories and view is not None and view.window.text == window:
                new = await source.load(window, pool, histories=view.histories, now=view.read_at)
            else:
                source.progress = self._history_read
                try:
                    new = await source.load(window, pool)
                finally:
                    self.reading = None
            self.view = new
            self.pool_name = new.pool

        self._start(what, job, restart=True)

    def _chosen(self) -> list[GpuKey]:
        """The marked GPUs, else the one under the cursor."""
        if self.marked:
            return sorted(parse_key(k) for k in self.marked)
        key = self.query_one("#pool-gpus", LiveTable).cursor_key
        return [parse_key(key)] if key else []

    def _move(self, action: str) -> None:
        if not self.gapp.allowed(action):
            return
        source, view = self.source, self.view
        if source is None or view is None:
            self.flash(NO_FLEET if source is None else "wait for the evidence to be read")
            return
        chosen = self._chosen()
        if not chosen:
            self.flash("no GPU to move: mark GPUs with space")
            return
        current = self.draft
        join = chosen if action == MOVE_IN else []
        leave = chosen if action == MOVE_BACK else []
        state = self.state or self.gapp.fleet_state
        known = known_gpus(state.snapshot) if state is not None else []
        what = "into the pool" if action == MOVE_IN else "back to the silos"

        async def job() -> None:
            assert source is not None and view is not None
            review = await source.moves(view, current, join, leave, known)
            self.review, self.applied = review, None
            self.marked.clear()

        self._start(f"planning {render.count(len(chosen), 'GPU')} {what}", job)

    # ---- keys ------------------------------------------------------------------------------------

    def action_mark(self) -> None:
        key = self.query_one("#pool-gpus", LiveTable).cursor_key
        if key is None:
            return
        if key in self.marked:
            self.marked.discard(key)
        else:
            self.marked.add(key)
        self.draw_pool()
        self.query_one("#pool-gpus", LiveTable).action_move(1)

    def action_move_into_pool(self) -> None:
        self._move(MOVE_IN)

    def action_move_back_to_silo(self) -> None:
        self._move(MOVE_BACK)

    def action_propose(self) -> None:
        source, view = self.source, self.view
        if source is None or view is None:
            self.flash(NO_FLEET if source is None else "wait for the evidence to be read")
            return
        current = self.draft

        async def job() -> None:
            assert source is not None and view is not None
            review = await source.planner(view, current)
            self.review, self.applied = review, None

        self._start(f"asking the planner for pool {view.pool}", job)

    def action_apply_pool_change(self) -> None:
        if not self.gapp.allowed(APPLY):
            return
        review = self.review
        if review is None:
            self.flash("nothing to apply: move GPUs (m, b) or ask the planner (p) first")
            return
        if self.job:
            self.flash(f"busy: {self.job}; wait for it")
            return
        draft = review.draft
        if not draft.changed and not review.plan.changes:
            self.flash("nothing to apply: fleet.yaml and the nodes already agree")
            return
        c = review.plan.counts()
        body = Text()
        if draft.changed:
            body.append(f"{draft.view.file} is rewritten first; the current file is kept as a backup\n")
            body.append(f"({draft.view.file.name}.bak-<time>).\n")
        if review.plan.changes:
            body.append(
                f"Then {c['add']} to add, {c['change']} to change, {c['remove']} to remove on "
                f"{render.count(c['gpus'], 'GPU')} of {render.count(c['nodes'], 'node')} are applied.\n"
            )
        if c["disruptive"]:
            body.append(
                f"{c['disruptive']} change(s) are disruptive: a node refuses them while processes are in "
                "the way (no --force here: use gpuops apply --force).\n",
                style=f"bold {theme.DANGER}",
            )
        failed = [n.name for n in review.plan.nodes if n.failed]
        if failed:
            body.append(f"Not planned (errors): {', '.join(failed[:5])}.\n", style=theme.ERROR)

        def answered(yes: bool | None) -> None:
            if yes:
                self._apply(review)
            else:
                self.flash("nothing applied")

        self.app.push_screen(
            ConfirmScreen(f"Apply the change to pool {draft.view.pool}?", body, "y: apply"), answered
        )

    def _apply(self, review: Review) -> None:
        source = self.source
        window, pool = self.window, review.draft.view.pool
        outcome: list[Applied] = []

        async def job() -> None:
            assert source is not None
            applied = await source.apply(review)
            outcome.append(applied)
            self.review, self.applied = None, applied
            self.marked.clear()
            view = review.draft.view
            # The new layout: fleet.yaml read again (the pools as written), the same evidence
            # (the history did not change), the nodes' live state read again.
            self.view = await source.load(window, pool, histories=view.histories, now=view.read_at)
            # The live views (:tenants, the grid's team chips) count pool GPUs and guarantees
            # from fleet.yaml too: from now on, from the file as written.
            self.gapp.feed.use_fleet(self.view.fleet)

        def ended() -> None:
            quitting = self.gapp.quit_after_apply
            self.gapp.apply_ended(self.apply_summary(pool))
            if outcome and outcome[0].changed and not quitting and not self.error:
                # The window's figures (p95, used by, borrowed) are still those of the history
                # read before the apply: read it again as r does, once this step has ended, and
                # keep the apply's result on show meanwhile.
                self.call_later(self._load, f"reading the nodes' history over {self.window} after the apply")

        if self._start("applying: writing fleet.yaml, then the plan node by node", job, after=ended):
            self.gapp.apply_started()

    def apply_summary(self, pool: str) -> Text:
        """The last apply's outcome in words, for the terminal when the app quits after it."""
        text = Text()
        text.append(f"gpuops tui: the apply to pool {pool} has ended.\n", style="bold")
        if self.applied is not None:
            text.append_text(self._applied_text(self.applied, after_quit=True))
        else:
            text.append("Nothing was applied.\n")
        if self.error:
            text.append(f"✖ {self.error}\n", style=f"bold {theme.ERROR}")
        return text

    def action_clear(self) -> None:
        dropped = self.review is not None
        self.marked.clear()
        self.review = None
        self.applied = None
        self.draw_pool()
        self.flash("dropped the change under review" if dropped else "marks cleared")

    def _drop_for(self, why: str) -> None:
        if self.review is not None:
            self.review = None
            self.flash(f"dropped the change under review ({why})")
        self.applied = None
        self.marked.clear()

    def action_window(self) -> None:
        if self.job.startswith("applying"):
            self.flash(f"busy: {self.job}; wait for it")
            return
        at = WINDOWS.index(self.window) if self.window in WINDOWS else -1
        self.window = WINDOWS[(at + 1) % len(WINDOWS)]
        self._drop_for(f"window now {self.window}")
        self._load(f"reading the nodes' history over {self.window}")

    def action_next_pool(self) -> None:
        view = self.view
        if view is None or len(view.pools) < 2:
            self.flash("fleet.yaml has no other pool")
            return
        if self.job:
            self.flash(f"busy: {self.job}; wait for it")
            return
        pools = view.pools
        self.pool_name = pools[(pools.index(view.pool) + 1) % len(pools)]
        self._drop_for(f"pool now {self.pool_name}")
        self._load(f"showing pool {self.pool_name}", keep_histories=True)

    def action_reload(self) -> None:
        if self.job.startswith("applying"):
            self.flash(f"busy: {self.job}; wait for it")
            return
        if self.view is not None:
            self._drop_for("read again")
        self._load(f"reading fleet.yaml and the nodes' history over {self.window}")

    def action_switch_focus(self) -> None:
        gpus = self.query_one("#pool-gpus", LiveTable)
        review = self.query_one("#pool-review", VerticalScroll)
        if gpus.has_focus and review.has_class("open"):
            self.set_focus(review)
        else:
            self.set_focus(gpus)

    @on(LiveTable.RowSelected, "#pool-gpus")
    def _selected(self, event: LiveTable.RowSelected) -> None:
        node, index = parse_key(event.key)
        self.gapp.open_detail(node, index)


__all__ = ["CHANGES", "PoolScreen"]
