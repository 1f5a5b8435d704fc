"""deploy/prometheus/gpuops-history.rules.yml records what a node's history recorder integrates
(core/history.py's `gpu_shares`): the same node sample, exported by the node's exporter
(node/metrics.py, with per-process series) and fed to `promtool test rules`, gives per GPU the
busy fraction and per key (user, tenant, MIG instance) the held and busy GPU-equivalents that
`gpu_shares` computes from the sample itself.

The sample has a whole GPU shared by two users, a MIG H100 whose slices report their SMs'
utilization (NVML's GPM) — one of them not yet (NO_DATA), one over 100% — and a MIG A100 whose
slices report none (Ampere): a held slice's GPU-time is its SM utilization where GPM gives it,
else all of it (docs/history.md, MIG).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import yaml

from gpuops.core.history import gpu_shares
from gpuops.core.model import (
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    MigInstanceSample,
    MigState,
    NodeSample,
    NotAvailable,
)
from gpuops.node.metrics import NodeCollector
from gpuops.node.sampler import Latest
from tests.promtest.dashboards import REPO
from tests.promtest.fixtures import promtool_path_fixture  # noqa: F401  (a fixture, by its name)
from tests.promtest.promtool import check_rules, test_rules

HISTORY_RULES = REPO / "deploy" / "prometheus" / "gpuops-history.rules.yml"
GIB = 1 << 30
NA = NotAvailable("NOT_SUPPORTED")
T0 = 1_767_225_600.0
NODE = "n1"


def _sample() -> NodeSample:
    whole = Gpu(
        info=GpuInfo(
            0, "GPU-w", "NVIDIA A100-SXM4-80GB", "0000:01:00.0", 0x20B210DE, 80 * GIB, True, "A100-80GB"
        ),
        mig=MigState(False, False),
        sample=GpuSample(T0, 80.0, NA, 40 * GIB, 80 * GIB, NA, NA, NA, NA),
        processes=(
            GpuProcess(1, 30 * GIB, user="alice", tenant="vision"),
            GpuProcess(2, 10 * GIB, user="bob", tenant="speech"),
        ),
    )
    h100_gis = (
        GpuInstance(1, 9, "3g.40gb", 0, 4, 40 * GIB, 60),
        GpuInstance(9, 19, "1g.10gb", 6, 1, 10 * GIB, 16),
        GpuInstance(10, 19, "1g.10gb", 5, 1, 10 * GIB, 16),
        GpuInstance(11, 19, "1g.10gb", 4, 1, 10 * GIB, 16),  # empty, yet its SMs report 30%
    )
    h100 = Gpu(
        info=GpuInfo(
            1, "GPU-h", "NVIDIA H100 80GB HBM3", "0000:02:00.0", 0x233010DE, 80 * GIB, True, "H100-80GB"
        ),
        mig=MigState(True, True, h100_gis),
        sample=GpuSample(T0, NA, NA, 27 * GIB, 80 * GIB, NA, NA, NA, NA),
        processes=(
            GpuProcess(3, 15 * GIB, user="carol", tenant="chat", gpu_instance_id=1),
            GpuProcess(4, 5 * GIB, user="dave", tenant="chat", gpu_instance_id=1),
            GpuProcess(5, 6 * GIB, user="erin", tenant="research", gpu_instance_id=9),
            GpuProcess(6, 1 * GIB, user="fred", tenant="research", gpu_instance_id=10),
        ),
        mig_samples=(
            MigInstanceSample(1, 20 * GIB, 40 * GIB, 50.0),
            MigInstanceSample(9, 6 * GIB, 10 * GIB, 120.0),
            MigInstanceSample(10, 1 * GIB, 10 * GIB, NotAvailable("NO_DATA")),
            MigInstanceSample(11, 0, 10 * GIB, 30.0),
        ),
    )
    a100_gis = (
        GpuInstance(1, 9, "3g.40gb", 0, 4, 40 * GIB, 42),
        GpuInstance(2, 14, "2g.20gb", 4, 2, 20 * GIB, 28),
    )
    a100 = Gpu(
        info=GpuInfo(
            2, "GPU-a", "NVIDIA A100-SXM4-80GB", "0000:03:00.0", 0x20B210DE, 80 * GIB, True, "A100-80GB"
        ),
        mig=MigState(True, True, a100_gis),
        sample=GpuSample(T0, NA, NA, 8 * GIB, 80 * GIB, NA, NA, NA, NA),
        processes=(GpuProcess(7, 8 * GIB, user="gina", tenant="vision", gpu_instance_id=2),),
        mig_samples=(
            MigInstanceSample(1, 0, 40 * GIB, NA),
            MigInstanceSample(2, 8 * GIB, 20 * GIB, NA),
        ),
    )
    return NodeSample(NODE, T0, (whole, h100, a100))


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()) if v != "")
    return f"{name}{{{inner}}}"


def _input_series(sample: NodeSample) -> list[dict[str, str]]:
    """The node exporter's series for `sample`, as Prometheus would scrape them (job, instance)."""
    collector = NodeCollector(lambda: Latest(sample, sample.timestamp, ""), node=NODE, process_top=100)
    out = []
    for family in collector.families():
        for values, value in family.samples:
            labels = dict(zip(family.labels, values, strict=True))
            labels.update(job="gpuops-node", instance="n1:9835")
            out.append({"series": _selector(family.name, labels), "values": f"{value!r}x5"})
    return out


