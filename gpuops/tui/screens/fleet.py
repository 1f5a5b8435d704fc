"""`:gpus`, the start screen: team totals on top, then every GPU or MIG slice of the fleet as a cell,
nodes grouped by team (or not), the cell under the cursor described at the bottom."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.widget import Widget

from gpuops.tui.grid import FleetGrid
from gpuops.tui.keys import Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.widgets import Inspector, TeamHeader
from gpuops.views.feed import FleetState
from gpuops.views.grid import BY_NODE, BY_TEAM, group_rows, totals


class FleetScreen(ViewScreen):
    VIEW = "gpus"
    TITLE = "fleet"
    KEYS: ClassVar[tuple[Key, ...]] = (
        Key("up,down,left,right", "↑ ↓ ← →  h j k l", "move over the cells (GPUs and MIG slices)"),
        Key("pageup,pagedown", "PgUp PgDn", "a page up or down"),
        Key("home,end", "Home End", "first / last cell"),
        Key("enter", "Enter", "open the node and GPU under the cursor (details, processes, MIG layout)"),
        Key("g", "g", "group by team (nodes under the team owning their GPUs) or list all nodes", "group"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {
        "N": ("name", "node name"),
        "S": ("state", "state (unreachable and stale first)"),
        "A": ("age", "age of the data (oldest first)"),
        "U": ("util", "mean utilization (busiest first)"),
        "M": ("memory", "memory in use (fullest first)"),
        "I": ("idle", "idle GPUs (most first)"),
    }
    DEFAULT_SORT = "name"
    FILTER_HINT = "matches node, team, model, state, tenants and users; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("top line", "the fleet: GPUs, busy and idle GPU-equivalents (held idle ones), util, memory"),
        ("team chips", "per team: busy/silo GPUs, idle (held), GPUs in pools, borrowed, without data;"),
        ("", "per pool: the same of its GPUs. Chips add up to the top line"),
        ("group header", "a team's nodes: GPUs, busy, idle (held), util, memory, processes"),
        ("cell", "a GPU: utilization % then memory %; a MIG slice: its SMs' % (or its size) then memory %"),
        (
            "held idle",
            "a cell whose utilization is orange: under 5% utilized but holding memory or processes",
        ),
        ("bottom line", "the cell under the cursor: node, GPU, model, owner, util, memory, processes"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)

    def __init__(self) -> None:
        super().__init__()
        self.by = BY_TEAM

    @property
    def title_text(self) -> str:
        return f"fleet by {'team' if self.by == BY_TEAM else 'node'}"

    def compose_body(self) -> ComposeResult:
        yield TeamHeader(id="team-header")
        yield FleetGrid(id="grid")
        yield Inspector(id="inspector")

    def main_widget(self) -> Widget | None:
        return self.query_one(FleetGrid)

    def draw(self, state: FleetState) -> None:
        rows = state.rows
        groups = group_rows(rows, self.by, self.sort, self.reverse, self.filter, state.time)
        self.query_one(TeamHeader).draw(totals(rows), state.tenants)
        self.query_one(FleetGrid).show(groups, self.by, state.time)

    def action_group(self) -> None:
        self.by = BY_NODE if self.by == BY_TEAM else BY_TEAM
        self.redraw()

    @on(FleetGrid.CursorMoved)
    def _cursor_moved(self, event: FleetGrid.CursorMoved) -> None:
        now = self.state.time if self.state is not None else 0.0
        self.query_one(Inspector).draw(event.row, event.cell, now)

    @on(FleetGrid.Opened)
    def _opened(self, event: FleetGrid.Opened) -> None:
        self.gapp.open_detail(event.row.name, event.cell.gpu if event.cell is not None else None)
