"""`gpuops sim`: a simulated GPU fleet on this machine — real SSH servers on 127.0.0.1.

gpuops sim up [--nodes N] [--scenario silos|large|mixed] [--dir DIR] [--seed S] [--prometheus]
                                                                            start it in the background
gpuops sim status [--dir DIR] [--json]                                      is it running, and where
gpuops sim down [--dir DIR]                                                 stop it (idempotent)
gpuops sim queue [--dir DIR] [--json]                                       the queued work and where it runs
gpuops sim event NODE KIND [XID] --gpu N [--gpu-instance GI]                a health event (XID, ECC)

DIR (default `$XDG_RUNTIME_DIR/gpuops-sim`, else `~/.cache/gpuops/sim`) receives fleet.yaml,
known_hosts, the client key and the log. See docs/simulator.md, "Simulated fleet".
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpuops.cli.errors import fail

sim_app = typer.Typer(
    name="sim",
    help="A simulated GPU fleet on this machine: real SSH servers on 127.0.0.1, one per node.",
    no_args_is_help=True,
)

_LIST_NODES_UP_TO = 12
_LIST_TEAMS_UP_TO = 12


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


def _dir(directory: Path | None) -> Path:
    from gpuops.simfleet import default_dir

    return (directory if directory is not None else default_dir()).expanduser().absolute()


def _dir_flag(directory: Path) -> str:
    """` --dir DIR` when DIR is not the default, for the commands we suggest."""
    from gpuops.simfleet import default_dir

    return "" if directory == default_dir().absolute() else f" --dir {shlex.quote(str(directory))}"


def _pasts(directory: Path) -> dict[str, Any] | None:
    """Where the nodes' simulated pasts stand, as the fleet writes it (state/pasts.json) while it
    builds them; None when it has not (yet)."""
    import json

    try:
        doc = json.loads((directory / "state" / "pasts.json").read_text())
        return {
            "nodes": int(doc["nodes"]),
            "built": int(doc["built"]),
            "days": float(doc["days"]),
            "background": bool(doc["background"]),
        }
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _history_line(directory: Path) -> str:
    """A first `tenants --window 7d` waits for the pasts of the nodes it asks: say how far."""
    doc = _pasts(directory)
    if doc is None:
        return ""
    nodes, built, days = doc["nodes"], doc["built"], doc["days"]
    if nodes and built >= nodes:
        return f"{days:g} days on every node"
    if doc["background"]:
        return f"{days:g}-day pasts being built: {built} of {nodes} nodes (a first read waits for the rest)"
    return f"{days:g}-day pasts built when a node is first asked: {built} of {nodes} nodes so far"


def _describe(state: dict[str, Any], directory: Path) -> list[str]:
    nodes = state.get("nodes") or []
    teams = state.get("teams") or {}
    per_team = Counter(str(n.get("owner")) for n in nodes)
    gpus = sum(int(n.get("gpus", 0)) for n in nodes)
    queued = sum(len(n.get("queued") or []) for n in nodes)
    lines = [
        f"  scenario: {state.get('scenario')} (seed {state.get('seed')}), "
        f"{len(nodes)} nodes, {gpus} GPUs, {queued} queued jobs",
        "  teams:    "
        + ", ".join(f"{t} ({per_team.get(t, 0)})" for t in list(teams)[:_LIST_TEAMS_UP_TO])
        + (f" and {len(teams) - _LIST_TEAMS_UP_TO} more" if len(teams) > _LIST_TEAMS_UP_TO else ""),
        f"  dir:      {directory}",
    ]
    if state.get("prometheus_url"):
        lines.append(f"  prometheus: {state['prometheus_url']} (scrapes every node's exporter)")
    history = _history_line(directory)
    if history:
        lines.append(f"  history:  {history}")
    if len(nodes) <= _LIST_NODES_UP_TO:
        width = max(len(str(n.get("name"))) for n in nodes) if nodes else 0
        lines.append("  nodes:")
        for n in nodes:
            lines.append(
                f"    {n.get('name')!s:<{width}}  {state.get('host', '127.0.0.1')}:{n.get('port')}  "
                f"owner {n.get('owner')}, {n.get('gpus')} GPUs, {n.get('profile')}"
            )
    else:
        ports = [int(n.get("port", 0)) for n in nodes]
        lines.append(f"  nodes:    {state.get('host', '127.0.0.1')} ports {min(ports)}-{max(ports)}")
    return lines


@sim_app.command("up")
def up(
    nodes: int | None = typer.Option(
        None, "--nodes", "-n", help="How many nodes (default: 8 for silos, 200 for large, 6 for mixed)."
    ),
    scenario: str = typer.Option(
        "silos",
        "--scenario",
        "-s",
        help="silos (the demo), large (benchmarks) or mixed (NVIDIA and AMD MI300X nodes).",
    ),
    directory: Path | None = typer.Option(
        None, "--dir", help="Where fleet.yaml, keys and the log go (default: $XDG_RUNTIME_DIR/gpuops-sim)."
    ),
    seed: int = typer.Option(0, "--seed", help="Same seed, same fleet."),
    base_port: int = typer.Option(
        0, "--base-port", help="Listen on consecutive ports from here (default: free ports)."
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait until every node listens."),
    queue_speed: float = typer.Option(
        60.0,
        "--queue-speed",
        help="Queued work runs this many times faster than real time (60: a 6h job takes 6 minutes).",
    ),
    prometheus: bool = typer.Option(
        False,
        "--prometheus",
        help="Also start a Prometheus (Debian's prometheus) on loopback scraping every node's exporter, "
        "with gpuops' rules; its URL is in sim status.",
    ),
    fresh: bool = typer.Option(
        False,
        "--fresh",
        help="Start from the scenario alone: remove the node agents' state that earlier runs in --dir "
        "kept (recorded history, MPS record, MIG journal).",
    ),
) -> None:
    """Start a simulated fleet in the background and write fleet.yaml for it. The node agents'
    state (recorded history, MPS record, MIG journal) is kept from one run in --dir to the next
    (--fresh: removed first)."""
    from gpuops.simfleet import ScenarioError, SimFleetError, launch

    where = _dir(directory)
    if not 0 <= base_port <= 65535:
        fail(f"--base-port must be 0 (free ports) or a port from 1 to 65535 (got {base_port})", code=2)
    try:
        started = launch(
            where,
            scenario,
            nodes,
            seed,
            base_port=base_port,
            timeout=timeout,
            queue_speed=queue_speed,
            prometheus=prometheus,
            fresh=fresh,
        )
    except ScenarioError as exc:
        fail(escape(str(exc)), code=2)
    except SimFleetError as exc:
        fail(escape(str(exc)))
    except OSError as exc:
        fail(escape(f"cannot start the sim fleet in {where}: {exc.strerror or exc}"))
    state = started.state
    typer.echo(f"sim fleet up (pid {started.pid}, ready in {started.seconds:.1f}s)")
    for line in _describe(state, where):
        typer.echo(line)
    fleet = shlex.quote(str(where / "fleet.yaml"))
    typer.echo("next:")
    typer.echo(f"  gpuops discover -f {fleet}")
    typer.echo(f"  gpuops status -f {fleet}")
    url = state.get("prometheus_url")
    if url:
        typer.echo(f"  gpuops tui -f {fleet} --prometheus {url}")
        typer.echo(f"  gpuops tenants -f {fleet} --prometheus {url} --window 5m")
    if any(n.get("queued") for n in state.get("nodes") or []):
        typer.echo(f"  gpuops rebalance -f {fleet} -o proposed.yaml   # then: gpuops apply proposed.yaml")
        typer.echo(f"  gpuops sim queue{_dir_flag(where)}            # the queued work, and where it runs")
    typer.echo(f"  gpuops sim down{_dir_flag(where)}")


@sim_app.command("down")
def down(
    directory: Path | None = typer.Option(None, "--dir", help="The fleet's directory (as given to sim up)."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds to wait after SIGTERM before SIGKILL."),
) -> None:
    """Stop the simulated fleet (nothing to do if none runs)."""
    from gpuops.simfleet import SimFleetError, stop

    try:
        typer.echo(stop(_dir(directory), timeout=timeout))
    except SimFleetError as exc:
        fail(escape(str(exc)))


@sim_app.command("status")
def status(
    directory: Path | None = typer.Option(None, "--dir", help="The fleet's directory (as given to sim up)."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="One JSON document: state, fleet.yaml, and each node's SSH port and metrics_url.",
    ),
) -> None:
    """Whether a simulated fleet runs, and what it serves (exit 1 when none runs)."""
    from gpuops.simfleet import read_state, running_pid

    where = _dir(directory)
    pid = running_pid(where)
    if pid is None:
        if as_json:
            _echo_json(
                {"state": "stopped", "dir": str(where), "pid": None, "prometheus_url": None, "nodes": []}
            )
        else:
            typer.echo(f"no simulated fleet runs in {where}")
        raise typer.Exit(1)
    state = read_state(where)
    if pid == 0 or state is None or state.get("pid") != pid:
        if as_json:
            _echo_json(
                {
                    "state": "starting",
                    "dir": str(where),
                    "pid": pid or None,
                    "prometheus_url": None,
                    "nodes": [],
                }
            )
        else:
            typer.echo(f"a simulated fleet is starting in {where}")
        return
    if as_json:
        _echo_json(status_document(state, where))
        return
    typer.echo(f"sim fleet running (pid {pid})")
    for line in _describe(state, where):
        typer.echo(line)


def _echo_json(doc: dict[str, Any]) -> None:
    import json

    typer.echo(json.dumps(doc, indent=1))


def status_document(state: dict[str, Any], directory: Path) -> dict[str, Any]:
    """`sim status --json` of a running fleet: where each node's SSH server and exporter listen."""
    host = str(state.get("host", "127.0.0.1"))
    nodes = []
    for n in state.get("nodes") or []:
        metrics_port = n.get("metrics_port")
        nodes.append(
            {
                "name": n.get("name"),
                "host": host,
                "port": n.get("port"),
                "metrics_url": f"http://{host}:{metrics_port}/metrics" if metrics_port else None,
                "owner": n.get("owner"),
                "gpus": n.get("gpus"),
                "profile": n.get("profile"),
            }
        )
    return {
        "state": "running",
        "dir": str(directory),
        "pid": state.get("pid"),
        "scenario": state.get("scenario"),
        "seed": state.get("seed"),
        "fleet": state.get("fleet"),
        # `sim up --prometheus`: the Prometheus scraping the fleet, else null.
        "prometheus_url": state.get("prometheus_url"),
        # The simulated pasts: {"nodes", "built", "days", "background"}, null before the first write.
        "history": _pasts(directory),
        "nodes": nodes,
    }


