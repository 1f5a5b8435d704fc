"""A memory cap bounds a tenant's whole footprint on the GPU, its processes' CUDA contexts
included (docs/limiter.md, "What a cap bounds"), over a fake driver whose contexts cost what an
H100's do (518 MiB) and which reserves part of the card, as the real one does. Real processes
under LD_PRELOAD; what the fake GPU itself allocated and refused is the judge."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gpuops.core.driver_memory import DriverMemory
from gpuops.core.model import Gpu, GpuInfo, NodeSample
from gpuops.node import limiter
from gpuops.node.limiter_tags import LimiterTagger
from tests.native.conftest import MIB, Built, Lab, read_until, step
from tests.native.test_cli import gpuops
from tests.tenancy_helpers import planner_caps

OOM = "2"
GIB = 1 << 30
CONTEXT = 518 * MIB  # what the fake driver's contexts cost: the H100's (fakegpu_state.c)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def ctx_lab(built: Built, tmp_path: Path) -> Lab:
    lab = Lab(built, tmp_path, memory=4 * GIB, context_bytes=CONTEXT)
    yield lab  # type: ignore[misc]
    lab.close()


def test_a_program_sees_its_cap_less_its_context_and_the_gpu_holds_no_more_than_the_cap(ctx_lab: Lab) -> None:
    ctx_lab.table("tenant a memory=1GiB")
    p = ctx_lab.start("init", "info", "fill", "64m", "fill", "1m", "info", "totalmem", "ready", "wait")
    lines = read_until(p, "ready")
    out = {line.split()[0]: line.split()[1:] for line in lines}
    assert lines[0] == "init 0"
    first = [line.split()[1:] for line in lines if line.startswith("info")]
    assert first[0] == ["0", str(GIB - CONTEXT), str(GIB)]  # HAMi-core's view too: 3.49 of 4 GiB
    fills = [line.split()[1:] for line in lines if line.startswith("fill")]
    got = int(fills[0][0]) * 64 * MIB + int(fills[1][0]) * MIB
    assert got == GIB - CONTEXT  # every byte of the cap, the context's share excepted
    assert first[1][1] == "0"  # nothing left, as it says
    assert out["totalmem"] == ["0", str(GIB)]
    assert ctx_lab.fake.used_memory() == GIB  # the context and the allocations: the cap, no more
    assert ctx_lab.fake.ooms() == 0  # the driver refused nothing: the limiter stopped at the cap
    step(p)
    p.wait(timeout=30)


def test_a_context_past_the_cap_is_refused_and_never_made(ctx_lab: Lab) -> None:
    """A second process of a tenant at its cap cannot make a context: it would take the tenant
    past its cap on the device, as a full GPU refuses it (CUDA_ERROR_OUT_OF_MEMORY)."""
    ctx_lab.table("tenant a memory=1GiB")
    first = ctx_lab.start("init", "fill", "64m", "ready", "wait")
    read_until(first, "ready")
    held = ctx_lab.fake.used_memory()
    second = ctx_lab.start("cuinit", "dev", "0", "ready", "wait")
    lines = read_until(second, "ready")
    assert lines[:2] == ["cuinit 0", "dev " + OOM]
    assert ctx_lab.fake.used_memory() == held  # the driver never made it
    assert ctx_lab.fake.ooms() == 0
    for p in (first, second):
        step(p)
        p.wait(timeout=30)
    # with the first gone, the same tenant's context fits again
    out, _ = ctx_lab.run("init", "info")
    assert out["init"] == [["0"]] and out["info"][0][1] == str(GIB - CONTEXT)


def test_contexts_are_charged_while_they_exist(ctx_lab: Lab) -> None:
    """Every context costs: a second one (cuCtxCreate) while it lives, the primary one until its
    last release; the charge goes with the context."""
    ctx_lab.table("tenant a memory=2GiB")
    out, _ = ctx_lab.run(
        "init",
        "info",
        "ctx",
        "0",
        "info",
        "ctxdestroy",
        "info",
        "release",
        "0",
        "dev",
        "0",
        "info",
        via="procaddr_v2",
    )
    free = [int(i[1]) for i in out["info"]]
    assert out["ctx"] == [["0"]] and out["ctxdestroy"] == [["0"]] and out["release"] == [["0"]]
    assert free == [2 * GIB - CONTEXT, 2 * GIB - 2 * CONTEXT, 2 * GIB - CONTEXT, 2 * GIB - CONTEXT]


def test_the_region_keeps_what_a_context_costs_and_what_cuda_can_use(built: Built, tmp_path: Path) -> None:
    """The node's report: the first context measured on the GPU, under the driver's version, and
    what CUDA programs can use of the card; the agent puts them on the GPU's GpuInfo."""
    lab = Lab(built, tmp_path, memory=4 * GIB, context_bytes=CONTEXT, reserved=256 * MIB)
    try:
        lab.table("tenant a memory=2GiB")
        lab.run("init", "alloc", "100m")
        (header,) = limiter.read_headers(lab.dir)
        assert header.context_bytes == CONTEXT and header.context_measured == 1
        assert header.context_cuda_version == 12040  # the fake driver's cuDriverGetVersion
        assert header.cuda_total_bytes == 4 * GIB - 256 * MIB
        lab.run("init")
        assert limiter.read_headers(lab.dir)[0].context_measured == 2
        info = _observed(lab, header.gpu_uuid)
        assert info.driver_memory == DriverMemory(CONTEXT, 256 * MIB, "12.4")
        status = gpuops(lab, "limiter", "status", "--dir", str(lab.dir), "--interval", "0", "--json")
        assert status.returncode == 0, status.stderr
        (gpu,) = json.loads(status.stdout)["gpus"]
        assert gpu["driver"]["context_bytes"] == CONTEXT and gpu["driver"]["context_measurements"] == 2
        assert gpu["driver"]["cuda_total_bytes"] == 4 * GIB - 256 * MIB
    finally:
        lab.close()


