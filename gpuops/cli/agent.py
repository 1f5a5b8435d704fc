"""`gpuops agent --stdio | --record | --metrics ADDRESS`: the node agent, for nodes where gpuops is
installed.

The options are checked here, with the CLI's messages; then the node's own entry
(gpuops/node/main.py) runs the agent. Run as a program, `gpuops agent` becomes that entry (exec,
as git runs git-<command>): a long-running agent then holds only what `python -m gpuops.node agent`
holds, not the CLI's framework (typer, its pydantic coercion, rich: about 12 MB).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from gpuops.cli.errors import fail
from gpuops.cli.main import AS_PROGRAM


def run_node_entry(argv: list[str], replace_process: bool) -> int:
    """The node's command line with these arguments: in this process, or instead of it."""
    if replace_process:
        sys.stdout.flush()
        sys.stderr.flush()
        # The gpuops that parsed the options runs the agent, whatever the working folder holds.
        root = str(Path(__file__).resolve().parent.parent.parent)
        code = (
            f"import sys; sys.path.insert(0, {root!r}); from gpuops.node.main import main; sys.exit(main())"
        )
        os.execv(sys.executable, [sys.executable, "-P", "-c", code, *argv])
    from gpuops.node.main import main as node_main

    return node_main(argv)


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        ctx: typer.Context,
        stdio: bool = typer.Option(False, "--stdio", help="Serve the JSON-lines protocol on stdin/stdout."),
        backend: str = typer.Option("nvml", "--backend", help="Where GPU facts come from: nvml or sim."),
        sim_spec: Path | None = typer.Option(
            None, "--sim-spec", help="Simulator spec (JSON), --backend sim."
        ),
        log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
        state_dir: Path | None = typer.Option(
            None, "--state-dir", help="Node lock and MIG journal directory."
        ),
        limiter_dir: Path | None = typer.Option(
            None,
            "--limiter-dir",
            help="The limiter's tenant table and regions (default /run/gpuops/limiter).",
        ),
        mps_control: Path | None = typer.Option(
            None, "--mps-control", help="nvidia-cuda-mps-control to run (default: the one on PATH)."
        ),
        record: bool = typer.Option(
            False, "--record", help="Service mode: sample forever and keep history in --history-dir."
        ),
        history_dir: Path | None = typer.Option(
            None,
            "--history-dir",
            help="History kept by --record and served by --stdio (default: <state dir>/history).",
        ),
        record_interval: float = typer.Option(
            10.0, "--record-interval", help="Seconds between samples with --record."
        ),
        metrics: str | None = typer.Option(
            None,
            "--metrics",
            metavar="ADDRESS",
            help="Serve Prometheus /metrics on ADDRESS (default port 9835, e.g. 127.0.0.1:9835), "
            "alone or with --record.",
        ),
        interval: float | None = typer.Option(
            None, "--interval", help="Seconds between samples with --metrics (default 1)."
        ),
        process_metrics: str | None = typer.Option(
            None,
            "--process-metrics",
            metavar="top:N",
            help="With --metrics: series for the N processes holding the most GPU memory.",
        ),
        dcgm_compat: bool = typer.Option(
            False,
            "--dcgm-compat",
            help="With --metrics: dcgm-exporter's names and units as well (DCGM_FI_DEV_*), for "
            "dashboards written for it. Off by default: a node may run dcgm-exporter too.",
        ),
    ) -> None:
        """Serve the node agent protocol (used by the fleet over SSH, or by hand for debugging)."""
        if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            fail(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}", code=2)
        if metrics is not None:
            if stdio:
                fail(
                    "--metrics is a service of its own: give it alone or with --record, not with --stdio",
                    code=2,
                )
        elif interval is not None or process_metrics is not None or dcgm_compat:
            fail("--interval, --process-metrics and --dcgm-compat go with --metrics", code=2)
        elif stdio and record:
            fail("give one of --stdio (serve the protocol) or --record (keep history), not both", code=2)
        elif not stdio and not record:
            fail(
                "the agent speaks over stdin/stdout (--stdio), keeps history (--record) or serves "
                "metrics (--metrics ADDRESS): add one",
                code=2,
            )
        # The node's parser gets what was given, in its spelling; what was not keeps its default,
        # the same as this command's.
        argv = [
            "agent",
            "--backend",
            backend,
            "--log-level",
            log_level.upper(),
            "--record-interval",
            repr(record_interval),
        ]
        flags = {"--stdio": stdio, "--record": record, "--dcgm-compat": dcgm_compat}
        argv += [flag for flag, given in flags.items() if given]
        values = {
            "--sim-spec": sim_spec,
            "--state-dir": state_dir,
            "--limiter-dir": limiter_dir,
            "--mps-control": mps_control,
            "--history-dir": history_dir,
            "--metrics": metrics,
            "--interval": None if interval is None else repr(interval),
            "--process-metrics": process_metrics,
        }
        for option, value in values.items():
            if value is not None:
                argv += [f"{option}={value}"]
        raise typer.Exit(run_node_entry(argv, replace_process=ctx.find_root().obj == AS_PROGRAM))
