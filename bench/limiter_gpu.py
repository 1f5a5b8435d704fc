"""The limiter on a real GPU with PyTorch: the acceptance figures, recorded in docs/benchmarks.md.

    python3 bench/limiter_gpu.py [--from DIR] [--seconds 10] [--no-write]

Runs the measurements of tests/gpu/test_limiter_torch.py (tests/gpu/torchlab.py): the memory cap
as PyTorch sees and hits it, two fixed-share tenants at 30/70 doing matmul loops, and a
launch-bound loop with and without the limiter; writes the section "Limiter on a real GPU"
with the GPU's model from nvidia-smi. --from DIR records the JSON figures a test run left in
DIR ($GPUOPS_GPU_RESULTS) instead of measuring again. Without an NVIDIA GPU it prints so and
exits 0; with one but no CUDA build of PyTorch it says what it tried and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: bench/ is on the path, the checkout is not
    sys.path.insert(0, str(ROOT))

from bench.benchdoc import write_section  # noqa: E402
from tests.gpu import torchlab  # noqa: E402

GIB = torchlab.GIB


def measure(seconds: float) -> dict[str, Any]:
    python = torchlab.find_torch_python()
    lib = torchlab.build_library()
    figures: dict[str, Any] = {
        "environment": {
            "gpu": torchlab.gpu_info(),
            "python": python.path,
            "torch": python.torch,
            "cuda": python.cuda,
        }
    }
    with tempfile.TemporaryDirectory(prefix="gpuops-limiter-gpu-") as tmp:
        cap = torchlab.memory_cap()
        for name, conf in (("memory-default", None), ("memory-expandable", "expandable_segments:True")):
            print(f"{name} ...", flush=True)
            node = torchlab.Node(Path(tmp) / name, python.path, lib)
            try:
                figures[name] = torchlab.measure_memory(node, cap, conf)
            finally:
                node.close()
        for name, run in (
            ("shares", lambda n: torchlab.measure_shares(n, seconds=seconds)),
            ("overhead", torchlab.measure_overhead),
        ):
            print(f"{name} ...", flush=True)
            node = torchlab.Node(Path(tmp) / name, python.path, lib)
            try:
                figures[name] = run(node)
            finally:
                node.close()
    for name, value in figures.items():
        torchlab.write_result(name, value)
    return figures


def load(directory: Path) -> dict[str, Any]:
    names = ("environment", "memory-default", "memory-expandable", "shares", "overhead")
    figures = {name: torchlab.read_result(directory, name) for name in names}
    missing = [name for name, value in figures.items() if value is None]
    if missing:
        raise SystemExit(f"{directory}: no figures for {', '.join(missing)} (run make gpu-test first)")
    return figures


def verdict(problems: list[str]) -> str:
    return "pass" if not problems else "**fail**"


def render(figures: dict[str, Any]) -> str:
    env = figures["environment"]
    gpu = env["gpu"]
    lines = [
        "## Limiter on a real GPU (`bench/limiter_gpu.py`)",
        "",
        f"GPU: **{gpu['name']}** ({gpu['memory_mib']} MiB, driver {gpu['driver']}); PyTorch {env['torch']} "
        f"(CUDA {env['cuda']}). The acceptance of the limiter with unmodified PyTorch programs, each a "
        "process with `libgpuops-limiter.so` preloaded and a tenant table of its own "
        "(`tests/gpu/test_limiter_torch.py` checks the same figures). Run again on a GPU machine with "
        "`make gpu-test && python3 bench/limiter_gpu.py` (or `--from` the test run's "
        "`$GPUOPS_GPU_RESULTS`).",
        "",
        "| check | target | measured | |",
        "|---|---|---|---|",
    ]
    for name, label in (
        ("memory-default", "default allocator"),
        ("memory-expandable", "expandable segments"),
    ):
        m = figures[name]
        cap = m["cap"] / GIB
        lines.append(
            f"| memory cap {cap:g} GiB, {label}: `mem_get_info()` | total = cap | total "
            f"{m['total'] / GIB:.2f} GiB, free {m['free_before'] / GIB:.2f} GiB | "
            f"{verdict([] if m['total'] == m['cap'] else ['total'])} |"
        )
        error = m["fill_error"] or m["single_error"] or "none"
        lines.append(
            f"| ... allocating past the cap, {label} | out-of-memory error, program goes on | "
            f"one {(m['cap'] + m['chunk']) / GIB:g} GiB block: "
            f"{'refused' if m['single_oom'] else 'allowed'}; "
            f"{m['chunk'] >> 20} MiB blocks: refused after {m['reserved_at_oom'] / GIB:.2f} GiB "
            f"(`{error[:60]}`); afterwards half the cap used again: "
            f"{'yes' if m['after_sum_ok'] and m['after_matmul_ok'] else 'no'} | "
            f"{verdict(torchlab.memory_problems(m))} |"
        )
    s = figures["shares"]
    a, b = s["shares"]
    view = "/".join("n/a" if v is None else f"{100 * v:.1f}%" for v in s["limiter_view"])
    lines.append(
        f"| fixed share {a}/{b}, two processes, {s['size']}x{s['size']} {s['dtype']} matmuls, "
        f"{s['window_s']:g} s | ratio {s['expected_ratio']:.4f} ±{torchlab.RATIO_TOLERANCE:.0%} | "
        f"{s['matmuls_per_s'][0]:.1f} and {s['matmuls_per_s'][1]:.1f} matmul/s: ratio {s['ratio']:.4f} "
        f"({s['ratio_error']:+.1%}); split {100 * s['split'][0]:.1f}/{100 * s['split'][1]:.1f}; "
        f"{100 * s['of_solo'][0]:.1f}% and {100 * s['of_solo'][1]:.1f}% of one process alone "
        f"({s['solo_matmuls_per_s']:.1f}/s, {s['solo_tflops']:.0f} TFLOP/s); the limiter's view {view} | "
        f"{verdict(torchlab.share_problems(s))} |"
    )
    o = figures["overhead"]
    base = o["configs"]["no limiter"]
    for name, c in o["configs"].items():
        if c["tenant"] is None:
            continue
        lines.append(
            f"| launch-bound loop (`x.add_(1)` on one element), {name} tenant | <= "
            f"{torchlab.OVERHEAD_MAX:.0%} | {base['best_us']:.3f} us -> {c['best_us']:.3f} us per "
            f"iteration: {c['overhead']:+.1%} | "
            f"{verdict([p for p in torchlab.overhead_problems(o) if p.startswith(name + ':')])} |"
        )
    lines += [
        "",
        f"Launch-bound loop: {o['iterations']} iterations x {o['repeats']} repeats per process, "
        f"{o['rounds']} processes per configuration in turn; each figure is the best process's median.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="record the JSON a test run left here")
    parser.add_argument("--seconds", type=float, default=10.0, help="window of the share measurement")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.source:
        figures = load(args.source)
    else:
        if not torchlab.has_gpu():
            print("no NVIDIA GPU: nothing to measure (exit 0)")
            return 0
        try:
            figures = measure(args.seconds)
        except torchlab.Unavailable as exc:
            print(f"cannot measure: {exc}", file=sys.stderr)
            return 2
    body = render(figures)
    print(body)
    if not args.no_write:
        write_section("limiter_gpu", body)
        print(f"\nwritten to {Path('docs') / 'benchmarks.md'}; JSON in {torchlab.results_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
