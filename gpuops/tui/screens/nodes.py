"""`:nodes`: one row per node with its state, the age of its data, owner, GPUs and load."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.widget import Widget

from gpuops.fleet.source import LIVE
from gpuops.tui import render, theme
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.table import Column, LiveTable, Row, Styled
from gpuops.views.feed import FleetState
from gpuops.views.nodes import filter_rows, sort_rows

_COLOUR = render.STATE_COLOUR.get

COLUMNS = (
    Column("Node", "node"),
    Column("State", "state"),
    Column("Age", "age", "right"),
    Column("Owner", "owner"),
    Column("GPUs", "gpus"),
    Column("Busy", "busy", "right"),
    Column("Idle", "idle", "right"),
    Column("Util", "util", "right"),
    Column("Memory", "memory"),
    Column("Procs", "procs", "right"),
    Column("Reason", "reason"),
)


class NodesScreen(ViewScreen):
    VIEW = "nodes"
    TITLE = "nodes"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("enter", "Enter", "open the node: GPUs, samples with units, processes, MIG layout"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "N": ("name", "node name"),
        "S": ("state", "state (unreachable and stale first)"),
        "A": ("age", "age of the data (oldest first)"),
        "O": ("owner", "owner"),
        "G": ("gpus", "number of GPUs"),
        "I": ("idle", "idle GPUs (most first)"),
        "U": ("util", "mean utilization"),
        "M": ("memory", "memory in use"),
        "P": ("processes", "number of processes"),
    }
    DEFAULT_SORT = "name"
    FILTER_HINT = "matches node, owner, model, state, tenants and users; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("Node", "the node's name in fleet.yaml"),
        ("State", "live, stale (no sample for 2 intervals), unreachable, connecting"),
        ("Age", "how old the node's last sample is"),
        ("Owner", "the team owning the node (fleet.yaml); its GPUs may have owners of their own"),
        ("GPUs", "how many GPUs of which model"),
        ("Busy", "GPU-equivalents doing work (see busy below) of the node's GPUs"),
        ("Idle", "GPU-equivalents not doing work, held idle ones included"),
        ("Util", "mean utilization, each MIG slice by its share of its GPU"),
        ("Memory", "GPU memory in use of the node's total"),
        ("Procs", "processes on the node's GPUs"),
        ("Reason", "why a node is not live (the collector's words)"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)

    def compose_body(self) -> ComposeResult:
        yield LiveTable(COLUMNS, id="nodes-table")

    def main_widget(self) -> Widget | None:
        return self.query_one(LiveTable)

    def draw(self, state: FleetState) -> None:
        now = state.time
        rows = sort_rows(filter_rows(state.rows, self.filter), self.sort, now, self.reverse)
        out: list[Row] = []
        for r in rows:
            age = r.age(now)
            out.append(
                (
                    r.name,
                    (
                        # Styled, not Text: made a Text only if its line is drawn
                        Styled(r.name, "bold"),
                        Styled(f"{render.STATE_GLYPH.get(r.state, '?')} {r.state}", _COLOUR(r.state, "")),
                        render.age(age) if age is not None else "-",
                        r.owner or "-",
                        r.models or "-",
                        f"{render.gpus(r.busy)}/{r.gpus}" if r.has_data else "-",
                        Styled(
                            render.gpus(r.idle) if r.has_data else "-",
                            f"bold {theme.IDLE}" if r.idle >= 0.05 else "",
                        ),
                        render.percent(r.util) if r.has_data else "-",
                        render.share(r.memory_used, r.memory_total) if r.has_data else "-",
                        str(r.processes) if r.has_data else "-",
                        Styled(r.reason if r.state != LIVE else "", _COLOUR(r.state, "")),
                    ),
                )
            )
        self.query_one(LiveTable).set_rows(out)

    @on(LiveTable.RowSelected)
    def _selected(self, event: LiveTable.RowSelected) -> None:
        self.gapp.open_detail(event.key, None)
