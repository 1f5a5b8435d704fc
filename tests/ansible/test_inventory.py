"""`gpuops inventory -f fleet.yaml`: a real `python -m gpuops` run, read back by Ansible's own
`ansible-inventory` (the YAML file, and the `--list`/`--host` JSON through a dynamic inventory
script), so what Ansible sees is checked, not only what we print."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ansible.helpers import ROOT, ansible_env, ansible_tool

FLEET = """\
version: 1
ssh:
  user: ops
  identity_file: keys/id_ed25519
  known_hosts: known_hosts
jump_hosts:
  bastion: {host: 127.0.0.1, port: 2201, user: jump}
agent:
  backend: sim
  prefix: /srv/gpuops
teams:
  vision: {users: [alice]}
  nlp-x: {users: [bob]}
nodes:
  - {name: gpu-a, host: 127.0.0.1, port: 2200, owner: vision}
  - name: gpu-b
    host: 10.0.0.2
    gpus: {"0": nlp-x, "1": vision}
    ssh: {jump_host: bastion}
    agent: {python: /usr/bin/python3.11, sim_spec: idle-silo}
  - {name: gpu-c, host: 10.0.0.3, ssh: {jump_host: "root@10.0.0.9:22", known_hosts: kh2}}
"""


def gpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(name="fleet")
def fleet_fixture(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def ansible_view(inventory: Path, tmp_path: Path) -> dict[str, Any]:
    r = subprocess.run(
        [ansible_tool("ansible-inventory"), "-i", str(inventory), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ansible_env(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert "[WARNING]" not in r.stderr, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_yaml_inventory_as_ansible_reads_it(fleet: Path, tmp_path: Path) -> None:
    r = gpuops("inventory", "-f", str(fleet), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "hosts.yml").write_text(r.stdout)
    seen = ansible_view(tmp_path / "hosts.yml", tmp_path)
    hostvars = seen["_meta"]["hostvars"]
    assert sorted(seen["gpuops_nodes"]["hosts"]) == ["gpu-a", "gpu-b", "gpu-c"]
    # Teams as groups: the node's owner and every per-GPU owner; '-' is not a group character.
    assert sorted(seen["team_vision"]["hosts"]) == ["gpu-a", "gpu-b"]
    assert seen["team_nlp_x"]["hosts"] == ["gpu-b"]
    a = hostvars["gpu-a"]
    assert (a["ansible_host"], a["ansible_port"], a["ansible_user"]) == ("127.0.0.1", 2200, "ops")
    assert a["ansible_ssh_private_key_file"] == str(tmp_path / "keys" / "id_ed25519")
    assert (a["gpuops_prefix"], a["gpuops_backend"]) == ("/srv/gpuops", "sim")
    assert "ansible_python_interpreter" not in a
    args = shlex.split(a["ansible_ssh_common_args"])
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in args
    assert "StrictHostKeyChecking=yes" in args
    assert not any(x.startswith(("ProxyJump", "ProxyCommand")) for x in args)
    b = hostvars["gpu-b"]
    assert "ansible_port" not in b
    assert b["ansible_python_interpreter"] == "/usr/bin/python3.11"
    assert b["gpuops_sim_spec"] == "idle-silo"
    # The jump hop carries the fleet's key and known_hosts, which ProxyJump would not pass on.
    (proxy,) = [x for x in shlex.split(b["ansible_ssh_common_args"]) if x.startswith("ProxyCommand=")]
    jump = shlex.split(proxy.removeprefix("ProxyCommand="))
    assert jump[0] == "ssh" and jump[-2:] == ["--", "127.0.0.1"]
    assert jump[jump.index("-p") : jump.index("-p") + 2] == ["-p", "2201"]
    assert jump[jump.index("-l") : jump.index("-l") + 2] == ["-l", "jump"]
    assert jump[jump.index("-W") : jump.index("-W") + 2] == ["-W", "%h:%p"]
    assert str(tmp_path / "keys" / "id_ed25519") in jump
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in jump


def test_dynamic_inventory_list_and_host(fleet: Path, tmp_path: Path) -> None:
    # A dynamic inventory is an executable that answers --list and --host NAME.
    script = tmp_path / "fleet_inventory.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m gpuops inventory "
        f'-f {shlex.quote(str(fleet))} "$@"\n'
    )
    script.chmod(0o755)
    seen = ansible_view(script, tmp_path)
    r = gpuops("inventory", "-f", str(fleet), cwd=tmp_path)
    (tmp_path / "hosts.yml").write_text(r.stdout)
    assert seen == ansible_view(tmp_path / "hosts.yml", tmp_path)

    one = gpuops("inventory", "-f", str(fleet), "--host", "gpu-c", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    hostvars = json.loads(one.stdout)
    assert hostvars == seen["_meta"]["hostvars"]["gpu-c"]
    args = shlex.split(hostvars["ansible_ssh_common_args"])
    (proxy,) = [x for x in args if x.startswith("ProxyCommand=")]
    assert shlex.split(proxy.removeprefix("ProxyCommand="))[-1] == "10.0.0.9"
    assert f"UserKnownHostsFile={tmp_path / 'kh2'}" in args


def test_unknown_host_and_bad_options(fleet: Path, tmp_path: Path) -> None:
    r = gpuops("inventory", "-f", str(fleet), "--host", "nope", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.strip() == f"error: {fleet}: no node named 'nope'"
    r = gpuops("inventory", "-f", str(fleet), "--list", "--host", "gpu-a", cwd=tmp_path)
    assert r.returncode == 2 and "either --list or --host" in r.stderr
    (tmp_path / "bad.yaml").write_text(FLEET.replace("port: 2200", "port: 99999"))
    r = gpuops("inventory", "-f", str(tmp_path / "bad.yaml"), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "bad.yaml:" in r.stderr and "99999" in r.stderr


def test_teams_that_would_share_a_group_are_refused(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("  nlp-x: {users: [bob]}\n", "  nlp-x: {users: [bob]}\n  nlp_x: {}\n"))
    r = gpuops("inventory", "-f", str(fleet), cwd=tmp_path)
    assert (r.returncode, r.stdout) == (1, "")
    assert "'nlp-x' and 'nlp_x' would both be the Ansible group 'team_nlp_x'" in r.stderr
    assert r.stderr.count("\n") == 1
