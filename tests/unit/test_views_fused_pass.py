"""The fused per-node pass (gpuops.views.gpus.node_facts): the GPU history's points it reads are
`gpu_point`'s, a MIG layout listed out of slice order gives the rows and tenants of before (the
cells add slices by first slice, the tenants in the layout's order), and the grid's positions,
kept per block of cells, are the per-cell positions of before."""

from __future__ import annotations

import math
from array import array
from dataclasses import replace

from gpuops.fleet.source import FleetSnapshot
from gpuops.simfleet.source import SimSource
from gpuops.tui.grid import PITCH, Position, layout_grid
from gpuops.views.common import mig_active
from gpuops.views.gpu_history import GpuHistory, gpu_point
from gpuops.views.gpus import node_facts
from gpuops.views.grid import BY_NODE, BY_TEAM, group_rows
from gpuops.views.nodes import RowCache, node_rows
from gpuops.views.tenants import tenant_rows
from tests.unit.test_views_shared_pass import (  # the reference: the view models before the pass
    _snapshots,
    fleet,
    old_node_row,
    old_tenant_rows,
)

__all__ = ["fleet"]  # the fixture, shared with the shared pass's tests


def _same_number(a: float, b: float | None) -> bool:
    return (b is None and math.isnan(a)) or a == b


def test_history_points_are_gpu_point(fleet: tuple[SimSource, list[float]]) -> None:
    source, _ = fleet
    own = source.ownership()
    fused, alone = GpuHistory(), GpuHistory()
    snapshots = _snapshots(fleet, 4)
    for snapshot in snapshots:
        tenant_rows(snapshot, own)  # as the feed: the tenants' pass first, the history reads it
        for view in snapshot.nodes:
            if view.sample is None:
                continue
            points = node_facts(view, own).points
            want = [v for gpu in view.sample.gpus for v in gpu_point(gpu)]
            assert len(points) == len(want)
            assert all(_same_number(a, b) for a, b in zip(points, want, strict=True)), view.name
        fused.update(snapshot, lambda view: node_facts(view, own).history)
        alone.update(snapshot)
    mig = 0
    for view in snapshots[-1].nodes:
        for gpu in view.sample.gpus if view.sample else ():
            mig += mig_active(gpu)
            for series in ("util", "memory", "power", "temperature"):
                index = gpu.info.index
                assert fused.series(view.name, index, series) == alone.series(view.name, index, series)
    assert mig > 0 and fused.nbytes() == alone.nbytes() > 0


def _reversed_layouts(snapshot: FleetSnapshot) -> FleetSnapshot:
    """Every MIG GPU's instances listed last slice first, as a driver may list them."""
    views = []
    for view in snapshot.nodes:
        if view.sample is not None:
            gpus = tuple(
                replace(g, mig=replace(g.mig, gpu_instances=g.mig.gpu_instances[::-1]))
                if mig_active(g) and g.mig is not None and len(g.mig.gpu_instances) > 1
                else g
                for g in view.sample.gpus
            )
            view = replace(view, sample=replace(view.sample, gpus=gpus))
        views.append(view)
    return replace(snapshot, nodes=tuple(views))


def test_mig_layouts_out_of_slice_order(fleet: tuple[SimSource, list[float]]) -> None:
    source, _ = fleet
    shared, reference = source.ownership(), source.ownership()
    cache = RowCache(lazy=True)
    for snapshot in map(_reversed_layouts, _snapshots(fleet, 3)):
        assert tenant_rows(snapshot, shared) == old_tenant_rows(snapshot, reference)
        want = tuple(old_node_row(v, reference) for v in snapshot.nodes)
        assert cache.rows(snapshot, shared) == want
        assert node_rows(snapshot, source.ownership()) == want


