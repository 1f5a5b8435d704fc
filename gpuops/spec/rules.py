"""The rules on one GPU's combination of kinds, the same at load and at plan time: MPS memory
limits within what a client can have (the smallest MIG instance wanted, else the GPU's memory),
the limiter never on a MIG GPU nor beside MPS, limiter memory caps within the GPU; warned of: caps
that together pass what the driver leaves of it (no promise then), a cap smaller than one CUDA
context (its tenant's programs cannot start there). A cap bounds a tenant's whole footprint on the GPU, its
processes' contexts included (docs/limiter.md, "What a cap bounds"); what the driver reserves of
the card is no tenant's (core/driver_memory.py: observed by the GPU's node at plan time, else the
model's documented figures).

A rule fires only on what is certain for the GPU (`Winner.certain`): at load time a GPU selected
by index or by every GPU of a node, at plan time every live GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuops.core.driver_memory import mib_text
from gpuops.core.mig.catalog import MODELS, MigModel
from gpuops.core.units import format_bytes
from gpuops.spec.carve_entry import MIB, PROFILE_MODELS, CarveEntry, LimiterTenantSpec, format_exact_bytes
from gpuops.spec.desired import desired_mig
from gpuops.spec.errors import DataPath
from gpuops.spec.resolve import GpuView, Winner


def _instance_memory(name: str, model: MigModel | None) -> int | None:
    """Memory of a GPU instance profile: on the model; model unknown: the most any model has."""
    if model is not None:
        gi = model.find_profile(name)
        return gi.memory_mib * MIB if gi is not None else None
    sizes = [gi.memory_mib for key in PROFILE_MODELS.get(name, ()) if (gi := MODELS[key].find_profile(name))]
    return max(sizes) * MIB if sizes else None


def _mps_bound(entries: Sequence[CarveEntry], gpu: GpuView, mig: Winner) -> tuple[int, str] | None:
    """The memory one MPS client can have at most on the GPU: the smallest MIG instance wanted
    on it, else the GPU's memory; None when not known."""
    if mig.entry is not None and mig.certain:
        spec = entries[mig.entry].mig
        if spec is not None and spec.enabled:
            d = desired_mig(spec)
            names = list(d.profile_counts())
            if names:
                sizes = [(mem, n) for n in names if (mem := _instance_memory(n, gpu.mig_model)) is not None]
                if sizes:
                    mem, name = min(sizes)
                    where = f"carve[{mig.entry}]"
                    return mem, f"the {format_bytes(mem, 2)} of a {name} instance (MIG from {where})"
                return None
            if d.profiles is not None or d.placements is not None:
                return None  # no instances: no daemons
    total = gpu.memory_total
    if total is None:
        return None
    what = gpu.model or "GPU"
    return total, f"the {format_bytes(total, 2)} of the {what}"


