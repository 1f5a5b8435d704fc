"""AMD partition modes in the TUI, driven by keys (Textual's Pilot) over the simulated `mixed`
fleet (NVIDIA and MI300X nodes) on a fixed clock: the grid's cell under the cursor, a filter on
the mode, the node's GPU table and GPU panel, and the AMD node's detail as an SVG snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.simfleet.source import SimSource
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.widgets import Inspector
from gpuops.views.feed import Feed
from tests.tui.conftest import EPOCH, NOON, Clock
from tests.tui.test_pilot import SIZE, grid_text, table_rows, text_of

pytestmark = pytest.mark.timeout(60)
Compare = Callable[..., bool]
NODE = "sim-chat-02"  # eight MI300X: four CPX/NPS4, two DPX/NPS1, two SPX/NPS1


def mixed_app() -> GpuopsApp:
    clock = Clock(NOON)
    source = SimSource.scenario("mixed", epoch=EPOCH, clock=clock, label="simulated mixed fleet (test)")
    source.sample()
    return GpuopsApp(Feed(source, source.ownership(), clock, 3600.0))


async def ready(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, GpuopsApp)
    for _ in range(100):
        if app.fleet_state is not None:
            break
        await pilot.pause(0.05)
    await pilot.pause()


def test_grid_and_detail_show_the_amd_nodes_partition_modes() -> None:
    app = mixed_app()

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            grid = app.screen.query_one(FleetGrid)
            grid.select_node(NODE)
            await pilot.pause()
            inspector = text_of(app.screen.query_one(Inspector))
            assert f"{NODE}" in inspector and "GPU 0 MI300X" in inspector
            assert "partition CPX/NPS4" in inspector, inspector
            for _ in range(4):
                await pilot.press("right")
            await pilot.pause()
            assert "GPU 4 MI300X · partition DPX/NPS1" in text_of(app.screen.query_one(Inspector))
            # The modes are words a filter finds, as MIG profiles are.
            await pilot.press("slash", *"NPS4", "enter")
            await pilot.pause()
            shown = grid_text(app)
            assert NODE in shown and "sim-vision-02" not in shown and "sim-chat-01" not in shown
            await pilot.press("escape")
            await pilot.pause()
            app.screen.query_one(FleetGrid).select_node(NODE)
            await pilot.press("enter")
            await pilot.pause()
            detail = app.screen
            assert isinstance(detail, DetailScreen) and detail.node == NODE
            gpus = table_rows(app, "#gpu-table")
            assert [row[9] for row in gpus] == ["CPX (8) / NPS4"] * 4 + ["DPX (2) / NPS1"] * 2 + [
                "SPX (1) / NPS1"
            ] * 2
            panel = text_of(detail.query_one("#gpu-panel", Static))
            assert "Partition: compute CPX (8 logical GPUs) · memory NPS4" in panel, panel
            assert "takes compute SPX/DPX/QPX/CPX, memory NPS1/NPS4" in panel
            assert "CUs" in panel and "304" in panel and "MIG: not supported" not in panel
            header = text_of(detail.query_one("#node-header", Static))
            assert "driver 6.8.5 · ROCm 6.2.0" in header, header

    asyncio.run(asyncio.wait_for(main(), 60))


def test_amd_node_detail_snapshot(snap_compare: Compare) -> None:
    async def open_node(pilot: Pilot[None]) -> None:
        await ready(pilot)
        pilot.app.screen.query_one(FleetGrid).select_node(NODE)
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(mixed_app(), terminal_size=SIZE, run_before=open_node)
