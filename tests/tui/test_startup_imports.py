"""What `gpuops tui` loads before its first screen: on this host's GPUs (no fleet.yaml) neither the
spec (pydantic, ruamel) nor the planner, which only the Pool screen uses (they load when it is
opened); with a fleet.yaml the spec is read at start, as it must be.

Each case runs in a fresh interpreter (this one has imported everything): the `tui` command's own
code (`fleet_source` / `local_source`, `run_tui`), with the app run headless by Textual's test
driver instead of on the terminal, until the grid shows the first state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_helpers import REPO

pytestmark = pytest.mark.timeout(120)

HEAVY = ("pydantic", "ruamel.yaml", "gpuops.spec", "gpuops.plan", "gpuops.views.pool")

RUN = """
import asyncio, json, sys
from pathlib import Path
from gpuops.cli import tui

HEAVY = {heavy!r}

def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)

report = {{}}

def headless(app):
    async def drive():
        async with app.run_test(size=(120, 40)) as pilot:
            while app.published == 0:
                await pilot.pause(0.05)
            report["first screen"] = loaded()
            report["modules"] = len(sys.modules)
            await pilot.press("colon", *"pool", "enter")
            await pilot.pause()
            report["pool opened"] = loaded()
            report["pool screen"] = type(app.screen).__name__
            await pilot.press("q")
    asyncio.run(drive())

tui._run_on_fleet_loop = headless
if len(sys.argv) > 1:
    source, ownership = tui.fleet_source(Path(sys.argv[1]), "1s")
    tui.run_tui(source, ownership, readonly=True, fleet_file=Path(sys.argv[1]))
else:
    from gpuops.tenancy.ownership import Ownership
    tui.run_tui(tui.local_source("500ms", "sim", None), Ownership(), readonly=True)
print(json.dumps(report))
"""


def _start(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(heavy=HEAVY), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_this_hosts_view_starts_without_the_spec_and_planner() -> None:
    report = _start()
    assert report["first screen"] == [], report
    # The Pool screen brings them when opened (it then says it needs a fleet.yaml).
    assert report["pool screen"] == "PoolScreen"
    assert {"pydantic", "gpuops.spec"} <= set(report["pool opened"]), report  # type: ignore[arg-type]


def test_a_fleet_yaml_is_read_with_the_spec_at_start(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    # A node nobody listens for: the grid shows it connecting, which is enough here.
    fleet.write_text(
        "version: 1\n"
        f"ssh: {{port: 1, use_ssh_config: false, known_hosts: {tmp_path / 'known_hosts'}}}\n"
        "nodes:\n  - name: n1\n    host: 127.0.0.1\n"
    )
    report = _start(str(fleet))
    assert {"pydantic", "gpuops.spec"} <= set(report["first screen"]), report  # type: ignore[arg-type]
    assert report["pool screen"] == "PoolScreen"
