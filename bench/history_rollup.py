"""Per-node usage history (docs/history.md): what recording costs a node, what a 7-day reply weighs,
how long the sim fleet's simulated past takes, and `gpuops tenants`/`rebalance --window 7d` as a
user runs them.

    .venv/bin/python bench/history_rollup.py [--reps 3] [--large-nodes 100] [--no-e2e] [--no-write]

In one run (a minute and a half on a 2-core machine):
1. Node side, on sim-vision-01 of the `silos` scenario (8 x A100, DDP training on every card):
   CPU time per sample folded into the buckets, by `Rollup.add` (memory only) and by
   `Recorder.add` (minute and hour buckets rotated and compressed; no write), over 50 minutes of
   samples at the recorder's 10 s interval taken beforehand from a `SimBackend` on a controlled
   clock; the crash-safe write a recorder does every 60 s (the day's hour file and a full
   `minutes.json`: temporary file, fsync, rename, fsync of the directory) at 23:50 UTC, when the
   day file is nearly full, and the same write without the fsyncs; the bytes 35 days of hour
   files take, written by a `Recorder` from a simulated past evaluated every 5 minutes.
2. The agent's 7-day hourly `history` reply (the protocol line it sends) for that node and for
   two MIG nodes (silos' sim-platform-01 and an 8-GPU MIG node of `large`): bytes, the node's
   `read_history`, and on the operator side parsing the line (orjson, as AgentClient does) and
   `history_from_json`.
3. The sim fleet's 7-day past (`SimHistory.ensure_past`, as when an agent is first asked), per
   node, for the 8 `silos` nodes and one node of each profile of a 100-node `large` fleet.
4. End to end: wall time of `gpuops tenants -f fleet.yaml --window 7d --json` and `gpuops
   rebalance ... --json` against a `silos` sim fleet on 127.0.0.1 (first call right after the
   fleet is ready, so waiting for the pasts is included, then later calls), and `gpuops tenants`
   against a 100-node `large` fleet (whose pasts are built on demand, on the first call).
Figures are medians of `--reps` repetitions where a repetition is cheap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

INTERVAL = 10.0  # the recorder's default interval (gpuops agent --record)
PAST_STEP = 300.0  # the sim fleet's fine backfill step, used here for whole days of past
DAY = 86400.0
HOUR = 3600.0
E2E_TIMEOUT = 300.0  # one CLI call; the sim fleet answers in seconds, so this only bounds a hang


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def find_node(scenario: str, nodes: int | None, pick: Callable[[Any], bool], epoch: float) -> Any:
    """Of the nodes `pick` accepts, the first with the most GPUs."""
    from gpuops.simfleet.scenarios import build_fleet

    plan = build_fleet(scenario, nodes, epoch=epoch)
    return max((n for n in plan.nodes if pick(n)), key=lambda n: n.gpu_count)


def live_samples(spec: dict[str, Any], start: float, count: int, interval: float = INTERVAL) -> list[Any]:
    """`count` samples of the node at `interval`, as the live recorder sees them (taken up front:
    the backend's cost is not the recorder's)."""
    from gpuops.node.backends.sim import SimBackend

    clock = _Clock(start)
    backend = SimBackend(spec=spec, clock=clock)
    out = []
    for i in range(count):
        clock.t = start + i * interval
        out.append(backend.sample())
    backend.close()
    return out


def fold_cost(samples: Sequence[Any], reps: int) -> dict[str, float]:
    """CPU microseconds per sample: Rollup.add and Recorder.add (no write), medians of `reps`."""
    from gpuops.node.history.recorder import Recorder
    from gpuops.node.history.rollup import Rollup

    rollup_us, recorder_us = [], []
    for _ in range(reps):
        rollup = Rollup(INTERVAL)
        c0 = time.process_time()
        for s in samples:
            rollup.add(s)
        rollup_us.append(1e6 * (time.process_time() - c0) / len(samples))
        with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
            clock = _Clock(samples[0].timestamp)
            recorder = Recorder(
                tmp, interval=INTERVAL, clock=clock, durable=False, autoflush=False, lock=False
            )
            c0 = time.process_time()
            for s in samples:
                clock.t = s.timestamp
                recorder.add(s)
            recorder_us.append(1e6 * (time.process_time() - c0) / len(samples))
    keys = max((len(g.users) for b in rollup.buckets() for g in b.gpus), default=0)
    return {"rollup_us": _median(rollup_us), "recorder_us": _median(recorder_us), "keys_per_gpu": keys}


def past_rollup(spec: dict[str, Any], since: float, until: float, step: float = PAST_STEP) -> list[Any]:
    """Hour buckets of [since, until) from the node's model evaluated every `step`, as the sim
    fleet's backfill builds them (power and temperature left out, as there)."""
    from gpuops.node.history.rollup import Rollup
    from gpuops.simfleet.history import _PastBackend

    clock = _Clock(since)
    past = _PastBackend(spec=spec, clock=clock)
    rollup = Rollup(step, minutes_after=math.inf)  # hours only: minutes are the live recorder's
    t = since
    while t <= until:
        clock.t = t
        rollup.add(past.sample())
        t += step
    past.close()
    return rollup.buckets()


