"""`gpuops demo`: a simulated fleet over real SSH on loopback, watched live; stopped on exit.

Until the TUI lands, the live view is `gpuops status`'s table; the fleet is the `silos` scenario
(teams with busy, idle and MIG-carved nodes, one saturated team with queued work).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

import typer

from gpuops.cli.errors import fail


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        nodes: int | None = typer.Option(None, "--nodes", "-n", help="How many simulated nodes (default 8)."),
        interval: float = typer.Option(1.0, "--interval", help="Refresh interval in seconds."),
    ) -> None:
        """Start a simulated fleet on loopback and watch it live (Ctrl-C stops both)."""
        from gpuops.cli.fleet import load_or_fail, run_live
        from gpuops.fleet.simfleet import ScenarioError, SimFleetError, launch, stop

        if interval < 0.1:
            fail("--interval must be at least 0.1 seconds", code=2)
        with tempfile.TemporaryDirectory(prefix="gpuops-demo-") as tmp:
            directory = Path(tmp) / "sim"
            try:
                started = launch(directory, "silos", nodes)
            except ScenarioError as exc:
                fail(str(exc), code=2)
            except (SimFleetError, OSError) as exc:
                fail(f"cannot start the simulated fleet: {exc}")
            try:
                where = directory / "fleet.yaml"
                typer.echo(f"simulated fleet up in {started.seconds:.1f}s ({where}); Ctrl-C stops it")
                fleet = load_or_fail(directory / "fleet.yaml")
                with contextlib.suppress(KeyboardInterrupt):
                    asyncio.run(run_live(fleet, interval))
            finally:
                typer.echo(stop(directory))
