"""Discovery's cost grows with the fleet, not with its square: `Collector.discover` waits for
every node to answer once (a sample, or a failed first attempt) by counting the nodes still
unanswered, not by checking every node each time one changes (29% of a 4000-node discovery's
CPU went to that check, issue 22).

A real simulated fleet on loopback (`gpuops.simfleet`), reached over SSH; the collector's
node table counts how often it is walked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, ValuesView
from pathlib import Path
from typing import Any

import pytest

from gpuops.fleet.collector import Collector
from gpuops.fleet.source import LIVE, UNREACHABLE
from gpuops.fleet.targets import node_targets
from gpuops.simfleet import launch, stop
from gpuops.spec import load_fleet

NODES = 16
DISCOVERY_TIMEOUT = 30.0


class _CountedWalks(dict[str, Any]):
    """The collector's node table, counting the walks over every node."""

    walks = 0

    def values(self) -> ValuesView[Any]:
        self.walks += 1
        return super().values()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("discovery")
    launch(directory, "large", nodes=NODES, timeout=60)
    try:
        yield directory
    finally:
        stop(directory)


def _discover(fleet_file: Path, extra: list[Any]) -> tuple[int, int, list[str], float]:
    """(walks over the node table during discovery, changes seen, each node's state after,
    seconds discovery took)."""
    targets = [*node_targets(load_fleet(fleet_file)), *extra]
    changes = 0

    def changed() -> None:
        nonlocal changes
        changes += 1

    async def main() -> tuple[int, list[str], float]:
        collector = Collector(targets, interval=1.0, on_change=changed)
        table = _CountedWalks(collector._records)
        collector._records = table
        collector.start()
        try:
            before, began = table.walks, time.monotonic()
            snap = await collector.discover(DISCOVERY_TIMEOUT)
            took = time.monotonic() - began
            return table.walks - before, [n.state for n in snap.nodes], took
        finally:
            await collector.stop()

    walks, states, took = asyncio.run(main())
    return walks, changes, states, took


def test_discovery_walks_the_fleet_a_fixed_number_of_times(fleet: Path) -> None:
    walks, changes, states, _took = _discover(fleet / "fleet.yaml", [])
    assert states == [LIVE] * NODES
    # Each node changes several times while it connects (handshake, inventory, first sample),
    # and discovery wakes for those changes; it walks the table only to finish (the nodes that
    # never answered, then the snapshot), however many changes there were.
    assert changes >= 2 * NODES
    assert walks <= 2, walks


def test_a_node_whose_first_attempt_fails_counts_as_answered(fleet: Path) -> None:
    # A port nothing listens on: refused at once; discovery must not wait for its timeout.
    from dataclasses import replace

    base = node_targets(load_fleet(fleet / "fleet.yaml"))[0]
    dead = replace(base, name="dead", ssh=replace(base.ssh, host="127.0.0.1", port=1))
    walks, _changes, states, took = _discover(fleet / "fleet.yaml", [dead])
    assert states.count(LIVE) == NODES
    assert states[-1] == UNREACHABLE
    assert took < DISCOVERY_TIMEOUT / 2, took
    assert walks <= 2, walks
