"""The collector's coalesced wake-ups, as a user of the collector sees them: while many streams
are followed, samples are taken in batches, so each arrives at most one window late and every
node is still updated every interval; other work in the same loop is held up at most one pause
at a time, and only when samples come: the agents sample at the same instants (aligned
watches), so the loop pauses about once per interval, not once per window. `coalesce=0` turns
it off: samples arrive as they come.

A real simulated fleet on loopback (`gpuops.simfleet`), reached over SSH.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.fleet.collector import PAUSE_SHARE, Collector
from gpuops.fleet.source import LIVE
from gpuops.fleet.targets import node_targets
from gpuops.simfleet import Launched, launch, stop
from gpuops.spec import load_fleet

NODES = 12
INTERVAL = 1.0
WINDOW = 0.2  # coalescing window asked of the collector: 12 nodes at 1 Hz fill it (12 * 0.2 >= 1)
MEASURE = 4.0  # seconds of steady state
SLACK = 0.15  # scheduling on a shared 2-core machine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Launched]]:
    directory = tmp_path_factory.mktemp("coalescing")
    started = launch(directory, "large", nodes=NODES, timeout=60)
    try:
        yield directory, started
    finally:
        stop(directory)


class _Run:
    """What the collector delivered while measuring: per sample, how late it came (delivery
    wall time minus the node's sample time); per node, the samples; and how late a ticker that
    sleeps 10 ms at a time woke up."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.timestamps: list[float] = []  # each sample's time on its node
        self.samples: dict[str, int] = {}
        self.ticker: list[float] = []
        self.live = 0


def _follow(directory: Path, coalesce: float) -> _Run:
    targets = node_targets(load_fleet(directory / "fleet.yaml"))
    run = _Run()
    seen: dict[str, float] = {}
    measuring = False

    async def main() -> None:
        nonlocal measuring
        collector: Collector

        def on_change() -> None:
            now = time.time()
            for view in collector.snapshot(now).nodes:
                sample = view.sample
                if sample is None or seen.get(view.name) == sample.timestamp:
                    continue
                seen[view.name] = sample.timestamp
                if measuring:
                    run.lateness.append(now - sample.timestamp)
                    run.timestamps.append(sample.timestamp)
                    run.samples[view.name] = run.samples.get(view.name, 0) + 1

        async def ticker() -> None:
            loop = asyncio.get_running_loop()
            while True:
                due = loop.time() + 0.01
                await asyncio.sleep(0.01)
                if measuring:
                    run.ticker.append(loop.time() - due)

        collector = Collector(targets, interval=INTERVAL, coalesce=coalesce, on_change=on_change)
        collector.start()
        tick = asyncio.create_task(ticker())
        try:
            snap = await collector.discover(30)
            assert all(n.state == LIVE for n in snap.nodes), [(n.name, n.reason) for n in snap.nodes]
            # The watchdog turns coalescing on within a second of the streams flowing.
            await asyncio.sleep(2 * INTERVAL)
            measuring = True
            await asyncio.sleep(MEASURE)
            measuring = False
            run.live = collector.snapshot().count(LIVE)
        finally:
            tick.cancel()
            await collector.stop()

    asyncio.run(main())
    return run


def test_coalesced_samples_arrive_within_a_window_and_every_node_is_updated(
    fleet: tuple[Path, Launched],
) -> None:
    run = _follow(fleet[0], WINDOW)
    assert run.live == NODES
    # Every node, every interval.
    assert len(run.samples) == NODES
    assert min(run.samples.values()) >= MEASURE / INTERVAL - 1
    # At most one window late (how late depends on where the nodes' ticks fall in the window).
    assert max(run.lateness) <= WINDOW + SLACK, max(run.lateness)
    # Aligned watches: every node samples at the multiples of the interval (its clock is this
    # machine's), so one snapshot is of one moment.
    phases = [t % INTERVAL for t in run.timestamps]
    assert all(min(p, INTERVAL - p) < 0.1 for p in phases), sorted(phases)[-3:]
    # Other work in the loop waits for a pause when a burst of samples comes in, one pause at a
    # time (never a pause per turn of the loop): a 10 ms sleep comes about one pause late, about
    # once per interval (a burst takes one or two windows), and the loop runs freely otherwise.
    held = [late for late in run.ticker if late > PAUSE_SHARE * WINDOW / 2]
    assert MEASURE / INTERVAL - 1 <= len(held) <= 3 * MEASURE / INTERVAL, (len(held), MEASURE / INTERVAL)
    assert max(run.ticker) <= PAUSE_SHARE * WINDOW + SLACK, max(run.ticker)


def test_without_coalescing_samples_arrive_as_they_come(fleet: tuple[Path, Launched]) -> None:
    run = _follow(fleet[0], 0)
    assert run.live == NODES
    assert len(run.samples) == NODES
    assert min(run.samples.values()) >= MEASURE / INTERVAL - 1
    assert statistics.median(run.lateness) < 0.03, statistics.median(run.lateness)
    held = [late for late in run.ticker if late > PAUSE_SHARE * WINDOW / 2]
    assert len(held) <= 2, held
