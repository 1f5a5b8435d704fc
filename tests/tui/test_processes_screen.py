"""Issue 18 items 1 and 2 through the screens (Pilot): `:processes` across the fleet, sorted and
filtered, the drill-down team -> its processes from `:tenants`, held-idle GPUs marked in the grid
and counted in tenants, one meaning of busy on the header, the chips and the group headers, and
`?` explaining each screen's columns."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.tui import render
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid, draw_line
from gpuops.tui.screens import detail, events, nodes, pool, processes, tenants
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.screens.events import EventsScreen
from gpuops.tui.screens.fleet import FleetScreen
from gpuops.tui.screens.help import HelpScreen
from gpuops.tui.screens.nodes import NodesScreen
from gpuops.tui.screens.pool import PoolScreen
from gpuops.tui.screens.processes import ProcessesScreen
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.tui.table import Column, LiveTable
from gpuops.tui.widgets import TeamHeader
from tests.tui.conftest import AppFactory

SIZE = (160, 45)
pytestmark = pytest.mark.timeout(60)


def run(app: GpuopsApp, script: Callable[[Pilot[None]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 60))


async def command(pilot: Pilot[None], text: str) -> None:
    await pilot.press("colon", *text, "enter")
    await pilot.pause()


def rows(app: GpuopsApp, selector: str = "LiveTable") -> list[list[str]]:
    table = app.screen.query_one(selector, LiveTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def text_of(widget: Static) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


def test_processes_across_the_fleet_sorted_and_filtered(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "processes")
        screen = app.screen
        assert isinstance(screen, ProcessesScreen)
        state = app.fleet_state
        assert state is not None
        every = sum(len(g.processes) for v in state.snapshot.nodes if v.sample for g in v.sample.gpus)
        table = rows(app)
        assert len(table) == every > 20
        # nvitop's fields; where the agent sends nothing, n/a and the reason above the table.
        assert {"research", "vision", "chat"} <= {r[2] for r in table}
        assert all(r[8] == r[9] == r[10] == "n/a" for r in table)
        note = text_of(screen.query_one("#processes-note", Static))
        assert f"{every} of {every} processes" in note and "not sent by the agent" in note
        assert "held-idle" in note
        # GPU memory first (as nvitop), MIG slices named.
        memory = [r[6] for r in table]
        assert memory[0].endswith("GiB") and any(r[5].startswith("GI ") for r in table)
        await pilot.press("P")  # Shift-P: by pid
        await pilot.pause()
        pids = [int(r[0]) for r in rows(app)]
        assert pids == sorted(pids) and screen.sort_label() == "pid"
        await pilot.press("slash", *"sim-research", "enter")
        await pilot.pause()
        assert {r[3] for r in rows(app)} == {"sim-research-01"}
        # Enter opens the node at the process's GPU.
        key = app.screen.query_one(LiveTable).cursor_key
        assert key is not None
        gpu = int(key.split("/")[1])
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        assert (app.screen.node, app.screen.gpu_index) == ("sim-research-01", gpu)

    run(app, script)


def test_enter_on_a_team_drills_down_to_its_processes(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "tenants")
        table = app.screen.query_one(LiveTable)
        table.move_to_key("research")
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProcessesScreen) and screen.team == "research"
        research = rows(app)
        assert research and {r[2] for r in research} == {"research"}
        assert "processes of team research" in screen.title_text
        # Held idle: research's GPUs 1 and 3 hold memory at 0%; their processes say so.
        assert any(
            s.style == render.HELD_TEXT
            for cells in screen.query_one(LiveTable).rows
            for s in [cells[1][7]]
            if hasattr(s, "style")
        )
        await pilot.press("escape")  # back where we came from
        await pilot.pause()
        assert isinstance(app.screen, TenantsScreen)
        await command(pilot, "processes")  # the command shows every team again
        assert isinstance(app.screen, ProcessesScreen) and app.screen.team is None
        assert len(rows(app)) > len(research)

    run(app, script)


def test_held_idle_marked_in_the_grid_and_counted_in_tenants(make_app: AppFactory) -> None:
    """research's GPUs 1 and 3 and analytics' GPU 0 hold memory at 0% utilization: not busy on any
    line, held idle in the grid (their own colour), the chips and the tenants' Held column."""
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        grid = app.screen.query_one(FleetGrid)
        grid.select_node("sim-research-01")
        await pilot.pause()
        held = [c for r in grid.layout_.positions.rows if r.name == "sim-research-01" for c in r.cells]
        assert [c.held for c in held[:4]] == [False, True, False, True]
        layout = grid.layout_
        line = next(
            i for i, ln in enumerate(layout.lines) if any(b.row.name == "sim-research-01" for b in ln.blocks)
        )
        segments = draw_line(layout, line, grid.by, grid.now, None)
        assert sum(1 for s in segments if s.style == render.HELD_STYLE) == 2
        header = text_of(app.screen.query_one(TeamHeader))
        assert re.search(r"\d+(\.\d)? busy · \d+(\.\d)? idle \(\d+(\.\d)? held\)", header)
        assert "research 1/4 busy 3 idle (2 held)" in header
        assert "analytics 0/4 busy 4 idle (1 held)" in header
        research_header = next(
            "".join(s.text for s in draw_line(layout, i, grid.by, grid.now, None))
            for i, ln in enumerate(layout.lines)
            if ln.group is not None and ln.group.team == "research"
        )
        assert "1 busy · 3 idle (2 held)" in research_header
        await command(pilot, "tenants")
        table = {r[0]: r for r in rows(app)}
        assert (table["research"][5], table["research"][6]) == ("3", "2")  # Idle, Held
        assert (table["robotics"][5], table["robotics"][6]) == ("8", "0")

    run(app, script)


