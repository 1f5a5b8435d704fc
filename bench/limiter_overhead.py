"""Overhead of the interception limiter (native/libgpuops-limiter.so) against the fake driver.

    .venv/bin/python -m bench.limiter_overhead [--quick] [--no-write]

Measures, each without and with the library preloaded (the difference is the limiter's cost):
- ns per cuLaunchKernel on the steady path (best-effort tenant; fixed-share tenant);
- ns per cuMemAlloc_v2 + cuMemFree_v2 pair in one process;
- per-allocation time with 8 processes of one tenant allocating 256 MiB at once, against one;
- the limiter's start-up cost per process, one process against 64 started at once.
Targets (issue 5): <= 50 ns per launch, <= 1 us per pair, 8 processes <= 2x one.
Writes the figures into the `## Limiter` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "native" / "build"
FAKE = BUILD / "tests"
BENCH = BUILD / "bench" / "limiter_overhead"
LIB = BUILD / "libgpuops-limiter.so"
CUDAPROG = FAKE / "cudaprog"
MIB = 1 << 20


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "native"), f"BUILD={FAKE}"], check=True)
    BENCH.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-std=c11",
            "-Wall",
            "-Werror",
            f"-I{ROOT / 'native' / 'include'}",
            "-o",
            str(BENCH),
            str(ROOT / "bench" / "limiter_overhead.c"),
            str(FAKE / "libcuda.so.1"),
        ],
        check=True,
    )


class Node:
    def __init__(self, root: Path) -> None:
        self.dir = root / "limiter"
        self.dir.mkdir()
        self.state = root / "fakegpu.state"
        (self.dir / "tenants").write_text(
            "gpuops-limiter-table 1\n"
            "tenant be memory=16GiB policy=best-effort\n"
            "tenant fixed memory=16GiB compute=100 policy=fixed-share\n"
        )

    def env(self, tenant: Optional[str]) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUOPS_", "CUDA_DEVICE_", "LD_PRELOAD"))
        }
        env.update(
            FAKECUDA_STATE=str(self.state),
            FAKECUDA_MEMORY=str(64 << 30),
            FAKECUDA_INSTANT="1",
            GPUOPS_LIMITER_DIR=str(self.dir),
            LD_LIBRARY_PATH=str(FAKE),
        )
        if tenant:
            env["GPUOPS_TENANT"] = tenant
            env["LD_PRELOAD"] = str(LIB)
        return env

    def bench(self, tenant: Optional[str], *args: str) -> tuple[float, float]:
        out = subprocess.run(
            [str(BENCH), *args], env=self.env(tenant), capture_output=True, text=True, check=True
        ).stdout.split()
        return float(out[1]), float(out[2])


def best(values: list[float]) -> float:
    """The least disturbed of several runs (noise on a shared machine only adds time)."""
    return min(values)


def launch_costs(node: Node, repeats: int, n: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {"none": [], "be": [], "fixed": []}
    for _ in range(repeats):
        for tenant in runs:
            runs[tenant].append(node.bench(None if tenant == "none" else tenant, "launch", str(n))[0])
    return {k: best(v) for k, v in runs.items()}


def alloc_costs(node: Node, repeats: int, n: int) -> dict[str, tuple[float, float]]:
    runs: dict[str, list[tuple[float, float]]] = {"none": [], "be": []}
    for _ in range(repeats):
        for tenant in runs:
            runs[tenant].append(
                node.bench(None if tenant == "none" else tenant, "alloc", str(n), str(256 * MIB))
            )
    return {k: (best([w for w, _ in v]), best([c for _, c in v])) for k, v in runs.items()}


def concurrent_alloc(node: Node, tenant: Optional[str], procs: int, n: int) -> tuple[float, float]:
    """(CPU ns per pair averaged over the processes, wall ns per pair x min(procs, cores))."""
    ps = [
        subprocess.Popen(
            [str(BENCH), "startgate", "alloc", str(n), str(256 * MIB)],
            env=node.env(tenant),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    for p in ps:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    cpu = []
    for p in ps:
        out, _ = p.communicate(timeout=600)
        cpu.append(float(out.split()[2]))
    wall = time.monotonic() - t0
    cores = min(procs, os.cpu_count() or 1)
    return statistics.mean(cpu), wall * 1e9 * cores / (procs * n)


def startup(node: Node, count: int) -> tuple[float, float]:
    """Mean CPU and wall time of the limiter's start-up per process (recorded in its slot)."""
    from gpuops.node import limiter

    env = node.env("be")
    ps = [
        subprocess.Popen(
            [str(CUDAPROG), "ready", "wait", "init", "alloc", "1m", "ready", "wait"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for p in ps:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in ps:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in ps:
        assert p.stdout is not None
        while not p.stdout.readline().startswith("ready"):
            pass
    ((_, snap, _),) = limiter.read_regions(node.dir)
    assert snap is not None
    pids = {p.pid for p in ps}
    used = [u for u in snap.processes if u.pid in pids and u.alive]
    for p in ps:
        p.communicate("go\n", timeout=60)
    return statistics.mean(u.init_cpu_ns for u in used), statistics.mean(u.init_ns for u in used)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 7
    build()
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp))
        node.bench("be", "alloc", "10", "1024")  # creates the region and the tenant entries
        launch = launch_costs(node, repeats, 50_000 if args.quick else 200_000)
        alloc = alloc_costs(node, repeats, 5_000 if args.quick else 20_000)
        n8 = 100_000 if args.quick else 500_000
        conc: dict[tuple[Optional[str], int], list[tuple[float, float]]] = {}
        for _ in range(2 if args.quick else 3):
            for tenant in ("be", None):
                for procs in (1, 8):
                    conc.setdefault((tenant, procs), []).append(concurrent_alloc(node, tenant, procs, n8))

        def least(tenant: Optional[str], procs: int) -> tuple[float, float]:
            runs = conc[(tenant, procs)]
            return best([c for c, _ in runs]), best([w for _, w in runs])

        one_lim, eight_lim, one_raw, eight_raw = (
            least("be", 1),
            least("be", 8),
            least(None, 1),
            least(None, 8),
        )
        start_one = [startup(node, 1) for _ in range(5)]
        start_64 = startup(node, 64)
    one_cpu = statistics.median(c for c, _ in start_one)
    one_wall = statistics.median(w for _, w in start_one)
    rows = [
        ("cuLaunchKernel, best-effort tenant (steady path)", launch["none"], launch["be"], "<= 50 ns"),
        ("cuLaunchKernel, fixed-share tenant (steady path)", launch["none"], launch["fixed"], "<= 50 ns"),
        ("cuMemAlloc_v2 + cuMemFree_v2 (256 MiB), 1 process", alloc["none"][0], alloc["be"][0], "<= 1 us"),
    ]
    lines = [
        "## Limiter (`bench/limiter_overhead.py`)",
        "",
        "The interception limiter against the fake driver of `tests/native` (a CPU-only machine: the",
        "driver's own cost is the fake's, so the column that matters is the difference; empty kernels",
        "complete at once, `FAKECUDA_INSTANT=1`). Each figure is the best of",
        f"{repeats} runs; run it again with `.venv/bin/python -m bench.limiter_overhead`.",
        "",
        "| call | without limiter | with limiter | added | target |",
        "|---|---|---|---|---|",
    ]
    for name, raw, lim, target in rows:
        lines.append(f"| {name} | {raw:.0f} ns | {lim:.0f} ns | {lim - raw:+.0f} ns | {target} |")
    lines += [
        "",
        "Eight processes of one tenant allocating and freeing 256 MiB at once, against one process "
        "(target: <= 2x one process; HAMi-core measured 20x, 12.7 against 0.59 ms). CPU time per "
        "call is the measure: it includes any spinning or cache-line contention and no waiting for "
        "a core. Wall time x cores is shown too, but on a shared machine other work takes cores "
        "(the fake driver alone does not scale either):",
        "",
        "| per allocation + free | 1 process | 8 processes | 8 ÷ 1 |",
        "|---|---|---|---|",
        *(
            f"| {label} | {one[i]:.0f} ns | {eight[i]:.0f} ns | {eight[i] / one[i]:.2f}x |"
            for label, one, eight, i in (
                ("CPU time, with limiter", one_lim, eight_lim, 0),
                ("CPU time, without", one_raw, eight_raw, 0),
                (
                    "CPU time added by the limiter",
                    (one_lim[0] - one_raw[0],),
                    (eight_lim[0] - eight_raw[0],),
                    0,
                ),
                ("wall time x cores used, with limiter", one_lim, eight_lim, 1),
                ("wall time x cores used, without", one_raw, eight_raw, 1),
            )
        ),
        "",
        "Start-up of the limiter in a process (driver loading, tenant table, region registration), "
        "as recorded in its slot:",
        "",
        "| processes started at once | CPU per process | wall per process |",
        "|---|---|---|",
        f"| 1 | {one_cpu / 1e3:.0f} us | {one_wall / 1e3:.0f} us |",
        f"| 64 | {start_64[0] / 1e3:.0f} us | {start_64[1] / 1e3:.0f} us |",
        "",
        "With 64 processes on this machine's cores the wall time includes waiting for a core; no",
        "process waits on a lock (slots are claimed lock-free).",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        sys.path.insert(0, str(ROOT))
        from bench.benchdoc import write_section

        write_section("limiter", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