def write_past(directory: str, buckets: Sequence[Any], now: float) -> None:
    from gpuops.node.history.recorder import Recorder

    recorder = Recorder(directory, interval=INTERVAL, clock=lambda: now, durable=False, lock=False)
    recorder.merge(buckets)
    recorder.close()


def disk_usage(directory: str) -> dict[str, float]:
    files = [e for e in os.scandir(directory) if e.is_file() and e.name.startswith("hours-")]
    return {
        "files": len(files),
        "bytes": sum(e.stat().st_size for e in files),
        "allocated": sum(e.stat().st_blocks * 512 for e in files),
        "largest": max((e.stat().st_size for e in files), default=0),
    }


def filesystem(path: str) -> str:
    """The file system type under `path` (fsync costs depend on it)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1]
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > len(best):
                    best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


def write_cost(spec: dict[str, Any], day: float, live_minutes: int, reps: int) -> dict[str, Any]:
    """The recorder's periodic write at 23:50 UTC: the day's hour file (hours before the live
    window from the simulated past) and minutes.json (`live_minutes` of 10 s samples)."""
    from gpuops.node.history.files import MINUTES_FILE, day_of, hours_file
    from gpuops.node.history.recorder import Recorder

    live_from = day + DAY - 600.0 - live_minutes * 60.0
    samples = live_samples(spec, live_from, live_minutes * 6 + 2 * reps)
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        write_past(tmp, past_rollup(spec, day, math.floor(live_from / HOUR) * HOUR - 1.0), live_from)
        clock = _Clock(live_from)
        recorder = Recorder(tmp, interval=INTERVAL, clock=clock, durable=True, autoflush=False, lock=False)
        feed, extra = samples[: -2 * reps], samples[-2 * reps :]
        for s in feed:
            clock.t = s.timestamp
            recorder.add(s)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for n, s in enumerate(extra):
            # One more sample changes the current minute and hour, so both files are written;
            # with and without fsync alternate, so that both see the same disk's mood.
            clock.t = s.timestamp
            recorder.add(s)
            recorder.durable = n % 2 == 0
            w0, c0 = time.perf_counter(), time.process_time()
            recorder.flush()
            times[recorder.durable].append((time.perf_counter() - w0, time.process_time() - c0))
        hours = os.path.getsize(os.path.join(tmp, hours_file(day_of(clock.t))))
        minutes = os.path.getsize(os.path.join(tmp, MINUTES_FILE))
        fs = filesystem(os.path.realpath(tmp))
        recorder.close()
    return {
        "write_ms": 1000 * _median([w for w, _ in times[True]]),
        "write_cpu_ms": 1000 * _median([c for _, c in times[True]]),
        "nosync_ms": 1000 * _median([w for w, _ in times[False]]),
        "hours_bytes": hours,
        "minutes_bytes": minutes,
        "filesystem": fs,
    }


def reply_cost(directory: str, now: float, days: float, reps: int) -> dict[str, float]:
    """The `history` reply for [now - days, now] at hour resolution: the agent's line and what
    the operator does with it."""
    from gpuops.core import protocol as proto
    from gpuops.core.history import history_from_json, history_to_json
    from gpuops.fleet.agent_client import _loads  # the parser AgentClient uses (orjson)
    from gpuops.node.history.reader import read_history

    read_s, parse_s, decode_s = [], [], []
    line = b""
    buckets = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        history = read_history(directory, "hour", now - days * DAY, now + 1.0, now=now)
        line = proto.reply(7, history_to_json(history))
        read_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        message = proto.parse_message(line, _loads)
        parse_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decoded = history_from_json(message.result)
        decode_s.append(time.perf_counter() - t0)
        buckets = len(decoded.buckets)
    return {
        "bytes": len(line),
        "buckets": buckets,
        "read_ms": 1000 * _median(read_s),
        "parse_ms": 1000 * _median(parse_s),
        "decode_ms": 1000 * _median(decode_s),
    }


def reply_for(spec: dict[str, Any], now: float, days: float, reps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        write_past(tmp, past_rollup(spec, now - (days + 1) * DAY, now), now)
        return reply_cost(tmp, now, days, reps)


def backfill(nodes: Sequence[Any], days: float) -> list[dict[str, Any]]:
    """Each node's simulated past, one after the other, as the sim fleet builds it on demand."""
    from gpuops.node.backends.sim import SimBackend
    from gpuops.simfleet.history import SimHistory

    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        history = SimHistory(
            [(n.name, SimBackend(spec=n.spec), n.spec) for n in nodes],
            Path(tmp),
            days=days,
            background_nodes=0,
        )

        async def run() -> None:
            for n in nodes:
                w0, c0 = time.perf_counter(), time.process_time()
                await history.ensure_past(n.name)
                out.append(
                    {
                        "node": n.name,
                        "profile": n.profile,
                        "gpus": n.gpu_count,
                        "seconds": time.perf_counter() - w0,
                        "cpu": time.process_time() - c0,
                    }
                )

        asyncio.run(run())
        history.close()
        for node in history.nodes.values():
            node.backend.close()
    return out


