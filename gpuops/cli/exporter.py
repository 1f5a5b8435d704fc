"""`gpuops exporter -f fleet.yaml [--listen 127.0.0.1:9836] [--interval 1s]`: the fleet exporter,
one Prometheus scrape target for an agentless fleet (docs/metrics.md).

Exit 0 on SIGTERM or SIGINT; 1: a bad fleet.yaml (located), a bad `--listen` address or one that
cannot be bound (one line, before any node is contacted); 2: a malformed `--interval`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit

import typer

from gpuops.cli.errors import fail

DEFAULT_PORT = 9836  # the node exporter's is 9835, dcgm-exporter's 9400


def exporter_command(
    fleet_file: Path = typer.Option(..., "-f", "--fleet", help="fleet.yaml of the nodes to export."),
    listen: str = typer.Option(
        f"127.0.0.1:{DEFAULT_PORT}",
        "--listen",
        help="HOST:PORT to serve /metrics on (HOST an IP address; 0.0.0.0 for every interface).",
    ),
    interval: str | None = typer.Option(
        None, "--interval", help="Sampling interval, e.g. 1s (default: fleet.yaml)."
    ),
    dcgm_compat: bool = typer.Option(
        False,
        "--dcgm-compat",
        help="Also dcgm-exporter's names and units (DCGM_FI_DEV_*), for dashboards written for it. "
        "Off by default: the nodes may run dcgm-exporter too.",
    ),
) -> None:
    """Serve the fleet's metrics for Prometheus: every node's GPUs and reachability over SSH, with
    fleet.yaml's teams, owners, pools and guarantees, until Ctrl-C."""
    from gpuops.cli.fleet import load_or_fail
    from gpuops.cli.tui import parse_interval
    from gpuops.core.listen import ListenError, exposure_warning, parse_listen

    fleet = load_or_fail(fleet_file)
    try:
        host, port = parse_listen(listen, "--listen", DEFAULT_PORT)
    except ListenError as exc:
        fail(str(exc))
    every = parse_interval(interval, float(fleet.interval))
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        fail(f"the exporter needs the prometheus-client package, which {sys.executable} lacks")
    from gpuops.exporter.service import ListenFailed, serve

    def ready(url: str) -> None:
        print(
            f"gpuops exporter: serving metrics on {url} "
            f"({len(fleet.nodes)} nodes, sampling every {every:g}s)",
            file=sys.stderr,
            flush=True,
        )
        exposed = exposure_warning(host, urlsplit(url).port or port, "--listen")
        if exposed is not None:
            print(exposed, file=sys.stderr, flush=True)

    try:
        asyncio.run(serve(fleet, host, port, every, ready, dcgm_compat=dcgm_compat))
    except ListenFailed as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    app.command("exporter")(exporter_command)
