"""A GPU plan's payloads (what apply sends) are the protocol's types: the MIG payload is the GPU's
change of the mig_apply request (core/protocol.py MigChange), MPS the settings of the GPU's
daemons (MpsSettings, with MpsTenant), the limiter's lines core/tenant_table.py's TenantSpec (the
line from fleet.yaml to the node); the saved document is the JSON core/codec.py writes for them:
read back to the same plan and written again to the same document."""

from __future__ import annotations

import json

from gpuops.core.mig.layout import MigLayout
from gpuops.core.protocol import MigChange, MpsSettings, MpsTenant
from gpuops.core.tenant_table import TenantSpec
from gpuops.plan.saved import parse_plan, plan_document
from tests.unit.test_saved_plan_fuzz import DOCUMENT, PLAN, SOURCE


def test_the_payloads_are_typed() -> None:
    gpu0, gpu1 = PLAN.nodes[0].gpus
    assert isinstance(gpu0.mig, MigChange) and isinstance(gpu0.mig.layout, MigLayout)
    assert gpu0.mig.gpu == gpu0.index
    assert gpu0.mig.known_pids and all(isinstance(p, int) for p in gpu0.mig.known_pids)
    assert isinstance(gpu0.mps, MpsSettings) and gpu0.mps.per_instance is True
    assert gpu0.mps.tenants == (MpsTenant("vision", ("alice",), 50, 1 << 30),)  # 50: the default
    assert gpu1.limiter is not None and [t.name for t in gpu1.limiter] == ["nlp", "vision"]
    assert all(isinstance(t, TenantSpec) and t.gpus == () for t in gpu1.limiter)


def test_the_document_keeps_its_json() -> None:
    gpu0, gpu1 = DOCUMENT["nodes"][0]["gpus"]
    mig = gpu0["mig"]
    assert list(mig) == ["gpu", "layout", "expect", "known_pids"]
    assert MigLayout.from_json(mig["layout"]) == PLAN.nodes[0].gpus[0].mig.layout  # type: ignore[union-attr]
    assert list(gpu0["mps"]) == [
        "enabled",
        "per_instance",
        "pipe_directory",
        "log_directory",
        "active_thread_percentage",
        "pinned_memory_limit",
        "tenants",
    ]
    (tenant,) = gpu0["mps"]["tenants"]
    assert list(tenant) == ["name", "users", "active_thread_percentage", "pinned_memory_limit"]
    assert isinstance(tenant["users"], list)
    assert [list(line) for line in gpu1["limiter"]] == [
        ["name", "memory", "compute", "policy", "class", "gpus"]
    ] * 2
    assert gpu1["mig"] is None and gpu1["mps"] is None


def test_a_saved_plan_reads_back_and_writes_the_same_document() -> None:
    again = parse_plan(json.dumps(DOCUMENT, indent=2).encode(), SOURCE)
    assert again == PLAN
    assert plan_document(again) == DOCUMENT
