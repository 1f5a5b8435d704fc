"""The fleet's event loop: `gpuops.fleet.ssh.run` runs on uvloop's loop when it is installed
(asyncio's with GPUOPS_EVENT_LOOP=asyncio), and the fleet commands collect on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuops.cli import fleet as fleet_cli
from gpuops.cli import status_lines
from gpuops.cli.main import app
from gpuops.fleet.source import FleetSnapshot
from gpuops.fleet.ssh import run
from gpuops.spec import Fleet

uvloop = pytest.importorskip("uvloop")


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_run_is_on_uvloop_unless_asked_for_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(_loop_module()).startswith("uvloop")
    monkeypatch.setenv("GPUOPS_EVENT_LOOP", "asyncio")
    assert run(_loop_module()).startswith("asyncio")


def test_discover_and_status_collect_on_uvloop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[str] = []

    # Stand-ins for the collecting coroutines, whatever else they are given (a Prometheus URL, ...).
    async def discover(fleet: Fleet, interval: float, *_: object) -> FleetSnapshot:
        loops.append(await _loop_module())
        return FleetSnapshot(0.0, interval, ())

    async def live(fleet: Fleet, every: float, *_: object) -> None:
        loops.append(await _loop_module())

    monkeypatch.setattr(fleet_cli, "_discover", discover)
    monkeypatch.setattr(fleet_cli, "run_live", live)
    # Without a terminal (CliRunner) status prints a line per refresh: that loop stands in too,
    # else it would watch the fleet until interrupted.
    monkeypatch.setattr(status_lines, "print_lines", live)
    monkeypatch.setattr(fleet_cli, "live_fleet", lambda *_: None)
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\nnodes:\n  - name: gpu-a-01\n    host: 127.0.0.1\n")
    for command in ("discover", "status"):
        result = CliRunner().invoke(app, [command, "-f", str(path)])
        assert result.exit_code == 0, result.output
    assert len(loops) == 2 and all(m.startswith("uvloop") for m in loops), loops
