"""How long the MIG placement solver takes: every multiset of profiles of every model in the catalog.

    .venv/bin/python -m bench.mig_solver [--repeat 5] [--no-write]

The cases are those of tests/unit/test_mig_placement.py (every multiset with at most max_count + 1
of each profile and at most memory_slice_count + 2 memory slices: all that fit and those just beyond
every limit), solved on an empty GPU and again around a pinned instance (the first profile's first
start). `gpuops plan` solves one such case per GPU it carves, so the per-solve figure bounds what
the solver adds to a plan of N GPUs. Median of --repeat runs; figures go to docs/benchmarks.md
(section mig_solver).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.benchdoc import write_section
from gpuops.core.mig.catalog import MODELS, MigModel
from gpuops.core.mig.placement import Placement, solve
from tests.unit.test_mig_placement import multisets

Case = tuple[MigModel, dict[str, int], tuple[Placement, ...]]


def cases(pinned: bool) -> list[Case]:
    out: list[Case] = []
    for model in MODELS.values():
        fixed: tuple[Placement, ...] = ()
        if pinned:
            first = model.profiles[0]
            fixed = (Placement(first.name, first.id, first.placements[0], first.memory_slices),)
        for counts in multisets(model):
            out.append((model, {p.name: n for p, n in counts}, fixed))
    return out


def timed(batch: list[Case], repeat: int) -> tuple[float, int]:
    """Median seconds for the whole batch, and how many of its cases were placeable."""
    runs, ok = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        results = [solve(model, wanted, fixed) for model, wanted, fixed in batch]
        runs.append(time.perf_counter() - started)
        ok = sum(1 for r in results if r.ok)
    return statistics.median(runs), ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    rows = []
    for label, pinned in (("empty GPU", False), ("around a pinned instance", True)):
        batch = cases(pinned)
        seconds, ok = timed(batch, max(1, args.repeat))
        per = 1e6 * seconds / len(batch)
        rows.append(f"| {label} | {len(batch)} | {ok} | {seconds * 1000:.0f} ms | {per:.0f} µs |")
        print(f"{label}: {len(batch)} cases ({ok} placeable) in {seconds * 1000:.0f} ms, {per:.0f} µs each")
    body = "\n".join(
        [
            "## MIG placement solver (`bench/mig_solver.py`)",
            "",
            f"Every multiset of profiles of the {len(MODELS)} catalog models (all that fit and those just",
            "beyond every limit), median of "
            f"{max(1, args.repeat)} runs. `gpuops plan` solves one case per GPU it carves.",
            "",
            "| solved on | cases | placeable | all cases | per case |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    if not args.no_write:
        write_section("mig_solver", body)


if __name__ == "__main__":
    main()
