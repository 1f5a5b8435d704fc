"""Hand-made evidence for planner and Pool screen tests: GPUs used at a steady rate over a day."""

from __future__ import annotations

from collections.abc import Mapping

from gpuops.spec.model import Fleet
from gpuops.tenancy.accounting import Evidence, GpuEvidence, parse_window

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
