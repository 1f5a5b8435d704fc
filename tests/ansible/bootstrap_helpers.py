"""The pieces of a real `ansible-playbook ansible/bootstrap.yml` run against the test sshds: the
fleet.yaml, the inventory `gpuops inventory` makes of it, the variables that keep every path of
the install under a per-host temporary prefix, stand-ins for nvidia-smi, and the recap."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.ansible.helpers import PLAYBOOK, ROOT, ansible_env, ansible_tool
from tests.ansible.wheelhouse import fill

PLAY_TIMEOUT = 240
FAKE_MPS = ROOT / "tests" / "node" / "fake_nvidia_cuda_mps_control"
GPU0, GPU1 = "GPU-5f0b3b6e-0000-4000-8000-000000000000", "GPU-5f0b3b6e-0001-4000-8000-000000000001"
MIG1A, MIG1B = "MIG-7a1c9d2e-0000-4000-8000-00000000000a", "MIG-7a1c9d2e-0000-4000-8000-00000000000b"

# What nvidia-smi prints on a node with an A100 (MIG off) and an H100 with two MIG devices.
FAKE_SMI = f"""#!/bin/sh
case "$*" in
  *--query-gpu=*)
    echo "0, {GPU0}, NVIDIA A100-SXM4-40GB, 550.54.15, Disabled"
    echo "1, {GPU1}, NVIDIA H100 80GB HBM3, 550.54.15, Enabled" ;;
  -L)
    echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: {GPU0})"
    echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: {GPU1})"
    echo "  MIG 3g.40gb     Device  0: (UUID: {MIG1A})"
    echo "  MIG 3g.40gb     Device  1: (UUID: {MIG1B})" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""

_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def source_snapshot(dest: Path) -> Path:
    """The package as it is now: every run of a test builds the same wheel, whatever is edited
    in the checkout meanwhile."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "gpuops", dest / "gpuops", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def gpuops(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    # Wide enough that no table column is cut short.
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def make_inventory(fleet: Path, where: Path, host_vars: dict[str, dict[str, Any]]) -> Path:
    """hosts.yml from `gpuops inventory -f fleet.yaml`, with host_vars/ beside it."""
    r = gpuops("inventory", "-f", str(fleet))
    assert r.returncode == 0, r.stderr
    where.mkdir(parents=True, exist_ok=True)
    (where / "hosts.yml").write_text(r.stdout)
    shutil.rmtree(where / "host_vars", ignore_errors=True)
    (where / "host_vars").mkdir()
    for name, values in host_vars.items():
        (where / "host_vars" / f"{name}.yml").write_text(json.dumps(values))
    return where / "hosts.yml"


def play_vars(tmp_path: Path, src: Path, wheels: Path, user: str) -> dict[str, Any]:
    """Everything the play writes goes under the host's gpuops_prefix; no systemd, no sudo."""
    smi = write_executable(tmp_path / "nvidia-smi", FAKE_SMI)
    return {
        "gpuops_become": False,
        "gpuops_systemd_manage": False,
        "gpuops_node_source": str(src),
        "gpuops_node_wheelhouse": str(wheels),
        "gpuops_node_download": False,
        "gpuops_node_service_user": user,
        "gpuops_node_create_service_user": False,
        "gpuops_state_dir": "{{ gpuops_prefix }}/var/lib/gpuops",
        "gpuops_systemd_dir": "{{ gpuops_prefix }}/etc/systemd/system",
        "gpuops_tmpfiles_dir": "{{ gpuops_prefix }}/etc/tmpfiles.d",
        "gpuops_limiter_dir": "{{ gpuops_prefix }}/run/gpuops/limiter",
        "gpuops_limiter_lib_dir": "{{ gpuops_prefix }}/lib/gpuops",
        "gpuops_limiter_source": str(ROOT),
        "gpuops_limiter_preload": "system",
        "gpuops_limiter_preload_file": "{{ gpuops_prefix }}/etc/ld.so.preload",
        "gpuops_mps_enabled": True,
        "gpuops_mps_control": str(FAKE_MPS),
        "gpuops_mps_pipe_dir": "{{ gpuops_prefix }}/mps/pipe",
        "gpuops_mps_log_dir": "{{ gpuops_prefix }}/mps/log",
        "gpuops_facts_nvidia_smi": str(smi),
    }


def prepare(tmp_path: Path) -> tuple[Path, Path]:
    src = source_snapshot(tmp_path / "src")
    wheels = tmp_path / "wheels"
    fill(wheels)
    return src, wheels


def playbook(
    tmp_path: Path, inventory: Path, variables: dict[str, Any], *extra: str
) -> subprocess.CompletedProcess[str]:
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(variables))
    argv = [
        ansible_tool("ansible-playbook"),
        "-i",
        str(inventory),
        "-e",
        f"@{vars_file}",
        *extra,
        str(PLAYBOOK),
    ]
    started = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=PLAY_TIMEOUT, env=ansible_env(tmp_path))
    print(f"--- {shlex.join(argv[3:])}: rc {r.returncode} in {time.monotonic() - started:.1f}s")
    return r


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP per host: ok, changed, unreachable, failed."""
    tail = out[out.rindex("PLAY RECAP") :]
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in _RECAP.finditer(tail)
    }


def unit_command(unit: Path, instance: str = "") -> tuple[list[str], dict[str, str]]:
    """The ExecStart argv and Environment= of a rendered unit (%i: `instance`), as systemd
    would run it."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        line = line.replace("%i", instance)
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart="))
        elif line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value
    assert argv, f"{unit}: no ExecStart"
    return argv, env


def wait_metrics(address: str, expect: str = "gpuops_gpu_info{", timeout: float = 30) -> str:
    """/metrics once it holds `expect`: the exporter answers (empty) before its first sample."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as response:
                text = str(response.read().decode())
            if expect in text:
                return text
            last = f"no {expect} yet"
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"no {expect} on http://{address}/metrics within {timeout}s: {last}")


def agent_lines(argv: Sequence[str], requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests to an agent started by `argv` (stdin closed after them), its replies."""
    text = "".join(json.dumps({"v": 1, "id": i + 1, **r}) + "\n" for i, r in enumerate(requests))
    r = subprocess.run(list(argv), input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
