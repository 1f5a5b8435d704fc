"""How long `gpuops plan` / `apply` / `assert` take on a simulated fleet of N nodes over SSH.

    .venv/bin/python -m bench.apply_fleet [--nodes 100] [--parallel 10] [--no-write]

Starts the `large` scenario on 127.0.0.1, adds a carve: section (MIG layouts on every A100-80GB,
A100-40GB and H100 GPU, limiter lines on every L40S), then times, each as one command run the way
a user runs it: plan, apply --yes --force, assert, and a second apply (nothing to do). Figures go to
docs/benchmarks.md (section apply_fleet).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.benchdoc import write_section
from gpuops.simfleet import launch, stop

CARVE = """\
carve:
  - select: {gpus: {model: A100-80GB}}
    mig: {enabled: true, profiles: {"3g.40gb": 2}}
  - select: {gpus: {model: A100-SXM4-40GB}}
    mig: {enabled: true, profiles: {"2g.10gb": 3}}
  - select: {gpus: {model: H100-80GB}}
    mig: {enabled: true, profiles: {"1g.10gb": 3, "4g.40gb": 1}}
  - select: {gpus: {model: L40S}}
    limiter:
      policy: burst-share
      tenants: {search: {compute: 30%, class: offline}, "*": {compute: 20%}}
"""


def gpuops(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=1800,
    )
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=10)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-apply-") as tmp:
        directory = Path(tmp) / "fleet"
        launch(directory, "large", nodes=args.nodes, timeout=300)
        try:
            carve = directory / "carve.yaml"
            carve.write_text((directory / "fleet.yaml").read_text() + CARVE)
            t_plan, plan = gpuops("plan", str(carve), "--json")
            if plan.returncode != 2:
                print(plan.stdout[-2000:], plan.stderr[-2000:])
                return 1
            summary = json.loads(plan.stdout)["summary"]
            t_apply, applied = gpuops(
                "apply", str(carve), "--yes", "--force", "--parallel", str(args.parallel), "--json"
            )
            results = json.loads(applied.stdout)["results"] if applied.stdout.strip().startswith("{") else []
            changed = sum(r["status"] == "changed" for r in results)
            t_assert, asserted = gpuops("assert", str(carve))
            t_again, again = gpuops("apply", str(carve), "--yes")
        finally:
            stop(directory)
    ok = applied.returncode == 0 and asserted.returncode == 0 and again.returncode == 0
    lines = [
        f"{args.nodes} simulated nodes (`large` scenario) on 127.0.0.1 over SSH, one command each, "
        f"`--parallel {args.parallel}`; carve: MIG layouts on every A100/H100 GPU, limiter lines on L40S.",
        "",
        "| step | wall time | what |",
        "|---|---|---|",
        f"| `gpuops plan` | {t_plan:.1f} s | {summary['gpus']} GPUs on {summary['nodes']} nodes to change: "
        f"{summary['add']} adds, {summary['change']} changes, {summary['remove']} removals, "
        f"{summary['disruptive']} disruptive |",
        f"| `gpuops apply --yes --force` | {t_apply:.1f} s | {changed} nodes changed, "
        f"exit {applied.returncode} |",
        f"| `gpuops assert` | {t_assert:.1f} s | exit {asserted.returncode} |",
        f"| `gpuops apply` again | {t_again:.1f} s | nothing to do, exit {again.returncode} |",
        "",
        "Run again: `.venv/bin/python -m bench.apply_fleet --nodes 100`. The simulated GPUs change MIG "
        "layouts instantly, so this measures gpuops (SSH sessions, plans, agent round trips, node "
        "locks, verify), not the driver: on real hardware a MIG mode change with a GPU reset takes "
        "seconds per GPU, and the nodes' GPUs are changed one after another within a node while "
        "`--parallel` nodes run at once.",
    ]
    text = "\n".join(lines)
    print(text)
    if not ok:
        print(applied.stdout[-3000:], applied.stderr[-3000:], asserted.stdout[-2000:])
        return 1
    if not args.no_write:
        write_section("apply_fleet", "## Plan and apply (`bench/apply_fleet.py`)\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
