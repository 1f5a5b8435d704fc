"""From silos to one pool on the simulated `silos` fleet: utilization and completed work, before
and after `gpuops rebalance` + `gpuops apply`.

    .venv/bin/python bench/pool_demand.py [--speed 600] [--before 60] [--no-write]

A sim fleet (`silos`, 8 nodes, 48 GPUs) is started on 127.0.0.1 with its queued work running
`--speed` times real time. An operator-side collector (gpuops' own, over SSH at 1 Hz) samples
every GPU:
1. silos, `--before` seconds: the saturated team's queue waits (its cards are busy, nothing else
   is its own);
2. `gpuops rebalance -f fleet.yaml --window 24h -o proposed.yaml` and `gpuops apply proposed.yaml
   --yes`, as a user runs them, timed;
3. the pool, from the apply until the sim fleet's batch scheduler has finished the queue.
Figures per phase: fleet mean GPU utilization, mean utilization of the GPUs the proposal pooled,
the saturated team's completed jobs and job-hours (from `gpuops sim queue --json`) and its
throughput in job-hours per simulated hour.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section


def gpuops(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=timeout
    )


def demand(directory: Path) -> dict[str, Any]:
    from gpuops.simfleet.demand import read_demand

    doc = read_demand(directory)
    if doc is None:
        raise SystemExit(f"no demand.json in {directory}")
    return doc


class Meter:
    """Utilization per second from the collector's latest samples (each GPU once per tick)."""

    def __init__(self) -> None:
        self.ticks: list[dict[tuple[str, int], float]] = []

    def take(self, snapshot: Any) -> None:
        tick: dict[tuple[str, int], float] = {}
        for node in snapshot.nodes:
            if node.sample is None:
                continue
            for gpu in node.sample.gpus:
                value = gpu.sample.utilization_gpu_percent
                if isinstance(value, (int, float)):
                    tick[(node.name, gpu.info.index)] = float(value)
        if tick:
            self.ticks.append(tick)

    def mean(self, keys: set[tuple[str, int]] | None = None) -> float:
        values = [v for t in self.ticks for k, v in t.items() if keys is None or k in keys]
        return sum(values) / len(values) if values else 0.0


async def measure(directory: Path, before: float, speed: float, drain_limit: float) -> dict[str, Any]:
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.targets import node_targets
    from gpuops.spec import load_fleet

    fleet_file = directory / "fleet.yaml"
    fleet = load_fleet(fleet_file)
    collector = Collector(node_targets(fleet), interval=1.0, max_handshakes=fleet.max_handshakes)
    collector.start()
    found = await collector.discover(60)
    gpus_total = sum(len(n.sample.gpus) for n in found.nodes if n.sample is not None)
    await asyncio.sleep(2.0)

    async def sample(meter: Meter, until: Any) -> float:
        started = time.monotonic()
        while not until(time.monotonic() - started):
            meter.take(collector.snapshot())
            await asyncio.sleep(1.0)
        return time.monotonic() - started

    silos = Meter()
    silo_wall = await sample(silos, lambda elapsed: elapsed >= before)
    waited = demand(directory)

    proposed = directory / "proposed.yaml"
    t0 = time.monotonic()
    rebalance = await asyncio.to_thread(
        gpuops, "rebalance", "-f", str(fleet_file), "--window", "24h", "-o", str(proposed), "--json"
    )
    t1 = time.monotonic()
    applied = await asyncio.to_thread(gpuops, "apply", str(proposed), "--yes")
    t2 = time.monotonic()
    if rebalance.returncode != 2 or applied.returncode != 0:
        raise SystemExit(f"rebalance/apply failed: {rebalance.stderr} {applied.stdout} {applied.stderr}")
    proposal = json.loads(rebalance.stdout)
    pooled = {(m["node"], m["index"]) for m in proposal["moves"]}

    pool = Meter()
    total = len(waited["jobs"])

    def drained(elapsed: float) -> bool:
        return demand(directory)["teams"]["speech"]["done"] >= total or elapsed > drain_limit

    pool_wall = await sample(pool, drained)
    done = demand(directory)
    await collector.stop()
    team = done["teams"]["speech"]
    return {
        "gpus": gpus_total,
        "gpus_read": len(silos.ticks[-1]) if silos.ticks else 0,
        "pooled": len(pooled),
        "jobs": total,
        "job_hours": sum(j["work_hours"] for j in done["jobs"]),
        "silos": {
            "wall_s": silo_wall,
            "sim_hours": silo_wall * speed / 3600,
            "fleet_util": silos.mean(),
            "pooled_util": silos.mean(pooled),
            "done": waited["teams"]["speech"]["done"],
            "job_hours_done": waited["teams"]["speech"]["work_done_hours"],
        },
        "pool": {
            "wall_s": pool_wall,
            "sim_hours": pool_wall * speed / 3600,
            "fleet_util": pool.mean(),
            "pooled_util": pool.mean(pooled),
            "done": team["done"],
            "job_hours_done": team["work_done_hours"],
        },
        "grants": sorted({j["grant"] for j in done["jobs"] if j["grant"]}),
        "rebalance_s": t1 - t0,
        "apply_s": t2 - t1,
    }


