"""`gpuops tui [-f fleet.yaml] [--readonly] [--interval 1s]`: the live fleet view.

Without -f it shows this host's GPUs through a local agent (NVML); with -f every node of the
fleet over SSH. Keys follow k9s: ? help, : views, / filter, esc back, q quit. docs/tui.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpuops.cli.errors import fail

if TYPE_CHECKING:  # the TUI (Textual) is imported only when a command needs it
    from gpuops.fleet.local import LocalSource
    from gpuops.fleet.source import FleetSource
    from gpuops.tenancy.ownership import Ownership

TERMINAL_NEEDED = "the live view needs a terminal (stdin and stderr are not one)"


def is_terminal() -> bool:
    """Textual reads keys from stdin and draws on stderr."""
    try:
        return sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()
    except (AttributeError, ValueError):
        return False


def parse_interval(text: str | None, default: float) -> float:
    from gpuops.core.units import UnitError, parse_duration

    if text is None:
        return default
    try:
        value = parse_duration(text)
    except UnitError as exc:
        fail(f"--interval: {exc}", code=2)
    if value < 0.1:
        fail("--interval must be at least 100ms", code=2)
    return value


def fleet_source(
    fleet_file: Path | None, interval: str | None, label: str | None = None, prometheus: str | None = None
) -> tuple[FleetSource, Ownership]:
    """The source and Ownership for a fleet.yaml (over SSH, or Prometheus when --prometheus or its
    `source:` says so), or for a Prometheus alone; a bad file or URL is a one-line error."""
    from gpuops.cli.fleet import load_or_fail
    from gpuops.cli.sources import no_fleet, prometheus_source, prometheus_url
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.targets import node_targets
    from gpuops.tenancy.ownership import Ownership

    fleet = load_or_fail(fleet_file) if fleet_file is not None else None
    url = prometheus_url(prometheus, fleet)
    if url is not None:
        every = parse_interval(interval, float(fleet.interval) if fleet is not None else 1.0)
        source = prometheus_source(url, fleet, every)
        return source, Ownership.from_fleet(fleet if fleet is not None else no_fleet())
    assert fleet_file is not None and fleet is not None
    every = parse_interval(interval, float(fleet.interval))
    text = label or f"{fleet_file} ({len(fleet.nodes)} nodes)"
    collector = Collector(
        node_targets(fleet), interval=every, max_handshakes=fleet.max_handshakes, label=text
    )
    return collector, Ownership.from_fleet(fleet)


async def _local_backend_error(backend: str, sim_spec: str | None) -> str:
    from gpuops.fleet.local import local_agent

    async with local_agent(backend, sim_spec) as client:
        return client.hello.backend_error if client.hello is not None else "the agent did not greet"


def local_source(interval: str | None, backend: str, sim_spec: str | None) -> LocalSource:
    """A LocalSource, after checking that the backend works (NVML present), else a one-line error."""
    from gpuops.fleet.agent_client import AgentError
    from gpuops.fleet.local import LocalSource

    every = parse_interval(interval, 1.0)
    try:
        error = asyncio.run(_local_backend_error(backend, sim_spec))
    except AgentError as exc:
        error = exc.message
    except OSError as exc:
        fail(f"cannot start the local agent: {exc}")
    if error:
        hint = ""
        if backend == "nvml":
            hint = (
                " — to try gpuops without a GPU: gpuops demo (a simulated fleet), or gpuops tui -f fleet.yaml"
            )
        fail(f"cannot read this host's GPUs: {error}{hint}")
    return LocalSource(every, backend, sim_spec)


def run_tui(
    source: FleetSource, ownership: Ownership, readonly: bool, fleet_file: Path | None = None
) -> None:
    """Run the TUI until the user quits; SIGTERM and SIGHUP quit it cleanly too. `fleet_file` (the
    fleet.yaml the source was made from) gives the Pool screen that file."""
    from gpuops.tui.app import GpuopsApp
    from gpuops.views.feed import Feed

    pool = None
    if fleet_file is not None:
        # The Pool screen's source brings the planner (and the spec): only with a fleet.yaml.
        from gpuops.views.pool import PoolSource

        pool = PoolSource(fleet_file)
    app = GpuopsApp(Feed(source, ownership), readonly=readonly, handle_signals=True, tune_gc=True, pool=pool)
    _run_on_fleet_loop(app)
    if app.return_code:
        raise typer.Exit(app.return_code)


def _run_on_fleet_loop(app: Any) -> None:
    """Run the app on the event loop the fleet commands use (uvloop where installed: the
    collector costs about 15% less per sample on it, docs/fleet.md); Textual's own `run` would
    take asyncio's."""
    from gpuops.fleet.ssh import loop_factory

    factory = loop_factory()
    if factory is None:
        app.run()
        return
    loop = factory()
    asyncio.set_event_loop(loop)
    try:
        app.run(loop=loop)
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


def register(app: typer.Typer) -> None:
    @app.command("tui")
    def tui(
        fleet_file: Path | None = typer.Option(
            None, "-f", "--fleet", help="fleet.yaml of the nodes to watch (default: this host's GPUs)."
        ),
        readonly: bool = typer.Option(
            False, "--readonly", help="Disable every action that changes the fleet."
        ),
        interval: str | None = typer.Option(
            None, "--interval", help="Sampling interval, e.g. 1s or 500ms (default: fleet.yaml's, else 1s)."
        ),
        prometheus: str | None = typer.Option(
            None,
            "--prometheus",
            help="Read the fleet from this Prometheus (its API's base URL) instead of over SSH.",
        ),
        local_backend: str = typer.Option("nvml", "--local-backend", hidden=True),
        sim_spec: Path | None = typer.Option(None, "--sim-spec", hidden=True),
    ) -> None:
        """The live fleet view: every GPU and MIG slice per team, tenants, nodes, events (k9s keys)."""
        if not is_terminal():
            fail(f"{TERMINAL_NEEDED}; for scripts use: gpuops status -f fleet.yaml --once", code=2)
        if fleet_file is not None or prometheus is not None:
            if local_backend != "nvml" or sim_spec is not None:
                fail(
                    "--local-backend and --sim-spec are for this host's view, not with -f or --prometheus",
                    code=2,
                )
            source, ownership = fleet_source(fleet_file, interval, prometheus=prometheus)
            run_tui(source, ownership, readonly, fleet_file)
            return
        from gpuops.tenancy.ownership import Ownership

        local = local_source(interval, local_backend, str(sim_spec) if sim_spec else None)
        run_tui(local, Ownership(), readonly)
