"""`gpuops plan`, `apply`, `assert` and `export`: fleet.yaml's `carve:` made real, with a plan first.

gpuops plan FLEET [-o plan.json] [--json]      what would change; exit 0 none, 1 error, 2 changes
gpuops apply FLEET | --plan plan.json [--yes] [--force] [--parallel N]
gpuops assert FLEET                            exit 0 when the live state matches, 1 when not
gpuops export [-f FLEET] [-o FILE]             the live state as fleet.yaml carve: entries
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.cli.fleet_file import load_or_fail
from gpuops.plan.diff import make_plan
from gpuops.plan.export import carve_entries
from gpuops.plan.live import NodeLive
from gpuops.plan.model import PayloadError, Plan, PlanError, digest
from gpuops.plan.render import plan_lines
from gpuops.plan.saved import EditedPlanError, plan_document, read_plan, save_plan
from gpuops.spec import Fleet
from gpuops.spec.dump import carve_section, dump_yaml
from gpuops.spec.edit import EditError, set_carve

if TYPE_CHECKING:  # apply's side (SSH) is loaded when a command applies, not by --help
    from gpuops.plan.apply import NodeResult

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_EDITED = 4  # apply --plan: the file is not what gpuops plan -o wrote (its digest differs)
DEFAULT_PARALLEL = 10
LOCALHOST = "localhost"  # the local node's name until its agent says its hostname

_out = CliConsole(highlight=False, soft_wrap=True)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        fail(escape(f"{path}: {exc.strerror or exc}"))


def _live(fleet: Fleet, parallel: int, names: set[str] | None = None) -> list[NodeLive]:
    from gpuops.fleet.targets import node_targets
    from gpuops.plan.live import read_fleet

    targets = [t for t in node_targets(fleet) if names is None or t.name in names]
    return asyncio.run(read_fleet(targets, parallel=parallel, handshakes=fleet.max_handshakes))


def _make(fleet_file: Path, parallel: int) -> tuple[Fleet, Plan]:
    fleet = load_or_fail(fleet_file)
    data = _read_bytes(fleet_file)
    # Absolute, so that a saved plan finds its fleet.yaml from any working directory.
    where = os.path.abspath(fleet_file)
    plan = make_plan(fleet, _live(fleet, parallel), where, digest(data), time.time())
    return fleet, plan


def _print_plan(plan: Plan) -> None:
    for line in plan_lines(plan):
        _out.print(line)


def _save(path: Path, plan: Plan) -> None:
    try:
        save_plan(path, plan)
    except PlanError as exc:
        fail(escape(str(exc)))
    except OSError as exc:
        fail(escape(f"cannot write {path}: {exc.strerror or exc}"))


def _document(plan: Plan) -> dict[str, Any]:
    try:
        return plan_document(plan)
    except PlanError as exc:
        fail(escape(str(exc)))


def _results_table(results: list[NodeResult]) -> None:
    from gpuops.plan.apply import CHANGED, PARTIAL, UNCHANGED

    for r in sorted(results, key=lambda r: r.name):
        style = {CHANGED: "green", UNCHANGED: "dim", PARTIAL: "yellow"}.get(r.status, "red")
        _out.print(f"[bold]node {r.name}[/]: [{style}]{r.status}[/]" + (f": {r.error}" if r.error else ""))
        for line in r.done:
            _out.print(f"  [green]done[/] {line}")
        for line in r.refused:
            _out.print(f"  [red]not done[/] {line}")
    counts = {s: sum(r.status == s for r in results) for s in (CHANGED, UNCHANGED, PARTIAL)}
    bad = len(results) - sum(counts.values())
    _out.print(
        f"Apply: {counts[CHANGED]} node(s) changed, {counts[UNCHANGED]} unchanged, "
        f"{counts[PARTIAL]} partly done, {bad} refused or failed."
    )


def _confirm(yes: bool, plan: Plan) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        fail("not a terminal: review the plan and confirm with --yes", code=EXIT_ERROR)
    disruptive = plan.counts()["disruptive"]
    question = "Apply these changes?" + (f" {disruptive} of them disrupt running work." if disruptive else "")
    if not typer.confirm(question, default=False):
        _out.print("Nothing applied.")
        raise typer.Exit(EXIT_ERROR)


def _finish(results: list[NodeResult], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"results": [r.to_json() for r in results]}, indent=2))
    else:
        _results_table(results)
    raise typer.Exit(EXIT_OK if all(r.ok for r in results) else EXIT_ERROR)


def plan_command(
    fleet_file: Path = typer.Argument(..., help="fleet.yaml with carve: settings."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Save the plan for `gpuops apply --plan`."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    parallel: int = typer.Option(DEFAULT_PARALLEL * 3, "--parallel", min=1, help="Nodes read at once."),
) -> None:
    """Show what apply would change (+ add, ~ change, - remove; disruptive actions marked).
    Exit 0: no changes; 1: error; 2: changes."""
    _fleet, plan = _make(fleet_file, parallel)
    if as_json:
        typer.echo(json.dumps(_document(plan), indent=2))
    else:
        _print_plan(plan)
    if out is not None:
        _save(out, plan)
        if not as_json:
            _out.print(f"Saved to {out}: apply it with gpuops apply --plan {out}")
    raise typer.Exit(plan.exit_code())


def _load_plan(path: Path) -> Plan:
    try:
        return read_plan(path)
    except EditedPlanError as exc:
        fail(escape(str(exc)), code=EXIT_EDITED)
    except PayloadError as exc:  # what the node would refuse: said as fleet.yaml's checks are
        fail(escape(f"{exc}; nothing applied"))
    except PlanError as exc:
        fail(escape(str(exc)))


def apply_command(
    fleet_file: Path | None = typer.Argument(None, help="fleet.yaml with carve: settings."),
    plan_file: Path | None = typer.Option(None, "--plan", help="Apply exactly this saved plan."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Stop processes that are in the way."),
    parallel: int = typer.Option(DEFAULT_PARALLEL, "--parallel", min=1, help="Nodes changed at once."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Make the live state what fleet.yaml says: per node concurrently, per GPU transactionally,
    verified after. Refuses GPUs with running processes in the way unless --force."""
    if plan_file is not None:
        _apply_saved(fleet_file, plan_file, yes, force, parallel, as_json)
        return
    if fleet_file is None:
        fail("say what to apply: FLEET.yaml, or --plan plan.json", code=2)
    fleet, plan = _make(fleet_file, parallel * 3)
    if not as_json:
        _print_plan(plan)
    if not plan.changes:
        failed = [n for n in plan.nodes if n.failed]
        if failed:
            raise typer.Exit(EXIT_ERROR)
        return
    _confirm(yes, plan)
    from gpuops.fleet.targets import node_targets
    from gpuops.plan.apply import apply_fleet

    saved = {n.name: n for n in plan.nodes if n.changes or n.failed}
    results = asyncio.run(apply_fleet(fleet, node_targets(fleet), saved, force=force, parallel=parallel))
    _finish(results, as_json)


