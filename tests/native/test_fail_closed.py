"""The limiter fails closed (docs/limiter.md, "Threat model: what fails closed, and how"): a
program that starts while the tenant table is invalid, truncated or empty, or that names no
tenant the table knows, never runs uncapped.  Real processes under LD_PRELOAD, fake driver."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.node import limiter
from gpuops.simfleet import Launched, launch, stop
from tests.native.conftest import Built, Lab, read_until, step

OOM = "2"
CAPPED = "tenant a memory=64MiB compute=50 policy=fixed-share class=online"
# What `gpuops apply` writes, bar the comment line (gpuops.node.limiter.format_table).
GOOD = f"gpuops-limiter-table 1\ngeneration 7\n{CAPPED}\n"


def fill(lab: Lab, timeout: float = 60, **env: str) -> tuple[list[str], str]:
    """The filed evidence: 16 allocations of 60 MiB (960 of the fake GPU's 1024 MiB)."""
    out, err = lab.run("init", *["alloc", "60m"] * 16, timeout=timeout, **env)
    return [a[0] for a in out["alloc"]], err


def refused_everything(lab: Lab, timeout: float = 60, **env: str) -> str:
    results, err = fill(lab, timeout=timeout, **env)
    assert results == [OOM] * 16, f"no cap at all: {results}\n{err}"
    return err


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(GOOD + "tenant b memory=lots\n", id="invalid"),
        pytest.param("this is\x00 not a table\n\xff\xfe", id="binary"),
        pytest.param(GOOD[: GOOD.index("policy=") + len("policy=fix")], id="truncated-mid-word"),
        # cut where the rest still parses: the last line has no newline
        pytest.param(
            GOOD + "tenant * memory=0 compute=1 policy=fixed-share class=offline"[:27], id="truncated"
        ),
        pytest.param("", id="empty"),
    ],
)
def test_a_bad_table_at_start_fails_closed(lab: Lab, text: str) -> None:
    lab.write_table(text)
    for tenant in ("a", "b"):
        err = refused_everything(lab, tenant=tenant)
        assert "failing closed" in err and "every GPU allocation is refused" in err
        assert err.count("failing closed") == 1, err  # said once, not per call
    assert lab.fake.used_memory() == 0


def test_failing_closed_shows_a_cap_of_zero_and_lowers_compute(lab: Lab) -> None:
    lab.write_table("")
    out, _ = lab.run("init", "info", "totalmem", "alloc", "1")
    assert out["info"][0][1:] == ["0", "0"]  # free, total
    assert out["totalmem"] == [["0", "0"]]
    assert out["alloc"] == [[OOM]]
    p = lab.start("init", "alloc", "1", "ready", "wait")
    read_until(p, "ready")
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir) if s is not None]
    (t,) = snap.tenants
    assert (t.memory_limit, t.memory_capped) == (0, True)
    assert (t.compute_percent, t.policy, t.klass) == (1.0, "fixed-share", "offline")
    step(p)
    p.wait(timeout=30)


def test_the_environment_cannot_lift_the_closed_default(lab: Lab) -> None:
    lab.write_table("garbage\n")
    refused_everything(lab, CUDA_DEVICE_MEMORY_LIMIT="900m", GPUOPS_COMPUTE_SHARE="90", GPUOPS_CLASS="online")


def test_a_running_program_closed_at_start_takes_the_first_valid_table(lab: Lab) -> None:
    lab.write_table("")
    p = lab.start(
        "init", "alloc", "60m", "ready", "wait", "sleep", "700", "alloc", "60m", "alloc", "60m", "ready"
    )
    assert read_until(p, "ready")[-2:] == ["alloc " + OOM, "ready"]
    lab.write_table(GOOD)
    step(p)
    assert read_until(p, "ready")[-3:] == ["alloc 0", "alloc " + OOM, "ready"]
    p.wait(timeout=30)


def test_the_last_good_table_written_by_the_agent_applies_to_new_programs(lab: Lab) -> None:
    spec = limiter.TenantSpec("a", memory=64 << 20, compute=50)
    limiter.write_table(lab.dir, [spec])
    lab.write_table(GOOD.replace("64MiB", "100MiB")[:40])  # truncated by some other writer
    results, err = fill(lab)
    assert results == ["0"] + [OOM] * 15
    assert "using the last good table" in err and "truncated" in err


def test_the_library_keeps_the_last_good_table_for_new_programs(lab: Lab) -> None:
    lab.write_table(GOOD)
    assert fill(lab)[0] == ["0"] + [OOM] * 15
    kept = lab.dir / "tenants.last-good"
    assert kept.read_text() == GOOD and kept.stat().st_mode & 0o777 == 0o644
    lab.write_table("")
    results, err = fill(lab)
    assert results == ["0"] + [OOM] * 15
    assert "using the last good table" in err
    assert kept.read_text() == GOOD  # a bad table never replaces it


def test_a_last_good_table_others_could_write_is_not_trusted(lab: Lab) -> None:
    lab.write_table(GOOD)
    fill(lab)
    kept = lab.dir / "tenants.last-good"
    kept.write_text(GOOD.replace("64MiB", "900MiB"))
    os.chmod(kept, 0o666)  # a process of any user could have written it
    lab.write_table("")
    err = refused_everything(lab)
    assert "writable by it alone" in err


