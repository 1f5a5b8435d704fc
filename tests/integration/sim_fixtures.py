"""The simulated `silos` fleet of a test that changes it (plans, applies, journals): one fleet
per test, stopped at its end. A module imports the fixture, which pytest finds by its name::

    from tests.integration.sim_fixtures import silos_fleet_fixture  # noqa: F401  (fixture `fleet`)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.simfleet import Launched, launch, stop


@pytest.fixture(name="fleet")
def silos_fleet_fixture(tmp_path: Path) -> Iterator[Launched]:
    directory = tmp_path / "fleet"
    started = launch(directory, "silos", timeout=60)
    try:
        yield started
    finally:
        stop(directory)
