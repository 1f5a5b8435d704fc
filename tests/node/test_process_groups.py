"""The unix groups and the cgroup of GPU processes, as the node reports them for attribution.

- the model field is optional: a process from an agent that does not send groups still decodes;
- the simulator's spec gives users groups, and its processes carry them;
- the NVML backend reads them from /proc/<pid>/status and /proc/<pid>/cgroup, through the real
  pynvml path against the fake libnvidia-ml.so.1 (a process started here with chosen groups when
  the tests run as root).
"""

from __future__ import annotations

import grp
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from gpuops.core.codec import DecodeError, from_json, to_json
from gpuops.core.model import GpuProcess, NodeSample
from gpuops.node.backends.nvml.processes import MAX_PROCESS_GROUPS, read_cgroup, read_gids
from gpuops.node.backends.sim import SimBackend
from gpuops.node.sim.spec import SpecError, parse_spec
from tests.fakes.nvml_fake import GiB, gpu, run_backend

# ---- the model and the codec ---------------------------------------------------------------------


def test_a_process_without_groups_still_decodes() -> None:
    old = {"pid": 7, "used_memory_bytes": 1024, "user": "alice", "command": "python", "tenant": None}
    process = from_json(GpuProcess, old)
    assert process.groups == () and process.cgroup == ""


def test_groups_and_cgroup_round_trip_and_are_checked() -> None:
    process = GpuProcess(7, 1024, "alice", groups=("alice", "cv-lab"), cgroup="/kubepods/pod1/c")
    assert from_json(GpuProcess, to_json(process)) == process
    with pytest.raises(DecodeError, match=r"GpuProcess\.groups\[1\]: expected a string"):
        from_json(GpuProcess, {"pid": 7, "used_memory_bytes": 0, "groups": ["a", 5]})
    with pytest.raises(DecodeError, match=r"GpuProcess\.cgroup: expected a string"):
        from_json(GpuProcess, {"pid": 7, "used_memory_bytes": 0, "cgroup": None})


# ---- the simulator ---------------------------------------------------------------------------------

SPEC: Dict[str, Any] = {
    "hostname": "sim-groups",
    "users": {"alice": 1001, "bob": 1002, "eve": 1003},
    "groups": {"cv-lab": ["alice", "bob"], "interns": ["bob"]},
    "tenants": {"vision": ["alice"]},
    "gpus": [{"model": "A100-SXM4-40GB", "count": 1, "owner": "vision"}],
    "workloads": [
        {"name": "a", "kind": "training", "user": "alice", "gpu": 0},
        {"name": "b", "kind": "training", "user": "bob", "gpu": 0},
        {"name": "e", "kind": "training", "user": "eve", "gpu": 0},
    ],
}


