"""The grid's layout on small and full terminals (issue 18 item 7): a cell's two figures never run
together, and a team's header line keeps whole parts when the terminal is too narrow for all."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace

from rich.console import Console
from textual.pilot import Pilot

from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid, draw_line
from tests.tui.conftest import AppFactory
from tests.tui.test_pilot import grid_text


def _run(app: GpuopsApp, size: tuple[int, int], script: Callable[[Pilot[None]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 60))


def screen_lines(app: GpuopsApp) -> list[str]:
    """The terminal's text, line by line, as the user sees it."""
    width = app.size.width
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text().splitlines()


def test_a_full_memory_cell_keeps_its_figures_apart(make_app: AppFactory, source) -> None:  # type: ignore[no-untyped-def]
    view = source.views["sim-chat-01"]
    assert view.sample is not None
    gpus = list(view.sample.gpus)
    first = gpus[0].sample
    assert first is not None
    gpus[0] = replace(gpus[0], sample=replace(first, memory_used_bytes=first.memory_total_bytes))
    source.views["sim-chat-01"] = replace(view, sample=replace(view.sample, gpus=tuple(gpus)))
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        line = next(x for x in grid_text(app).splitlines() if "sim-chat-01" in x)
        cells = line.split("sim-chat-01", 1)[1]
        assert not re.search(r"\d{4}", cells), line  # ' 96100' read as one number
        assert "MAX" in cells, line

    _run(app, (140, 45), script)


def test_team_headers_keep_whole_parts_at_80_columns(make_app: AppFactory) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        grid = app.screen.query_one(FleetGrid)
        full = {}
        for y, line in enumerate(grid.layout_.lines):
            if line.group is not None:
                text = "".join(s.text for s in draw_line(grid.layout_, y, grid.by, grid.now, None))
                full[text.split()[0]] = text
        shown = [x.rstrip() for x in screen_lines(app) if x.startswith("▌")]
        assert len(shown) == len(full) == 7, shown
        for line in shown:
            assert len(line) <= 80
            parts = line.split(" · ")
            whole = full[line.split()[0]].split(" · ")
            # Each shown part is one of the header's parts, whole (not '7 pr' of '7 processes').
            assert parts == whole[: len(parts)], (line, whole)

    _run(app, (80, 24), script)