# ---- end to end ----------------------------------------------------------------------------------


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "gpuops"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuops"]


def timed_cli(*args: str, ok: Sequence[int] = (0,)) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    out = subprocess.run([*_cli(), *args], capture_output=True, text=True, timeout=E2E_TIMEOUT)
    took = time.perf_counter() - t0
    if out.returncode not in ok:
        raise SystemExit(f"gpuops {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return took, json.loads(out.stdout)


def end_to_end(
    scenario: str, nodes: int | None, commands: Sequence[str], reps: int, phases: bool = False
) -> dict[str, Any]:
    """Start a sim fleet, run each command once at once (pasts not built yet, or being built) and
    then `reps` times more, then (`phases`) once in this process with its phases timed; stop the
    fleet."""
    from gpuops.simfleet import launch, stop

    result: dict[str, Any] = {"scenario": scenario}
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        directory = Path(tmp) / "sim"
        launched = launch(directory, scenario=scenario, nodes=nodes, timeout=120)
        try:
            result["nodes"] = len(launched.state.get("nodes", []))
            result["start_s"] = launched.seconds
            fleet = str(directory / "fleet.yaml")
            for command in commands:
                args = (command, "-f", fleet, "--window", "7d", "--json")
                ok = (0, 2) if command == "rebalance" else (0,)
                first, doc = timed_cli(*args, ok=ok)
                later = [timed_cli(*args, ok=ok)[0] for _ in range(reps)]
                result[command] = {"first_s": first, "later_s": _median(later)}
                if command == "tenants":  # its JSON says what evidence came back; rebalance's does not
                    gpus = doc.get("gpus", [])
                    result[command]["missing"] = len(doc.get("missing", {}))
                    result[command]["gpus"] = len(gpus)
                    seconds = [g.get("observed_seconds", 0) for g in gpus]
                    result[command]["evidence_days"] = _median(seconds) / DAY if seconds else 0.0
            if phases:
                result["phases"] = operator_phases(fleet)
        finally:
            stop(directory)
    return result


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def operator_phases(fleet_file: str) -> dict[str, float]:
    """What `gpuops tenants` does after its imports, in this process: every node's 7-day history
    over SSH (wall, and this process's CPU: SSH, parsing, `history_from_json`), then the
    accounting (`gather_evidence`, `tenant_usage`)."""
    from gpuops.fleet.targets import node_targets
    from gpuops.spec import load_fleet
    from gpuops.tenancy.accounting import gather_evidence, parse_window, tenant_usage
    from gpuops.tenancy.gather import read_histories

    fleet = load_fleet(fleet_file)
    targets = node_targets(fleet)
    window = parse_window("7d")
    now = time.time()
    w0, c0 = time.perf_counter(), _cpu()
    histories = asyncio.run(read_histories(targets, window, now, handshakes=fleet.max_handshakes))
    w1, c1 = time.perf_counter(), _cpu()
    tenant_usage(gather_evidence(fleet, histories, window, now), fleet)
    w2 = time.perf_counter()
    return {"read_s": w1 - w0, "read_cpu_s": c1 - c0, "accounting_s": w2 - w1}


def cli_start(reps: int) -> float:
    """What any gpuops command costs before it reads a node: the interpreter and the imports."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([*_cli(), "tenants", "--help"], capture_output=True, timeout=60, check=True)
        times.append(time.perf_counter() - t0)
    return _median(times)


# ---- report --------------------------------------------------------------------------------------


def _kib(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def render(r: dict[str, Any]) -> str:
    fold, write, disk = r["fold"], r["write"], r["disk"]
    per_hour_ms = 360 * fold["recorder_us"] / 1000 + 60 * write["write_cpu_ms"]
    lines = [
        "## History rollups (`bench/history_rollup.py`)",
        "",
        "Per-node usage history (docs/history.md). Medians of "
        f"{r['reps']} repetitions where a repetition is cheap.",
        "",
        f"**On the node**: {r['busy_node']} ({r['busy_gpus']} GPUs, DDP training on every card; up to "
        f"{fold['keys_per_gpu']} key{'s' if fold['keys_per_gpu'] != 1 else ''} per GPU per bucket), "
        "samples at the recorder's "
        f"{INTERVAL:g} s interval.",
        "",
        "| what | figure |",
        "|---|---|",
        f"| fold one sample into the minute and hour buckets, in memory (`Rollup.add`) "
        f"| {fold['rollup_us']:.0f} µs CPU |",
        f"| the same in a `Recorder` (finished minutes frozen and compressed; no write) "
        f"| {fold['recorder_us']:.0f} µs CPU |",
        f"| crash-safe write every 60 s at 23:50 UTC: day file ({_kib(write['hours_bytes'])}) and "
        f"minutes.json ({_kib(write['minutes_bytes'])}), fsync, rename, directory fsync "
        f"| {write['write_ms']:.1f} ms wall, {write['write_cpu_ms']:.1f} ms CPU |",
        f"| the same write without the fsyncs | {write['nosync_ms']:.1f} ms wall |",
        f"| recorder CPU per hour (360 samples, 60 writes; sampling NVML not included) "
        f"| {per_hour_ms:.0f} ms ({per_hour_ms / 36000:.3f}% of a core) |",
        f"| 35 days of hour files | {_kib(disk['bytes'])} in {disk['files']} files "
        f"({_kib(disk['allocated'])} allocated; a full day {_kib(disk['largest'])}) |",
        "",
        "**7-day hourly `history` reply** (the agent's protocol line; `read_history` on the node, "
        "then on the operator the line parsed with orjson and `history_from_json`):",
        "",
        "| node | GPUs | buckets | reply | node: read_history | operator: parse | history_from_json |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["replies"]:
        lines.append(
            f"| {row['node']} ({row['kind']}) | {row['gpus']} | {row['buckets']} | {_kib(row['bytes'])} "
            f"| {row['read_ms']:.1f} ms | {row['parse_ms']:.1f} ms | {row['decode_ms']:.1f} ms |"
        )
    lines += [
        "",
        f"**Simulated past** ({r['days']:g} days, `SimHistory.ensure_past` one node after the other, "
        "as the sim fleet does when an agent is first asked; wall time):",
        "",
        "| fleet | nodes | total | per node: median | slowest |",
        "|---|---|---|---|---|",
    ]
    for label, rows in r["backfill"].items():
        slow = max(rows, key=lambda x: x["seconds"])
        lines.append(
            f"| {label} | {len(rows)} | {sum(x['seconds'] for x in rows):.2f} s "
            f"| {_median([x['seconds'] for x in rows]):.2f} s "
            f"| {slow['seconds']:.2f} s ({slow['node']}, {slow['profile']}, {slow['gpus']} GPUs) |"
        )
    if r.get("e2e"):
        lines += [
            "",
            "**End to end** (`--window 7d --json`, a new `gpuops` process per call, sim fleet on "
            "127.0.0.1 over SSH in its own process; *first*: right after the fleet is ready):",
            "",
            "| command | fleet | first call | later calls (median) | evidence in the reply |",
            "|---|---|---|---|---|",
        ]
        for e in r["e2e"]:
            for command in ("tenants", "rebalance"):
                if command in e:
                    c = e[command]
                    evidence = (
                        f"{c['gpus']} GPUs, {c['evidence_days']:.1f} days each (median); "
                        f"{c['missing']} nodes missing"
                        if "gpus" in c
                        else "(not in its JSON)"
                    )
                    lines.append(
                        f"| `gpuops {command}` | {e['scenario']}, {e['nodes']} nodes "
                        f"| {c['first_s']:.2f} s | {c['later_s']:.2f} s | {evidence} |"
                    )
        for e in r["e2e"]:
            if "phases" in e:
                p = e["phases"]
                lines += [
                    "",
                    f"Where a later `gpuops tenants` call against {e['scenario']} ({e['nodes']} nodes) "
                    f"spends its time, measured in the benchmark's own process: reading every node's "
                    f"history over SSH {p['read_s']:.2f} s wall, of which {p['read_cpu_s']:.2f} s "
                    "CPU on the operator (SSH, parsing, `history_from_json`; the rest is the sim fleet "
                    f"process reading and sending), then the accounting {p['accounting_s']:.2f} s.",
                ]
        lines += [
            "",
            f"A `gpuops` process costs {r['cli_start_s']:.2f} s before it reads any node "
            "(`gpuops tenants --help`: the interpreter and the imports). Fleets were ready in "
            + ", ".join(f"{e['start_s']:.1f} s ({e['scenario']}, {e['nodes']})" for e in r["e2e"])
            + ". A `silos` fleet builds its pasts in the background from its start, so its first "
            "call waits for what is left; a fleet of more than 64 nodes builds a node's past when the "
            "node is first asked, so the first call against `large` pays for all of them, in the "
            "one sim fleet process.",
        ]
    lines += [
        "",
        f"How: 50 minutes of samples taken first from a `SimBackend` on a controlled clock, then "
        f"folded; the write is `Recorder.flush()` with both files changed, on {r['filesystem']}; "
        "hour files and replies are built from the simulated past evaluated every 5 minutes "
        "(the same keys as live sampling for these steady workloads). This machine is shared: the "
        f"load average was {r['load'][0]:.1f} at the start and {r['load'][1]:.1f} at the end of this run "
        "(2 cores), and under such load the millisecond figures come out up to twice those of a quiet "
        "run; fsync times depend on the disk and on other writers.",
        "Run again: `.venv/bin/python bench/history_rollup.py` (a minute and a half).",
    ]
    # Prose wrapped as in the other sections; table rows stay whole.
    return "\n".join(
        line if line.startswith("|") or len(line) <= 100 else textwrap.fill(line, 100, break_on_hyphens=False)
        for line in lines
    )


def measure(
    reps: int = 3,
    fold_samples: int = 300,
    live_minutes: int = 120,
    disk_days: int = 35,
    reply_days: float = 7.0,
    backfill_days: float = 7.0,
    large_nodes: int = 100,
    e2e: bool = True,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    # Aligned to the hour; the fold's samples start one second in and stay in that hour, so no
    # hour ends (an hour's end is a write) while it is timed.
    now = math.floor(time.time() / HOUR) * HOUR
    busy = find_node("silos", None, lambda n: n.name == "sim-vision-01", now)
    mig = find_node("silos", None, lambda n: n.name == "sim-platform-01", now)
    big_mig = find_node("large", large_nodes, lambda n: n.profile == "mig", now)
    r: dict[str, Any] = {"reps": reps, "days": backfill_days, "busy_node": busy.name}
    load_at_start = os.getloadavg()[0]
    r["busy_gpus"] = busy.gpu_count

    r["fold"] = fold_cost(live_samples(busy.spec, now + 1.0, fold_samples), reps)
    progress(f"fold: {json.dumps(r['fold'])}")
    day = math.floor(now / DAY) * DAY - DAY
    r["write"] = write_cost(busy.spec, day, live_minutes, reps)
    r["filesystem"] = r["write"].pop("filesystem")
    progress(f"write: {json.dumps(r['write'])}")

    replies = []
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        write_past(tmp, past_rollup(busy.spec, now - disk_days * DAY, now), now)
        r["disk"] = disk_usage(tmp)
        replies.append({"node": busy.name, "kind": "training", "gpus": busy.gpu_count})
        replies[-1].update(reply_cost(tmp, now, reply_days, reps))
    progress(f"disk: {json.dumps(r['disk'])}")
    for node, kind in ((mig, "MIG, silos"), (big_mig, "MIG, large")):
        replies.append({"node": node.name, "kind": kind, "gpus": node.gpu_count})
        replies[-1].update(reply_for(node.spec, now, reply_days, reps))
    r["replies"] = replies
    progress(f"replies: {json.dumps(replies)}")

    from gpuops.simfleet.scenarios import PROFILES, build_fleet

    epoch = float(int(time.time()))
    silos = build_fleet("silos", epoch=epoch).nodes
    large = build_fleet("large", large_nodes, epoch=epoch).nodes
    one_each = [
        next(n for n in large if n.profile == p) for p in PROFILES if any(n.profile == p for n in large)
    ]
    r["backfill"] = {
        f"silos ({len(silos)} nodes)": backfill(silos, backfill_days),
        f"large ({large_nodes} nodes), one per profile": backfill(one_each, backfill_days),
    }
    progress(f"backfill: {json.dumps(r['backfill'])}")

    r["e2e"] = []
    if e2e:
        r["cli_start_s"] = cli_start(reps)
        r["e2e"].append(end_to_end("silos", None, ("tenants",), reps))
        progress(f"e2e: {json.dumps(r['e2e'][-1])}")
        # A fresh fleet, so that rebalance's first call is a first call too.
        r["e2e"].append(end_to_end("silos", None, ("rebalance",), reps))
        progress(f"e2e: {json.dumps(r['e2e'][-1])}")
        r["e2e"].append(end_to_end("large", large_nodes, ("tenants",), max(1, reps - 1), phases=True))
        progress(f"e2e: {json.dumps(r['e2e'][-1])}")
    r["load"] = (load_at_start, os.getloadavg()[0])
    return r


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each cheap measure")
    parser.add_argument("--large-nodes", type=int, default=100, help="nodes of the `large` fleet")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end runs over SSH")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    started = time.monotonic()
    results = measure(
        reps=max(1, args.reps),
        large_nodes=args.large_nodes,
        e2e=not args.no_e2e,
        progress=lambda line: print(line, flush=True),
    )
    text = render(results)
    print(text)
    print(f"(took {time.monotonic() - started:.0f} s)")
    if not args.no_write:
        write_section("history_rollup", text)


if __name__ == "__main__":
    main()
