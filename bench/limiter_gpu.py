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
import shutil
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
MIB = torchlab.MIB


MEASURES = (
    "memory-default",
    "memory-expandable",
    "shares",
    "overhead",
    "overhead-driver",
    "overhead-in-process",
    "planner-caps",
)
# Measures added after the first recorded runs: a directory of an older run may lack them.
OPTIONAL = ("overhead-driver", "overhead-in-process", "planner-caps")
ENGINE_NAMES = {"gpuops": "gpuops", "hami": "HAMi-core"}
HAMI_LIB = ROOT / ".hami" / "libvgpu.so"


def result_name(engine: str, measure: str) -> str:
    return measure if engine == "gpuops" else f"{engine}-{measure}"


def measure(seconds: float, engine: str = "gpuops", only: tuple[str, ...] = MEASURES) -> dict[str, Any]:
    """The figures of each measure in only, each written as JSON as soon as it is taken (a
    later one may hang and be killed). A worker that fails is a figure too for HAMi-core: its
    error is recorded in place of the figures; for gpuops it stops the run."""
    python = torchlab.find_torch_python()
    if engine == "gpuops":
        lib = torchlab.build_library()
    else:
        lib = HAMI_LIB
        if not lib.is_file():
            raise torchlab.Unavailable(f"no {lib}: run scripts/hami-core.sh first")
    figures: dict[str, Any] = {}
    environment = {
        "gpu": torchlab.gpu_info(),
        "python": python.path,
        "torch": python.torch,
        "cuda": python.cuda,
    }
    if engine == "hami":
        environment["hami_commit"] = (
            (lib.parent / "COMMIT").read_text().strip() if (lib.parent / "COMMIT").is_file() else None
        )
    torchlab.write_result(result_name(engine, "environment"), environment)
    figures["environment"] = environment
    runs: dict[str, Any] = {
        "memory-default": lambda n: torchlab.measure_memory(n, torchlab.memory_cap(), None),
        "memory-expandable": lambda n: torchlab.measure_memory(
            n, torchlab.memory_cap(), "expandable_segments:True"
        ),
        "shares": lambda n: torchlab.measure_shares(n, seconds=seconds),
        "overhead": torchlab.measure_overhead,
        "overhead-driver": lambda n: torchlab.measure_overhead(
            n, iterations=50000, repeats=10, rounds=7, program="cu_launch.c"
        ),
        "overhead-in-process": torchlab.measure_launch_in_process,
        "planner-caps": torchlab.measure_planner_caps,
    }
    with tempfile.TemporaryDirectory(prefix="gpuops-limiter-gpu-") as tmp:
        for name in only:
            print(f"{ENGINE_NAMES[engine]} {name} ...", flush=True)
            node = torchlab.Node(Path(tmp) / name, python.path, lib, engine=engine)
            try:
                figures[name] = runs[name](node)
            except torchlab.WorkerError as exc:
                if engine == "gpuops":
                    raise
                figures[name] = {"error": str(exc)}
            finally:
                node.close()
            torchlab.write_result(result_name(engine, name), figures[name])
            if engine != "gpuops":  # its own log lines say what it hooked, for the notes
                logs = torchlab.results_dir() / f"{engine}-logs"
                logs.mkdir(exist_ok=True)
                for path in (Path(tmp) / name).glob("*.stderr"):
                    shutil.copy(path, logs / f"{name}-{path.name}")
    return figures


def load(directory: Path, engine: str = "gpuops") -> dict[str, Any] | None:
    """The figures a run left in directory; None when it left none of engine's."""
    names = ("environment", *MEASURES)
    figures = {name: torchlab.read_result(directory, result_name(engine, name)) for name in names}
    if all(value is None for value in figures.values()) and engine != "gpuops":
        return None
    missing = [name for name, value in figures.items() if value is None and name not in OPTIONAL]
    if missing and engine == "gpuops":
        raise SystemExit(f"{directory}: no figures for {', '.join(missing)} (run make gpu-test first)")
    # A measure killed before it wrote its figures (HAMi-core hanging) is recorded as such.
    return {
        name: value if value is not None else {"error": "no figures: the run was killed"}
        for name, value in figures.items()
        if value is not None or name not in OPTIONAL
    }


def verdict(problems: list[str]) -> str:
    return "pass" if not problems else "**fail**"


def _error_cell(error: str) -> str:
    first = next((line for line in error.splitlines() if line.strip()), error)
    return f"**failed**: {first[:160]}".replace("|", "/")


