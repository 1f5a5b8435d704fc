"""gpuops.node.limiter: the agent's side of the limiter, against regions written by the real
library in real processes."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpuops.node import limiter
from tests.native.conftest import MIB, Built, Lab, read_until, step


def test_region_layout_matches_the_library(built: Built) -> None:
    layout = json.loads(
        subprocess.run([str(built.layout)], capture_output=True, text=True, check=True).stdout
    )
    assert layout["magic"] == limiter.MAGIC
    assert layout["version"] == limiter.VERSION
    assert layout["total_size"] == limiter.TOTAL_SIZE
    assert layout["slots_off"] == limiter.SLOTS_OFF
    assert layout["tenant_size"] == limiter.TENANT_SIZE and layout["slot_size"] == limiter.SLOT_SIZE
    for name, offset in limiter.OFFSETS.items():
        assert layout[name] == offset, name


def test_written_table_is_what_the_library_enforces(lab: Lab) -> None:
    specs = [
        limiter.TenantSpec("a", memory=64 * MIB, compute=30, policy="burst-share", klass="offline"),
        limiter.TenantSpec("b", memory=8 * MIB, gpus=("0",)),
        limiter.TenantSpec("b", memory=512 * MIB),
    ]
    assert limiter.write_table(lab.dir, specs) == 1
    assert limiter.write_table(lab.dir, specs) == 2  # generations increase
    generation, back = limiter.read_table(lab.dir)
    assert generation == 2 and back == specs
    out, _ = lab.run("init", "alloc", "40m", "alloc", "40m")
    assert out["alloc"] == [["0"], ["2"]]
    out, _ = lab.run("init", "alloc", "10m", tenant="b")  # the line for GPU 0 wins
    assert out["alloc"] == [["2"]]
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir)]
    assert snap is not None
    a = snap.tenant("a")
    assert a is not None
    assert (a.memory_limit, a.compute_percent, a.policy, a.klass) == (
        64 * MIB,
        30.0,
        "burst-share",
        "offline",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tenant a memory=1GiB\n", "line 1"),
        ("gpuops-limiter-table 1\ntenant a memory=lots\n", "line 2"),
        ("gpuops-limiter-table 1\ntenant a compute=30 policy=greedy\n", "line 2"),
        ("gpuops-limiter-table 1\ntenant a policy=burst-share\n", "line 2"),
        ("gpuops-limiter-table 1\ntenant bad/name\n", "line 2"),
        ("gpuops-limiter-table 1\ntenant a color=red\n", "line 2"),
        ("gpuops-limiter-table 1\ntenant a memory=1GiB", "line 2: last line incomplete"),
    ],
)
def test_garbage_tables_are_rejected_like_the_library_does(lab: Lab, text: str, error: str) -> None:
    with pytest.raises(limiter.LimiterError, match=error):
        limiter.parse_table(text)
    # the library refuses the same file: with no last good table, a program under it fails closed
    lab.write_table(text)
    out, err = lab.run("init", "alloc", "900m")
    assert out["alloc"] == [["2"]]
    assert "invalid" in err and "failing closed" in err


def test_reader_reports_tenants_and_processes(lab: Lab) -> None:
    lab.table("tenant a memory=100MiB compute=30 policy=fixed-share", "tenant b")
    pa = lab.start("init", "alloc", "30m", "launch", "20", "1000000", "kernel", "ready", "wait")
    pb = lab.start("init", "alloc", "10m", "ready", "wait", tenant="b")
    read_until(pa, "ready")
    read_until(pb, "ready")
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir)]
    assert snap is not None and snap.gpu_uuid.startswith("GPU-")
    a, b = snap.tenant("a"), snap.tenant("b")
    assert a is not None and b is not None
    assert (a.memory_used, a.processes, a.memory_limit) == (30 * MIB, 1, 100 * MIB)
    assert (b.memory_used, b.processes, b.memory_limit) == (10 * MIB, 1, 0)
    assert a.busy_ns >= 19 * 1_000_000  # twenty 1 ms kernels, measured by its events
    by_pid = {p.pid: p for p in snap.processes if p.alive}
    assert by_pid[pa.pid].tenant == "a" and by_pid[pa.pid].memory_used == 30 * MIB
    assert by_pid[pb.pid].tenant == "b"
    assert by_pid[pa.pid].init_cpu_ns > 0
    pa.kill()
    pa.wait()
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir)]
    assert snap is not None
    a = snap.tenant("a")
    assert a is not None and (a.memory_used, a.processes) == (0, 0)
    assert [p.alive for p in snap.processes if p.pid == pa.pid] == [False]
    step(pb)
    pb.wait(timeout=30)


def test_reader_rejects_a_garbage_region(lab: Lab) -> None:
    lab.table("tenant a")
    lab.run("init", "alloc", "1m")
    (path,) = limiter.region_paths(lab.dir)
    data = bytearray(path.read_bytes())
    data[48:52] = b"XXXX"  # the GPU UUID, covered by the header checksum
    path.write_bytes(bytes(data))
    ((_, snap, error),) = limiter.read_regions(lab.dir)
    assert snap is None and error is not None and "corrupt" in error
