"""The screens at 80x24 and at 200x50 (issue 18 items 7 and 8), checked as a user reads them: the
text on the terminal, line by line. A header line is never wrapped (its parts are laid out for
the width: whole, or left out, or cut with '…'), the MIG layout keeps its slices on one line, a
team's group header keeps whole parts. Also: a failed ':' command leaves no text in the bar, and
a team's sparkline does not start from zeros recorded before its nodes answered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from rich.console import Console
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.simfleet.source import SimSource
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid, draw_line
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.tui.widgets import PromptBar, StatusBar, TeamHeader, TopBar
from gpuops.views.feed import Feed
from tests.tui.conftest import EPOCH, Clock
from tests.tui.test_snapshots import ready, scene

pytestmark = pytest.mark.timeout(90)

SIZES = [(80, 24), (200, 50)]
TEAMS = ("analytics", "chat", "platform", "research", "robotics", "speech", "vision")


def run(app: GpuopsApp, size: tuple[int, int], script: Callable[[Pilot[None]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await ready(pilot)
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 80))


def screen_lines(app: GpuopsApp) -> list[str]:
    """The terminal's text, line by line, as the user sees it."""
    console = Console(width=app.size.width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


def content_lines(widget: Static) -> list[str]:
    """The lines a Static was given (before the terminal wraps them)."""
    content = widget.content
    text = content if isinstance(content, Text) else Text(str(content))
    return text.plain.split("\n")


def assert_unwrapped(widget: Static) -> None:
    """Every line it was given fits its width: nothing is wrapped onto a line of its own."""
    width = widget.content_region.width
    for line in content_lines(widget):
        assert len(line) <= width, (type(widget).__name__, width, line)


def status(app: GpuopsApp) -> str:
    return "\n".join(content_lines(app.screen.query_one(StatusBar)))


async def command(pilot: Pilot[None], text: str) -> None:
    await pilot.press("colon", *text, "enter")
    await pilot.pause()


def assert_title_whole_or_marked(app: GpuopsApp, title: str) -> None:
    line = screen_lines(app)[0].rstrip()
    assert len(line) <= app.size.width
    shown = line.split(" │ ", 1)[1]
    # The title whole, else cut with a sign; never 'pool (silos and the'.
    assert shown.startswith(title) or (shown.endswith("…") and title.startswith(shown[:-1])), line
    assert_unwrapped(app.screen.query_one(TopBar))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_fleet_grid_and_the_lists_fit(size: tuple[int, int]) -> None:
    app = scene()

    async def script(pilot: Pilot[None]) -> None:
        width = size[0]
        header = app.screen.query_one("#team-header", TeamHeader)
        assert_unwrapped(header)  # the fleet's line: whole parts only (not 'util⏎52%')
        fleet = content_lines(header)[0]
        assert fleet.startswith("48 GPUs on 8 nodes · 25.9 busy · 18.1 idle (3.1 held)"), fleet
        assert_title_whole_or_marked(app, "fleet by team")
        # Every team's group header on the screen, each part whole (never '8 pr').
        grid = app.screen.query_one(FleetGrid)
        full = {}
        for y, line in enumerate(grid.layout_.lines):
            if line.group is not None:
                text = "".join(s.text for s in draw_line(grid.layout_, y, grid.by, grid.now, None))
                full[text.split()[0]] = text.split(" · ")
        shown = [x.rstrip() for x in screen_lines(app) if x.startswith("▌")]
        assert [x.split()[0] for x in shown] == [f"▌{t}" for t in TEAMS], shown
        for line in shown:
            parts = line.split(" · ")
            assert len(line) <= width and parts == full[line.split()[0]][: len(parts)], line

        for view, title in (("nodes", "nodes"), ("tenants", "tenants (teams)"), ("events", "events")):
            await command(pilot, view)
            assert_title_whole_or_marked(app, title)
        await command(pilot, "tenants")
        assert isinstance(app.screen, TenantsScreen)
        panel = app.screen.query_one("#tenant-panel", Static)
        assert_unwrapped(panel)  # its head breaks between parts ('· idle 8'), never inside one
        head = [x for x in content_lines(panel) if "owns" in x or x.startswith("  ")][:2]
        assert head and "owns" in head[0], head
        await command(pilot, "processes")
        note = app.screen.query_one("#processes-note", Static)
        assert_unwrapped(note)
        assert content_lines(note)[0].startswith("38 of 38 processes · 4 on held-idle GPUs or slices")

    run(app, size, script)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_mig_layout_and_the_gpu_header_fit(size: tuple[int, int]) -> None:
    """The detail of a MIG GPU (8 memory slices): the slice ruler and the boxes on one line each,
    a box's words whole or cut with '…'; the GPU's title and its sparklines unwrapped."""
    app = scene()

    async def script(pilot: Pilot[None]) -> None:
        app.screen.query_one(FleetGrid).select_node("sim-platform-01")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        panel = app.screen.query_one("#gpu-panel", Static)
        width = panel.content_region.width
        console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(panel.content)
        lines = console.export_text().splitlines()
        assert lines[0].rstrip() == "GPU 0 · NVIDIA H100 80GB HBM3" + (
            "" if width < 100 else " · GPU-e36d35b6-a447-56ca-6ead-be60a7df449e · PCI 00000000:07:00.0"
        ), lines[:2]
        if width < 100:
            assert lines[1].strip() == "GPU-e36d35b6-a447-56ca-6ead-be60a7df449e · PCI 00000000:07:00.0"
        ruler = next(i for i, x in enumerate(lines) if x.startswith("slice "))
        assert lines[ruler].split() == ["slice", *map(str, range(8))], lines[ruler]
        boxes = lines[ruler + 1 : ruler + 4]
        assert boxes[0].split() == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"], boxes
        assert boxes[1].split() == ["GI7", "60%", "GI8", "0%", "GI4", "0%", "GI2", "79%"], boxes
        owner = boxes[2].split()[0]
        assert owner == "research" or (owner.endswith("…") and "research".startswith(owner[:-1])), boxes
        assert lines[ruler + 4].strip().startswith("GI 7 1g.10gb: slice 0"), lines[ruler + 4]
        session = next(i for i, x in enumerate(lines) if x.startswith("over the session"))
        trends = lines[session + 1 : session + 5]
        titles = [x.split()[0] for x in trends]
        assert titles == ["utilization", "memory", "power", "temperature"], trends
        assert all(" now " in x for x in trends), trends

    run(app, size, script)


def test_a_failed_command_leaves_the_bar_and_says_why() -> None:
    """`:foo` closes the bar as any command does, its text gone; the status line says why; the
    next ':' opens an empty bar."""
    app = scene()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "foo")
        bar = app.screen.query_one(PromptBar)
        assert not bar.is_open
        assert "unknown command 'foo': try gpus, nodes" in status(app)
        assert "foo" not in "\n".join(screen_lines(app)[:-1])  # nowhere but the status line
        await pilot.press("colon")
        await pilot.pause()
        assert bar.is_open and app.screen.query_one("#prompt-input").value == ""  # type: ignore[attr-defined]
        await pilot.press("escape")
        await command(pilot, "nodes")  # the bar still runs commands
        assert app.current_mode == "nodes"

    run(app, (80, 24), script)


