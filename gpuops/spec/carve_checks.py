"""Load time: every rule of `carve:` that the file alone decides (`check_carve`, one of
`checks.CHECKS`), with the MIG layouts checked against the models the file names
(`gpus: {model: ...}` or a node's model label) or, where it names none, against every catalog
model. Combinations on one GPU (`rules.gpu_rules`) are checked where the file makes them certain:
the GPU is selected by index or by every GPU of a node, and no later entry might override the
outcome. The same rules on a live GPU are `desired_gpu.desired_for`'s (plan time).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuops.core.mig.catalog import MODELS, find_model, normalize_model_name
from gpuops.core.partition_catalog import PARTITION_MODELS, find_partition_model
from gpuops.spec.carve_entry import (
    ALL_TENANTS,
    KINDS,
    MAX_TENANTS,
    PROFILE_MODELS,
    CarveEntry,
    LimiterSpec,
    MpsSpec,
    Select,
    format_share,
)
from gpuops.spec.desired import DesiredMig, desired_mig, effective_policy
from gpuops.spec.errors import DataPath, show
from gpuops.spec.mig_solve import mig_check_args, solve_layout
from gpuops.spec.model import Fleet, NodeEntry
from gpuops.spec.resolve import CarveSelectors, GpuView, node_model, resolve, same_model
from gpuops.spec.rules import gpu_rules
from gpuops.spec.selectors import parse_gpu_indices, parse_selector
from gpuops.spec.types import closest


class Emit(Protocol):
    def __call__(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None: ...


@dataclass
class _Grouped:
    """Rules on one GPU fire for many GPUs alike: one line per place and message, naming the first
    GPU and how many more."""

    found: dict[tuple[DataPath, str, str, bool], list[str]] = field(default_factory=dict)

    def add(self, path: DataPath, message: str, hint: str, at_key: bool, where: str) -> None:
        places = self.found.setdefault((path, message, hint, at_key), [])
        if where not in places:
            places.append(where)

    def flush(self, emit: Emit) -> None:
        for (path, message, hint, at_key), places in self.found.items():
            more = len(places) - 1
            on = places[0] + (f" and {more} more GPU{'s' if more > 1 else ''}" if more else "")
            emit(path, f"{message}, on {on}", hint, at_key=at_key)


class CheckReport(Protocol):
    """What `checks.CheckContext` offers the carve checks."""

    kept: dict[DataPath, list[int]]

    def report(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None: ...

    def written(self, path: DataPath) -> bool: ...

    def ref(self, path: DataPath, *, at_key: bool = False) -> str: ...


def check_carve(fleet: Fleet, ctx: CheckReport) -> None:
    """Every load-time rule of carve: (see the module docstring and docs/fleet-yaml.md)."""
    entries = fleet.carve
    if not entries:
        return
    for i, entry in enumerate(entries):
        _check_entry(fleet, ctx, i, entry)
    _check_duplicates(entries, ctx)
    sel = CarveSelectors(entries)
    grouped = _Grouped()
    for gpu in _certain_gpus(fleet, sel):
        winners = resolve(entries, sel, gpu)
        gpu_rules(
            entries,
            winners,
            gpu,
            lambda path, message, hint, at_key, where=gpu.describe(): grouped.add(
                path, message, hint, at_key, where
            ),
        )
    grouped.flush(ctx.report)


def carve_warnings(fleet: Fleet) -> list[str]:
    """What `validate` warns about, on the GPUs the file makes certain (as `check_carve`): a
    limiter memory cap smaller than one CUDA context there (the tenant's programs cannot start).
    Lines as errors print ('fleet.yaml:12:26: carve[0]...: message, on GPU; hint')."""
    entries = fleet.carve
    if not entries:
        return []
    sel = CarveSelectors(entries)
    grouped = _Grouped()
    for gpu in _certain_gpus(fleet, sel):

        def warn(path: DataPath, message: str, hint: str, where: str = gpu.describe()) -> None:
            grouped.add(path, message, hint, False, where)

        gpu_rules(entries, resolve(entries, sel, gpu), gpu, _ignore, warn)
    lines: list[str] = []

    def line(path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None:
        lines.append(str(fleet.source.issue(path, message, hint)))

    grouped.flush(line)
    return lines


def _certain_gpus(fleet: Fleet, sel: CarveSelectors) -> Iterator[GpuView]:
    """Each node's GPUs the carve names by index, then the node's any-GPU view (index None): the
    GPUs the file makes certain, as the checks and the warnings walk them."""
    for node in fleet.nodes:
        label_model, _ = node_model(node)
        indices: set[int] = set()
        for i in range(len(sel.indices)):
            found = sel.indices[i]
            if found is not None and sel.selects(i, node):
                indices |= found
        for index in [*sorted(indices), None]:
            yield GpuView(node, index, None, label_model, live=False)


def _ignore(*_: object) -> None:
    """What a warning pass does with refusals: `check_carve` reports them."""


def _check_entry(fleet: Fleet, ctx: CheckReport, i: int, entry: CarveEntry) -> None:
    here: DataPath = ("carve", i)
    if all(getattr(entry, kind) is None and not ctx.written((*here, kind)) for kind in KINDS):
        ctx.report(
            here,
            "an entry needs mig:, mps:, limiter: or partition:",
            "say what the selected GPUs should have",
        )
    selected = _check_select(fleet, ctx, i, entry.select)
    if entry.mig is not None:
        _check_mig(ctx, i, entry, selected)
    if entry.mps is not None:
        _check_mps(fleet, ctx, i, entry.mps)
    if entry.limiter is not None:
        _check_limiter(fleet, ctx, i, entry.limiter)
    if entry.partition is not None:
        _check_partition(ctx, i, entry, selected)


def _check_select(fleet: Fleet, ctx: CheckReport, i: int, select: Select) -> list[NodeEntry]:
    selector = parse_selector(select.nodes)
    nodes = [n for n in fleet.nodes if selector.matches(n.name, n.labels)]
    path: DataPath = ("carve", i, "select", "nodes")
    if not ctx.written(path):
        path = ("carve", i, "select")
    if not nodes and ("nodes",) not in ctx.kept:
        names = [n.name for n in fleet.nodes]
        guess = "".join(closest(t, names) for t in selector.names[:1])
        listing = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        ctx.report(
            path,
            f"selects no node (selector {show(select.nodes)})",
            guess or (f"nodes: {listing}" if names else "nodes: is empty"),
        )
    gpus = select.gpus
    if gpus is not None and gpus.model is not None and nodes:
        labelled = [(n, node_model(n)) for n in nodes]
        if all(m is not None for _, (m, _) in labelled) and not any(
            same_model(want, m) for want in gpus.model for _, (m, _) in labelled if m is not None
        ):
            node, (model, key) = labelled[0]
            ctx.report(
                ("carve", i, "select", "gpus"),
                f"selects no GPU: the selected nodes are labelled as other models "
                f"({node.name}: {key}={show(node.labels.get(key, model))})",
                "fix the model, the node selector or the nodes' labels",
            )
    return nodes


def _mig_candidates(entry: CarveEntry, nodes: Sequence[NodeEntry]) -> tuple[dict[str, str], bool]:
    """Catalog models the entry's MIG layout must fit (key -> why), and whether GPUs of unknown
    model may be selected too."""
    gpus = entry.select.gpus
    models: dict[str, str] = {}
    if gpus is not None and gpus.model is not None:
        for name in gpus.model:
            found = find_model(name)
            if found is not None:
                models.setdefault(found.key, f"the entry selects {found.key} GPUs")
        return models, False
    unknown = False
    for node in nodes:
        model, key = node_model(node)
        found = find_model(model) if model else None
        if found is None:
            unknown = True
        else:
            models.setdefault(found.key, f"{node.name} is an {found.key} by its label {key}")
    return models, unknown or not nodes


def _check_partition(ctx: CheckReport, i: int, entry: CarveEntry, nodes: Sequence[NodeEntry]) -> None:
    """Partition modes against the models the entry selects (by model, else by the nodes' model
    labels); where it names none, against every model with partition modes."""
    spec = entry.partition
    assert spec is not None
    base: DataPath = ("carve", i, "partition")
    if spec.compute is None and spec.memory is None:
        if ctx.written((*base, "compute")) or ctx.written((*base, "memory")):
            return  # a bad mode, reported where it is written
        ctx.report(base, "partition: names neither compute nor memory", "e.g. {compute: CPX, memory: NPS4}")
        return
    gpus = entry.select.gpus
    names = list(gpus.model) if gpus is not None and gpus.model is not None else []
    if not names:
        names = [m for node in nodes if (m := node_model(node)[0]) is not None]
    models = {found.key: found for n in names if (found := find_partition_model(n)) is not None}
    if gpus is not None and gpus.model is not None and not models:
        ctx.report(
            ("carve", i, "select", "gpus", "model"),
            f"partition modes on {', '.join(gpus.model)}, which has none",
            "partition modes are AMD Instinct MI300-class GPUs' (" + ", ".join(PARTITION_MODELS) + ")",
        )
        return
    candidates = list(models.values()) or list(PARTITION_MODELS.values())
    for key, mode in (("compute", spec.compute), ("memory", spec.memory)):
        if mode is None:
            continue
        takes = [m for m in candidates if mode in (m.compute if key == "compute" else m.memory)]
        if models and len(takes) < len(candidates):
            lacking = next(m for m in candidates if m not in takes)
            ctx.report((*base, key), f"{lacking.key} has no {key} partition mode {mode}", lacking.describe())
        elif not takes:
            ctx.report(
                (*base, key),
                f"no GPU has the {key} partition mode {mode}",
                "; ".join(m.describe() for m in candidates),
            )


def _given(spec: object, key: str, ctx: CheckReport, path: DataPath) -> bool:
    """Whether a setting is given: written in the file, or set (a fleet built in code)."""
    value = getattr(spec, key)
    return ctx.written(path) or (value is not None and value != {} and value != [])


def _check_mig(ctx: CheckReport, i: int, entry: CarveEntry, nodes: Sequence[NodeEntry]) -> None:
    spec = entry.mig
    assert spec is not None
    base: DataPath = ("carve", i, "mig")
    instances = spec.profiles is not None or spec.placements is not None
    if not spec.enabled:
        for key in ("profiles", "placements", "compute"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with MIG disabled",
                    "a GPU with MIG off has no instances: remove it, or set enabled: true",
                    at_key=True,
                )
        return
    if spec.profiles is not None and spec.placements is not None:
        ctx.report(
            (*base, "placements"),
            "profiles and placements both given",
            "give counts (profiles:) and let the solver place them, or explicit placements, not both",
            at_key=True,
        )
        return
    d = desired_mig(spec, i)
    if spec.compute and not instances:
        ctx.report(
            (*base, "compute"),
            "compute splits without instances",
            "list the GPU instances under profiles: or placements:",
            at_key=True,
        )
    wanted = d.profile_counts()
    for name in spec.compute:
        if name not in wanted:
            ctx.report(
                (*base, "compute", name),
                f"no {name} instance in this layout",
                f"instances: {', '.join(wanted)}" if wanted else "",
                at_key=True,
            )
    gpus = entry.select.gpus
    if gpus is not None and gpus.model is not None:
        for j, name in enumerate(gpus.model):
            if find_model(name) is None:
                ctx.report(
                    ("carve", i, "select", "gpus", "model", j)
                    if len(gpus.model) > 1
                    else ("carve", i, "select", "gpus"),
                    f"{show(name)} has no MIG in gpuops' catalog",
                    f"MIG models: {', '.join(MODELS)}",
                )
    pruned = [n for n, split in spec.compute.items() if not split and ctx.written((*base, "compute", n, 0))]
    if not instances or pruned:
        return  # (a compute split with a bad item: that item's error says it)
    models, unknown = _mig_candidates(entry, nodes)
    for key, why in models.items():
        solved = solve_layout(d, MODELS[key])
        if not solved.ok:
            hint = f"{why}; try: gpuops mig check {key} {mig_check_args(d)}".rstrip()
            ctx.report((*base, *solved.path), solved.reason, hint, at_key=solved.at_key)
    if unknown:
        _check_mig_any_model(ctx, base, d)


def _check_mig_any_model(ctx: CheckReport, base: DataPath, d: DesiredMig) -> None:
    """Model not known before plan time: the layout must fit some catalog model."""
    names = list(d.profile_counts())
    having = [m for m in MODELS.values() if all(m.find_profile(n) is not None for n in names)]
    if not having:
        owners = "; ".join(f"{n}: {', '.join(PROFILE_MODELS.get(n, ()))}" for n in names)
        path = (*base, "profiles") if d.profiles is not None else (*base, "placements")
        ctx.report(path, f"no MIG model has all of {', '.join(names)}", owners)
        return
    solved = [solve_layout(d, m) for m in having]
    if any(s.ok for s in solved):
        return
    first = solved[0]
    models = ", ".join(m.key for m in having)
    check = f"gpuops mig check {first.model} {mig_check_args(d)}"
    ctx.report(
        (*base, *first.path),
        f"{first.reason} (on {first.model})",
        f"fits no model with these profiles ({models}); try: {check}",
        at_key=first.at_key,
    )


def _team_hint(team: str, fleet: Fleet) -> str:
    teams = list(fleet.teams)
    return closest(team, teams) or (
        f"define it under teams: (teams: {', '.join(teams)})" if teams else "define it under teams:"
    )


def _check_mps(fleet: Fleet, ctx: CheckReport, i: int, spec: MpsSpec) -> None:
    base: DataPath = ("carve", i, "mps")
    if not spec.enabled:
        for key in ("active_thread_percentage", "pinned_memory_limit", "per_tenant"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with MPS disabled",
                    "remove it, or set enabled: true",
                    at_key=True,
                )
        return
    for name in spec.per_tenant:
        if name not in fleet.teams:
            ctx.report(
                (*base, "per_tenant", name),
                f"no team named {show(name)}",
                _team_hint(name, fleet),
                at_key=True,
            )


def _check_limiter(fleet: Fleet, ctx: CheckReport, i: int, spec: LimiterSpec) -> None:
    base: DataPath = ("carve", i, "limiter")
    if not spec.enabled:
        for key in ("policy", "tenants"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with the limiter disabled",
                    "remove it, or set enabled: true",
                    at_key=True,
                )
        return
    if len(spec.tenants) > MAX_TENANTS:
        ctx.report(
            (*base, "tenants"),
            f"{len(spec.tenants)} tenants; the limiter holds at most {MAX_TENANTS} per GPU",
            at_key=True,
        )
    shares: list[tuple[str, float, str]] = []
    for name, tenant in spec.tenants.items():
        path: DataPath = (*base, "tenants", name)
        if name != ALL_TENANTS and name not in fleet.teams:
            ctx.report(path, f"no team named {show(name)}", _team_hint(name, fleet), at_key=True)
        policy = effective_policy(spec, tenant)
        if policy == "best-effort" and tenant.compute is not None:
            ctx.report(
                (*path, "compute"),
                f"a compute share under best-effort ({format_share(tenant.compute)})",
                "best-effort tenants get what the others leave: remove compute, "
                "or use burst-share for a guarantee",
            )
        elif policy != "best-effort":
            if tenant.compute is None:
                ctx.report(
                    path,
                    f"{policy} needs a compute share",
                    "add compute: (e.g. 30%), or policy: best-effort for a memory cap only",
                    at_key=True,
                )
            else:
                shares.append((name, tenant.compute, policy))
    total = sum(share for _, share, _ in shares)
    if total > 100 + 1e-9:
        policies = {policy for _, _, policy in shares}
        what = "guarantees" if policies == {"burst-share"} else "shares"
        parts = ", ".join(
            f"{name} {format_share(share)}" + (f" {policy}" if len(policies) > 1 else "")
            for name, share, policy in shares
        )
        if policies == {"fixed-share"}:
            hint = "under fixed-share each share is a cap on the GPU's time: together at most 100%"
        elif policies == {"burst-share"}:
            hint = "burst-share guarantees cannot promise more than the whole GPU"
        else:
            hint = "caps (fixed-share) and guarantees (burst-share) together must fit in 100%"
        ctx.report(
            (*base, "tenants"),
            f"compute {what} add up to {format_share(round(total, 6))}, over 100% ({parts})",
            hint,
            at_key=True,
        )


def _select_key(select: Select) -> tuple[object, ...]:
    s = parse_selector(select.nodes)
    gpus = select.gpus
    key: tuple[object, ...] = (frozenset(s.names), frozenset(str(t) for t in s.labels))
    if gpus is None or (gpus.indices is None and gpus.uuids is None and gpus.model is None):
        return (*key, None)
    return (
        *key,
        parse_gpu_indices(gpus.indices) if gpus.indices is not None else None,
        frozenset(u.lower() for u in gpus.uuids) if gpus.uuids is not None else None,
        frozenset(_model_key(m) for m in gpus.model) if gpus.model is not None else None,
    )


def _model_key(name: str) -> str:
    found = find_model(name)
    return found.key if found is not None else normalize_model_name(name)


def _check_duplicates(entries: Sequence[CarveEntry], ctx: CheckReport) -> None:
    first: dict[tuple[str, tuple[object, ...]], int] = {}
    for i, entry in enumerate(entries):
        key = _select_key(entry.select)
        for kind in KINDS:
            if getattr(entry, kind) is None:
                continue
            seen = first.get((kind, key))
            if seen is None:
                first[(kind, key)] = i
                continue
            ctx.report(
                ("carve", i, "select"),
                f"duplicate selector: {ctx.ref(('carve', seen))} already sets {kind} for the same GPUs",
                "merge the two entries; a later entry overrides an earlier one only where selections overlap",
                at_key=True,
            )


__all__ = ["CheckReport", "check_carve"]
