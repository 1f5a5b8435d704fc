"""`gpuops discover --local`: what GPUs this host has and what runs on them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.core.codec import to_json
from gpuops.core.mig.catalog import find_model
from gpuops.core.model import Gpu, Node, NodeSample
from gpuops.core.vendor import runtime_name
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.local import local_agent
from gpuops.views import format as render


@asynccontextmanager
async def local_client(backend: str, sim_spec: str | None = None) -> AsyncIterator[AgentClient]:
    """This host's agent, greeted, with a backend that works (`discover --local`, `export`
    without -f); raises AgentError (backend_unavailable: it runs but cannot reach the GPUs) or
    OSError (it did not start)."""
    async with local_agent(backend, sim_spec) as client:
        assert client.hello is not None
        if client.hello.backend_error:
            raise AgentError("backend_unavailable", client.hello.backend_error)
        yield client


async def _collect(backend: str, sim_spec: str | None) -> tuple[Node, NodeSample]:
    async with local_client(backend, sim_spec) as client:
        node = await client.inventory()
        sample = await client.sample()
        return node, sample


def _unavailable_hint(backend: str) -> str:
    if backend == "nvml":
        return " — to try gpuops without a GPU: gpuops discover --local --backend sim"
    return ""


def register(app: typer.Typer) -> None:
    @app.command("discover")
    def discover(
        local: bool = typer.Option(False, "--local", help="This host's GPUs, through a local agent."),
        backend: str = typer.Option("nvml", "--backend", help="nvml (real GPUs) or sim (simulated node)."),
        sim_spec: Path | None = typer.Option(
            None, "--sim-spec", help="Simulator spec (JSON) for --backend sim."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts instead of tables."),
        fleet_file: Path | None = typer.Option(
            None, "-f", "--fleet", help="Discover the nodes of this fleet.yaml."
        ),
        timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for slow nodes (with -f)."),
        prometheus: str | None = typer.Option(
            None,
            "--prometheus",
            help="Read the fleet from this Prometheus (its API's base URL) instead of over SSH.",
        ),
    ) -> None:
        """Show GPUs, MIG layout and processes of this host (--local) or of a fleet (-f, --prometheus)."""
        if fleet_file is not None or prometheus is not None:
            if local:
                fail("give either --local or a fleet (-f FLEET.yaml, --prometheus URL), not both", code=2)
            from gpuops.cli.fleet import discover_fleet

            discover_fleet(fleet_file, as_json, timeout, prometheus)
            return
        if not local:
            fail(
                "say which GPUs to discover: --local for this host; "
                "-f fleet.yaml or --prometheus URL for a fleet",
                code=2,
            )
        if sim_spec is not None and backend != "sim":
            fail("--sim-spec only goes with --backend sim", code=2)
        try:
            node, sample = asyncio.run(_collect(backend, str(sim_spec) if sim_spec else None))
        except AgentError as exc:
            fail(exc.message + _unavailable_hint(backend))
        except OSError as exc:
            fail(f"cannot start the local agent: {exc}")
        if as_json:
            document = to_json(node)
            document["gpus"] = to_json(sample.gpus)
            document["timestamp"] = sample.timestamp
            typer.echo(json.dumps(document, indent=2))
            return
        print_node(CliConsole(), node, sample)


def print_node(console: Console, node: Node, sample: NodeSample) -> None:
    title = f"{node.hostname} — {len(sample.gpus)} GPU(s), backend {node.backend}"
    if node.driver_version:
        title += f", driver {node.driver_version}"
    if node.cuda_driver_version:
        # AMD nodes give their ROCm release in the same field (docs/backends.md), simulated
        # ones too: the GPUs' vendor says which, not the backend's name.
        runtime = runtime_name((g.info for g in node.gpus), node.backend)
        title += f", {runtime} {node.cuda_driver_version}"
    # Node text (host names, models, users, command lines) is shown as it is, never as markup.
    gpus = Table(title=Text(title), title_justify="left", expand=False)
    for column in ("GPU", "Model", "Owner", "Util", "Memory", "Power", "Temp", "MIG", "Procs"):
        gpus.add_column(column, no_wrap=column != "MIG")
    for gpu in sample.gpus:
        _plain_row(gpus, *_gpu_row(gpu))
        for gi in gpu.mig.gpu_instances if gpu.mig else ():
            used = next((m.memory_used_bytes for m in gpu.mig_samples if m.gpu_instance_id == gi.id), None)
            procs = sum(1 for p in gpu.processes if p.gpu_instance_id == gi.id)
            cis = ", ".join(ci.name for ci in gi.compute_instances) or "no compute instance"
            _plain_row(
                gpus,
                "",
                f"  └ {gi.profile_name} (GI {gi.id})",
                "",
                "",
                render.memory_usage(used, gi.memory_total_bytes)
                if used is not None
                else render.size(gi.memory_total_bytes),
                "",
                "",
                f"{render.slice_range(gi)}; {cis}",
                str(procs),
            )
    console.print(gpus)
    processes = [(gpu, p) for gpu in sample.gpus for p in gpu.processes]
    if not processes:
        console.print("No GPU processes.")
        return
    table = Table(title="Processes", title_justify="left")
    for column in ("GPU", "MIG", "PID", "User", "Tenant", "Memory", "Command"):
        table.add_column(column, no_wrap=column != "Command")
    from gpuops.tenancy import AttributionContext, default_chain

    chain = default_chain()  # no fleet.yaml here: the limiter's label, else the GPU's owner
    for gpu, p in processes:
        mig = "" if p.gpu_instance_id is None else f"GI {p.gpu_instance_id}/CI {p.compute_instance_id}"
        found = chain.attribute(p, AttributionContext(node.hostname, gpu, gpu.owner))
        tenant = f"{found.team} ({found.source})"
        _plain_row(
            table,
            str(gpu.info.index),
            mig,
            str(p.pid),
            p.user or "?",
            tenant,
            render.size(p.used_memory_bytes),
            p.command,
        )
    console.print(table)


def _plain_row(table: Table, *cells: str) -> None:
    table.add_row(*(Text(cell) for cell in cells))


def _gpu_row(gpu: Gpu) -> list[str]:
    info, s = gpu.info, gpu.sample
    util = render.percent(s.utilization_gpu_percent) if s else render.NA
    memory = (
        render.memory_usage(s.memory_used_bytes, s.memory_total_bytes)
        if s
        else render.size(info.memory_total_bytes)
    )
    if gpu.partition is not None:
        part = gpu.partition
        mig = f"partition {part.compute_mode or '?'} ({part.partitions}) / {part.memory_mode or '?'}"
    elif gpu.mig is None:
        mig = "not supported"
    else:
        mode = "on" if gpu.mig.current else "off"
        if gpu.mig.pending != gpu.mig.current:
            mode += f" (pending {'on' if gpu.mig.pending else 'off'}: reset needed)"
        mig = mode
        model = find_model(info.mig_model or info.name)
        if gpu.mig.current and model is not None:
            mig += " " + render.slice_map(gpu.mig.gpu_instances, model.memory_slice_count)
    return [
        str(info.index),
        info.name,
        gpu.owner or "",
        util,
        memory,
        render.watts(s.power_watts) if s else render.NA,
        render.celsius(s.temperature_celsius) if s else render.NA,
        mig,
        render.NA if gpu.processes_error else str(len(gpu.processes)),
    ]