def untrusted_last_good(lab: Lab, case: str) -> None:
    """Puts a tenants.last-good the library must not trust in lab's directory (no table)."""
    kept = lab.dir / "tenants.last-good"
    roomy = GOOD.replace("64MiB", "900MiB")
    if case == "garbage":
        kept.write_text("garbage\n")
    elif case == "group-writable":
        kept.write_text(roomy)
        os.chmod(kept, 0o664)
    elif case == "symlink":
        target = lab.dir.parent / "elsewhere"
        target.write_text(roomy)
        kept.symlink_to(target)
    elif case == "dangling-symlink":
        kept.symlink_to(lab.dir.parent / "nothing-here")
    elif case == "owned-by-someone-else":
        kept.write_text(roomy)
        os.chown(kept, 65534, 65534)
    elif case == "directory":
        kept.mkdir()
    elif case == "fifo":
        os.mkfifo(kept, 0o644)  # nobody writes it: a blocking open() would wait forever
    else:
        raise AssertionError(case)


BAD_COPIES = ["garbage", "group-writable", "symlink", "dangling-symlink", "owned-by-someone-else"]


@pytest.mark.parametrize("case", [*BAD_COPIES, "directory", "fifo"])
def test_no_table_and_a_bad_last_good_table_fails_closed(lab: Lab, case: str) -> None:
    """The table gone, its last good copy there but not usable: the directory has had a table,
    so this is not ad-hoc use (which needs neither file): the closed default, not the env."""
    if case == "owned-by-someone-else" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    untrusted_last_good(lab, case)
    assert not (lab.dir / "tenants").exists()
    for tenant in ("a", "b"):
        err = refused_everything(lab, timeout=15, tenant=tenant)
        assert "does not exist and there is no usable last good table" in err, err
        assert "tenants.last-good" in err and err.count("failing closed") == 1, err
    assert lab.fake.used_memory() == 0


def test_a_table_that_is_a_fifo_fails_closed_without_hanging(lab: Lab) -> None:
    os.mkfifo(lab.dir / "tenants", 0o644)
    err = refused_everything(lab, timeout=15)
    assert "is not a regular file" in err, err


def test_a_directory_that_never_had_a_table_is_ad_hoc(lab: Lab) -> None:
    """Neither tenants nor tenants.last-good: `gpuops limiter run` use, the environment decides."""
    results, err = fill(lab)
    assert results == ["0"] * 16 and "failing closed" not in err, err
    results, _ = fill(lab, CUDA_DEVICE_MEMORY_LIMIT="200m")
    assert results == ["0"] * 3 + [OOM] * 13


def test_a_tenant_without_a_line_on_a_covered_gpu_fails_closed(lab: Lab) -> None:
    lab.table(CAPPED)
    for tenant in (None, "b", "A"):
        err = refused_everything(lab, tenant=tenant)  # type: ignore[arg-type]
        assert "no 'tenant *' line" in err
    # a tenant * line is what they get instead
    lab.table(CAPPED, "tenant * memory=200MiB", generation=2)
    results, _ = fill(lab, tenant="b")
    assert results == ["0"] * 3 + [OOM] * 13


def test_memory_zero_is_a_cap_of_zero(lab: Lab) -> None:
    lab.table("tenant * memory=0 compute=1 policy=fixed-share class=offline")
    refused_everything(lab, tenant="b")
    assert limiter.parse_table(GOOD + "tenant * memory=0\n")[1][1].memory == 0


# --------------------------------------------------------------------------- `gpuops apply`

APPLY_CARVE = """\
  - select: {nodes: sim-robotics-01}
    limiter:
      tenants: {vision: {memory: 64MiB, compute: 50%}}
"""


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tenant table `gpuops apply` wrote on a simulated node: its limiter directory."""
    directory = tmp_path_factory.mktemp("simfleet") / "fleet"
    started: Launched = launch(directory, "silos", timeout=60)
    try:
        carve = started.dir / "carve.yaml"
        carve.write_text((started.dir / "fleet.yaml").read_text() + "carve:\n" + APPLY_CARVE)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "COLUMNS": "200", "TERM": "dumb"}
        done = subprocess.run(
            [sys.executable, "-m", "gpuops", "apply", str(carve), "--yes"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield started.dir / "state" / "sim-robotics-01" / "limiter"
    finally:
        stop(directory)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tenant", [None, "nobody", "VISION", "vision "])
def test_unset_unknown_or_wrong_case_tenant_on_an_applied_table_fails_closed(
    built: Built, tmp_path: Path, applied: Path, tenant: str | None
) -> None:
    lab = Lab(built, tmp_path)
    try:
        lab.write_table((applied / "tenants").read_text())
        assert "tenant vision memory=67108864" in (lab.dir / "tenants").read_text()
        refused_everything(lab, tenant=tenant)  # type: ignore[arg-type]
        # the tenant the table names gets its own cap, not the closed default
        results, _ = fill(lab, tenant="vision")
        assert results == ["0"] + [OOM] * 15
    finally:
        lab.close()
