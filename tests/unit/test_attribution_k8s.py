"""The example plugin plugins/gpuops-attributor-k8s, installed for real: `pip install` of its
source into a directory that is then put on sys.path (in this process, and for a fresh
`python -m gpuops` process), so gpuops finds it through its dist-info's entry point exactly as an
operator's install would."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuops import attributors
from gpuops.core.model import GpuProcess
from gpuops.spec import Fleet, SpecError, parse_fleet
from gpuops.tenancy import AttributionChain, AttributionContext, available_attributors, load_attributor
from gpuops.tenancy import attribution as attribution_module
from gpuops.tenancy.ownership import Ownership

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "gpuops-attributor-k8s"

ML_PROD = "0b5c7a35-2f8e-4a53-9c8e-1d2f3a4b5c6d"
NLP = "7f1e2d3c-4b5a-4968-8776-655443322110"
STRAY = "11111111-2222-4333-8444-555555555555"  # in a namespace without a team
NEW = "99999999-8888-4777-8666-555555555555"  # started after the file was written


def systemd_cgroup(uid: str) -> str:
    u = uid.replace("-", "_")
    return (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-ab12.scope"
    )


def cgroupfs_cgroup(uid: str) -> str:
    return f"/kubepods/besteffort/pod{uid}/4f3c2b1a0e9d"


PODLIST = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {"metadata": {"uid": ML_PROD, "namespace": "ml-prod", "name": "trainer-0"}, "spec": {}},
        {"metadata": {"uid": NLP, "namespace": "nlp", "name": "bert-7d9f"}},
        {"metadata": {"uid": STRAY, "namespace": "sandbox", "name": "tmp"}},
    ],
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin built and installed by pip (from a copy: the build leaves files behind)."""
    work = tmp_path_factory.mktemp("k8s-plugin")
    source = work / "src"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(target.glob("gpuops_attributor_k8s-*.dist-info/entry_points.txt"))
    return target


@pytest.fixture
def plugin(installed: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.setattr(attribution_module, "_reported", set())
    attributors.refresh()
    yield installed
    attributors.refresh()


@pytest.fixture
def pods(tmp_path: Path) -> Path:
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(PODLIST))
    return path


def fleet_with(pods: Path | str, extra: str = "") -> Fleet:
    text = f"""\
version: 1
teams:
  vision: {{users: [alice]}}
  nlp: {{users: [bob]}}
nodes:
  - {{host: gpu-k8s-01, owner: vision}}
attribution:
  order: [limiter, kubernetes, user, group, owner]
  settings:
    kubernetes: {{pods: "{pods}", namespaces: {{ml-prod: vision}}{extra}}}
"""
    return parse_fleet(text, "fleet.yaml")


def proc(pid: int, cgroup: str = "", user: str = "root", **kw: Any) -> GpuProcess:
    return GpuProcess(pid, 1 << 30, user=user, cgroup=cgroup, **kw)


def test_found_through_its_entry_point(plugin: Path) -> None:
    assert "kubernetes" in available_attributors()
    from importlib import metadata

    (ep,) = [e for e in metadata.entry_points(group="gpuops.attributors") if e.name == "kubernetes"]
    assert ep.value == "gpuops_attributor_k8s:KubernetesAttributor"
    assert ep.dist is not None and ep.dist.name == "gpuops-attributor-k8s"
    assert ep.load().__name__ == "KubernetesAttributor"
    assert str(sys.modules[ep.module].__file__).startswith(str(plugin))  # the installed copy


@pytest.mark.usefixtures("plugin")
def test_pod_uid_from_either_cgroup_driver() -> None:
    from gpuops_attributor_k8s import pod_uid  # type: ignore[import-not-found]

    assert pod_uid(systemd_cgroup(ML_PROD)) == ML_PROD
    assert pod_uid(cgroupfs_cgroup(NLP)) == NLP
    assert pod_uid("/user.slice/user-1000.slice/session-3.scope") is None
    assert pod_uid("/system.slice/docker-0b5c7a352f8e4a539c8e1d2f3a4b5c6d.scope") is None
    assert pod_uid("") is None


def test_processes_count_for_their_pods_namespace_team(plugin: Path, pods: Path) -> None:
    own = Ownership.from_fleet(fleet_with(pods))
    assert own.chain is not None and own.chain.names == ("limiter", "kubernetes", "user", "group", "owner")
    assert own.tenant(proc(1, systemd_cgroup(ML_PROD), "bob"), "vision") == ("vision", "kubernetes")
    assert own.tenant(proc(2, cgroupfs_cgroup(NLP)), "vision") == ("nlp", "kubernetes")  # named like a team
    # what the plugin cannot place goes on down the chain
    assert own.tenant(proc(3, cgroupfs_cgroup(STRAY), "bob"), "vision") == ("nlp", "user")
    assert own.tenant(proc(4, cgroupfs_cgroup(NEW)), "vision") == ("vision", "owner")
    assert own.tenant(proc(5, "/user.slice", "eve"), None) == ("-", "none")
    # the limiter's label still comes first
    assert own.tenant(proc(6, cgroupfs_cgroup(NLP), tenant="vision"), None) == ("vision", "limiter")
    assert own.chain.problems == ()


