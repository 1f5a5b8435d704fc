"""Fleet collection at scale: discovery time, operator CPU per node-sample, peak memory.

    .venv/bin/python bench/fleet_collect.py [--nodes 100,500,1000] [--steady 10] [--no-write]

For each size a simulated fleet (`large` scenario, one server process) is started on loopback,
and a separate operator process measures:
- time from start until every node has delivered a sample (full discovery);
- steady state at 1 Hz: operator CPU seconds (user+sys of the operator process only) divided by
  the node-samples it took in, over `--steady` seconds, with gpuops' persistent agent sessions
  (one SSH connection per node, one `watch` stream per agent);
- the same fleet polled the naive way (gpustat-web's pattern: a new exec channel per node per
  poll, which starts the agent, asks once and closes), in the same run;
- peak resident memory of the operator process (ru_maxrss).
The server runs in its own process on the same 2 cores, so absolute rates are bounded by it;
the ratio between the two patterns is what the comparison rests on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

NAIVE_COMMAND = "gpuops agent --stdio --backend sim"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _operator(fleet_file: str, steady: float, discovery_timeout: float) -> dict[str, float]:
    from gpuops.core import protocol as proto
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.ssh import connect
    from gpuops.fleet.targets import node_targets
    from gpuops.spec import load_fleet

    fleet = load_fleet(fleet_file)
    targets = node_targets(fleet)
    collector = Collector(targets, interval=1.0, max_handshakes=fleet.max_handshakes)
    started = time.monotonic()
    collector.start()
    await collector.discover(discovery_timeout)
    discovery = time.monotonic() - started
    reached = sum(1 for n in collector.snapshot().nodes if n.sample is not None)
    # Steady state: let the streams settle, then count.
    await asyncio.sleep(2.0)
    samples0, cpu0, wall0 = collector.samples_received, _cpu(), time.monotonic()
    await asyncio.sleep(steady)
    samples = collector.samples_received - samples0
    cpu = _cpu() - cpu0
    wall = time.monotonic() - wall0
    await collector.stop()

    # The naive pattern: connections kept (as gpustat-web keeps them), a new channel per poll.
    handshakes = asyncio.Semaphore(fleet.max_handshakes)
    conns = await asyncio.gather(*(connect(t.ssh, handshakes) for t in targets), return_exceptions=True)
    live = [c for c in conns if not isinstance(c, BaseException)]
    request = proto.request(1, "hello") + proto.request(2, "sample")

    async def poll(conn) -> int:  # type: ignore[no-untyped-def]
        try:
            result = await asyncio.wait_for(conn.run(NAIVE_COMMAND, input=request, encoding=None), 10)
        except (TimeoutError, OSError, Exception):
            return 0
        return int(b'"id":2' in (result.stdout or b""))

    naive_samples, naive_cpu0, naive_wall0 = 0, _cpu(), time.monotonic()
    deadline = naive_wall0 + steady
    while time.monotonic() < deadline:
        tick = time.monotonic()
        naive_samples += sum(await asyncio.gather(*(poll(c) for c in live)))
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    naive_cpu = _cpu() - naive_cpu0
    naive_wall = time.monotonic() - naive_wall0
    for c in live:
        c.close()
    return {
        "nodes": len(targets),
        "reached": reached,
        "discovery_s": discovery,
        "samples_per_s": samples / wall,
        "cpu_ms_per_sample": 1000 * cpu / max(samples, 1),
        "naive_samples_per_s": naive_samples / naive_wall,
        "naive_cpu_ms_per_sample": 1000 * naive_cpu / max(naive_samples, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_size(nodes: int, steady: float) -> dict[str, float]:
    from gpuops.fleet.simfleet import launch, stop

    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        directory = Path(tmp) / "sim"
        launched = launch(directory, scenario="large", nodes=nodes, timeout=120)
        try:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--operator",
                    str(directory / "fleet.yaml"),
                    "--steady",
                    str(steady),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode != 0:
                raise SystemExit(f"operator process failed:\n{out.stderr}")
            result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
            result["server_start_s"] = launched.seconds
            return result
        finally:
            stop(directory)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="100,500,1000")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of steady state per pattern")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--operator", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator:
        print(json.dumps(asyncio.run(_operator(args.operator, args.steady, 120.0))))
        return
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        result = run_size(nodes, args.steady)
        ratio = result["naive_cpu_ms_per_sample"] / max(result["cpu_ms_per_sample"], 1e-9)
        result["naive_ratio"] = ratio
        print(json.dumps(result), flush=True)
        rows.append(result)
    lines = [
        "## Fleet collection (`bench/fleet_collect.py`)",
        "",
        "Simulated `large` fleet on loopback, one server process, operator in its own process; 1 Hz.",
        "Targets: 1000 nodes discovered in <= 20 s; <= 0.3 ms operator CPU per node-sample;",
        ">= 5x cheaper than a new exec channel per poll.",
        "",
        "| nodes | discovered | discovery | node-samples/s | operator CPU / node-sample | naive: samples/s "
        "| naive CPU / node-sample | naive ÷ gpuops | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {int(r['nodes'])} | {int(r['reached'])} | {r['discovery_s']:.1f} s "
            f"| {r['samples_per_s']:.0f} "
            f"| {r['cpu_ms_per_sample']:.3f} ms | {r['naive_samples_per_s']:.0f} "
            f"| {r['naive_cpu_ms_per_sample']:.3f} ms | {r['naive_ratio']:.1f}x | {r['peak_rss_mb']:.0f} MB |"
        )
    lines += [
        "",
        "Where the operator's time goes per node-sample (cProfile, 300 nodes): asyncssh receiving",
        "and decrypting the packets (about half; asyncssh's server also sends an SSH_MSG_IGNORE",
        "before every data packet, so a simulated node costs two packets per sample where OpenSSH's",
        "sshd sends one), the event loop, then ours: JSON parsing and rebuilding the sample from its",
        "delta (about 0.04 ms). The naive pattern is measured on the same kept-open connections, as",
        "gpustat-web keeps them, so it pays channel set-up and a full sample per poll but no",
        "handshake; see docs/fleet.md for why the ratio stays near 2-3x.",
    ]
    if not args.no_write:
        write_section("fleet_collect", "\n".join(lines))


if __name__ == "__main__":
    main()
