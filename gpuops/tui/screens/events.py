"""`:events`: what happened to the fleet — nodes going stale or unreachable and coming back, agent
errors, attribution warnings (each distinct one once), and the GPUs' health events (XID errors
with their meaning, ECC errors, clock events) per node, GPU and MIG instance — newest first.
(Applied changes will land here as their source does.)"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from gpuops.fleet.source import LIVE, STALE, UNREACHABLE
from gpuops.tui import render, theme
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.table import Column, LiveTable, Row
from gpuops.views.events import HEALTH, event_rows
from gpuops.views.feed import ATTRIBUTION, FLEET_WIDE, FleetState

KIND_STYLE = {
    LIVE: theme.LIVE,
    STALE: theme.STALE,
    UNREACHABLE: f"bold {theme.UNREACHABLE}",
    "agent-error": theme.AGENT_ERROR,
    ATTRIBUTION: theme.NOTICE,
}
# a health event that is informative, one that needs someone
HEALTH_STYLE = (theme.INFO, f"bold {theme.ERROR}")


class EventsScreen(ViewScreen):
    VIEW = "events"
    TITLE = "events"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("enter", "Enter", "open the node of the event"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "T": ("time", "time (newest first)"),
        "N": ("node", "node"),
        "W": ("kind", "what happened"),
    }
    DEFAULT_SORT = "time"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("Time", "when it happened (this machine's clock; health events: the node's)"),
        ("Ago", "how long ago"),
        ("Node", "the node; '-' for a warning about no node in particular"),
        (
            "What",
            "up, stale, unreachable, back, agent-error, attribution, or a health event (XID, ECC, clocks)",
        ),
        ("Message", "the reason, the GPU and MIG instance, an XID's meaning"),
    )
    FILTER_HINT = "matches node, kind and message; !re hides matches"
    BINDINGS = screen_bindings(KEYS, SORTS)

    def compose_body(self) -> ComposeResult:
        columns = (
            Column("Time", "time"),
            Column("Ago", "ago", "right"),
            Column("Node", "node"),
            Column("What", "what"),
            Column("Message", "message"),
        )
        yield LiveTable(columns, id="events-table")
        yield Static(
            "No events yet. Nodes going stale or unreachable and back, agent errors, attribution "
            "warnings and GPU health events (XID, ECC, clocks) appear here.",
            id="events-empty",
        )

    def main_widget(self) -> Widget | None:
        return self.query_one(LiveTable)

    def draw(self, state: FleetState) -> None:
        events = event_rows(state.events + state.warnings, self.filter, self.sort, self.reverse, state.health)
        out: list[Row] = []
        for i, e in enumerate(events):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
            style = HEALTH_STYLE[e.severe] if e.kind == HEALTH else KIND_STYLE.get(e.kind, "")
            gpu = "" if e.gpu is None or e.gpu < 0 else str(e.gpu)
            out.append(
                (
                    f"{e.time:.6f}/{e.node}/{e.kind}/{i}/{gpu}",
                    (
                        stamp,
                        render.age(max(0.0, state.time - e.time)),
                        Text(e.node, style="bold"),
                        Text(e.what, style=style),
                        e.message,
                    ),
                )
            )
        self.query_one(LiveTable).set_rows(out)
        empty = self.query_one("#events-empty", Static)
        empty.display = not out
        if not out and (state.events or state.warnings or state.health):
            empty.update("No event matches the filter (esc clears it).")

    @on(LiveTable.RowSelected)
    def _selected(self, event: LiveTable.RowSelected) -> None:
        parts = event.key.split("/")
        node, gpu = parts[1], parts[-1]
        if node != FLEET_WIDE:  # a warning about no node in particular has no node to open
            self.gapp.open_detail(node, int(gpu) if gpu else None)
