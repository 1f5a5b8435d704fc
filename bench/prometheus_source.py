"""The PromQL fleet source against the SSH source: operator CPU per refresh, TUI update time, and
`tenants --window` through PromQL against through each node's history over SSH.

    .venv/bin/python bench/prometheus_source.py [--nodes 50,200] [--steady 10] [--updates 10]
        [--window 7d] [--tenants-ssh 50] [--no-write]

For each size one simulated fleet (`large` scenario) runs with its own Prometheus
(`gpuops sim up --prometheus`: Debian's prometheus on loopback scraping every node's exporter each
second, gpuops' rules loaded). Once Prometheus has every target up, one operator process per source
(SSH first, then PromQL, on the same fleet) runs the real app headless (Textual's test driver,
200x60, the fleet grid in front) on `gpuops tui`'s event loop, as `gpuops tui -f fleet.yaml
[--prometheus URL]` builds it, and measures:
- **source alone**: the process's CPU over `--steady` seconds while the source refreshes every
  second and the app is up but not fed (the feed's own loop is off), per refresh (1 s);
- **TUI update**: `--updates` refreshes one second apart, each: the feed builds a FleetState from
  the source's snapshot, the grid takes it and Textual draws (as bench/tui_refresh.py times it);
  the event loop thread's CPU meanwhile (median) and the wall time (median, worst); operator CPU
  per refresh = source + TUI update;
- what a refresh took in: node-samples (SSH) or series in the answers (PromQL), and the
  Prometheus server's CPU while each operator ran (it scrapes the fleet in both phases).
Then `gpuops tenants -f fleet.yaml --window W --json` as a new process, with and without
`--prometheus URL`: wall time and the process's CPU, first call and the median of two later ones.
The SSH path reads every node's `--window` of history (a simulated past of 7 days, built by the
fleet on first ask); Prometheus holds only what it scraped since the fleet started, so the PromQL
figures are for the same queries over minutes of data (see docs/scale.md for what 7 days cost).
Everything runs on loopback on the same cores (fleet, Prometheus, operator); it is all stopped at
the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

REPO = Path(__file__).resolve().parent.parent
SIZE = (200, 60)
READY_TIMEOUT = 120.0
GPUOPS_TIMEOUT = 300.0
ROUND_TIMEOUT = 5.0  # the PromQL source's timeout (fleet.yaml's source.timeout)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu(pid: int) -> float:
    """A process's user + system seconds, ended threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child_named(parent: int, name: str) -> int | None:
    """The pid of `parent`'s child whose command is `name` (the fleet's Prometheus)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            head, tail = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        if head.split("(", 1)[1] == name and int(tail.split()[1]) == parent:
            return int(entry.name)
    return None


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=10) as response:
        return list(json.loads(response.read())["data"]["result"])


def _wait_scraped(url: str, nodes: int) -> None:
    """Until every target is up and has been for a few scrapes (rules evaluated over them)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        found = _query(url, "count(count_over_time(up[10s]) >= 3 and up == 1)")
        up = int(float(found[0]["value"][1])) if found else 0
        if up >= nodes:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"Prometheus has {up} of {nodes} targets up after {READY_TIMEOUT:g}s")
        time.sleep(1)


# ---- the operator process ----------------------------------------------------------------------


