"""Fleet collection at scale: discovery time, operator CPU per node-sample, peak memory.

    .venv/bin/python bench/fleet_collect.py [--nodes 100,500,1000] [--steady 10] [--no-write]

For each size a simulated fleet (`large` scenario, one server process) is started on loopback,
and a separate operator process measures:
- time from start until every node has delivered a sample (full discovery);
- steady state at 1 Hz: operator CPU seconds (user+sys of the operator process only) divided by
  the node-samples it took in, over `--steady` seconds, with gpuops' persistent agent sessions
  (one SSH connection per node, one `watch` stream per agent);
- the same fleet polled the naive way (gpustat-web's pattern: a new exec channel per node per
  poll, which starts the agent, asks once and closes), in the same run, after one untimed
  round; and, for reference, the same again with each reply decoded into a NodeSample;
- peak resident memory of the operator process (ru_maxrss).
The operator runs on `gpuops.fleet.ssh.run` (uvloop when installed; GPUOPS_EVENT_LOOP=asyncio
for asyncio's loop), both patterns on the same loop. The server runs in its own process on the
same 2 cores, so absolute rates are bounded by it; the ratio between the two patterns is what
the comparison rests on.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

NAIVE_COMMAND = "gpuops agent --stdio --backend sim"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _operator(fleet_file: str, steady: float, discovery_timeout: float) -> dict[str, Any]:
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
    naive, naive_samples_per_s = await _naive(live, steady, decode=False)
    # For reference, the same with each sample decoded into a NodeSample, as gpuops delivers it.
    naive_decode, _ = await _naive(live, steady, decode=True)
    for c in live:
        c.close()
    return {
        "nodes": len(targets),
        "reached": reached,
        "discovery_s": discovery,
        "samples_per_s": samples / wall,
        "cpu_ms_per_sample": 1000 * cpu / max(samples, 1),
        "naive_samples_per_s": naive_samples_per_s,
        "naive_cpu_ms_per_sample": naive,
        "naive_decode_cpu_ms_per_sample": naive_decode,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
    }


async def _naive(conns: list[Any], steady: float, decode: bool) -> tuple[float, float]:
    """Poll every connection once per second with a new exec channel, as gpustat-web does
    (`conn.run`, the agent started for one `sample` and ended); returns (operator CPU ms per
    node-sample, node-samples per second). One untimed round first, as the collector has its
    settling time. With `decode`, each reply is also parsed and decoded into a NodeSample."""
    from gpuops.core import protocol as proto
    from gpuops.core.codec import from_json
    from gpuops.core.model import NodeSample
    from gpuops.fleet.agent_client import _loads  # the parser gpuops' client uses (orjson)

    request = proto.request(1, "hello") + proto.request(2, "sample")

    async def poll(conn: Any) -> int:
        try:
            result = await asyncio.wait_for(conn.run(NAIVE_COMMAND, input=request, encoding=None), 10)
        except (TimeoutError, OSError, Exception):
            return 0
        out = result.stdout or b""
        if not decode:
            return int(b'"id":2' in out)
        for line in out.splitlines():
            message = proto.parse_message(line, _loads)
            if message.id == 2 and message.ok:
                from_json(NodeSample, message.result)
                return 1
        return 0

    async def round_of_polls() -> int:
        return sum(await asyncio.gather(*(poll(c) for c in conns)))

    await round_of_polls()
    samples, cpu0, wall0 = 0, _cpu(), time.monotonic()
    while time.monotonic() < wall0 + steady:
        tick = time.monotonic()
        samples += await round_of_polls()
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return 1000 * (_cpu() - cpu0) / max(samples, 1), samples / (time.monotonic() - wall0)


def run_size(nodes: int, steady: float) -> dict[str, float]:
    from gpuops.simfleet import launch, stop

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


def _target(rows: list[dict[str, Any]]) -> str:
    met = [str(int(r["nodes"])) for r in rows if r["naive_ratio"] >= 5]
    missed = [str(int(r["nodes"])) for r in rows if r["naive_ratio"] < 5]
    if not missed:
        return "met at every size"
    if not met:
        return "not met"
    return f"met at {', '.join(met)} nodes, not at {', '.join(missed)}"


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
        from gpuops.fleet.ssh import run

        print(json.dumps(run(_operator(args.operator, args.steady, 120.0))))
        return
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        result = run_size(nodes, args.steady)
        gpuops = max(result["cpu_ms_per_sample"], 1e-9)
        result["naive_ratio"] = result["naive_cpu_ms_per_sample"] / gpuops
        result["naive_decode_ratio"] = result["naive_decode_cpu_ms_per_sample"] / gpuops
        print(json.dumps(result), flush=True)
        rows.append(result)
    lines = [
        "## Fleet collection (`bench/fleet_collect.py`)",
        "",
        "Simulated `large` fleet on loopback, one server process, operator in its own process; 1 Hz.",
        "Targets: 1000 nodes discovered in <= 20 s; <= 0.3 ms operator CPU per node-sample;",
        ">= 5x cheaper than a new exec channel per poll.",
        "",
        "| nodes | discovered | discovery | node-samples/s | gpuops CPU / node-sample "
        "| naive: node-samples/s | naive CPU / node-sample | **naive ÷ gpuops** "
        "| naive + decode CPU / node-sample | (naive + decode) ÷ gpuops | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {int(r['nodes'])} | {int(r['reached'])} | {r['discovery_s']:.1f} s "
            f"| {r['samples_per_s']:.0f} | {r['cpu_ms_per_sample']:.3f} ms "
            f"| {r['naive_samples_per_s']:.0f} | {r['naive_cpu_ms_per_sample']:.3f} ms "
            f"| **{r['naive_ratio']:.1f}x** | {r['naive_decode_cpu_ms_per_sample']:.3f} ms "
            f"| {r['naive_decode_ratio']:.1f}x | {r['peak_rss_mb']:.0f} MB |"
        )
    loops = ", ".join(sorted({str(r.get("loop", "asyncio")) for r in rows}))
    lines += [
        "",
        f"Operator event loop: {loops} (`gpuops.fleet.ssh.run`; `GPUOPS_EVENT_LOOP=asyncio` gives",
        "asyncio's own). *gpuops*: one SSH connection per node, one `watch` stream per agent in",
        "rows (each GPU's sample a row of the values that changed, `core/delta.py`), parsed with",
        "orjson, every agent sampling at the same instants (aligned watches) and the loop pausing",
        "up to 80 ms when a burst of samples comes in (`docs/fleet.md`). *naive*: on connections",
        "kept open as gpustat-web keeps them, a new exec channel per node per poll (`conn.run`), the",
        "agent started for one full sample, the reply's bytes only looked at: the baseline of the 5x",
        "target. *naive + decode*: the same with each reply parsed (with gpuops' parser) and decoded",
        "into a NodeSample, as gpuops delivers it (for reference, not the target's baseline). The",
        "simulated servers put on the wire what sshd does (one packet per sample; asyncssh's own",
        "server adds an SSH_MSG_IGNORE before every packet, `gpuops/simfleet/server.py`).",
        "",
        "Where gpuops' time went per node-sample before the watches were aligned (thread CPU time):",
        "at 1000 nodes, parsing the JSON line about 0.006 ms, rebuilding the sample from the rows",
        "(`codec.from_rows`, freeing the previous one included) 0.027 ms, the agent client and the",
        "collector around them 0.011 ms, asyncssh receiving and decrypting the packet 0.030 ms, the",
        "event loop 0.011 ms; at 100 nodes the loop's share was 0.045 ms (20 coalescing windows a",
        "second whatever the number of nodes). Aligned samples arrive in one burst a second, taken",
        "in one or a few pauses: at 100 nodes 0.100 -> 0.070 ms per sample in one session's A/B.",
        f"The 5x target: {_target(rows)} (`docs/fleet.md`).",
        "Run again: `.venv/bin/python bench/fleet_collect.py` (a few minutes; figures vary by about",
        "10% from run to run on a shared 2-core machine, the naive pattern's more).",
    ]
    if not args.no_write:
        write_section("fleet_collect", "\n".join(lines))


if __name__ == "__main__":
    main()