def _memory_cells(m: dict[str, Any]) -> tuple[str, str]:
    if "error" in m:
        return _error_cell(m["error"]), _error_cell(m["error"])
    seen = f"total {m['total'] / GIB:.2f} GiB, free {m['free_before'] / GIB:.2f} GiB " + verdict(
        [] if m["total"] == m["cap"] else ["total"]
    )
    error = m["fill_error"] or m["single_error"] or "none"
    refused = (
        f"refused after {m['reserved_at_oom'] / GIB:.2f} GiB (`{error[:60]}`)"
        if m["fill_oom"]
        else f"**never refused** ({m['held_bytes'] / GIB:.2f} GiB held)"
    )
    hit = (
        f"one {(m['cap'] + m['chunk']) / GIB:g} GiB block: "
        f"{'refused' if m['single_oom'] else '**allowed**'}; "
        f"{m['chunk'] >> 20} MiB blocks: {refused}; afterwards half the cap used again: "
        f"{'yes' if m['after_fill_ok'] and m['after_matmul_ok'] else 'no'} "
        f"{verdict(torchlab.memory_problems(m))}"
    )
    return seen.replace("|", "/"), hit.replace("|", "/")


def _planner_cell(p: dict[str, Any] | None) -> str:
    if not p:
        return "-"
    if "error" in p:
        return _error_cell(p["error"])
    observed = p.get("observed") or {}
    context = observed.get("context_bytes")
    held = ", ".join(
        f"{t} {(p['footprint'].get(t) or 0) / GIB:.2f} of {cap / GIB:.2f} GiB"
        + ("" if p["limiter_refused"][t] else " (**driver refused**)")
        for t, cap in sorted(p["caps"].items())
    )
    used = p.get("smi_used")
    return (
        f"{held}; the GPU {used / GIB:.2f} GiB used of {p['total'] / GIB:.2f} "
        f"(context {context / MIB:.0f} MiB observed) "
        if used is not None and context
        else f"{held} "
    ) + verdict(torchlab.planner_caps_problems(p))


def _shares_cell(s: dict[str, Any]) -> str:
    if "error" in s:
        return _error_cell(s["error"])
    known = [v for v in s["limiter_view"] if v is not None]
    view = (
        "; its own view " + "/".join(f"{100 * v:.1f}%" for v in s["limiter_view"])
        if len(known) == len(s["limiter_view"])
        else ""
    )
    return (
        f"{s['matmuls_per_s'][0]:.1f} and {s['matmuls_per_s'][1]:.1f} matmul/s: ratio {s['ratio']:.4f} "
        f"({s['ratio_error']:+.1%}); split {100 * s['split'][0]:.1f}/{100 * s['split'][1]:.1f}; "
        f"{100 * s['of_solo'][0]:.1f}% and {100 * s['of_solo'][1]:.1f}% of one process alone{view} "
        f"{verdict(torchlab.share_problems(s))}"
    )


def _overhead_cell(o: dict[str, Any] | None, name: str) -> str:
    if not o or name not in o.get("configs", {name: None}):
        return "-"
    if "error" in o:
        return _error_cell(o["error"])
    base, c = o["configs"]["no limiter"], o["configs"][name]
    if o.get("program", "").endswith(".c"):
        ns = (1000 * base["best_us"], 1000 * c["best_us"])
        figure = f"{ns[0]:.0f} -> {ns[1]:.0f} ns per launch: {c['overhead']:+.1%}"
    else:
        figure = f"{base['best_us']:.3f} -> {c['best_us']:.3f} us per iteration: {c['overhead']:+.1%}"
    if "overhead_of_medians" in c:
        figure += f" (median process {c['overhead_of_medians']:+.1%})"
    if c.get("library"):
        return figure + " (code before the change)"
    return figure


def _in_process_cell(o: dict[str, Any] | None, name: str) -> str:
    if not o or name not in o.get("configs", {name: None}):
        return "-"
    if "error" in o:
        return _error_cell(o["error"])
    c = o["configs"][name]
    figure = (
        f"{c['added_ns']:+.0f} ns to a {c['driver_ns']:.0f} ns launch: {c['overhead']:+.1%} "
        f"(per process {', '.join(f'{v:+.0f}' for v in c['added_ns_per_process'])} ns)"
    )
    if c.get("library"):
        return figure + " (code before the change)"
    if c["tenant"] is None:
        return figure + " (the method's noise: both blocks are the driver's)"
    return (
        f"{figure} {verdict([p for p in torchlab.launch_in_process_problems(o) if p.startswith(name + ':')])}"
    )


