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
    data: dict[str, Any] = json.loads(r.stdout, object_hook=_as_data)
    return data


def _as_data(obj: dict[str, Any]) -> Any:
    """Ansible prints a string it holds as data (never templated) as `{"__ansible_unsafe": s}`:
    every string of the inventory gpuops writes is one (issue 26), read here as the string."""
    return obj["__ansible_unsafe"] if set(obj) == {"__ansible_unsafe"} else obj


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
    hostvars = json.loads(one.stdout, object_hook=_as_data)
    assert hostvars == seen["_meta"]["hostvars"]["gpu-c"]
    assert all(
        value == {"__ansible_unsafe": hostvars[key]}
        for key, value in json.loads(one.stdout).items()
        if isinstance(hostvars[key], str)
    )
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


# Issue 26 item 1: what gpuops writes into an inventory reaches Ansible as data, never as a template.


def _lookup(marker: Path) -> str:
    return "{{ lookup('pipe', 'touch " + str(marker) + "') }}"


def _run_ansible(inventory: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A real `ansible` run over the inventory whose debug task templates every variable of every
    host (`hostvars`), as a playbook's tasks and connections would. It runs with the local
    connection: the hosts' addresses carry the lookups too, and nothing is sent anywhere."""
    return subprocess.run(
        [
            ansible_tool("ansible"),
            *("-i", str(inventory), "gpuops_nodes", "-c", "local"),
            *("-m", "debug", "-a", "msg={{ hostvars[inventory_hostname] | to_json }}"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ansible_env(tmp_path),
    )


@pytest.mark.parametrize(
    ("original", "evil", "where"),
    [
        ("known_hosts: known_hosts", 'known_hosts: "/kh{}"', "evil.yaml:5:16: ssh.known_hosts:"),
        ("identity_file: keys/id_ed25519", 'identity_file: "k{}"', "evil.yaml:4:18: ssh.identity_file:"),
        ("user: jump}", 'user: jump, identity_file: "j{}"}', "evil.yaml:7:"),
        ("known_hosts: kh2}", 'known_hosts: "{}"}', "evil.yaml:21:"),
    ],
)
def test_template_syntax_in_a_path_is_refused_by_validate_and_inventory(
    original: str, evil: str, where: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    assert original in FLEET
    (tmp_path / "evil.yaml").write_text(FLEET.replace(original, evil.replace("{}", _lookup(marker))))
    for command in (
        ["validate", str(tmp_path / "evil.yaml")],
        ["inventory", "-f", str(tmp_path / "evil.yaml")],
    ):
        r = gpuops(*command, cwd=tmp_path)
        assert r.returncode == 1 and r.stdout == "", (command, r.stdout)
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert where in r.stderr and "must not hold template syntax" in r.stderr, r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("form", ["yaml", "list", "host"])
def test_every_string_in_an_inventory_reaches_ansible_as_data(form: str, tmp_path: Path) -> None:
    """Every string field gpuops writes carries a lookup (validation is what keeps them out of
    fleet.yaml; this checks the second wall, the writer): a real ansible run over the inventory
    runs none of them, and sees each value as written."""
    marker = tmp_path / "ran"
    (tmp_path / "fleet.yaml").write_text(FLEET)
    fleet = hostile_copy(tmp_path / "fleet.yaml", _lookup(marker))
    if form == "yaml":
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(render_inventory(fleet, "yaml"))
    else:
        data = tmp_path / "inventory.json"
        data.write_text(render_inventory(fleet, "list"))
        hosts = {name: render_inventory(fleet, "host", name) for name in ("gpu-a", "gpu-b", "gpu-c")}
        for name, text in hosts.items():
            (tmp_path / f"{name}.json").write_text(text)
        inventory = tmp_path / "inventory.sh"
        if form == "list":
            body = f'[ "$1" = --list ] && exec cat {shlex.quote(str(data))}\n'
        else:  # a script that leaves _meta out, so Ansible asks --host for each host
            stripped = json.loads(render_inventory(fleet, "list"))
            del stripped["_meta"]
            (tmp_path / "groups.json").write_text(json.dumps(stripped))
            body = (
                f'[ "$1" = --list ] && exec cat {shlex.quote(str(tmp_path / "groups.json"))}\n'
                f'exec cat {shlex.quote(str(tmp_path))}/"$2".json\n'
            )
        inventory.write_text("#!/bin/sh\n" + body)
        inventory.chmod(0o755)
    r = _run_ansible(inventory, tmp_path)
    assert not marker.exists(), "a lookup written into the inventory ran on the operator machine"
    seen = subprocess.run(
        [ansible_tool("ansible-inventory"), "-i", str(inventory), "--host", "gpu-b"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ansible_env(tmp_path),
    )
    assert seen.returncode == 0, seen.stderr
    assert not marker.exists()
    hostvars = json.loads(seen.stdout, object_hook=_as_data)
    # Each value as written, the lookup text included (the debug run above printed them too).
    assert hostvars["gpuops_prefix"].endswith(_lookup(marker))
    assert "UserKnownHostsFile=/kh" + _lookup(marker) in shlex.split(hostvars["ansible_ssh_common_args"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("touch " + str(marker)) >= 3, r.stdout  # each host's values, as data


def hostile_copy(path: Path, evil: str) -> Any:
    """fleet.yaml loaded, then every string that reaches the inventory given `evil` at its end,
    past validation (model_copy does not validate): host, user, key, known_hosts, the jump host's
    user and key, Python, prefix, backend, scenario."""
    from gpuops.spec.loader import load_fleet

    fleet = load_fleet(path)
    ssh = fleet.ssh.model_copy(
        update={"user": "ops" + evil, "identity_file": "/k" + evil, "known_hosts": "/kh" + evil}
    )
    agent = fleet.agent.model_copy(update={"prefix": "/srv" + evil, "backend": "sim" + evil})
    jumps = {
        name: jump.model_copy(update={"user": "j" + evil, "identity_file": "/j" + evil})
        for name, jump in fleet.jump_hosts.items()
    }
    nodes = []
    for node in fleet.nodes:
        # A jump literal is parsed again when settings are resolved: it stays a plain loopback one.
        node_ssh = node.ssh and node.ssh.model_copy(
            update={"jump_host": "root@127.0.0.1:1"}
            if node.ssh.jump_host and "@" in node.ssh.jump_host
            else {}
        )
        node_agent = (node.agent or type(fleet.agent)()).model_copy(
            update={"python": "/usr/bin/python3" + evil, "sim_spec": "idle" + evil}
        )
        nodes.append(
            node.model_copy(update={"host": "127.0.0.1" + evil, "agent": node_agent, "ssh": node_ssh})
        )
    copy = fleet.model_copy(update={"ssh": ssh, "agent": agent, "jump_hosts": jumps, "nodes": nodes})
    copy._index = None  # the node index is a cache of the nodes replaced above
    return copy


def render_inventory(fleet: Any, form: str, host: str | None = None) -> str:
    """The text `gpuops inventory` prints, from the same functions it calls."""
    from gpuops.spec.dump import dump_yaml
    from gpuops.spec.inventory import dynamic_host, dynamic_list, inventory

    if form == "yaml":
        return dump_yaml(inventory(fleet))
    if form == "list":
        return json.dumps(dynamic_list(fleet))
    assert host is not None
    return json.dumps(dynamic_host(fleet, host))
