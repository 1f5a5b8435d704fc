"""Issue 18 item 3 through the screen (Pilot): the GPU detail's sparklines over the session (a
bounded ring per GPU, one point per sample), health fields from the agent's events (ECC, clock
changes) and, where the agent sends nothing, the reason; MPS and limiter say why they are empty."""

from __future__ import annotations

from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.simfleet.source import SimSource
from gpuops.tui.screens.detail import DetailScreen
from gpuops.views.gpu_history import GpuHistory
from tests.tui.conftest import AppFactory, Clock
from tests.tui.test_pilot import run, text_of


def test_gpu_detail_shows_the_session_and_health(
    make_app: AppFactory, source: SimSource, clock: Clock
) -> None:
    app = make_app()

    async def script(pilot: Pilot[None]) -> None:
        for _ in range(6):  # six more samples over an hour of the simulated working day
            clock.advance(600)
            source.sample()
            app.publish(app.feed.build())
        source.inject_event("sim-chat-01", "ecc_double_bit", 2)
        source.inject_event("sim-chat-01", "clock", 2)
        clock.advance(5)
        source.sample()
        app.publish(app.feed.build())
        await pilot.pause()
        app.open_detail("sim-chat-01", 2)
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, DetailScreen)
        panel = text_of(detail.query_one("#gpu-panel", Static))
        assert "over the session (8 samples" in panel
        for title in ("utilization", "memory", "power", "temperature"):
            line = next(ln for ln in panel.splitlines() if ln.strip().startswith(title) and "now" in ln)
            assert any(ch in line for ch in "▁▂▃▄▅▆▇█") and "min" in line and "max" in line
        assert "0 corrected · 1 uncorrectable" in panel and "1 clock changes" in panel
        for field in ("fan", "PCIe link", "throttle reasons", "ECC counters"):
            line = next(ln for ln in panel.splitlines() if ln.strip().startswith(field))
            assert "not reported: the agent's sample has no field for it yet (nvmlDevice" in line
        assert "MPS: not in the live sample" in panel and "config op" in panel
        assert "Limiter:" in panel and "gpuops plan" in panel

    run(app, script)


def test_gpu_history_is_a_bounded_ring(source: SimSource, clock: Clock) -> None:
    history = GpuHistory(ring=5)
    for _ in range(12):
        clock.advance(1)
        source.sample()
        history.update(source.snapshot(clock()))
        history.update(source.snapshot(clock()))  # no new sample: nothing added
    assert history.points("sim-vision-01", 0) == 5
    util = history.series("sim-vision-01", 0, "util")
    assert len(util) == 5 and all(80 < u <= 100 for u in util)
    # MIG GPU: utilization from its slices' SMs (GPM), weighted by their share.
    assert len(history.series("sim-platform-01", 0, "util")) == 5


def test_the_ring_costs_sixteen_bytes_a_point(source: SimSource, clock: Clock) -> None:
    # 10k GPUs x 600 points must fit the TUI's memory budget: tuples of floats took ~180 bytes a
    # point (over 1 GB at 10k GPUs after 10 minutes); the ring stores 4 x 32-bit floats.
    history = GpuHistory(ring=600)
    clock.advance(1)
    source.sample()
    history.update(source.snapshot(clock()))
    gpus = sum(len(v.sample.gpus) for v in source.snapshot(clock()).nodes if v.sample is not None)
    assert history.nbytes() == gpus * 16
    one = history.series("sim-vision-01", 0, "temperature")
    assert len(one) == 1 and 20 <= one[0] <= 100
