"""Memory caps, checked the way a user would: real processes under LD_PRELOAD, the driver's
answers, and what the (fake) GPU really allocated."""

from __future__ import annotations

import pytest

from tests.native.conftest import MIB, Lab, read_until, step

OOM = "2"

# (command, args for ~40 MiB) for every allocation path, and how each is freed ("free").
PATHS = {
    "cuMemAlloc_v2": ("alloc", ["40m"]),
    "cuMemAllocManaged": ("managed", ["40m"]),
    "cuMemAllocAsync": ("async", ["40m"]),
    "cuMemAllocFromPoolAsync": ("pool", ["40m"]),
    "cuMemCreate": ("create", ["40m"]),
    "cuMemAllocPitch_v2": ("pitch", ["4000", "10240"]),  # real pitch 4096 -> 40 MiB
    "cuArrayCreate_v2": ("array", ["2048", "1280"]),  # float4 elements -> 40 MiB
    "cuArray3DCreate_v2": ("array3d", ["256", "256", "40"]),
    "cuMipmappedArrayCreate": ("mipmap", ["2048", "1024", "0", "2"]),  # 2 levels -> 40 MiB
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_allocation_path_is_capped_and_freed(lab: Lab, path: str) -> None:
    lab.table("tenant a memory=64MiB")
    cmd, args = PATHS[path]
    out, _ = lab.run("init", cmd, *args, cmd, *args, "info", "free", cmd, *args, "info")
    first, second, third = (r[0] for r in out[cmd])
    assert first == "0", path
    assert second == OOM, f"{path}: a second 40 MiB went past the 64 MiB cap"
    assert third == "0", f"{path}: freeing did not give the memory back to the tenant"
    free_after_first = int(out["info"][0][1])
    assert free_after_first == 24 * MIB, f"{path}: the tenant's view shows {free_after_first}"


def test_refused_allocation_never_reaches_the_gpu(lab: Lab) -> None:
    lab.table("tenant a memory=64MiB")
    p = lab.start("init", "alloc", "40m", "alloc", "40m", "ready", "wait")
    lines = read_until(p, "ready")
    assert lines[1:3] == ["alloc 0", "alloc " + OOM]
    assert lab.fake.used_memory() == 40 * MIB
    step(p)
    p.wait(timeout=30)


def test_pitch_is_counted_with_the_real_pitch(lab: Lab) -> None:
    # 4000 x 10240 at pitch 4096 is 40 MiB on the GPU, but only 39.06 MiB of width x height;
    # 1.5 MiB more fits under a 41 MiB cap only if the pitch is ignored.
    lab.table("tenant a memory=41MiB")
    out, _ = lab.run("init", "pitch", "4000", "10240", "alloc", str(3 * MIB // 2))
    assert out["pitch"][0] == ["0", "4096"]
    assert out["alloc"][0] == [OOM]


def test_host_located_cuMemCreate_is_not_counted(lab: Lab) -> None:
    lab.table("tenant a memory=4MiB")
    out, _ = lab.run("init", "createhost", "64m", "create", "64m")
    assert out["createhost"][0] == ["0"]
    assert out["create"][0] == [OOM]


@pytest.mark.parametrize("via", ["dlopen", "procaddr", "procaddr_v2", "procaddr_ptsz"])
def test_programs_that_load_the_driver_themselves_are_capped(lab: Lab, via: str) -> None:
    lab.table("tenant a memory=64MiB")
    out, _ = lab.run("init", "alloc", "40m", "alloc", "40m", "async", "40m", "info", via=via)
    assert out["alloc"] == [["0"], [OOM]]
    assert out["async"] == [[OOM]]
    assert out["info"][0][2] == str(64 * MIB)


def test_two_processes_of_one_tenant_share_one_cap(lab: Lab) -> None:
    lab.table("tenant a memory=100MiB", "tenant b memory=100MiB")
    first = lab.start("init", "alloc", "60m", "ready", "wait")
    read_until(first, "ready")
    out, _ = lab.run("init", "alloc", "60m", "alloc", "30m", "info")
    assert out["alloc"] == [[OOM], ["0"]]
    assert out["info"][0][1:] == [str(10 * MIB), str(100 * MIB)]
    # another tenant has its own cap
    out_b, _ = lab.run("init", "alloc", "60m", tenant="b")
    assert out_b["alloc"] == [["0"]]
    step(first)
    first.wait(timeout=30)
    # once the first process is gone, its 60 MiB are the tenant's again
    out, _ = lab.run("init", "alloc", "90m")
    assert out["alloc"] == [["0"]]


def test_memory_info_shows_the_tenants_view(lab: Lab) -> None:
    lab.table("tenant a memory=100MiB")
    out, _ = lab.run("init", "info", "alloc", "30m", "info", "totalmem", "nvml")
    assert out["info"][0] == ["0", str(100 * MIB), str(100 * MIB)]
    assert out["info"][1] == ["0", str(70 * MIB), str(100 * MIB)]
    assert out["totalmem"][0] == ["0", str(100 * MIB)]
    rc, total, used, free, rc2, total2, used2, free2 = out["nvml"][0]
    assert (rc, total, used, free) == ("0", str(100 * MIB), str(30 * MIB), str(70 * MIB))
    assert (rc2, total2, used2, free2) == ("0", str(100 * MIB), str(30 * MIB), str(70 * MIB))


def test_without_a_limit_the_whole_gpu_is_visible(lab: Lab) -> None:
    # a tenant * line without limits: what the table gives tenants it does not name is no cap
    lab.table("tenant other memory=1MiB", "tenant *")
    out, _ = lab.run("init", "alloc", "500m", "info")
    assert out["alloc"] == [["0"]]
    assert out["info"][0][2] == str(1024 * MIB)


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("CUDA_DEVICE_MEMORY_LIMIT", "50m", 50),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "50m", 50),
        ("GPUOPS_MEMORY_LIMIT", "50MiB", 50),
        ("CUDA_DEVICE_MEMORY_LIMIT", "200m", 100),  # cannot raise the table's 100 MiB
        ("GPUOPS_MEMORY_LIMIT", "8GiB", 100),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "10m", 100),  # another GPU's limit
    ],
)
def test_environment_can_only_lower_the_limit(lab: Lab, variable: str, value: str, allowed: int) -> None:
    lab.table("tenant a memory=100MiB")
    out, _ = lab.run("init", "info", **{variable: value})
    assert out["info"][0][2] == str(allowed * MIB)


