# ruff: noqa: E501  (the expected error lines are long by nature)
"""Every validation rule of fleet.yaml, each with the exact line it prints (file:line:column)."""

from __future__ import annotations

import textwrap

import pytest

from gpuops.spec import SpecError, parse_fleet


def errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_fleet(textwrap.dedent(text), "f.yaml")
    lines = [str(e) for e in info.value.errors]
    assert str(info.value) == "\n".join(lines)
    return lines


def one_error(text: str) -> str:
    found = errors(text)
    assert len(found) == 1, found
    return found[0]


def ok(text: str) -> None:
    parse_fleet(textwrap.dedent(text), "f.yaml")


# (description, YAML, the one line it must print)
CASES = [
    (
        "port above range",
        """\
        version: 1
        nodes:
          - name: a
            host: 10.0.0.1
            port: 70000
        """,
        "f.yaml:5:11: nodes[0].port: must be between 1 and 65535 (got 70000)",
    ),
    (
        "port zero",
        """\
        version: 1
        nodes:
          - {name: a, host: h, port: 0}
        """,
        "f.yaml:3:30: nodes[0].port: must be between 1 and 65535 (got 0)",
    ),
    (
        "port as text",
        """\
        version: 1
        ssh: {port: ssh}
        nodes: []
        """,
        "f.yaml:2:13: ssh.port: expected a port number (got 'ssh')",
    ),
    (
        "port true",
        """\
        version: 1
        ssh: {port: true}
        nodes: []
        """,
        "f.yaml:2:13: ssh.port: expected a port number (got true)",
    ),
    (
        "duplicate node names",
        """\
        version: 1
        nodes:
          - name: a
            host: h1
          - name: a
            host: h2
        """,
        "f.yaml:5:11: nodes[1].name: duplicate node name 'a'; first used by nodes[0] at line 3",
    ),
    (
        "duplicate node names defaulted from host",
        """\
        version: 1
        nodes:
          - host: gpu1
          - host: gpu1
            port: 2222
        """,
        "f.yaml:4:11: nodes[1].host: duplicate node name 'gpu1'; first used by nodes[0] at line 3",
    ),
    (
        "duplicate host and port",
        """\
        version: 1
        nodes:
          - {name: a, host: 10.0.0.1}
          - {name: b, host: 10.0.0.1, port: 22}
        """,
        "f.yaml:4:21: nodes[1].host: 10.0.0.1:22 is already listed as nodes[0] at line 3; list each machine once",
    ),
    (
        "duplicate host case and trailing dot",
        """\
        version: 1
        ssh: {port: 2200}
        nodes:
          - {name: a, host: GPU1.example.com}
          - {name: b, host: gpu1.example.com.}
        """,
        "f.yaml:5:21: nodes[1].host: gpu1.example.com.:2200 is already listed as nodes[0] at line 4; "
        "list each machine once",
    ),
    (
        "duplicate IPv6 written two ways",
        """\
        version: 1
        nodes:
          - {name: a, host: "fd00::1"}
          - {name: b, host: "fd00:0:0::1"}
        """,
        "f.yaml:4:21: nodes[1].host: fd00:0:0::1:22 is already listed as nodes[0] at line 3; list each machine once",
    ),
    (
        "owner must be a team",
        """\
        version: 1
        teams:
          vision: {users: [alice]}
        nodes:
          - {name: a, host: h, owner: visoin}
        """,
        "f.yaml:5:31: nodes[0].owner: no team named 'visoin'; did you mean 'vision'?",
    ),
    (
        "owner without any teams",
        """\
        version: 1
        nodes:
          - {name: a, host: h, owner: vision}
        """,
        "f.yaml:3:31: nodes[0].owner: no team named 'vision'; define it under teams:",
    ),
    (
        "GPU owner must be a team",
        """\
        version: 1
        teams: {nlp: {}, vision: {}}
        nodes:
          - name: a
            host: h
            gpus:
              "0-3": robotics
        """,
        "f.yaml:7:14: nodes[0].gpus[\"0-3\"]: no team named 'robotics'; define it under teams: (teams: nlp, vision)",
    ),
    (
        "user in two teams",
        """\
        version: 1
        teams:
          vision:
            users: [alice, bob]
          nlp:
            users: [carol, bob]
        nodes: []
        """,
        "f.yaml:6:20: teams.nlp.users[1]: user 'bob' is already in team 'vision' (teams.vision.users[1] at line 4); "
        "a user belongs to one team",
    ),
    (
        "user twice in one team",
        """\
        version: 1
        teams:
          vision:
            users:
              - alice
              - alice
        nodes: []
        """,
        "f.yaml:6:9: teams.vision.users[1]: user 'alice' is listed twice; first at teams.vision.users[0] at line 5",
    ),
    (
        "group in two teams",
        """\
        version: 1
        teams:
          vision: {groups: [gpu]}
          nlp: {groups: [gpu]}
        nodes: []
        """,
        "f.yaml:4:18: teams.nlp.groups[0]: group 'gpu' is already in team 'vision' "
        "(teams.vision.groups[0] at line 3); a group belongs to one team",
    ),
    (
        "overlapping GPU ranges",
        """\
        version: 1
        teams: {a: {}, b: {}}
        nodes:
          - name: n
            host: h
            gpus:
              "0-3": a
              "3,4": b
        """,
        "f.yaml:8:7: nodes[0].gpus[\"3,4\"]: GPU 3 is already given an owner by '0-3' "
        '(nodes[0].gpus["0-3"] at line 7); each GPU may appear in one key',
    ),
    (
        "GPU range backwards",
        """\
        version: 1
        teams: {a: {}}
        nodes:
          - {name: n, host: h, gpus: {"5-2": a}}
        """,
        "f.yaml:4:31: nodes[0].gpus[\"5-2\"]: range '5-2' runs backwards (write 2-5); "
        "GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to 255)",
    ),
    (
        "GPU range malformed",
        """\
        version: 1
        teams: {a: {}}
        nodes:
          - {name: n, host: h, gpus: {"0-": a}}
        """,
        "f.yaml:4:31: nodes[0].gpus[\"0-\"]: '0-' is not a GPU index or range such as 0-3; "
        "GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to 255)",
    ),
    (
        "GPU index too large",
        """\
        version: 1
        teams: {a: {}}
        nodes:
          - {name: n, host: h, gpus: {"0-99999": a}}
        """,
        'f.yaml:4:31: nodes[0].gpus["0-99999"]: GPU index 99999 is out of range (0 to 255); '
        "GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to 255)",
    ),
    (
        "GPU listed twice in one key",
        """\
        version: 1
        teams: {a: {}}
        nodes:
          - {name: n, host: h, gpus: {"1,0-2": a}}
        """,
        "f.yaml:4:31: nodes[0].gpus[\"1,0-2\"]: GPU 1 is listed twice in '1,0-2'; "
        "GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to 255)",
    ),
    (
        "jump host must exist",
        """\
        version: 1
        jump_hosts:
          bastion: {host: b.example.com}
        ssh:
          jump_host: bastoin
        nodes: []
        """,
        "f.yaml:5:14: ssh.jump_host: no jump host named 'bastoin'; did you mean 'bastion'?",
    ),
    (
        "node jump host must exist",
        """\
        version: 1
        nodes:
          - {name: a, host: h, ssh: {jump_host: gw}}
        """,
        "f.yaml:3:41: nodes[0].ssh.jump_host: no jump host named 'gw'; "
        "define it under jump_hosts:, or write user@host:port (or none)",
    ),
    (
        "jump host literal with a bad port",
        """\
        version: 1
        ssh: {jump_host: "ops@gw:99999"}
        nodes: []
        """,
        "f.yaml:2:18: ssh.jump_host: must be between 1 and 65535 (got 99999)",
    ),
    (
        "jump host literal with an option",
        """\
        version: 1
        ssh: {jump_host: "ops@-oProxyCommand=x:22"}
        nodes: []
        """,
        "f.yaml:2:18: ssh.jump_host: host must not start with '-' (got '-oProxyCommand=x')",
    ),
    (
        "jump host chains",
        """\
        version: 1
        jump_hosts:
          gw: {host: g, jump_host: outer}
        nodes: []
        """,
        "f.yaml:3:17: jump_hosts.gw.jump_host: unknown key 'jump_host'; one hop only in fleet.yaml; "
        "for chains use ProxyJump in ~/.ssh/config",
    ),
    (
        "jump host name 'none' is reserved",
        """\
        version: 1
        jump_hosts:
          none: {host: gw}
        nodes: []
        """,
        "f.yaml:3:3: jump_hosts.none: 'none' is reserved and cannot be a jump host name",
    ),
    (
        "host with whitespace",
        """\
        version: 1
        nodes:
          - {name: a, host: "gpu 1"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not contain whitespace (got 'gpu 1')",
    ),
    (
        "host that would be an ssh option",
        """\
        version: 1
        nodes:
          - {name: a, host: "-oProxyCommand=touch /tmp/x"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not start with '-' (got '-oProxyCommand=touch /tmp/x')",
    ),
    (
        "host with shell metacharacters",
        """\
        version: 1
        nodes:
          - {name: a, host: "gpu1;reboot"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not contain ';' (got 'gpu1;reboot'); "
        "a host is a DNS name, an ~/.ssh/config Host alias or an IP address",
    ),
    (
        "host with command substitution",
        """\
        version: 1
        nodes:
          - {name: a, host: "$(reboot)"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not contain '$' '(' ')' (got '$(reboot)'); "
        "a host is a DNS name, an ~/.ssh/config Host alias or an IP address",
    ),
    (
        "host with a user",
        """\
        version: 1
        nodes:
          - {name: a, host: "root@gpu1"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not contain '@' (got 'root@gpu1'); put the user in user:",
    ),
    (
        "host with a port",
        """\
        version: 1
        nodes:
          - {name: a, host: "gpu1:2222"}
        """,
        "f.yaml:3:21: nodes[0].host: host must not contain a port (got 'gpu1:2222'); put it in port:",
    ),
    (
        "bad IPv4",
        """\
        version: 1
        nodes:
          - {name: a, host: 10.0.0.256}
        """,
        "f.yaml:3:21: nodes[0].host: not a valid IPv4 address (got '10.0.0.256')",
    ),
    (
        "bracketed IPv6",
        """\
        version: 1
        nodes:
          - {name: a, host: "[fd00::1]"}
        """,
        "f.yaml:3:21: nodes[0].host: write IPv6 addresses without brackets (got '[fd00::1]'); e.g. host: fd00::11",
    ),
    (
        "host label too long",
        f"""\
        version: 1
        nodes:
          - {{name: a, host: {"x" * 64}.example.com}}
        """,
        f"f.yaml:3:21: nodes[0].host: not a valid host name (got '{'x' * 57}...'); "
        "use letters, digits, '-', '_' and '.', at most 63 characters between dots",
    ),
    (
        "host is a number",
        """\
        version: 1
        nodes:
          - {name: a, host: 12}
        """,
        'f.yaml:3:21: nodes[0].host: expected a host name or IP address (got 12); quote it if you mean the text: "12"',
    ),
    (
        "IPv6 host needs a name",
        """\
        version: 1
        nodes:
          - host: "fd00::1"
        """,
        "f.yaml:3:5: nodes[0]: missing required key 'name'; "
        "a node needs a name when its host is not usable as one (an IPv6 address)",
    ),
    (
        "user name starting with a dash",
        """\
        version: 1
        nodes:
          - {name: a, host: h, user: -root}
        """,
        "f.yaml:3:30: nodes[0].user: user name must not start with '-' (got '-root')",
    ),
    (
        "user name with a space",
        """\
        version: 1
        ssh: {user: "john doe"}
        nodes: []
        """,
        "f.yaml:2:13: ssh.user: user name must not contain whitespace (got 'john doe')",
    ),
    (
        "user name with a shell character",
        """\
        version: 1
        teams: {a: {users: ["bob;id"]}}
        nodes: []
        """,
        "f.yaml:2:21: teams.a.users[0]: not a valid user name (got 'bob;id'); "
        "start with a letter or '_', then letters, digits, '_', '.' or '-'; at most 32 characters",
    ),
    (
        "numeric user id",
        """\
        version: 1
        teams: {a: {users: [1001]}}
        nodes: []
        """,
        "f.yaml:2:21: teams.a.users[0]: expected a user name (got 1001); names, not numeric ids",
    ),
    (
        "group name too long",
        f"""\
        version: 1
        teams: {{a: {{groups: [{"g" * 33}]}}}}
        nodes: []
        """,
        "f.yaml:2:22: teams.a.groups[0]: not a valid group name (got '" + "g" * 33 + "'); "
        "start with a letter or '_', then letters, digits, '_', '.' or '-'; at most 32 characters",
    ),
    (
        "team name",
        """\
        version: 1
        teams:
          "vision team": {}
        nodes: []
        """,
        "f.yaml:3:3: teams[\"vision team\"]: team name must not contain whitespace (got 'vision team')",
    ),
    (
        "node name",
        """\
        version: 1
        nodes:
          - {name: "gpu/1", host: h}
        """,
        "f.yaml:3:12: nodes[0].name: not a valid node name (got 'gpu/1'); "
        "start with a letter or digit, then letters, digits, '_', '.' or '-'; at most 63 characters",
    ),
    (
        "label key",
        """\
        version: 1
        nodes:
          - name: a
            host: h
            labels:
              "rack id": r1
        """,
        "f.yaml:6:7: nodes[0].labels[\"rack id\"]: not a valid label name (got 'rack id'); as Kubernetes: "
        "[prefix/]name, name up to 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit",
    ),
    (
        "label value",
        """\
        version: 1
        nodes:
          - name: a
            host: h
            labels:
              rack: "r1;x"
        """,
        "f.yaml:6:13: nodes[0].labels.rack: not a valid label value (got 'r1;x'); "
        "up to 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit",
    ),
    (
        "label value that YAML reads as a boolean",
        """\
        version: 1
        nodes:
          - {name: a, host: h, labels: {gpu: true}}
        """,
        'f.yaml:3:38: nodes[0].labels.gpu: expected a label value (got true); quote it if you mean the text: "true"',
    ),
    (
        "unknown top-level key",
        """\
        version: 1
        node: []
        nodes: []
        """,
        "f.yaml:2:1: node: unknown key 'node'; did you mean 'nodes'?",
    ),
    (
        "unknown key without a close match",
        """\
        version: 1
        nodes: []
        frobnicate: 1
        """,
        "f.yaml:3:1: frobnicate: unknown key 'frobnicate'; valid keys: version, interval, ssh, agent, "
        "jump_hosts, teams, nodes, carve, attribution, pools, source",
    ),
    (
        "unknown ssh key",
        """\
        version: 1
        ssh:
          identity_fle: ~/.ssh/id
        nodes: []
        """,
        "f.yaml:3:3: ssh.identity_fle: unknown key 'identity_fle'; did you mean 'identity_file'?",
    ),
    (
        "ssh option directly on a node",
        """\
        version: 1
        nodes:
          - name: a
            host: h
            jump_host: none
        """,
        "f.yaml:5:5: nodes[0].jump_host: unknown key 'jump_host'; SSH settings of a node go under its ssh: "
        "(nodes[0].ssh.jump_host)",
    ),
    (
        "agent option directly on a node",
        """\
        version: 1
        nodes:
          - name: a
            host: h
            backend: sim
        """,
        "f.yaml:5:5: nodes[0].backend: unknown key 'backend'; agent settings of a node go under its agent: "
        "(nodes[0].agent.backend)",
    ),
    (
        "fleet-wide ssh key on a node",
        """\
        version: 1
        nodes:
          - {name: a, host: h, ssh: {max_handshakes: 8}}
        """,
        "f.yaml:3:30: nodes[0].ssh.max_handshakes: unknown key 'max_handshakes'; "
        "max_handshakes is fleet-wide: set it in the top-level ssh:",
    ),
    (
        "node key at the top level",
        """\
        version: 1
        host: h
        nodes: []
        """,
        "f.yaml:2:1: host: unknown key 'host'; node settings go in an entry of nodes:",
    ),
    (
        "ssh key at the top level",
        """\
        version: 1
        connect_timeout: 5s
        nodes: []
        """,
        "f.yaml:2:1: connect_timeout: unknown key 'connect_timeout'; SSH settings go under ssh: (ssh.connect_timeout)",
    ),
    (
        "unknown team key",
        """\
        version: 1
        teams:
          vision: {user: [alice]}
        nodes: []
        """,
        "f.yaml:3:12: teams.vision.user: unknown key 'user'; did you mean 'users'?",
    ),
    (
        "host key checking cannot be turned off",
        """\
        version: 1
        ssh: {host_key_policy: "off"}
        nodes: []
        """,
        "f.yaml:2:24: ssh.host_key_policy: host key checking cannot be turned off; use accept-new to trust a new "
        "host on first contact, or add its key with ssh-keyscan",
    ),
    (
        "host key policy typo",
        """\
        version: 1
        ssh: {host_key_policy: accept_new}
        nodes: []
        """,
        "f.yaml:2:24: ssh.host_key_policy: must be one of strict | accept-new (got 'accept_new'); "
        "did you mean 'accept-new'?",
    ),
    (
        "host key checking off through a YAML 1.1 boolean",
        """\
        version: 1
        ssh: {host_key_policy: false}
        nodes: []
        """,
        "f.yaml:2:24: ssh.host_key_policy: host key checking cannot be turned off; use accept-new to trust a new "
        "host on first contact, or add its key with ssh-keyscan",
    ),
    (
        "bad duration",
        """\
        version: 1
        ssh: {connect_timeout: 10 seconds}
        nodes: []
        """,
        "f.yaml:2:24: ssh.connect_timeout: expected a duration such as 500ms, 10s, 5m or 1h (got '10 seconds'); "
        "a bare number is seconds",
    ),
    (
        "duration out of range",
        """\
        version: 1
        ssh: {login_timeout: 2h}
        nodes: []
        """,
        "f.yaml:2:22: ssh.login_timeout: must be between 100ms and 10m (got '2h')",
    ),
    (
        "negative duration",
        """\
        version: 1
        ssh: {keepalive_interval: -5}
        nodes: []
        """,
        "f.yaml:2:27: ssh.keepalive_interval: expected a duration such as 500ms, 10s, 5m or 1h (got -5); "
        "a bare number is seconds",
    ),
    (
        "interval too short",
        """\
        version: 1
        interval: 10ms
        nodes: []
        """,
        "f.yaml:2:11: interval: must be between 100ms and 1h (got '10ms')",
    ),
    (
        "max_handshakes",
        """\
        version: 1
        ssh: {max_handshakes: 0}
        nodes: []
        """,
        "f.yaml:2:23: ssh.max_handshakes: must be between 1 and 4096 (got 0)",
    ),
    (
        "use_ssh_config not a boolean",
        """\
        version: 1
        ssh: {use_ssh_config: maybe}
        nodes: []
        """,
        "f.yaml:2:23: ssh.use_ssh_config: expected true or false (got 'maybe')",
    ),
    (
        "identity file that would be an option",
        """\
        version: 1
        ssh: {identity_file: -i}
        nodes: []
        """,
        "f.yaml:2:22: ssh.identity_file: path must not start with '-' (got '-i'); write ./-i",
    ),
    (
        "agent mode",
        """\
        version: 1
        agent: {mode: pushed}
        nodes: []
        """,
        "f.yaml:2:15: agent.mode: must be one of auto | installed | push (got 'pushed'); did you mean 'push'?",
    ),
    (
        "agent python with arguments",
        """\
        version: 1
        agent: {python: "python3 -c 'import os'"}
        nodes: []
        """,
        "f.yaml:2:17: agent.python: command must not contain whitespace (got \"python3 -c 'import os'\")",
    ),
    (
        "agent python relative path",
        """\
        version: 1
        agent: {python: bin/python3}
        nodes: []
        """,
        "f.yaml:2:17: agent.python: not a usable command (got 'bin/python3'); a command name found on the node's "
        "PATH (python3) or an absolute path (/usr/bin/python3), without arguments",
    ),
    (
        "sim spec with a tilde",
        """\
        version: 1
        agent: {backend: sim, sim_spec: ~/node.json}
        nodes: []
        """,
        "f.yaml:2:33: agent.sim_spec: not a usable path on the node (got '~/node.json'); "
        "use letters, digits and _ . / + @ = , - only; no '~' (write the path in full)",
    ),
    (
        "backend name",
        """\
        version: 1
        agent: {backend: "NVML!"}
        nodes: []
        """,
        "f.yaml:2:18: agent.backend: not a valid backend name (got 'NVML!'); built in: nvml, sim",
    ),
    (
        "port given twice on a node",
        """\
        version: 1
        nodes:
          - name: a
            host: h
            port: 22
            ssh: {port: 2222}
        """,
        "f.yaml:6:11: nodes[0].ssh.port: port is given twice, here and as nodes[0].port at line 5; keep one of them",
    ),
    (
        "missing version",
        """\
        nodes: []
        """,
        "f.yaml:1:1: missing required key 'version'; add 'version: 1' at the top of the file",
    ),
    (
        "unsupported version",
        """\
        version: 2
        nodes: []
        """,
        "f.yaml:1:10: version: unsupported version 2; this gpuops reads version 1",
    ),
    (
        "missing nodes",
        """\
        version: 1
        """,
        "f.yaml:1:1: missing required key 'nodes'; list the GPU servers under nodes:, each with at least a host",
    ),
    (
        "nodes not a list",
        """\
        version: 1
        nodes:
          gpu1: {host: h}
        """,
        "f.yaml:3:3: nodes: expected a list (got a mapping)",
    ),
    (
        "node missing host",
        """\
        version: 1
        nodes:
          - name: a
            port: 22
        """,
        "f.yaml:3:5: nodes[0]: missing required key 'host'; "
        "the DNS name, IP address or ~/.ssh/config alias to reach the node",
    ),
    (
        "team not a mapping",
        """\
        version: 1
        teams:
          vision: [alice]
        nodes: []
        """,
        "f.yaml:3:11: teams.vision: expected a mapping (got a list)",
    ),
    (
        "users not a list",
        """\
        version: 1
        teams:
          vision: {users: alice}
        nodes: []
        """,
        "f.yaml:3:19: teams.vision.users: expected a list (got 'alice'); write a YAML list: [alice]",
    ),
    (
        "description not one line",
        """\
        version: 1
        teams:
          vision:
            description: "a\\nb"
        nodes: []
        """,
        "f.yaml:4:18: teams.vision.description: must be one line of at most 500 printable characters",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in CASES], ids=[c[0] for c in CASES])
def test_rule(text: str, expected: str) -> None:
    assert one_error(text) == expected


def test_all_errors_are_reported_sorted_by_place() -> None:
    # Field errors and cross-field errors together: an entry with a bad optional value still
    # takes part in the cross-field checks; one without a usable host (a required key) does not.
    found = errors(
        """\
        version: 1
        ssh:
          prot: 22
          jump_host: gw
        teams:
          vision: {users: [alice, bob]}
          nlp: {users: [bob, "-x"]}
        nodes:
          - name: a
            host: 10.0.0.1
            port: 70000
            owner: visoin
          - name: a
            host: 10.0.0.9
            port: 0
          - name: c
            host: 10.0.0.2
            identity_file: k
          - name: d
            host: 10.0.0.2
          - name: a
            host: "bad host"
        extra: 1
        """
    )
    assert found == [
        "f.yaml:3:3: ssh.prot: unknown key 'prot'; did you mean 'port'?",
        "f.yaml:4:14: ssh.jump_host: no jump host named 'gw'; "
        "define it under jump_hosts:, or write user@host:port (or none)",
        "f.yaml:7:17: teams.nlp.users[0]: user 'bob' is already in team 'vision' (teams.vision.users[1] at line 6); "
        "a user belongs to one team",
        "f.yaml:7:22: teams.nlp.users[1]: user name must not start with '-' (got '-x')",
        "f.yaml:11:11: nodes[0].port: must be between 1 and 65535 (got 70000)",
        "f.yaml:12:12: nodes[0].owner: no team named 'visoin'; did you mean 'vision'?",
        "f.yaml:13:11: nodes[1].name: duplicate node name 'a'; first used by nodes[0] at line 9",
        "f.yaml:15:11: nodes[1].port: must be between 1 and 65535 (got 0)",
        "f.yaml:18:5: nodes[2].identity_file: unknown key 'identity_file'; SSH settings of a node go under its ssh: "
        "(nodes[2].ssh.identity_file)",
        "f.yaml:20:11: nodes[3].host: 10.0.0.2:22 through gw is already listed as nodes[2] at line 16; "
        "list each machine once",
        "f.yaml:22:11: nodes[4].host: host must not contain whitespace (got 'bad host')",
        "f.yaml:23:1: extra: unknown key 'extra'; valid keys: version, interval, ssh, agent, jump_hosts, teams, nodes, carve, attribution, pools, source",
    ]


def test_same_address_behind_different_jump_hosts_is_two_machines() -> None:
    ok(
        """\
        version: 1
        jump_hosts:
          dc1: {host: gw1}
          dc2: {host: gw2}
        nodes:
          - {name: a, host: 10.0.0.1, ssh: {jump_host: dc1}}
          - {name: b, host: 10.0.0.1, ssh: {jump_host: dc2}}
          - {name: c, host: 10.0.0.1, ssh: {jump_host: none}}
          - {name: d, host: 10.0.0.1, port: 2222, ssh: {jump_host: none}}
        """
    )


def test_same_host_on_different_ports_is_fine() -> None:
    ok(
        """\
        version: 1
        nodes:
          - {name: a, host: 127.0.0.1, port: 2201}
          - {name: b, host: 127.0.0.1, port: 2202}
        """
    )


@pytest.mark.parametrize(
    "host",
    [
        "gpu-a-01",
        "gpu_a_01",
        "GPU1.example.com",
        "gpu1.example.com.",
        "10.0.0.1",
        "fd00::1",
        "fe80::1%eth0",
        "a",
    ],
)
def test_valid_hosts(host: str) -> None:
    ok(f'version: 1\nnodes: [{{name: n, host: "{host}"}}]\n')


@pytest.mark.parametrize("user", ["alice", "_svc", "john.doe", "ops-1", "A" * 32])
def test_valid_users(user: str) -> None:
    ok(f"version: 1\nssh: {{user: {user}}}\nteams: {{t: {{users: [{user}]}}}}\nnodes: []\n")


@pytest.mark.parametrize(
    "ref",
    ["none", "bastion", "ops@gw.example.com", "gw:2222", "ops@gw:2222", "ops@[fd00::1]:22", "[fd00::1]:22"],
)
def test_valid_jump_hosts(ref: str) -> None:
    ok(f'version: 1\njump_hosts: {{bastion: {{host: b}}}}\nssh: {{jump_host: "{ref}"}}\nnodes: []\n')


def test_labels_follow_kubernetes_rules() -> None:
    ok(
        """\
        version: 1
        nodes:
          - name: a
            host: h
            labels:
              topology.kubernetes.io/zone: eu-1a
              rack: "07"
              row: 7
              empty: ""
        """
    )


def test_an_empty_key_means_its_default() -> None:
    fleet = parse_fleet("version: 1\nssh:\nagent:\nteams:\n  vision:\njump_hosts:\nnodes:\n")
    assert fleet.nodes == [] and list(fleet.teams) == ["vision"]
