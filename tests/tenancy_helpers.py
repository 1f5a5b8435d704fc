"""Hand-made evidence for planner and Pool screen tests: GPUs used at a steady rate over a day;
the caps the planner lays on one GPU (`planner_caps`: tests/native, tests/gpu)."""

from __future__ import annotations

from collections.abc import Mapping

from gpuops.core.driver_memory import DriverMemory
from gpuops.core.tenant_table import TenantSpec
from gpuops.spec import fleet_from_data, parse_fleet
from gpuops.spec.model import Fleet
from gpuops.tenancy.accounting import Evidence, GpuEvidence, parse_window
from gpuops.tenancy.rebalance import Options, propose, proposed_fleet

NOW = 1772409600.0 + 14 * 3600  # 2026-03-02 14:00 UTC
GIB = 1 << 30


def steady_evidence(
    fleet: Fleet,
    use: Mapping[tuple[str, int], Mapping[str, float]],
    model: str = "NVIDIA A100-SXM4-80GB",
    memory_total: int = 80 * GIB,
    window: str = "24h",
) -> Evidence:
    """Every GPU of `use` (node, index -> team -> GPU-time) observed in each bucket of the window,
    each team at a steady GPU-time; owners and pools as `fleet` says."""
    w = parse_window(window)
    starts = w.starts(NOW)
    gpus = []
    for (node, index), teams in sorted(use.items()):
        uuid = f"GPU-{node}-{index}"
        gpus.append(
            GpuEvidence(
                node=node,
                index=index,
                uuid=uuid,
                name=model,
                memory_total=memory_total,
                owner=fleet.gpu_owner(node, index),
                pool=fleet.pool_of(node, index, uuid, model),
                observed=tuple(3600.0 for _ in starts),
                busy=tuple(min(1.0, sum(teams.values())) for _ in starts),
                teams={t: tuple(v for _ in starts) for t, v in teams.items() if v},
                held={t: v for t, v in teams.items() if v},
                memory={},
                process_p95={},
            )
        )
    return Evidence(w, NOW, starts, tuple(gpus))


def planner_caps(
    model: str,
    memory_total: int,
    uuid: str,
    driver_memory: DriverMemory | None,
    shares: Mapping[str, float],
    held: Mapping[str, int],
) -> list[TenantSpec]:
    """The limiter lines the planner lays on one GPU of a fixed pool for teams using it at
    `shares` (fractions of the GPU), where `held` is what their processes still hold there (so
    the caps are laid to the MiB), from what the GPU's node observed of its driver's memory; by
    way of fleet.yaml (propose, proposed_fleet, desired_for), as `gpuops rebalance` and `apply`
    make them. Raises AssertionError when `plan` would refuse them."""
    teams = ", ".join(f"{t}: {{users: [u-{t}]}}" for t in shares)
    guarantees = ", ".join(f"{t}: {round(100 * v)}%" for t, v in shares.items())
    fleet = parse_fleet(
        f"version: 1\nteams: {{{teams}}}\nnodes: [{{name: gpu, host: 127.0.0.1}}]\n"
        f"pools:\n  shared:\n    gpus: [{{nodes: gpu}}]\n    guarantees: {{{guarantees}}}\n"
    )
    w = parse_window("24h")
    starts = w.starts(NOW)
    gpu = GpuEvidence(
        node="gpu",
        index=0,
        uuid=uuid,
        name=model,
        memory_total=memory_total,
        owner=None,
        pool="shared",
        observed=tuple(3600.0 for _ in starts),
        busy=tuple(min(1.0, sum(shares.values())) for _ in starts),
        teams={t: tuple(v for _ in starts) for t, v in shares.items()},
        held=dict(shares),
        memory={},
        process_p95={},
        memory_now=dict(held),
    )
    observed = {("gpu", 0): driver_memory} if driver_memory is not None else {}
    proposal = propose(fleet, Evidence(w, NOW, starts, (gpu,)), Options(moves=False, driver_memory=observed))
    assert not proposal.infeasible, proposal.infeasible
    new = fleet_from_data(proposed_fleet(fleet, proposal))
    desired = new.desired_for(
        "gpu", 0, uuid, model, mig_mode=False, memory_total=memory_total, driver_memory=driver_memory
    )
    assert desired.limiter is not None and not desired.problems, [str(p) for p in desired.problems]
    return [t for t in desired.limiter.tenant_specs() if t.name != "*"]
