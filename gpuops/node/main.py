"""Command line of the node side alone (argparse, stdlib): what a zipapp pushed over SSH runs.

`gpuops agent` checks its options with the CLI's messages, then becomes this entry (gpuops/cli/agent.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import List, Optional

from gpuops.node.agent import Agent
from gpuops.node.backends.registry import open_backend
from gpuops.node.health import HealthMonitor
from gpuops.node.limiter import DEFAULT_DIR as DEFAULT_LIMITER_DIR
from gpuops.node.logs import log_to_stderr

EXIT_OK = 0
EXIT_USAGE = 2


def run_agent(
    backend_name: str = "nvml",
    sim_spec: Optional[str] = None,
    log_level: str = "WARNING",
    state_dir: Optional[str] = None,
    limiter_dir: Optional[str] = None,
    mps_control: Optional[str] = None,
    history_dir: Optional[str] = None,
) -> int:
    """Serve the agent protocol on stdin/stdout until EOF; returns the exit code."""
    from gpuops.node.state import interrupted_applies
    from gpuops.node.stdio import stdio_streams

    log_to_stderr(log_level)
    # The protocol owns fd 1: anything a library prints must not corrupt it.
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    backend, reason = open_backend(backend_name, sim_spec)
    health = HealthMonitor()
    if backend is not None:
        # Before serving: the event set is made with the backend's handles while nothing else
        # calls it; then its thread waits on NVML beside the agent's backend thread.
        health.start(backend)
    agent = Agent(
        backend,
        backend_name,
        reason,
        state_dir=state_dir,
        limiter_dir=limiter_dir,
        mps_control=mps_control,
        history_dir=history_dir,
        health=health,
    )
    # A journal of an interrupted apply is said, not resolved: this session may be a read-only
    # one (discover, status, tui), and only an apply changes a GPU (node/mig_apply.py recover).
    for note in interrupted_applies(agent.state_dir):
        logging.getLogger("gpuops.agent").warning("%s", note)

    async def main() -> None:
        reader, writer = stdio_streams(asyncio.get_event_loop(), 0, protocol_out)
        try:
            await agent.serve(reader, writer)
        finally:
            writer.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        # The event set goes before the library it belongs to.
        if not health.stop():
            logging.getLogger("gpuops.agent").warning("the health thread did not stop in time")
        if backend is not None:
            backend.close()
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuops-node", description="gpuops node side")
    sub = parser.add_subparsers(dest="command")
    agent = sub.add_parser("agent", help="serve the agent protocol")
    agent.add_argument("--stdio", action="store_true", help="talk JSON lines on stdin/stdout")
    agent.add_argument(
        "--record",
        action="store_true",
        help="service mode: sample the backend forever and keep history in --history-dir",
    )
    agent.add_argument(
        "--history-dir",
        default=None,
        metavar="DIR",
        help="history kept by --record and served by --stdio (default: <state dir>/history)",
    )
    agent.add_argument(
        "--record-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between samples with --record (default: 10)",
    )
    agent.add_argument("--backend", default="nvml", help="nvml (default) or sim")
    agent.add_argument("--sim-spec", default=None, help="simulator spec (JSON) for --backend sim")
    agent.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    agent.add_argument(
        "--state-dir", default=None, help="node lock and MIG journal (default: /var/lib/gpuops)"
    )
    agent.add_argument(
        "--limiter-dir",
        default=DEFAULT_LIMITER_DIR,
        help="the limiter's tenant table and regions (default: %s)" % DEFAULT_LIMITER_DIR,
    )
    agent.add_argument(
        "--mps-control",
        default=None,
        metavar="PATH",
        help="nvidia-cuda-mps-control to run (default: the backend's: nvml runs the one on PATH, "
        "sim keeps MPS in memory)",
    )
    agent.add_argument(
        "--metrics",
        default=None,
        metavar="ADDRESS",
        help="serve Prometheus /metrics on ADDRESS (127.0.0.1:9835; needs prometheus-client), "
        "alone or with --record",
    )
    agent.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between samples with --metrics (default: 1)",
    )
    agent.add_argument(
        "--process-metrics",
        default=None,
        metavar="top:N",
        help="with --metrics: series for the N processes holding the most GPU memory",
    )
    agent.add_argument(
        "--dcgm-compat",
        action="store_true",
        help="with --metrics: dcgm-exporter's names and units as well (DCGM_FI_DEV_*; off by default)",
    )
    args = parser.parse_args(argv)
    if args.command != "agent":
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.metrics is not None:
        if args.stdio:
            agent.error("--metrics is a service of its own: give it alone or with --record, not with --stdio")
        from gpuops.node.exporter import DEFAULT_INTERVAL, run_exporter

        return run_exporter(
            args.metrics,
            args.backend,
            args.sim_spec,
            args.interval if args.interval is not None else DEFAULT_INTERVAL,
            args.process_metrics,
            args.log_level,
            args.state_dir,
            args.limiter_dir,
            args.mps_control,
            args.history_dir,
            record=args.record,
            dcgm_compat=args.dcgm_compat,
        )
    if args.interval is not None or args.process_metrics is not None or args.dcgm_compat:
        agent.error("--interval, --process-metrics and --dcgm-compat go with --metrics")
    if args.stdio == args.record:
        agent.error("give one of --stdio (serve the protocol), --record (keep history) or --metrics ADDRESS")
    if args.record:
        return record(
            args.backend,
            args.sim_spec,
            args.log_level,
            args.state_dir,
            args.history_dir,
            args.record_interval,
            args.limiter_dir,
        )
    return run_agent(
        args.backend,
        args.sim_spec,
        args.log_level,
        args.state_dir,
        args.limiter_dir,
        args.mps_control,
        args.history_dir,
    )


def record(
    backend_name: str = "nvml",
    sim_spec: Optional[str] = None,
    log_level: str = "WARNING",
    state_dir: Optional[str] = None,
    history_dir: Optional[str] = None,
    interval: float = 10.0,
    limiter_dir: Optional[str] = None,
) -> int:
    """Service mode (`agent --record`): keep history until SIGTERM; returns the exit code."""
    from gpuops.node.history.service import run_recorder

    if history_dir is None:
        if state_dir is None:
            from gpuops.node.state import default_state_dir

            state_dir = default_state_dir()
        history_dir = os.path.join(state_dir, "history")
    return run_recorder(backend_name, sim_spec, history_dir, interval, log_level, limiter_dir)