def render(figures: dict[str, Any], hami: dict[str, Any] | None = None) -> str:
    env = figures["environment"]
    gpu = env["gpu"]
    engines = [figures] + ([hami] if hami else [])
    head = "| check | target | gpuops |" + (" HAMi-core |" if hami else "")
    lines = [
        "## Limiter on a real GPU (`bench/limiter_gpu.py`)",
        "",
        f"GPU: **{gpu['name']}** ({gpu['memory_mib']} MiB, driver {gpu['driver']}); PyTorch {env['torch']} "
        f"(CUDA {env['cuda']}). The acceptance of the limiter with unmodified PyTorch programs, each a "
        "process with `libgpuops-limiter.so` preloaded and a tenant table of its own "
        "(`tests/gpu/test_limiter_torch.py` checks the same figures). Run again on a GPU machine with "
        "`make gpu-test && python3 bench/limiter_gpu.py` (or `--from` the test run's "
        "`$GPUOPS_GPU_RESULTS`).",
    ]
    if hami:
        lines += [
            "",
            f"HAMi-core ({(hami['environment'] or {}).get('hami_commit') or 'commit unknown'}, built by "
            "`scripts/hami-core.sh`) ran the same programs on the same machine, each tenant as its own "
            "container would be (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`, a shared-region file "
            "per tenant): the fixed shares as `CUDA_DEVICE_SM_LIMIT=30` and `=70`, the best-effort tenant "
            "as a memory limit alone, the 50% burst tenant as `CUDA_DEVICE_SM_LIMIT=50` (HAMi-core has no "
            "burst policy). Same targets, same checks (`bench/limiter_gpu.py --engine hami`).",
        ]
    lines += ["", head, "|---|---|---|" + ("---|" if hami else "")]

    def row(check: str, target: str, cells: list[str]) -> None:
        lines.append(f"| {check} | {target} | " + " | ".join(cells) + " |")

    # gpuops' own figures are complete (load refuses them otherwise): the rows' text comes from them.
    cap = figures["memory-default"]["cap"] / GIB
    for name, label in (
        ("memory-default", "default allocator"),
        ("memory-expandable", "expandable segments"),
    ):
        cells = [_memory_cells(e[name]) for e in engines]
        row(f"memory cap {cap:g} GiB, {label}: `mem_get_info()`", "total = cap", [c[0] for c in cells])
        row(
            f"... allocating past the cap, {label}",
            "out-of-memory error, program goes on",
            [c[1] for c in cells],
        )
    if figures.get("planner-caps"):
        row(
            "three tenants with the planner's caps (50/30/20%, to the MiB) fill the GPU together",
            "each its cap; the driver refuses none",
            [_planner_cell(e.get("planner-caps")) for e in engines],
        )
    s = figures["shares"]
    a, b = s["shares"]
    row(
        f"fixed share {a}/{b}, two processes, {s['size']}x{s['size']} {s['dtype']} matmuls, "
        f"{s['window_s']:g} s (one alone: {s['solo_matmuls_per_s']:.1f}/s, {s['solo_tflops']:.0f} TFLOP/s)",
        f"ratio {a / b:.4f} ±{torchlab.RATIO_TOLERANCE:.0%}",
        [_shares_cell(e["shares"]) for e in engines],
    )
    o = figures["overhead"]
    loops = [("overhead", "launch-bound loop (`x.add_(1)` on one element)")]
    if figures.get("overhead-driver"):
        loops.append(("overhead-driver", "empty kernel through `cuLaunchKernel` (`cu_launch.c`)"))
    for measure_name, loop in loops:
        for name in figures[measure_name]["configs"]:
            if name == "no limiter":
                continue
            row(
                f"{loop}, {name} tenant",
                "recorded",
                [_overhead_cell(e.get(measure_name), name) for e in engines],
            )
    ip = figures.get("overhead-in-process")
    if ip and "configs" in ip:
        for name in ip["configs"]:
            row(
                f"added to one `cuLaunchKernel` inside one process, {name}",
                f"<= {torchlab.OVERHEAD_MAX:.0%}",
                [_in_process_cell(e.get("overhead-in-process"), name) for e in engines],
            )
    lines += [
        "",
        f"Launch-bound loop: {o['iterations']} iterations x {o['repeats']} repeats per process, "
        f"{o['rounds']} processes per configuration in turn, each pinned to CPUs {o.get('cpus', 'any')}; "
        "each figure is the best process's median (in brackets: the median process against the median "
        "process without the limiter). Between processes these loops are recorded, not judged: processes "
        "of one configuration spread by 10-40%, with or without the limiter.",
    ]
    if ip and "configs" in ip:
        lines.append(
            f"In one process (the overhead acceptance, `cu_launch.c ab`): {ip['repeats']} pairs of blocks of "
            f"{ip['iterations']} launches, through the limiter and straight into the driver, the order "
            f"turning each pair; {ip['rounds']} processes per configuration; the figure is the median "
            "difference."
        )
    d = figures.get("overhead-driver")
    if d and "configs" in d:
        lines.append(
            f"Driver loop: {d['iterations']} launches x {d['repeats']} repeats per process, {d['rounds']} "
            f"processes per configuration. On this driver one event record costs "
            f"{d.get('event_record_ns', 0):.0f} ns and one query of a completed event "
            f"{d.get('event_query_ns', 0):.0f} ns (the calls the limiter makes to measure GPU time)."
        )
    measured = [figures.get(m) or {} for m in ("overhead", "overhead-driver", "overhead-in-process")]
    if any(c.get("library") for m in measured for c in m.get("configs", {}).values()):
        lines.append(
            '"before": the limiter built from the commit before the change, in the same rounds '
            "($GPUOPS_LIMITER_BEFORE)."
        )
    return "\n".join(lines)