async def _operator(fleet_file: str, url: str | None, steady: float, updates: int) -> dict[str, Any]:
    from gpuops.fleet.collector import Collector
    from gpuops.fleet.promql.source import ExpectedNode, PromSource
    from gpuops.fleet.source import LIVE, FleetSource
    from gpuops.fleet.targets import node_targets
    from gpuops.spec import load_fleet
    from gpuops.tenancy.ownership import Ownership
    from gpuops.tui.app import GpuopsApp
    from gpuops.views.feed import Feed

    class ManualFeed(Feed):
        """The feed whose states the benchmark builds and hands on itself, one a second."""

        async def run(self, publish: Any) -> None:
            await asyncio.Event().wait()

    fleet = load_fleet(fleet_file)
    source: FleetSource
    collector: Collector | None = None
    prom: PromSource | None = None
    walls: list[float] = []  # each PromQL round's wall time
    failed = [0]  # rounds that ended with the source unreachable (timeout)
    if url is not None:
        # As `gpuops tui --prometheus URL` builds it, with fleet.yaml's `source: {timeout: 5s}`:
        # on these shared 2 cores a round under load can take longer than the 1 s interval.
        expected = [ExpectedNode(n.name, n.owner) for n in fleet.nodes]
        prom = PromSource(url, expected, interval=1.0, timeout=ROUND_TIMEOUT)
        source = prom
        one_round = prom.refresh

        async def timed_round() -> None:
            started = time.perf_counter()
            await one_round()
            walls.append(time.perf_counter() - started)
            failed[0] += prom is not None and prom.health.state != LIVE

        prom.refresh = timed_round  # type: ignore[method-assign]
    else:
        collector = Collector(
            node_targets(fleet), interval=1.0, max_handshakes=fleet.max_handshakes, label=fleet_file
        )
        source = collector
    feed = ManualFeed(source, Ownership.from_fleet(fleet))
    app = GpuopsApp(feed, tune_gc=True)  # as `gpuops tui` runs it

    def taken_in() -> int:
        if prom is not None:
            return prom.series_received
        assert collector is not None
        return collector.samples_received

    def rounds() -> int:
        return prom.rounds if prom is not None else 0

    result: dict[str, Any] = {"source": "promql" if url else "ssh"}
    async with app.run_test(size=SIZE) as pilot:
        app.go("gpus")
        started = time.monotonic()
        while True:
            snap = source.snapshot(time.time())
            live = sum(1 for v in snap.nodes if v.state == LIVE)
            if live == len(fleet.nodes):
                break
            if time.monotonic() - started > READY_TIMEOUT:
                raise SystemExit(f"{live} of {len(fleet.nodes)} nodes live after {READY_TIMEOUT:g}s")
            await asyncio.sleep(0.2)
        result["ready_s"] = time.monotonic() - started
        await asyncio.sleep(3.0)  # past the first burst (discovery, the first full samples)
        # The source alone (the app up, not fed).
        del walls[:]
        failed[0] = 0
        cpu0, in0, r0, t0 = _cpu(), taken_in(), rounds(), time.monotonic()
        await asyncio.sleep(steady)
        wall = time.monotonic() - t0
        refreshes = (rounds() - r0) if prom is not None else wall  # SSH: a sample a node a second
        result["source_cpu_ms"] = 1000 * (_cpu() - cpu0) / max(refreshes, 1)
        result["taken_in"] = (taken_in() - in0) / max(refreshes, 1)
        result["rounds_per_s"] = (rounds() - r0) / wall
        # With the TUI: a refresh a second, each built, shown and drawn.
        app.publish(feed.build())  # the grid's first layout is not a refresh: untimed
        await pilot._wait_for_screen()
        times: list[float] = []
        thread_cpu: list[float] = []
        cpu0, t0 = _cpu(), time.monotonic()
        for k in range(updates):
            await asyncio.sleep(max(0.0, t0 + k + 1 - time.monotonic()))
            a, c = time.perf_counter(), time.thread_time()
            app.publish(feed.build())
            await pilot._wait_for_screen()
            app.screen._on_timer_update()
            times.append(1000 * (time.perf_counter() - a))
            thread_cpu.append(1000 * (time.thread_time() - c))
        wall = time.monotonic() - t0
        result["total_cpu_ms"] = 1000 * (_cpu() - cpu0) / wall
        result["update_ms"] = statistics.median(times)
        result["update_worst_ms"] = max(times)
        # The loop's thread CPU meanwhile: the update, and whatever else the loop ran then.
        result["update_cpu_ms"] = statistics.median(thread_cpu)
        result["round_ms"] = 1000 * statistics.median(walls) if walls else None
        result["round_worst_ms"] = 1000 * max(walls) if walls else None
        result["rounds_failed"] = failed[0]
        result["rounds_timed"] = len(walls)
        state = app.fleet_state
        assert state is not None
        result["gpus"] = sum(len(v.sample.gpus) for v in state.snapshot.nodes if v.sample is not None)
        result["nodes_live"] = sum(1 for v in state.snapshot.nodes if v.state == LIVE)
        result["source_state"] = state.source
        result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        await pilot.press("q")
    return result


