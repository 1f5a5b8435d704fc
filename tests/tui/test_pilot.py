"""The TUI driven by keys (Textual's Pilot) over a simulated fleet on a fixed clock: every screen,
filtering, sorting, drill-down, a node going unreachable and back, hidden screens idle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.fleet.source import LIVE, UNREACHABLE
from gpuops.simfleet.source import SimSource
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid, draw_line
from gpuops.tui.keys import GLOBAL_KEYS
from gpuops.tui.screens.base import ViewScreen
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.screens.fleet import FleetScreen
from gpuops.tui.screens.help import HelpScreen
from gpuops.tui.screens.nodes import NodesScreen
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.tui.table import LiveTable
from gpuops.tui.widgets import PromptBar, StatusBar, TopBar
from tests.tui.conftest import AppFactory, Clock

SIZE = (140, 45)
pytestmark = pytest.mark.timeout(60)


Script = Callable[[Pilot[None]], Awaitable[None]]


def run(app: GpuopsApp, script: Script, size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 60))


def text_of(widget: Static) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


def grid_text(app: GpuopsApp) -> str:
    grid = app.screen.query_one(FleetGrid)
    layout = grid.layout_
    lines = (draw_line(layout, y, grid.by, grid.now, None) for y in range(len(layout.lines)))
    return "\n".join("".join(s.text for s in line) for line in lines)


def table_rows(app: GpuopsApp, selector: str = "LiveTable") -> list[list[str]]:
    table = app.screen.query_one(selector, LiveTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def status(app: GpuopsApp) -> str:
    return text_of(app.screen.query_one(StatusBar))


async def command(pilot: Pilot[None], text: str) -> None:
    await pilot.press("colon", *text, "enter")
    await pilot.pause()


def test_starts_on_the_fleet_grid_with_teams_and_nodes(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        assert isinstance(app.screen, FleetScreen)
        grid = grid_text(app)
        for team in ("analytics", "chat", "platform", "research", "robotics", "speech", "vision"):
            assert f"▌{team} " in grid
        assert "sim-robotics-01" in grid and "8 idle" in grid
        header = text_of(app.screen.query_one("#team-header", Static))
        assert "48 GPUs on 8 nodes" in header and "robotics 0/8 busy 8 idle" in header
        line = status(app)
        assert "8 live" in line and "0 stale" in line and "0 unreachable" in line and "every 1s" in line
        assert "data 0ms old" in line
        top = text_of(app.screen.query_one(TopBar))
        assert "simulated silos fleet (test)" in top and "READONLY" not in top
        inspector = text_of(app.screen.query_one("#inspector", Static))
        assert "sim-analytics-01" in inspector and "GPU 0" in inspector

    run(app, script)


def test_every_screen_by_keys_and_back(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "nodes")
        assert isinstance(app.screen, NodesScreen) and len(table_rows(app)) == 8
        await command(pilot, "tenants")
        assert isinstance(app.screen, TenantsScreen)
        assert table_rows(app)[0][0] == "robotics"  # sorted by waste
        await command(pilot, "ev")  # a unique prefix is enough
        assert app.current_mode == "events"
        assert "No events yet" in text_of(app.screen.query_one("#events-empty", Static))
        await command(pilot, "gpus")
        assert isinstance(app.screen, FleetScreen)
        # esc walks back through the views visited
        for expected in ("events", "tenants", "nodes", "gpus"):
            await pilot.press("escape")
            await pilot.pause()
            assert app.current_mode == expected
        await command(pilot, "nodes vision")  # a view with a filter
        assert isinstance(app.screen, NodesScreen) and [r[0] for r in table_rows(app)] == [
            "sim-platform-01",
            "sim-vision-01",
            "sim-vision-02",
        ]
        await pilot.press("escape")  # clears the filter
        await pilot.press("escape")  # back to the grid
        await pilot.pause()
        assert app.current_mode == "gpus"
        await command(pilot, "pool")  # no fleet.yaml behind this app: the Pool screen says so
        assert app.current_mode == "pool" and "needs a fleet.yaml" in status(app)
        await command(pilot, "bogus")  # the bar closes, the status line says why (issue 18 item 8)
        bar = app.screen.query_one(PromptBar)
        assert not bar.is_open and "unknown command 'bogus'" in status(app)
        await command(pilot, "q")
        assert app.return_code == 0

    run(app, script)
    assert not app.is_running


def test_help_lists_every_key_of_each_screen(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        for view in ("gpus", "nodes", "tenants", "events"):
            await command(pilot, view)
            screen = app.screen
            assert isinstance(screen, ViewScreen)
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            text = text_of(app.screen.query_one("#help-text", Static))
            bound = {b.key for b in screen.BINDINGS} | {b.key for b in GpuopsApp.BINDINGS}  # type: ignore[union-attr]
            labels = {k.keys: k.label for k in (*screen.help_keys(), *GLOBAL_KEYS)}
            for key in bound:
                assert key in labels, f"{view}: key {key} has no help entry"
                assert labels[key] in text, f"{view}: {labels[key]} missing from help"
            for word in (":gpus", ":tenants", "waste", "Shift-"):
                assert word in text
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is screen
        await pilot.press("q")

    run(app, script, size=(140, 60))


def test_filter_by_regex_inverse_and_clear(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("slash", *"vision")
        await pilot.pause()
        grid = grid_text(app)
        assert "▌vision" in grid and "sim-robotics-01" not in grid
        assert "sim-platform-01" in grid  # vision's notebooks run on a MIG slice of the platform node
        await pilot.press("enter")
        assert "/vision" in status(app)
        await pilot.press("slash", "ctrl+u", *"!vision|platform", "enter")
        await pilot.pause()
        grid = grid_text(app)
        assert "sim-vision-01" not in grid and "sim-platform-01" not in grid and "sim-robotics-01" in grid
        # A broken expression is reported and the last good one ("vision", typed on the way) stays.
        await pilot.press("slash", "ctrl+u", *"vision(")
        await pilot.pause()
        hint = str(app.screen.query_one(PromptBar).query_one("#prompt-hint", Static).content)
        assert "not a regular expression" in hint
        assert "sim-vision-01" in grid_text(app) and "sim-robotics-01" not in grid_text(app)
        await pilot.press("escape")  # leaves the bar and clears the filter
        await pilot.pause()
        assert "sim-vision-01" in grid_text(app) and "/" not in status(app).split("│")[3]
        # The nodes table filters the same way; esc clears a kept filter.
        await command(pilot, "nodes")
        await pilot.press("slash", *"idle|analytics", "enter")
        await pilot.pause()
        assert [r[0] for r in table_rows(app)] == ["sim-analytics-01"]
        await pilot.press("escape")
        await pilot.pause()
        assert len(table_rows(app)) == 8

    run(app, script)


def test_drill_down_from_every_view(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        grid = app.screen.query_one(FleetGrid)
        grid.select_node("sim-platform-01")
        await pilot.press("right", "enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, DetailScreen) and detail.node == "sim-platform-01" and detail.gpu_index == 0
        panel = text_of(detail.query_one("#gpu-panel", Static))
        for word in ("MIG: on", "1g.10gb", "2g.20gb", "3g.40gb", "GI 2", "MPS:", "Limiter:"):
            assert word in panel
        procs = table_rows(app, "#proc-table")
        assert procs and all(row[1].startswith("GI ") for row in procs)
        gpus = table_rows(app, "#gpu-table")
        assert len(gpus) == 4 and "W" in gpus[0][5] and "°C" in gpus[0][6] and "MHz" in gpus[0][7]
        await pilot.press("down")  # the next GPU: seven 1g slices
        await pilot.pause()
        assert detail.gpu_index == 1
        await pilot.press("down")
        await pilot.pause()
        assert text_of(detail.query_one("#gpu-panel", Static)).count("1g.10gb") >= 7
        await pilot.press("a")
        await pilot.pause()
        assert len(table_rows(app, "#proc-table")) == 10
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        # nodes -> node
        await command(pilot, "nodes")
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen) and app.screen.node == "sim-chat-01"
        await pilot.press("escape")
        # tenants -> g: the team's GPUs in the grid (Enter: its processes, test_processes_screen)
        await command(pilot, "tenants")
        await pilot.press("g")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        assert app.screen.filter is not None and app.screen.filter.text == "robotics"
        assert "sim-robotics-01" in grid_text(app) and "sim-vision-01" not in grid_text(app)

    run(app, script)


def test_sort_keys_and_grouping(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "nodes")
        await pilot.press("U")  # Shift-U: busiest first
        await pilot.pause()
        names = [r[0] for r in table_rows(app)]
        assert names[0] == "sim-speech-01" and "sort util" in status(app)
        await pilot.press("U")  # again: reversed
        await pilot.pause()
        assert [r[0] for r in table_rows(app)][-1] == "sim-speech-01"
        assert "reversed" in status(app)
        await command(pilot, "tenants")
        await pilot.press("N")
        await pilot.pause()
        assert [r[0] for r in table_rows(app)] == sorted(r[0] for r in table_rows(app))
        await command(pilot, "gpus")
        await pilot.press("g")
        await pilot.pause()
        assert "fleet by node" in text_of(app.screen.query_one(TopBar))
        assert "▌" not in grid_text(app)  # no team headers
        await pilot.press("I")  # most idle first
        await pilot.pause()
        assert grid_text(app).splitlines()[0].lstrip("● ").startswith("sim-robotics-01")

    run(app, script)


def test_unreachable_node_shown_with_age_and_reason_then_recovered(
    make_app: AppFactory, source: SimSource, clock: Clock
) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        clock.advance(5)
        source.sample()
        source.set_state("sim-speech-01", UNREACHABLE, "connection refused")
        clock.advance(12)
        app.publish(app.feed.build())
        await pilot.pause()
        grid = grid_text(app)
        line = next(s for s in grid.splitlines() if "sim-speech-01" in s)
        assert "✖" in line and "unreachable for 12s, data 12s old · connection refused" in line
        assert "1 unreachable" in status(app)
        await command(pilot, "events")
        rows = table_rows(app)
        assert rows[0][2:] == ["sim-speech-01", "unreachable", "connection refused"]
        source.recover("sim-speech-01")
        app.publish(app.feed.build())
        await pilot.pause()
        rows = table_rows(app)
        assert [r[3] for r in rows[:2]] == ["back", "unreachable"]
        await command(pilot, "gpus")
        line = next(s for s in grid_text(app).splitlines() if "sim-speech-01" in s)
        assert "●" in line and "unreachable" not in line
        assert "0 unreachable" in status(app)

    run(app, script)
    assert source.views["sim-speech-01"].state == LIVE


def test_hidden_screens_do_no_work(make_app: AppFactory, source: SimSource, clock: Clock) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        fleet = app.screen
        assert isinstance(fleet, FleetScreen)
        await command(pilot, "tenants")
        tenants = app.screen
        assert isinstance(tenants, TenantsScreen)
        drawn, lines = fleet.renders, fleet.query_one(FleetGrid).draws
        for _ in range(5):
            clock.advance(1)
            source.sample()
            app.publish(app.feed.build())
            await pilot.pause()
        assert fleet.renders == drawn and fleet.query_one(FleetGrid).draws == lines
        assert app.fleet_state is not None and tenants.shown_version == app.fleet_state.version
        await command(pilot, "gpus")
        assert fleet.renders == drawn + 1  # once, the latest state, on coming back
        assert fleet.shown_version == tenants.shown_version

    run(app, script)


def test_readonly_is_shown_and_disables_changes(make_app: AppFactory) -> None:
    app = make_app(readonly=True, destructive=frozenset({"move_gpus"}))

    async def script(pilot: Pilot[None]) -> None:
        assert "READONLY" in text_of(app.screen.query_one(TopBar)) and "READONLY" in status(app)
        assert app.check_action("move_gpus", ()) is False
        assert app.screen.check_action("move_gpus", ()) is False
        assert app.check_action("help", ()) is True
        assert not app.allowed("move_gpus")
        assert "read-only: move gpus is disabled" in status(app)

    run(app, script)
    writable = make_app(destructive=frozenset({"move_gpus"}))

    async def script2(pilot: Pilot[None]) -> None:
        assert writable.allowed("move_gpus") and "READONLY" not in status(writable)

    run(writable, script2)


def test_the_feed_runs_in_the_background(make_app: AppFactory, source: SimSource, clock: Clock) -> None:
    """With a short period the feed publishes on its own; ctrl-c quits."""
    source.auto = True
    app = make_app(period=0.25)

    async def script(pilot: Pilot[None]) -> None:
        first = app.published
        await pilot.pause(1.0)
        assert app.published >= first + 2
        assert app.fleet_state is not None and app.fleet_state.snapshot.count(LIVE) == 8
        await pilot.press("ctrl+c")

    run(app, script)
    assert not app.is_running