_NVML_ROWS = (  # (label, the backend's field in the record, nvidia-smi's column)
    ("memory total", ("inventory", "info", "memory_total_bytes"), "memory.total"),
    ("power limit (W)", ("inventory", "info", "power_limit_watts"), "enforced.power.limit"),
    ("architecture", ("inventory", "info", "architecture"), None),
    ("MIG mode (current)", ("inventory", "mig", "current"), "mig.mode.current"),
    ("memory used", ("sample", "sample", "memory_used_bytes"), "memory.used"),
    ("power draw (W)", ("sample", "sample", "power_watts"), "power.draw"),
    ("temperature (C)", ("sample", "sample", "temperature_celsius"), "temperature.gpu"),
    ("SM clock (MHz)", ("sample", "sample", "sm_clock_mhz"), "clocks.sm"),
    ("memory clock (MHz)", ("sample", "sample", "memory_clock_mhz"), "clocks.mem"),
    ("utilization (%)", ("sample", "sample", "utilization_gpu_percent"), "utilization.gpu"),
)


def render_nvml(record: dict[str, Any]) -> str:
    """The NVML backend's reading of the real driver beside nvidia-smi's (tests/gpu/test_nvml_real.py)."""
    node = record.get("node", {})
    lines = [
        "",
        f"The NVML backend on the same driver (`tests/gpu/test_nvml_real.py`, read-only; node: driver "
        f"{node.get('driver_version')}, CUDA {node.get('cuda_driver_version')}; capabilities "
        f"{', '.join(record.get('capabilities', []))}):",
        "",
        "| field | gpuops (NVML) | nvidia-smi |",
        "|---|---|---|",
    ]
    for gpu in record.get("gpus", []):
        smi = gpu.get("nvidia_smi", {})
        for label, path, column in _NVML_ROWS:
            value: Any = gpu
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and path[-1].endswith("_bytes"):
                value = f"{value / MIB:.0f} MiB"
            theirs = smi.get(column, "") if column else ""
            if theirs and column in ("memory.total", "memory.used"):
                theirs += " MiB"
            lines.append(f"| {label} | {value} | {theirs or '-'} |")
        lines.append(f"| MIG mode as found | {gpu.get('mig_mode_found')} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="record the JSON a test run left here")
    parser.add_argument("--seconds", type=float, default=10.0, help="window of the share measurement")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/benchmarks.md")
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINE_NAMES),
        default="gpuops",
        help="measure gpuops' limiter or HAMi-core (.hami/libvgpu.so, scripts/hami-core.sh); "
        "HAMi-core's figures only measure (JSON), --from records both",
    )
    parser.add_argument("--only", choices=MEASURES, action="append", help="measure only these (repeatable)")
    parser.add_argument(
        "--note", default="", help="a paragraph recorded under the table (where the figures come from)"
    )
    args = parser.parse_args(argv)
    hami = nvml = None
    if args.source:
        figures = load(args.source)
        hami = load(args.source, "hami")
        nvml = torchlab.read_result(args.source, "nvml")
    else:
        if not torchlab.has_gpu():
            print("no NVIDIA GPU: nothing to measure (exit 0)")
            return 0
        try:
            figures = measure(args.seconds, args.engine, tuple(args.only or MEASURES))
        except torchlab.Unavailable as exc:
            print(f"cannot measure: {exc}", file=sys.stderr)
            return 2
        if args.engine != "gpuops" or args.only:
            print(f"figures in {torchlab.results_dir()} (record them with --from)")
            return 0
    body = render(figures, hami)
    if nvml:
        body += "\n" + render_nvml(nvml)
    if args.note:
        body += "\n\n" + args.note
    print(body)
    if not args.no_write:
        gpu = figures["environment"]["gpu"]
        write_section("limiter_gpu", body, f"{gpu['name']}, driver {gpu['driver']}")
        print(f"\nwritten to {Path('docs') / 'benchmarks.md'}; JSON in {torchlab.results_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
