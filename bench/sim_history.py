"""The simulated fleet's history as a user meets it: `gpuops tenants --window 7d` right after a
100-node `large` fleet is ready (its nodes' 7-day pasts not built yet, or being built), then
again; and on a second fleet once its pasts are built (the history on the nodes, as a real
fleet has it); for this tree and (optionally) another checkout measured in the same run.

    .venv/bin/python bench/sim_history.py [--nodes 100 [200 ...]] [--reps 2]
        [--before /path/to/checkout] [--no-write]

Each tree runs in its own process with its `gpuops` first on PYTHONPATH (the sim fleet and the
CLI calls are that tree's); trees take turns per repetition. The evidence each first call got
back (GPUs, median days observed, nodes missing) is reported, so a past that came back short
cannot pass for a fast one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0
CALL_TIMEOUT = 300.0


def _cli() -> list[str]:
    return [sys.executable, "-m", "gpuops"]


def _timed(*args: str) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    out = subprocess.run([*_cli(), *args], capture_output=True, text=True, timeout=CALL_TIMEOUT)
    took = time.perf_counter() - began
    # 3: figures shown, but some node's history incomplete (reported with the figures)
    if out.returncode not in (0, 3):
        raise SystemExit(f"gpuops {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(out.stdout)
    doc["exit"] = out.returncode
    return took, doc


PASTS_LINE = "simulated pasts of"  # the fleet's log line once every node's past is built
PASTS_WAIT = 45.0


def _wait_for_pasts(log: Path) -> float | None:
    """Seconds until the fleet logged that its pasts are built; None if it did not (a fleet
    that builds each past on demand, or one slower than PASTS_WAIT)."""
    began = time.perf_counter()
    while time.perf_counter() - began < PASTS_WAIT:
        if log.exists() and PASTS_LINE in log.read_text(errors="replace"):
            return time.perf_counter() - began
        time.sleep(0.1)
    return None


def _measure(nodes: int) -> dict[str, Any]:
    """In the measured tree's process: start a fleet, call tenants twice right away, stop it;
    then start another, wait until its simulated pasts are built, call twice again."""
    import gpuops
    from gpuops.simfleet import launch, stop

    result: dict[str, Any] = {"nodes": nodes, "gpuops": str(Path(gpuops.__file__).resolve().parent.parent)}
    for mode in ("cold", "history"):
        with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
            directory = Path(tmp) / "sim"
            launched = launch(directory, scenario="large", nodes=nodes, timeout=120)
            try:
                pasts = _wait_for_pasts(directory / "simfleet.log") if mode == "history" else None
                if mode == "history" and pasts is None:
                    result["pasts_s"] = None
                    continue
                args = ("tenants", "-f", str(directory / "fleet.yaml"), "--window", "7d", "--json")
                first, doc = _timed(*args)
                later, _ = _timed(*args)
            finally:
                stop(directory)
        gpus = doc.get("gpus", [])
        seconds = [g.get("observed_seconds", 0) for g in gpus]
        if mode == "cold":
            result.update(
                ready_s=launched.seconds,
                first_s=first,
                later_s=later,
                gpus=len(gpus),
                evidence_days=statistics.median(seconds) / DAY if seconds else 0.0,
                missing=len(doc.get("missing", {})),
                incomplete=len(doc.get("incomplete", {}) or ()),
                exit=doc["exit"],
            )
        else:
            result.update(pasts_s=pasts, history_first_s=first, history_later_s=later, history_gpus=len(gpus))
    return result


def _run_tree(tree: Path, nodes: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, __file__, "--measure", "--tree", str(tree), "--nodes", str(nodes)],
        capture_output=True,
        text=True,
        timeout=3 * CALL_TIMEOUT,
        env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["gpuops"]) != tree.resolve():
        raise SystemExit(f"{tree}: the fleet ran gpuops from {result['gpuops']}")
    return result


def _spread(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[100], help="fleet sizes, each measured")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--before", help="another checkout of gpuops to measure in the same run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        sys.path.insert(0, args.tree)
        print(json.dumps(_measure(args.nodes[0])))
        return
    sys.path.insert(0, str(ROOT))
    from bench.benchdoc import write_section

    trees = {"after": ROOT}
    if args.before:
        trees = {"before": Path(args.before).resolve(), "after": ROOT}
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {
        (n, label): [] for n in args.nodes for label in trees
    }
    load = [os.getloadavg()[0]]
    for nodes in args.nodes:
        for _ in range(args.reps):
            for label, tree in trees.items():
                result = _run_tree(tree, nodes)
                print(json.dumps({"tree": label, **result}), flush=True)
                runs[(nodes, label)].append(result)
    load.append(os.getloadavg()[0])
    sizes = " and ".join(str(n) for n in args.nodes)
    lines = [
        "## Simulated history, first call (`bench/sim_history.py`, issues 22 and 18)",
        "",
        f"`gpuops tenants -f fleet.yaml --window 7d --json` against a {sizes}-node `large` sim fleet",
        "on 127.0.0.1, two fleets per run. *Right after up*: the first call as soon as `launch`",
        "returns (the ports listen; the simulated 7-day pasts not built yet, or being built), and the",
        "call after it. *History on the nodes*: a second fleet, left until it has logged that every",
        "node's past is built (*pasts built*, seconds after `launch` returned; `-` where that tree",
        "builds pasts only when asked), then the first call (no node's files read yet: the cold read",
        "a real fleet, whose nodes have their days on disk, gives) and the one after it.",
        "min/median/max over the runs; *before* and *after* in turns in the same run.",
        "",
        "| nodes | tree | runs | right after up: first | later | pasts built | history on the nodes: first "
        "| later | GPUs | evidence per GPU (median) | nodes missing | incomplete | exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(results: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in results if r.get(key) is not None]
        return f"{_spread(values)} s" if values else "-"

    for (nodes, label), results in runs.items():
        lines.append(
            f"| {nodes} | {label} | {len(results)} | {spread(results, 'first_s')} "
            f"| {spread(results, 'later_s')} | {spread(results, 'pasts_s')} "
            f"| {spread(results, 'history_first_s')} | {spread(results, 'history_later_s')} "
            f"| {min(r['gpus'] for r in results)} "
            f"| {min(r['evidence_days'] for r in results):.1f} days | {max(r['missing'] for r in results)} "
            f"| {max(r['incomplete'] for r in results)} | {','.join(str(r['exit']) for r in results)} |"
        )
    lines += [
        "",
        f"Load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (2 cores, shared).",
        "Run again: `.venv/bin/python bench/sim_history.py --before <worktree of an older commit>`.",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("sim_history", "\n".join(lines))


if __name__ == "__main__":
    main()
