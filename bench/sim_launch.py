"""What one launch of a small sim fleet costs in CPU: `gpuops sim up` (the CLI process), and the
fleet process with its children (past workers, multiprocessing's resource tracker) once every
node's past is built, and again after one `gpuops discover`; for this tree and (optionally)
another checkout, in turns, in the same run.

    .venv/bin/python bench/sim_launch.py [--nodes 8 16] [--scenario silos] [--reps 3]
        [--before /path/to/checkout] [--no-write]

CPU from the CLI's rusage (wait4) and the fleet's /proc/PID/stat (utime + stime, plus its reaped
and live children's). Each tree runs with its `gpuops` first on PYTHONPATH and its own bytecode
cache (PYTHONPYCACHEPREFIX, written even where PYTHONDONTWRITEBYTECODE is set, one untimed
launch first): a tree without .pyc files would be measured compiling itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PASTS_LINE = "simulated pasts of"
PASTS_WAIT = 60.0


def _env(tree: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache / tree.name)
    env["PYTHONPATH"] = str(tree)
    return env


def _cpu(pid: int) -> float:
    """CPU seconds of pid and its children (reaped ones in its cutime/cstime, live ones read)."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def _run_timed(argv: list[str], tree: Path, env: dict[str, str]) -> float:
    """CPU seconds of the command (not of the fleet it leaves running in its own session)."""
    child = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {tree}: {child.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    return usage.ru_utime + usage.ru_stime


def one(tree: Path, cache: Path, nodes: int, scenario: str) -> dict[str, float]:
    env = _env(tree, cache)
    cli = [sys.executable, "-m", "gpuops"]
    with tempfile.TemporaryDirectory(prefix="sim-launch-") as tmp:
        directory = Path(tmp) / "sim"
        began = time.perf_counter()
        up = _run_timed(
            [*cli, "sim", "up", "--dir", str(directory), "-n", str(nodes), "--scenario", scenario], tree, env
        )
        ready = time.perf_counter() - began
        try:
            pid = int((directory / "simfleet.pid").read_text())
            log = directory / "simfleet.log"
            deadline = time.perf_counter() + PASTS_WAIT
            while PASTS_LINE not in log.read_text(errors="replace") and time.perf_counter() < deadline:
                time.sleep(0.1)
            built = time.perf_counter() - began
            time.sleep(0.3)
            fleet = _cpu(pid)
            _run_timed([*cli, "discover", "-f", str(directory / "fleet.yaml")], tree, env)
            time.sleep(0.3)
            after = _cpu(pid)
        finally:
            subprocess.run(
                [*cli, "sim", "down", "--dir", str(directory)], cwd=tree, env=env, capture_output=True
            )
    return {"cli": up, "fleet": fleet, "discover": after, "total": up + fleet, "ready": ready, "built": built}


def _fmt(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--scenario", default="silos")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout, measured in turns with this one")
    parser.add_argument("--no-write", action="store_true", help="print only; docs/benchmarks.md untouched")
    args = parser.parse_args()
    trees = [("before", args.before.resolve())] if args.before else []
    trees.append(("after" if args.before else "this tree", ROOT))
    rows = []
    with tempfile.TemporaryDirectory(prefix="sim-launch-pyc-") as cache_dir:
        cache = Path(cache_dir)
        for _label, tree in trees:  # untimed: fills each tree's bytecode cache
            one(tree, cache, 2, args.scenario)
        for nodes in args.nodes:
            runs: dict[str, list[dict[str, float]]] = {label: [] for label, _tree in trees}
            for _rep in range(args.reps):
                for label, tree in trees:
                    runs[label].append(one(tree, cache, nodes, args.scenario))
                    print(label, nodes, runs[label][-1], file=sys.stderr)
            for label, _tree in trees:
                r = runs[label]
                rows.append(
                    f"| {nodes} | {label} | "
                    + " | ".join(
                        _fmt([x[k] for x in r]) + " s"
                        for k in ("cli", "fleet", "discover", "total", "ready", "built")
                    )
                    + " |"
                )
    head = [
        "| nodes | tree | `sim up` (CLI) | fleet + children, pasts built | after a `discover` | "
        "CLI + fleet | `sim up` returned | pasts built |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table = "\n".join(head + rows)
    print(table)
    if not args.no_write:
        from bench.benchdoc import write_section

        write_section("sim_launch", _doc(args, table))


def _doc(args: argparse.Namespace, table: str) -> str:
    intro = textwrap.fill(
        f"CPU seconds of one `gpuops sim up --scenario {args.scenario}`: the CLI process, and the "
        "fleet process with its children once every node's past is built and after one "
        "`gpuops discover`; wall seconds until `sim up` returned and until the pasts were built. "
        f"min/median/max over {args.reps} runs, trees in turns.",
        width=100,
    )
    return (
        f"## Launching a small fleet (`bench/sim_launch.py`)\n\n{intro}\n\n{table}\n\n"
        "Run again: `.venv/bin/python bench/sim_launch.py --before <worktree of an older commit>`."
    )


if __name__ == "__main__":
    main()