def _apply_saved(
    fleet_file: Path | None, plan_file: Path, yes: bool, force: bool, parallel: int, as_json: bool
) -> None:
    from gpuops.fleet.targets import node_targets
    from gpuops.plan.apply import apply_fleet, shown_node, stale_gpus

    plan = _load_plan(plan_file)
    source = fleet_file or (Path(plan.fleet_file) if plan.fleet_file else None)
    if source is None:
        fail(
            escape(
                f"{plan_file}: the plan does not name its fleet.yaml; give it: gpuops apply FLEET --plan PLAN"
            )
        )
    fleet = load_or_fail(source)
    if not as_json and plan.fleet_digest and digest(_read_bytes(source)) != plan.fleet_digest:
        changed = escape(f"{source} changed since the plan was made; the plan is applied as saved")
        _out.print(f"[yellow]note:[/] {changed}")
    todo = {n.name: n for n in plan.nodes if any(g.has_payload for g in n.gpus)}
    if not todo:
        _out.print("The plan has no changes.")
        return
    unknown = sorted(set(todo) - {n.name for n in fleet.nodes})
    if unknown:
        fail(escape(f"{plan_file}: node {unknown[0]} is not in {source}"))
    # The whole plan is checked before anything is applied: a plan made from another state is
    # not applied anywhere.
    lives = _live(fleet, parallel * 3, set(todo))
    stale = []
    for live in lives:
        if not live.ok:
            stale.append(f"{live.name}: cannot read it ({live.error})")
            continue
        stale += [f"{live.name} {line}" for line in stale_gpus(todo[live.name], live)]
    if stale:
        for line in stale:
            _out.print(f"[red]changed since the plan:[/] {escape(line)}")
        fail(escape(f"the live state changed since {plan_file} was made; nothing applied (make a new plan)"))
    # The payloads pass what fleet.yaml's own checks pass, or nothing is applied anywhere (a file
    # signed again after an edit has a matching digest: docs/plan.md, "What is checked").
    from gpuops.plan.checks import payload_problems

    problems = payload_problems(plan, fleet, {live.name: live for live in lives}, str(plan_file))
    if problems:
        for line in problems[:-1]:
            typer.echo(f"error: {line}; nothing applied", err=True)
        fail(escape(f"{problems[-1]}; nothing applied"))
    # What is shown and confirmed is worked out from the payloads that will be sent.
    shown = Plan(tuple(shown_node(todo[live.name], live) for live in lives))
    if not shown.changes:
        _out.print("The plan has no changes left to make.")
        return
    if not as_json:
        _print_plan(shown)
    _confirm(yes, shown)
    nodes = {n.name: n for n in shown.nodes if n.changes}
    results = asyncio.run(apply_fleet(fleet, node_targets(fleet), nodes, force=force, parallel=parallel))
    _finish(results, as_json)


