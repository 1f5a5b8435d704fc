"""`gpuops limiter`: the interception limiter (native/libgpuops-limiter.so) from the command line.

gpuops limiter run --tenant T [--memory 8GiB] [--compute 30%] [--policy fixed-share]
                   [--class online] -- CMD...     run one program under the limiter
gpuops limiter status [--interval 1s] [--json]    tenants, processes, usage and GPU shares
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.core.driver_memory import cuda_version_text, mib_text
from gpuops.core.units import (
    UnitError,
    format_bytes,
    format_duration,
    parse_bytes,
    parse_duration,
    parse_percent,
)
from gpuops.node import limiter

limiter_app = typer.Typer(
    name="limiter",
    help="Memory caps and compute shares per tenant for unmodified CUDA programs (interception limiter).",
    no_args_is_help=True,
)

LIB_NAME = "libgpuops-limiter.so"


def register(app: typer.Typer) -> None:
    app.add_typer(limiter_app, name="limiter")


def find_library(explicit: Optional[Path] = None) -> Optional[Path]:
    """The limiter library: --lib, $GPUOPS_LIMITER_LIB, a source checkout's native/build, or an
    installed copy."""
    candidates = []
    if explicit:
        candidates.append(explicit)
    env = os.environ.get("GPUOPS_LIMITER_LIB")
    if env:
        candidates.append(Path(env))
    candidates += [
        Path(__file__).resolve().parents[2] / "native" / "build" / LIB_NAME,
        Path("/usr/local/lib/gpuops") / LIB_NAME,
        Path("/usr/lib/gpuops") / LIB_NAME,
    ]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    return None


def _limiter_dir(explicit: Optional[Path]) -> Path:
    """Where the regions live: --dir, $GPUOPS_LIMITER_DIR, the node's directory when it exists,
    else a private one for ad-hoc use on a node without the agent."""
    if explicit:
        return explicit
    env = os.environ.get("GPUOPS_LIMITER_DIR")
    if env:
        return Path(env)
    default = Path(limiter.DEFAULT_DIR)
    if default.is_dir():
        return default
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path("/tmp")
    return base / f"gpuops-limiter-{os.getuid()}"


@limiter_app.command("run")
def run(
    command: Annotated[list[str], typer.Argument(help="The program and its arguments (after --).")],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant (team) the program belongs to.")],
    memory: Annotated[Optional[str], typer.Option(help="GPU memory cap, e.g. 8GiB.")] = None,
    compute: Annotated[Optional[str], typer.Option(help="Compute share of the GPU, e.g. 30%.")] = None,
    policy: Annotated[
        Optional[str], typer.Option(help="fixed-share (a cap), burst-share (a guarantee) or best-effort.")
    ] = None,
    klass: Annotated[
        Optional[str], typer.Option("--class", help="online, or offline (yields to online).")
    ] = None,
    directory: Annotated[
        Optional[Path], typer.Option("--dir", help="Limiter directory (regions, table).")
    ] = None,
    lib: Annotated[Optional[Path], typer.Option(help=f"Path of {LIB_NAME}.")] = None,
) -> None:
    """Run CMD with the limiter preloaded.  The node's tenant table, when it has a line for the
    tenant, still applies: these options can only lower its limits."""
    spec_kwargs: dict[str, Any] = {"name": tenant}
    try:
        if memory is not None:
            spec_kwargs["memory"] = parse_bytes(memory)
        if compute is not None:
            spec_kwargs["compute"] = parse_percent(compute)
    except UnitError as exc:
        fail(escape(str(exc)))
    spec_kwargs["policy"] = policy
    spec_kwargs["klass"] = klass or "online"
    try:
        spec = limiter.TenantSpec(**spec_kwargs)
        spec.validate()
    except limiter.LimiterError as exc:
        fail(escape(str(exc)))
    library = find_library(lib)
    if library is None:
        fail(f"{LIB_NAME} not found: build it with 'make -C native' or give --lib PATH")
    where = _limiter_dir(directory)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(escape(f"cannot use limiter directory {where}: {exc.strerror}"))
    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library} {preload}".strip() if str(library) not in preload else preload
    env["GPUOPS_TENANT"] = tenant
    env["GPUOPS_LIMITER_DIR"] = str(where)
    for name, value in (
        ("GPUOPS_MEMORY_LIMIT", str(spec.memory) if spec.memory is not None else None),
        ("GPUOPS_COMPUTE_SHARE", f"{spec.compute:g}" if spec.compute is not None else None),
        ("GPUOPS_POLICY", policy),
        ("GPUOPS_CLASS", klass),
    ):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        fail(escape(f"cannot run {command[0]}: {exc.strerror}"), code=127)


def _policy_text(t: limiter.TenantUsage) -> str:
    """'fixed 30%', 'burst 70%' or 'best-effort'."""
    if t.policy == "best-effort" or not t.compute_percent:
        return t.policy
    return f"{t.policy.split('-')[0]} {t.compute_percent:g}%"


def _share_text(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _snapshot_json(snap: limiter.RegionSnapshot, shares: dict[str, float]) -> dict[str, Any]:
    return {
        "gpu_uuid": snap.gpu_uuid,
        "path": snap.path,
        "lease": {"state": snap.lease_state, "holder": snap.lease_holder, "transitions": snap.transitions},
        # what the driver takes of the GPU, as the library measured it (docs/limiter.md)
        "driver": {
            "context_bytes": snap.context_bytes,
            "context_cuda_version": cuda_version_text(snap.context_cuda_version) or None,
            "context_measurements": snap.context_measured,
            "context_max_bytes": snap.context_max_bytes or None,
            "cuda_total_bytes": snap.cuda_total_bytes or None,
        },
        "tenants": [
            {
                "tenant": t.name,
                "policy": t.policy,
                "class": t.klass,
                "compute_share_ratio": t.compute_percent / 100 if t.compute_percent else None,
                "gpu_share_ratio": shares.get(t.name),
                "memory_used_bytes": t.memory_used,
                "memory_limit_bytes": t.memory_limit if t.memory_limit or t.memory_capped else None,
                "gpu_time_seconds": t.busy_ns / 1e9,
                "processes": t.processes,
            }
            for t in snap.tenants
        ],
        "processes": [
            {
                "pid": p.pid,
                "tenant": p.tenant,
                "alive": p.alive,
                "memory_used_bytes": p.memory_used,
                "gpu_time_seconds": p.busy_ns / 1e9,
                "launches": p.launches,
                "waited_seconds": p.waited_ns / 1e9,
            }
            for p in snap.processes
        ],
    }


@limiter_app.command("status")
def status(
    directory: Annotated[Optional[Path], typer.Option("--dir", help="Limiter directory.")] = None,
    interval: Annotated[
        str, typer.Option(help="Sample twice this far apart to measure GPU shares (0 to skip).")
    ] = "1s",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    show_dead: Annotated[bool, typer.Option("--all", help="Also list processes that have exited.")] = False,
) -> None:
    """Tenants, processes, memory and GPU shares on this node, from the limiter's regions."""
    where = _limiter_dir(directory)
    try:
        wait = parse_duration(interval)
    except UnitError as exc:
        fail(escape(str(exc)))
    try:
        generation, specs = limiter.read_table(where)
        table_error = None
    except limiter.LimiterError as exc:
        generation, specs, table_error = 0, [], str(exc)
    first = limiter.read_regions(where)
    shares: dict[str, dict[str, float]] = {}
    snaps = first
    if wait > 0 and any(s for _, s, _ in first):
        time.sleep(wait)
        snaps = limiter.read_regions(where)
        before = {str(p): s for p, s, _ in first if s}
        for path, snap, _ in snaps:
            if snap and str(path) in before:
                shares[str(path)] = limiter.gpu_shares(before[str(path)], snap)
    if as_json:
        doc = {
            "directory": str(where),
            "table": {"generation": generation, "tenants": len(specs), "error": table_error},
            "gpus": [_snapshot_json(s, shares.get(str(p), {})) for p, s, _ in snaps if s],
            "errors": [{"path": str(p), "error": e} for p, s, e in snaps if e],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    console = CliConsole(highlight=False)
    console.print(
        f"limiter directory {escape(str(where))}: tenant table generation {generation}, {len(specs)} line(s)"
        + (f" [red]({escape(table_error)})[/]" if table_error else "")
    )
    if not snaps:
        console.print("no GPU regions yet: no program has run under the limiter here")
        return
    for path, snap, error in snaps:
        if snap is None:
            console.print(f"[red]{escape(str(path))}: {escape(error or '')}[/]")
            continue
        gpu_shares = shares.get(str(path), {})
        holder = f", held by {escape(snap.lease_holder)}" if snap.lease_holder else ""
        title = f"GPU {escape(snap.gpu_uuid)} — lease {snap.lease_state}{holder}"
        if snap.context_bytes is not None:  # the memory counts include it, per process
            version = cuda_version_text(snap.context_cuda_version)
            title += f" — a CUDA context costs {mib_text(snap.context_bytes)}" + (
                f" (CUDA {version})" if version else ""
            )
        table = Table(title=title, box=box.SIMPLE, title_justify="left", pad_edge=False, padding=(0, 1))
        for col in ("TENANT", "POLICY", "CLASS", "GPU NOW", "GPU TIME", "MEMORY", "LIMIT", "PROCS"):
            left = col in ("TENANT", "POLICY", "CLASS")
            table.add_column(col, justify="left" if left else "right")
        for t in snap.tenants:
            table.add_row(
                escape(t.name),
                _policy_text(t),
                t.klass,
                _share_text(gpu_shares.get(t.name)) if gpu_shares else "n/a",
                format_duration(t.busy_ns / 1e9),
                format_bytes(t.memory_used),
                format_bytes(t.memory_limit) if t.memory_limit or t.memory_capped else "-",
                str(t.processes),
            )
        console.print(table)
        procs = Table(box=box.SIMPLE)
        for col in ("PID", "TENANT", "MEMORY", "GPU TIME", "LAUNCHES", "WAITED", "STATE"):
            procs.add_column(col, justify="left" if col in ("TENANT", "STATE") else "right")
        for p in snap.processes:
            if not p.alive and not show_dead:
                continue
            procs.add_row(
                str(p.pid),
                escape(p.tenant),
                format_bytes(p.memory_used),
                format_duration(p.busy_ns / 1e9),
                str(p.launches),
                format_duration(p.waited_ns / 1e9),
                "running" if p.alive else "exited",
            )
        if procs.row_count:
            console.print(procs)
