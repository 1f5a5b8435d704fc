"""`gpuops export`: the live MIG layouts, MPS daemons and limiter lines written back as fleet.yaml
`carve:` entries, so that `gpuops assert` on the result passes and `gpuops plan` shows nothing.

One entry per node and group of GPUs with the same settings. MIG layouts are written as explicit
placements (`3g.40gb@4`), which say exactly what the GPU has. A compute-instance split is written
per GPU instance profile (fleet.yaml's form); when instances of one profile are split differently
on the same GPU that cannot be written, and the export says so (`notes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuops.core.mig.catalog import find_model
from gpuops.core.mig.layout import MigLayout, layout_of
from gpuops.core.model import Gpu
from gpuops.plan.live import NodeLive
from gpuops.spec.carve_entry import (
    DEFAULT_MPS_LOG_DIRECTORY,
    DEFAULT_MPS_PIPE_DIRECTORY,
    CarveEntry,
    GpuSelect,
    LimiterSpec,
    LimiterTenantSpec,
    MigSpec,
    MpsSpec,
    MpsTenantSpec,
    Select,
    entry_data,
)
from gpuops.spec.selectors import format_gpu_indices


def _mig(gpu: Gpu, notes: list[str], where: str) -> MigSpec | None:
    layout = layout_of(gpu)
    if layout is None:
        return None
    return mig_spec(layout, gpu.info.mig_model or gpu.info.name, notes, where)


def mig_spec(layout: MigLayout, model_name: str, notes: list[str], where: str) -> MigSpec:
    """A MIG layout on a GPU of that model as a carve entry's `mig:` (explicit placements, compute
    splits per profile); what cannot be written is said in `notes`. Also how `apply --plan` puts a
    saved plan's MIG payload to fleet.yaml's checks (plan/checks.py)."""
    if not layout.enabled:
        return MigSpec.model_construct(enabled=False)
    model = find_model(model_name)
    if model is None:
        notes.append(f"{where}: MIG model {model_name!r} is not in the catalog; its layout is left out")
        return MigSpec.model_construct(enabled=True)
    placements = []
    splits: dict[str, list[str]] = {}
    for spec in layout.instances:
        profile = model.find_profile(spec.profile_id)
        if profile is None:
            notes.append(f"{where}: unknown profile id {spec.profile_id}; the layout is left out")
            return MigSpec.model_construct(enabled=True)
        placements.append(f"{profile.name}@{spec.start}")
        default = (profile.default_compute_profile.id,)
        if spec.compute == default:
            split: list[str] = []
        else:
            split = [
                next((cp.name.split(".")[0] for cp in profile.compute_profiles if cp.id == ci), str(ci))
                for ci in spec.compute
            ]
            split.sort(key=lambda name: -int(name.rstrip("c")) if name.rstrip("c").isdigit() else 0)
        if profile.name in splits and splits[profile.name] != split:
            notes.append(
                f"{where}: instances of {profile.name} are split differently; only the first split is written"
            )
            continue
        splits[profile.name] = split
    compute = {name: split for name, split in splits.items() if split}
    if compute:
        return MigSpec.model_construct(enabled=True, placements=placements, compute=compute)
    return MigSpec.model_construct(enabled=True, placements=placements)


def _mps(gpu: Gpu, live: NodeLive, notes: list[str], where: str) -> MpsSpec | None:
    daemons = [d for d in live.daemons_of(gpu) if d.running]
    if live.mps is None or not daemons:
        return None
    first = daemons[0]
    if any(
        d.settings() | {"pipe_directory": ""} != first.settings() | {"pipe_directory": ""} for d in daemons
    ):
        notes.append(f"{where}: its MPS daemons differ; the first one's settings are written")
    values: dict[str, Any] = {"enabled": True}
    if first.active_thread_percentage is not None:
        values["active_thread_percentage"] = first.active_thread_percentage
    if first.pinned_memory_limit is not None:
        values["pinned_memory_limit"] = first.pinned_memory_limit
    per_tenant = {
        name: MpsTenantSpec.model_construct(
            **{k: v for k, v in given.items() if k in ("active_thread_percentage", "pinned_memory_limit")}
        )
        for name, given in sorted(first.tenants.items())
    }
    if per_tenant:
        values["per_tenant"] = per_tenant
    root = first.pipe_directory.rsplit("/", 1)[0] if "/" in first.pipe_directory else ""
    if root and root != DEFAULT_MPS_PIPE_DIRECTORY:
        values["pipe_directory"] = root
    log_root = first.log_directory.rsplit("/", 1)[0] if "/" in first.log_directory else ""
    if log_root and log_root != DEFAULT_MPS_LOG_DIRECTORY:
        values["log_directory"] = log_root
    return MpsSpec.model_construct(**values)


def _limiter(gpu: Gpu, live: NodeLive) -> LimiterSpec | None:
    if live.limiter is None:
        return None
    lines = live.lines_of(gpu)
    if not lines:
        return None
    tenants = {}
    for line in lines:
        values: dict[str, Any] = {"policy": line.effective_policy(), "klass": line.klass}
        if line.memory is not None:
            values["memory"] = line.memory
        if line.compute is not None:
            values["compute"] = line.compute
        tenants[line.name] = LimiterTenantSpec.model_construct(**values)
    return LimiterSpec.model_construct(tenants=tenants)


def gpu_settings(gpu: Gpu, live: NodeLive, notes: list[str]) -> dict[str, Any]:
    """The GPU's live MIG, MPS and limiter settings, each as its carve entry setting (typed)."""
    where = f"{live.name} GPU {gpu.info.index}"
    settings: dict[str, Any] = {}
    for key, value in (
        ("mig", _mig(gpu, notes, where)),
        ("mps", _mps(gpu, live, notes, where)),
        ("limiter", _limiter(gpu, live)),
    ):
        if value is not None:
            settings[key] = value
    return settings


def carve_entries(lives: Sequence[NodeLive]) -> tuple[list[dict[str, Any]], list[str]]:
    """The carve: entries that describe the live state (as fleet.yaml data: `entry_data` of the
    typed entries), and notes on what could not be written."""
    entries: list[dict[str, Any]] = []
    notes: list[str] = []
    for live in lives:
        if not live.ok:
            notes.append(f"{live.name}: not exported ({live.error or 'no data'})")
            continue
        groups: list[tuple[dict[str, Any], dict[str, Any], list[int]]] = []
        for gpu in sorted(live.gpus, key=lambda g: g.info.index):
            settings = gpu_settings(gpu, live, notes)
            if not settings:
                continue
            written = {key: entry_data(value) for key, value in settings.items()}
            for known, _typed, indices in groups:
                if known == written:
                    indices.append(gpu.info.index)
                    break
            else:
                groups.append((written, settings, [gpu.info.index]))
        all_gpus = len(live.gpus)
        for _written, settings, indices in groups:
            if len(indices) == all_gpus:
                select = Select.model_construct(nodes=live.name)
            else:
                gpus = GpuSelect.model_construct(indices=format_gpu_indices(set(indices)))
                select = Select.model_construct(nodes=live.name, gpus=gpus)
            entries.append(entry_data(CarveEntry.model_construct(select=select, **settings)))
    return entries, notes