def _observed(lab: Lab, uuid: str) -> GpuInfo:
    """The GPU as the node's agent reports it: its sample tagged from the limiter's regions."""
    info = GpuInfo(0, uuid, H100, "00000000:00:06.0", 0x233010DE, lab.memory, True, "H100-80GB")
    sample = LimiterTagger(lab.dir).tag(NodeSample("fake", 0.0, (Gpu(info=info),)))
    return sample.gpus[0].info


SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}


def _planner_caps(lab: Lab, uuid: str) -> dict[str, int]:
    """The caps the planner lays on the fake GPU for three teams at 50/30/20% (a's notebook still
    holds 64 MiB there, so the caps are laid to the MiB and add up to everything the card
    offers), from what the node observed of it; written to the node's table, as `apply` does."""
    info = _observed(lab, uuid)
    specs = planner_caps(H100, lab.memory, uuid, info.driver_memory, SHARES, {"a": 64 * MIB})
    limiter.write_table(lab.dir, specs)
    caps = {t.name: t.memory for t in specs if t.memory is not None}
    assert set(caps) == {"a", "b", "c"}, specs
    return caps


def _fill(lab: Lab, tenant: str) -> tuple[object, int]:
    """A program of the tenant that allocates until refused (64 MiB, then 1 MiB at a time) and
    waits: (the process, the bytes it got)."""
    p = lab.start("init", "fill", "64m", "fill", "1m", "ready", "wait", tenant=tenant)
    lines = read_until(p, "ready")
    assert lines[0] == "init 0", (tenant, lines)
    fills = [line.split()[1:] for line in lines if line.startswith("fill")]
    return p, int(fills[0][0]) * 64 * MIB + int(fills[1][0]) * MIB


def test_caps_the_planner_lays_on_a_gpu_hold_in_every_order(built: Built, tmp_path: Path) -> None:
    """Three tenants whose caps the planner made for one GPU start their programs in every
    order, each allocating up to its cap: each gets its cap (its context included, within a MiB)
    and no allocation fails in the driver while its tenant is under its cap. The fake GPU
    reserves 256 MiB of its 8 GiB and charges 518 MiB per context, as an H100 does."""
    for n, order in enumerate(itertools.permutations("abc")):
        root = tmp_path / f"order-{n}"
        root.mkdir()
        lab = Lab(built, root, memory=8 * GIB, context_bytes=CONTEXT, reserved=256 * MIB)
        try:
            lab.table("tenant probe memory=1GiB")
            lab.run("init", "alloc", "1m", tenant="probe")  # the node's first context on the GPU: observed
            (header,) = limiter.read_headers(lab.dir)
            caps = _planner_caps(lab, header.gpu_uuid)
            # the card, all but what the driver reserves (the H100's 480 MiB: more than this one's)
            assert 8 * GIB - 480 * MIB - 8 * MIB < sum(caps.values()) <= 8 * GIB - 480 * MIB
            procs, got = [], {}
            for tenant in order:
                p, got[tenant] = _fill(lab, tenant)
                procs.append(p)
            assert lab.fake.ooms() == 0, (
                f"order {order}: the driver refused memory under a cap ({got}, {caps})"
            )
            for tenant in order:
                assert caps[tenant] - MIB < got[tenant] + CONTEXT <= caps[tenant], (order, tenant, got, caps)
            for p in procs:
                step(p)  # type: ignore[arg-type]
                p.wait(timeout=30)  # type: ignore[attr-defined]
        finally:
            lab.close()


def test_caps_hold_when_the_programs_start_at_once(built: Built, tmp_path: Path) -> None:
    """The same three tenants starting together: contexts measured one at a time or charged the
    GPU's observed figure, every program gets its cap, the driver refuses nothing."""
    lab = Lab(built, tmp_path, memory=8 * GIB, context_bytes=CONTEXT, reserved=256 * MIB)
    try:
        lab.table("tenant probe memory=1GiB")
        lab.run("init", "alloc", "1m", tenant="probe")
        (header,) = limiter.read_headers(lab.dir)
        caps = _planner_caps(lab, header.gpu_uuid)
        procs = {t: lab.start("init", "fill", "64m", "fill", "1m", "ready", "wait", tenant=t) for t in "abc"}
        for tenant, p in procs.items():
            lines = read_until(p, "ready")
            fills = [line.split()[1:] for line in lines if line.startswith("fill")]
            got = int(fills[0][0]) * 64 * MIB + int(fills[1][0]) * MIB
            assert caps[tenant] - MIB < got + CONTEXT <= caps[tenant], (tenant, got, caps)
        assert lab.fake.ooms() == 0
        for p in procs.values():
            step(p)
            p.wait(timeout=30)
    finally:
        lab.close()
