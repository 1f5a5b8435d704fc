"""`gpuops status` for scripts: one line per refresh instead of a redrawn table.

Without a terminal a live table has nowhere to redraw, and rich prints it only when it stops:
a script reading `status` would get nothing until Ctrl-C. Here each refresh is a line of its
own, written and flushed as it happens: a plain summary, or with --json the document
`discover -f --json` prints, on one line (JSON Lines). The first line waits for discovery (every
node answered or failed its first attempt), so that it is not all "connecting".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import typer

from gpuops.fleet.source import LIVE, STALE, UNREACHABLE, FleetSnapshot, FleetSource
from gpuops.views import format as render
from gpuops.views.nodes import node_summary


def summary_line(snapshot: FleetSnapshot) -> str:
    """'2026-11-27T10:15:02+00:00 8 nodes: 7 live, 0 stale, 1 unreachable; 40/56 GPUs busy; …'"""
    nodes = [node_summary(view, snapshot.time) for view in sorted(snapshot.nodes, key=lambda v: v.name)]
    gpus = sum(n.gpus for n in nodes)
    busy = sum(n.busy for n in nodes)
    used = sum(n.memory_used_bytes for n in nodes)
    total = sum(n.memory_total_bytes for n in nodes)
    utils = [n.utilization_percent for n in nodes if n.utilization_percent is not None]
    when = datetime.fromtimestamp(snapshot.time).astimezone().isoformat(timespec="seconds")
    parts = [
        f"{when} {len(nodes)} nodes: {snapshot.count(LIVE)} live, {snapshot.count(STALE)} stale,"
        f" {snapshot.count(UNREACHABLE)} unreachable",
        f"{busy}/{gpus} GPUs busy",
        f"util {render.percent(sum(utils) / len(utils)) if utils else render.NA}",
        f"memory {render.size(used)} of {render.size(total)}",
        f"{sum(n.processes for n in nodes)} procs",
    ]
    not_live = [
        f"{n.name} {n.state}" + (f" ({n.reason})" if n.reason else "") for n in nodes if n.state != LIVE
    ]
    if not_live:
        parts.append("not live: " + ", ".join(not_live))
    health = snapshot.source
    if health is not None and health.state == LIVE:
        # As the table's title says it: a log of these lines must tell a Prometheus' figures
        # from the nodes' own.
        parts.insert(1, f"from {health.kind} {health.where}")
    elif health is not None:
        parts.insert(
            1, f"source {health.state}: {health.where}" + (f" ({health.reason})" if health.reason else "")
        )
    return "; ".join(parts)


async def print_lines(
    collector: FleetSource,
    every: float,
    count: int | None,
    line: Callable[[FleetSnapshot], str],
    discovery_timeout: float,
) -> None:
    """Print `line(snapshot)` once per interval, `count` times (None: until cancelled)."""
    collector.start()
    try:
        await collector.discover(discovery_timeout)
        loop = asyncio.get_running_loop()
        due = loop.time()
        printed = 0
        while count is None or printed < count:
            if printed:
                # On the interval's beat, however long printing to a slow reader took.
                due = max(due + every, loop.time())
                await asyncio.sleep(due - loop.time())
            typer.echo(line(collector.snapshot()))  # echo flushes: the reader has it now
            printed += 1
    finally:
        await collector.stop()


def json_line(document: Callable[[FleetSnapshot], dict[str, Any]]) -> Callable[[FleetSnapshot], str]:
    return lambda snapshot: json.dumps(document(snapshot), separators=(",", ":"))