def _run_operator(
    fleet: Path, url: str | None, steady: float, updates: int, prom_pid: int | None
) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--operator", str(fleet), "--steady", str(steady)]
    argv += ["--updates", str(updates)] + (["--url", url] if url else [])
    prom0, t0 = (_proc_cpu(prom_pid) if prom_pid else 0.0), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=GPUOPS_TIMEOUT, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"operator process ({'promql' if url else 'ssh'}) failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if prom_pid:
        result["prometheus_core"] = (_proc_cpu(prom_pid) - prom0) / (time.monotonic() - t0)
    return result


# ---- tenants --window ----------------------------------------------------------------------------


def _tenants(fleet: Path, window: str, url: str | None) -> dict[str, Any]:
    """First call, then two more: wall and CPU of the `gpuops tenants` process each."""
    argv = [sys.executable, "-m", "gpuops", "tenants", "-f", str(fleet), "--window", window, "--json"]
    if url:
        argv += ["--prometheus", url]
    calls: list[tuple[float, float]] = []
    doc: dict[str, Any] = {}
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=GPUOPS_TIMEOUT, cwd=REPO)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"gpuops tenants ({'promql' if url else 'ssh'}) failed: {done.stderr.strip()}")
        doc = json.loads(done.stdout)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        calls.append((wall, cpu))
    return {
        "first_s": calls[0][0],
        "first_cpu_s": calls[0][1],
        "later_s": statistics.median(c[0] for c in calls[1:]),
        "later_cpu_s": statistics.median(c[1] for c in calls[1:]),
        "gpus": len(doc.get("gpus", [])),
        "missing": len(doc.get("missing", {})),
        "used": sum(t["used"] for t in doc.get("tenants", [])),
    }


# ---- one size ------------------------------------------------------------------------------------


