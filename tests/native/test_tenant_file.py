"""Who is which tenant (docs/limiter.md, "Who is which tenant"): `/etc/gpuops/tenant`, when it is
there in any form, decides: its name, or the closed default (logged), never `GPUOPS_TENANT`.

The library reads that fixed path (nothing in the environment may move it, or a program could
name its own file), so each program runs in a private mount namespace where `/etc/gpuops` is a
tmpfs holding the case's `tenant` (over an overlay of `/etc` where the directory does not exist).
That needs root; the tests skip without it.  Real processes under LD_PRELOAD, fake driver."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuops.node import limiter
from tests.native.conftest import Lab

OOM = "2"
TABLE = (
    "tenant a memory=64MiB compute=50 policy=fixed-share class=online",
    "tenant big memory=900MiB compute=50 policy=burst-share class=online",
    "tenant * memory=200MiB compute=5 policy=fixed-share class=online",
)
A_ONLY = ["0"] + [OOM] * 15  # 64 MiB: one allocation of 60 MiB
BIG = ["0"] * 15 + [OOM]  # 900 MiB: fifteen
CLOSED = [OOM] * 16  # the closed default: a cap of 0
TENANT_FILE = "/etc/gpuops/tenant"

# $1: what /etc/gpuops holds; $2: an empty directory for the overlay's own files; then the command.
NAMESPACE = r"""
set -e
stage=$1 ns=$2
shift 2
if [ ! -d /etc/gpuops ]; then
    mount -t tmpfs -o mode=0755 gpuops-test "$ns"
    mkdir -p "$ns/upper/gpuops" "$ns/work"
    mount -t overlay overlay -o "lowerdir=/etc,upperdir=$ns/upper,workdir=$ns/work" /etc
fi
mount -t tmpfs -o mode=0755 gpuops-test /etc/gpuops
cp -a "$stage/." /etc/gpuops/
exec "$@"
"""
# The program's user cannot read a file root can: root without the capabilities that bypass
# file permissions (bounding set dropped before exec; its inheritable set is empty).
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def in_namespace(tmp: Path, stage: Path) -> list[str]:
    ns = tmp / "ns"
    ns.mkdir(exist_ok=True)
    unshare = ["unshare", "--mount", "--propagation", "private"]
    return [*unshare, "sh", "-c", NAMESPACE, "sh", str(stage), str(ns)]


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip(f"needs root, unshare and setpriv to put a file at {TENANT_FILE}")
    tmp = tmp_path_factory.mktemp("probe")
    stage = tmp / "stage"
    stage.mkdir()
    (stage / "tenant").write_text("probe\n")
    probe = [*in_namespace(tmp, stage), *NO_DAC, "cat", TENANT_FILE]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if done.returncode != 0 or done.stdout != "probe\n":
        pytest.skip(f"cannot mount over {TENANT_FILE} in a mount namespace: {done.stderr.strip()}")


def stage_tenant_file(stage: Path, case: str) -> None:
    """Makes stage/tenant what the case says (stage becomes /etc/gpuops)."""
    tenant = stage / "tenant"
    if case == "absent":
        return
    if case == "directory":
        tenant.mkdir()
    elif case == "dangling-link":
        tenant.symlink_to("/nonexistent/gpuops/tenant")
    elif case == "link":
        (stage / "real-tenant").write_text("a\n")
        tenant.symlink_to("real-tenant")
    elif case == "fifo":
        os.mkfifo(tenant, 0o644)  # nobody writes it: a blocking open() waits forever
    elif case == "unreadable":
        tenant.write_text("a\n")
        os.chmod(tenant, 0)
    else:
        tenant.write_text(
            {
                "a": "a\n",
                "a-no-newline": "a",
                "a-crlf": "a\r\n",
                "empty": "",
                "whitespace": " \t \n",
                "blank-first-line": "\na\n",
                "too-long": "a" * 64 + "\n",  # a tenant name has at most 63 characters
                "star": "*\n",
                "invalid-name": "team a\n",
            }[case]
        )


def run_with_tenant_file(lab: Lab, tmp: Path, case: str) -> tuple[list[str], str]:
    """16 allocations of 60 MiB by a program claiming GPUOPS_TENANT=big, with the case's file."""
    stage = tmp / "stage"
    stage.mkdir()
    stage_tenant_file(stage, case)
    wrap = in_namespace(tmp, stage) + (NO_DAC if case == "unreadable" else [])
    out, err = lab.run("init", *["alloc", "60m"] * 16, wrap=wrap, timeout=20, tenant="big")
    return [a[0] for a in out["alloc"]], err


@pytest.mark.parametrize(
    ("case", "expected"),
    [("absent", BIG), ("a", A_ONLY), ("a-no-newline", A_ONLY), ("a-crlf", A_ONLY)],
)
def test_a_valid_tenant_file_decides_and_none_leaves_it_to_the_environment(
    namespaces: None, lab: Lab, tmp_path: Path, case: str, expected: list[str]
) -> None:
    lab.table(*TABLE)
    results, err = run_with_tenant_file(lab, tmp_path, case)
    assert results == expected, err
    assert "failing closed" not in err, err


BROKEN = [
    "empty",
    "whitespace",
    "blank-first-line",
    "directory",
    "dangling-link",
    "link",
    "unreadable",
    "too-long",
    "star",
    "invalid-name",
    "fifo",
]


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_tenant_file_fails_closed_not_to_the_environment(
    namespaces: None, lab: Lab, tmp_path: Path, case: str
) -> None:
    """GPUOPS_TENANT=big names a team with 900 MiB, and `tenant *` gives 200 MiB: a program whose
    tenant file is there but says no valid name gets neither, only the closed default."""
    lab.table(*TABLE)
    results, err = run_with_tenant_file(lab, tmp_path, case)
    assert results == CLOSED, f"{case}: {results}\n{err}"
    assert TENANT_FILE in err and "failing closed" in err, err
    assert err.count("failing closed") == 1, err  # said once, not per call
    assert lab.fake.used_memory() == 0
    (snap,) = [s for _, s, _ in limiter.read_regions(lab.dir) if s is not None]
    (t,) = snap.tenants
    assert t.name not in ("big", "a", "default", "*"), t.name  # no listed team's entry
    assert (t.memory_limit, t.memory_capped) == (0, True)
    assert (t.compute_percent, t.policy, t.klass) == (1.0, "fixed-share", "offline")
