"""The node exporter's limiter series, from regions written by the real library in real
processes, scraped over HTTP from `gpuops agent --metrics`."""

from __future__ import annotations

from pathlib import Path

from gpuops.node import limiter
from tests.integration.metrics_helpers import one, parse, promtool_problems, running_exporter, scrape
from tests.native.conftest import MIB, Lab, read_until, step


def test_limiter_regions_become_tenant_series(lab: Lab, tmp_path: Path) -> None:
    lab.table("tenant a memory=100MiB compute=30 policy=fixed-share", "tenant b")
    pa = lab.start(
        "init", "alloc", "30m", "ready", "wait", "launch", "50", "1000000", "kernel", "ready", "wait"
    )
    pb = lab.start("init", "alloc", "10m", "ready", "wait", tenant="b")
    read_until(pa, "ready")
    read_until(pb, "ready")
    args = ["--backend", "sim", "--limiter-dir", str(lab.dir), "--state-dir", str(tmp_path / "state")]
    with running_exporter(*args, "--interval", "0.2") as (url, _proc):
        first = scrape(url)
        step(pa)  # fifty 1 ms kernels of tenant a between the two scrapes
        read_until(pa, "ready")
        second = scrape(url)
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir)]
    assert snap is not None
    uuid = snap.gpu_uuid
    for text in (first, second):
        series = parse(text)
        a = {"UUID": uuid, "tenant": "a"}
        b = {"UUID": uuid, "tenant": "b"}
        assert one(series, "gpuops_limiter_memory_limit_bytes", **a) == 100 * MIB
        assert one(series, "gpuops_limiter_memory_limit_bytes", **b) is None  # uncapped: no limit
        assert one(series, "gpuops_limiter_memory_used_bytes", **a) == 30 * MIB
        assert one(series, "gpuops_limiter_memory_used_bytes", **b) == 10 * MIB
        assert one(series, "gpuops_limiter_compute_share_target_ratio", policy="fixed-share", **a) == 0.3
        assert one(series, "gpuops_limiter_compute_share_target_ratio", **b) is None
        problems = promtool_problems(text)
        assert not problems, problems
    # The achieved share is measured between scrapes: none at the first, then what each got.
    assert "gpuops_limiter_compute_share_ratio" not in parse(first)
    later = parse(second)
    got_a = one(later, "gpuops_limiter_compute_share_ratio", UUID=uuid, tenant="a")
    assert got_a is not None and 0 < got_a <= 1
    assert one(later, "gpuops_limiter_compute_share_ratio", UUID=uuid, tenant="b") == 0.0
    for p in (pa, pb):
        step(p)
        p.wait(timeout=30)
