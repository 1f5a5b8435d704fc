"""`gpuops discover -f fleet.yaml` and `gpuops status -f fleet.yaml`: the fleet over SSH."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.core.codec import to_json
from gpuops.core.model import Gpu
from gpuops.core.units import UnitError, format_duration, parse_duration
from gpuops.fleet.collector import LIVE, STALE, UNREACHABLE, Collector, FleetSnapshot
from gpuops.fleet.remote_agent import PUSHED
from gpuops.fleet.ssh import run
from gpuops.fleet.targets import node_targets
from gpuops.spec import Fleet, SpecError, load_fleet
from gpuops.views import format as render
from gpuops.views.nodes import node_summary
from gpuops.views.teams import TeamSummary, team_summaries

EXIT_PARTIAL = 3  # discover: some nodes could not be reached
DISCOVERY_TIMEOUT = 30.0  # status: seconds the first snapshot waits for slow nodes

_STATE_STYLE = {LIVE: "green", STALE: "yellow", UNREACHABLE: "red", "connecting": "dim"}


def load_or_fail(path: Path) -> Fleet:
    try:
        return load_fleet(str(path))
    except SpecError as exc:
        fail(str(exc).replace("\n", "\n       "))


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
    return team_summaries(snapshot, fleet.gpu_owner, _teams(fleet), _pool_of(fleet) if fleet.pools else None)


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


def nodes_table(snapshot: FleetSnapshot) -> Table:
    live, stale, down = snapshot.count(LIVE), snapshot.count(STALE), snapshot.count(UNREACHABLE)
    title = (
        f"{len(snapshot.nodes)} nodes: {live} live, {stale} stale, {down} unreachable"
        f" · interval {format_duration(snapshot.interval)}"
    )
    table = Table(title=title, title_justify="left")
    # The way to each node, when some are reached through jump hosts (ProxyJump, jump_host).
    via = any(v.route not in ("", "direct") for v in snapshot.nodes)
    # Which agent each node runs, once some node runs its installed one rather than the zipapp.
    agent = any(v.agent not in ("", PUSHED) for v in snapshot.nodes)
    columns = ("Node", "State", "Age", "Owner", "GPUs", "Busy", "Util", "Memory", "Procs", "Reason")
    for column in (*columns, *(("Via",) if via else ()), *(("Agent",) if agent else ())):
        # Figures never shrink; names, models and reasons give way on narrow terminals.
        flexible = column in ("Node", "Owner", "GPUs", "Reason", "Via", "Agent")
        table.add_column(column, no_wrap=True, min_width=None if flexible else len(column))
    for view in sorted(snapshot.nodes, key=lambda v: v.name):
        s = node_summary(view, snapshot.time)
        style = _STATE_STYLE.get(s.state, "")
        table.add_row(
            s.name,
            f"[{style}]{s.state}[/]" if style else s.state,
            format_duration(s.age) if s.age is not None else "",
            s.owner or "",
            Text(s.models or ""),  # GPU names are the node's words too
            f"{s.busy}/{s.gpus}" if s.gpus else "",
            render.percent(s.utilization_percent) if s.utilization_percent is not None else render.NA,
            _share(s.memory_used_bytes, s.memory_total_bytes),
            str(s.processes),
            Text(s.reason if s.state != LIVE else ""),  # a node's words, never markup
            *((view.route if view.route != "direct" else "",) if via else ()),
            *((view.agent,) if agent else ()),
        )
    return table


def _share(used: int, total: int) -> str:
    """'85% of 640GiB': the share first, so narrow terminals keep what matters."""
    return f"{100 * used / total:.0f}% of {render.size(total)}" if total else ""


def snapshot_json(snapshot: FleetSnapshot, fleet: Fleet) -> dict[str, Any]:
    return {
        "time": snapshot.time,
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
    }


async def _discover(fleet: Fleet, interval: float, timeout: float) -> FleetSnapshot:
    collector = Collector(node_targets(fleet), interval=interval, max_handshakes=fleet.max_handshakes)
    collector.start()
    try:
        return await collector.discover(timeout)
    finally:
        await collector.stop()


def discover_fleet(fleet_file: Path, as_json: bool, timeout: float) -> None:
    fleet = load_or_fail(fleet_file)
    snapshot = run(_discover(fleet, 1.0, timeout))
    if as_json:
        typer.echo(json.dumps(snapshot_json(snapshot, fleet), indent=2))
    else:
        console = CliConsole()
        console.print(nodes_table(snapshot))
        console.print(teams_table(snapshot, fleet))
        for v in sorted(snapshot.nodes, key=lambda v: v.name):
            for line in v.hello.interrupted if v.hello else ():
                console.print(f"{v.name}: {line}", style="bold yellow", markup=False, highlight=False)
    if any(v.sample is None for v in snapshot.nodes):
        raise typer.Exit(EXIT_PARTIAL)


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        fleet_file: Path = typer.Option(..., "-f", "--fleet", help="fleet.yaml of the nodes to watch."),
        once: bool = typer.Option(False, "--once", help="Print one snapshot after discovery and exit."),
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
        fleet = load_or_fail(fleet_file)
        every = _interval(interval, fleet)
        if count is not None and count < 1:
            fail(f"--count must be at least 1 (got {count})", code=2)
        if once:
            if count is not None:
                fail("give either --once or --count, not both", code=2)
            discover_fleet(fleet_file, as_json, timeout=DISCOVERY_TIMEOUT)
            return
        console = CliConsole()
        with contextlib.suppress(KeyboardInterrupt):
            if as_json or not console.is_terminal:
                from gpuops.cli.status_lines import json_line, print_lines, summary_line

                line = json_line(lambda s: snapshot_json(s, fleet)) if as_json else summary_line
                run(print_lines(fleet, every, count, line, DISCOVERY_TIMEOUT))
            else:
                run(run_live(fleet, every, count))


async def run_live(fleet: Fleet, every: float, count: int | None = None) -> None:
    """Redraw the nodes and teams tables at the interval, `count` times or until cancelled."""
    collector = Collector(node_targets(fleet), interval=every, max_handshakes=fleet.max_handshakes)
    collector.start()
    console = CliConsole()
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            refreshes = 0
            while True:
                snapshot = collector.snapshot()
                live.update(Group(nodes_table(snapshot), teams_table(snapshot, fleet)), refresh=True)
                refreshes += 1
                if count is not None and refreshes >= count:
                    return
                await asyncio.sleep(every)
    finally:
        await collector.stop()
