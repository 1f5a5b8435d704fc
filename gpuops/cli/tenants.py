"""`gpuops tenants` (per-team accounting over a window) and `gpuops rebalance` (a proposal that
moves idle silo GPUs into a pool, with guarantees from evidence), both from the nodes' history.

gpuops tenants -f FLEET [--window 24h] [--json] [--prometheus URL]
    exit 0; 1: error; 3: figures shown, but some node's history has unreadable buckets
gpuops rebalance -f FLEET [--window 7d] [--pool shared] [--no-moves] [-o proposed.yaml] [--json]
    [--allow-incomplete-history] [--prometheus URL]
    exit 0: nothing to change; 1: error, no feasible proposal, or history with unreadable
    buckets (refused unless --allow-incomplete-history); 2: a proposal with changes

Unreadable history is unknown time, never idle or busy: the figures leave those buckets out and
the warning names each node and how many (docs/history.md#unreadable-history).

With --prometheus URL (or fleet.yaml's `source: {prometheus: URL}`) the history is read from
Prometheus' recording rules instead of from every node over SSH (tenancy/prometheus_history.py,
docs/prometheus-source.md#history); the same evidence, the same tables.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.cli.fleet_file import load_or_fail
from gpuops.cli.sources import prometheus_url
from gpuops.core.atomic_file import atomic_write
from gpuops.core.driver_memory import DriverMemory
from gpuops.core.history import History
from gpuops.core.units import format_bytes, parse_percent
from gpuops.spec import Fleet, dump_fleet, fleet_from_data
from gpuops.spec.errors import SpecError
from gpuops.tenancy.accounting import (
    Evidence,
    PoolUsage,
    Window,
    WindowError,
    gather_evidence,
    parse_window,
    pool_usage,
    tenant_usage,
)
from gpuops.tenancy.gather import no_history, read_histories
from gpuops.tenancy.rebalance import Options, Proposal, propose, proposed_fleet

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
# docs/cli.md's rule for reports: the output is there, but some nodes' part of it is not.
EXIT_INCOMPLETE = 3
COLUMNS = (
    "Owned",
    "Silo",
    "Guaranteed",
    "Used",
    "p95",
    "Peak",
    "Borrowed",
    "Lent",
    "Idle silo",
    "Memory",
    "Share",
)
_out = CliConsole(highlight=False, soft_wrap=True)


PROMETHEUS_HISTORY_HELP = (
    "Read the history from this Prometheus' recording rules instead of from every node over SSH "
    "(default: fleet.yaml's source.prometheus, if any)."
)
HISTORY_TIMEOUT = 60.0  # seconds for the whole round of range queries


async def _prometheus_histories(
    url: str, fleet: Fleet, window: Window, now: float
) -> dict[str, History | str]:
    from gpuops.fleet.promql.client import PromClient, PromError
    from gpuops.tenancy.prometheus_history import read_histories_promql

    timeout = fleet.live_source.timeout or HISTORY_TIMEOUT
    client = PromClient(url, timeout)
    try:
        nodes = [n.name for n in fleet.nodes]
        return await read_histories_promql(client, window, now, nodes, timeout=timeout)
    except PromError as exc:
        fail(f"--prometheus: {exc}")
    finally:
        await client.close()


def _histories(
    fleet: Fleet, window: Window, now: float, parallel: int, url: str | None
) -> dict[str, History | str]:
    if url is not None:
        return asyncio.run(_prometheus_histories(url, fleet, window, now))
    # Imported here: the import lines belong to the CLI's lazy start-up (cli/main.py).
    from gpuops.cli.read_progress import read_progress
    from gpuops.fleet.targets import node_targets

    targets = node_targets(fleet)
    with read_progress(len(targets), f"reading {window.text} of history") as done:
        return asyncio.run(
            read_histories(
                targets, window, now, parallel=parallel, handshakes=fleet.max_handshakes, done=done
            )
        )


def _driver_memory(fleet: Fleet, parallel: int) -> dict[tuple[str, int], DriverMemory]:
    """What each node observed of its GPUs' driver memory (their live state over SSH): the
    planner lays caps on what the driver leaves of each card. A node that cannot be read gives
    none (its GPUs take their models' documented figures)."""
    from gpuops.fleet.targets import node_targets
    from gpuops.plan.live import read_fleet
    from gpuops.views.pool import live_driver_memory

    lives = asyncio.run(read_fleet(node_targets(fleet), parallel=parallel, handshakes=fleet.max_handshakes))
    return live_driver_memory(lives)


def _evidence(fleet: Fleet, window_text: str, parallel: int, url: str | None = None) -> Evidence:
    try:
        window = parse_window(window_text)
    except WindowError as exc:
        fail(str(exc))
    now = time.time()
    # The command ends once it has printed: the decoded histories (millions of containers, no
    # cycles) are frozen out of the cyclic collector before it runs again. Turned on between
    # reading and freezing, it would walk them all at once (0.3 s at 200 nodes), and the
    # accounting's allocations would start that again and again (0.4 s).
    collecting = gc.isenabled()
    gc.disable()
    try:
        histories = _histories(fleet, window, now, parallel, url)
        gc.freeze()
    finally:
        if collecting:
            gc.enable()
    evidence = gather_evidence(fleet, histories, window, now)
    missing = {**no_history(histories), **evidence.missing}
    return dataclasses.replace(evidence, missing=missing)


def _gpus(value: float) -> str:
    return f"{value:.2f}"


def _warn_missing(evidence: Evidence) -> None:
    for node, reason in sorted(evidence.missing.items()):
        _out.print(f"[yellow]{node}: {reason}[/]", markup=True)


def _warnings(evidence: Evidence) -> list[str]:
    """Unreadable history, then a window longer than the history recorded."""
    coverage = evidence.coverage_line()
    return evidence.incomplete_lines() + ([coverage] if coverage else [])


def _warn_incomplete(evidence: Evidence) -> None:
    for line in _warnings(evidence):
        _out.print(f"[bold yellow]{line}[/]", markup=True)


def _incomplete_json(evidence: Evidence) -> dict[str, Any]:
    """--json's account of unreadable history (empty when complete)."""
    return {
        "incomplete": {
            node: {"buckets": i.buckets, "reasons": list(i.reasons)}
            for node, i in sorted(evidence.incomplete.items())
        },
        "buckets": len(evidence.starts),
        "readable_buckets": evidence.readable(),
        "warnings": _warnings(evidence),
    }


def tenants_command(
    fleet_file: Path = typer.Option(..., "-f", "--fleet", help="fleet.yaml (teams, owners, pools)."),
    window: str = typer.Option("24h", "--window", "-w", help="1m, 1h, 24h, 7d or any N[mhd] up to 90d."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    parallel: int = typer.Option(32, "--parallel", min=1, help="Nodes read at once."),
    prometheus: str | None = typer.Option(None, "--prometheus", help=PROMETHEUS_HISTORY_HELP),
) -> None:
    """Per team over a window: GPUs owned, guaranteed, used (mean, p95, peak), borrowed, lent,
    idle capacity of its silo, memory; then each pool as a whole (guaranteed, used, idle). Figures in
    GPUs' worth of GPU time."""
    fleet = load_or_fail(fleet_file)
    url = prometheus_url(prometheus, fleet)
    evidence = _evidence(fleet, window, parallel, url)
    rows = tenant_usage(evidence, fleet)
    pools = pool_usage(evidence, fleet)
    if as_json:
        document = {
            "window": evidence.window.text,
            "since": evidence.starts[0],
            "until": evidence.now,
            "source": {"kind": "prometheus", "url": url} if url is not None else {"kind": "ssh"},
            "tenants": [dataclasses.asdict(r) for r in rows],
            "pools": [dataclasses.asdict(p) for p in pools],
            "gpus": [
                {
                    "node": g.node,
                    "index": g.index,
                    "name": g.name,
                    "owner": g.owner,
                    "pool": g.pool,
                    "busy_mean": round(g.mean_busy(), 6),
                    "busy_p95": round(g.p95_busy(), 6),
                    "memory_used": round(g.memory_used),
                    "observed_seconds": g.seconds,
                    "teams": {t: round(sum(v) / max(1, len(v)), 6) for t, v in sorted(g.teams.items())},
                }
                for g in evidence.gpus
            ],
            "missing": dict(sorted(evidence.missing.items())),
            **_incomplete_json(evidence),
        }
        typer.echo(json.dumps(document, indent=2))
        raise typer.Exit(EXIT_INCOMPLETE if _partial(evidence) else EXIT_OK)
    table = Table(
        title=f"Tenants over {evidence.window.text} (GPUs' worth of GPU time)", title_justify="left"
    )
    table.add_column("Team", justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(
            r.team,
            str(r.owned),
            str(r.silo),
            _gpus(r.guaranteed),
            _gpus(r.used),
            _gpus(r.p95),
            _gpus(r.peak),
            _gpus(r.borrowed),
            _gpus(r.lent),
            _gpus(r.idle_owned),
            format_bytes(int(r.memory)),
            f"{r.share:.0%}",
        )
    _out.print(table)
    if pools:
        _out.print(_pools_table(pools, evidence.window.text))
    _warn_missing(evidence)
    _warn_incomplete(evidence)
    if _partial(evidence):
        raise typer.Exit(EXIT_INCOMPLETE)


def _partial(evidence: Evidence) -> bool:
    """A node unread (unreachable, no history) or with unreadable buckets: figures without it."""
    return bool(evidence.missing or evidence.incomplete)


def _pools_table(pools: tuple[PoolUsage, ...], window: str) -> Table:
    """The pools as a whole: the teams' rows above count their use of pool GPUs, not the pools'
    idle capacity."""
    table = Table(title=f"Pools over {window} (GPUs' worth of GPU time)", title_justify="left")
    for name, justify in (
        ("Pool", "left"),
        ("GPUs", "right"),
        ("Policy", "left"),
        ("Guaranteed", "right"),
        ("Used", "right"),
        ("p95", "right"),
        ("Idle", "right"),
        ("Used by", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for p in pools:
        users = sorted(p.teams.items(), key=lambda kv: (-kv[1], kv[0]))
        table.add_row(
            p.pool,
            str(p.gpus),
            p.policy + ("" if p.borrowing else ", no borrowing"),
            _gpus(p.guaranteed),
            _gpus(p.used),
            _gpus(p.p95),
            _gpus(p.idle),
            ", ".join(f"{t} {_gpus(v)}" for t, v in users) or "-",
        )
    return table


def _proposal_json(p: Proposal) -> dict[str, Any]:
    return {
        "pool": p.pool,
        "window": p.window,
        "capacity": p.capacity,
        "infeasible": p.infeasible,
        "moves": [dataclasses.asdict(m) for m in p.moves],
        "returns": [dataclasses.asdict(r) for r in p.returns],
        "guarantees": [{**dataclasses.asdict(g), "share": p.share(g.team)} for g in p.guarantees],
        "carvings": [dataclasses.asdict(c) for c in p.carvings],
        "notes": list(p.notes),
        "explanation": p.explain(),
    }


def _proposal_document(p: Proposal, evidence: Evidence) -> dict[str, Any]:
    return {**_proposal_json(p), **_incomplete_json(evidence)}


def rebalance_command(
    fleet_file: Path = typer.Option(..., "-f", "--fleet", help="fleet.yaml (teams, owners, pools)."),
    window: str = typer.Option("7d", "--window", "-w", help="Evidence window: 24h, 7d, ... (up to 90d)."),
    pool: str = typer.Option("shared", "--pool", help="The pool to plan (created when missing)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write the proposed fleet.yaml here."),
    idle: str = typer.Option("10%", "--idle", help="A GPU whose GPU-time p95 is at most this moves."),
    no_moves: bool = typer.Option(
        False,
        "--no-moves",
        help="Move no GPU: only re-guarantee and re-carve the GPUs already in the pool.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the proposal as JSON."),
    parallel: int = typer.Option(32, "--parallel", min=1, help="Nodes read at once."),
    allow_incomplete: bool = typer.Option(
        False,
        "--allow-incomplete-history",
        help="Propose even when some node's history has unreadable buckets (from the time "
        "readable on every node).",
    ),
    prometheus: str | None = typer.Option(None, "--prometheus", help=PROMETHEUS_HISTORY_HELP),
) -> None:
    """Propose moving under-used silo GPUs into a pool, with guarantees no lower than each team's
    p95 use and a carving that enforces them. Review it, then `gpuops plan`/`apply` the file.
    Exit 0: nothing to change; 1: error, no feasible proposal, or unreadable history (refused
    unless --allow-incomplete-history); 2: changes proposed."""
    try:
        idle_p95 = parse_percent(idle) / 100.0
    except ValueError as exc:
        fail(f"--idle: {exc}")
    fleet = load_or_fail(fleet_file)
    evidence = _evidence(fleet, window, parallel, prometheus_url(prometheus, fleet))
    if evidence.incomplete and not allow_incomplete:
        first = min(evidence.incomplete)
        more = len(evidence.incomplete) - 1
        refusal = (
            evidence.incomplete[first].line(first)
            + (f" (and {more} more node{'s' if more > 1 else ''})" if more else "")
            + ": no proposal from evidence with holes; --allow-incomplete-history proposes from the "
            "time readable on every node"
        )
        if as_json:
            typer.echo(
                json.dumps(
                    {"pool": pool, "window": window, "refused": refusal, **_incomplete_json(evidence)},
                    indent=2,
                )
            )
        fail(refusal)
    # With history from Prometheus, no node is asked: the models' documented figures apply.
    observed = _driver_memory(fleet, parallel) if prometheus_url(prometheus, fleet) is None else {}
    options = Options(pool=pool, idle_p95=idle_p95, moves=not no_moves, driver_memory=observed)
    proposal = propose(fleet, evidence, options)
    if proposal.infeasible:
        if as_json:
            typer.echo(json.dumps(_proposal_document(proposal, evidence), indent=2))
        fail(proposal.explain()[0])
    data = proposed_fleet(fleet, proposal)
    try:
        text = dump_fleet(
            fleet_from_data(data, str(fleet_file), base_dir=fleet_file.parent),
            comment=f"gpuops rebalance -f {fleet_file} --window {window} --pool {pool}"
            + (" --no-moves" if no_moves else "")
            + "\n"
            + "\n".join(proposal.explain()),
        )
    except SpecError as exc:  # the planner's own output must load; say so plainly if not
        fail(f"the proposal is not a valid fleet.yaml (a bug): {str(exc).splitlines()[0]}")
    before = dump_fleet(fleet)
    changed = dump_fleet(fleet_from_data(data, str(fleet_file), base_dir=fleet_file.parent)) != before
    if as_json:
        typer.echo(json.dumps({**_proposal_document(proposal, evidence), "changed": changed}, indent=2))
    else:
        for line in proposal.explain():
            _out.print(line)
        _warn_missing(evidence)
        _warn_incomplete(evidence)
    if out is not None:
        try:
            atomic_write(out, text)  # 0600: it names every team's GPUs, as a saved plan does
        except OSError as exc:
            fail(f"{out}: {exc.strerror or exc}")
        if not as_json:
            _out.print(f"Wrote {out}: review it, then gpuops plan {out} and gpuops apply {out}")
    raise typer.Exit(EXIT_CHANGES if changed else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("tenants")(tenants_command)
    app.command("rebalance")(rebalance_command)