def _per_cell(layout_lines: tuple, label: int) -> list[Position]:  # type: ignore[type-arg]
    """The positions as they were listed before: one per cell, a block without cells one (-1)."""
    out = []
    for y, line in enumerate(layout_lines):
        for block in line.blocks:
            if block.start == block.end:
                out.append(Position(y, block.x, block.row, -1))
            x = block.x + label
            for i in range(block.start, block.end):
                out.append(Position(y, x, block.row, i))
                x += PITCH
    return out


def test_grid_positions_are_the_cells(fleet: tuple[SimSource, list[float]]) -> None:
    source, clock = fleet
    own = source.ownership()
    rows = RowCache(lazy=True).rows(_snapshots(fleet, 1)[0], own)
    for by, width in ((BY_TEAM, 200), (BY_NODE, 120), (BY_NODE, 30)):
        groups = group_rows(rows, by, "name", now=clock[0])
        layout = layout_grid(groups, width, by)
        positions = layout.positions
        want = _per_cell(layout.lines, layout.label_width)
        assert len(positions) == len(want) > 1000
        assert list(positions) == want
        assert positions[-1] == want[-1] and positions[5:9] == want[5:9]
        assert positions.lines == [p.line for p in want] and positions.cells == [p.cell for p in want]
        assert positions.xs == [p.x for p in want] and positions.rows == [p.row for p in want]
        last = want[-1]
        if last.cell >= 0:
            cell = last.row.cells[last.cell]
            key = (cell.node, cell.gpu, cell.instance, cell.kind)
            assert positions.find(key) == len(want) - 1
        assert positions.first_of(last.row.name) == next(i for i, p in enumerate(want) if p.row is last.row)
        assert positions.find(("no such node", 0, None, "gpu")) == 0 and positions.first_of("nope") is None


def test_lazy_rows_are_the_full_rows(fleet: tuple[SimSource, list[float]]) -> None:
    """The TUI's rows (figures from the light pass, cells on first use) have the full rows'
    figures in the odd cases too: a lost MIG GPU is one LOST cell, its slices count for nothing."""
    source, _ = fleet
    shared, reference = source.ownership(), source.ownership()
    cache = RowCache(lazy=True)
    for snapshot in _snapshots(fleet, 6):
        rows = cache.rows(snapshot, shared)
        want = tuple(old_node_row(v, reference) for v in snapshot.nodes)
        figures = [(r.busy, r.held, r.util, r.memory_used, r.gpus, r.models) for r in rows]
        assert figures == [(r.busy, r.held, r.util, r.memory_used, r.gpus, r.models) for r in want]
        assert [r.cell_count for r in rows] == [len(r.cells) for r in want]
        assert rows == want


def test_history_when_a_node_gpus_change(fleet: tuple[SimSource, list[float]]) -> None:
    """A node's GPUs share a ring; when one goes (and comes back) each GPU keeps its last points."""
    history = GpuHistory(ring=5)
    want: dict[tuple[str, int], list[float]] = {}
    for step, snapshot in enumerate(_snapshots(fleet, 9)):
        if 3 <= step < 6:  # the first node with a sample loses its first GPU for three samples
            views = list(snapshot.nodes)
            k = next(i for i, v in enumerate(views) if v.sample is not None and len(v.sample.gpus) > 1)
            sample = views[k].sample
            assert sample is not None
            views[k] = replace(views[k], sample=replace(sample, gpus=sample.gpus[1:]))
            snapshot = replace(snapshot, nodes=tuple(views))
        history.update(snapshot)
        for view in snapshot.nodes:
            for gpu in view.sample.gpus if view.sample else ():
                util = gpu_point(gpu)[0]
                want.setdefault((view.name, gpu.info.index), []).append(math.nan if util is None else util)
    for (node, index), utils in want.items():
        kept = [v for v in array("f", utils[-5:]) if not math.isnan(v)]  # stored as 32-bit
        assert history.series(node, index, "util") == kept, (node, index)
        assert history.points(node, index) == min(5, len(utils))