def test_a_flat_team_figure_is_a_flat_sparkline() -> None:
    """The app starts before the nodes answer (as over SSH): the first state has no data. The
    teams' history starts with the first answers, so robotics' 8 owned GPUs, which never change,
    draw a flat line, not a rise from zero."""
    clock = Clock(EPOCH + 14 * 3600)
    source = SimSource.scenario("silos", None, epoch=EPOCH, clock=clock, label="simulated (not sampled yet)")
    feed = Feed(source, source.ownership(), clock, 3600.0)
    app = GpuopsApp(feed)

    async def script(pilot: Pilot[None]) -> None:
        for _ in range(4):
            clock.advance(5)
            source.sample()
            app.publish(feed.build())
        await command(pilot, "tenants")
        await pilot.pause()
        panel = content_lines(app.screen.query_one("#tenant-panel", Static))
        owned = next(x for x in panel if x.strip().startswith("GPUs owned"))
        spark = owned.split("GPUs owned", 1)[1].split("now", 1)[0].strip()
        assert len(spark) == 4 and len(set(spark)) == 1, owned  # 4 points, one height
        assert "min       8  max       8" in owned, owned

    async def first(pilot: Pilot[None]) -> None:
        assert app.fleet_state is not None and app.fleet_state.status.live == 0  # no answers yet
        await script(pilot)

    async def main() -> None:
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(100):
                if app.fleet_state is not None:
                    break
                await pilot.pause(0.05)
            await first(pilot)

    asyncio.run(asyncio.wait_for(main(), 80))
