"""A saved plan's payloads put to fleet.yaml's own checks before `apply --plan` runs them.

The digest (plan/saved.py) only says a file is what `gpuops plan -o` wrote; anyone who can write
the file can sign it again. So `apply --plan` does not take the payloads on trust either: each
GPU's payloads are written as the carve entries they stand for (`carve_entries`: one entry per
GPU and kind, selecting that GPU by index, built typed and written as `gpuops export` writes
them, `spec.carve_entry.entry_data`) and loaded as a fleet.yaml is (`spec.fleet_from_data`: the
field checks and `checks.CHECKS`, the limiter's shares included), with the real fleet.yaml's
teams; then each GPU is resolved as a plan resolves a live
GPU (`Fleet.desired_for`: the layout solved for its model, its memory, its MIG mode, partition
modes). A payload that `gpuops validate` would refuse in a fleet.yaml is refused here, with the
check's own words, located in the plan (`nodes[0].gpus[2].limiter: ...`). Nothing is copied: a
rule added to fleet.yaml's checks applies to saved plans as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuops.core.mig.layout import layout_of
from gpuops.core.model import Gpu
from gpuops.plan.export import mig_spec
from gpuops.plan.live import NodeLive
from gpuops.plan.model import LIMITER, MIG, MPS, PARTITION, GpuPlan, Plan
from gpuops.spec import Fleet, SolvedLayout, SpecError, SpecIssue, fleet_from_data
from gpuops.spec.carve_entry import (
    LimiterSpec,
    LimiterTenantSpec,
    MpsSpec,
    MpsTenantSpec,
    PartitionSpec,
    entry_data,
)
from gpuops.spec.errors import printable
from gpuops.spec.types import SPEC_VERSION

_CARVE_PATH = re.compile(r"^carve\[(\d+)\](?:\.(.*))?\Z")


@dataclass(frozen=True)
class _Entry:
    """Which payload a synthetic carve entry stands for: its GPU's place in the plan and kind."""

    where: str  # nodes[i].gpus[j]
    gpu: GpuPlan
    kind: str


def _mps(gpu: GpuPlan) -> MpsSpec:
    payload = gpu.mps
    assert payload is not None
    values: dict[str, Any] = {
        "enabled": payload.enabled,
        "active_thread_percentage": payload.active_thread_percentage,
        "pinned_memory_limit": payload.pinned_memory_limit,
    }
    per_tenant = {
        t.name: MpsTenantSpec.model_construct(
            active_thread_percentage=t.active_thread_percentage, pinned_memory_limit=t.pinned_memory_limit
        )
        for t in payload.tenants
    }
    if per_tenant:
        values["per_tenant"] = per_tenant
    return MpsSpec.model_construct(
        **values, pipe_directory=payload.pipe_directory, log_directory=payload.log_directory
    )


def _limiter(gpu: GpuPlan) -> LimiterSpec:
    assert gpu.limiter is not None
    if not gpu.limiter:
        return LimiterSpec.model_construct(enabled=False)  # no lines for the GPU: what enabled: false asks
    tenants = {
        t.name: LimiterTenantSpec.model_construct(
            memory=t.memory, compute=t.compute, policy=t.effective_policy(), klass=t.klass
        )
        for t in gpu.limiter
    }
    return LimiterSpec.model_construct(tenants=tenants)


def _partition(gpu: GpuPlan) -> PartitionSpec:
    payload = gpu.partition
    assert payload is not None
    return PartitionSpec.model_construct(compute=payload.compute, memory=payload.memory)


def carve_entries(
    node: str, gpu: GpuPlan, where: str, live: Gpu | None, problems: list[str]
) -> list[tuple[dict[str, Any], _Entry]]:
    """A GPU's payloads as fleet.yaml carve entries, one per kind; what a MIG layout holds that
    no entry can say (an unknown profile) goes to `problems`."""
    out: list[tuple[dict[str, Any], _Entry]] = []
    select = {"nodes": node, "gpus": str(gpu.index)}
    if gpu.mig is not None:
        kept = _same_instances(gpu, live)
        notes: list[str] = []
        at = f"{where}.{MIG}.layout"
        mig = entry_data(mig_spec(gpu.mig.layout, _model_name(gpu, live), notes, at))
        if kept:
            mig = {"enabled": mig["enabled"]}  # the instances the GPU has, kept: the mode only
        else:  # "AT: what; what export does about it" -> "AT: what (...)"
            problems += [f"{note.split('; ')[0]} (not a layout fleet.yaml can ask for)" for note in notes]
        out.append(({"select": select, MIG: mig}, _Entry(where, gpu, MIG)))
    for kind, setting in (
        (MPS, _mps(gpu) if gpu.mps is not None else None),
        (LIMITER, _limiter(gpu) if gpu.limiter is not None else None),
        (PARTITION, _partition(gpu) if gpu.partition is not None else None),
    ):
        if setting is not None:
            out.append(({"select": select, kind: entry_data(setting)}, _Entry(where, gpu, kind)))
    return out


def _model_name(gpu: GpuPlan, live: Gpu | None) -> str:
    if live is not None:
        return live.info.mig_model or live.info.name
    return gpu.name


def _same_instances(gpu: GpuPlan, live: Gpu | None) -> bool:
    """Whether a MIG payload keeps exactly the instances the GPU has (a mode-only `mig:`)."""
    have = layout_of(live) if live is not None else None
    if gpu.mig is None or have is None or not have.instances:
        return False
    return gpu.mig.layout.normalized().instances == have.normalized().instances


