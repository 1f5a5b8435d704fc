"""What carve: wants on one live GPU (plan time): `desired_for` resolves the entries that select
it (later entries win per kind), solves the MIG layout for the live model and checks the
combination rules, now certain. What is wrong comes back as located `SpecIssue`s in
`DesiredGpu.problems`, never as an exception. Called through `Fleet.desired_for`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuops.core.driver_memory import DriverMemory
from gpuops.core.mig.catalog import MigModel, find_model
from gpuops.spec.desired import (
    DesiredLimiter,
    DesiredMig,
    DesiredMps,
    DesiredPartition,
    desired_limiter,
    desired_mig,
    desired_mps,
    desired_partition,
)
from gpuops.spec.errors import DataPath, SpecIssue, format_path
from gpuops.spec.mig_solve import SolvedLayout, mig_check_args, solve_layout
from gpuops.spec.resolve import YES, GpuView, match_entry, names_gpus, resolve, selectors_for
from gpuops.spec.rules import gpu_rules
from gpuops.spec.source import Document

if TYPE_CHECKING:
    # Types only: the fleet model calls this module at run time (Fleet.desired_for).
    from gpuops.spec.model import Fleet, NodeEntry


@dataclass(frozen=True)
class DesiredGpu:
    """What fleet.yaml wants on one GPU. None = not specified: leave it as it is.

    `solved_layout`: the MIG layout solved for the GPU's model (when MIG is wanted on, with
    instances, and the model is known). `problems`: located errors of the file for this GPU
    (a layout that does not fit the live model, MPS with the limiter, ...); the plan should
    refuse the GPU while there are any."""

    node: str
    index: int
    uuid: str | None
    model: str | None  # catalog key, or the model as given
    mig: DesiredMig | None = None
    mps: DesiredMps | None = None
    limiter: DesiredLimiter | None = None
    solved_layout: SolvedLayout | None = None
    problems: tuple[SpecIssue, ...] = ()
    partition: DesiredPartition | None = None
    notes: tuple[str, ...] = ()  # what the file's entries leave alone on this GPU, and why

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def empty(self) -> bool:
        return self.mig is None and self.mps is None and self.limiter is None and self.partition is None

    def mps_per_instance(self, live_mig_mode: bool | None = None) -> bool | None:
        """Whether MPS daemons go per MIG instance: MIG on after the change. None: unknown."""
        if self.mig is not None:
            return self.mig.enabled
        return live_mig_mode


def desired_for(
    fleet: Fleet,
    doc: Document,
    node: NodeEntry,
    gpu_index: int,
    gpu_uuid: str | None,
    gpu_model: str | MigModel | None,
    *,
    mig_mode: bool | None = None,
    memory_total: int | None = None,
    driver_memory: DriverMemory | None = None,
) -> DesiredGpu:
    """See `Fleet.desired_for`."""
    model = gpu_model.key if isinstance(gpu_model, MigModel) else gpu_model
    found = find_model(model) if model else None
    if found is not None:
        model = found.key
    gpu = GpuView(
        node,
        gpu_index,
        gpu_uuid,
        model,
        live=True,
        memory=memory_total,
        mig_mode=mig_mode,
        driver=driver_memory,
    )
    entries = fleet.carve
    if not entries:
        return DesiredGpu(node.name, gpu_index, gpu_uuid, model)
    sel = selectors_for(fleet)
    issues: list[SpecIssue] = []

    def emit(path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None:
        issues.append(doc.issue(path, f"{message}, on {gpu.describe()}", hint, at_key=at_key))

    winners = resolve(entries, sel, gpu)
    notes: list[str] = []

    def where(i: int) -> str:
        return entry_location(doc, i)

    def warn(path: DataPath, message: str, hint: str) -> None:
        notes.append(f"warning: {doc.issue(path, f'{message}, on {gpu.describe()}', hint)}")

    gpu_rules(
        entries,
        winners,
        gpu,
        lambda path, message, hint, at_key: emit(path, message, hint, at_key=at_key),
        warn,
    )

    # mig: an entry naming a GPU without MIG by index or UUID
    if gpu.mig_capable is False:
        for i, entry in enumerate(entries):
            if (
                entry.mig is not None
                and entry.mig.enabled
                and names_gpus(entry.select.gpus)
                and match_entry(entry, i, sel, gpu) == YES
            ):
                emit(
                    ("carve", i, "select", "gpus"),
                    f"MIG on a GPU without MIG ({model}, not in gpuops' MIG catalog)",
                    "select MIG-capable GPUs only; by node or model, GPUs without MIG are skipped",
                )
    # mig: an entry enabling MIG on every GPU of its nodes passes over a GPU without MIG; mig-parted
    # stops with an error there (an enabled spec without device-filter), so the plan says so.
    if gpu.mig_capable is False:
        for i, entry in enumerate(entries):
            gpus_sel = entry.select.gpus
            if (
                entry.mig is not None
                and entry.mig.enabled
                and not names_gpus(gpus_sel)
                and (gpus_sel is None or gpus_sel.model is None)
                and match_entry(entry, i, sel, gpu) == YES
            ):
                notes.append(
                    f"{where(i)}: MIG left as it is on {gpu.describe()}: {model} has no MIG "
                    "(the entry enables MIG on every GPU of its nodes; mig-parted stops with an error "
                    "on such a GPU; select models to say which)"
                )
                break
    # partition: the same for a GPU without partition modes
    if gpu.partition_capable is False:
        for i, entry in enumerate(entries):
            if (
                entry.partition is not None
                and names_gpus(entry.select.gpus)
                and match_entry(entry, i, sel, gpu) == YES
            ):
                emit(
                    ("carve", i, "select", "gpus"),
                    f"partition modes on a GPU without them ({model})",
                    "partition modes are AMD Instinct MI300-class GPUs'; select those by node or model",
                )
    mig = mps = limiter = None
    partition: DesiredPartition | None = None
    solved: SolvedLayout | None = None
    w = winners["mig"].entry
    if w is not None and (spec := entries[w].mig) is not None:
        mig = desired_mig(spec, w, where(w))
        if found is not None and mig.enabled and not mig.keeps_instances:
            solved = solve_layout(mig, found)
            if not solved.ok:
                hint = f"{gpu.describe()} is an {model}; try: gpuops mig check {model} {mig_check_args(mig)}"
                issues.append(
                    doc.issue(("carve", w, "mig", *solved.path), solved.reason, hint, at_key=solved.at_key)
                )
    w = winners["mps"].entry
    if w is not None and (mps_spec := entries[w].mps) is not None:
        mps = desired_mps(mps_spec, w, where(w))
    w = winners["limiter"].entry
    if w is not None and (lim_spec := entries[w].limiter) is not None:
        limiter = desired_limiter(lim_spec, w, where(w))
    w = winners["partition"].entry
    if w is not None and (part_spec := entries[w].partition) is not None:
        partition = desired_partition(part_spec, w, where(w))
        found_modes = gpu.partition_model
        if found_modes is not None:
            for key, mode, accepted in (
                ("compute", part_spec.compute, tuple(found_modes.compute)),
                ("memory", part_spec.memory, found_modes.memory),
            ):
                if mode is not None and mode not in accepted:
                    emit(
                        ("carve", w, "partition", key),
                        f"{found_modes.key} has no {key} partition mode {mode}",
                        found_modes.describe(),
                    )
    unique = tuple(sorted(set(issues), key=SpecIssue.sort_key))
    return DesiredGpu(
        node.name, gpu_index, gpu_uuid, model, mig, mps, limiter, solved, unique, partition, tuple(notes)
    )


def entry_location(doc: Document, i: int) -> str:
    """'fleet.yaml:30:5': where carve entry i is written ('carve[i]' when not known)."""
    line, column = doc.position(("carve", i), at_key=True)
    return f"{doc.file}:{line}:{column}" if line else format_path(("carve", i))


__all__ = ["DesiredGpu", "desired_for", "entry_location"]