def test_sim_users_have_groups_and_their_processes_carry_them() -> None:
    spec = parse_spec(SPEC)
    assert spec.groups == {"cv-lab": ("alice", "bob"), "interns": ("bob",)}
    assert {w.user: w.groups for w in spec.workloads} == {
        "alice": ("cv-lab",),
        "bob": ("cv-lab", "interns"),
        "eve": (),
    }
    backend = SimBackend(spec=SPEC, clock=lambda: 1772409600.0)
    sample = backend.sample()
    got = {p.user: p.groups for p in sample.gpus[0].processes}
    assert got == {"alice": ("cv-lab",), "bob": ("cv-lab", "interns"), "eve": ()}
    # and through the codec, as the operator side gets them
    again = from_json(NodeSample, to_json(sample))
    assert {p.user: p.groups for p in again.gpus[0].processes} == got


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([], r"^groups: expected an object"),
        ({"cv lab": ["alice"]}, r"""^groups\["cv lab"\]: 'cv lab' is not a valid group name"""),
        ({"cv": ["mallory"]}, r"^groups\.cv\[0\]: unknown user 'mallory'"),
        ({"cv": ["alice", "alice"]}, r"^groups\.cv\[1\]: user 'alice' is listed twice"),
        ({"cv": "alice"}, r"^groups\.cv: expected a list"),
    ],
)
def test_sim_group_mistakes_are_located(groups: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({**SPEC, "groups": groups})


def test_a_spec_without_groups_is_unchanged() -> None:
    spec = parse_spec({k: v for k, v in SPEC.items() if k != "groups"})
    assert spec.groups == {} and all(w.groups == () for w in spec.workloads)


# ---- reading /proc ---------------------------------------------------------------------------------


def test_gids_primary_first_each_once(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Name:\tpython\nUid:\t1001\t1001\t1001\t1001\nGid:\t2000\t2000\t2000\t2000\n"
        "FDSize:\t64\nGroups:\t27 2000 100 27 \nNStgid:\t1\n"
    )
    assert read_gids(str(status)) == [2000, 27, 100]
    status.write_text("Name:\tx\nGid:\t5\t5\t5\t5\nGroups:\t\n")
    assert read_gids(str(status)) == [5]
    many = " ".join(str(g) for g in range(1000, 1100))
    status.write_text(f"Gid:\t5\t5\t5\t5\nGroups:\t{many}\n")
    assert len(read_gids(str(status))) == MAX_PROCESS_GROUPS
    status.write_text("Gid:\tfive\n")
    assert read_gids(str(status)) == []
    assert read_gids(str(tmp_path / "gone")) == []


POD = (
    "/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod0b5c7a35_2f8e_4a53_9c8e_1d2f3a4b5c6d.slice"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"0::{POD}/cri-containerd-abc.scope\n", f"{POD}/cri-containerd-abc.scope"),  # cgroup v2
        (  # v1: the first hierarchy that is not the root
            "12:pids:/\n11:memory:/kubepods/burstable/pod0b5c7a35-2f8e-4a53-9c8e-1d2f3a4b5c6d/abc\n"
            "10:cpu,cpuacct:/kubepods/burstable/pod0b5c7a35-2f8e-4a53-9c8e-1d2f3a4b5c6d/abc\n",
            "/kubepods/burstable/pod0b5c7a35-2f8e-4a53-9c8e-1d2f3a4b5c6d/abc",
        ),
        ("1:name=systemd:/user.slice\n0::/\n", "/user.slice"),  # hybrid, unified at the root
        ("0::/\n", "/"),
        ("garbage\n", ""),
        ("", ""),
    ],
)
def test_cgroup_paths(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "cgroup"
    path.write_text(text)
    assert read_cgroup(str(path)) == expected


def test_cgroup_of_a_process_that_is_gone(tmp_path: Path) -> None:
    assert read_cgroup(str(tmp_path / "gone")) == ""


# ---- the NVML backend through the fake libnvidia-ml ------------------------------------------------


def _name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _expected_groups(gid: int, groups: List[int]) -> tuple[str, ...]:
    out: List[str] = []
    for g in [gid, *groups]:
        if _name(g) not in out:
            out.append(_name(g))
    return tuple(out)


def _processes(pids: List[int]) -> Dict[int, GpuProcess]:
    config = {"devices": [gpu("A100-SXM4-40GB", 0, processes=[{"pid": p, "used_memory": GiB} for p in pids])]}
    init, smp = run_backend(config, (("sample",),))
    assert init.error is None, init.error
    sample: NodeSample = smp.decode(NodeSample)
    return {p.pid: p for p in sample.gpus[0].processes}


@pytest.mark.usefixtures("fake_nvml_library")
def test_nvml_processes_carry_their_groups_and_cgroup() -> None:
    me = os.getpid()
    got = _processes([me, 4_194_000])
    mine = got[me]
    assert mine.groups == _expected_groups(os.getgid(), os.getgroups())
    assert mine.cgroup == read_cgroup("/proc/self/cgroup")
    if not os.path.exists("/proc/4194000"):  # not in this PID namespace: unknown, not an error
        assert got[4_194_000].groups == () and got[4_194_000].cgroup == ""


@pytest.mark.usefixtures("fake_nvml_library")
@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process with other groups needs root")
def test_nvml_groups_of_a_process_with_other_groups() -> None:
    unnamed = next(g for g in range(60000, 61000) if _name(g) == str(g))
    named = next(g.gr_gid for g in grp.getgrall() if g.gr_gid not in (0, unnamed))
    child = subprocess.Popen(["sleep", "30"], group=unnamed, extra_groups=[named, 0])
    try:
        got = _processes([child.pid])
    finally:
        child.kill()
        child.wait()
    # the primary group first (a number: it has no name here), then the supplementary ones in the
    # kernel's order (setgroups sorts them)
    assert got[child.pid].groups == (str(unnamed), *(_name(g) for g in sorted([named, 0])))