def gpu_rules(
    entries: Sequence[CarveEntry],
    winners: Mapping[str, Winner],
    gpu: GpuView,
    add: Callable[..., None],
    warn: Callable[[DataPath, str, str], None] | None = None,
) -> None:
    """The rules on one GPU's combination of kinds; `add(path, message, hint, at_key)` refuses,
    `warn(path, message, hint)` (when given) warns."""
    mig_w, mps_w, lim_w = winners["mig"], winners["mps"], winners["limiter"]
    mig = entries[mig_w.entry].mig if mig_w.entry is not None and mig_w.certain else None
    mps = entries[mps_w.entry].mps if mps_w.entry is not None and mps_w.certain else None
    lim = entries[lim_w.entry].limiter if lim_w.entry is not None and lim_w.certain else None
    mig_on = (mig is not None and mig.enabled) or (
        mig_w.entry is None and mig_w.certain and gpu.mig_mode is True
    )
    lim_on = lim is not None and lim.enabled and bool(lim.tenants)
    mps_on = mps is not None and mps.enabled

    if mps is not None and mps_on and mps_w.entry is not None:
        bound = _mps_bound(entries, gpu, mig_w)
        if bound is not None:
            limit, what = bound
            base: DataPath = ("carve", mps_w.entry, "mps")
            if mps.pinned_memory_limit is not None and mps.pinned_memory_limit > limit:
                add(
                    (*base, "pinned_memory_limit"),
                    f"{format_exact_bytes(mps.pinned_memory_limit)} is more than {what}",
                    "the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
                    False,
                )
            for name, tenant in mps.per_tenant.items():
                if tenant.pinned_memory_limit is not None and tenant.pinned_memory_limit > limit:
                    add(
                        (*base, "per_tenant", name, "pinned_memory_limit"),
                        f"{format_exact_bytes(tenant.pinned_memory_limit)} is more than {what}",
                        "the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
                        False,
                    )

    if lim is not None and lim_on and lim_w.entry is not None:
        if mig_on:
            if mig_w.entry is not None and mig_w.entry > lim_w.entry:
                path: DataPath = ("carve", mig_w.entry, "mig")
                message = f"MIG on a GPU that carve[{lim_w.entry}] gives to the limiter"
            else:
                path = ("carve", lim_w.entry, "limiter")
                source = f"carve[{mig_w.entry}]" if mig_w.entry is not None else "its live MIG mode"
                message = f"the limiter cannot share a GPU in MIG mode (MIG from {source})"
            add(
                path,
                message,
                "MIG instances already split memory and compute; share an instance with MPS instead",
                True,
            )
        if mps_on and mps_w.entry is not None:
            later, earlier = max(lim_w.entry, mps_w.entry), min(lim_w.entry, mps_w.entry)
            kind = "limiter" if later == lim_w.entry else "mps"
            other = "MPS" if kind == "limiter" else "the limiter"
            add(
                ("carve", later, kind),
                f"{'the limiter' if kind == 'limiter' else 'MPS'} and {other} (from carve[{earlier}]) "
                "on the same GPU",
                "use one per GPU: the limiter hands the GPU to one tenant at a time, "
                "which serializes MPS clients",
                True,
            )
        total = gpu.memory_total
        if total is not None:
            single = False
            for name, lt in lim.tenants.items():
                if lt.memory is not None and lt.memory > total:
                    single = True
                    add(
                        ("carve", lim_w.entry, "limiter", "tenants", name, "memory"),
                        f"{format_exact_bytes(lt.memory)} is more than the {format_bytes(total, 2)} "
                        f"of the {gpu.model or 'GPU'}",
                        "a memory cap is per GPU",
                        False,
                    )
            if not single and warn is not None:
                _caps_within_the_card(lim_w.entry, lim.tenants, gpu, total, warn)


def _caps_within_the_card(
    entry: int,
    tenants: Mapping[str, LimiterTenantSpec],
    gpu: GpuView,
    total: int,
    warn: Callable[[DataPath, str, str], None],
) -> None:
    """Warnings, not refusals (a cap is a ceiling, not a reservation: caps may add up to more
    than a GPU where the operator knows its tenants never fill them together): the caps of a GPU's
    tenants together past what the driver leaves of the card (each process's context is inside its
    tenant's cap), and a cap smaller than one context."""
    over = gpu.overhead
    what = gpu.model or "GPU"
    caps = {name: lt.memory for name, lt in tenants.items() if lt.memory is not None}
    usable = over.usable(total)
    if sum(caps.values()) > usable:
        parts = ", ".join(
            f"{n} {format_bytes(c)}" for n, c in sorted(caps.items(), key=lambda nc: (-nc[1], nc[0]))
        )
        warn(
            ("carve", entry, "limiter", "tenants"),
            f"the memory caps add up to {format_bytes(sum(caps.values()), 2)} ({parts}), more than the "
            f"{format_bytes(usable, 2)} the driver leaves of the {what} ({format_bytes(total, 2)} less "
            f"{mib_text(over.reserved_bytes)} it reserves, {over.reserved_source}): they are no promise, "
            "the tenant that allocates last can meet the driver's out-of-memory error under its cap",
            f"each cap includes its processes' CUDA contexts ({mib_text(over.context_bytes)} each) and "
            "'*' counts once; lower the caps for each to hold on a full GPU",
        )
    for name, cap in sorted(caps.items()):
        if 0 < cap < over.context_bytes:
            warn(
                ("carve", entry, "limiter", "tenants", name, "memory"),
                f"a cap of {format_exact_bytes(cap)} is less than one CUDA context on the {what} "
                f"({mib_text(over.context_bytes)}, {over.context_source}): "
                f"no program of {name} can start there",
                "a cap bounds the tenant's whole footprint, its processes' contexts included",
            )


__all__ = ["gpu_rules"]
