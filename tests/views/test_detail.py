"""MIG layout and processes of the detail screens (gpuops.views.detail) on the simulated silos fleet."""

from __future__ import annotations

from gpuops.simfleet.source import SimSource
from gpuops.views.detail import find_gpu, mig_layout, process_rows
from tests.tui.conftest import Clock


def test_mig_layout_and_processes(source: SimSource, clock: Clock) -> None:
    view = source.snapshot(clock()).nodes[4]
    assert view.name == "sim-platform-01"
    gpu = find_gpu(view, 0)
    assert gpu is not None
    count, spans = mig_layout(gpu, source.ownership(), view)
    assert count == 8
    assert [(s.start, s.size, s.profile) for s in spans] == [
        (0, 1, "1g.10gb"),
        (1, 1, "1g.10gb"),
        (2, 2, "2g.20gb"),
        (4, 4, "3g.40gb"),
    ]
    procs = process_rows(view, source.ownership(), 0)
    assert procs and all(p.gpu == 0 and p.instance is not None for p in procs)
    assert {p.tenant for p in procs} <= {"chat", "research", "vision"}
