"""The TUI over the PromQL fleet source (Textual's Pilot): the title bar says which source it
shows and how it is doing — live, "source unreachable" when Prometheus stops, live again when it
returns — and a Prometheus that accepts connections but never answers is "source unreachable:
... timeout" within the source's timeout, while the screens keep answering keys."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from gpuops.fleet.promql.source import PromSource
from gpuops.tenancy.ownership import Ownership
from gpuops.tui.app import GpuopsApp
from gpuops.tui.screens.help import HelpScreen
from gpuops.tui.widgets import TopBar
from gpuops.views.feed import Feed
from tests.promtest.prometheus import Prometheus, prometheus_unavailable_reason
from tests.tui.test_pilot import text_of

SIZE = (160, 40)
pytestmark = pytest.mark.timeout(120)


def _title(app: GpuopsApp) -> str:
    return text_of(app.screen.query_one(TopBar))


async def _until(pilot: Pilot[None], app: GpuopsApp, text: str, within: float) -> float:
    """Seconds until the title shows `text`; fails after `within`."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        await pilot.pause(0.05)
        if text in _title(app):
            return time.monotonic() - started
    raise AssertionError(f"{text!r} not in the title after {within}s: {_title(app)!r}")


@contextlib.contextmanager
def frozen_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a hung Prometheus)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])  # kept open, never read from, never written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        listener.close()


def _app(url: str, interval: float, timeout: float) -> GpuopsApp:
    source = PromSource(url, interval=interval, timeout=timeout)
    return GpuopsApp(Feed(source, Ownership()))


@pytest.mark.skipif(prometheus_unavailable_reason() is not None, reason=str(prometheus_unavailable_reason()))
def test_the_title_says_live_then_source_unreachable_then_live(tmp_path: Path) -> None:
    prom = Prometheus(tmp_path / "prom").start()
    try:
        app = _app(prom.url, interval=0.5, timeout=1.0)

        async def main() -> None:
            async with app.run_test(size=SIZE) as pilot:
                await _until(pilot, app, f"Prometheus {prom.url}", 10)
                await pilot.pause(1.0)
                assert "unreachable" not in _title(app), _title(app)
                await asyncio.to_thread(prom.stop)
                took = await _until(pilot, app, "source unreachable:", 5)
                assert took <= 2 * 0.5 + 1.0, took  # two intervals, plus a round's timeout
                assert "connection refused" in _title(app), _title(app)
                await asyncio.to_thread(prom.restart)
                started = time.monotonic()
                while "unreachable" in _title(app):
                    assert time.monotonic() - started < 5, _title(app)
                    await pilot.pause(0.05)
                assert f"Prometheus {prom.url}" in _title(app)

        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        prom.stop()


# Times a key's answer against the clock: alone (make test's serial phase), where a second is a
# freeze and not four workers sharing two cores (it took 1.7 s so once).
@pytest.mark.serial
def test_a_frozen_prometheus_is_a_timeout_not_a_freeze() -> None:
    with frozen_server() as port:
        url = f"http://127.0.0.1:{port}"
        timeout = 0.6
        app = _app(url, interval=0.5, timeout=timeout)

        async def main() -> None:
            async with app.run_test(size=SIZE) as pilot:
                took = await _until(pilot, app, "source unreachable:", 3 * timeout + 1)
                assert took <= timeout + 1.0, took
                assert "timeout" in _title(app), _title(app)
                # The screens still answer keys while every request hangs.
                pressed = time.monotonic()
                await pilot.press("question_mark")
                await pilot.pause(0.1)
                assert isinstance(app.screen, HelpScreen)
                assert time.monotonic() - pressed < 1.0
                await pilot.press("escape")

        asyncio.run(asyncio.wait_for(main(), 60))