def report(r: dict[str, Any], speed: float) -> str:
    s, p = r["silos"], r["pool"]
    rate_silos = s["job_hours_done"] / s["sim_hours"] if s["sim_hours"] else 0.0
    rate_pool = p["job_hours_done"] / p["sim_hours"] if p["sim_hours"] else 0.0
    return "\n".join(
        [
            "## From silos to a pool (`bench/pool_demand.py`)",
            "",
            f"The simulated `silos` fleet (8 nodes, {r['gpus']} GPUs; the means are over the "
            f"{r['gpus_read']} with a whole-GPU utilization reading, MIG-mode GPUs having none) on "
            "127.0.0.1 over SSH; the saturated "
            f"team (speech) has {r['jobs']} queued jobs ({r['job_hours']:.0f} job-hours) that the sim "
            f"fleet's batch scheduler runs where the applied tenant tables grant it, {speed:g}x real time. "
            "Utilization is what gpuops' collector read over SSH at 1 Hz.",
            "",
            "| phase | wall (simulated) | fleet mean utilization | the pooled GPUs | speech jobs done | "
            "speech job-hours done | speech throughput |",
            "|---|---|---|---|---|---|---|",
            f"| silos | {s['wall_s']:.0f} s ({s['sim_hours']:.1f} h) | {s['fleet_util']:.1f}% | "
            f"{s['pooled_util']:.1f}% | {s['done']} | {s['job_hours_done']:.1f} | {rate_silos:.2f} job-h/h |",
            f"| pool, until the queue drained | {p['wall_s']:.0f} s ({p['sim_hours']:.1f} h) | "
            f"{p['fleet_util']:.1f}% | {p['pooled_util']:.1f}% | {p['done']} | {p['job_hours_done']:.1f} | "
            f"{rate_pool:.2f} job-h/h |",
            "",
            f"`gpuops rebalance --window 24h` proposed pooling {r['pooled']} idle GPUs "
            f"({r['rebalance_s']:.1f} s); "
            f"`gpuops apply` took {r['apply_s']:.1f} s. The queue ran on pool GPUs by "
            f"{' and '.join(r['grants'])} grants. Run again: `.venv/bin/python bench/pool_demand.py`. "
            "The pool phase ends when the queue is empty, so its mean includes the tail where only the "
            "longest job still runs; once drained, the fleet goes back to its silo figure, as the "
            "scenario queues nothing more.",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speed", type=float, default=600.0, help="queued work runs this much faster")
    parser.add_argument("--before", type=float, default=60.0, help="seconds of silos before the rebalance")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md")
    args = parser.parse_args()
    from gpuops.simfleet import launch, stop

    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        directory = Path(tmp) / "sim"
        launch(directory, "silos", timeout=60, queue_speed=args.speed)
        try:
            limit = 3 * 12 * 3600 / args.speed + 60  # the longest job, with room for preemption
            result = asyncio.run(measure(directory, args.before, args.speed, limit))
        finally:
            stop(directory)
    print(json.dumps(result, indent=1))
    text = report(result, args.speed)
    print(text)
    if not args.no_write:
        write_section("pool_demand", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
