"""`:processes`: every GPU process of the fleet in one table (nvitop's list, across nodes), sorted
and filtered; Enter on a `:tenants` row drills down here, scoped to that team (k9s style)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from gpuops.tui import render
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.table import Column, LiveTable, Row
from gpuops.tui.widgets import whole_parts
from gpuops.views.feed import FleetState
from gpuops.views.processes import NOT_SENT, sort_processes
from gpuops.views.tenants import team_label

COLUMNS = (
    Column("PID", "pid", "right"),
    Column("User", "user"),
    Column("Team", "team"),
    Column("Node", "node"),
    Column("GPU", "gpu", "right"),
    Column("MIG", "mig"),
    Column("GPU mem", "memory", "right"),
    Column("Dev util", "util", "right"),
    Column("SM%", "sm", "right"),
    Column("CPU%", "cpu", "right"),
    Column("Host mem", "host", "right"),
    Column("Seen", "seen", "right"),
    Column("Command", "command"),
)
NA = "n/a"


class ProcessesScreen(ViewScreen):
    VIEW = "processes"
    TITLE = "processes"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("enter", "Enter", "open the process's node at its GPU"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "M": ("memory", "GPU memory held (the default, as nvitop)"),
        "P": ("pid", "process id"),
        "U": ("user", "unix user"),
        "T": ("team", "team (tenant)"),
        "N": ("node", "node, GPU and MIG instance"),
        "D": ("util", "utilization of its GPU or MIG slice"),
        "S": ("seen", "how long it has been seen (longest first)"),
        "C": ("command", "command line"),
    }
    DEFAULT_SORT = "memory"
    FILTER_HINT = "matches node, gpuN, MIG profile, pid, user, team and command; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("PID", "process id on its node"),
        ("User", "unix user ('?' where the agent could not tell)"),
        ("Team", "the team it counts for (docs/tenancy.md); '-': nobody claims it"),
        ("Node", "the node it runs on"),
        ("GPU", "the GPU's index on the node"),
        ("MIG", "GPU instance / compute instance and profile, '-' on a whole GPU"),
        ("GPU mem", "GPU memory it holds (NVML's used memory of the process)"),
        ("Dev util", "utilization of its GPU (MIG slice: its SMs, GPM), shared by every process there;"),
        ("", "orange: held idle, memory held at under 5% utilization"),
        ("SM%", "n/a: per-process SM utilization is not sent by the agent"),
        ("CPU%", "n/a: the agent does not sample processes' CPU"),
        ("Host mem", "n/a: the agent does not read processes' resident memory"),
        ("Seen", "how long this view has seen it (the agent sends no start time)"),
        ("Command", "its command line, as the agent sends it"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)

    DEFAULT_CSS = """
    #processes-note { height: auto; padding: 0 1; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.team: str | None = None  # the drill-down's scope: one team's processes

    @property
    def title_text(self) -> str:
        return f"processes of team {self.team}" if self.team is not None else "processes"

    def scope(self, team: str | None) -> None:
        self.team = team
        self.redraw()

    def compose_body(self) -> ComposeResult:
        yield Static(id="processes-note")
        yield LiveTable(COLUMNS, id="processes-table")

    def main_widget(self) -> Widget | None:
        return self.query_one(LiveTable)

    def draw(self, state: FleetState) -> None:
        everything = state.processes
        rows = sort_processes(everything, self.sort, self.reverse, self.filter, self.team)
        now = state.time
        out: list[Row] = []
        for p in rows:
            mig = "-" if p.instance is None else f"GI {p.instance}/CI {p.compute_instance} {p.profile}"
            util = Text(render.percent(p.device_util), style=render.HELD_TEXT if p.held else "")
            out.append(
                (
                    f"{p.node}/{p.gpu}/{p.pid}/{p.instance}",
                    (
                        str(p.pid),
                        p.user or "?",
                        Text(team_label(p.team), style="bold"),
                        p.node,
                        str(p.gpu),
                        mig,
                        render.size(p.memory),
                        util,
                        Text(NA, style="dim"),
                        Text(NA, style="dim"),
                        Text(NA, style="dim"),
                        render.age(max(0.0, now - p.seen)),
                        p.command,
                    ),
                )
            )
        self.query_one(LiveTable).set_rows(out)
        scope = f" of team {self.team}" if self.team is not None else ""
        held = sum(1 for p in rows if p.held)
        parts = [Text(f"{len(rows)} of {len(everything)} processes{scope}", style="bold")]
        if held:
            parts.append(Text(f"{held} on held-idle GPUs or slices", style=render.HELD_TEXT))
        # One line, never wrapped: why the n/a columns are n/a in full where it fits, else short
        # (`?` explains each column).
        widget = self.query_one("#processes-note", Static)
        width = max(40, (widget.size.width or self.size.width - 2))
        used = sum(p.cell_len + 3 for p in parts)
        why = f"n/a: {NOT_SENT}"
        short = "n/a: not sent by the agent (? says)"
        parts.append(Text(why if used + len(why) <= width else short, style="dim"))
        widget.update(whole_parts(parts, width))

    @on(LiveTable.RowSelected)
    def _selected(self, event: LiveTable.RowSelected) -> None:
        node, gpu, _, _ = event.key.rsplit("/", 3)
        self.gapp.open_detail(node, int(gpu))
