"""`?`: every key of the screen it was opened from, the commands, the colours and what the figures
mean. Made from the same key lists as the bindings."""

from __future__ import annotations

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuops.tui import render, theme
from gpuops.tui.keys import GLOBAL_KEYS, Key

COMMANDS: tuple[tuple[str, str], ...] = (
    (":gpus [filter]", "the fleet grid: a cell per GPU or MIG slice (the start screen)"),
    (":nodes [filter]", "one row per node: state, data age, owner, GPUs, busy, util, memory"),
    (":tenants [filter]", "per team: owned, guaranteed, used, borrowed, idle, waste, GPU-time, sparklines"),
    (":processes [filter]", "every GPU process of the fleet: pid, user, team, where, memory, command"),
    (":events [filter]", "nodes going stale or unreachable and back, agent errors"),
    (":pool [filter]", "silos and the pool per team: move GPUs, ask the planner, plan, apply"),
    (":help", "this screen"),
    (":q", "quit (also :quit, q, ctrl-c)"),
)

FIGURES: tuple[tuple[str, str], ...] = (
    ("busy", "capacity doing work: a GPU at least 5% utilized (processes or not); a MIG slice by its"),
    ("", "SMs' utilization where NVML's GPM gives it, else while it holds a process (Ampere: no"),
    ("", "per-slice figure). Counted in GPU-equivalents (a 3g slice of an H100 is 3/7) on every"),
    ("", "line: top line, team chips, group headers, nodes, tenants"),
    ("idle", "capacity with data that is not busy (free MIG slices included): held idle + free"),
    ("held idle", "idle but holding processes or memory (at least 1%): looks taken, delivers nothing"),
    ("owned", "GPUs a team owns (fleet.yaml); '8 (2?)': 2 of them on nodes without current data"),
    ("used", "GPU-equivalents holding a team's processes, on any team's GPUs"),
    ("guaranteed", "a team's silo GPUs plus its pool guarantees (share x the pool's GPUs)"),
    ("borrowed", "what a team uses outside its silo beyond its pool guarantees"),
    ("GPU-time", "utilization-weighted GPU-equivalents: a GPU at 50% is 0.5"),
    ("waste", "silo capacity minus the GPU-time delivered on it: the silo capacity to pool"),
    ("pool NAME", "a pool's row: its GPUs, what it guarantees, its idle capacity and waste"),
    ("age", "how old a node's last sample is; stale: older than 2 intervals"),
)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; max-width: 100%; height: 90%; border: round $accent;
        background: $surface; padding: 0 1; }
    """

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "close help", show=False),
        Binding("up,k", "scroll(-1)", show=False),
        Binding("down,j", "scroll(1)", show=False),
    ]

    def __init__(
        self,
        screen_name: str,
        keys: tuple[Key, ...],
        readonly: bool,
        columns: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__()
        self.screen_name = screen_name
        self.keys = keys
        self.readonly = readonly
        self.columns = columns

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.content(), id="help-text")

    def content(self) -> RichGroup:
        parts: list[Text | Table] = []

        def section(title: str) -> Table:
            parts.append(Text(f"\n{title}", style="bold underline"))
            table = Table.grid(padding=(0, 2))
            table.add_column(style=f"bold {theme.ACCENT}", no_wrap=True, min_width=14)
            table.add_column()
            parts.append(table)
            return table

        head = Text(f"Help — {self.screen_name}", style="bold")
        head.append("   esc, q or ? closes this help", style="dim")
        parts.append(head)
        if self.columns:
            table = section("Columns on this screen")
            for name, what in self.columns:
                table.add_row(name, what)
        table = section("Keys on this screen")
        for key in self.keys:
            table.add_row(key.label, key.description)
        table = section("Keys everywhere")
        for key in GLOBAL_KEYS:
            table.add_row(key.label, key.description)
        table = section("Commands (type : then the name; a unique prefix is enough)")
        for name, what in COMMANDS:
            table.add_row(name, what)
        table = section("Colours")
        legend = Text()
        legend.append("util ")
        for value in (0, 10, 40, 60, 80, 95):
            legend.append(render.pct3(value), style=render.util_style(value))
        legend.append("   memory ")
        for value in (0, 10, 40, 60, 80, 95):
            legend.append(render.pct3(value), style=render.mem_style(value))
        table.add_row("cells", legend)
        table.add_row("", "a cell is utilization % then memory %; grey utilization: idle (under 5%)")
        held = Text("  0", style=render.HELD_STYLE)
        held.append(" 40", style=render.mem_style(40))
        held.append(" held idle: under 5% utilized while holding processes or memory")
        table.add_row("", held)
        mig = Text()
        mig.append(" 3g", style=render.SLICE_BUSY)
        mig.append(" 79", style=render.mem_style(79))
        mig.append(" a MIG slice in use (compute size, memory %)  ")
        mig.append(" 1g", style=render.SLICE_IDLE)
        mig.append("  0", style=render.mem_style(0))
        mig.append(" unused  ")
        mig.append(" free ", style=render.FREE_STYLE)
        mig.append(" not carved; │ ends a MIG GPU")
        table.add_row("MIG", mig)
        table.add_row("", Text(" LOST ", style=render.LOST_STYLE) + Text(" the GPU fell off the bus"))
        states = Text()
        for state in ("live", "stale", "unreachable", "connecting"):
            states.append_text(render.state_text(state))
            states.append("   ")
        table.add_row("nodes", states)
        table.add_row("", "a node that is not live shows its last known figures dimmed, with age and reason")
        table = section("Figures")
        for name, what in FIGURES:
            table.add_row(name, what)
        if self.readonly:
            table = section("Read-only")
            table.add_row("READONLY", "started with --readonly: actions that change the fleet are disabled")
        return RichGroup(*parts)

    def action_close(self) -> None:
        self.dismiss()

    def action_scroll(self, lines: int) -> None:
        self.query_one(VerticalScroll).scroll_relative(y=lines, animate=False)
