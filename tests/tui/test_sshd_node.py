"""A real node behind Debian's OpenSSH sshd (the agent pushed as a zipapp), followed by the TUI's
collector: killed mid-test it turns unreachable on the screen, with its reason, and comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from gpuops.fleet.collector import Collector
from gpuops.fleet.remote_agent import AgentLaunch
from gpuops.fleet.session import NodeTarget
from gpuops.fleet.ssh import SshTarget
from gpuops.tenancy.ownership import Ownership
from gpuops.tui.app import GpuopsApp
from gpuops.tui.screens.events import EventsScreen
from gpuops.views.feed import Feed
from tests.sshtest.sshd import Sshd
from tests.tui.test_pilot import grid_text, status, table_rows

pytestmark = [pytest.mark.usefixtures("sshtest_leak_check"), pytest.mark.timeout(90)]

SIM = AgentLaunch(mode="push", python="python3", backend="sim")


def _target(server: Sshd) -> SshTarget:
    return SshTarget(
        host=server.host,
        port=server.port,
        user=server.user,
        identity_files=(str(server.client_key),),
        known_hosts=str(server.known_hosts),
        use_ssh_config=False,
        connect_timeout=3.0,
        login_timeout=5.0,
    )


async def _until(pilot: Pilot[None], check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}\n{grid_text(pilot.app)}")  # type: ignore[arg-type]
        await pilot.pause(0.2)


def _line(app: GpuopsApp, node: str) -> str:
    return next((s for s in grid_text(app).splitlines() if node in s), "")


def test_a_killed_node_turns_unreachable_and_recovers(sshd_loopback: Sshd) -> None:
    collector = Collector(
        [NodeTarget("gpu-a", _target(sshd_loopback), SIM, owner="vision")],
        interval=0.3,
        silence_limit=3.0,
        backoff_max=1.0,
        label="one sshd node",
    )
    ownership = Ownership(("vision",), lambda node, index: "vision")
    app = GpuopsApp(Feed(collector, ownership, period=0.25))

    async def script(pilot: Pilot[None]) -> None:
        await _until(pilot, lambda: "● gpu-a" in _line(app, "gpu-a"), 40, "gpu-a live")
        assert "1 live" in status(app) and "▌vision" in grid_text(app)
        sshd_loopback.kill()  # sshd and the session under it, like a crashed host
        await _until(pilot, lambda: "✖ gpu-a" in _line(app, "gpu-a"), 20, "gpu-a unreachable")
        line = _line(app, "gpu-a")
        assert "unreachable for " in line and "old · " in line  # how long, age of the data, reason
        assert "1 unreachable" in status(app)
        sshd_loopback.restart()
        await _until(pilot, lambda: "● gpu-a" in _line(app, "gpu-a"), 30, "gpu-a live again")
        await pilot.press("colon", *"events", "enter")
        await pilot.pause()
        assert isinstance(app.screen, EventsScreen)
        kinds = [row[3] for row in table_rows(app) if row[2] == "gpu-a"]
        assert kinds[:2] == ["back", "unreachable"]
        await pilot.press("q")

    async def main() -> None:
        async with app.run_test(size=(140, 40)) as pilot:
            await script(pilot)

    asyncio.run(main())
    assert not collector._tasks  # the collector was stopped with the app
