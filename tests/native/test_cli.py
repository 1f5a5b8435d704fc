"""`gpuops limiter run` and `gpuops limiter status`, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.native.conftest import MIB, Lab, read_until

# A compute share measured over seconds: run alone, after the parallel phase (make test).
pytestmark = pytest.mark.serial

# The limiter commands on an app of their own (the main entry point lists its command modules).
RUNNER = """
import typer
from gpuops.cli.limiter import register
app = typer.Typer()
register(app)
@app.command()
def version() -> None: pass
app()
"""


def gpuops(lab: Lab, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = lab.env(tenant=None, preload=False, **env)
    return subprocess.run(
        [sys.executable, "-c", RUNNER, *args], env=e, capture_output=True, text=True, timeout=120
    )


def test_run_caps_an_unmodified_program(lab: Lab) -> None:
    prog = str(lab.built.cudaprog)
    p = gpuops(
        lab,
        "limiter",
        "run",
        "--tenant",
        "t1",
        "--memory",
        "64MiB",
        "--dir",
        str(lab.dir),
        "--",
        prog,
        "init",
        "alloc",
        "40m",
        "alloc",
        "40m",
        "info",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1:] == ["alloc 0", "alloc 2", f"info 0 {24 * MIB} {64 * MIB}"]


def test_run_gives_a_fixed_compute_share(lab: Lab) -> None:
    prog = str(lab.built.cudaprog)
    p = gpuops(
        lab,
        "limiter",
        "run",
        "--tenant",
        "t1",
        "--compute",
        "20%",
        "--dir",
        str(lab.dir),
        "--",
        prog,
        "init",
        "spin",
        "1.5",
        "100000",
        "kernel",
        "1000",
    )
    assert p.returncode == 0, p.stderr
    ks = lab.fake.kernels()
    t0 = ks[0].start_ns + 200_000_000
    t1 = ks[-1].end_ns
    busy = sum(min(k.end_ns, t1) - max(k.start_ns, t0) for k in ks if k.end_ns > t0)
    assert 0.16 <= busy / (t1 - t0) <= 0.23


def test_run_cannot_raise_the_tables_limit(lab: Lab) -> None:
    lab.table("tenant t1 memory=32MiB")
    prog = str(lab.built.cudaprog)
    p = gpuops(
        lab,
        "limiter",
        "run",
        "--tenant",
        "t1",
        "--memory",
        "1GiB",
        "--dir",
        str(lab.dir),
        "--",
        prog,
        "init",
        "alloc",
        "40m",
    )
    assert p.stdout.splitlines()[1:] == ["alloc 2"]


def test_run_rejects_bad_input_in_one_line(lab: Lab) -> None:
    for args in (
        ["--tenant", "a/b"],
        ["--tenant", "a", "--memory", "lots"],
        ["--tenant", "a", "--policy", "x", "--compute", "5"],
    ):
        p = gpuops(lab, "limiter", "run", *args, "--", "true")
        assert p.returncode == 1
        assert p.stderr.startswith("error:") and "Traceback" not in p.stderr
    p = gpuops(lab, "limiter", "run", "--tenant", "a", "--dir", str(lab.dir), "--", "/nonexistent/prog")
    assert p.returncode == 127 and "cannot run" in p.stderr


def test_status_shows_tenants_processes_and_shares(lab: Lab) -> None:
    lab.table(
        "tenant a memory=256MiB compute=30 policy=fixed-share", "tenant b compute=70 policy=fixed-share"
    )
    pa = lab.start("init", "alloc", "48m", "ready", "spin", "3", "100000", "kernel", "1000", tenant="a")
    pb = lab.start("init", "alloc", "16m", "ready", "spin", "3", "2000000", "kernel", "1000", tenant="b")
    read_until(pa, "ready")
    read_until(pb, "ready")
    p = gpuops(lab, "limiter", "status", "--dir", str(lab.dir), "--interval", "1s", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (gpu,) = doc["gpus"]
    tenants = {t["tenant"]: t for t in gpu["tenants"]}
    assert tenants["a"]["memory_used_bytes"] == 48 * MIB and tenants["a"]["memory_limit_bytes"] == 256 * MIB
    assert tenants["b"]["memory_used_bytes"] == 16 * MIB and tenants["b"]["memory_limit_bytes"] is None
    assert tenants["a"]["compute_share_ratio"] == 0.3
    share_a, share_b = tenants["a"]["gpu_share_ratio"], tenants["b"]["gpu_share_ratio"]
    assert 0.2 <= share_a / (share_a + share_b) <= 0.4, (share_a, share_b)
    assert {p["pid"] for p in gpu["processes"] if p["alive"]} == {pa.pid, pb.pid}
    text = gpuops(lab, "limiter", "status", "--dir", str(lab.dir), "--interval", "0")
    assert text.returncode == 0
    assert "48MiB" in text.stdout and "256MiB" in text.stdout and str(pa.pid) in text.stdout
    for proc in (pa, pb):
        proc.kill()
        proc.wait()


def test_status_without_regions(lab: Lab) -> None:
    p = gpuops(lab, "limiter", "status", "--dir", str(lab.dir), "--interval", "0")
    assert p.returncode == 0 and "no GPU regions" in p.stdout
