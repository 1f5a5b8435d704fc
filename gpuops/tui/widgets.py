"""The small widgets every screen shares: title bar, status line, command/filter bar, the team
totals header of the fleet grid, and a cell inspector. They draw what they are given."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, Static

from gpuops.tui import render, theme
from gpuops.views.cells import EMPTY_MIG, FREE, LOST, SLICE, Cell
from gpuops.views.grid import Totals
from gpuops.views.nodes import NodeRow
from gpuops.views.status import FleetStatus
from gpuops.views.tenants import TenantRow, team_label

VIEWS = ("gpus", "nodes", "tenants", "processes", "events", "pool")
COMMANDS = ("gpus", "nodes", "tenants", "processes", "events", "pool", "help", "quit", "q")


class TopBar(Static):
    """'gpuops │ gpus nodes tenants events │ source │ READONLY'."""

    DEFAULT_CSS = """
    TopBar { dock: top; height: 1; background: $panel; color: $text; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._drawn: tuple[str, str, str, bool] | None = None

    def draw(self, view: str, title: str, source: str, readonly: bool) -> None:
        self._drawn = (view, title, source, readonly)
        self.update(self._text(self.size.width or 200))

    def on_resize(self) -> None:
        if self._drawn is not None:
            self.update(self._text(self.size.width))

    def _text(self, width: int) -> Text:
        """In `width` cells, READONLY always. Where the line is too long, the other views' names
        go first (the one shown stays), then the source is cut in its middle (its state and
        reason kept), then the title is cut; each cut with '…', never a word cut without a sign."""
        assert self._drawn is not None
        view, title, source, readonly = self._drawn
        flag = Text("  READONLY ", style=f"bold {theme.ON_FLAG} on {theme.NOTICE}") if readonly else Text()
        head = Text(f" │ {title}", style="bold")
        tail = Text(f" │ {source}", style="dim") if source else Text()
        text = self._views(view, every=True)
        if text.cell_len + head.cell_len + tail.cell_len + flag.cell_len > width:
            text = self._views(view, every=False)
        room = width - text.cell_len - flag.cell_len
        if head.cell_len <= room:
            text.append_text(head)
            if room - head.cell_len >= 8:
                text.append_text(_cut_middle(tail, room - head.cell_len))
        else:
            text.append_text(_cut(head, room))
        text.append_text(flag)
        return text

    @staticmethod
    def _views(view: str, every: bool) -> Text:
        text = Text()
        text.append(" gpuops ", style=f"bold {theme.ON_FLAG} on {theme.ACCENT}")
        text.append(" ")
        for name in VIEWS:
            if name == view:
                text.append(f" {name} ", style="bold reverse")
            elif every:
                text.append(f" {name} ", style="dim")
        return text


class StatusBar(Static):
    """Nodes live/stale/unreachable, data age, interval, filter and sort, then what the screen says
    matters (its own part: marks, a change under review, a step under way) and the last message;
    the key hints on the right. On a narrow terminal the fleet figures give way first (a short
    form, then cut), then the screen's part, then the message; never '? help'."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; }
    """

    HINTS = "? help  q quit "

    def draw(
        self,
        status: FleetStatus | None,
        age: float | None,
        interval: float,
        filter_text: str,
        sort: str,
        readonly: bool,
        message: str = "",
        extra: Text | None = None,
    ) -> None:
        hints = self.HINTS
        width = self.size.width or 160
        room = width - len(hints) - 1
        tail = Text()
        if extra is not None and extra.cell_len:
            tail.append("│ ", style="dim")
            tail.append_text(extra)
            tail.append(" ")
        note = Text()
        if message:
            note.append("│ ", style="dim")
            note.append(message + " ", style="bold")
        full = self._figures(status, age, interval, filter_text, sort, readonly, short=False)
        if full.cell_len + tail.cell_len + note.cell_len <= room:
            text = full + tail + note
        else:
            # Narrow: the message (the answer to a key just pressed) first, then the screen's
            # part, then the fleet figures in their short form, cut or left out.
            note = _cut(note, room)
            tail = _cut(tail, room - note.cell_len)
            left = room - note.cell_len - tail.cell_len
            short = self._figures(status, age, interval, filter_text, sort, readonly, short=True)
            text = (_cut(short, left) if left >= 12 else Text()) + tail + note
        text.append(" " * max(1, width - text.cell_len - len(hints)))
        text.append(hints, style="dim")
        self.update(text)

    @staticmethod
    def _figures(
        status: FleetStatus | None,
        age: float | None,
        interval: float,
        filter_text: str,
        sort: str,
        readonly: bool,
        short: bool,
    ) -> Text:
        text = Text()
        if status is None:
            text.append(
                " waiting for data… " if short else " waiting for the first data… ", style=theme.PENDING
            )
        elif short:
            text.append(f" {render.STATE_GLYPH['live']}{status.live}", style=theme.LIVE)
            text.append(
                f" {render.STATE_GLYPH['stale']}{status.stale}", style=theme.STALE if status.stale else "dim"
            )
            text.append(
                f" {render.STATE_GLYPH['unreachable']}{status.unreachable} ",
                style=f"bold {theme.UNREACHABLE}" if status.unreachable else "dim",
            )
            text.append(f"{render.age(age)} old " if age is not None else "no data ")
        else:
            text.append(f" {render.STATE_GLYPH['live']} {status.live} live ", style=theme.LIVE)
            text.append(
                f"{render.STATE_GLYPH['stale']} {status.stale} stale ",
                style=theme.STALE if status.stale else "dim",
            )
            text.append(
                f"{render.STATE_GLYPH['unreachable']} {status.unreachable} unreachable ",
                style=f"bold {theme.UNREACHABLE}" if status.unreachable else "dim",
            )
            if status.connecting:
                text.append(f"○ {status.connecting} connecting ", style=theme.CONNECTING)
            text.append("│ ", style="dim")
            text.append(f"data {render.age(age)} old " if age is not None else "no live data ")
            text.append(f"│ every {render.age(interval)} ", style="dim")
        if readonly:
            text.append("│ READONLY ", style=f"bold {theme.NOTICE}")
        if filter_text:
            text.append("│ ", style="dim")
            text.append(f"/{filter_text} ", style=f"bold {theme.MARKED}")
        if sort and not short:
            text.append(f"│ sort {sort} ", style="dim")
        return text


def whole_parts(parts: list[Text], width: int, sep: str = " · ") -> Text:
    """The parts joined by `sep`, as many whole ones as fit `width` in order (the first always);
    never a part cut in two."""
    text = Text()
    if parts:
        text.append_text(parts[0])  # (a copy of parts[0] would lend its style to what follows)
    for part in parts[1:]:
        if text.cell_len + len(sep) + part.cell_len > width:
            break
        text.append(sep)
        text.append_text(part)
    return text


def flow_parts(parts: list[Text], width: int, sep: str = " · ", indent: str = "  ") -> Text:
    """The parts joined by `sep` on as many lines as they need, each line within `width` where a
    part fits at all: a line breaks between parts, never inside one."""
    text = Text()
    line = 0
    for i, part in enumerate(parts):
        if i and line + len(sep) + part.cell_len > width:
            text.append("\n" + indent)
            line = len(indent)
        elif i:
            text.append(sep)
            line += len(sep)
        text.append_text(part)
        line += part.cell_len
    return text


def _cut_middle(text: Text, width: int) -> Text:
    """`text` in at most `width` cells: its start and its end (a source's state and reason),
    '…' where the middle was left out."""
    if text.cell_len <= width:
        return text
    if width <= 1:
        return Text()
    end = (width - 1) // 2
    start = width - 1 - end
    said = text.plain.find(": ") + 2  # a state said before its reason ('source unreachable: …')
    if 2 <= said <= width - 1 - 12:
        start, end = said, width - 1 - said
        last = text.plain.rfind(": ") + 2  # and the last part whole where it fits ('timeout (…)')
        if last > said and text.cell_len - last <= end:
            end = text.cell_len - last
            start = width - 1 - end
    out = text[:start]
    out.append("…", style=text.style)
    out.append_text(text[text.cell_len - end :])
    return out


def _cut(text: Text, width: int) -> Text:
    """`text` in at most `width` cells, ending in '…' where cut."""
    if text.cell_len <= width:
        return text
    if width <= 0:
        return Text()
    out = text.copy()
    out.truncate(width - 1)
    out.append("…")
    return out


class PromptInput(Input):
    """The bar's input: Tab takes the suggested completion instead of moving the focus."""

    DEFAULT_CSS = """
    PromptInput, PromptInput:focus { border: none; height: 1; padding: 0; width: 1fr; background: $boost; }
    """

    BINDINGS = [Binding("tab", "complete", "complete the command", show=False, priority=True)]

    def action_complete(self) -> None:
        suggestion = self._suggestion
        if suggestion and len(suggestion) > len(self.value):
            self.value = suggestion
            self.cursor_position = len(suggestion)


class PromptBar(Horizontal):
    """The k9s bar: ':' runs a command, '/' types a filter. Hidden until opened."""

    DEFAULT_CSS = """
    PromptBar { height: 1; display: none; background: $boost; }
    PromptBar.open { display: block; }
    PromptBar > Label { width: auto; padding: 0 0 0 1; color: $accent; text-style: bold; }
    PromptBar > Label.error { color: $error; }
    PromptBar > #prompt-hint { color: $text-muted; text-style: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.mode = ""

    def compose(self) -> ComposeResult:
        yield Label(":", id="prompt-mode")
        yield PromptInput(id="prompt-input", suggester=SuggestFromList(COMMANDS, case_sensitive=False))
        yield Label("", id="prompt-hint")

    def open(self, mode: str, value: str = "") -> None:
        self.mode = mode
        self.query_one("#prompt-mode", Label).update(mode)
        field = self.query_one("#prompt-input", PromptInput)
        field.suggester = SuggestFromList(COMMANDS, case_sensitive=False) if mode == ":" else None
        field.value = value
        field.cursor_position = len(value)
        self.hint("")
        self.add_class("open")
        # Now, not after a refresh: keys that arrived with ':' (a paste, a fast typist) go to the bar.
        self.screen.set_focus(field)

    def close(self) -> None:
        self.mode = ""
        self.remove_class("open")

    @property
    def is_open(self) -> bool:
        return self.has_class("open")

    def hint(self, text: str, error: bool = False) -> None:
        label = self.query_one("#prompt-hint", Label)
        label.update(text)
        label.set_class(error, "error")


class TeamHeader(Static):
    """Fleet totals and one chip per team (busy/owned, idle), wrapped to a few lines."""

    DEFAULT_CSS = """
    TeamHeader { height: auto; max-height: 4; padding: 0 1; }
    """

    MAX_LINES = 3

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.fleet: Totals | None = None
        self.teams: tuple[TenantRow, ...] = ()

    def draw(self, fleet: Totals, teams: tuple[TenantRow, ...]) -> None:
        self.fleet, self.teams = fleet, teams
        self.update(self._text(max(40, self.size.width - 2 if self.size.width else 118)))

    def on_resize(self) -> None:
        if self.fleet is not None:
            self.update(self._text(max(40, self.size.width - 2)))

    def _text(self, width: int) -> Text:
        f = self.fleet
        assert f is not None
        # The fleet's line: its parts in order of importance, as many whole parts as fit (a
        # wrapped line would push the chips and the grid down, and cut a figure in two).
        parts = [Text(f"{render.count(f.gpus, 'GPU')} on {render.count(f.nodes, 'node')}", style="bold")]
        parts.append(Text(f"{render.gpus(f.busy)} busy"))
        idle = Text(f"{render.gpus(f.idle)} idle", style=f"bold {theme.IDLE}" if f.idle >= 0.05 else "")
        if f.held >= 0.05:
            idle.append(f" ({render.gpus(f.held)} held)", style=render.HELD_TEXT)
        parts.append(idle)
        if f.unknown:
            parts.append(Text(f"{f.unknown} without data", style=theme.ERROR))
        parts.append(Text(f"util {render.percent(f.util)}"))
        parts.append(Text(f"mem {render.share(f.memory_used, f.memory_total)}"))
        text = whole_parts(parts, width)
        legend = Text("   cell ", style="dim")
        legend.append(" 96", style=render.util_style(96))
        legend.append(" 80", style=render.mem_style(80))
        legend.append(" util% mem%  ", style="dim")
        legend.append("  0", style=render.util_style(0))
        legend.append(" idle  ", style="dim")
        legend.append(" 3g", style=render.SLICE_BUSY)
        legend.append(" 79", style=render.mem_style(79))
        legend.append(" MIG slice  ", style="dim")
        legend.append("  0", style=render.HELD_STYLE)
        legend.append(" held idle", style="dim")
        if text.cell_len + legend.cell_len <= width:
            text.append_text(legend)
        for line in self._chip_lines([self._chip(t) for t in self.teams if t.owned or t.used], width):
            text.append("\n")
            text.append_text(line)
        return text

    def _chip_lines(self, chips: list[Text], width: int) -> list[Text]:
        """Chips flowed into at most MAX_LINES lines; the last says how many did not fit."""
        lines: list[Text] = []
        line = Text()
        for i, chip in enumerate(chips):
            last = len(lines) == self.MAX_LINES - 1
            room = width - (len(f"  … +{len(chips)} teams (:tenants)") if last and i < len(chips) - 1 else 0)
            if line.cell_len and line.cell_len + 3 + chip.cell_len > room:
                if last:
                    line.append(f"  … +{len(chips) - i} teams (:tenants)", style="dim")
                    lines.append(line)
                    return lines
                lines.append(line)
                line = Text()
            if line.cell_len:
                line.append(" │ ", style="dim")
            line.append_text(chip)
        if line.cell_len:
            lines.append(line)
        return lines

    @staticmethod
    def _chip(t: TenantRow) -> Text:
        """A team: its silo's busy and idle capacity, what it borrows; a pool: the same of its GPUs."""
        chip = Text()
        name = team_label(t.team)
        chip.append(name, style=f"bold {theme.POOL}" if t.pool is not None else f"bold {theme.TEAM}")
        if t.silo or not t.pooled:
            busy = max(0.0, t.silo - t.unknown - t.idle)
            chip.append(f" {render.gpus(busy)}/{t.silo} busy")
        if t.idle >= 0.05:
            chip.append(f" {render.gpus(t.idle)} idle", style=f"bold {theme.IDLE}")
            if t.held >= 0.05:
                chip.append(f" ({render.gpus(t.held)} held)", style=render.HELD_TEXT)
        if t.pooled:
            chip.append(f" {t.pooled} in pools", style="dim")
        if t.borrowed >= 0.05:
            chip.append(f" +{render.gpus(t.borrowed)} borrowed", style=theme.BORROWED)
        if t.unknown:
            chip.append(f" {t.unknown} no data", style=theme.ERROR)
        return chip


class Inspector(Static):
    """One line about the cell under the cursor."""

    DEFAULT_CSS = """
    Inspector { height: 1; background: $boost; padding: 0 1; }
    """

    def draw(self, row: NodeRow | None, cell: Cell | None, now: float) -> None:
        if row is None:
            self.update(Text("no node matches", style="dim"))
            return
        text = Text()
        text.append(row.name, style="bold")
        text.append(" ")
        text.append_text(render.state_text(row.state, row.age(now)))
        if cell is None:
            text.append(f" · {row.reason or 'no GPUs known yet'}", style="dim")
            self.update(text)
            return
        text.append(f" · GPU {cell.gpu} {cell.model}")
        if cell.kind == SLICE:
            text.append(f" · MIG {cell.profile} (GI {cell.instance})")
        elif cell.kind == FREE:
            text.append(f" · {cell.fraction:.0%} of the GPU not carved into MIG instances")
        elif cell.kind == EMPTY_MIG:
            text.append(" · MIG mode on, no GPU instance")
        elif cell.kind == LOST:
            text.append(" · GPU lost (GPU_IS_LOST: fell off the bus?)", style=f"bold {theme.ERROR}")
        elif cell.profile:
            text.append(f" · partition {cell.profile}")
        text.append(f" · owner {cell.owner or 'none'}")
        if cell.kind not in (FREE, EMPTY_MIG, LOST):
            if cell.kind != SLICE:
                text.append(f" · util {render.percent(cell.util)}")
            if cell.memory_total:
                text.append(f" · mem {render.size(cell.memory_used)} / {render.size(cell.memory_total)}")
            if cell.processes:
                who = ", ".join(cell.tenants)
                text.append(f" · {cell.processes} proc{'s' if cell.processes > 1 else ''} of {who}")
                if cell.users:
                    text.append(f" ({', '.join(cell.users)})", style="dim")
            else:
                text.append(" · no processes", style="dim")
        text.append("  Enter: details", style="dim")
        self.update(text)
