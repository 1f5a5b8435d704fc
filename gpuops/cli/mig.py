"""`gpuops mig`: the MIG profile catalog and the placement solver, offline (no GPU needed).

gpuops mig check MODEL PROFILE... [--json]   will these instances fit, and where?
gpuops mig profiles MODEL [--json]           the catalog table of one model
gpuops mig models                            the models gpuops knows
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from gpuops.cli.console import CliConsole
from gpuops.cli.errors import fail
from gpuops.core.mig.catalog import MODELS, GpuInstanceProfile, MigModel, find_model
from gpuops.core.mig.placement import Placement, PlacementResult, slice_map, solve

mig_app = typer.Typer(
    name="mig",
    help="MIG profiles and placements: check a layout before carving a GPU (no GPU needed).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(mig_app, name="mig")


def _known_models() -> str:
    return ", ".join(MODELS)


def _model_or_fail(text: str) -> MigModel:
    model = find_model(text)
    if model is None:
        fail(escape(f"unknown GPU model {text!r}; known: {_known_models()} (see 'gpuops mig models')"))
    return model


def _parse_profile_args(
    model: MigModel, args: list[str]
) -> tuple[list[GpuInstanceProfile], list[Placement], str]:
    """PROFILE or PROFILE:START arguments -> (profiles to place, pinned placements, error)."""
    wanted: list[GpuInstanceProfile] = []
    pinned: list[Placement] = []
    for arg in args:
        ref, sep, start_text = arg.strip().rpartition(":") if ":" in arg else (arg.strip(), "", "")
        profile = model.find_profile(ref)
        if profile is None:
            return [], [], f"unknown profile {ref!r} for {model.key}; valid: {model.profile_list()}"
        if not sep:
            wanted.append(profile)
            continue
        if not start_text.strip().isdigit():
            return (
                [],
                [],
                f"{arg!r}: the start after ':' must be a memory-slice number, e.g. {profile.name}:0",
            )
        pinned.append(
            Placement(
                profile=profile.name,
                profile_id=profile.id,
                start=int(start_text),
                size=profile.memory_slices,
            )
        )
    return wanted, pinned, ""


def _slice_range(p: Placement) -> str:
    return f"slice {p.start}" if p.size == 1 else f"slices {p.start}-{p.end - 1}"


def _map_text(model: MigModel, placements: tuple[Placement, ...]) -> str:
    cells = slice_map(model, placements)
    return "[" + " ".join("." if c is None else str(c) for c in cells) + "]"


def _create_command(placements: tuple[Placement, ...]) -> str:
    return "nvidia-smi mig -cgi " + ",".join(f"{p.profile_id}:{p.start}" for p in placements) + " -C"


def _usage(model: MigModel, placements: tuple[Placement, ...]) -> tuple[int, int]:
    by_name = {p.name: p for p in model.profiles}
    memory = sum(p.size for p in placements)
    compute = sum(by_name[p.profile].compute_slices for p in placements)
    return memory, compute


def _check_json(
    model: MigModel, result: PlacementResult, pinned: list[Placement], error: str = ""
) -> dict[str, Any]:
    memory, compute = _usage(model, result.placements)
    return {
        "model": model.key,
        "ok": result.ok and not error,
        "reason": error or result.reason,
        "placements": [
            {
                "profile": p.profile,
                "profile_id": p.profile_id,
                "start": p.start,
                "size": p.size,
                "pinned": p in pinned,
            }
            for p in result.placements
        ],
        "slice_map": list(slice_map(model, result.placements)) if result.ok else [],
        "memory_slices": {"used": memory, "total": model.memory_slice_count},
        "compute_slices": {"used": compute, "total": model.compute_slice_count},
    }


@mig_app.command("check")
def check(
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="GPU model, e.g. A100-40GB, H100-80GB.")],
    profiles: Annotated[
        list[str],
        typer.Argument(
            metavar="PROFILE...",
            help="Profile names or ids (3g.20gb, 9); PROFILE:START pins an instance at a memory slice.",
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as one JSON object.")] = False,
) -> None:
    """Check that GPU instances fit on one GPU and print where they go (exit 1 if they do not)."""
    model = _model_or_fail(model_name)
    wanted, pinned, error = _parse_profile_args(model, profiles)
    result = (
        PlacementResult(ok=False, placements=(), reason=error)
        if error
        else solve(model, [p.id for p in wanted], fixed=pinned)
    )
    if as_json:
        typer.echo(json.dumps(_check_json(model, result, pinned), indent=2))
        raise typer.Exit(0 if result.ok else 1)
    if not result.ok:
        fail(escape(result.reason))
    memory, compute = _usage(model, result.placements)
    n = len(result.placements)
    lines = [
        f"{model.key}: {n} instance{'' if n == 1 else 's'} fit "
        f"({memory}/{model.memory_slice_count} memory slices, "
        f"{compute}/{model.compute_slice_count} compute slices)"
    ]
    width = max((len(p.profile) for p in result.placements), default=0)
    for p in result.placements:
        tail = "  pinned" if p in pinned else ""
        lines.append(
            f"  {p.profile:<{width}}  id {p.profile_id:<2}  {_slice_range(p):<11} "
            f"(start {p.start}, size {p.size}){tail}"
        )
    lines.append(f"  {_map_text(model, result.placements)}")
    if result.placements:
        lines.append(f"  create: {_create_command(result.placements)}")
    typer.echo("\n".join(lines))


def _profile_json(p: GpuInstanceProfile) -> dict[str, Any]:
    return {
        "id": p.id,
        "enum": p.enum,
        "name": p.name,
        "compute_slices": p.compute_slices,
        "memory_slices": p.memory_slices,
        "memory_mib": p.memory_mib,
        "multiprocessor_count": p.multiprocessor_count,
        "engines": {
            "decoders": p.engines.decoders,
            "copy_engines": p.engines.copy_engines,
            "jpeg": p.engines.jpeg,
            "ofa": p.engines.ofa,
        },
        "max_count": p.max_count,
        "placements": list(p.placements),
        "driver_order": list(p.driver_order),
        "min_driver": p.min_driver,
        "inferred": p.inferred,
        "inferred_fields": list(p.inferred_fields),
        "compute_profiles": [
            {
                "id": c.id,
                "name": c.name,
                "slices": c.slices,
                "max_count": c.max_count,
                "placements": list(c.placements),
                "multiprocessor_count": c.multiprocessor_count,
                "default": c.default,
            }
            for c in p.compute_profiles
        ],
    }


def _cis(p: GpuInstanceProfile) -> str:
    return " ".join(
        f"{c.slices}c*" if c.default else f"{c.slices}cx{c.max_count}" for c in p.compute_profiles
    )


def _starts(starts: tuple[int, ...]) -> str:
    """0,1,2,3,4,5,6 -> 0-6; 0,2,4,6 stays."""
    if len(starts) > 2 and list(starts) == list(range(starts[0], starts[-1] + 1)):
        return f"{starts[0]}-{starts[-1]}"
    return ",".join(str(s) for s in starts)


@mig_app.command("profiles")
def profiles_cmd(
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="GPU model, e.g. A100-40GB, A30.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the catalog as JSON.")] = False,
) -> None:
    """Show the GPU instance profiles of one model (id, slices, memory, SMs, engines, placements)."""
    model = _model_or_fail(model_name)
    if as_json:
        doc = {
            "model": model.key,
            "aliases": list(model.aliases),
            "nvml_names": list(model.nvml_names),
            "pci_device_ids": [f"0x{i:08X}" for i in model.pci_device_ids],
            "architecture": model.architecture,
            "memory_slice_count": model.memory_slice_count,
            "compute_slice_count": model.compute_slice_count,
            "memory_total_mib": model.memory_total_mib,
            "multiprocessor_count": model.multiprocessor_count,
            "profiles": [_profile_json(p) for p in model.profiles],
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    console = CliConsole(highlight=False)
    pci = ", ".join(f"0x{i:08X}" for i in model.pci_device_ids)
    console.print(
        escape(
            f"{model.key} ({model.architecture}, PCI {pci}): {model.memory_slice_count} memory slices, "
            f"{model.compute_slice_count} compute slices, {model.multiprocessor_count} SMs"
        )
    )
    table = Table(show_edge=False, pad_edge=False, box=box.SIMPLE_HEAD)
    for col, justify in (
        ("ID", "right"),
        ("Name", "left"),
        ("g/mem", "right"),
        ("MiB", "right"),
        ("SMs", "right"),
        ("Engines", "center"),
        ("Max", "right"),
        ("Starts", "left"),
        ("Compute instances", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=col != "Compute instances")  # type: ignore[arg-type]
    notes = []
    for p in model.profiles:
        table.add_row(
            str(p.id),
            p.name,
            f"{p.compute_slices}/{p.memory_slices}",
            str(p.memory_mib),
            str(p.multiprocessor_count),
            str(p.engines),
            str(p.max_count),
            _starts(p.placements),
            _cis(p),
        )
        extra = []
        if p.min_driver:
            extra.append(f"needs driver R{p.min_driver}+")
        if p.inferred_fields:
            extra.append("inferred: " + ", ".join(p.inferred_fields))
        if extra:
            notes.append(f"  {p.name}: " + "; ".join(extra))
    console.print(table)
    console.print(
        "Engines: decoders/copy engines/JPEG/OFA. g/mem: compute/memory slices. "
        "Compute instances: 1cx3 = up to three 1-slice CIs, * = the default (full) CI."
    )
    if notes:
        console.print(escape("\n".join(notes)))


@mig_app.command("models")
def models_cmd() -> None:
    """List the MIG-capable GPU models, with the spellings and PCI ids that select them."""
    console = CliConsole(highlight=False)
    table = Table(show_edge=False, pad_edge=False, box=box.SIMPLE_HEAD)
    for col in ("Model", "Arch", "mem/g slices", "PCI ids", "Aliases"):
        table.add_column(col, no_wrap=col != "Aliases")
    for m in MODELS.values():
        table.add_row(
            m.key,
            m.architecture,
            f"{m.memory_slice_count}/{m.compute_slice_count}",
            " ".join(f"{i >> 16:04X}" for i in m.pci_device_ids),
            escape(", ".join(m.aliases)),
        )
    console.print(table)
    console.print("Names are case-insensitive; NVML names such as 'NVIDIA A100-SXM4-40GB' work too.")