def test_the_header_is_the_sum_of_the_chips(make_app: AppFactory) -> None:
    """The top line's busy is what the chips add up to, and each team's chip says what its group
    header says (issue 18 item 1: '35 busy' with chips adding up to 33)."""
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        header = text_of(app.screen.query_one(TeamHeader))
        top = float(re.search(r"([\d.]+) busy", header).group(1))  # type: ignore[union-attr]
        chips = [float(m) for m in re.findall(r"[a-z]+ ([\d.]+)/\d+ busy", header)]
        assert len(chips) == 7 and top == pytest.approx(sum(chips), abs=0.1 * len(chips))
        grid = app.screen.query_one(FleetGrid)
        for group in grid.groups:
            chip = re.search(rf"{group.team} ([\d.]+)/\d+ busy", header)
            assert chip is not None and float(chip.group(1)) == pytest.approx(group.totals.busy, abs=0.05)

    run(app, script)


def _labels(columns: tuple[Column, ...]) -> set[str]:
    return {c.label for c in columns if c.label.strip() not in ("", "│")}


def test_help_explains_every_column_of_every_screen(make_app: AppFactory) -> None:
    """`?` on each screen says what its columns mean, not only its sort keys."""
    events_columns = {"Time", "Ago", "Node", "What", "Message"}
    screens = {
        NodesScreen: _labels(nodes.COLUMNS),
        TenantsScreen: _labels(tenants.COLUMNS),
        ProcessesScreen: _labels(processes.COLUMNS),
        DetailScreen: _labels(detail.GPU_COLUMNS) | _labels(detail.PROC_COLUMNS),
        PoolScreen: _labels(pool.TEAM_COLUMNS) | _labels(pool.GPU_COLUMNS),
        EventsScreen: events_columns,
    }
    assert events
    for screen, labels in screens.items():
        explained = {name for name, _ in screen.COLUMN_HELP}
        assert labels <= explained, (screen.__name__, labels - explained)
    assert {"cell", "held idle", "team chips"} <= {n for n, _ in FleetScreen.COLUMN_HELP}
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "tenants")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = text_of(app.screen.query_one("#help-text", Static))
        assert "Columns on this screen" in text
        for word in ("Waste", "Session", "Held", "held idle", "GPU-equivalents"):
            assert word in text
        assert "busy" in text and "on every" in text

    run(app, script)
