"""TUI refresh: time to apply one fleet update and render it, at 100 to 10k GPUs; resident memory.

    .venv/bin/python bench/tui_refresh.py [--gpus 100,1000,10000] [--updates 40] [--before REV] [--no-write]

--before DIR measures a checkout of an older commit too (`git worktree add DIR COMMIT`), each size
in turn, with its own copy of this script, and the table shows both side by side; --before REV
(a commit) unpacks that commit's tree into a temporary directory (`git archive`) and does the same.

For each size, a fresh process builds a simulated fleet (`large` scenario, in-process
`SimBackend`s on one clock, no SSH) and runs the real app headless (Textual's test driver, a
200x60 terminal). Each update: the simulated clock moves 1 s and every node is sampled (node side,
not timed); then, timed:
- **build**: the data layer turns the snapshot into a FleetState (tenants now and over the
  session, events, status; node rows on first use by the screen);
- **apply + render**: the screen in front takes the state (grid layout, tables) and Textual
  renders what changed, until the screen has processed every message and the compositor has
  drawn (`Pilot._wait_for_screen` then a screen update).
Screens measured: the fleet grid (the heaviest: a cell per GPU or MIG slice), the nodes table,
the tenants table. Memory: the process's resident set after the updates (VmRSS), and before the
app started (interpreter, imports and the simulated nodes, which would live on the GPU nodes).
The app runs as `gpuops tui` does (`tune_gc=True`: gc.freeze once the screens are up).
Targets: <= 50 ms per update at 1000 GPUs (issue 6), then at 10k GPUs (issue 22); <= 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

EPOCH = 1772409600.0 + 14 * 3600  # a Monday, 14:00 UTC
SIZE = (200, 60)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _nodes_for(gpus: int) -> int:
    """The smallest node count of the `large` scenario with at least `gpus` GPUs."""
    from gpuops.simfleet import build_fleet

    for nodes in range(max(1, gpus // 8), gpus // 4 + 2):
        if sum(n.gpu_count for n in build_fleet("large", nodes, 0, EPOCH).nodes) >= gpus:
            return nodes
    return gpus // 4 + 1


async def _measure(gpus: int, updates: int) -> dict[str, Any]:
    from gpuops.simfleet.source import SimSource
    from gpuops.tui.app import GpuopsApp
    from gpuops.views.feed import Feed

    clock = [EPOCH]
    source = SimSource.scenario("large", _nodes_for(gpus), epoch=EPOCH - 86400, clock=lambda: clock[0])
    source.sample()
    nodes_rss = _rss_mb()
    feed = Feed(source, source.ownership(), lambda: clock[0], period=3600.0)
    app = GpuopsApp(feed, tune_gc=True)  # as `gpuops tui` runs it
    result: dict[str, Any] = {
        "gpus": source.gpu_count,
        "nodes": len(source.plan.nodes),
        "cells": 0,
        "screens": {},
    }
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        for view in ("gpus", "nodes", "tenants"):
            app.go(view)
            await pilot.pause()
            builds: list[float] = []
            renders: list[float] = []
            for _ in range(updates):
                clock[0] += 1.0
                source.sample()
                t0 = time.perf_counter()
                state = feed.build()
                t1 = time.perf_counter()
                app.publish(state)
                await pilot._wait_for_screen()
                app.screen._on_timer_update()
                t2 = time.perf_counter()
                builds.append((t1 - t0) * 1000)
                renders.append((t2 - t1) * 1000)
            totals = [b + r for b, r in zip(builds, renders, strict=True)]
            result["screens"][view] = {
                "build_ms": statistics.median(builds),
                "render_ms": statistics.median(renders),
                "median_ms": statistics.median(totals),
                "p95_ms": sorted(totals)[int(0.95 * (len(totals) - 1))],
                "max_ms": max(totals),
            }
        if app.fleet_state is not None:
            result["cells"] = sum(len(r.cells) for r in app.fleet_state.rows)
        result["rss_mb"] = _rss_mb()
        result["nodes_rss_mb"] = nodes_rss
        result["history_points"] = feed.history.points
        await pilot.press("q")
    return result


def _commit(tree: Path, rev: str = "HEAD") -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "log", "-1", "--format=%h %s", rev],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()[:60] or str(tree)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", default="100,1000,10000")
    parser.add_argument("--updates", type=int, default=40, help="updates measured per screen")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--before", help="a checkout (directory) or a commit of an older tree to measure too")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_measure(args.one, args.updates))))
        return
    trees = [("", Path(__file__))]
    before_label = ""
    if args.before is not None:
        before = Path(args.before)
        if before.is_dir():
            before_label = _commit(before)
        else:  # a commit: its tree, unpacked
            repo = Path(__file__).resolve().parent.parent
            before = Path(tempfile.mkdtemp(prefix="tui-refresh-before-"))
            archive = subprocess.run(
                ["git", "-C", str(repo), "archive", args.before], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
            before_label = _commit(repo, args.before)
        trees.insert(0, ("before", before.resolve() / "bench" / "tui_refresh.py"))
    results: list[tuple[str, dict[str, Any]]] = []
    try:
        _measure_all(args, trees, results)
    finally:
        if args.before is not None and not Path(args.before).is_dir():
            shutil.rmtree(trees[0][1].parent.parent, ignore_errors=True)  # the unpacked commit
    _write(args, before_label, results)


def _measure_all(
    args: argparse.Namespace, trees: list[tuple[str, Path]], results: list[tuple[str, dict[str, Any]]]
) -> None:
    for gpus in (int(g) for g in args.gpus.split(",")):
        for label, script in trees:  # side by side, so that both see the machine as it is now
            done = subprocess.run(
                [sys.executable, str(script), "--one", str(gpus), "--updates", str(args.updates)],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(
                (label or ("after" if args.before else ""), json.loads(done.stdout.strip().splitlines()[-1]))
            )


def _write(args: argparse.Namespace, before_label: str, results: list[tuple[str, dict[str, Any]]]) -> None:
    lines = [
        "## TUI",
        "",
        "Time to apply one fleet update and render it (`bench/tui_refresh.py`): the simulated `large`",
        f"fleet in-process, the real app headless ({SIZE[0]}x{SIZE[1]} terminal), {args.updates} updates"
        " per screen.",
        "*build*: the data layer (tenants now and over the session, events, node rows); *render*:",
        "the screen in front takes the state and Textual draws what changed. Median (p95) per update.",
    ]
    if args.before is not None:
        lines.append(f"*before*: `{before_label}`, measured in the same run, size by size.")
    lines += [
        "",
        "| GPUs (cells, nodes) | code | screen | build | render | total median | p95 | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results:
        for view, m in r["screens"].items():
            lines.append(
                f"| {r['gpus']} ({r['cells']}, {r['nodes']}) | {label or 'now'} | {view}"
                f" | {m['build_ms']:.1f} ms"
                f" | {m['render_ms']:.1f} ms | **{m['median_ms']:.1f} ms** | {m['p95_ms']:.1f} ms"
                f" | {m['max_ms']:.1f} ms |"
            )
    lines.append("")
    lines.append("| GPUs | code | resident memory (VmRSS) after the updates | before the app started |")
    lines.append("|---|---|---|---|")
    for label, r in results:
        lines.append(
            f"| {r['gpus']} | {label or 'now'} | **{r['rss_mb']:.0f} MB** | {r['nodes_rss_mb']:.0f} MB |"
        )
    lines.append("")
    lines.append(
        "*Before the app started*: the interpreter, gpuops and the simulated nodes (which would run on"
        " the GPU nodes, not here); the app itself adds the difference."
    )
    lines.append("")
    lines.append(
        "Targets: <= 50 ms per update at 1000 GPUs (issue 6), then at 10k GPUs (issue 22); <= 300 MB."
        " Only the screen in front draws; the grid and the tables draw only the lines in view."
    )
    lines.append(
        "Run again: `.venv/bin/python bench/tui_refresh.py` (`--before REV` measures a commit's tree"
        " in the same run)."
    )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("tui_refresh", body)


if __name__ == "__main__":
    main()
