"""The sim fleet's fleet.yaml (gpuops/simfleet/runner.py): written without the spec package for a
document of plain names (`plain_fleet_yaml`), it is the text the spec package writes
(`dump_fleet`), and its loader reads it back as the same fleet; anything else is left to the
spec package."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpuops.simfleet import runner
from gpuops.simfleet.runner import SimPaths, fleet_document, fleet_yaml_text, plain_fleet_yaml
from gpuops.simfleet.scenarios import build_fleet
from gpuops.spec import SpecError, dump_fleet, fleet_from_data, parse_fleet
from gpuops.spec.types import USER_RE

COMMENT = "Written by a test;\nrewritten on every start."


def _document(scenario: str, nodes: int | None, user: str, directory: str) -> dict[str, Any]:
    plan = build_fleet(scenario, nodes, 3, epoch=1.7e9, utc_offset="+00:00")
    ports = {node.name: 20000 + i for i, node in enumerate(plan.nodes)}
    return fleet_document(plan, ports, SimPaths(Path(directory)), user)


def _spec_text(document: dict[str, Any], path: Path) -> str:
    return dump_fleet(fleet_from_data(document, str(path), base_dir=path.parent), comment=COMMENT)


@pytest.mark.parametrize(
    ("scenario", "nodes"),
    [("silos", None), ("silos", 3), ("silos", 19), ("mixed", None), ("large", 40), ("large", 300)],
)
@pytest.mark.parametrize(
    ("user", "directory"),
    [
        ("root", "/tmp/simX"),
        ("alice_b", "/run/user/1000/gpuops-sim"),
        ("u", "/home/someone/.cache/gpuops/sim/with-a/rather_long/path/that.goes/on/and/on/and/on"),
    ],
)
def test_every_scenario_is_written_as_the_spec_package_writes_it(
    scenario: str, nodes: int | None, user: str, directory: str
) -> None:
    document = _document(scenario, nodes, user, directory)
    path = Path(directory) / "fleet.yaml"
    text = plain_fleet_yaml(document, COMMENT)
    assert text is not None
    assert text == _spec_text(document, path)
    read = parse_fleet(text, str(path), base_dir=path.parent)
    assert read == fleet_from_data(document, str(path), base_dir=path.parent)


def test_blocks_where_one_line_is_too_long() -> None:
    """A team of many users and a node of many labels go in blocks, as the spec package's."""
    document = _document("silos", 3, "root", "/tmp/simX")
    team = next(iter(document["teams"]))
    document["teams"][team]["users"] = [f"user{i:02d}" for i in range(20)]
    document["nodes"][0]["labels"] = {f"label{i}": f"value{i}" for i in range(12)}
    text = plain_fleet_yaml(document, COMMENT)
    assert text is not None and "  - user00\n" in text
    assert text == _spec_text(document, Path("/tmp/simX/fleet.yaml"))


def test_the_user_name_rule_is_the_loaders() -> None:
    assert runner._USER.pattern == USER_RE.pattern


@pytest.mark.parametrize("user", ["a b", "-x", "élodie", "1234", "/root", "x" * 33])
def test_a_user_name_the_loader_refuses_is_refused_as_before(user: str, tmp_path: Path) -> None:
    """The fleet does not start (SpecError in its log) rather than write a fleet.yaml that no
    gpuops command reads."""
    document = _document("silos", 3, user, "/tmp/simX")
    assert plain_fleet_yaml(document, COMMENT) is None
    plan = build_fleet("silos", 3, 3, epoch=1.7e9, utc_offset="+00:00")
    with pytest.raises(SpecError):
        fleet_yaml_text(document, plan, tmp_path / "fleet.yaml")


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["ssh"].update(user="yes"),
        lambda d: d["ssh"].update(user="Null"),
        lambda d: d["ssh"].update(identity_file="/tmp/" + "x" * 1100 + "/id_ed25519"),
        lambda d: d["ssh"].update(identity_file="/tmp/with space/id_ed25519"),
        lambda d: d["ssh"].update(known_hosts="/tmp/x:y/known_hosts"),
        lambda d: d["nodes"][0].update(owner=None),
        lambda d: d["nodes"][0].update(labels={}),
        lambda d: d["nodes"][0]["labels"].update(gpu="null"),
        lambda d: d["nodes"][0]["labels"].update(note="2026-11-29"),
        lambda d: d.update(interval="5s"),
        lambda d: d["ssh"].update(port=2222),
        lambda d: next(iter(d["teams"].values())).update(users=[]),
    ],
)
def test_anything_else_is_left_to_the_spec_package(change: Any, tmp_path: Path) -> None:
    document = copy.deepcopy(_document("silos", 3, "root", "/tmp/simX"))
    change(document)
    assert plain_fleet_yaml(document, COMMENT) is None
    plan = build_fleet("silos", 3, 3, epoch=1.7e9, utc_offset="+00:00")
    path = tmp_path / "fleet.yaml"
    text = fleet_yaml_text(document, plan, path)  # the spec package's text, checked by its loader
    assert parse_fleet(text, str(path), base_dir=tmp_path) == fleet_from_data(
        document, str(path), base_dir=tmp_path
    )
