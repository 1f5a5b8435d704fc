"""Discovery at scale: how long the collector takes until every node of a simulated fleet has
answered once, and the operator CPU it spends per node, for this tree and (optionally) another
checkout of gpuops measured in the same run against the same fleet.

    .venv/bin/python bench/fleet_discover.py [--nodes 250,500,1000] [--reps 3]
        [--before /path/to/other/checkout] [--no-write]

For each size one simulated fleet (`large` scenario, one server process) is started on loopback;
then each repetition runs a fresh operator process per tree, in turns (before, after, before,
after...), each of which starts a `Collector` on the fleet's targets and measures the wall time
of `discover` and its own CPU time (user+sys) over it. `--before` names a checkout (a git
worktree of an earlier commit) whose `gpuops` the operator imports instead of this tree's; the
fleet is this tree's either way. Figures are min/median/max over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _operator(fleet_file: str, timeout: float) -> dict[str, Any]:
    # Imported here, after main() put the measured tree first on sys.path.
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.ssh import run
    from gpuops.fleet.targets import node_targets
    from gpuops.spec import load_fleet

    fleet = load_fleet(fleet_file)
    targets = node_targets(fleet)

    async def discover() -> tuple[float, float, int]:
        collector = Collector(targets, interval=1.0, max_handshakes=fleet.max_handshakes)
        cpu0, wall0 = _cpu(), time.monotonic()
        collector.start()
        snap = await collector.discover(timeout)
        wall, cpu = time.monotonic() - wall0, _cpu() - cpu0
        await collector.stop()
        return wall, cpu, sum(1 for n in snap.nodes if n.sample is not None)

    wall, cpu, reached = run(discover())
    import gpuops

    return {
        "nodes": len(targets),
        "reached": reached,
        "discovery_s": wall,
        "cpu_ms_per_node": 1000 * cpu / max(len(targets), 1),
        "gpuops": str(Path(gpuops.__file__).resolve().parent.parent),
    }


def _measure(tree: Path, fleet_file: Path, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, __file__, "--operator", str(fleet_file), "--tree", str(tree)]
    out = subprocess.run(
        [*command, "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 120,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"operator process ({tree}) failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["gpuops"]) != tree.resolve():
        raise SystemExit(f"the operator imported gpuops from {result['gpuops']}, not {tree}")
    return result


Runs = dict[str, list[dict[str, Any]]]


def run_size(nodes: int, reps: int, trees: dict[str, Path], timeout: float) -> Runs:
    from gpuops.simfleet import launch, stop

    runs: Runs = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        directory = Path(tmp) / "sim"
        launch(directory, scenario="large", nodes=nodes, timeout=300)
        try:
            for _ in range(reps):
                for label, tree in trees.items():
                    result = _measure(tree, directory / "fleet.yaml", timeout)
                    print(json.dumps({"tree": label, **result}), flush=True)
                    runs[label].append(result)
        finally:
            stop(directory)
    return runs


def _spread(values: list[float], fmt: str) -> str:
    return "/".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="250,500,1000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", help="another checkout of gpuops to measure in the same run")
    parser.add_argument("--timeout", type=float, default=120.0, help="discovery timeout per run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--operator", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator:
        sys.path.insert(0, args.tree)
        print(json.dumps(_operator(args.operator, args.timeout)))
        return
    sys.path.insert(0, str(ROOT))
    from bench.benchdoc import write_section

    trees = {"after": ROOT}
    if args.before:
        trees = {"before": Path(args.before).resolve(), "after": ROOT}
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        runs = run_size(nodes, args.reps, trees, args.timeout)
        for label, results in runs.items():
            rows.append((nodes, label, results))
    lines = [
        "## Discovery (`bench/fleet_discover.py`, issue 22)",
        "",
        "Simulated `large` fleet on loopback, one server process; a fresh operator process per run,",
        "`Collector.discover` until every node has answered once. min/median/max over the runs;",
        "*before* and *after* measured in turns against the same fleet in the same run.",
        "",
        "| nodes | tree | runs | discovered | discovery | operator CPU per node |",
        "|---|---|---|---|---|---|",
    ]
    for nodes, label, results in rows:
        lines.append(
            f"| {nodes} | {label} | {len(results)} | {min(r['reached'] for r in results)} "
            f"| {_spread([r['discovery_s'] for r in results], '.1f')} s "
            f"| {_spread([r['cpu_ms_per_node'] for r in results], '.2f')} ms |"
        )
    lines += [
        "",
        "Run again: `.venv/bin/python bench/fleet_discover.py --before <worktree of an older commit>`.",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("fleet_discover", "\n".join(lines))


if __name__ == "__main__":
    main()
