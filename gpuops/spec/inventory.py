"""An Ansible inventory from fleet.yaml, so that fleet.yaml stays the one list of nodes.

`gpuops inventory -f fleet.yaml` writes it (YAML, or `--list`/`--host` JSON as a dynamic
inventory script answers). Every node is in the group `gpuops_nodes` (what ansible/bootstrap.yml
runs on) and in `team_<name>` for each team that owns it or one of its GPUs. Host variables
carry how fleet.yaml reaches the node, so Ansible connects the way gpuops does:

- `ansible_host`, `ansible_port`, `ansible_user`, `ansible_ssh_private_key_file`;
- `ansible_ssh_common_args`: known_hosts and the host-key policy (strict is
  `StrictHostKeyChecking=yes`, accept-new the same word), the connect timeout, keepalives,
  `-F /dev/null` when `use_ssh_config: false`, and the jump host. A jump host is `ProxyJump` when
  nothing of the fleet's has to reach the jump's own connection; with a key, a known_hosts file, a
  policy or `use_ssh_config: false` it is a `ProxyCommand` running `ssh -W` with those options,
  because OpenSSH hands no `-o` option to the connection ProxyJump opens;
- `ansible_python_interpreter` when fleet.yaml names a Python for the node (`agent.python`);
- `gpuops_prefix`, `gpuops_backend`, `gpuops_sim_spec`: the node side as fleet.yaml starts it.

Ansible templates the variables an inventory gives, and a template can run commands on the
operator machine (`lookup('pipe', ...)`). Every string written here is marked as data, never a
template, whatever field it comes from: `!unsafe` in the YAML inventory, `{"__ansible_unsafe": ...}`
in the `--list`/`--host` JSON (the form Ansible's script inventory reads as unsafe). Validation
keeps template syntax out of fleet.yaml's file paths in the first place (spec/types.py); this is
the second wall, for whatever field a later change adds.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from ruamel.yaml.comments import TaggedScalar

from gpuops.spec.model import DEFAULT_PYTHON, Fleet, JumpSettings, NodeEntry, SshSettings

ALL_NODES = "gpuops_nodes"
_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class InventoryError(ValueError):
    """fleet.yaml cannot be written as an inventory (one line, says where)."""


def team_group(team: str) -> str:
    """The Ansible group of a team: `team_` and the name with what Ansible refuses in group
    names (anything but letters, digits and `_`) as `_`."""
    return "team_" + _GROUP_UNSAFE.sub("_", team)


def _policy(ssh: SshSettings) -> str:
    return "yes" if ssh.host_key_policy == "strict" else "accept-new"


def _hop_options(ssh: SshSettings, identity: str | None) -> list[str]:
    """The options a hop needs to be checked and logged into as gpuops would."""
    args: list[str] = []
    if not ssh.use_ssh_config:
        args += ["-F", "/dev/null"]
    if identity:
        args += ["-i", identity]
    if ssh.known_hosts:
        args += ["-o", f"UserKnownHostsFile={ssh.known_hosts}"]
    args += ["-o", f"StrictHostKeyChecking={_policy(ssh)}"]
    return args


def _jump_args(ssh: SshSettings, jump: JumpSettings) -> list[str]:
    # A jump without a key of its own is offered the node's, as gpuops and OpenSSH do.
    identity = jump.identity_file or ssh.identity_file
    plain = ssh.use_ssh_config and not identity and not ssh.known_hosts and ssh.host_key_policy == "strict"
    host = f"[{jump.host}]" if ":" in jump.host else jump.host
    if plain:
        spec = (f"{jump.user}@" if jump.user else "") + host
        return ["-o", f"ProxyJump={spec}:{jump.port}" if jump.port is not None else f"ProxyJump={spec}"]
    argv = ["ssh", *_hop_options(ssh, identity), "-W", "%h:%p"]
    if jump.port is not None:
        argv += ["-p", str(jump.port)]
    if jump.user:
        argv += ["-l", jump.user]
    argv += ["--", jump.host]
    return ["-o", "ProxyCommand=" + shlex.join(argv)]


def host_vars(fleet: Fleet, node: NodeEntry) -> dict[str, Any]:
    """The Ansible variables of one node."""
    try:
        ssh = fleet.ssh_settings(node)
    except KeyError as exc:  # a jump_host name that jump_hosts does not define
        raise InventoryError(f"node {node.name!r}: {exc.args[0]}") from None
    agent = fleet.agent_settings(node)
    out: dict[str, Any] = {"ansible_host": ssh.host}
    if ssh.port is not None:
        out["ansible_port"] = ssh.port
    if ssh.user:
        out["ansible_user"] = ssh.user
    if ssh.identity_file:
        out["ansible_ssh_private_key_file"] = ssh.identity_file
    args = [*_hop_options(ssh, None), "-o", f"ConnectTimeout={max(1, math.ceil(ssh.connect_timeout))}"]
    if ssh.keepalive_interval > 0:
        args += ["-o", f"ServerAliveInterval={max(1, math.ceil(ssh.keepalive_interval))}"]
    if ssh.jump is not None:
        args += _jump_args(ssh, ssh.jump)
    out["ansible_ssh_common_args"] = shlex.join(args)
    if agent.python != DEFAULT_PYTHON:
        out["ansible_python_interpreter"] = agent.python
    out["gpuops_prefix"] = agent.prefix
    out["gpuops_backend"] = agent.backend
    if agent.sim_spec:
        out["gpuops_sim_spec"] = agent.sim_spec
    return out


def _teams_of(fleet: Fleet, node: NodeEntry) -> list[str]:
    teams = {t for t in (node.owner, *fleet.gpu_owners(node).values()) if t}
    return sorted(teams)


def _groups(fleet: Fleet) -> dict[str, list[str]]:
    """Team groups and their hosts, in file order; refuses two teams that land in one group."""
    groups: dict[str, list[str]] = {}
    named: dict[str, str] = {}
    for team in fleet.teams:
        group = team_group(team)
        if group in named:
            raise InventoryError(
                f"teams {named[group]!r} and {team!r} would both be the Ansible group {group!r}: "
                "rename one (Ansible group names hold letters, digits and _ only)"
            )
        named[group] = team
        groups[group] = []
    for node in fleet.nodes:
        for team in _teams_of(fleet, node):
            group = team_group(team)
            if named.get(group, team) != team:
                raise InventoryError(
                    f"node {node.name!r}: team {team!r} would be the Ansible group {group!r} of "
                    f"team {named[group]!r}: rename one"
                )
            named[group] = team
            groups.setdefault(group, []).append(node.name)
    return groups


def _unsafe_yaml(value: Any) -> Any:
    """A host variable for the YAML inventory: strings tagged `!unsafe` (data, never a template)."""
    return TaggedScalar(value, style='"', tag="!unsafe") if isinstance(value, str) else value


def _unsafe_json(value: Any) -> Any:
    """A host variable for the JSON inventory: strings as `{"__ansible_unsafe": ...}`."""
    return {"__ansible_unsafe": value} if isinstance(value, str) else value


def inventory(fleet: Fleet) -> dict[str, Any]:
    """The YAML inventory: `all:` with `gpuops_nodes` (hosts and their variables) and the teams."""
    nodes = {
        node.name: {key: _unsafe_yaml(value) for key, value in host_vars(fleet, node).items()}
        for node in fleet.nodes
    }
    children: dict[str, Any] = {ALL_NODES: {"hosts": nodes}}
    for group, hosts in _groups(fleet).items():
        children[group] = {"hosts": {name: None for name in hosts}}
    return {"all": {"children": children}}


def dynamic_list(fleet: Fleet) -> dict[str, Any]:
    """`--list`: what a dynamic inventory script prints (groups, and `_meta.hostvars`)."""
    hostvars = {node.name: dynamic_host(fleet, node.name) for node in fleet.nodes}
    groups = _groups(fleet)
    out: dict[str, Any] = {
        "_meta": {"hostvars": hostvars},
        "all": {"children": ["ungrouped", ALL_NODES, *groups]},
        ALL_NODES: {"hosts": list(hostvars)},
    }
    for group, hosts in groups.items():
        out[group] = {"hosts": hosts}
    return out


def dynamic_host(fleet: Fleet, name: str) -> dict[str, Any]:
    """`--host NAME`: one node's variables; KeyError names a node fleet.yaml does not have."""
    return {key: _unsafe_json(value) for key, value in host_vars(fleet, fleet.node(name)).items()}
