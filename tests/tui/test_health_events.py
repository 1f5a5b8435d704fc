"""GPU health events in the TUI (Textual's Pilot): an XID injected into a simulated node travels the
agent's path (its event source, node/health.py) into the sample, and the `:events` screen lists it
with its meaning, per node, GPU and MIG instance, newest first; Enter opens that GPU, whose detail
shows the XID count."""

from __future__ import annotations

import re

from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.simfleet.source import SimSource
from gpuops.tui.screens.detail import DetailScreen
from tests.tui.conftest import AppFactory, Clock
from tests.tui.test_pilot import command, run, table_rows, text_of


def test_injected_xids_on_the_events_screen_and_the_gpu_detail(
    make_app: AppFactory, source: SimSource, clock: Clock
) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        await command(pilot, "events")
        assert not [r for r in table_rows(app) if r[3].startswith(("XID", "ECC"))]
        clock.advance(5)
        source.inject_event("sim-chat-01", "xid", 3, xid=79)
        source.inject_event("sim-chat-01", "ecc_single_bit", 1)
        source.sample()
        clock.advance(5)
        source.inject_event("sim-platform-01", "xid", 0, xid=94, gpu_instance_id=2, compute_instance_id=0)
        source.inject_event("sim-platform-01", "xid", 0, xid=4242)
        source.sample()
        clock.advance(5)
        source.sample()  # the same events again: listed once
        app.publish(app.feed.build())
        await pilot.pause()
        rows = [r[2:] for r in table_rows(app)]
        assert rows[:4] == [
            ["sim-platform-01", "XID 94", "GPU 0 GI 2 CI 0: " + _meaning(94)],
            ["sim-platform-01", "XID 4242", "GPU 0: see NVIDIA's XID catalog"],
            ["sim-chat-01", "XID 79", "GPU 3: " + _meaning(79)],
            ["sim-chat-01", "ECC single-bit", "GPU 1: a corrected memory error"],
        ]
        assert all(r[1] in ("up", "live") for r in rows[4:])  # the nodes' first samples, older
        assert table_rows(app)[2][1] == "10s"  # 10 s ago
        # A filter on the meaning; then Enter opens the node at that GPU.
        await pilot.press("slash", *"bus", "enter")
        await pilot.pause()
        assert [r[3] for r in table_rows(app)] == ["XID 79"]
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DetailScreen) and (screen.node, screen.gpu_index) == ("sim-chat-01", 3)
        gpus = table_rows(app, "#gpu-table")
        assert [r[-1] for r in gpus] == ["0", "0", "0", "1", "0", "0", "0", "0"]
        panel = text_of(screen.query_one("#gpu-panel", Static))
        # the label column is as wide as the panel's longest label
        assert re.search(r"XID errors +1 \(XID 79: 1\)", panel), panel

    run(app, script)


def _meaning(xid: int) -> str:
    from gpuops.views.events import XID_MEANINGS

    return XID_MEANINGS[xid]