def measure(nodes: int, steady: float, updates: int, window: str, tenants_ssh: bool) -> dict[str, Any]:
    from gpuops.simfleet import launch, stop

    with tempfile.TemporaryDirectory(prefix="gpuops-bench-promsrc-") as tmp:
        directory = Path(tmp) / "sim"
        launched = launch(directory, scenario="large", nodes=nodes, timeout=180, prometheus=True)
        started = time.time()
        try:
            url = str(launched.state["prometheus_url"])
            fleet = directory / "fleet.yaml"
            prom_pid = _child_named(launched.pid, "prometheus")
            _wait_scraped(url, nodes)
            row: dict[str, Any] = {"nodes": nodes}
            row["ssh"] = _run_operator(fleet, None, steady, updates, prom_pid)
            print(json.dumps(row["ssh"]), flush=True)
            row["promql"] = _run_operator(fleet, url, steady, updates, prom_pid)
            print(json.dumps(row["promql"]), flush=True)
            row["tenants_promql"] = _tenants(fleet, window, url)
            row["held_min"] = (time.time() - started) / 60
            print(json.dumps(row["tenants_promql"]), flush=True)
            if tenants_ssh:
                row["tenants_ssh"] = _tenants(fleet, window, None)
                print(json.dumps(row["tenants_ssh"]), flush=True)
            with urllib.request.urlopen(f"{url}/api/v1/status/tsdb", timeout=10) as response:
                row["head_series"] = int(json.loads(response.read())["data"]["headStats"]["numSeries"])
        finally:
            stop(directory)
    return row


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    live = [
        "| nodes (GPUs) | source | taken in per refresh (nodes live) | operator CPU per refresh: "
        "source | + TUI update | **= operator** | source, per item taken in | TUI update wall (worst) "
        "| PromQL round wall (worst) | Prometheus server | operator RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for kind in ("ssh", "promql"):
            m = r[kind]
            unit, one = ("node-samples", "node-sample") if kind == "ssh" else ("series", "series")
            per_item = 1000 * m["source_cpu_ms"] / max(m["taken_in"], 1e-9)
            rounds = "-"
            if m.get("round_ms") is not None:
                rounds = f"{m['round_ms']:.0f} ms ({m['round_worst_ms']:.0f})"
                if m["rounds_failed"]:
                    rounds += f", {m['rounds_failed']} of {m['rounds_timed']} failed"
            live.append(
                f"| {r['nodes']} ({m['gpus']}) | {'SSH' if kind == 'ssh' else 'PromQL'} "
                f"| {m['taken_in']:.0f} {unit} ({m['nodes_live']}) | {m['source_cpu_ms']:.0f} ms "
                f"| {m['update_cpu_ms']:.0f} ms | **{m['source_cpu_ms'] + m['update_cpu_ms']:.0f} ms** "
                f"| {per_item:.0f} µs per {one} | {m['update_ms']:.0f} ms ({m['update_worst_ms']:.0f}) "
                f"| {rounds} | {100 * m.get('prometheus_core', 0.0):.0f}% of a core | {m['rss_mb']:.0f} MB |"
            )
    tenants = [
        "| nodes | path | first call | its CPU | later calls (median of 2) | their CPU | GPUs in the reply |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for kind, label in (
            ("tenants_ssh", "SSH: every node's history"),
            ("tenants_promql", "PromQL: query_range"),
        ):
            t = r.get(kind)
            if t is None:
                continue
            tenants.append(
                f"| {r['nodes']} | {label} | {t['first_s']:.2f} s | {t['first_cpu_s']:.2f} s "
                f"| **{t['later_s']:.2f} s** | {t['later_cpu_s']:.2f} s "
                f"| {t['gpus']} ({t['missing']} nodes missing) |"
            )
    held = ", ".join(f"{r['held_min']:.0f} min at {r['nodes']} nodes" for r in rows)
    heads = ", ".join(f"{r['head_series']} series at {r['nodes']} nodes" for r in rows)
    growth = ""
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]

        def ratio(kind: str, key: str) -> float:
            return float(hi[kind][key]) / max(float(lo[kind][key]), 1e-9)

        growth = (
            f"From {lo['nodes']} to {hi['nodes']} nodes the source's CPU per refresh grew "
            f"{ratio('ssh', 'source_cpu_ms'):.1f}x over SSH (node-samples taken in "
            f"{ratio('ssh', 'taken_in'):.1f}x) and {ratio('promql', 'source_cpu_ms'):.1f}x over "
            f"PromQL (series in the answers {ratio('promql', 'taken_in'):.1f}x, GPUs "
            f"{ratio('promql', 'gpus'):.1f}x), with the same 4 queries a round at both sizes: "
            "PromQL's cost follows the size of the answers, not the node count. "
        )
    return (
        "## PromQL source against SSH (`bench/prometheus_source.py`, issue 16)\n\n"
        "A simulated `large` fleet with its own Prometheus (`sim up --prometheus`: Debian's "
        "prometheus 2.42 on loopback, every node's exporter scraped each second, gpuops' rules). "
        "Per size, one operator process per source on the same fleet, the real app headless "
        "(200x60, the fleet grid in front) built as `gpuops tui -f fleet.yaml [--prometheus URL]` "
        f"builds it (the PromQL source with `source.timeout: {ROUND_TIMEOUT:g}s`), refreshing every "
        f"second. *Source*: the process's CPU over {args.steady:g} s with the app up but not fed, per "
        f"refresh (a second over SSH, a round of queries over PromQL); *TUI update*: {args.updates} "
        "refreshes one second apart, each built into a FleetState, shown and drawn as "
        "`bench/tui_refresh.py` times it, the median of the event loop thread's CPU meanwhile "
        "(with whatever else the loop ran then) and of the wall time. *Taken in*: what one refresh "
        "reads (node-samples over SSH, series in the "
        "answers of PromQL's 4 instant queries) and the nodes live at the end. *Prometheus "
        "server*: its CPU while each operator ran (scraping every node each second in both, "
        "answering the queries in the PromQL one).\n\n"
        + "\n".join(live)
        + "\n\n"
        + growth
        + "Per GPU, though, PromQL costs the operator more than SSH: a node's SSH sample is a row "
        "of the values that changed (`core/delta.py`), while every round of PromQL brings every "
        "series again as JSON with all its labels, and the source rebuilds each node's sample from "
        "them (most of it Python work per series: copying each series' labels, grouping, decoding "
        "the nodes; orjson's parsing is under a tenth, by cProfile at 50 nodes). What PromQL takes "
        "off the operator is the sessions (one scrape per node whatever the number of viewers), the "
        "history reads, and the fleet's size as such: it can refresh at the scrape interval, ask "
        "for one site (`source.selector`), and read a Prometheus sharded behind Thanos, Mimir or "
        "VictoriaMetrics (docs/scale.md). "
        f"Prometheus' head held {heads} at the end.\n\n"
        f"`gpuops tenants -f fleet.yaml --window {args.window} --json`, a new process per call "
        "(about 0.45 s of it is the interpreter and imports):\n\n"
        + "\n".join(tenants)
        + f"\n\nOver SSH a {args.window} window reads every node's hour files (a simulated past "
        "of 7 days, which fleets of up to 64 nodes build at start and bigger ones on first ask: "
        "a first call on 200 nodes paid 54 s for it in issue 16, so this benchmark reads history "
        "over SSH only at the sizes `--tenants-ssh` names). Through PromQL it is a fixed dozen "
        "`query_range` with the hour as the step, whatever the fleet's size, and the answers grow "
        "with the GPUs and their keys; but this Prometheus held only what it scraped since the "
        f"fleet started ({held}), so its answers cover minutes, not 7 days: docs/scale.md works "
        "out what 7 days of records cost Prometheus. "
        "Everything (fleet, Prometheus, operator) ran on this machine's 2 cores beside other "
        f"people's work (load average {args.load_average:.1f} at the end): the wall times include "
        "waiting for a core (the 200-node fleet process could not serve every node's sample each "
        "second, and PromQL rounds took over a second, so fewer than one a second ran); the CPU "
        "figures are the processes' own. Run again: `.venv/bin/python bench/prometheus_source.py` "
        "(about 3.5 minutes; `--save rows.json`, then `--load rows.json` renders the section "
        "again without measuring)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="50,200")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of the source alone")
    parser.add_argument("--updates", type=int, default=10, help="refreshes with the TUI")
    parser.add_argument("--window", default="7d", help="tenants --window")
    parser.add_argument(
        "--tenants-ssh", default="50", help="sizes at which tenants also reads history over SSH (comma list)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--save", type=Path, help="also write the measured rows to this JSON file")
    parser.add_argument(
        "--load", type=Path, help="render the section from rows --save wrote; measure nothing"
    )
    parser.add_argument("--operator", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator:
        from gpuops.fleet.ssh import run

        print(json.dumps(run(_operator(args.operator, args.url, args.steady, args.updates))))
        return
    if args.load:
        saved = json.loads(args.load.read_text())
        rows = saved["rows"]
        args.steady, args.updates, args.window = saved["args"]
        load = saved["load"]
    else:
        ssh_sizes = {int(x) for x in args.tenants_ssh.split(",") if x.strip()}
        rows = []
        for nodes in (int(n) for n in args.nodes.split(",")):
            rows.append(measure(nodes, args.steady, args.updates, args.window, nodes in ssh_sizes))
        load = os.getloadavg()[0]
        if args.save:
            document = {"rows": rows, "args": [args.steady, args.updates, args.window], "load": load}
            args.save.write_text(json.dumps(document, indent=1) + "\n")
    args.load_average = load
    body = _report(rows, args)
    print(body)
    if not args.no_write:
        write_section("prometheus_source", body)


if __name__ == "__main__":
    main()
