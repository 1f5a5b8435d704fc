"""Busy is one rule (gpuops/core/busy.py): at least 5% utilized, a MIG GPU by its slices (by GPM
utilization, else by a process on the slice), a lost GPU never. Every surface asks it: the grid's
cells, the TUI's node rows and tenants (the fused pass, views/gpus.py), the CLI's nodes and team
tables (`gpu_busy`), and the Prometheus rules, whose threshold is core's."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from gpuops.core import metric_schema as schema
from gpuops.core.busy import BUSY_PERCENT, BUSY_RATIO, gpu_busy, is_busy
from gpuops.core.model import Gpu, NotAvailable
from gpuops.views.cells import gpu_cells
from gpuops.views.common import mig_active
from gpuops.views.gpus import node_facts
from gpuops.views.nodes import node_summary
from gpuops.views.teams import team_summaries
from tests.promtest.dashboards import REPO, RULES_FILE, rule_exprs
from tests.unit.test_views_shared_pass import _snapshots, fleet

if TYPE_CHECKING:
    from gpuops.simfleet.source import SimSource

__all__ = ["fleet"]  # the fixture, shared with the shared pass's tests


@pytest.mark.parametrize(
    ("util", "processes", "busy"),
    [
        (5.0, 0, True),  # the threshold itself
        (4.99, 3, False),  # held idle: processes at under 5% are not work
        (0.0, 0, False),
        (150.0, 0, True),  # a reading past 100% (a PromQL source decodes what it is given)
        (None, 1, True),  # no utilization (an Ampere MIG slice): a process is the evidence
        (None, 0, False),
        (math.nan, 2, False),  # not a number: not busy, as Prometheus compares it
    ],
)
def test_is_busy(util: float | None, processes: int, busy: bool) -> None:
    assert is_busy(util, processes) is busy


def test_the_rules_count_busy_by_core_s_threshold() -> None:
    rule = next(r for r in rule_exprs(RULES_FILE) if r.name == "gpu:gpuops_gpu_busy:bool")
    compared = re.findall(r"\(\s*([a-zA-Z_:]+)\s*(>=|>)\s*bool\s*([0-9.eE+-]+)\s*\)", rule.expr)
    by_name = {name: (op, float(value)) for name, op, value in compared}
    assert by_name == {
        schema.GPU_UTILIZATION.name: (">=", BUSY_RATIO),  # at least BUSY_PERCENT of the GPU
        schema.MIG_UTILIZATION.name: (">=", BUSY_RATIO),  # of a slice's SMs (GPM)
        schema.MIG_PROCESSES.name: (">", 0.0),  # a slice without utilization: while it holds one
    }
    assert BUSY_RATIO == BUSY_PERCENT / 100.0 == 0.05
    assert schema.GPU_UTILIZATION.unit == schema.MIG_UTILIZATION.unit == "ratio"


def test_the_docs_give_core_s_threshold() -> None:
    for doc in ("metrics.md", "prometheus.md"):
        text = " ".join((REPO / "docs" / doc).read_text(encoding="utf-8").split())
        assert f"at least {BUSY_PERCENT:g}% utilized" in text, doc


def _lost(gpu: Gpu) -> Gpu:
    assert gpu.sample is not None
    return replace(gpu, sample=replace(gpu.sample, memory_total_bytes=NotAvailable("GPU_IS_LOST")))


def _variants(gpu: Gpu) -> list[Gpu]:
    """`gpu` and the cases a simulated fleet rarely has: lost; no utilization anywhere (processes
    are then the evidence); a utilization that is not a number; just under and at the threshold."""
    s = gpu.sample
    if s is None:
        return [gpu]
    na = NotAvailable("NOT_SUPPORTED")
    out = [gpu, _lost(gpu)]
    for util in (na, math.nan, BUSY_PERCENT - 0.01, BUSY_PERCENT):
        out.append(
            replace(
                gpu,
                sample=replace(s, utilization_gpu_percent=na if mig_active(gpu) else util),
                mig_samples=tuple(replace(m, sm_utilization_percent=util) for m in gpu.mig_samples),
            )
        )
    return out


def _alone(view: Any, gpu: Gpu) -> Any:
    """The node view with `gpu` alone, live."""
    assert view.sample is not None
    return replace(view, sample=replace(view.sample, gpus=(gpu,)), state="live")


def test_every_surface_counts_a_gpu_busy_alike(fleet: tuple[SimSource, list[float]]) -> None:
    source, _ = fleet
    snapshot = _snapshots(fleet, 2)[-1]
    checked = {"whole": 0, "mig": 0, "busy": 0, "idle": 0, "lost mig": 0}
    for view in snapshot.nodes:
        if view.sample is None:
            continue
        gpus = view.sample.gpus
        for original in [g for k, g in enumerate(gpus) if k == 0 or mig_active(g)]:
            for gpu in _variants(original):
                alone = _alone(view, gpu)
                ownership = source.ownership()
                busy = gpu_busy(gpu)
                where = (view.name, gpu.info.index, gpu.sample)
                # the TUI's node rows and tenants: the fused pass (GPU-equivalents busy)
                row_busy = node_facts(alone, ownership).row[6]
                if mig_active(gpu):
                    assert (row_busy > 0) == busy, where
                else:
                    assert row_busy == float(busy), where
                # the grid's cells
                assert any(c.busy for c in gpu_cells(alone, gpu, ownership)) == busy, where
                # the CLI: the nodes table and discover's team table
                assert node_summary(alone, snapshot.time).busy == int(busy), where
                one = replace(snapshot, nodes=(alone,))
                (team,) = team_summaries(one, lambda node, index: "t", ["t"])
                assert (team.gpus_busy, team.gpus_idle) == (int(busy), int(not busy)), where
                checked["mig" if mig_active(gpu) else "whole"] += 1
                checked["busy" if busy else "idle"] += 1
                if mig_active(gpu) and gpu is not original and gpu.sample is not None:
                    lost = isinstance(gpu.sample.memory_total_bytes, NotAvailable)
                    checked["lost mig"] += lost and gpu_busy(original)
    assert min(checked.values()) > 0, checked
