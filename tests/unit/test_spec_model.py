# ruff: noqa: E501  (the expected error lines are long by nature)
"""What the layers above ask of a loaded fleet: resolved SSH and agent settings, owners, teams,
selectors; the example file; the JSON Schema."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuops.spec import (
    AgentSettings,
    Fleet,
    JumpSettings,
    SelectorError,
    SpecError,
    SshSettings,
    check_fleet,
    fleet_from_data,
    fleet_json_schema,
    load_fleet,
    parse_fleet,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"

FLEET = textwrap.dedent(
    """\
    version: 1
    interval: 2s
    ssh:
      user: gpuops
      identity_file: /keys/id
      host_key_policy: accept-new
      connect_timeout: 5s
      jump_host: bastion
      max_handshakes: 16
    agent:
      python: /usr/bin/python3
    jump_hosts:
      bastion: {host: bastion.example.com, port: 2222, user: ops, identity_file: /keys/jump}
    teams:
      vision: {users: [alice, bob], groups: [cv]}
      nlp: {users: [carol], groups: [nlp, shared]}
    nodes:
      - name: a1
        host: 10.0.0.1
        labels: {zone: a, rack: r1}
        owner: vision
        gpus: {"4-5": nlp, "7": nlp}
      - name: a2
        host: 10.0.0.2
        port: 2200
        user: root
        labels: {zone: a, rack: r2}
        ssh: {jump_host: none, login_timeout: 1m, use_ssh_config: false}
        agent: {mode: push, backend: sim, sim_spec: idle-silo}
      - name: b1
        host: b1.example.com
        labels: {zone: b}
        owner: nlp
        ssh: {jump_host: "root@gw2:22"}
    """
)


@pytest.fixture
def fleet() -> Fleet:
    return parse_fleet(FLEET, "fleet.yaml")


def test_ssh_settings_merge_node_fleet_and_builtin_defaults(fleet: Fleet) -> None:
    assert fleet.ssh_settings("a1") == SshSettings(
        host="10.0.0.1",
        port=None,
        user="gpuops",
        identity_file="/keys/id",
        known_hosts=None,
        host_key_policy="accept-new",
        connect_timeout=5.0,
        login_timeout=20.0,
        keepalive_interval=15.0,
        use_ssh_config=True,
        jump=JumpSettings("bastion", "bastion.example.com", 2222, "ops", "/keys/jump"),
    )
    a2 = fleet.ssh_settings(fleet.nodes[1])
    assert (a2.port, a2.user, a2.jump, a2.login_timeout, a2.use_ssh_config) == (
        2200,
        "root",
        None,
        60.0,
        False,
    )
    assert a2.target == "root@10.0.0.2:2200" and a2.effective_port == 2200
    b1 = fleet.ssh_settings("b1")
    assert b1.jump == JumpSettings("root@gw2:22", "gw2", 22, "root", None)
    assert fleet.ssh_settings("a1").effective_port == 22
    assert fleet.ssh_settings("a1").target == "gpuops@10.0.0.1"


def test_builtin_defaults() -> None:
    fleet = parse_fleet("version: 1\nnodes: [{host: h}]\n")
    s = fleet.ssh_settings("h")
    assert (s.port, s.user, s.identity_file, s.known_hosts, s.jump) == (None, None, None, None, None)
    assert (
        s.host_key_policy,
        s.connect_timeout,
        s.login_timeout,
        s.keepalive_interval,
        s.use_ssh_config,
    ) == (
        "strict",
        10.0,
        20.0,
        15.0,
        True,
    )
    assert fleet.max_handshakes == 64 and fleet.interval == 1.0
    assert fleet.agent_settings("h") == AgentSettings(
        mode="auto", python="python3", backend="nvml", sim_spec=None
    )


def test_identity_file_tilde_is_expanded(fleet: Fleet) -> None:
    f = parse_fleet("version: 1\nssh: {identity_file: ~/.ssh/k, known_hosts: ~/kh}\nnodes: [{host: h}]\n")
    s = f.ssh_settings("h")
    assert s.identity_file == os.path.expanduser("~/.ssh/k") and s.known_hosts == os.path.expanduser("~/kh")


def test_agent_settings(fleet: Fleet) -> None:
    assert fleet.agent_settings("a1") == AgentSettings("auto", "/usr/bin/python3", "nvml", None)
    assert fleet.agent_settings("a2") == AgentSettings("push", "/usr/bin/python3", "sim", "idle-silo")


def test_fleet_wide_values(fleet: Fleet) -> None:
    assert fleet.max_handshakes == 16
    assert fleet.interval == 2.0


def test_owners(fleet: Fleet) -> None:
    assert fleet.node_owner("a1") == "vision"
    assert fleet.node_owner("a2") is None
    assert [fleet.gpu_owner("a1", i) for i in range(8)] == ["vision"] * 4 + ["nlp", "nlp", "vision", "nlp"]
    assert fleet.gpu_owner("a2", 0) is None
    assert fleet.gpu_owners("a1") == {4: "nlp", 5: "nlp", 7: "nlp"}
    assert fleet.gpu_owner(fleet.nodes[2], 3) == "nlp"


def test_team_of_user(fleet: Fleet) -> None:
    assert fleet.team_of_user("alice") == "vision"
    assert fleet.team_of_user("carol", groups=["cv"]) == "nlp"  # the user's own listing wins
    assert fleet.team_of_user("zed", groups=["users", "shared", "cv"]) == "nlp"  # first listed group
    assert fleet.team_of_user("zed", groups=["users"]) is None
    assert fleet.team_of_group("cv") == "vision"
    assert fleet.team_of_group("nope") is None


def test_unknown_node(fleet: Fleet) -> None:
    with pytest.raises(KeyError, match="no node named 'zz'"):
        fleet.ssh_settings("zz")
    assert fleet.node("a2").port == 2200


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("*", ["a1", "a2", "b1"]),
        ("a*", ["a1", "a2"]),
        ("a1,b1", ["a1", "b1"]),
        ("zone=a", ["a1", "a2"]),
        ("zone!=a", ["b1"]),
        ("zone=a,rack=r2", ["a2"]),
        ("a*,b*,zone=b", ["b1"]),
        ("rack=r*", ["a1", "a2"]),
        ("rack!=r1", ["a2", "b1"]),
        ("gpu-*", []),
        ("a[12]", ["a1", "a2"]),
    ],
)
def test_nodes_matching(fleet: Fleet, selector: str, names: list[str]) -> None:
    assert [n.name for n in fleet.nodes_matching(selector)] == names


def test_bad_selector(fleet: Fleet) -> None:
    with pytest.raises(SelectorError):
        fleet.nodes_matching("zone==a")


def test_models_are_frozen(fleet: Fleet) -> None:
    with pytest.raises(ValidationError):
        fleet.nodes[0].host = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        fleet.interval = 3.0  # type: ignore[misc]


def test_lookups_follow_a_modified_copy(fleet: Fleet) -> None:
    assert fleet.node_owner("a1") == "vision"
    moved = fleet.nodes[0].model_copy(update={"owner": "nlp", "gpus": {}})
    copy = fleet.model_copy(update={"nodes": [moved, *fleet.nodes[1:]]})
    assert copy.node_owner("a1") == "nlp" and copy.gpu_owner("a1", 4) == "nlp"
    assert fleet.node_owner("a1") == "vision" and fleet.gpu_owner("a1", 4) == "nlp"


def test_equality_ignores_the_lookup_cache(fleet: Fleet) -> None:
    other = parse_fleet(FLEET)
    fleet.node_owner("a1")
    assert fleet == other
    assert fleet != parse_fleet(FLEET.replace("interval: 2s", "interval: 3s"))


def test_fleet_from_data_checks_like_a_file() -> None:
    data = {"version": 1, "teams": {"a": {"users": ["u"]}, "b": {"users": ["u"]}}, "nodes": [{"host": "h"}]}
    with pytest.raises(SpecError) as info:
        fleet_from_data(data)
    assert str(info.value) == (
        "<data>: teams.b.users[0]: user 'u' is already in team 'a' (teams.a.users[0]); a user belongs to one team"
    )
    with pytest.raises(SpecError) as info:
        fleet_from_data({"version": 1, "nodes": [{"host": "h", 7: 1, (1, 2): 3}]}, "x")
    assert [str(e) for e in info.value.errors] == [
        "x: nodes[0]: a mapping key must be text, got a list",
        "x: nodes[0][\"7\"]: unknown key '7'; valid keys: name, host, port, user, labels, owner, gpus, ssh, agent",
    ]
    assert fleet_from_data({"version": 1, "nodes": ({"host": "h", "gpus": {0: "t"}},), "teams": {"t": None}})


def test_check_fleet_on_a_fleet_built_in_code() -> None:
    fleet = Fleet(version=1, nodes=[{"host": "h", "owner": "ghost"}])  # type: ignore[list-item]
    assert [str(i) for i in check_fleet(fleet)] == [
        "<fleet>: nodes[0].owner: no team named 'ghost'; define it under teams:"
    ]


def test_example_file_loads() -> None:
    fleet = load_fleet(EXAMPLE)
    assert len(fleet.nodes) == 8 and set(fleet.teams) == {"vision", "nlp", "recsys", "platform"}
    assert fleet.gpu_owner("dgx-b-01", 6) == "recsys" and fleet.gpu_owner("dgx-b-01", 0) == "nlp"
    assert fleet.ssh_settings("l40s-c-01").jump == JumpSettings(
        "dc2-bastion", "bastion.dc2.example.com", 2222, "ops", None
    )
    assert fleet.ssh_settings("l40s-c-01").connect_timeout == 20.0
    assert fleet.ssh_settings("sim-01").jump is None
    assert fleet.agent_settings("sim-01").backend == "sim"
    assert [n.name for n in fleet.nodes_matching("zone=dc2-*")] == ["l40s-c-01", "l40s-c-02"]
    assert fleet.node("dgx-b-02.dc1.example.com").owner == "nlp"


# ---- the JSON Schema ------------------------------------------------------------------------


def test_schema_describes_the_file() -> None:
    schema = fleet_json_schema()
    json.dumps(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "gpuops fleet.yaml"
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        "version",
        "interval",
        "ssh",
        "agent",
        "jump_hosts",
        "teams",
        "nodes",
        "carve",
        "attribution",
        "pools",
        "source",
    }
    assert schema["required"] == ["version", "nodes"]
    assert "^x-" in schema["patternProperties"]
    node = schema["$defs"]["NodeEntry"]
    assert node["required"] == ["host"] and node["additionalProperties"] is False
    ssh = schema["$defs"]["SshOptions"]["properties"]
    assert ssh["host_key_policy"]["anyOf"][0]["enum"] == ["strict", "accept-new"]
    durations = ssh["connect_timeout"]["anyOf"][0]["anyOf"]
    assert durations[0]["type"] == "string" and durations[1]["type"] == "number"
    assert "max_handshakes" in schema["$defs"]["SshDefaults"]["properties"]
    assert "max_handshakes" not in ssh
    # empty keys are allowed where a mapping of settings goes
    assert {"type": "null"} in schema["properties"]["ssh"]["anyOf"]
    assert all(
        "description" in spec
        for spec in ssh.values()
        if isinstance(spec, dict)  # every SSH option says what it does
    )