def assert_command(
    fleet_file: Path = typer.Argument(..., help="fleet.yaml with carve: settings."),
    parallel: int = typer.Option(DEFAULT_PARALLEL * 3, "--parallel", min=1, help="Nodes read at once."),
) -> None:
    """Exit 0 when every node has what fleet.yaml says, 1 with the differences when not."""
    _fleet, plan = _make(fleet_file, parallel)
    if plan.changes or plan.failed:
        unread = [n.name for n in plan.nodes if n.error]
        if unread and not plan.changes and not any(n.failed and not n.error for n in plan.nodes):
            # docs/cli.md: no verdict on nodes that could not be read; one message says so
            for line in plan_lines(plan, summary=False):
                _out.print(line)
            _out.print(
                "[red]Cannot tell whether the live state matches fleet.yaml: "
                f"{len(unread)} node(s) could not be read ({escape(', '.join(unread))}); "
                f"the {len(plan.nodes) - len(unread)} node(s) read match.[/]"
            )
        else:
            _print_plan(plan)
            _out.print("[red]The live state does not match.[/]")
        raise typer.Exit(EXIT_ERROR)
    _out.print("The live state matches fleet.yaml.")


def _carve_yaml(entries: list[dict[str, Any]], fleet_text: str | None) -> str:
    if fleet_text is None:
        return dump_yaml({"carve": carve_section(entries)})
    try:
        return set_carve(fleet_text, entries)
    except EditError as exc:
        fail(escape(str(exc)))


def export_command(
    fleet_file: Path | None = typer.Option(
        None, "-f", "--fleet", help="Export these nodes (default: this host)."
    ),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write here instead of standard output."),
    backend: str = typer.Option("nvml", "--backend", help="Without -f: nvml (real GPUs) or sim."),
    parallel: int = typer.Option(DEFAULT_PARALLEL * 3, "--parallel", min=1, help="Nodes read at once."),
) -> None:
    """The live MIG, MPS and limiter settings as fleet.yaml carve: entries. With -f, the whole file
    is written back with its carve: replaced, so `gpuops assert` on it passes."""
    if fleet_file is not None:
        fleet = load_or_fail(fleet_file)
        lives = _live(fleet, parallel)
        text: str | None = _read_bytes(fleet_file).decode("utf-8", "replace")
    else:
        lives = [asyncio.run(_local_live(backend))]
        text = None
    entries, notes = carve_entries(lives)
    if any(not live.ok for live in lives):
        # docs/cli.md: a carve: without a node's entries says that node has none; nothing is
        # written rather than a document that would undo its settings when applied.
        for live in lives:
            if not live.ok:
                typer.echo(f"error: {live.name}: not exported ({live.error or 'no data'})", err=True)
        raise typer.Exit(EXIT_ERROR)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    result = _carve_yaml(entries, text)
    if out is None:
        typer.echo(result, nl=False)
    else:
        try:
            out.write_text(result, encoding="utf-8")
        except OSError as exc:
            fail(escape(f"cannot write {out}: {exc.strerror or exc}"))


async def _local_live(backend: str) -> NodeLive:
    from dataclasses import replace

    from gpuops.cli.discover import local_client
    from gpuops.fleet.agent_client import AgentError
    from gpuops.plan.live import read_node

    try:
        async with local_client(backend) as client:
            live = await read_node(client, LOCALHOST)
    except AgentError as exc:
        return NodeLive(LOCALHOST, error=exc.message)
    except OSError as exc:
        return NodeLive(LOCALHOST, error=f"cannot start the local agent: {exc}")
    # read_node has taken the inventory: the entries are written for the host's own name
    return replace(live, name=live.node.hostname) if live.node is not None else live


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("apply")(apply_command)
    app.command("assert")(assert_command)
    app.command("export")(export_command)
