"""Fleet exporter: scrape time at 100 and 1000 simulated nodes, over real SSH on loopback.

    .venv/bin/python bench/exporter_fleet.py [--nodes 100,1000] [--scrapes 20] [--no-write]

For each size a simulated fleet (`large` scenario, one server process) is started on loopback and
`gpuops exporter -f fleet.yaml --listen 127.0.0.1:0` runs as its own process, following every node
at 1 Hz as an operator runs it. Once every node is live, measured:
- **scrape**: wall time of a whole scrape over HTTP as Prometheus sends it (gzip accepted), from
  the request to the last byte, `--scrapes` of them one second apart (median and worst), with
  the collector taking every node's samples meanwhile;
- **CPU per scrape**: the exporter's CPU (/proc/PID/stat, ended threads included) over the scrapes, less
  its CPU over as long a time without scrapes (the collector alone), per scrape;
- the body's size (plain and gzip) and its series count; the exporter's resident set at the end.
The fleet's server runs on the same 2 cores, so the figures include its competition, as they
would on an operator machine that also runs the TUI.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

REPO = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"serving metrics on (http://\S+/metrics)")
UP = re.compile(r'^gpuops_node_up\{[^}]*state="live"[^}]*\} 1\.0$', re.M)


def _get(url: str) -> tuple[float, bytes]:
    """(seconds from request to last byte, the body as sent: gzip)."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return time.perf_counter() - started, body


def cpu_seconds(pid: int) -> float:
    """The process's user + system time, its ended threads' included (each scrape runs on a
    thread of its own that ends with it, so per-thread counters would lose it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(nodes: int, scrapes: int) -> dict[str, Any]:
    from gpuops.simfleet import launch, stop

    with tempfile.TemporaryDirectory(prefix="gpuops-bench-exporter-") as tmp:
        directory = Path(tmp) / "sim"
        launch(directory, scenario="large", nodes=nodes, timeout=180)
        fleet = directory / "fleet.yaml"
        command = [sys.executable, "-m", "gpuops", "exporter", "-f", str(fleet), "--listen", "127.0.0.1:0"]
        proc = subprocess.Popen(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO, text=True
        )
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            match = URL_LINE.search(line)
            if match is None:
                raise SystemExit(f"the exporter did not start: {line}")
            url = match.group(1)
            deadline = time.monotonic() + 120
            while True:
                _, body = _get(url)
                live = len(UP.findall(gzip.decompress(body).decode()))
                if live == nodes:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{live} of {nodes} nodes live after 120 s")
                time.sleep(1)
            time.sleep(3)  # past the discovery burst
            quiet = float(scrapes)
            before = cpu_seconds(proc.pid)
            time.sleep(quiet)
            collector_cpu = cpu_seconds(proc.pid) - before
            walls: list[float] = []
            before, started = cpu_seconds(proc.pid), time.monotonic()
            for k in range(scrapes):
                wall, body = _get(url)
                walls.append(wall)
                time.sleep(max(0.0, started + k + 1 - time.monotonic()))
            elapsed = time.monotonic() - started
            scraping_cpu = cpu_seconds(proc.pid) - before
            text = gzip.decompress(body)
            series = sum(1 for ln in text.splitlines() if ln and not ln.startswith(b"#"))
            rss = _rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            stop(directory)
    per_scrape = (scraping_cpu - collector_cpu * elapsed / quiet) / scrapes
    gpus = text.count(b"gpuops_gpu_info{")
    return {
        "nodes": nodes,
        "gpus": gpus,
        "series": series,
        "median_ms": 1000 * statistics.median(walls),
        "worst_ms": 1000 * max(walls),
        "cpu_ms": 1000 * per_scrape,
        "collector_core": collector_cpu / quiet,
        "plain_kib": len(text) / 1024,
        "gzip_kib": len(body) / 1024,
        "rss_mb": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = measure(n, args.scrapes)
        print(row, flush=True)
        rows.append(row)
    table = [
        "| nodes | GPUs | series | scrape (median) | scrape (worst) | exporter CPU per scrape "
        "| collector alone | body (gzip) | RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['nodes']} | {r['gpus']} | {r['series']} "
            f"| {r['median_ms']:.0f} ms | {r['worst_ms']:.0f} ms "
            f"| {r['cpu_ms']:.0f} ms | {100 * r['collector_core']:.0f}% of a core "
            f"| {r['plain_kib']:.0f} KiB ({r['gzip_kib']:.0f}) | {r['rss_mb']:.0f} MB |"
        )
    body = (
        "## Fleet exporter (`bench/exporter_fleet.py`, issue 15)\n\n"
        "`gpuops exporter -f fleet.yaml` over a simulated `large` fleet on loopback (real SSH, one "
        "server process on the same 2 cores), every node followed at 1 Hz; "
        f"{args.scrapes} scrapes one second apart once every node is live, gzip accepted as "
        "Prometheus asks. *scrape*: request to last byte; *CPU per scrape*: the exporter's CPU "
        "over the scrapes less the collector's alone over as long.\n\n"
        + "\n".join(table)
        + "\n\nA scrape takes the collector's node views and renders them on the HTTP server's thread "
        "(tenant figures per node and for the fleet through views/tenants.py, then prometheus-client's "
        "text format, about two thirds of the CPU), so sampling goes on meanwhile. At 1000 nodes a "
        "scrape fits Prometheus' default 10 s timeout; scrape such a fleet every 15 s or more (about "
        "9% of a core at 15 s), or give its nodes the node exporter. Run again: "
        "`.venv/bin/python bench/exporter_fleet.py` (a few minutes)."
    )
    if not args.no_write:
        write_section("exporter_fleet", body)
    print(body)


if __name__ == "__main__":
    main()