@sim_app.command("event")
def event(
    node: str = typer.Argument(..., help="The simulated node (a name from sim status)."),
    kind: str = typer.Argument(..., help="xid, ecc_single_bit, ecc_double_bit, clock, pstate or other."),
    xid: int | None = typer.Argument(None, help="The XID number of an xid event (79: fallen off the bus)."),
    gpu: int = typer.Option(0, "--gpu", help="The GPU's index on the node."),
    gpu_instance: int | None = typer.Option(None, "--gpu-instance", help="The MIG GPU instance it is on."),
    compute_instance: int | None = typer.Option(None, "--compute-instance", help="The compute instance."),
    directory: Path | None = typer.Option(None, "--dir", help="The fleet's directory (as given to sim up)."),
) -> None:
    """Make a simulated node's GPU report a health event, as NVML's event set would: the node's
    next sample carries it (gpuops_xid_errors_total, the TUI's :events screen)."""
    from gpuops.simfleet import read_state, running_pid
    from gpuops.simfleet.faults import event_problem, inject_event

    where = _dir(directory)
    state = read_state(where) if running_pid(where) else None
    if state is None:
        fail(f"no simulated fleet runs in {where} (gpuops sim up)")
    nodes = {str(n.get("name")): int(n.get("gpus", 0)) for n in state.get("nodes") or []}
    if node not in nodes:
        fail(f"no node {escape(node)!r} in the fleet of {where} (gpuops sim status lists them)")
    if not 0 <= gpu < nodes[node]:
        fail(f"--gpu {gpu}: {node} has GPUs 0-{nodes[node] - 1}")
    problem = event_problem(kind, gpu, xid, gpu_instance, compute_instance)
    if problem:
        fail(escape(problem))
    inject_event(where / "state" / node, kind, gpu, xid, gpu_instance, compute_instance)
    what = f"XID {xid}" if kind == "xid" else kind
    typer.echo(f"{node}: {what} on GPU {gpu} queued; the node's next sample reports it")


