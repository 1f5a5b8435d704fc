"""dump_fleet writes what load_fleet reads back equal: the example, and random valid fleets."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuops.spec import Fleet, dump_fleet, fleet_from_data, load_fleet, parse_fleet
from gpuops.spec.types import format_exact_duration
from tests.hypothesis_budget import examples

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def round_trip(fleet: Fleet) -> Fleet:
    return parse_fleet(dump_fleet(fleet), "dumped.yaml")


def test_example_round_trips(tmp_path: Path) -> None:
    fleet = load_fleet(EXAMPLE)
    text = dump_fleet(fleet, comment="written by a test\nsecond line")
    assert text.startswith("# written by a test\n# second line\nversion: 1\n")
    path = tmp_path / "elsewhere" / "fleet.yaml"
    path.parent.mkdir()
    path.write_text(text)
    assert load_fleet(path) == fleet
    assert dump_fleet(load_fleet(path), comment="written by a test\nsecond line") == text


def test_dump_is_minimal_and_readable() -> None:
    fleet = parse_fleet(
        textwrap.dedent(
            """\
            version: 1
            ssh: {connect_timeout: 1m30s, keepalive_interval: 0}
            teams:
              vision: {users: [alice, bob]}
            nodes:
              - host: gpu1
                labels: {zone: a, rack: "07"}
                owner: vision
                gpus: {"4,5": vision}
            """
        )
    )
    assert dump_fleet(fleet) == textwrap.dedent(
        """\
        version: 1
        ssh: {connect_timeout: 1m30s, keepalive_interval: 0s}
        teams:
          vision:
            users: [alice, bob]
        nodes:
          - name: gpu1
            host: gpu1
            labels: {zone: a, rack: '07'}
            owner: vision
            gpus: {'4,5': vision}
        """
    )


def test_exact_durations() -> None:
    assert format_exact_duration(15.0) == "15s"
    assert format_exact_duration(90061.0) == "1d1h1m1s"
    assert format_exact_duration(0.25) == "250ms"
    assert format_exact_duration(0.0) == "0s"
    assert format_exact_duration(1.0000001) == 1.0000001  # no text reads back exactly: a number


# ---- random valid fleets --------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)
DURATIONS = st.one_of(
    st.integers(1, 600).map(float),
    st.sampled_from([0.1, 0.25, 0.3, 1.5, 2.3, 59.999, 90.0, 599.5]),
    st.floats(0.1, 600.0, allow_nan=False),
)


@st.composite
def ssh_options(draw: st.DrawFn, top: bool) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if draw(st.booleans()):
        options["user"] = draw(st.from_regex(r"[a-z_][a-z0-9_.-]{0,10}", fullmatch=True))
    if draw(st.booleans()):
        options["port"] = draw(st.integers(1, 65535))
    if draw(st.booleans()):
        options["identity_file"] = draw(st.sampled_from(["/keys/id", "~/.ssh/id_ed25519", "/a b/key"]))
    if draw(st.booleans()):
        options["host_key_policy"] = draw(st.sampled_from(["strict", "accept-new"]))
    for key in ("connect_timeout", "login_timeout"):
        if draw(st.booleans()):
            options[key] = draw(DURATIONS)
    if draw(st.booleans()):
        options["keepalive_interval"] = draw(st.one_of(st.just(0.0), st.integers(1, 3600).map(float)))
    if draw(st.booleans()):
        options["use_ssh_config"] = draw(st.booleans())
    if draw(st.booleans()):
        options["jump_host"] = draw(st.sampled_from(["none", "ops@gw:2222", "gw.example.com:22"]))
    if top and draw(st.booleans()):
        options["max_handshakes"] = draw(st.integers(1, 4096))
    return options


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, Any]:
    team_names = draw(st.lists(NAMES, unique=True, max_size=4))
    users = draw(st.lists(NAMES, unique=True, max_size=8))
    teams: dict[str, Any] = {name: {} for name in team_names}
    for user in users:
        if team_names:
            teams[draw(st.sampled_from(team_names))].setdefault("users", []).append(user)
    for name in team_names:
        if draw(st.booleans()):
            teams[name]["description"] = draw(
                st.text(
                    st.characters(min_codepoint=32, max_codepoint=0x2FF).filter(str.isprintable), max_size=30
                )
            )
    node_names = draw(st.lists(NAMES, unique=True, max_size=6))
    nodes = []
    for i, name in enumerate(node_names):
        node: dict[str, Any] = {
            "name": name,
            "host": draw(st.sampled_from([name, f"10.0.{i}.1", f"fd00::{i + 1}"])),
        }
        if draw(st.booleans()):
            node["port"] = draw(st.integers(1, 65535))
        if draw(st.booleans()):
            node["labels"] = draw(
                st.dictionaries(
                    NAMES, st.one_of(NAMES, st.just(""), st.from_regex(r"[0-9]{1,3}", fullmatch=True))
                )
            )
        if team_names and draw(st.booleans()):
            node["owner"] = draw(st.sampled_from(team_names))
        if team_names and draw(st.booleans()):
            gpus: dict[str, str] = {}
            start = 0
            for _ in range(draw(st.integers(0, 3))):
                size = draw(st.integers(1, 4))
                key = str(start) if size == 1 else f"{start}-{start + size - 1}"
                gpus[key] = draw(st.sampled_from(team_names))
                start += size + draw(st.integers(0, 2))
            node["gpus"] = gpus
        if draw(st.booleans()):
            node["ssh"] = {k: v for k, v in draw(ssh_options(top=False)).items() if k not in ("port", "user")}
        if draw(st.booleans()):
            node["agent"] = {"mode": draw(st.sampled_from(["auto", "installed", "push"])), "backend": "sim"}
        nodes.append(node)
    data: dict[str, Any] = {"version": 1, "teams": teams, "nodes": nodes}
    if draw(st.booleans()):
        data["ssh"] = draw(ssh_options(top=True))
        if data["ssh"].get("jump_host") not in (None, "none") and "@" not in data["ssh"]["jump_host"]:
            data["jump_hosts"] = {}
    if draw(st.booleans()):
        data["interval"] = draw(st.sampled_from([0.1, 0.5, 1.0, 2.0, 3600.0]))
    if draw(st.booleans()):
        data["jump_hosts"] = {"bastion": {"host": "bastion.example.com", "port": 2222}}
    return data


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
@example({"version": 1, "teams": {"a0": {"description": ":0"}}, "nodes": []})  # written bare in {...}
def test_random_fleets_round_trip(data: dict[str, Any]) -> None:
    fleet = fleet_from_data(data)
    text = dump_fleet(fleet)
    again = parse_fleet(text, "dumped.yaml")
    assert again == fleet, text
    assert dump_fleet(again) == text