def _rounded(value: float) -> float:
    """PromQL's round(v, 1e-6), for comparing sums computed in another order."""
    inverse = 1.0 / 1e-6
    return math.floor(value * inverse + 0.5) / inverse


def _expected(sample: NodeSample) -> dict[str, list[dict[str, object]]]:
    """Per recorded series: what `gpu_shares` says of the sample, rounded as the test asks."""
    gpu_time, held, busy = [], [], []
    for gpu in sample.gpus:
        share = gpu_shares(gpu)
        where = {"node": NODE, "gpu": str(gpu.info.index)}
        gpu_time.append({"labels": _selector("", where), "value": _rounded(share.busy)})
        for k in share.keys:
            user, _groups, tenant, _source, gi = k.key
            key = {**where, "user": user, "tenant": tenant or "", "GPU_I_ID": "" if gi is None else str(gi)}
            held.append({"labels": _selector("", key), "value": _rounded(k.weight)})
            busy.append({"labels": _selector("", key), "value": _rounded(k.busy)})
    return {
        "gpu:gpuops_gpu_time:ratio": gpu_time,
        "gpu_key:gpuops_gpu_held:ratio": held,
        "gpu_key:gpuops_gpu_busy:ratio": busy,
    }


def _tests_file(directory: Path, sample: NodeSample) -> Path:
    shutil.copy(HISTORY_RULES, directory / HISTORY_RULES.name)
    expected = _expected(sample)
    document = {
        "rule_files": [HISTORY_RULES.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "the shares gpu_shares computes",
                "interval": "1m",
                "input_series": _input_series(sample),
                "promql_expr_test": [
                    {"expr": f"round({name}, 1e-6)", "eval_time": "3m", "exp_samples": samples}
                    for name, samples in expected.items()
                ],
            }
        ],
    }
    path = directory / "gpuops-history.rules.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def test_history_rules_are_valid(promtool_path: str) -> None:
    result = check_rules(HISTORY_RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_history_rules_record_what_gpu_shares_computes(promtool_path: str, tmp_path: Path) -> None:
    sample = _sample()
    # The sample covers every case: GPM weighs the H100's slices, the A100's count fully.
    shares = {g.info.index: gpu_shares(g) for g in sample.gpus}
    assert 0 < shares[1].busy < 5 / 7 and shares[2].busy == 2 / 7
    result = test_rules(_tests_file(tmp_path, sample))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
