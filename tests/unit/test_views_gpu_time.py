"""The live GPU-time (views.gpus.node_facts, read by views.tenants.tenant_rows, the exporter's
gpuops_tenant_gpu_used and the tenants' session history) counts a GPU as the recorded history
does (core.history.gpu_shares): at most the whole GPU, never less than none, whatever utilization
a source reports (a PromQL source decodes whatever its query gives, 150% or -20%)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuops.core.history import gpu_shares
from gpuops.core.model import Gpu
from gpuops.fleet.source import FleetSnapshot
from gpuops.views.common import BUSY_PERCENT, mig_active
from gpuops.views.tenants import tenant_rows
from tests.tui.conftest import Clock, silos


def _reporting(gpu: Gpu, util: float) -> Gpu:
    """`gpu` with every utilization it reports (the GPU's, its MIG slices') set to `util` %."""
    if gpu.sample is None:
        return gpu
    return replace(
        gpu,
        sample=replace(gpu.sample, utilization_gpu_percent=util),
        mig_samples=tuple(replace(m, sm_utilization_percent=util) for m in gpu.mig_samples),
    )


@pytest.mark.parametrize("util", [150.0, 250.0, -20.0, 60.0, float("nan")])
def test_gpu_time_is_the_history_s_per_gpu(util: float) -> None:
    clock = Clock()
    source = silos(clock)
    snapshot = source.snapshot(clock())
    ownership = source.ownership()
    whole = mig = 0
    for view in snapshot.nodes:
        if view.sample is None:
            continue
        gpus = tuple(_reporting(g, util) for g in view.sample.gpus)
        view = replace(view, sample=replace(view.sample, gpus=gpus))
        # one node alone, as the exporter asks for its per-node gauge
        rows = tenant_rows(FleetSnapshot(snapshot.time, snapshot.interval, (view,)), ownership)
        live = sum(r.gpu_time for r in rows)
        held = [g for g in gpus if g.processes]
        recorded = sum(k.busy for g in held for k in gpu_shares(g).keys)
        # a whole GPU at work with no process listed (none we may see): its owner's, all of it
        unseen = [g for g in gpus if not g.processes and not mig_active(g) and util >= BUSY_PERCENT]
        recorded += sum(gpu_shares(g).busy for g in unseen)
        assert live == pytest.approx(recorded, abs=1e-5), view.name  # rows rounded to 1e-6
        assert 0.0 <= live <= len(held) + len(unseen) + 1e-9, view.name
        for r in rows:
            assert 0.0 <= r.waste <= r.owned + 1e-9, (view.name, r.team)
        whole += sum(1 for g in held if not mig_active(g))
        mig += sum(1 for g in held if mig_active(g))
    assert whole > 0 and mig > 0  # both kinds of GPU were counted
