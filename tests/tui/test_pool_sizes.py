"""The Pool screen (`:pool`) at 80x24 and at 200x50, its GPU list's order and its progress line
while it reads the nodes' history (issue 18 items 7, 8 and 9), over the simulated `silos` fleet
on SSH as tests/tui/test_pool_screen.py drives it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.cli.tui import fleet_source
from gpuops.simfleet import Launched, launch, stop
from gpuops.tui.app import GpuopsApp
from gpuops.tui.screens.pool import PoolScreen
from gpuops.tui.table import LiveTable
from gpuops.views.feed import Feed
from gpuops.views.pool import PoolSource, PoolView
from tests.tui.test_pool_screen import open_pool, own_copy, pool_app, run, settled, status, text_of
from tests.tui.test_sizes import screen_lines

pytestmark = pytest.mark.timeout(300)

TEAMS = ("analytics", "chat", "platform", "research", "robotics", "speech", "vision")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    directory = tmp_path_factory.mktemp("pool-sizes")
    started = launch(directory, "silos", timeout=90)
    try:
        yield started
    finally:
        stop(directory)


def team_table(app: GpuopsApp) -> list[str]:
    """The team table's lines on the terminal: its header to its totals row."""
    lines = screen_lines(app)
    top = next(i for i, x in enumerate(lines) if x.startswith(" Team "))
    end = next(i for i, x in enumerate(lines) if x.startswith(" all teams"))
    return lines[top : end + 1]


def assert_head_unwrapped(screen: PoolScreen) -> None:
    head = screen.query_one("#pool-head", Static)
    width = head.content_region.width
    for line in text_of(head).rstrip("\n").split("\n"):
        assert len(line.rstrip()) <= width, (width, line)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_team_table_is_there_whole_at_both_sizes(
    sim: Launched, tmp_path: Path, size: tuple[int, int]
) -> None:
    """Every team and the totals, with the table's last column (p95) on the screen, before and
    while a proposal is reviewed; the pool's lines unwrapped."""
    app = pool_app(own_copy(sim, tmp_path))

    def check(reviewing: bool) -> None:
        table = team_table(app)
        assert [x.split()[0] for x in table[1:-1]] == list(TEAMS), table
        header = table[0].split()
        if size[0] >= 160:
            assert header[-2:] == ["Use", "p95"] and "Silo used" in table[0], table[0]
        else:  # the narrow table: every column on the screen, none behind a scroll
            assert header == ["Team", "Silo", "idle", "│", "Pool", "Guar.", "idle", "│", "Borr.", "p95"], (
                table[0]
            )
        for line in table:
            assert len(line) <= size[0] and line.count("│") == 2, line
        if reviewing:
            assert "→" in "\n".join(table)  # before → after: the point of the table while reviewing

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        assert_head_unwrapped(screen)
        check(reviewing=False)
        await pilot.press("p")
        await settled(pilot, screen)
        assert screen.review is not None
        check(reviewing=True)
        assert screen.query_one("#pool-review").region.height >= 6  # and the plan keeps its room
        assert screen.query_one("#pool-gpus").region.height >= 4  # three GPUs to mark more
        assert_head_unwrapped(screen)
        await pilot.press("c", "q")

    run(app, script, size=size)


def test_the_gpu_list_is_in_node_order_as_its_label_says(sim: Launched, tmp_path: Path) -> None:
    """'sort node' (the default): by node name and GPU index, not fleet.yaml's order."""
    app = pool_app(own_copy(sim, tmp_path))

    async def script(pilot: Pilot[None]) -> None:
        await open_pool(pilot)
        assert "sort node" in status(app)
        table = app.screen.query_one("#pool-gpus", LiveTable)
        keys = [table.rows[i][0] for i in range(table.row_count)]
        order = [(k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])) for k in keys]
        assert len(keys) == 48 and order == sorted(order), keys[:10]
        await pilot.press("N")  # again: reversed
        await pilot.pause()
        keys = [table.rows[i][0] for i in range(table.row_count)]
        assert "sort node (reversed)" in status(app) and keys[0] == "sim-vision-02:7", keys[:3]
        await pilot.press("q")

    run(app, script)


class WatchedPoolSource(PoolSource):
    """Reads one node at a time and, after the screen was told of each node, notes what the
    screen shows then; each node's answer comes 0.15 s after the last (a slow fleet's pace, and
    more than the screen's 0.1 s between redraws)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, parallel=1)
        self.shown: list[tuple[int, int, str, str]] = []
        self.app: GpuopsApp | None = None

    async def load(self, *args: Any, **kwargs: Any) -> PoolView:
        told = self.progress
        if told is None:
            return await super().load(*args, **kwargs)

        def watched(count: int, total: int) -> None:
            if count:
                time.sleep(0.15)
            told(count, total)
            assert self.app is not None
            head = text_of(self.app.screen.query_one("#pool-head", Static))
            self.shown.append((count, total, head, status(self.app)))

        self.progress = watched
        try:
            return await super().load(*args, **kwargs)
        finally:
            self.progress = told


def test_reading_the_history_shows_progress(sim: Launched, tmp_path: Path) -> None:
    """While the nodes' history is read, the screen shows how many nodes are read of how many, as
    the CLI's progress bar does: a line under the step under way, and the count in the status
    line; both go once the history is read."""
    path = own_copy(sim, tmp_path)
    source, ownership = fleet_source(path, "1s", "simulated silos fleet (pool test)")
    pool = WatchedPoolSource(path)
    app = GpuopsApp(Feed(source, ownership, period=1.0), pool=pool)
    pool.app = app

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        assert [(c, t) for c, t, _, _ in pool.shown] == [(n, 8) for n in range(9)]
        for count, _, head, line in pool.shown:
            progress = [x.strip() for x in head.splitlines() if x.strip().startswith("history ")]
            assert len(progress) == 1 and f" {count} of 8 nodes · " in progress[0], head
            assert "━" * 5 in progress[0] or count < 2, progress  # the bar fills
            assert f"⟳ reading… {count}/8" in line, line
        assert screen.reading is None
        head = text_of(screen.query_one("#pool-head", Static))
        assert "history " not in head and "⟳" not in head and "⟳" not in status(app)  # gone once read
        await pilot.press("q")

    run(app, script)