def _plan_path(entry: _Entry, tail: str) -> str:
    """A path in the synthetic carve entry -> the same place in the plan's payload."""
    kind = entry.kind
    parts = tail.split(".") if tail else []
    if not parts or parts[0] != kind:
        return f"{entry.where}.{kind}"  # the entry's select: (the GPU), or the entry as a whole
    rest = parts[1:]
    if kind == LIMITER and rest[:1] == ["tenants"] and entry.gpu.limiter is not None:
        names = [t.name for t in entry.gpu.limiter]
        if len(rest) >= 2 and rest[1] in names:
            field = "." + ".".join(rest[2:]) if rest[2:] else ""
            return f"{entry.where}.{kind}[{names.index(rest[1])}]{field}"
        return f"{entry.where}.{kind}"
    if kind == MPS and rest[:1] == ["per_tenant"] and entry.gpu.mps is not None:
        names = [t.name for t in entry.gpu.mps.tenants]
        if len(rest) >= 2 and rest[1] in names:
            field = "." + ".".join(rest[2:]) if rest[2:] else ""
            return f"{entry.where}.{kind}.tenants[{names.index(rest[1])}]{field}"
        return f"{entry.where}.{kind}.tenants"
    if kind == MIG:
        return f"{entry.where}.{kind}.layout"
    return ".".join([f"{entry.where}.{kind}", *rest])


def _line(source: str, entries: Sequence[_Entry], issue: SpecIssue) -> str:
    match = _CARVE_PATH.match(issue.path)
    if match is not None and int(match.group(1)) < len(entries):
        where = _plan_path(entries[int(match.group(1))], match.group(2) or "")
    else:  # a rule on the file as a whole: none of a plan's entries can trip one, but say it
        where = issue.path or "the plan"
    text = f"{issue.message}; {issue.hint}" if issue.hint else issue.message
    return printable(f"{source}: {where}: {text}")


def _teams(fleet: Fleet) -> dict[str, Any]:
    return {name: {"users": list(t.users), "groups": list(t.groups)} for name, t in fleet.teams.items()}


def payload_problems(plan: Plan, fleet: Fleet, lives: Mapping[str, NodeLive], source: str) -> list[str]:
    """What fleet.yaml's checks say of the plan's payloads, one located line each ([] when they
    pass). `lives`: the nodes as they are now (the plan was checked against them: not stale)."""
    problems: list[str] = []
    hosts = {n.name: n.host for n in fleet.nodes}
    for i, node in enumerate(plan.nodes):
        live = lives.get(node.name)
        by_index = {g.info.index: g for g in live.gpus} if live is not None else {}
        entries: list[dict[str, Any]] = []
        meaning: list[_Entry] = []
        unsayable: set[int] = set()  # GPUs whose MIG payload no fleet.yaml entry can say
        for j, gpu in enumerate(node.gpus):
            if not gpu.has_payload:
                continue
            where = f"nodes[{i}].gpus[{j}]"
            notes: list[str] = []
            for data, entry in carve_entries(node.name, gpu, where, by_index.get(gpu.index), notes):
                entries.append(data)
                meaning.append(entry)
            problems += [printable(f"{source}: {note}") for note in notes]
            if notes:
                unsayable.add(gpu.index)
        if not entries:
            continue
        document = {
            "version": SPEC_VERSION,
            "teams": _teams(fleet),
            "nodes": [{"name": node.name, "host": hosts.get(node.name, node.name)}],
            "carve": entries,
        }
        try:
            checked = fleet_from_data(document, source)
        except SpecError as exc:
            problems += [_line(source, meaning, issue) for issue in exc.errors]
            continue
        for gpu in node.gpus:
            found = by_index.get(gpu.index)
            if not gpu.has_payload or found is None:
                continue
            layout = layout_of(found)
            total = found.info.memory_total_bytes
            desired = checked.desired_for(
                node.name,
                gpu.index,
                found.info.uuid,
                found.info.mig_model or found.info.name,
                mig_mode=layout.enabled if layout is not None else None,
                memory_total=total if isinstance(total, int) and not isinstance(total, bool) else None,
                driver_memory=found.info.driver_memory,
            )
            problems += [_line(source, meaning, issue) for issue in desired.problems]
            if gpu.index not in unsayable:
                problems += _layout_problems(source, meaning, gpu, found, desired.solved_layout)
    return list(dict.fromkeys(problems))


def _layout_problems(
    source: str, meaning: Sequence[_Entry], gpu: GpuPlan, live: Gpu, solved: SolvedLayout | None
) -> list[str]:
    """A MIG payload whose instances differ from what fleet.yaml's placements make on the model
    (its compute instances in another order, say): one fleet.yaml cannot ask for."""
    if gpu.mig is None or solved is None or not solved.ok or _same_instances(gpu, live):
        return []
    try:
        wanted = solved.layout()
    except ValueError:
        return []
    if wanted == gpu.mig.layout.normalized():
        return []
    where = next(e.where for e in meaning if e.gpu is gpu)
    return [
        printable(
            f"{source}: {where}.{MIG}.layout: its compute instances are not the ones fleet.yaml's "
            f"placements make on the {solved.model} (not a layout fleet.yaml can ask for)"
        )
    ]


__all__ = ["carve_entries", "payload_problems"]
