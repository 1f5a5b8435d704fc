"""The fleet grid at a large simulated fleet makes cells only for the lines on screen (issue 22):
rows past the first screen appear, right, after paging and jumping to the end; the fleet line and
the group headers equal the full computation over every node; a filter still sees every node."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from textual.pilot import Pilot

from gpuops.simfleet.source import SimSource
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid, draw_line, layout_grid
from gpuops.tui.screens.fleet import FleetScreen
from gpuops.tui.widgets import TeamHeader
from gpuops.views.feed import Feed
from gpuops.views.grid import group_rows, totals
from gpuops.views.nodes import node_rows
from tests.tui.conftest import EPOCH, Clock

SIZE = (140, 45)
NODES = 150  # the `large` scenario: about 1000 GPUs, far more lines than a screen
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def large(clock: Clock) -> SimSource:
    source = SimSource.scenario("large", NODES, epoch=EPOCH, clock=clock, label="large (test)")
    source.sample()
    return source


def _text(segments: list[object]) -> str:
    return "".join(s.text for s in segments).rstrip()  # type: ignore[attr-defined]


def _screen_lines(grid: FleetGrid) -> list[str]:
    """What the grid shows now, line by line (its own drawing, cursor and all)."""
    height = grid.scrollable_content_region.height
    return [_text(list(grid.render_line(y))) for y in range(height)]


def _expected_lines(app: GpuopsApp, grid: FleetGrid) -> list[str]:
    """The same lines from every node's full row (cells made for all, as before issue 22)."""
    state = app.fleet_state
    assert state is not None
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    full = node_rows(state.snapshot, state.ownership)
    groups = group_rows(full, screen.by, screen.sort, screen.reverse, screen.filter, state.time)
    layout = layout_grid(groups, grid.layout_.width, screen.by)
    assert len(layout.lines) == len(grid.layout_.lines)
    top = round(grid.scroll_offset.y)
    height = grid.scrollable_content_region.height
    cursor = grid.cursor
    out = []
    for y in range(top, top + height):
        if y >= len(layout.lines):
            out.append("")
            continue
        out.append(_text(draw_line(layout, y, screen.by, state.time, cursor)))
    return out


def _same(shown: list[str], want: list[str]) -> None:
    assert [s.rstrip() for s in shown] == [w.rstrip() for w in want]


def test_a_scrolled_grid_shows_the_right_rows_and_makes_only_those(large: SimSource, clock: Clock) -> None:
    app = GpuopsApp(Feed(large, large.ownership(), clock, 3600.0))

    async def script(pilot: Pilot[None]) -> None:
        grid = app.screen.query_one(FleetGrid)
        state = app.fleet_state
        assert state is not None and len(state.rows) == NODES
        assert len(grid.layout_.lines) > 3 * grid.scrollable_content_region.height
        _same(_screen_lines(grid), _expected_lines(app, grid))
        made = sum(r.made for r in state.rows)
        assert 0 < made < NODES // 2  # the first screen's nodes (and the cursor's), not the fleet

        for _ in range(3):
            await pilot.press("pagedown")
            await pilot.pause()
        assert grid.scroll_offset.y > 0
        _same(_screen_lines(grid), _expected_lines(app, grid))

        # A new update while scrolled: the rows in view are made from the new state.
        clock.advance(1)
        large.sample()
        app.publish(app.feed.build())
        await pilot.pause()
        state = app.fleet_state
        assert state is not None
        _same(_screen_lines(grid), _expected_lines(app, grid))
        assert sum(r.made for r in state.rows) < NODES // 2

        await pilot.press("end")
        await pilot.pause()
        _same(_screen_lines(grid), _expected_lines(app, grid))
        last = grid.layout_.positions.rows[-1]
        assert last.made and any(last.name in line for line in _screen_lines(grid))

        await pilot.press("g")  # one group of every node, sorted by utilization
        await pilot.press("U")
        await pilot.pause()
        await pilot.press("home")
        await pilot.press("pagedown")
        await pilot.pause()
        _same(_screen_lines(grid), _expected_lines(app, grid))

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 100))


def test_header_counts_equal_the_full_computation(large: SimSource, clock: Clock) -> None:
    app = GpuopsApp(Feed(large, large.ownership(), clock, 3600.0))

    async def script(pilot: Pilot[None]) -> None:
        for _ in range(2):
            state = app.fleet_state
            assert state is not None
            fleet = app.screen.query_one(TeamHeader).fleet
            assert fleet is not None
            full = node_rows(state.snapshot, state.ownership)
            want = totals(full)
            assert fleet.gpus > 900 and fleet.busy > 0 and fleet.idle > 0 and fleet.held > 0
            assert replace(fleet, util=None) == replace(want, util=None)  # counts, sums: exact
            assert fleet.util == pytest.approx(want.util)
            # every group header too (the groups' totals come from the same light figures)
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            shown = app.screen.query_one(FleetGrid).groups
            expected = group_rows(full, screen.by, screen.sort, screen.reverse, screen.filter, state.time)
            assert [g.team for g in shown] == [g.team for g in expected]
            for g, e in zip(shown, expected, strict=True):
                assert replace(g.totals, util=None) == replace(e.totals, util=None), g.team
                assert g.totals.util == pytest.approx(e.totals.util), g.team
            clock.advance(1)
            large.sample()
            app.publish(app.feed.build())
            await pilot.pause()

        # A filter matches the words of every node's cells (tenants, users): all rows made then.
        await pilot.press("slash", *"inference", "enter")
        await pilot.pause()
        state = app.fleet_state
        assert state is not None
        full = node_rows(state.snapshot, state.ownership)
        screen = app.screen
        assert isinstance(screen, FleetScreen) and screen.filter is not None
        want = group_rows(full, screen.by, screen.sort, screen.reverse, screen.filter, state.time)
        shown = app.screen.query_one(FleetGrid).groups
        assert [(g.team, [r.name for r in g.rows]) for g in shown] == [
            (g.team, [r.name for r in g.rows]) for g in want
        ]

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 100))