def test_namespace_is_team_can_be_turned_off(plugin: Path, pods: Path) -> None:
    own = Ownership.from_fleet(fleet_with(pods, ", namespace_is_team: false"))
    assert own.tenant(proc(2, cgroupfs_cgroup(NLP)), "vision") == ("vision", "owner")


def test_a_flat_mapping_file_and_a_changed_file_is_read_again(plugin: Path, tmp_path: Path) -> None:
    path = tmp_path / "uids.json"
    path.write_text(json.dumps({ML_PROD: "ml-prod"}))
    k8s = load_attributor("kubernetes", {"pods": str(path), "namespaces": {"ml-prod": "vision", "x": "nlp"}})
    k8s.index.check_every = 0.0  # type: ignore[attr-defined]
    ctx = AttributionContext(teams=("vision", "nlp"))
    found = k8s.attribute(proc(1, cgroupfs_cgroup(ML_PROD)), ctx)
    assert found is not None and (found.team, found.source, found.detail) == (
        "vision",
        "kubernetes",
        "namespace ml-prod",
    )
    assert k8s.attribute(proc(2, cgroupfs_cgroup(NEW)), ctx) is None
    path.write_text(json.dumps({ML_PROD: "ml-prod", NEW: {"namespace": "x", "name": "late-pod"}}))
    found = k8s.attribute(proc(2, cgroupfs_cgroup(NEW)), ctx)
    assert found is not None and (found.team, found.detail) == ("nlp", "pod x/late-pod")


def test_a_missing_pods_file_is_reported_once_and_skipped(
    plugin: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = Ownership.from_fleet(fleet_with(tmp_path / "not-written-yet.json"))
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        for pid in range(5):
            assert own.tenant(proc(pid, systemd_cgroup(ML_PROD), "bob"), "vision") == ("nlp", "user")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "attributor 'kubernetes' failed (FileNotFoundError" in warnings[0]
    assert "not-written-yet.json" in warnings[0]


def test_bad_settings_are_reported_and_the_plugin_left_out(
    plugin: Path, pods: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        chain = AttributionChain.from_config(["kubernetes", "owner"], {"kubernetes": {"pod": str(pods)}})
    assert chain.names == ("owner",)
    assert (
        "attributor 'kubernetes' (gpuops_attributor_k8s:KubernetesAttributor) cannot be set up" in caplog.text
    )
    assert "unknown settings ['pod']" in caplog.text
    broken = pods.parent / "broken.json"
    broken.write_text('{"items": [{"metadata": {"namespace": "x"}}]}')
    chain = AttributionChain.from_config(["kubernetes"], {"kubernetes": {"pods": str(broken)}})
    assert chain.attribute(proc(1, cgroupfs_cgroup(NLP)), AttributionContext()).team == "-"
    assert "items[0].metadata needs uid and namespace" in "\n".join(chain.problems)


def test_fleet_yaml_naming_it_needs_it_installed(pods: Path) -> None:
    attributors.refresh()
    with pytest.raises(SpecError, match=r"attribution\.order\[1\]: unknown attributor 'kubernetes'"):
        fleet_with(pods)


def test_a_fresh_gpuops_process_finds_the_installed_plugin(
    installed: Path, pods: Path, tmp_path: Path
) -> None:
    text = f"""\
version: 1
teams: {{vision: {{users: [alice]}}}}
nodes: [{{host: gpu-k8s-01}}]
attribution: {{order: [kubernetes, user], settings: {{kubernetes: {{pods: "{pods}"}}}}}}
"""
    (tmp_path / "fleet.yaml").write_text(text)

    def validate(extra_path: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)}
        return subprocess.run(
            [sys.executable, "-m", "gpuops", "validate", "fleet.yaml"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
        )

    ok = validate(str(installed))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = validate("")
    assert missing.returncode == 1
    lines = missing.stderr.splitlines()
    assert lines[0].startswith("fleet.yaml:4:23: attribution.order[0]: unknown attributor 'kubernetes'"), (
        lines
    )
    assert "attribution.settings.kubernetes: unknown attributor 'kubernetes'" in lines[1], lines
