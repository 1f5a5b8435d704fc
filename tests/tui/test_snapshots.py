"""Every screen as an SVG snapshot (pytest-textual-snapshot), with deterministic data: the silos
fleet simulated from 06:00 to 14:00 UTC on a fixed clock, one node unreachable, one stale, an
agent error, XID and ECC events. Update after an intended change with
`pytest tests/tui --snapshot-update` and look at the SVGs under tests/tui/__snapshots__/ before
committing them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from gpuops.fleet.source import STALE, UNREACHABLE
from gpuops.tui.app import GpuopsApp
from gpuops.tui.grid import FleetGrid
from gpuops.tui.table import LiveTable
from gpuops.views.feed import Feed
from tests.tui.conftest import EPOCH, Clock, silos

pytestmark = pytest.mark.timeout(60)

SIZE = (140, 45)
Compare = Callable[..., bool]


def scene() -> GpuopsApp:
    clock = Clock(EPOCH + 6 * 3600)
    source = silos(clock)
    feed = Feed(source, source.ownership(), clock, period=3600)
    while clock() < EPOCH + 14 * 3600:
        clock.advance(300)
        source.sample()
        feed.build()
    source.set_state("sim-speech-01", UNREACHABLE, "connection refused")
    source.agent_error("sim-research-01", "sample failed: GPU 2: GPU_IS_LOST")
    # GPU health events, carried by the next samples as an agent's NVML events are.
    source.inject_event("sim-chat-01", "xid", 3, xid=79)
    source.inject_event("sim-platform-01", "xid", 0, xid=94, gpu_instance_id=2, compute_instance_id=0)
    source.inject_event("sim-vision-01", "ecc_double_bit", 5)
    clock.advance(8)
    source.sample([n for n in source.views if n != "sim-analytics-01"])
    source.set_state("sim-analytics-01", STALE, "no sample for 4s")
    clock.advance(4)
    return GpuopsApp(feed)


async def ready(pilot: Pilot[None]) -> None:
    """Until the feed's first state is on the screen."""
    app = pilot.app
    assert isinstance(app, GpuopsApp)
    for _ in range(100):
        if app.fleet_state is not None:
            break
        await pilot.pause(0.05)
    await pilot.pause()


def test_fleet_by_team(snap_compare: Compare) -> None:
    assert snap_compare(scene(), run_before=ready, terminal_size=SIZE)


def test_fleet_by_node_sorted_by_idle(snap_compare: Compare) -> None:
    assert snap_compare(scene(), run_before=ready, press=["g", "I"], terminal_size=SIZE)


def test_fleet_filtered(snap_compare: Compare) -> None:
    press = ["slash", *"chat|platform", "enter"]
    assert snap_compare(scene(), run_before=ready, press=press, terminal_size=SIZE)


def test_nodes(snap_compare: Compare) -> None:
    press = ["colon", *"nodes", "enter"]
    assert snap_compare(scene(), run_before=ready, press=press, terminal_size=SIZE)


def test_tenants(snap_compare: Compare) -> None:
    press = ["colon", *"tenants", "enter", "down"]
    assert snap_compare(scene(), run_before=ready, press=press, terminal_size=SIZE)


def test_events(snap_compare: Compare) -> None:
    press = ["colon", *"events", "enter"]
    assert snap_compare(scene(), run_before=ready, press=press, terminal_size=SIZE)


def test_node_and_mig_gpu_detail(snap_compare: Compare) -> None:
    async def open_platform(pilot: Pilot[None]) -> None:
        await ready(pilot)
        pilot.app.screen.query_one(FleetGrid).select_node("sim-platform-01")
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(scene(), run_before=open_platform, terminal_size=(140, 50))


def test_help(snap_compare: Compare) -> None:
    assert snap_compare(scene(), run_before=ready, press=["question_mark"], terminal_size=(140, 60))


def test_processes_of_a_team(snap_compare: Compare) -> None:
    """The drill-down from :tenants: research's processes, two of them on held-idle GPUs."""

    async def drill(pilot: Pilot[None]) -> None:
        await ready(pilot)
        await pilot.press("colon", *"tenants", "enter")
        await pilot.pause()
        pilot.app.screen.query_one(LiveTable).move_to_key("research")
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(scene(), run_before=drill, terminal_size=SIZE)
