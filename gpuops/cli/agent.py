"""`gpuops agent --stdio | --record | --metrics ADDRESS`: the node agent, for nodes where gpuops is
installed."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuops.cli.errors import fail


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
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
        from gpuops.node.main import run_agent

        if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            fail(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}", code=2)
        if metrics is not None:
            if stdio:
                fail(
                    "--metrics is a service of its own: give it alone or with --record, not with --stdio",
                    code=2,
                )
            from gpuops.node.exporter import DEFAULT_INTERVAL, run_exporter

            raise typer.Exit(
                run_exporter(
                    metrics,
                    backend,
                    str(sim_spec) if sim_spec else None,
                    interval if interval is not None else DEFAULT_INTERVAL,
                    process_metrics,
                    log_level.upper(),
                    str(state_dir) if state_dir else None,
                    str(limiter_dir) if limiter_dir else None,
                    str(mps_control) if mps_control else None,
                    str(history_dir) if history_dir else None,
                    record=record,
                    dcgm_compat=dcgm_compat,
                )
            )
        if interval is not None or process_metrics is not None or dcgm_compat:
            fail("--interval, --process-metrics and --dcgm-compat go with --metrics", code=2)
        if stdio and record:
            fail("give one of --stdio (serve the protocol) or --record (keep history), not both", code=2)
        if not stdio and not record:
            fail(
                "the agent speaks over stdin/stdout (--stdio), keeps history (--record) or serves "
                "metrics (--metrics ADDRESS): add one",
                code=2,
            )
        spec = str(sim_spec) if sim_spec else None
        if record:
            from gpuops.node.main import record as record_history

            raise typer.Exit(
                record_history(
                    backend,
                    spec,
                    log_level.upper(),
                    str(state_dir) if state_dir else None,
                    str(history_dir) if history_dir else None,
                    record_interval,
                    str(limiter_dir) if limiter_dir else None,
                )
            )
        raise typer.Exit(
            run_agent(
                backend,
                spec,
                log_level.upper(),
                str(state_dir) if state_dir else None,
                str(limiter_dir) if limiter_dir else None,
                str(mps_control) if mps_control else None,
                str(history_dir) if history_dir else None,
            )
        )
