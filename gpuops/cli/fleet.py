"""`gpuops discover -f fleet.yaml` and `gpuops status -f fleet.yaml`: the fleet over SSH."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.cli.fleet_file import load_or_fail as load_or_fail  # where callers have found it
from gpuops.cli.sources import (
    PROMETHEUS_HELP,
    live_fleet,
    no_fleet,
    prometheus_url,
    require_fleet_or_prometheus,
)
from gpuops.core.codec import to_json
from gpuops.core.model import Gpu
from gpuops.core.units import UnitError, format_duration, parse_duration
from gpuops.fleet.remote_agent import PUSHED
from gpuops.fleet.source import LIVE, STALE, UNREACHABLE, FleetSnapshot
from gpuops.fleet.ssh import run
from gpuops.spec import Fleet
from gpuops.tenancy.ownership import Ownership
from gpuops.views import format as render
from gpuops.views.nodes import node_summary
from gpuops.views.teams import TeamSummary, team_summaries
from gpuops.views.tenants import tenant_rows

EXIT_PARTIAL = 3  # discover: some nodes could not be reached
DISCOVERY_TIMEOUT = 30.0  # status: seconds the first snapshot waits for slow nodes

_STATE_STYLE = {LIVE: "green", STALE: "yellow", UNREACHABLE: "red", "connecting": "dim"}


def _interval(text: str | None, fleet: Fleet) -> float:
    if text is None:
        return float(fleet.interval)
    try:
        value = parse_duration(text)
    except UnitError as exc:
        fail(f"--interval: {exc}", code=2)
    if value < 0.1:
        fail("--interval must be at least 100ms", code=2)
    return value


def _teams(fleet: Fleet) -> list[str]:
    return sorted(fleet.teams)


def _pool_of(fleet: Fleet) -> Callable[[str, Gpu], str | None]:
    def pool_of(node: str, gpu: Gpu) -> str | None:
        try:
            return fleet.pool_of(node, gpu.info.index, gpu.info.uuid, gpu.info.name)
        except KeyError:
            return None

    return pool_of


def _team_rows(snapshot: FleetSnapshot, fleet: Fleet) -> list[TeamSummary]:
    def gpu_owner(node: str, index: int) -> str | None:
        try:
            return fleet.gpu_owner(node, index)
        except KeyError:  # a node Prometheus has and fleet.yaml does not (or no fleet.yaml)
            return None

    return team_summaries(snapshot, gpu_owner, _teams(fleet), _pool_of(fleet) if fleet.pools else None)


def teams_table(snapshot: FleetSnapshot, fleet: Fleet) -> Table:
    table = Table(title="Teams", title_justify="left")
    pools = bool(fleet.pools)
    columns = ("Team", "Nodes", "GPUs owned", *(("In pools",) if pools else ()), "Busy", "Idle")
    for column in (*columns, "No data", "Memory used", "Procs"):
        table.add_column(
            column, no_wrap=True, justify="left" if column == "Team" else "right", min_width=len(column)
        )
    for row in _team_rows(snapshot, fleet):
        table.add_row(
            row.team,
            str(row.nodes),
            str(row.gpus_owned),
            *((str(row.gpus_pooled),) if pools else ()),
            str(row.gpus_busy),
            f"[bold yellow]{row.gpus_idle}[/]" if row.gpus_idle else "0",
            str(row.gpus_unknown) if row.gpus_unknown else "",
            _share(row.memory_used_bytes, row.memory_total_bytes),
            str(row.processes),
        )
    return table


def nodes_table(snapshot: FleetSnapshot, console: Console, live: bool = False) -> RenderableType:
    """The nodes table, as wide as the console allows. When the reasons do not fit beside the
    other columns they are written under the table, one line per node, so that a long reason never
    narrows the states, names and figures ('unreacha…'). The refresh interval is named only for a
    live view (`status`), where it is how often the table changes."""
    table = _nodes_table(snapshot, live, reasons=True)
    if Measurement.get(console, console.options.update_width(1 << 16), table).maximum <= console.width:
        return table
    notes = [
        Text(f"{s.name}: {s.reason}", style=_STATE_STYLE.get(s.state, ""))  # a node's words, never markup
        for s in (node_summary(v, snapshot.time) for v in sorted(snapshot.nodes, key=lambda v: v.name))
        if s.state != LIVE and s.reason
    ]
    return Group(_nodes_table(snapshot, live, reasons=False), *notes)


def _nodes_table(snapshot: FleetSnapshot, live: bool, reasons: bool) -> Table:
    up, stale, down = snapshot.count(LIVE), snapshot.count(STALE), snapshot.count(UNREACHABLE)
    title = f"{len(snapshot.nodes)} nodes: {up} live, {stale} stale, {down} unreachable"
    if live:
        title += f" · interval {format_duration(snapshot.interval)}"
    health = snapshot.source
    if health is not None:  # the source between us and the nodes, and how it is doing
        title += f" · from {health.kind} {health.where}"
        if health.state == UNREACHABLE:
            title += f": [bold red]source unreachable[/] ({escape(health.reason)})"
        elif health.warnings:
            title += f": [yellow]partial[/] ({escape(health.warnings[0])})"
    # The way to each node, when some are reached through jump hosts (ProxyJump, jump_host).
    via = any(v.route not in ("", "direct") for v in snapshot.nodes)
    # Which agent each node runs, once some node runs its installed one rather than the zipapp.
    agent = any(v.agent not in ("", PUSHED) for v in snapshot.nodes)
    columns: tuple[str, ...] = ("Node", "State", "Age", "Owner", "GPUs", "Busy", "Util", "Memory", "Procs")
    columns += ("Reason",) if reasons else ()
    columns += ("Via",) if via else ()
    columns += ("Agent",) if agent else ()
    rows: list[list[Text]] = []
    for view in sorted(snapshot.nodes, key=lambda v: v.name):
        s = node_summary(view, snapshot.time)
        cells = [
            Text(s.name),
            Text(s.state, style=_STATE_STYLE.get(s.state, "")),
            Text(format_duration(s.age) if s.age is not None else ""),
            Text(s.owner or ""),
            Text(s.models or ""),  # GPU names are the node's words too
            Text(f"{s.busy}/{s.gpus}" if s.gpus else ""),
            Text(render.percent(s.utilization_percent) if s.utilization_percent is not None else render.NA),
            Text(_share(s.memory_used_bytes, s.memory_total_bytes)),
            Text(str(s.processes)),
        ]
        if reasons:
            cells.append(Text(s.reason if s.state != LIVE else ""))  # a node's words, never markup
        if via:
            cells.append(Text(view.route if view.route != "direct" else ""))
        if agent:
            cells.append(Text(view.agent))
        rows.append(cells)
    if reasons:
        table = Table(title=title, title_justify="left")
    else:  # already too narrow for every column: lines under the header only, one space between
        table = Table(
            title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0)
        )
    for i, column in enumerate(columns):
        # Only the free texts wrap (in their own column); every other column keeps the width of its
        # longest cell, which rich would otherwise cut like any other when the table is too wide.
        wraps = column in ("GPUs", "Reason", "Via", "Agent")
        widest = max([len(column), *(r[i].cell_len for r in rows)])
        table.add_column(
            column,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            min_width=len(column) if wraps else widest,
        )
    for cells in rows:
        table.add_row(*cells)
    return table


def _share(used: int, total: int) -> str:
    """'85% of 640GiB': the share first, so narrow terminals keep what matters."""
    return f"{100 * used / total:.0f}% of {render.size(total)}" if total else ""


def source_json(snapshot: FleetSnapshot) -> dict[str, Any]:
    """Where the figures came from: the nodes over SSH, or a source between (Prometheus) and how
    it is doing."""
    health = snapshot.source
    if health is None:
        return {"kind": "ssh", "state": LIVE}
    return {
        "kind": health.kind,
        "url": health.where,
        "state": health.state,
        "reason": health.reason,
        "since": health.since,
        "warnings": list(health.warnings),
    }


def snapshot_json(snapshot: FleetSnapshot, fleet: Fleet) -> dict[str, Any]:
    return {
        "time": snapshot.time,
        "source": source_json(snapshot),
        "nodes": [
            {
                "name": v.name,
                "address": v.address,
                "state": v.state,
                "reason": v.reason,
                "route": v.route,
                "agent": v.agent or None,  # bootstrapped, installed or pushed; null before a session
                "agent_command": v.agent_command or None,
                "age": v.age(snapshot.time),
                "owner": v.owner,
                "inventory": to_json(v.inventory) if v.inventory else None,
                "sample": to_json(v.sample) if v.sample else None,
                "interrupted": list(v.hello.interrupted) if v.hello else [],
            }
            for v in snapshot.nodes
        ],
        "teams": [to_json(t) for t in _team_rows(snapshot, fleet)],
        # The tenants screen's figures now (owned, used, borrowed, lent, idle per team and pool).
        "tenants": [to_json(t) for t in tenant_rows(snapshot, Ownership.from_fleet(fleet))],
    }


async def _discover(
    fleet: Fleet, interval: float, timeout: float, url: str | None, has_file: bool
) -> FleetSnapshot:
    source = live_fleet(fleet, url, interval, has_file)
    source.start()
    try:
        return await source.discover(timeout)
    finally:
        await source.stop()


def fleet_and_source(fleet_file: Path | None, prometheus: str | None) -> tuple[Fleet, str | None]:
    """fleet.yaml (an empty fleet without -f) and the Prometheus to read (None: SSH)."""
    require_fleet_or_prometheus(fleet_file, prometheus)
    fleet = load_or_fail(fleet_file) if fleet_file is not None else None
    url = prometheus_url(prometheus, fleet)
    return (fleet if fleet is not None else no_fleet()), url


def discover_fleet(
    fleet_file: Path | None,
    as_json: bool,
    timeout: float,
    prometheus: str | None = None,
    *,
    as_status: bool = False,
) -> None:
    """`discover -f`: the tables, or with --json the document. `as_status` (`status --once`):
    what one refresh of status prints, the document on one line (JSON Lines) and, without a
    terminal, the summary line instead of the tables."""
    fleet, url = fleet_and_source(fleet_file, prometheus)
    snapshot = run(_discover(fleet, 1.0, timeout, url, fleet_file is not None))
    if as_json:
        document = snapshot_json(snapshot, fleet)
        typer.echo(json.dumps(document) if as_status else json.dumps(document, indent=2))
    elif as_status and not CliConsole().is_terminal:
        from gpuops.cli.status_lines import summary_line

        typer.echo(summary_line(snapshot))
    else:
        console = CliConsole()
        console.print(nodes_table(snapshot, console))
        console.print(teams_table(snapshot, fleet))
        for v in sorted(snapshot.nodes, key=lambda v: v.name):
            for line in v.hello.interrupted if v.hello else ():
                console.print(f"{v.name}: {line}", style="bold yellow", markup=False, highlight=False)
    source_down = snapshot.source is not None and snapshot.source.state != LIVE
    if source_down or any(v.sample is None for v in snapshot.nodes):
        raise typer.Exit(EXIT_PARTIAL)


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        fleet_file: Path | None = typer.Option(
            None, "-f", "--fleet", help="fleet.yaml of the nodes to watch."
        ),
        prometheus: str | None = typer.Option(None, "--prometheus", help=PROMETHEUS_HELP),
        once: bool = typer.Option(
            False,
            "--once",
            help="Print one refresh after discovery and exit: the tables; without a terminal the line; "
            "with --json one JSON line.",
        ),
        interval: str | None = typer.Option(
            None, "--interval", help="Sampling interval, e.g. 1s (default: fleet.yaml)."
        ),
        as_json: bool = typer.Option(
            False, "--json", help="One JSON document per refresh, one per line (JSON Lines)."
        ),
        count: int | None = typer.Option(
            None, "--count", help="Stop after this many refreshes (default: until Ctrl-C)."
        ),
    ) -> None:
        """A live table of every node and team, refreshed at the interval until Ctrl-C.

        Without a terminal, or with --json, one line per refresh instead, flushed as it is printed.
        """
        fleet, url = fleet_and_source(fleet_file, prometheus)
        every = _interval(interval, fleet)
        if count is not None and count < 1:
            fail(f"--count must be at least 1 (got {count})", code=2)
        if once:
            if count is not None:
                fail("give either --once or --count, not both", code=2)
            discover_fleet(
                fleet_file, as_json, timeout=DISCOVERY_TIMEOUT, prometheus=prometheus, as_status=True
            )
            return
        with contextlib.suppress(KeyboardInterrupt):
            watch(fleet, every, count, url, fleet_file is not None, as_json)


def watch(
    fleet: Fleet,
    every: float,
    count: int | None = None,
    url: str | None = None,
    has_file: bool = True,
    as_json: bool = False,
) -> None:
    """`status`' live view (and the demo's plain one): the tables redrawn on a terminal; without
    one, or with --json, a line per refresh, since rich would print a live table only when it
    stops and a reader would get nothing until then."""
    if as_json or not CliConsole().is_terminal:
        from gpuops.cli.status_lines import json_line, print_lines, summary_line

        line = json_line(lambda s: snapshot_json(s, fleet)) if as_json else summary_line
        source = live_fleet(fleet, url, every, has_file)
        run(print_lines(source, every, count, line, DISCOVERY_TIMEOUT))
    else:
        run(run_live(fleet, every, count, url, has_file))


async def run_live(
    fleet: Fleet, every: float, count: int | None = None, url: str | None = None, has_file: bool = True
) -> None:
    """Redraw the nodes and teams tables at the interval, `count` times or until cancelled."""
    collector = live_fleet(fleet, url, every, has_file)
    collector.start()
    console = CliConsole()
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            refreshes = 0
            while True:
                snapshot = collector.snapshot()
                table = nodes_table(snapshot, console, live=True)
                live.update(Group(table, teams_table(snapshot, fleet)), refresh=True)
                refreshes += 1
                if count is not None and refreshes >= count:
                    return
                await asyncio.sleep(every)
    finally:
        await collector.stop()
