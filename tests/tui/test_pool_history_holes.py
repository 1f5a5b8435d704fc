"""The Pool screen over history with holes: five corrupt day files of the robotics node in the
simulated `silos` fleet (real SSH on loopback). The screen says which node has how many
unreadable buckets, and the idle silo stays idle (unreadable time is unknown, not idle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.simfleet import Launched, launch, stop
from tests.integration.test_plan_apply import gpuops
from tests.tui.test_pool_screen import open_pool, own_copy, pool_app, rows, run, settled, text_of

NODE = "sim-robotics-01"


@pytest.fixture
def holed(tmp_path: Path) -> Iterator[Launched]:
    directory = tmp_path / "fleet"
    started = launch(directory, "silos", timeout=90)
    try:
        first = gpuops("tenants", "-f", str(directory / "fleet.yaml"), "--window", "7d", "--json")
        assert first.returncode == 0, first.stderr  # every node's past recorded
        days = sorted((directory / "state" / NODE / "history").glob("hours-*.json"))
        for day in days[-6:-1]:  # inside the 7-day window; today's file its recorder rewrites
            day.write_text("{garbage")
        yield started
    finally:
        stop(directory)


def test_the_pool_screen_says_history_is_incomplete(holed: Launched, tmp_path: Path) -> None:
    app = pool_app(own_copy(holed, tmp_path))

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        await pilot.press("w")  # 24h -> 7d
        await settled(pilot, screen)
        assert screen.view is not None and screen.view.window.text == "7d"
        head = text_of(screen.query_one("#pool-head", Static))
        assert f"⚠ history incomplete: 120 buckets unreadable on {NODE} (" in head, head
        assert "readable on every node" in head
        robotics = rows(app, "#pool-teams")["robotics"]
        assert robotics[1:4] == ["8", "0", "8"], robotics  # 8 silo GPUs, 8 idle: not 2 or 3

    run(app, script)
