"""Attribution warnings reach the operator: a plugin that cannot be loaded and a process whose user
is in no team (on a GPU nobody owns, so nobody claims it) are listed on the events screen, each
distinct warning once however many refreshes see it, and the tenants screen says that there are
some. The node is the simulated one of test_attribution_tui.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops import attributors
from gpuops.fleet.source import FleetEvent
from gpuops.spec import parse_fleet
from gpuops.tenancy.ownership import Ownership
from gpuops.tui.app import GpuopsApp
from gpuops.tui.screens.events import EventsScreen
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.tui.table import LiveTable
from gpuops.views.feed import Feed
from tests.tui.conftest import NOON, Clock
from tests.tui.test_attribution_tui import OneNode, _cell, _rows

pytestmark = pytest.mark.timeout(60)

ATTRIBUTION = "attribution"  # what the events screen says such a warning is

FLEET = """\
version: 1
teams:
  vision: {users: [alice]}
  nlp: {users: [bob], groups: [linguists]}
  platform: {}
nodes:
  - {host: sim-attr-01, gpus: {"0": vision}}
attribution:
  order: [limiter, broken, user, group, owner]
"""


@pytest.fixture
def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed attributor (a real entry point) whose module fails on import."""
    (tmp_path / "tui_broken_attributor.py").write_text("import no_such_module_for_gpuops_tests\n")
    info = tmp_path / "tui_broken_attributor-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tui-broken-attributor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gpuops.attributors]\nbroken = tui_broken_attributor:Broken\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    attributors.refresh()
    yield
    attributors.refresh()


@pytest.mark.usefixtures("broken_plugin")
def test_attribution_warnings_on_the_events_and_tenants_screens() -> None:
    clock = Clock(NOON)
    source = OneNode(clock)
    ownership = Ownership.from_fleet(parse_fleet(FLEET, "fleet.yaml"))
    app = GpuopsApp(Feed(source, ownership, clock, 3600.0))
    seen: dict[str, object] = {}

    async def script(pilot: Pilot[None]) -> None:
        await pilot.pause()
        # many refreshes see the same problems: still one warning each
        for _ in range(5):
            clock.advance(1)
            app.publish(app.feed.build())
        await pilot.press("colon", *"tenants", "enter")
        await pilot.pause()
        assert isinstance(app.screen, TenantsScreen)
        notice = app.screen.query_one("#tenants-notice", Static)
        seen["notice"] = _cell(notice.content) if notice.display else ""
        await pilot.press("colon", *"events", "enter")
        await pilot.pause()
        assert isinstance(app.screen, EventsScreen)
        seen["events"] = _rows(app, "#events-table")
        # Enter on a warning about no node in particular opens nothing (there is no node "-")
        fleet_wide = next(i for i, row in enumerate(seen["events"]) if row[2] == "-")  # type: ignore[union-attr]
        app.screen.query_one("#events-table", LiveTable).move_cursor(fleet_wide)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, EventsScreen)

    async def main() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 60))

    events = seen["events"]
    assert isinstance(events, list)
    # Time, Ago, Node, What, Message
    warnings = [row for row in events if row[3] == ATTRIBUTION]
    assert len(warnings) == 2, warnings
    by_node = {row[2]: row[4] for row in warnings}
    assert by_node["-"].startswith("attributor 'broken' (tui_broken_attributor:Broken) cannot be loaded")
    # eve on GPU 1, which nobody owns: unattributed; eve on vision's GPU 0 is the owner's, no warning
    assert by_node["sim-attr-01"].startswith("a process of user eve belongs to no team")
    assert "on GPU 1" in by_node["sim-attr-01"]
    notice = seen["notice"]
    assert isinstance(notice, str)
    assert notice.startswith("⚠ 2 attribution warnings (:events lists them)"), notice


def test_each_distinct_warning_once_and_a_bounded_list() -> None:
    """The list stops growing at its limit and says how many more there were."""
    from gpuops.views.feed import AttributionWarnings

    warnings = AttributionWarnings(limit=3)
    for i in range(10):
        for _ in range(3):  # seen again and again: once
            warnings._add(f"user\0u{i}", FleetEvent(float(i), "n", ATTRIBUTION, f"user u{i}"))
    events = warnings.events()
    assert [e.message for e in events[:3]] == ["user u0", "user u1", "user u2"]
    assert len(events) == 4 and events[3].message.startswith("7 more distinct attribution warning(s)")
