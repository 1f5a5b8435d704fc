"""Start-up of `gpuops` commands and resident memory of the agent, this tree against an older one.

    .venv/bin/python bench/cli_startup.py [--before REV] [--runs 15] [--no-write]

Both trees are measured in the same run, alternately, on the same interpreter: REV (default: main
before the lazy commands of issue 22) is unpacked with `git archive` into a temporary folder and put
first on the path, so the figures differ only by the code.
- **start-up**: wall time of the whole process (exec to exit), min and median of `--runs`, and
  its CPU time (user + system, min), for
  `python -c pass`, `gpuops --help`, `gpuops mig check A100-40GB 3g.20gb 3g.20gb`, `gpuops agent
  --help`, `gpuops tenants --help` (a fleet command: spec and planner, no SSH client), and commands
  that do their work against a 5-node simulated fleet started for the run (`gpuops sim up`):
  `validate`, `discover -f`, `plan`, `sim queue`; and how many modules each imports
  (`python -X importtime`).
- **agent memory**: resident set (VmRSS) of the agent on the simulated 8-GPU demo node, started as
  `gpuops agent` and as `python -m gpuops.node agent`, with `--stdio` (after hello, inventory and
  one sample answered) and with `--metrics` (after one scrape); the median of three starts.
Targets (issue 22): <= 0.15 s for `--help` and `mig check`; <= 40 MB for the agent however started.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchdoc import write_section

REPO = Path(__file__).resolve().parent.parent
BEFORE = "5c1c083"  # main before the spec's attribute docstrings and typer's adapters were left out
# The installed `gpuops` script does exactly this; `-c` keeps the tree in the current folder first
# on the path, so the same line runs either tree.
GPUOPS = ["-c", "import sys; sys.argv[0] = 'gpuops'; from gpuops.cli.main import main; main()"]
NODE = ["-m", "gpuops.node"]
COMMANDS: list[tuple[str, list[str]]] = [
    ("`python -c pass`", ["-c", "pass"]),
    ("`gpuops --help`", [*GPUOPS, "--help"]),
    (
        "`gpuops mig check A100-40GB 3g.20gb 3g.20gb`",
        [*GPUOPS, "mig", "check", "A100-40GB", "3g.20gb", "3g.20gb"],
    ),
    ("`gpuops agent --help`", [*GPUOPS, "agent", "--help"]),
    ("`gpuops tenants --help`", [*GPUOPS, "tenants", "--help"]),
]
# Against the simulated fleet `main` starts ({dir}: its folder).
FLEET_COMMANDS: list[tuple[str, list[str]]] = [
    ("`gpuops validate fleet.yaml`", [*GPUOPS, "validate", "{dir}/fleet.yaml"]),
    ("`gpuops discover -f fleet.yaml` (5 nodes)", [*GPUOPS, "discover", "-f", "{dir}/fleet.yaml"]),
    ("`gpuops plan fleet.yaml` (5 nodes)", [*GPUOPS, "plan", "{dir}/fleet.yaml"]),
    ("`gpuops sim queue`", [*GPUOPS, "sim", "queue", "--dir", "{dir}"]),
]
STDIO_REQUESTS = "".join(
    json.dumps({"v": 1, "id": n, "op": op, "args": {}}) + "\n"
    for n, op in enumerate(("hello", "inventory", "sample"), 1)
)


def unpack(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev, "gpuops"], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_once(tree: Path, argv: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one start: on a busy machine the wall time waits
    for the other processes, the CPU time much less."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} in {tree} exited {proc.returncode}")
    return took, usage.ru_utime + usage.ru_stime


def modules_imported(tree: Path, argv: list[str]) -> int:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], cwd=tree, capture_output=True, text=True
    )
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:") and "|" in line[12:])


def startup(trees: dict[str, Path], runs: int) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    """(wall min, wall median, CPU min, modules) per tree and command."""
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(t, c): [] for t in trees for c, _ in COMMANDS}
    for tree in trees.values():  # bytecode compiled before anything is timed
        for _, argv in COMMANDS:
            run_once(tree, argv)
    for _ in range(runs):  # alternately, so a busy moment costs both trees alike
        for name, tree in trees.items():
            for command, argv in COMMANDS:
                times[name, command].append(run_once(tree, argv))
    return {
        key: (
            min(w for w, _ in v),
            statistics.median(w for w, _ in v),
            min(c for _, c in v),
            modules_imported(trees[key[0]], dict(COMMANDS)[key[1]]),
        )
        for key, v in times.items()
    }


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr]


def agent_rss(tree: Path, entry: list[str], mode: str) -> float:
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-") as tmp:
        dirs = ["--state-dir", f"{tmp}/state", "--limiter-dir", f"{tmp}/limiter", "--history-dir", f"{tmp}/h"]
        command = [sys.executable, *entry, "agent", "--backend", "sim", *dirs]
        if mode == "stdio":
            proc = subprocess.Popen(
                [*command, "--stdio"],
                cwd=tree,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(STDIO_REQUESTS.encode())
            proc.stdin.flush()
            for _ in range(3):
                if not proc.stdout.readline():
                    raise SystemExit(
                        f"the agent ended early: {proc.stderr.read().decode() if proc.stderr else ''}"
                    )
        else:
            proc = subprocess.Popen(
                [*command, "--metrics", "127.0.0.1:0", "--interval", "1"], cwd=tree, stderr=subprocess.PIPE
            )
            assert proc.stderr is not None
            match = None
            while match is None:
                line = proc.stderr.readline()
                if not line:
                    raise SystemExit("the exporter did not start")
                match = re.search(rb"serving metrics on (http://\S+/metrics)", line)
            with urllib.request.urlopen(match.group(1).decode(), timeout=20) as response:
                response.read()
        try:
            time.sleep(1.0)  # a sample or two taken after the answers
            return rss_mb(proc.pid)
        finally:
            proc.kill()
            proc.wait(timeout=20)


def memory(trees: dict[str, Path]) -> dict[tuple[str, str, str], float]:
    results: dict[tuple[str, str, str], float] = {}
    for name, tree in trees.items():
        for entry_name, entry in (("`gpuops agent`", GPUOPS), ("`python -m gpuops.node agent`", NODE)):
            for mode in ("stdio", "metrics"):
                results[name, entry_name, mode] = statistics.median(
                    agent_rss(tree, entry, mode) for _ in range(3)
                )
    return results


def start_fleet(into: Path) -> list[tuple[str, list[str]]]:
    """A 5-node simulated fleet in `into` (this tree's), and the fleet commands pointed at it."""
    subprocess.run(
        [sys.executable, "-m", "gpuops", "sim", "up", "--dir", str(into), "-n", "5"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return [(name, [arg.replace("{dir}", str(into)) for arg in argv]) for name, argv in FLEET_COMMANDS]


def stop_fleet(into: Path) -> None:
    down = [sys.executable, "-m", "gpuops", "sim", "down", "--dir", str(into)]
    subprocess.run(down, cwd=REPO, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=BEFORE, help="the older revision to measure beside this tree")
    parser.add_argument("--runs", type=int, default=15, help="starts of each command per tree")
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks.md")
    args = parser.parse_args()
    if not 3 <= args.runs <= 200:
        raise SystemExit("--runs from 3 to 200")
    with tempfile.TemporaryDirectory(prefix="gpuops-before-") as tmp:
        trees = {"before": unpack(args.before, Path(tmp)), "after": REPO}
        load = os.getloadavg()[0]
        try:
            COMMANDS.extend(start_fleet(Path(tmp) / "fleet"))
            times = startup(trees, args.runs)
        finally:
            stop_fleet(Path(tmp) / "fleet")
        rss = memory(trees)
    lines = [
        "## Command start-up and agent memory (`bench/cli_startup.py`, issue 22)",
        "",
        f"Before: `{args.before}`; after: this tree. Both measured in the same run, alternately (the "
        "fleet commands against one 5-node simulated fleet). Wall time of the whole process, "
        f"{args.runs} starts each (min / median), its CPU time (user + system, min: less swayed by other "
        f"work on a busy machine) and the modules it imports; load average {load:.1f} at the start. "
        "Targets: <= 0.15 s for `--help` and `mig check`; 30% less CPU for a fleet command than "
        "`5c1c083` (`make test` runs the CLI ~490 times).",
        "",
        "| command | before: wall min / median, CPU min | after: wall min / median, CPU min "
        "| CPU after ÷ before | modules before | modules after |",
        "|---|---|---|---|---|---|",
    ]
    for command, _ in COMMANDS:
        b, a = times["before", command], times["after", command]
        lines.append(
            f"| {command} | {b[0] * 1000:.0f} / {b[1] * 1000:.0f} ms, {b[2] * 1000:.0f} ms "
            f"| {a[0] * 1000:.0f} / {a[1] * 1000:.0f} ms, {a[2] * 1000:.0f} ms | {a[2] / b[2]:.2f} "
            f"| {b[3]} | {a[3]} |"
        )
    lines += [
        "",
        "Resident memory of the agent on the simulated 8-GPU demo node (median of three starts): "
        "`--stdio` after hello, inventory and one sample; `--metrics` after one scrape. Target: <= 40 MB.",
        "",
        "| started as | mode | before | after |",
        "|---|---|---|---|",
    ]
    for entry in ("`gpuops agent`", "`python -m gpuops.node agent`"):
        for mode in ("stdio", "metrics"):
            before, after = rss["before", entry, mode], rss["after", entry, mode]
            lines.append(f"| {entry} | `--{mode}` | {before:.1f} MB | {after:.1f} MB |")
    lines += [
        "",
        "The before tree is REV's whole gpuops/, so changes outside the CLI and the spec count too "
        "(against `5c1c083`, most of `sim queue`'s is gpuops/simfleet's own, be02271).",
        "",
        "Left out of every start since `5c1c083`: pydantic's reading of the fleet models' attribute "
        "docstrings (it walked frames and tokenized each model's source, ~80 ms; now read only for "
        "`gpuops schema`, gpuops/spec/base.py), building every model's validator at import (now on first "
        "use, `defer_build`), and typer's pydantic TypeAdapter per parameter, built even for options not "
        "given (plain values are converted by gpuops/cli/coercion.py, any other by typer's adapter as "
        "before): a command that validates no fleet loads no pydantic. What is left for a fleet command "
        "is mostly the SSH client (asyncssh and cryptography, ~110 ms, imported by gpuops/fleet), the "
        "fleet models with pydantic (~100 ms) and gpuops/core's dataclasses; typer's own import is about "
        "40 ms and its rich help renderer about 50 ms more for `--help`. The agent checks its options "
        "with typer, then execs the node's entry (gpuops/cli/agent.py), so it holds what "
        "`python -m gpuops.node agent` holds.",
        "",
        "Run again: `.venv/bin/python bench/cli_startup.py` (a few minutes on a busy 2-core machine).",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("cli_startup", body)


if __name__ == "__main__":
    main()
