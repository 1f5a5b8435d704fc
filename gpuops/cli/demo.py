"""`gpuops demo`: a simulated fleet over real SSH on loopback, watched live in the TUI; stopped on exit.

The fleet is the `silos` scenario (teams with busy, idle and MIG-carved nodes, one saturated
team with queued work), served by one background process; the TUI follows it like any fleet.yaml.
With --prometheus the fleet starts its own Prometheus (Debian's package) scraping every node, and
the view reads the fleet from it (PromQL) instead of over SSH.
Whatever ends the view (q, :q, ctrl-c, SIGTERM, the terminal closing), the fleet is stopped and
its temporary directory removed; should the demo die without a chance to (SIGKILL), the fleet
sees its parent go and does both itself (simfleet/tether.py).
The full screen needs a terminal on stdin, stdout and stderr; without one the demo refuses before
starting anything (as `gpuops tui` does). `--plain` prints the live table of `gpuops status`
instead, for pipes and CI.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

import typer

from gpuops.cli.errors import fail


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        nodes: int | None = typer.Option(None, "--nodes", "-n", help="How many simulated nodes (default 8)."),
        interval: float = typer.Option(1.0, "--interval", help="Refresh interval in seconds."),
        plain: bool = typer.Option(
            False,
            "--plain",
            help="A live table instead of the full-screen view, for pipes and CI: "
            "without a terminal the demo refuses to start unless given --plain.",
        ),
        readonly: bool = typer.Option(
            False, "--readonly", help="Disable every action that changes the fleet."
        ),
        prometheus: bool = typer.Option(
            False,
            "--prometheus",
            help="Also start a Prometheus scraping the fleet, and watch the fleet through it (PromQL).",
        ),
    ) -> None:
        """Start a simulated fleet on loopback and watch it live (q quits and stops the fleet)."""
        from gpuops.cli.fleet import load_or_fail, watch
        from gpuops.cli.tui import fleet_source, run_tui
        from gpuops.simfleet import ScenarioError, SimFleetError, launch, stop

        if interval < 0.1:
            fail("--interval must be at least 0.1 seconds", code=2)
        full_screen = not plain
        if full_screen and (missing := _not_terminals()):
            fail(
                f"gpuops demo draws a full screen, and {missing} not a terminal; "
                "for a live table in a pipe or CI use: gpuops demo --plain",
                code=2,
            )
        # The terminal closing must stop the fleet like ctrl-c does (the TUI has its own handler).
        signal.signal(signal.SIGHUP, _hang_up)
        # The fleet removes the directory itself when this process dies first.
        with tempfile.TemporaryDirectory(prefix="gpuops-demo-", ignore_cleanup_errors=True) as tmp:
            directory = Path(tmp)
            if full_screen:
                typer.echo("starting a simulated fleet (silos scenario) on loopback…")
            try:
                started = launch(directory, "silos", nodes, prometheus=prometheus, tied=True)
            except ScenarioError as exc:
                fail(str(exc), code=2)
            except (SimFleetError, OSError) as exc:
                fail(f"cannot start the simulated fleet: {exc}")
            try:
                where = directory / "fleet.yaml"
                count = len(started.state.get("nodes", []))
                url = started.state.get("prometheus_url") if prometheus else None
                if full_screen:
                    label = f"simulated silos fleet, {count} nodes over SSH on loopback"
                    source, ownership = fleet_source(where, f"{interval}s", label, prometheus=url)
                    run_tui(source, ownership, readonly, where)
                else:
                    via = f", read through Prometheus {url}" if url else ""
                    typer.echo(
                        f"simulated fleet up in {started.seconds:.1f}s ({where}{via}); Ctrl-C stops it"
                    )
                    fleet = load_or_fail(where)
                    with contextlib.suppress(KeyboardInterrupt):
                        watch(fleet, interval, url=url)
            finally:
                typer.echo(stop(directory))


def _not_terminals() -> str:
    """Which of stdin, stdout, stderr are not a terminal, as a phrase ('' when all are): Textual
    reads keys from stdin and draws on stderr, and a redirected stdout would swallow what the
    demo says before and after the screen (where its fleet is, that it stopped)."""
    streams = (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.__stderr__))
    names = [name for name, stream in streams if not _is_tty(stream)]
    if not names:
        return ""
    return f"{' and '.join(names)} is" if len(names) == 1 else f"{', '.join(names)} are"


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream is not None and stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def _hang_up(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