@sim_app.command("queue")
def queue(
    directory: Path | None = typer.Option(None, "--dir", help="The fleet's directory (as given to sim up)."),
    as_json: bool = typer.Option(False, "--json", help="demand.json as the scheduler wrote it."),
) -> None:
    """The simulated fleet's queued work: where each job runs, what is done, per team (exit 1 when
    there is none, or no fleet runs there)."""
    import json
    import time

    from gpuops.simfleet import running_pid
    from gpuops.simfleet.demand import read_demand

    where = _dir(directory)
    doc = read_demand(where)
    if doc is None:
        fail(f"no queued work recorded in {where} (is a sim fleet running there? gpuops sim status)")
    try:
        lines = queue_lines(doc, time.time())
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a file edited or cut short
        fail(f"{where / 'demand.json'}: not a queue this version writes ({type(exc).__name__}: {exc})")
    if running_pid(where) is None:
        # `sim down` leaves demand.json for the post-mortem; nothing runs it any more.
        fail(
            f"no simulated fleet runs in {where}; its demand.json is the queue when it stopped "
            f"(start one: gpuops sim up{_dir_flag(where)})"
        )
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
        return
    for line in lines:
        typer.echo(line)


def queue_lines(doc: dict[str, Any], now: float) -> list[str]:
    """The queue as a person reads it: one line per job, then one per team."""
    age = max(now - float(doc.get("updated") or now), 0.0)
    lines = [f"Queued work (runs {float(doc.get('speed') or 1):g}x real time; updated {age:.0f}s ago)"]
    jobs = doc.get("jobs") or []
    rows = [("JOB", "TEAM", "STATE", "WHERE", "GRANT", "WORK", "DONE")]
    for job in jobs:
        where = f"{job['node']}:{job['gpu']}" if job.get("node") else "-"
        work = float(job.get("work_hours") or 0)
        done = float(job.get("done_hours") or 0)
        rows.append(
            (
                str(job.get("id")),
                str(job.get("team")),
                str(job.get("state")),
                where,
                str(job.get("grant") or "-"),
                f"{work:.1f}h",
                f"{100 * done / work:.0f}%" if work else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for team, t in sorted((doc.get("teams") or {}).items()):
        total = float(t.get("work_done_hours", 0)) + float(t.get("work_left_hours", 0))
        lines.append(
            f"{team}: {t.get('done', 0)} done, {t.get('running', 0)} running, {t.get('queued', 0)} waiting; "
            f"{float(t.get('work_done_hours', 0)):.1f} of {total:.1f} job-hours done"
        )
    return lines