def test_environment_alone_limits_a_tenant_without_a_table_line(lab: Lab) -> None:
    out, _ = lab.run("init", "alloc", "60m", "alloc", "60m", tenant="adhoc", CUDA_DEVICE_MEMORY_LIMIT="100m")
    assert out["alloc"] == [["0"], [OOM]]


def test_catch_all_line_limits_unlisted_tenants(lab: Lab) -> None:
    lab.table("tenant a memory=500MiB", "tenant * memory=10MiB")
    out, _ = lab.run("init", "alloc", "20m", tenant="somebody-else")
    assert out["alloc"] == [[OOM]]
    out, _ = lab.run("init", "alloc", "20m", tenant=None)  # no tenant given: 'default'
    assert out["alloc"] == [[OOM]]


def test_garbage_tenant_table_keeps_the_last_good_limits(lab: Lab) -> None:
    lab.table("tenant a memory=100MiB")
    p = lab.start(
        "init",
        "alloc",
        "60m",
        "ready",
        "wait",
        "sleep",
        "700",
        "alloc",
        "60m",
        "ready",
        "wait",
        "sleep",
        "700",
        "alloc",
        "60m",
        "ready",
    )
    read_until(p, "ready")
    lab.write_table("this is\x00 not a table\n\xff\xfe")
    step(p)
    lines = read_until(p, "ready")
    assert "alloc " + OOM in lines, "the last good cap of 100 MiB was lost"
    # a good table again: the new, larger cap applies (so the check above could have failed)
    lab.table("tenant a memory=300MiB", generation=2)
    step(p)
    lines = read_until(p, "ready")
    assert "alloc 0" in lines
    p.wait(timeout=30)
    assert p.stderr is not None
    err = p.stderr.read()
    assert "tenant table" in err and "invalid" in err


def test_garbage_table_at_start_fails_closed_and_logs(lab: Lab) -> None:
    # no last good table: the environment's 100 MiB cannot stand in for the table (fail closed)
    lab.write_table("gpuops-limiter-table 1\ntenant a memory=lots\n")
    out, err = lab.run("init", "alloc", "60m", "alloc", "60m", CUDA_DEVICE_MEMORY_LIMIT="100m")
    assert out["alloc"] == [[OOM], [OOM]]
    assert "invalid" in err and "failing closed" in err


def test_garbage_region_file_keeps_limits_in_force(lab: Lab) -> None:
    lab.table("tenant a memory=100MiB")
    p = lab.start(
        "init", "alloc", "60m", "ready", "wait", "sleep", "700", "alloc", "60m", "alloc", "30m", "ready"
    )
    read_until(p, "ready")
    (region,) = lab.dir.glob("gpu-*.region")
    with open(region, "r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 64)
    step(p)
    lines = read_until(p, "ready")
    assert lines[-3:] == ["alloc " + OOM, "alloc 0", "ready"]
    p.wait(timeout=30)
    assert p.stderr is not None
    assert "overwritten" in p.stderr.read()
    # a new process facing the garbage region still runs, with the cap applied to itself
    out, err = lab.run("init", "alloc", "60m", "alloc", "60m", "launch", "3", "1000", "kernel")
    assert out["alloc"] == [["0"], [OOM]]
    assert out["launch"] == [["0"]]
    assert "corrupt" in err


def test_unknown_symbols_pass_through(lab: Lab) -> None:
    # The program reaches every other driver function (contexts, modules, events, graphs)
    # through the same dlsym and cuGetProcAddress overrides.
    for via in ("dlopen", "procaddr_v2"):
        out, _ = lab.run("init", "elapsed", "1000000", "launch", "2", "1000", "graph", via=via)
        assert out["elapsed"][0][0] == "0"
        assert float(out["elapsed"][0][1]) >= 1.0
        assert out["launch"] == [["0"]]
